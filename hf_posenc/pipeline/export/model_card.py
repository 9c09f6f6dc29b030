"""Model cards: fill the card template (model_cards/template.md, linked into the package as
`model_card_template.md`) with a trained model's configuration, data, scores and machine.

What the card says of the data comes from what the run read: the number of test pairs actually scored, the
dataset's Hub id, config and split where one exists (`DATASETS`), the data's terms (which decide the card's
`license`: weights trained on Multi30k inherit Flickr30K's non-commercial terms, whatever the code's
licence), and BibTeX for every paper the modules cite and for this library.
"""

import re
from dataclasses import dataclass
from pathlib import Path

from ...base import ATTENTION_SITES, DECODER, ENCODER
from ...configuration_marian_posenc import MarianPosEncConfig
from ...registry import POSITION_ENCODINGS, TOKEN_MIXERS

TEMPLATE = Path(__file__).with_name("model_card_template.md")

MARIAN = (
    "Junczys-Dowmunt et al. 2018. Marian: Fast Neural Machine Translation in C++. ACL System Demonstrations."
)
LIBRARY_BIBTEX = """@software{hf_posenc,
  title = {hf_posenc: pluggable positional modules for Marian-style translation models in HF Transformers},
  year = {2026},
  note = {Version 0.1.0}
}"""
JOURNALS = ("JMLR", "TACL", "Computational Linguistics")
CHOICES = (
    "encoder_position_encoding",
    "decoder_position_encoding",
    "encoder_self_attention",
    "decoder_self_attention",
    "cross_attention",
)


@dataclass(frozen=True)
class Dataset:
    """A dataset as a card names it: the Hub id, config and split where it is on the Hub, its domain and terms."""

    name: str
    hub_id: str | None
    config: str | None
    domain: str
    terms: str
    license: str  # the card's `license` field
    license_name: str | None = None  # for license "other"


MULTI30K_TERMS = (
    "Multi30k's text comes from Flickr30K image descriptions, released for non-commercial research and "
    "education; a model trained on it inherits those terms."
)
WMT14_TERMS = (
    "the WMT14 training corpora are released for research; check each corpus's own terms before other use."
)
# Where the recipes' data live on the Hub, per (data, language pair); others are named by their files.
DATASETS = {
    ("multi30k", "en-de"): Dataset(
        "Multi30k task 1 (En-De)",
        "bentrevett/multi30k",
        None,
        "image descriptions (Flickr30K captions): short, literal sentences.",
        MULTI30K_TERMS,
        "other",
        "flickr30k-non-commercial",
    ),
    ("multi30k", "en-fr"): Dataset(
        "Multi30k task 1 (En-Fr)",
        None,
        None,
        "image descriptions (Flickr30K captions): short, literal sentences.",
        MULTI30K_TERMS,
        "other",
        "flickr30k-non-commercial",
    ),
    ("wmt14", "en-de"): Dataset(
        "WMT14 En-De",
        "wmt/wmt14",
        "de-en",
        "news and parliamentary text.",
        WMT14_TERMS,
        "other",
        "wmt14-research",
    ),
    ("wmt14", "en-fr"): Dataset(
        "WMT14 En-Fr",
        "wmt/wmt14",
        "fr-en",
        "news and parliamentary text.",
        WMT14_TERMS,
        "other",
        "wmt14-research",
    ),
}


def dataset_of(data_name: str, source_lang: str, target_lang: str, train_name: str) -> Dataset:
    """The card's dataset: a known one by its name and pair, else the training files (terms unknown)."""
    known = DATASETS.get((data_name, f"{source_lang}-{target_lang}")) or DATASETS.get(
        (data_name, f"{target_lang}-{source_lang}")
    )
    if known:
        return known
    return Dataset(
        data_name,
        None,
        None,
        f"that of the training data ({train_name}).",
        "unknown to this tool: set the card's license to what the training data allow.",
        "unknown",
    )


