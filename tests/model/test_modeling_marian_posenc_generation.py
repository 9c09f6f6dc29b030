"""`generate` on our models: settings that would decode garbage without an error are refused by name, decoding
logs no deprecation of transformers' cache argument names, and assisted decoding crops the positional state of
recurrent encodings and sentence-aware positions back to the accepted tokens (it equals greedy decoding)."""

import json
import logging

import pytest
import torch
from transformers import GenerationConfig
from transformers.utils import logging as transformers_logging

from hf_posenc import MarianPosEncForConditionalGeneration
from hf_posenc.base import PosEncCache

# Setting -> the value refused, with the other settings that make `generate` read it.
NON_FINITE_SETTINGS = {
    "length_penalty": (float("nan"), {"num_beams": 2}),
    "temperature": (float("inf"), {"do_sample": True}),
    "top_p": (float("nan"), {"do_sample": True}),
    "repetition_penalty": (float("nan"), {}),
    "diversity_penalty": (float("nan"), {"num_beams": 2, "num_beam_groups": 2}),
    "exponential_decay_length_penalty": ((2, float("nan")), {}),
}


@pytest.fixture(scope="module")
def model(tiny_model):
    return tiny_model()


@pytest.fixture(scope="module")
def source(source_batch):
    return source_batch()


@pytest.mark.parametrize("name", NON_FINITE_SETTINGS)
def test_non_finite_generation_settings_are_refused_wherever_they_come_from(name, model, source, tmp_path):
    """Before: a NaN length penalty returned NaN scores and a collapsed output, with no error. A non-finite
    float setting is refused naming the setting, the value and its origin: a keyword argument, a
    GenerationConfig given to generate, or the model's saved generation_config.json."""
    value, companions = NON_FINITE_SETTINGS[name]
    ids, mask = source
    call = dict(attention_mask=mask, max_new_tokens=3, **companions)
    with pytest.raises(
        ValueError, match=rf"{name}=.*(nan|inf).* must be a finite number \(given to generate\)"
    ):
        model.generate(ids, **call, **{name: value})
    config = GenerationConfig(**{**model.generation_config.to_dict(), name: value})
    with pytest.raises(
        ValueError, match=rf"{name}=.* must be a finite number \(in the generation_config given"
    ):
        model.generate(ids, generation_config=config, **call)

    model.save_pretrained(tmp_path)
    saved = json.loads((tmp_path / "generation_config.json").read_text())
    (tmp_path / "generation_config.json").write_text(json.dumps({**saved, name: value}))  # json writes NaN
    loaded = MarianPosEncForConditionalGeneration.from_pretrained(tmp_path)
    with pytest.raises(
        ValueError, match=rf"{name}=.* must be a finite number \(in the model's generation config"
    ):
        loaded.generate(ids, **call)


@pytest.mark.parametrize("name", ["num_beams", "num_return_sequences", "max_new_tokens"])
def test_counts_below_one_are_refused(name, model, source):
    ids, mask = source
    with pytest.raises(ValueError, match=rf"{name}=0 must be at least 1 \(given to generate\)"):
        model.generate(ids, attention_mask=mask, **{"max_new_tokens": 3, name: 0})


@pytest.mark.parametrize("fast", [False, True], ids=["transformers-loop", "fast-loop"])
def test_a_budget_over_the_source_given_to_generate_is_the_one_used(fast, model, source):
    """Before: `generate(max_new_tokens_over_source=2)` was read by neither loop (the saved 50 held)."""
    ids, mask = source
    out = model.generate(ids, attention_mask=mask, max_new_tokens_over_source=2, fast_decoding=fast)
    assert out.shape[-1] <= 1 + ids.shape[-1] + 2


