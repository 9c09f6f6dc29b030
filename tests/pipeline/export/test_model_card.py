"""The model card tells the truth, as the Hub reads it: huggingface_hub's card parser sees the pipeline tag,
the data's licence, the dataset's Hub id, config and split, and the scores; the card counts the pairs actually
scored; every module's citation becomes a BibTeX entry."""

import pytest
from huggingface_hub import ModelCard

from hf_posenc import POSITION_ENCODINGS, TOKEN_MIXERS
from hf_posenc.pipeline.export.model_card import LIBRARY_BIBTEX, bibtex, dataset_of, write_model_card

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
