"""The decoding loop and model loader (pipeline/evaluation/decoding.py) under bad input: sources that are not a list
of texts or token ids, and saved model folders whose config.json, weights, tokenizer or generation_config.json are
tampered with, end in an error naming the bad source or file before anything is decoded; a folder without a
generation config decodes with the model's own settings."""

import json
import logging
import shutil

import pytest
import torch

from hf_posenc.pipeline.evaluation.decoding import load_translation_model, split_sentences, translate
from tests.helpers import SOURCES

# id: (the sources given to translate, the error, words of its message)
BAD_SOURCES = {
    "one text": ("A dog runs.", TypeError, ["sources must be a list of texts", "put one text in a list"]),
    "a generator": ((text for text in SOURCES), TypeError, ["got a generator"]),
    "a number": (["A dog.", 3], TypeError, ["sources[1]=3 is neither a text (str) nor a list of token ids"]),
    "None": ([None], TypeError, ["sources[0]=None is neither a text"]),
    "bytes": ([b"A dog."], TypeError, ["sources[0]=b'A dog.' is neither a text"]),
    "words as a list": ([["A", "dog"]], TypeError, ["sources[0]=['A', 'dog'] is neither a text"]),
    "empty text": (["A dog.", "  "], ValueError, ["sources[1]='  ' is empty"]),
    "no token id": ([[]], ValueError, ["sources[0] holds no token id"]),
    "texts and ids": (["A dog.", [5, 6, 1]], TypeError, ["sources mix texts and token-id lists"]),
}


@pytest.mark.parametrize("sources, error, words", BAD_SOURCES.values(), ids=BAD_SOURCES.keys())
@pytest.mark.parametrize("by_sentence", [False, True], ids=["whole", "by-sentence"])
def test_sources_that_are_no_list_of_texts_or_ids_are_named_before_decoding(
    sources, error, words, by_sentence, model_and_tokenizer, monkeypatch
):
    """Before: one text was translated character by character, bytes and empty texts were decoded into garbage,
    and None or a number failed on `len()` inside the sort, naming no source."""
    model, tokenizer = model_and_tokenizer
    monkeypatch.setattr(model, "generate", lambda *args, **kwargs: pytest.fail("decoded"))
    with pytest.raises(error) as raised:
        translate(model, tokenizer, sources, split_sentences=by_sentence, progress_bar=False)
    for word in words:
        assert word in str(raised.value), str(raised.value)


def test_bf16_must_be_a_bool_and_split_sentences_takes_a_text(model_and_tokenizer):
    model, tokenizer = model_and_tokenizer
    with pytest.raises(TypeError, match=r"bf16='yes' must be True or False"):
        translate(model, tokenizer, SOURCES, bf16="yes")
    with pytest.raises(TypeError, match=r"split_sentences takes a text \(str\), got a NoneType"):
        split_sentences(None)


def edit_json(path, **fields):
    path.write_text(json.dumps({**json.loads(path.read_text()), **fields}))


# id: (how the saved folder is tampered with, words of the error)
TAMPERED_FOLDERS = {
    "config not JSON": (
        lambda folder: (folder / "config.json").write_text("{broken"),
        ["config.json is not a JSON object of model settings"],
    ),
    "unknown model type": (
        lambda folder: edit_json(folder / "config.json", model_type="bert"),
        ["config.json has model_type='bert'", "'marian_posenc' (MarianPosEnc)"],
    ),
    "config value of the wrong type": (
        lambda folder: edit_json(folder / "config.json", d_model="32"),
        ["config.json", "Field 'd_model' expected int, got str"],
    ),
    "weights of other shapes": (
        lambda folder: edit_json(folder / "config.json", encoder_ffn_dim=48),
        ["the weights in", "have other shapes than its config.json asks for"],
    ),
    "tokenizer not JSON": (
        lambda folder: (folder / "tokenizer.json").write_text("garbage"),
        ["the tokenizer of", "tokenizer.json", "cannot be read"],
    ),
    "tokenizer of another schema": (
        lambda folder: (folder / "tokenizer.json").write_text('{"broken": 1}'),
        ["the tokenizer of", "cannot be read"],
    ),
    "generation config not JSON": (
        lambda folder: (folder / "generation_config.json").write_text("{broken"),
        ["generation_config.json cannot be read"],
    ),
    "negative budget over the source": (
        lambda folder: edit_json(folder / "generation_config.json", max_new_tokens_over_source=-5),
        ["max_new_tokens_over_source=-5 must be a whole number of at least 0", "generation_config.json"],
    ),
    "budget as text": (
        lambda folder: edit_json(folder / "generation_config.json", max_new_tokens_over_source="50"),
        ["max_new_tokens_over_source='50' must be a whole number"],
    ),
    "negative loop guard": (
        lambda folder: edit_json(folder / "generation_config.json", no_repeat_ngram_size=-2),
        ["no_repeat_ngram_size=-2 must be a whole number of at least 0"],
    ),
    "length ratio as text": (
        lambda folder: edit_json(folder / "generation_config.json", min_length_ratio="2"),
        ["min_length_ratio='2' is not allowed", "generation_config.json"],
    ),
}