def bibtex(citation: str) -> str:
    """A BibTeX entry from a module's citation, "Authors Year. Title. Venue." (one home for each reference)."""
    match = re.match(
        r"(?P<authors>.+?) (?P<year>\d{4})\. (?P<title>.+?)\.(?: (?P<venue>[^.]+(?:\.[^.]+)*?)\.)?$", citation
    )
    if not match:
        return f"@misc{{unparsed,\n  note = {{{citation}}}\n}}"
    authors = match["authors"].replace(" et al.", " and others").replace(", ", " and ")
    key = re.sub(r"\W", "", match["authors"].split(",")[0].split()[0]).lower() + match["year"]
    key += re.sub(r"\W", "", match["title"].split()[0]).lower()
    venue = match["venue"]
    kind, where = ("article", "journal") if venue in JOURNALS else ("inproceedings", "booktitle")
    fields = [f"author = {{{authors}}}", f"title = {{{match['title']}}}", f"year = {{{match['year']}}}"]
    if venue:
        fields.append(f"{where} = {{{venue}}}")
    else:
        kind = "misc"
    return f"@{kind}{{{key},\n  " + ",\n  ".join(fields) + "\n}"


def module_citations(choices: dict) -> list[str]:
    """Marian's and the chosen modules' citations (their classes' `citations`), each once."""
    modules = {**POSITION_ENCODINGS, **TOKEN_MIXERS}
    citations = [MARIAN]
    for name in dict.fromkeys(choices.values()):
        citations += [citation for citation in modules[name].citations if citation not in citations]
    return citations


def module_sources(choices: dict) -> tuple[str, str]:
    """Markdown lines naming each chosen module's paper and equations (the classes' `title`, `reference`), and
    the references as a Markdown list."""
    modules = {**POSITION_ENCODINGS, **TOKEN_MIXERS}
    lines = [
        f"- `{name}` ({modules[name].title}): {modules[name].reference}"
        for name in dict.fromkeys(choices.values())
    ]
    return "\n".join(lines), "\n".join(f"- {citation}" for citation in module_citations(choices))


def write_model_card(folder, model, scores: dict, dataset: Dataset, **fields) -> Path:
    """Write README.md (YAML front matter with `model-index`, how to load, scores, decoding, intended use and
    limitations, BibTeX) into `folder`.

    Stock Marian configs lack the module fields: they get the defaults of `MarianPosEncConfig` (sinusoidal +
    content attention), which is what a stock Marian model computes.
    """
    defaults = MarianPosEncConfig()
    choices = {name: getattr(model.config, name, getattr(defaults, name)) for name in CHOICES}
    generation = model.generation_config
    sources, references = module_sources(choices)
    if isinstance(model.config, MarianPosEncConfig):
        departures = paper_deviations(model.config)
        sources += "\n\nDeparts from the papers' settings: " + ("; ".join(departures) or "nowhere") + "."
    values = {
        "repo_or_folder": str(folder),
        "model_name": Path(folder).name,
        "bleu": scores["bleu"],
        "chrf": scores["chrf++"],
        "bleu_signature": scores["bleu_signature"],
        "chrf_signature": scores["chrf++_signature"],
        "test_pairs": f"{scores['test_pairs']:,}",
        **choices,
        "module_sources": f"{sources}\n\nReferences:\n{references}",
        "bibtex": "\n\n".join([*map(bibtex, module_citations(choices)), LIBRARY_BIBTEX]),
        "num_beams": generation.num_beams,
        "length_penalty": generation.length_penalty,
        "max_new_tokens_over_source": getattr(generation, "max_new_tokens_over_source", None),
        "dataset_id": dataset.hub_id or dataset.name,
        "dataset_name": f"{dataset.name}, {fields['test_split']}",
        "dataset_config": f"\n      config: {dataset.config}" if dataset.config else "",
        "domain": dataset.domain,
        "data_terms": dataset.terms,
        "license": dataset.license,
        "license_name": f"\nlicense_name: {dataset.license_name}" if dataset.license_name else "",
        "hardware": "not recorded",
        "warning": "",
        **fields,
    }
    path = Path(folder) / "README.md"
    path.write_text(TEMPLATE.read_text(encoding="utf-8").format_map(values), encoding="utf-8")
    return path


def paper_deviations(config) -> list[str]:
    """Where the modules `config` builds depart from their papers' settings by default, each as "<places>:
    <what>", from the module classes' own `paper_deviations` (comparison tables, model cards)."""
    places = {"encoder_position_encoding": ENCODER, "decoder_position_encoding": DECODER}
    places.update({site: site for site in ATTENTION_SITES})
    modules, where = {**POSITION_ENCODINGS, **TOKEN_MIXERS}, {}
    for field_name, place in places.items():
        for text in modules[getattr(config, field_name)].paper_deviations(config, place):
            where.setdefault(text, []).append(place.replace("_", " "))
    return [f"{' and '.join(at)}: {text}" for text, at in where.items()]
