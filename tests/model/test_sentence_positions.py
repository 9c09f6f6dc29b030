"""Sentence-aware positions (`sentence_end_token_ids`, hf_posenc/sentence_positions.py): positions restart at each
sentence, the sentence index is a signal of its own, and cross-attention may take a sentence bias; every option
exact with and without the cache, under greedy and beam search."""

import json
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest
import torch

import hf_posenc
from hf_posenc import POSITION_ENCODINGS, MarianPosEncForConditionalGeneration
from hf_posenc.base import PositionLimitError
from hf_posenc.sentence_positions import SentenceBoundaries
from tests.helpers import EOS, PAD, decode_with_cache, record_host_reads_from

ENDS = [5, 11, 17, 23, 29]
SENTENCES = {"sentence_end_token_ids": ENDS}
WITH_BIAS = {**SENTENCES, "sentence_cross_attention_bias": True}
RESTARTABLE = [name for name, cls in POSITION_ENCODINGS.items() if cls.supports_sentence_positions]


@pytest.fixture
def sentence_batch(source_batch, target_batch):
    """Sources and targets (the decoder start token first) with several sentence ends per row."""
    src, mask = source_batch()
    src[0, [2, 6]] = torch.tensor([5, 17])
    src[1, 3] = 11
    tgt = target_batch()
    tgt[0, [2, 3, 6]] = torch.tensor([5, 23, 29])  # two ends in a row: a one-token sentence
    tgt[1, 4] = 11
    return src, mask, tgt


def talkative(model):
    """The model, with logits that depend on the decoder state (a larger embedding scale: a random tiny model
    otherwise repeats one token) and leaning toward the sentence ends, so that beams differ in their sentences."""
    with torch.no_grad():
        model.model.shared.weight.mul_(5.0)
        model.final_logits_bias[0, ENDS] = 1.0
    return model


def test_positions_restart_after_each_sentence_end_and_the_closing_eos_stays_in_its_sentence(tiny_config):
    boundaries = SentenceBoundaries(tiny_config(**SENTENCES))
    ids = torch.tensor([[7, 8, 5, 9, 11, 12, 13, 17, EOS, PAD]])
    mask = torch.tensor([[1, 1, 1, 1, 1, 1, 1, 1, 1, 0]])
    found = boundaries(ids, torch.arange(10)[None], mask)
    assert found.positions.tolist() == [[0, 1, 2, 0, 1, 0, 1, 2, 3, 4]]
    assert found.indices.tolist() == [[0, 0, 0, 1, 1, 2, 2, 2, 2, 2]]


def test_sentence_positions_do_not_depend_on_left_padding(tiny_config):
    boundaries = SentenceBoundaries(tiny_config(**SENTENCES))
    ids = torch.tensor([[7, 5, 9, EOS], [PAD, 7, 5, 9]])
    mask = torch.tensor([[1, 1, 1, 1], [0, 1, 1, 1]])
    order = (mask.cumsum(-1) - 1).clamp(min=0)
    found = boundaries(ids, order, mask)
    assert found.positions[1, 1:].tolist() == found.positions[0, :3].tolist() == [0, 1, 0]
    assert found.indices[1, 1:].tolist() == found.indices[0, :3].tolist() == [0, 0, 1]


@pytest.mark.parametrize("split", [1, 3, 5])
def test_carried_state_continues_the_sequence_exactly(split, tiny_config):
    """What the decoder cache carries: the positions of a sequence found in two calls, the second one resuming
    from the first one's state, are those of one call over the whole sequence."""
    boundaries = SentenceBoundaries(tiny_config(**SENTENCES))
    ids = torch.tensor([[PAD, 7, 5, 5, 8, 11, 9, 9], [PAD, 5, 7, 7, 7, 17, 23, 4]])
    whole = boundaries(ids, torch.arange(8)[None])
    first = boundaries(ids[:, :split], torch.arange(split)[None])
    second = boundaries(ids[:, split:], torch.arange(split, 8)[None], state=first.state)
    assert torch.cat([first.positions, second.positions], 1).tolist() == whole.positions.tolist()
    assert torch.cat([first.indices, second.indices], 1).tolist() == whole.indices.tolist()
    assert second.state.tolist() == whole.state.tolist()