@pytest.mark.parametrize("tamper, words", TAMPERED_FOLDERS.values(), ids=TAMPERED_FOLDERS.keys())
def test_a_tampered_model_folder_is_named_when_it_is_loaded(tamper, words, model_dir, tmp_path):
    """Before: tracebacks (a JSON error without the file, huggingface_hub's StrictDataclassFieldValidationError,
    transformers' size-mismatch RuntimeError, a KeyError of the tokenizer loader), a TypeError at the first
    `generate` (a budget given as text), or nothing at all: a negative budget cut every translation below the
    source length, a negative n-gram size turned the loop guard off, an unreadable generation config fell back
    to greedy decoding of 20 tokens."""
    folder = tmp_path / "model"
    shutil.copytree(model_dir, folder)
    tamper(folder)
    with pytest.raises(ValueError) as raised:
        load_translation_model(folder)
    for word in words:
        assert word in str(raised.value), str(raised.value)


def test_a_folder_without_generation_config_decodes_with_the_models_own_settings(model_dir, tmp_path, caplog):
    """Before: greedy decoding of at most 20 tokens (transformers' generation config built from config.json), every
    longer translation cut there, and the score reported as if nothing had happened."""
    folder = tmp_path / "model"
    shutil.copytree(model_dir, folder)
    (folder / "generation_config.json").unlink()
    with caplog.at_level(logging.WARNING):
        model, _ = load_translation_model(folder)
    settings = model.generation_config
    assert (settings.num_beams, settings.max_new_tokens_over_source) == (4, 50)
    assert "has no generation_config.json" in caplog.text


def test_beams_whose_scores_cannot_fit_in_memory_are_refused_before_decoding(
    model_and_tokenizer, monkeypatch
):
    """Before: the process grew until the kernel killed it, without a message (`hf-posenc-evaluate --num_beams
    100000` on the default model took the machine's 24 GB in 30 s)."""
    model, tokenizer = model_and_tokenizer
    monkeypatch.setattr(model, "generate", lambda *args, **kwargs: pytest.fail("decoded"))
    vocabulary = model.config.vocab_size
    rows = 2 * 10**12
    with pytest.raises(ValueError) as raised:
        translate(model, tokenizer, SOURCES[:2], num_beams=10**12, progress_bar=False)
    assert str(raised.value).startswith(
        f"decoding 2 sentences x {10**12} beams at once (a step's scores: {rows} rows x {vocabulary} tokens) "
        f"needs at least {rows * vocabulary * 8 / 2**30:.2f} GiB, more than the "
    ), str(raised.value)
    assert str(raised.value).endswith("GiB available (cpu): lower batch_size or num_beams")
    with pytest.raises(ValueError, match=r"^decoding \d+ sentences? x 1000000000000 beams"):  # by sentence
        translate(model, tokenizer, [" ".join(SOURCES[:2])], num_beams=10**12, split_sentences=True)


def test_a_batch_that_runs_out_of_the_devices_memory_is_named(model_and_tokenizer, monkeypatch):
    """A GPU's memory is not checked before decoding: torch's error comes from deep inside `generate`."""
    model, tokenizer = model_and_tokenizer

    def out_of_memory(*args, **kwargs):
        raise torch.OutOfMemoryError("CUDA out of memory. Tried to allocate 20.00 GiB")

    monkeypatch.setattr(model, "generate", out_of_memory)
    with pytest.raises(ValueError) as raised:
        translate(model, tokenizer, SOURCES[:3], batch_size=2, num_beams=3, progress_bar=False)
    assert str(raised.value) == (
        "decoding 2 sentences x 3 beams at once ran out of cpu memory: lower batch_size or num_beams"
    )
    assert raised.value.__cause__ is None and raised.value.__suppress_context__
