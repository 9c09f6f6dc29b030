"""Model cards: fill `model_cards/template.md` with a trained model's configuration and scores."""

from pathlib import Path

TEMPLATE = Path(__file__).resolve().parents[1] / "model_cards" / "template.md"

MULTI30K_NOTE = (
    "Multi30k task 1 (Elliott et al. 2016; 2017 for French): 29,000 training pairs of Flickr30K image "
    "descriptions; test set test_2016_flickr (1,000 pairs). For non-commercial research and education."
)

MARIAN_CITATION = """```bibtex
@inproceedings{junczys-dowmunt-etal-2018-marian,
  title = {Marian: Fast Neural Machine Translation in C++},
  author = {Junczys-Dowmunt, Marcin and others},
  booktitle = {Proceedings of ACL 2018, System Demonstrations},
  year = {2018}
}
```"""


def write_model_card(folder, model_config, scores: dict, **fields) -> Path:
    """Write README.md (YAML front matter with `model-index`, how to load, scores) into `folder`."""
    values = {
        "dataset": "multi30k",
        "test_split": "test_2016_flickr",
        "data_note": MULTI30K_NOTE,
        "citation": MARIAN_CITATION,
        "repo_or_folder": str(folder),
        "model_name": Path(folder).name,
        "bleu": scores["bleu"],
        "chrf": scores["chrf++"],
        "bleu_signature": scores["bleu_signature"],
        "chrf_signature": scores["chrf++_signature"],
        **{
            name: getattr(model_config, name, "attention" if "attention" in name else "sinusoidal")
            for name in (
                "encoder_position_encoding",
                "decoder_position_encoding",
                "encoder_self_attention",
                "decoder_self_attention",
                "cross_attention",
            )
        },
        **fields,
    }
    path = Path(folder) / "README.md"
    path.write_text(TEMPLATE.read_text(encoding="utf-8").format_map(values), encoding="utf-8")
    return path