@pytest.mark.parametrize("encoding", ["sinusoidal", "learned"])
def test_the_stack_input_is_token_plus_in_sentence_position_plus_sentence_row(
    encoding, tiny_model, sentence_batch
):
    model = tiny_model(position_encoding=encoding, **SENTENCES)
    src, mask, tgt = sentence_batch
    with torch.no_grad():
        out = model(input_ids=src, attention_mask=mask, decoder_input_ids=tgt, output_hidden_states=True)
    for stack, ids, hidden, padding in (
        (model.model.encoder, src, out.encoder_hidden_states[0], mask),
        (model.model.decoder, tgt, out.decoder_hidden_states[0], None),
    ):
        found = stack.sentence_boundaries(ids, torch.arange(ids.shape[1])[None], padding)
        table = stack.position_encoding.table if encoding == "sinusoidal" else stack.position_encoding.weight
        expected = stack.embed_tokens(ids) * stack.embed_scale + table[found.positions]
        expected = expected + stack.sentence_embedding.weight[found.indices]
        rows = slice(None) if padding is None else padding.bool()
        torch.testing.assert_close(hidden[rows], expected[rows])
        assert found.positions[0].max() < ids.shape[1] - 2  # row 0's positions did restart


@pytest.mark.parametrize("encoding", RESTARTABLE)
@pytest.mark.parametrize("bias", [False, True], ids=["", "cross-bias"])
def test_incremental_decoding_equals_full_forward(encoding, bias, tiny_model, sentence_batch):
    model = tiny_model(position_encoding=encoding, **(WITH_BIAS if bias else SENTENCES))
    src, mask, tgt = sentence_batch
    with torch.no_grad():
        encoder_outputs = model.get_encoder()(input_ids=src, attention_mask=mask)
        full = model(encoder_outputs=encoder_outputs, attention_mask=mask, decoder_input_ids=tgt).logits
        for prefill in (1, 4):
            incremental = decode_with_cache(model, encoder_outputs, mask, tgt, prefill)
            torch.testing.assert_close(incremental, full, atol=1e-4, rtol=1e-4)


@pytest.mark.parametrize("encoding", ["sinusoidal", "t5_bias"])
def test_a_reordered_and_repeated_cache_continues_the_reordered_sequences(
    encoding, tiny_model, sentence_batch
):
    """What beam search does to the cache: after 5 cached tokens the rows are permuted (`reorder_cache`) and each
    repeated twice (`batch_repeat_interleave`); the next steps' logits are those of a full forward over the
    permuted and repeated prefixes followed by the new tokens."""
    model = tiny_model(position_encoding=encoding, **WITH_BIAS)
    src, mask, tgt = sentence_batch
    split, order = 5, torch.tensor([2, 0, 1])
    with torch.no_grad():
        encoder_outputs = model.get_encoder()(input_ids=src, attention_mask=mask)
        cache = model(
            encoder_outputs=encoder_outputs,
            attention_mask=mask,
            decoder_input_ids=tgt[:, :split],
            use_cache=True,
        ).past_key_values
        cache.reorder_cache(order)
        cache.batch_repeat_interleave(2)
        moved = {
            "encoder_outputs": type(encoder_outputs)(
                last_hidden_state=encoder_outputs.last_hidden_state[order].repeat_interleave(2, 0),
                sentence_indices=encoder_outputs.sentence_indices[order].repeat_interleave(2, 0),
            ),
            "attention_mask": mask[order].repeat_interleave(2, 0),
        }
        suffix = tgt[:, split:].flip(0).repeat_interleave(2, 0)  # other rows' continuations
        steps = []
        for step in range(suffix.shape[1]):
            out = model(
                **moved, decoder_input_ids=suffix[:, step : step + 1], past_key_values=cache, use_cache=True
            )
            cache = out.past_key_values
            steps.append(out.logits)
        sequences = torch.cat([tgt[order, :split].repeat_interleave(2, 0), suffix], dim=1)
        full = model(**moved, decoder_input_ids=sequences).logits[:, split:]
    torch.testing.assert_close(torch.cat(steps, dim=1), full, atol=1e-4, rtol=1e-4)


