"""The one decoding loop and model loader (pipeline/evaluation/decoding.py): progress shown without changing the
output, texts and token ids translate alike, bf16 decoding under autocast, and settings or folders that would
decode garbage refused by name."""

import io
import logging
import math
import threading

import pytest
import torch
from transformers import LogitsProcessorList

import hf_posenc.generation_length as generation_length
from hf_posenc import fast_decoding
from hf_posenc.pipeline.evaluation.decoding import load_translation_model, translate
from tests.helpers import SOURCES


def test_unreadable_weights_and_folders_without_tokenizer_name_the_folder(tmp_path, tiny_model):
    model = tiny_model()
    model.save_pretrained(tmp_path / "model")
    with pytest.raises(ValueError, match="has no tokenizer"):
        load_translation_model(tmp_path / "model")
    with pytest.raises(FileNotFoundError, match="does not exist"):
        load_translation_model(tmp_path / "nothing")
    weights = tmp_path / "model" / "model.safetensors"
    weights.write_bytes(weights.read_bytes()[:100])
    with pytest.raises(ValueError, match=r"the weights in .*model cannot be read \(truncated or damaged\?\)"):
        type(model).from_pretrained(tmp_path / "model")


class Terminal(io.StringIO):
    def isatty(self) -> bool:
        return True


def test_decoding_progress_is_logged_off_a_terminal_without_changing_the_translations(
    model_and_tokenizer, caplog
):
    model, tokenizer = model_and_tokenizer
    caplog.set_level(logging.INFO, logger="hf_posenc.pipeline.training.progress")
    kwargs = dict(batch_size=2, num_beams=1, max_new_tokens=4)
    logged = translate(
        model, tokenizer, SOURCES, progress_every_seconds=0, progress_stream=io.StringIO(), **kwargs
    )
    lines = [record.getMessage() for record in caplog.records]
    assert [line.split(",")[0] for line in lines] == [
        "decoding: 2/5 sentences",
        "decoding: 4/5 sentences",
        "decoding: 5/5 sentences",
    ]
    terminal = Terminal()
    shown = translate(model, tokenizer, SOURCES, progress_stream=terminal, **kwargs)
    assert "100%|" in terminal.getvalue() and "5/5 sentences" in terminal.getvalue()
    assert logged == shown


def test_texts_and_their_token_ids_translate_alike(model_and_tokenizer):
    """One `translate` for the scripts and the word-order probe (issue #47): token ids made by the tokenizer
    (the probe's permuted sources) decode exactly as the texts they come from."""
    model, tokenizer = model_and_tokenizer
    kwargs = dict(batch_size=2, num_beams=2, max_new_tokens=4)
    ids = [tokenizer(sentence)["input_ids"] for sentence in SOURCES]
    assert translate(model, tokenizer, ids, **kwargs) == translate(model, tokenizer, SOURCES, **kwargs)


def test_bf16_translation_decodes_under_bf16_autocast(model_and_tokenizer, monkeypatch):
    model, tokenizer = model_and_tokenizer
    autocast_seen = []
    generate = model.generate

    def recording_generate(*args, **kwargs):
        autocast_seen.append(
            torch.is_autocast_enabled("cpu") and torch.get_autocast_dtype("cpu") == torch.bfloat16
        )
        return generate(*args, **kwargs)

    monkeypatch.setattr(model, "generate", recording_generate)
    translate(model, tokenizer, SOURCES, batch_size=8, bf16=True, max_new_tokens=2)
    translate(model, tokenizer, SOURCES, batch_size=8, max_new_tokens=2)
    assert autocast_seen == [True, False]