@pytest.mark.parametrize("value", [-5, 2.5, "50"])
def test_a_budget_over_the_source_that_is_no_whole_number_from_zero_is_refused_by_name(value, model, source):
    """Before: max_new_tokens_over_source=-5 silently cut every translation below the source length, "50" failed
    with a TypeError on `int + str`, 2.5 was reported as max_new_tokens=... "given to generate", a setting no one
    gave. The saved budget is named with its origin, before it is added to the source length."""
    ids, mask = source
    config = GenerationConfig(**{**model.generation_config.to_dict(), "max_new_tokens_over_source": value})
    with pytest.raises(
        ValueError,
        match=rf"max_new_tokens_over_source={value!r} must be a whole number of at least 0 \(in the generation_config",
    ):
        model.generate(ids, attention_mask=mask, generation_config=config)


def test_a_negative_loop_guard_is_refused(model, source):
    """Before: no_repeat_ngram_size=-1 turned the loop guard off without a word (transformers applies it only
    above 0); 0 is the way to turn it off."""
    ids, mask = source
    with pytest.raises(ValueError, match=r"no_repeat_ngram_size=-1 must be a whole number of at least 0"):
        model.generate(ids, attention_mask=mask, max_new_tokens=3, no_repeat_ngram_size=-1)
    model.generate(ids, attention_mask=mask, max_new_tokens=3, no_repeat_ngram_size=0)


def test_finite_settings_decode_as_before(model, source):
    """The check refuses nothing finite: beam search with a length penalty still decodes."""
    ids, mask = source
    out = model.generate(ids, attention_mask=mask, max_new_tokens=3, num_beams=2, length_penalty=0.6)
    assert out.shape[0] == ids.shape[0]


def test_forward_and_generate_log_no_cache_name_deprecation(caplog, model, source, target_batch):
    """Before: every forward logged transformers 5.24's "`past_key_values`/`cache_params` are deprecated. Use
    `cache` instead." (the outputs were built and read under the old field name). transformers logs it once per
    process, so its once-only memory is cleared first."""
    ids, mask = source
    transformers_logging.get_logger("transformers").warning_once.cache_clear()
    with caplog.at_level(logging.WARNING):
        out = model(
            input_ids=ids, attention_mask=mask, decoder_input_ids=target_batch()[:, :4], use_cache=True
        )
        model.generate(ids, attention_mask=mask, max_new_tokens=3, num_beams=2)
        model.generate(ids, attention_mask=mask, max_new_tokens=3, num_beams=1)
    assert "deprecated" not in caplog.text, caplog.text
    cache = out["cache"] if "cache" in out else out["past_key_values"]  # the output's own field name
    assert isinstance(cache, PosEncCache) and cache.get_seq_length() == 4


ASSISTED = {
    "rpe_head": {"position_encoding": "rpe_head"},
    "mpr_head-lstm-hidden": {"position_encoding": "mpr_head", "rpe_cell": "lstm", "rpe_recurrence": "hidden"},
    "sentence-aware": {"position_encoding": "sinusoidal", "sentence_end_token_ids": [5, 7, 9]},
}


@pytest.mark.parametrize("name", ASSISTED)
def test_assisted_decoding_equals_greedy_decoding_with_positional_state(
    name, monkeypatch, tiny_model, source
):
    """Before: assisted decoding refused any cache with positional state ("cannot be cropped"). The state after
    each token is kept, so cropping the rejected draft tokens returns to the state after the accepted ones:
    with a different model as the assistant (whose drafts are mostly rejected, so both caches are cropped),
    the tokens and per-step scores equal plain greedy decoding."""
    model, assistant = tiny_model(seed=0, **ASSISTED[name]), tiny_model(seed=1, **ASSISTED[name])
    crops = []
    crop = PosEncCache.crop
    monkeypatch.setattr(PosEncCache, "crop", lambda cache, n: crops.append(n) or crop(cache, n))
    ids = source[0][:1]  # transformers' assisted decoding takes one sequence
    settings = dict(num_beams=1, max_new_tokens=12, output_scores=True, return_dict_in_generate=True)
    greedy = model.generate(ids, **settings)
    assisted = model.generate(ids, assistant_model=assistant, **settings)
    assert any(crops), "no draft token was rejected: the test does not exercise cropping"
    assert assisted.sequences.tolist() == greedy.sequences.tolist()
    torch.testing.assert_close(torch.stack(assisted.scores), torch.stack(greedy.scores))