@pytest.mark.parametrize("encoding", ["sinusoidal", "rope", "t5_bias", "alibi"])
def test_greedy_and_beam_search_are_identical_with_and_without_cache(encoding, tiny_model, sentence_batch):
    model = talkative(tiny_model(position_encoding=encoding, **WITH_BIAS))
    src, mask, _ = sentence_batch
    greedy = dict(attention_mask=mask, max_new_tokens=14, num_beams=1, do_sample=False)
    cached, uncached = (model.generate(src, use_cache=use, **greedy) for use in (True, False))
    assert cached.tolist() == uncached.tolist()
    assert torch.isin(cached, torch.tensor(ENDS)).sum(-1).min() >= 2  # several sentences per row
    beam = dict(greedy, num_beams=4, output_scores=True, return_dict_in_generate=True, length_penalty=0.6)
    cached, uncached = (model.generate(src, use_cache=use, **beam) for use in (True, False))
    assert cached.sequences.tolist() == uncached.sequences.tolist()
    assert torch.isin(cached.sequences, torch.tensor(ENDS)).sum(-1).min() >= 2
    for step_cached, step_uncached in zip(cached.scores, uncached.scores, strict=True):
        finite = torch.isfinite(step_uncached)
        assert torch.equal(finite, torch.isfinite(step_cached))
        torch.testing.assert_close(step_cached[finite], step_uncached[finite], atol=1e-4, rtol=1e-4)


def test_a_strong_sentence_bias_confines_each_target_sentence_to_its_source_sentence(
    tiny_model, sentence_batch
):
    """With a large negative bias at every sentence difference but 0 (G-Transformer's group attention), the
    cross-attention of a target token falls on the source tokens of its own sentence only."""
    model = tiny_model(attn_implementation="eager", **WITH_BIAS)
    with torch.no_grad():
        model.model.decoder.sentence_cross_attention_bias.weight.fill_(-1e4)
        model.model.decoder.sentence_cross_attention_bias.weight[
            :, model.config.sentence_cross_attention_max_distance
        ] = 0
    src, mask, tgt = sentence_batch
    with torch.no_grad():
        out = model(input_ids=src, attention_mask=mask, decoder_input_ids=tgt, output_attentions=True)
        encoder = model.get_encoder()(input_ids=src, attention_mask=mask)
    found = model.model.decoder.sentence_boundaries(tgt, torch.arange(tgt.shape[1])[None])
    same = found.indices[:, :, None] == encoder.sentence_indices[:, None, :]  # (B, T, S)
    has_source = (same & mask[:, None, :].bool()).any(-1)  # target sentences the source has
    for weights in out.cross_attentions:  # (B, H, T, S)
        outside = (weights * ~same[:, None]).sum(-1)  # (B, H, T)
        assert outside[has_source[:, None].expand_as(outside)].max() < 1e-6


def test_the_cross_attention_bias_gives_the_same_logits_through_sdpa_and_eager(tiny_model, sentence_batch):
    src, mask, tgt = sentence_batch
    logits = []
    for implementation in ("sdpa", "eager"):
        model = tiny_model(attn_implementation=implementation, **WITH_BIAS)
        with torch.no_grad():
            logits.append(model(input_ids=src, attention_mask=mask, decoder_input_ids=tgt).logits)
    torch.testing.assert_close(logits[0], logits[1], atol=1e-5, rtol=1e-4)


def test_each_sentence_option_changes_the_output(tiny_model, sentence_batch):
    """Restarting positions, the sentence embedding and the cross-attention bias each reach the logits."""
    src, mask, tgt = sentence_batch
    outputs = {}
    for name, overrides in {
        "plain": {},
        "restart": {**SENTENCES, "sentence_embedding": "none"},
        "embedding": SENTENCES,
    }.items():
        with torch.no_grad():
            outputs[name] = tiny_model(**overrides)(
                input_ids=src, attention_mask=mask, decoder_input_ids=tgt
            ).logits
    model = tiny_model(**WITH_BIAS)
    with torch.no_grad():
        outputs["bias"] = model(input_ids=src, attention_mask=mask, decoder_input_ids=tgt).logits
        model.model.decoder.sentence_cross_attention_bias.weight.zero_()
        outputs["bias zeroed"] = model(input_ids=src, attention_mask=mask, decoder_input_ids=tgt).logits
    names = list(outputs)
    for before, after in zip(names, names[1:], strict=False):
        assert not torch.allclose(outputs[before], outputs[after]), (before, after)


