"""The model card tells the truth, as the Hub reads it: huggingface_hub's card parser sees the pipeline tag,
the data's licence, the dataset's Hub id, config and split, and the scores; the card counts the pairs actually
scored; every module's citation becomes a BibTeX entry. The metadata is YAML that huggingface_hub reads back as
written, whatever the run is called; a licence `other` links to its terms; the test split is named as the Hub
dataset names it; and neither the card nor scores.json names an absolute path of the machine that trained."""

import json
from pathlib import Path

import pytest
import yaml
from huggingface_hub import ModelCard

from hf_posenc import POSITION_ENCODINGS, TOKEN_MIXERS
from hf_posenc.pipeline.export.model_card import (
    FLICKR30K_TERMS_LINK,
    LIBRARY_BIBTEX,
    WMT14_TERMS_LINK,
    bibtex,
    card_metadata,
    check_card_metadata,
    dataset_of,
    write_model_card,
)
from hf_posenc.pipeline.export.run_folder import portable_paths
from hf_posenc.pipeline.training import run

SCORES = {
    "bleu": 31.2,
    "chrf++": 55.1,
    "bleu_signature": "nrefs:1|case:mixed|eff:no|tok:13a|smooth:exp|version:2.6.0",
    "chrf++_signature": "nrefs:1|case:mixed|eff:yes|nc:6|nw:2|space:no|version:2.6.0",
    "test_pairs": 100,
}
FIELDS = dict(
    source_lang="en",
    target_lang="de",
    parameters="1.00M",
    test_split="test_2016_flickr",
    longest_training=60,
    data_note="Training: x. Test: y, 100 pairs scored.",
    training="t",
    model_name="m",
)


def card_of(model, tmp_path, dataset) -> ModelCard:
    path = write_model_card(tmp_path, model, SCORES, dataset, **FIELDS)
    return ModelCard.load(path)


def test_the_hub_parser_reads_tag_licence_dataset_split_and_scores(tmp_path, tiny_model):
    card = card_of(
        tiny_model(position_encoding="learned"), tmp_path, dataset_of("multi30k", "en", "de", "train")
    )
    assert card.data.pipeline_tag == "translation" and card.data.library_name == "transformers"
    assert card.data.license == "other" and card.data.license_name == "flickr30k-non-commercial"
    result = {r.metric_type: r for r in card.data.eval_results}
    assert result["bleu"].metric_value == 31.2 and result["chrf"].metric_value == 55.1
    assert (
        result["bleu"].dataset_type == "bentrevett/multi30k"
        and result["bleu"].dataset_split == "test"  # the Hub dataset's name of test_2016_flickr
    )
    assert (
        "100 sentence pairs" in card.text and "1,000" not in card.text
    )  # the pairs scored, not the split's size
    assert "## Intended use and limitations" in card.text and "non-commercial" in card.text
    assert "at most 60 tokens" in card.text


def test_a_hub_dataset_with_a_config_names_it(tmp_path, tiny_model):
    card = card_of(
        tiny_model(position_encoding="learned"),
        tmp_path,
        dataset_of("wmt14", "en", "de", "wmt14/de-en:train"),
    )
    result = card.data.eval_results[0]
    assert (result.dataset_type, result.dataset_config) == ("wmt/wmt14", "de-en")


def test_unknown_data_leave_the_licence_unknown_and_say_so(tmp_path, tiny_model):
    card = card_of(
        tiny_model(position_encoding="learned"),
        tmp_path,
        dataset_of("my-corpus", "en", "de", "my.en / my.de"),
    )
    assert card.data.license == "unknown" and "set the card's license" in card.text


@pytest.mark.parametrize(
    "citation",
    sorted({c for module in {**POSITION_ENCODINGS, **TOKEN_MIXERS}.values() for c in module.citations}),
)
def test_every_module_citation_becomes_a_bibtex_entry(citation):
    entry = bibtex(citation)
    assert entry.startswith("@") and "unparsed" not in entry, entry
    assert entry.count("{") == entry.count("}")
    assert "title = {" in entry and "year = {" in entry


def test_the_card_carries_bibtex_for_the_modules_and_the_library(tmp_path, tiny_model):
    card = card_of(
        tiny_model(position_encoding="learned"), tmp_path, dataset_of("multi30k", "en", "de", "train")
    )
    assert "```bibtex" in card.text and LIBRARY_BIBTEX in card.text
    assert "title = {Convolutional Sequence to Sequence Learning}" in card.text  # learned positions (Gehring)


def card(tmp_path, model, dataset, **fields) -> ModelCard:
    path = write_model_card(tmp_path, model, SCORES, dataset, **{**FIELDS, **fields})
    return ModelCard.load(path)


@pytest.mark.parametrize("name", ['run: "learned" #1', "it's: {a} - [b]", "yes", "- leading dash"])
def test_a_run_name_with_colons_quotes_or_yaml_words_reads_back_as_written(tmp_path, tiny_model, name):
    """str.format into a YAML template made `name: run: "learned" #1` invalid YAML (and `yes` a boolean)."""
    read = card(tmp_path, tiny_model(), dataset_of("multi30k", "en", "de", "train"), model_name=name)
    assert read.data.model_name == name
    assert [result.metric_value for result in read.data.eval_results] == [31.2, 55.1]
    front = read.content.split("---\n")[1]
    assert yaml.safe_load(front)["model-index"][0]["name"] == name


