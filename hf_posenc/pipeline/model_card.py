"""Model cards: fill `model_card_template.md` with a trained model's configuration, scores and machine."""

from pathlib import Path

from ..configuration_marian_posenc import MarianPosEncConfig
from ..registry import POSITION_ENCODINGS, TOKEN_MIXERS
from .systems import paper_deviations

TEMPLATE = Path(__file__).with_name("model_card_template.md")

MULTI30K_NOTE = (
    "Multi30k task 1 (Elliott et al. 2016; 2017 for French): 29,000 training pairs of Flickr30K image "
    "descriptions; test set test_2016_flickr (1,000 pairs). For non-commercial research and education."
)

MARIAN = (
    "Junczys-Dowmunt et al. 2018. Marian: Fast Neural Machine Translation in C++. ACL System Demonstrations."
)
CHOICES = (
    "encoder_position_encoding",
    "decoder_position_encoding",
    "encoder_self_attention",
    "decoder_self_attention",
    "cross_attention",
)


def module_sources(choices: dict) -> tuple[str, str]:
    """Markdown lines naming each chosen module's paper and equations, and the deduplicated citations, from
    the module classes' own metadata (`title`, `reference`, `citations`)."""
    modules = {**POSITION_ENCODINGS, **TOKEN_MIXERS}
    lines, citations = [], [MARIAN]
    for name in dict.fromkeys(choices.values()):
        module = modules[name]
        lines.append(f"- `{name}` ({module.title}): {module.reference}")
        citations += [citation for citation in module.citations if citation not in citations]
    return "\n".join(lines), "\n".join(f"- {citation}" for citation in citations)


def write_model_card(folder, model, scores: dict, **fields) -> Path:
    """Write README.md (YAML front matter with `model-index`, how to load, scores, decoding) into `folder`.

    Stock Marian configs lack the module fields: they get the defaults of `MarianPosEncConfig` (sinusoidal +
    content attention), which is what a stock Marian model computes.
    """
    defaults = MarianPosEncConfig()
    choices = {name: getattr(model.config, name, getattr(defaults, name)) for name in CHOICES}
    generation = model.generation_config
    sources, citations = module_sources(choices)
    if isinstance(model.config, MarianPosEncConfig):
        departures = paper_deviations(model.config)
        sources += "\n\nDeparts from the papers' settings: " + ("; ".join(departures) or "nowhere") + "."
    values = {
        "dataset": "multi30k",
        "test_split": "test_2016_flickr",
        "data_note": MULTI30K_NOTE,
        "repo_or_folder": str(folder),
        "model_name": Path(folder).name,
        "bleu": scores["bleu"],
        "chrf": scores["chrf++"],
        "bleu_signature": scores["bleu_signature"],
        "chrf_signature": scores["chrf++_signature"],
        **choices,
        "module_sources": sources,
        "citation": citations,
        "num_beams": generation.num_beams,
        "length_penalty": generation.length_penalty,
        "max_new_tokens_over_source": getattr(generation, "max_new_tokens_over_source", None),
        "hardware": "not recorded",
        "warning": "",
        **fields,
    }
    path = Path(folder) / "README.md"
    path.write_text(TEMPLATE.read_text(encoding="utf-8").format_map(values), encoding="utf-8")
    return path