def test_save_and_reload_keeps_the_fields_and_the_logits(tmp_path, tiny_model, sentence_batch):
    model = tiny_model(**WITH_BIAS, max_sentences=8, sentence_cross_attention_max_distance=2)
    model.save_pretrained(tmp_path)
    saved = json.loads((tmp_path / "config.json").read_text())
    assert saved["sentence_end_token_ids"] == ENDS
    assert (saved["max_sentences"], saved["sentence_cross_attention_max_distance"]) == (8, 2)
    assert saved["sentence_cross_attention_bias"] is True and saved["sentence_embedding"] == "learned"
    assert (tmp_path / "sentence_positions.py").is_file()
    reloaded = MarianPosEncForConditionalGeneration.from_pretrained(tmp_path).eval()
    src, mask, tgt = sentence_batch
    with torch.no_grad():
        before = model(input_ids=src, attention_mask=mask, decoder_input_ids=tgt).logits
        after = reloaded(input_ids=src, attention_mask=mask, decoder_input_ids=tgt).logits
    assert torch.equal(before, after)


def test_a_checkpoint_without_the_sentence_parameters_is_refused_naming_the_choice(tmp_path, tiny_model):
    """A config.json edited to sentence-aware positions over weights trained without them would start the sentence
    table and bias at random: loading refuses, naming the config choices."""
    tiny_model().save_pretrained(tmp_path)
    saved = json.loads((tmp_path / "config.json").read_text())
    (tmp_path / "config.json").write_text(json.dumps({**saved, **WITH_BIAS}))
    with pytest.raises(
        ValueError, match=r"sentence_cross_attention_bias=True: .*sentence_embedding='learned': "
    ):
        MarianPosEncForConditionalGeneration.from_pretrained(tmp_path)


REMOTE_CODE_CHECK = textwrap.dedent(
    """
    import json, sys
    sys.modules["hf_posenc"] = None  # the package must not be importable
    import torch
    from transformers import AutoModelForSeq2SeqLM
    torch.set_num_threads(1)
    folder = sys.argv[1]
    model = AutoModelForSeq2SeqLM.from_pretrained(folder, trust_remote_code=True).eval()
    src, mask = torch.load(folder + "/inputs.pt")
    generated = model.generate(src, attention_mask=mask, num_beams=4, max_new_tokens=10)
    print(json.dumps({"module": type(model).__module__, "generated": generated.tolist()}))
    """
)


def test_a_saved_folder_loads_and_decodes_with_trust_remote_code_without_the_package(
    tmp_path, tiny_model, sentence_batch
):
    torch.set_num_threads(1)
    model = talkative(tiny_model(position_encoding="rope", **WITH_BIAS))
    model.save_pretrained(tmp_path)
    src, mask, _ = sentence_batch
    torch.save((src, mask), tmp_path / "inputs.pt")
    expected = model.generate(src, attention_mask=mask, num_beams=4, max_new_tokens=10).tolist()
    completed = subprocess.run(
        [sys.executable, "-c", REMOTE_CODE_CHECK, str(tmp_path)], capture_output=True, text=True, cwd=tmp_path
    )
    assert completed.returncode == 0, completed.stderr
    result = json.loads(completed.stdout.strip().splitlines()[-1])
    assert result["module"].startswith("transformers_modules")
    assert result["generated"] == expected


def test_more_sentences_than_the_table_holds_raise_a_position_limit_error(tiny_model, sentence_batch):
    model = tiny_model(**SENTENCES, max_sentences=2)
    src, mask, tgt = sentence_batch  # source row 0 holds three sentences
    with pytest.raises(PositionLimitError, match=r"'sentence embedding' table \(config.max_sentences=2\)"):
        model(input_ids=src, attention_mask=mask, decoder_input_ids=tgt)
    with torch.no_grad():
        encoder_outputs = model.get_encoder()(input_ids=src[1:], attention_mask=mask[1:])
        with pytest.raises(PositionLimitError, match=r"config.max_sentences=2"):
            decode_with_cache(model, encoder_outputs, mask[1:], tgt[:1].expand(2, -1), prefill=1)


