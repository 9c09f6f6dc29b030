"""Model cards: the Hub metadata, written as YAML by a YAML library (`yaml.safe_dump`: a run name with ':' or
quotes stays valid YAML) and read back through huggingface_hub's own card parser (`check_card_metadata`), over
the card text of `model_card_template.md` (package data) filled with a trained model's configuration, data,
scores and machine.

What the card says of the data comes from what the run read: the number of test pairs actually scored, the
dataset's Hub id, config and split where one exists (`DATASETS`; the split as the Hub dataset names it, e.g.
Multi30k's `test`, not the file `test_2016_flickr`), the data's terms (which decide the card's `license`:
weights trained on Multi30k inherit Flickr30K's non-commercial terms, whatever the code's licence; a licence
`other` comes with its name and a link to the terms), and BibTeX for every paper the modules cite and for this
library.
"""

import re
from dataclasses import dataclass
from pathlib import Path

import yaml
from huggingface_hub import ModelCard, ModelCardData

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
    license_link: str | None = None  # for license "other": where the terms are
    splits: tuple[tuple[str, str], ...] = ()  # (our split or file name, the Hub dataset's split name)

    def split_name(self, split: str) -> str:
        """The split as the Hub dataset names it: `split`, or the name of a test file without its language-pair
        suffix (`newstest2014.en-de`), looked up in `splits`; unknown splits keep their own name."""
        names = dict(self.splits)
        return names.get(split) or names.get(split.split(".")[0]) or split


MULTI30K_TERMS = (
    "Multi30k's text comes from Flickr30K image descriptions, released for non-commercial research and "
    "education; a model trained on it inherits those terms."
)
WMT14_TERMS = (
    "the WMT14 training corpora are released for research; check each corpus's own terms before other use."
)
FLICKR30K_TERMS_LINK = (
    "https://shannon.cs.illinois.edu/DenotationGraph/"  # the terms Flickr30K is released under
)
WMT14_TERMS_LINK = "https://www.statmt.org/wmt14/translation-task.html"  # each corpus and its terms
# The Hub dataset bentrevett/multi30k holds the shipped Multi30k files under the split names train, validation
# and test (test_2016_flickr); wmt/wmt14 holds newstest2013 as validation and newstest2014 as test.
MULTI30K_SPLITS = (("train", "train"), ("val", "validation"), ("test_2016_flickr", "test"))
WMT14_SPLITS = (("train", "train"), ("newstest2013", "validation"), ("newstest2014", "test"))
MULTI30K_DOMAIN = "image descriptions (Flickr30K captions): short, literal sentences."
# Where the recipes' data live on the Hub, per (data, language pair); others are named by their files.
DATASETS = {
    ("multi30k", "en-de"): Dataset(
        "Multi30k task 1 (En-De)",
        "bentrevett/multi30k",
        None,
        MULTI30K_DOMAIN,
        MULTI30K_TERMS,
        "other",
        "flickr30k-non-commercial",
        FLICKR30K_TERMS_LINK,
        MULTI30K_SPLITS,
    ),
    ("multi30k", "en-fr"): Dataset(
        "Multi30k task 1 (En-Fr)",
        None,
        None,
        MULTI30K_DOMAIN,
        MULTI30K_TERMS,
        "other",
        "flickr30k-non-commercial",
        FLICKR30K_TERMS_LINK,
    ),
    ("wmt14", "en-de"): Dataset(
        "WMT14 En-De",
        "wmt/wmt14",
        "de-en",
        "news and parliamentary text.",
        WMT14_TERMS,
        "other",
        "wmt14-research",
        WMT14_TERMS_LINK,
        WMT14_SPLITS,
    ),
    ("wmt14", "en-fr"): Dataset(
        "WMT14 En-Fr",
        "wmt/wmt14",
        "fr-en",
        "news and parliamentary text.",
        WMT14_TERMS,
        "other",
        "wmt14-research",
        WMT14_TERMS_LINK,
        WMT14_SPLITS,
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


def write_model_card(
    folder, model, scores: dict, dataset: Dataset, base_model: str | None = None, **fields
) -> Path:
    """Write README.md (YAML metadata with `model-index`, how to load, scores, decoding, intended use and
    limitations, BibTeX) into `folder`; `base_model` is the Hub id of the model training started from.

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
        "dataset_name": f"{dataset.name}, {fields['test_split']}",
        "domain": dataset.domain,
        "data_terms": dataset.terms,
        "hardware": "not recorded",
        "warning": "",
        **fields,
    }
    metadata = card_metadata(values, dataset, base_model)
    front = yaml.safe_dump(metadata, sort_keys=False, allow_unicode=True, width=1000)
    text = f"---\n{front}---\n" + TEMPLATE.read_text(encoding="utf-8").format_map(values)
    check_card_metadata(text, metadata)
    path = Path(folder) / "README.md"
    path.write_text(text, encoding="utf-8")
    return path


def card_metadata(values: dict, dataset: Dataset, base_model: str | None) -> dict:
    """The card's YAML metadata as the Hub reads it: languages, licence (with its name and link when `other`),
    tags, dataset, base model, and the scores as a `model-index` on the test split as the dataset names it."""
    source, target = values["source_lang"], values["target_lang"]
    licence = {"license": dataset.license}
    if dataset.license == "other":
        licence.update(license_name=dataset.license_name, license_link=dataset.license_link)
    split = {"config": dataset.config} if dataset.config else {}
    split["split"] = dataset.split_name(values["test_split"])
    metrics = [
        {"type": "bleu", "value": values["bleu"], "name": "BLEU", "args": values["bleu_signature"]},
        {"type": "chrf", "value": values["chrf"], "name": "chrF++", "args": values["chrf_signature"]},
    ]
    result = {
        "task": {"type": "translation", "name": f"Translation {source}-{target}"},
        "dataset": {"name": values["dataset_name"], "type": dataset.hub_id or dataset.name, **split},
        "metrics": metrics,
    }
    tags = [
        "translation",
        "marian_posenc",
        "hf_posenc",
        f"position-encoding-{values['encoder_position_encoding']}",
        f"decoder-position-encoding-{values['decoder_position_encoding']}",
        f"token-mixer-{values['encoder_self_attention']}",
    ]
    return {
        "language": [source, target],
        **licence,
        "library_name": "transformers",
        "pipeline_tag": "translation",
        "tags": tags,
        "datasets": [dataset.hub_id or dataset.name],
        **({"base_model": base_model} if base_model else {}),
        "metrics": ["bleu", "chrf"],
        "model-index": [{"name": values["model_name"], "results": [result]}],
    }


def check_card_metadata(text: str, metadata: dict) -> ModelCardData:
    """The card read by huggingface_hub's parser (`ModelCard`: the YAML block must be a mapping; `ModelCardData`
    turns the model-index into `EvalResult`s and raises on a malformed one), compared with what was meant, and
    the Hub's licence rule (`other` needs `license_name` and `license_link`). A ValueError names the problem."""
    data = ModelCard(text).data
    if data.to_dict() != ModelCardData(**metadata).to_dict():
        raise ValueError(
            f"the model card's metadata reads back as {data.to_dict()}, not as written: {metadata}"
        )
    results = {result.metric_type: result.metric_value for result in data.eval_results or []}
    if set(results) != {"bleu", "chrf"}:
        raise ValueError(f"the model card's model-index holds the scores {results}, expected BLEU and chrF++")
    if data.license == "other" and not (data.license_name and data.license_link):
        raise ValueError(
            f"license: other needs license_name and license_link (got {data.license_name!r}, {data.license_link!r})"
        )
    return data


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
