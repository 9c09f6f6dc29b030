"""Decode-time length control in the CTranslate2 export (generation_length.py's keys): what CTranslate2 can
express (the per-source minimum length, the loop guard) decodes as `generate` does; the word reward and the
sentence count are refused by name, at export and at decoding."""

import pytest
import torch

from tests.helpers import EOS, SOURCES

ctranslate2 = pytest.importorskip("ctranslate2")

from hf_posenc.pipeline.evaluation.decoding import translate  # noqa: E402
from hf_posenc.pipeline.export.ctranslate2 import (  # noqa: E402
    CTranslate2Model,
    decoding_options,
    export_ctranslate2,
    length_control_for_ctranslate2,
    min_decoding_length,
)

RATIO = 1.5
LONGER = [*SOURCES, "a man and a woman sit on the grass", "two children play"]


def eager_model(tiny_model):
    """A tiny model whose `</s>` is the best token at every step: without length control it writes nothing."""
    model = tiny_model()
    with torch.no_grad():
        model.final_logits_bias[0, EOS] = 1.0
    return model


def export(model, tokenizer, tmp_path) -> CTranslate2Model:
    model.save_pretrained(tmp_path / "model")
    tokenizer.save_pretrained(tmp_path / "model")
    export_ctranslate2(tmp_path / "model", tmp_path / "ct2")
    return CTranslate2Model.load(tmp_path / "ct2", threads=1)


@pytest.mark.parametrize("num_beams", [1, 4])
def test_the_minimum_length_ratio_and_its_loop_guard_decode_as_generate_does(
    num_beams, tiny_model, toy_tokenizer, tmp_path
):
    model = eager_model(tiny_model)
    ours = export(model, toy_tokenizer, tmp_path)
    settings = dict(num_beams=num_beams, early_stopping=True)  # CTranslate2 stops at beam_size finished
    assert set(translate(model, toy_tokenizer, LONGER, batch_size=4, **settings)) == {""}
    expected = translate(model, toy_tokenizer, LONGER, batch_size=4, min_length_ratio=RATIO, **settings)
    lengths = [len(toy_tokenizer(text)["input_ids"]) for text in expected]  # the words and </s>
    sources = [len(toy_tokenizer(text)["input_ids"]) for text in LONGER]
    assert lengths == [max(2, -(-3 * n // 2)) for n in sources]  # ⌈1.5·|x|⌉ (a word at least)
    given = ours.translate(
        LONGER, beam_size=num_beams, batch_size=4, length_control={"min_length_ratio": RATIO}
    )
    assert given == expected
    assert ours.translate(LONGER, beam_size=num_beams, batch_size=4) == [""] * len(LONGER)


def test_a_saved_minimum_length_ratio_is_exported_and_applied(tiny_model, toy_tokenizer, tmp_path):
    model = eager_model(tiny_model)
    model.generation_config.min_length_ratio = RATIO
    model.generation_config.early_stopping = True
    ours = export(model, toy_tokenizer, tmp_path)
    assert ours.generation_config.min_length_ratio == RATIO
    assert ours.translate(LONGER, batch_size=3) == translate(model, toy_tokenizer, LONGER, batch_size=3)


def test_the_loop_guard_and_the_minimum_map_onto_translate_batch_options(tiny_model, toy_tokenizer):
    settings = tiny_model().generation_config
    vocabulary = toy_tokenizer.convert_ids_to_tokens(list(range(len(toy_tokenizer))))
    assert decoding_options(settings, vocabulary)["no_repeat_ngram_size"] == 0
    on = {"min_length_ratio": RATIO}
    assert decoding_options(settings, vocabulary, length_control=on)["no_repeat_ngram_size"] == 8
    explicit = {**on, "no_repeat_ngram_size": 0}
    assert decoding_options(settings, vocabulary, length_control=explicit)["no_repeat_ngram_size"] == 0
    control = length_control_for_ctranslate2(settings, on, len(vocabulary))
    assert min_decoding_length(control, 0, 7) == 10  # </s> may be the 11th token, ⌈1.5 · 7⌉
    assert min_decoding_length(control, 12, 7) == 12  # the generation config's own minimum is larger
    off = length_control_for_ctranslate2(settings, None, len(vocabulary))
    assert min_decoding_length(off, 3, 7) == 3


@pytest.mark.parametrize(
    "key, value, words",
    [
        ("word_reward", 0.5, ["word_reward=0.5", "no per-word reward"]),
        ("match_source_sentence_count", True, ["match_source_sentence_count=True", "sentence ends"]),
        ("window_sentences", 2, ["window_sentences=2", "decodes each input whole"]),
    ],
)
def test_what_ctranslate2_cannot_express_is_refused_by_name(
    key, value, words, tiny_model, toy_tokenizer, tmp_path
):
    settings = tiny_model().generation_config
    settings.sentence_end_token_ids = [5]
    vocabulary = toy_tokenizer.convert_ids_to_tokens(list(range(len(toy_tokenizer))))
    with pytest.raises(ValueError) as refusal:
        decoding_options(settings, vocabulary, length_control={key: value})
    assert all(word in str(refusal.value) for word in words), str(refusal.value)
    model = tiny_model()
    setattr(model.generation_config, key, value)
    model.generation_config.sentence_end_token_ids = [5]
    with pytest.raises(ValueError, match=key):
        export(model, toy_tokenizer, tmp_path)
    assert not (tmp_path / "ct2").exists()
    with pytest.raises(ValueError, match="min_length_ratio=-1"):  # bad values as generate refuses them
        decoding_options(settings, vocabulary, length_control={"min_length_ratio": -1})