def test_batches_decode_side_by_side_on_the_cpus_threads_with_the_same_translations(
    model_and_tokenizer, monkeypatch
):
    """With two torch threads, two batches decode at once, each on one intra-op thread (`decoding_workers`), without
    gradients and in bf16 autocast where asked (both are a thread's own state): the translations of one batch after
    another, in input order; torch's thread count is restored after, the memory check counts both batches, and a
    caller's logits processor (which may hold state) keeps the batches in turn."""
    model, tokenizer = model_and_tokenizer
    kwargs = dict(batch_size=2, num_beams=2, max_new_tokens=6, progress_bar=False)
    threads = torch.get_num_threads()
    generate, seen = model.generate, []
    together = [threading.Barrier(2, timeout=30)]  # broken unless two batches decode at once

    def recording_generate(*args, **settings):
        state = (torch.is_grad_enabled(), torch.is_autocast_enabled("cpu"))
        seen.append((threading.current_thread().name, torch.get_num_threads(), state))
        if len(seen) <= 2:
            together[0].wait()
        return generate(*args, **settings)

    try:
        torch.set_num_threads(1)
        one_after_another = translate(model, tokenizer, SOURCES, **kwargs)
        torch.set_num_threads(2)
        monkeypatch.setattr(model, "generate", recording_generate)
        assert translate(model, tokenizer, SOURCES, **kwargs) == one_after_another
        assert torch.get_num_threads() == 2
        assert len(seen) == 3 and {name.split("_")[0] for name, _, _ in seen} == {"hf-posenc-decoding"}
        assert {(intra, state) for _, intra, state in seen} == {(1, (False, False))}
        seen.clear()
        together[0] = threading.Barrier(2, timeout=30)
        translate(model, tokenizer, SOURCES, bf16=True, **kwargs)
        assert {(name.split("_")[0], state) for name, _, state in seen} == {
            ("hf-posenc-decoding", (False, True))
        }
        seen.clear()
        together[0] = threading.Barrier(2, timeout=1)
        processors = LogitsProcessorList()
        with pytest.raises(threading.BrokenBarrierError):  # one batch at a time: the first waits alone
            translate(model, tokenizer, SOURCES, logits_processor=processors, **kwargs)
        assert [name for name, _, _ in seen] == ["MainThread"]
        with pytest.raises(ValueError, match=r"^decoding 4 sentences x 1000000000000 beams at once"):
            translate(model, tokenizer, SOURCES, batch_size=2, num_beams=10**12, progress_bar=False)
    finally:
        torch.set_num_threads(threads)


# id: (decoding settings given to translate, or saved in the model's generation config; words of the error)
TRANSLATE_FAULTS = {
    "nan-length-penalty-given": (
        {"length_penalty": math.nan},
        {},
        ["length_penalty=nan must be a finite number", "given to translate"],
    ),
    "nan-length-penalty-saved": (
        {},
        {"length_penalty": math.nan},
        ["length_penalty=nan must be a finite number", "in the model's generation_config.json"],
    ),
    "infinite-length-penalty": (
        {"length_penalty": math.inf},
        {},
        ["length_penalty=inf must be a finite number"],
    ),
    "no-new-tokens": ({"max_new_tokens": 0}, {}, ["max_new_tokens=0 must be at least 1"]),
    "batch-size-0": ({"batch_size": 0}, {}, ["batch_size=0 must be at least 1"]),
    "fractional-batch-size": ({"batch_size": 2.5}, {}, ["batch_size=2.5 must be a whole number at least 1"]),
}


@pytest.mark.parametrize("given, saved, words", list(TRANSLATE_FAULTS.values()), ids=list(TRANSLATE_FAULTS))
def test_translate_refuses_settings_that_decode_garbage(
    given, saved, words, bpe_tokenizer, monkeypatch, tiny_model
):
    """A NaN length penalty ranks every beam alike: the output collapses and nothing fails. Refused."""
    model = tiny_model()
    model.generation_config.update(**saved)
    monkeypatch.setattr(model, "generate", lambda *args, **kwargs: pytest.fail("decoded"))
    with pytest.raises(ValueError) as error:
        translate(model, bpe_tokenizer, SOURCES, **given)
    for word in words:
        assert word in str(error.value)


def test_split_sentences_translates_each_sentence_alone_and_joins_them_in_order(model_dir):
    """`split_sentences=True` (the length harness's ceiling, and a document's fallback): a text of three sentences
    comes back as the three sentences' own translations, joined with a space; token ids cannot be split."""
    model, tokenizer = load_translation_model(model_dir)
    sentences = [source if source.endswith((".", "!", "?")) else source + "." for source in SOURCES[:3]]
    alone = translate(model, tokenizer, sentences, num_beams=2, max_new_tokens=8)
    joined = translate(
        model, tokenizer, [" ".join(sentences)], split_sentences=True, num_beams=2, max_new_tokens=8
    )
    assert joined == [" ".join(alone)]
    with pytest.raises(ValueError, match="split_sentences=True needs source texts"):
        translate(model, tokenizer, [[5, 6, 1]], split_sentences=True)


def test_translate_decodes_through_the_fast_loop_unless_told_not_to(model_dir, monkeypatch):
    """The pipeline's one decoding loop switches the fast loop on (fast_decoding.py) for hf_posenc's models, with
    the same translations as transformers' loop; `fast_decoding=False` turns it off."""
    model, tokenizer = load_translation_model(model_dir)
    calls = []
    loop = fast_decoding.fast_generate
    monkeypatch.setattr(fast_decoding, "fast_generate", lambda *args: calls.append(1) or loop(*args))
    monkeypatch.setattr(generation_length, "fast_generate", fast_decoding.fast_generate)
    fast = translate(model, tokenizer, SOURCES, batch_size=4, progress_bar=False)
    assert calls and fast == translate(
        model, tokenizer, SOURCES, batch_size=4, progress_bar=False, fast_decoding=False
    )
    assert len(calls) == math.ceil(len(SOURCES) / 4)  # the second translate did not use it