@pytest.mark.parametrize(
    "data, pair, link",
    [("multi30k", ("en", "de"), FLICKR30K_TERMS_LINK), ("wmt14", ("en", "fr"), WMT14_TERMS_LINK)],
)
def test_a_licence_other_names_its_terms_and_links_to_them(tmp_path, tiny_model, data, pair, link):
    read = card(tmp_path, tiny_model(), dataset_of(data, *pair, "train"))
    assert read.data.license == "other"
    assert read.data.license_name and read.data.license_link == link


def test_unknown_data_have_no_licence_link_and_other_without_one_is_refused(tmp_path, tiny_model):
    read = card(tmp_path, tiny_model(), dataset_of("my-corpus", "en", "de", "my.en / my.de"))
    assert read.data.license == "unknown" and read.data.license_link is None
    values = {**FIELDS, **SCORES, "chrf": 55.1, "chrf_signature": "c", "dataset_name": "d"}
    values.update(
        encoder_position_encoding="sinusoidal",
        decoder_position_encoding="sinusoidal",
        encoder_self_attention="attention",
    )
    metadata = card_metadata(values, dataset_of("multi30k", "en", "de", "train"), None)
    del metadata["license_link"]
    text = f"---\n{yaml.safe_dump(metadata)}---\n# card\n"
    with pytest.raises(ValueError, match="license: other needs license_name and license_link"):
        check_card_metadata(text, metadata)


@pytest.mark.parametrize(
    "data, pair, split, hub_split, config",
    [
        ("multi30k", ("en", "de"), "test_2016_flickr", "test", None),
        ("multi30k", ("en", "de"), "val", "validation", None),
        ("wmt14", ("en", "de"), "newstest2014.en-de", "test", "de-en"),
        ("wmt14", ("en", "fr"), "newstest2013.en-fr", "validation", "fr-en"),
        ("my-corpus", ("en", "de"), "heldout", "heldout", None),  # no Hub dataset: the file's own name
    ],
)
def test_the_split_is_named_as_the_hub_dataset_names_it(
    tmp_path, tiny_model, data, pair, split, hub_split, config
):
    read = card(tmp_path, tiny_model(), dataset_of(data, *pair, "train"), test_split=split)
    result = read.data.eval_results[0]
    assert (result.dataset_split, result.dataset_config) == (hub_split, config)
    assert split in result.dataset_name  # the human-readable name keeps the file's split


def test_the_base_model_is_named_when_training_started_from_a_hub_model(tmp_path, tiny_model):
    path = write_model_card(
        tmp_path,
        tiny_model(),
        SCORES,
        dataset_of("multi30k", "en", "de", "train"),
        base_model="Helsinki-NLP/opus-mt-en-de",
        **FIELDS,
    )
    assert ModelCard.load(path).data.base_model == "Helsinki-NLP/opus-mt-en-de"


def test_absolute_paths_become_relative_to_the_data_root_or_bare_names(tmp_path):
    root = tmp_path / "data"
    (root / "multi30k").mkdir(parents=True)
    home = Path.home() / ".cache" / "hf_posenc"
    record = {
        "source": f"{root}/multi30k/train.en.gz / {root}/multi30k/train.de.gz",
        "cache": {"folder": str(home)},
        "notes": [f"Test: {tmp_path}/elsewhere/test.en, 4 pairs (from {root}/multi30k/val.en.gz)"],
        "kept": "bentrevett/multi30k de-en:train https://hub.invalid/a/b 2.2k tokens/s",
        "bleu": 1.5,
    }
    assert portable_paths(record, root) == {
        "source": "multi30k/train.en.gz / multi30k/train.de.gz",
        "cache": {"folder": "hf_posenc"},
        "notes": ["Test: test.en, 4 pairs (from multi30k/val.en.gz)"],
        "kept": record["kept"],
        "bleu": 1.5,
    }
    assert portable_paths(f"{root}/multi30k/x.gz", None) == "x.gz"  # no data root: bare names


def test_the_card_and_scores_of_a_run_name_no_absolute_local_path(multi30k_dir, tiny_run_flags, tmp_path):
    cache = tmp_path / "cache"
    output = tmp_path / "out" / "tiny: run"
    run.main(
        [*tiny_run_flags(), "--max_steps", "2", "--data_cache_dir", str(cache), "--output_dir", str(output)]
    )
    scores_text = (output / "scores.json").read_text()
    card_text = (output / "README.md").read_text()
    local = [str(tmp_path), str(multi30k_dir.parent), str(multi30k_dir.resolve().parent)]
    local += [str(Path.home())] if Path.home() != Path("/") else []
    for text in (scores_text, card_text):
        assert not [folder for folder in local if folder in text]
    scores = json.loads(scores_text)
    assert scores["data"]["source"] == "multi30k/train.en.gz / multi30k/train.de.gz"
    assert scores["test_set"] == "multi30k/test_2016_flickr.en.gz / multi30k/test_2016_flickr.de.gz"
    assert scores["data"]["cache"]["folder"] == "cache"
    read = ModelCard(card_text)
    assert read.data.model_name == "tiny: run" and read.data.eval_results[0].dataset_split == "test"
    assert "multi30k/train.en.gz / multi30k/train.de.gz" in card_text
    assert 'from_pretrained("tiny: run")' in card_text