@pytest.mark.parametrize(
    ("overrides", "message"),
    [
        ({"sentence_end_token_ids": [EOS]}, r"sentence_end_token_ids=\[1\] holds \[1\], the end-of-sequence"),
        ({"sentence_end_token_ids": [PAD, 5]}, r"holds \[0\]"),
        (
            {"sentence_end_token_ids": [5, 5]},
            r"sentence_end_token_ids=\[5, 5\] must be distinct token ids in 0..59",
        ),
        ({"sentence_end_token_ids": [60]}, r"must be distinct token ids in 0..59"),
        (
            {**SENTENCES, "sentence_embedding": "sinusoidal"},
            r"sentence_embedding='sinusoidal' .*learned, none",
        ),
        ({**SENTENCES, "max_sentences": 0}, r"max_sentences=0 must be >= 1"),
        ({"sentence_cross_attention_bias": True}, r"sentence_cross_attention_bias=True would do nothing"),
        ({"max_sentences": 8}, r"max_sentences=8 would do nothing"),
        (
            {**SENTENCES, "sentence_embedding": "none", "max_sentences": 8},
            r"max_sentences=8 would do nothing",
        ),
        ({**SENTENCES, "sentence_cross_attention_max_distance": 5}, r"max_distance=5 would do nothing"),
        ({**SENTENCES, "position_encoding": "shaw"}, r"encoder_position_encoding='shaw' cannot take .*rope"),
        (
            {**SENTENCES, "decoder_position_encoding": "mpr_head"},
            r"decoder_position_encoding='mpr_head' cannot",
        ),
        (
            {**SENTENCES, "decoder_self_attention": "lightconv"},
            r"decoder_self_attention='lightconv' .*allowed there: attention",
        ),
        (
            {**WITH_BIAS, "cross_attention": "rposnet"},
            r"cross_attention='rposnet' .*allowed there: attention",
        ),
        (
            {**SENTENCES, "randomized_positions_max": 64},
            r"randomized_positions_max=64 and sentence_end_token_ids=.* cannot both be set",
        ),
    ],
)
def test_bad_sentence_settings_are_refused_naming_the_value(overrides, message, tiny_config):
    with pytest.raises(ValueError, match=message):
        tiny_config(**overrides)


def test_without_sentence_ends_the_position_free_cross_mixers_stay_allowed(tiny_config):
    tiny_config(**SENTENCES, cross_attention="rposnet")  # no bias: cross-attention keeps its plain positions


def test_inputs_embeds_are_refused_since_sentence_ends_are_found_in_token_ids(tiny_model, sentence_batch):
    model = tiny_model(**SENTENCES)
    src, mask, tgt = sentence_batch
    with pytest.raises(ValueError, match=r"find sentence ends in the token ids: pass input_ids"):
        model(inputs_embeds=model.get_input_embeddings()(src), attention_mask=mask, decoder_input_ids=tgt)


def test_decoding_steps_read_nothing_back_from_the_device(monkeypatch, tiny_model, sentence_batch):
    """The sentence state lives in the cache on the device: a decoding step reads no tensor into Python while the
    target is shorter than the sentence table."""
    model = talkative(tiny_model(position_encoding="t5_bias", **WITH_BIAS))
    src, mask, _ = sentence_batch
    with torch.no_grad():
        encoder_outputs = model.get_encoder()(input_ids=src, attention_mask=mask)
        reads = record_host_reads_from(Path(hf_posenc.__file__).parent, monkeypatch)
        tokens, cache = torch.zeros(src.shape[0], 1, dtype=torch.long), None
        for _ in range(6):
            out = model(
                encoder_outputs=encoder_outputs,
                attention_mask=mask,
                decoder_input_ids=tokens[:, -1:],
                past_key_values=cache,
                use_cache=True,
            )
            cache = out.past_key_values
            tokens = torch.cat([tokens, out.logits[:, -1].argmax(-1, keepdim=True)], dim=1)
    assert [read for read in reads if not read.endswith(" in check_token_ids")] == []
