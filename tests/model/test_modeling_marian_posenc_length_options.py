"""Three length-generalisation options (docs/length.md): randomized positions in training
(`randomized_positions_max`, Ruoss et al. 2023), log-length attention scaling (`log_length_scaling`, Chiang &
Cholak 2022) and RoPE scaling at inference (`rope_scaling`, transformers' ROPE_INIT_FUNCTIONS). The conformance
suite runs their variants (`learned-randomized`, `attention-log-length`, `rope-dynamic-scaling`,
`rope-yarn-scaling`) through the cache, beam search, save/load and remote-code checks; this file tests what each
option computes."""

import json

import pytest
import torch
from transformers import LlamaConfig
from transformers.modeling_rope_utils import ROPE_INIT_FUNCTIONS

from hf_posenc import MarianPosEncForConditionalGeneration
from hf_posenc.base import ATTENTION_SITES, PositionContext, PositionLimitError
from tests.helpers import PAD, VOCAB, decode_with_cache, record_positions

DRAWS = 48  # L of the randomized positions; the tiny models' tables hold 64
DYNAMIC = {"rope_type": "dynamic", "factor": 2.0, "original_max_position_embeddings": 4}
YARN = {"rope_type": "yarn", "factor": 4.0, "original_max_position_embeddings": 4}
DYNAMIC_YARN = {**YARN, "dynamic": True}
LINEAR = {"rope_type": "linear", "factor": 4.0}


def record_contexts(model, monkeypatch) -> dict[str, list[PositionContext]]:
    """The contexts each stack's position encoding receives in `embed`, and the decoder's first cross-attention
    mixer in its forward."""
    seen = {**record_positions(model, monkeypatch), "cross": []}
    cross = model.model.decoder.layers[0].encoder_attn
    original = cross.forward
    monkeypatch.setattr(
        cross,
        "forward",
        lambda *args, **kwargs: seen["cross"].append(kwargs["context"]) or original(*args, **kwargs),
    )
    return seen


def training_batch(batch=64, length=12):
    """Sources with every other row padded after 5 tokens, and labels."""
    src = torch.randint(2, VOCAB, (batch, length))
    mask = torch.ones_like(src)
    mask[1::2, 5:] = 0
    src[mask == 0] = PAD
    return src, mask, torch.randint(2, VOCAB, (batch, 7))


# Randomized positions


def test_randomized_positions_are_sorted_distinct_and_in_range_in_training(monkeypatch, tiny_model):
    """In training each real token's position is one of n sorted distinct draws from 0..L-1 (n the row's real
    tokens), rows and stacks draw differently, the spans bound the draws by L - 1, and cross-attention keeps
    the plain positions of both sides."""
    model = tiny_model(position_encoding="sinusoidal", randomized_positions_max=DRAWS).train()
    seen = record_contexts(model, monkeypatch)
    src, mask, labels = training_batch()
    model(input_ids=src, attention_mask=mask, labels=labels)
    draws = {}
    for stack, real in (("encoder", mask.bool()), ("decoder", torch.ones(64, 7, dtype=torch.bool))):
        (context,) = seen[stack]
        positions = context.query_positions
        assert positions.shape == real.shape
        assert context.query_span == context.key_span == (0, DRAWS - 1)
        for row in range(positions.shape[0]):
            kept = positions[row][real[row]]
            assert (kept.diff() > 0).all() and 0 <= int(kept.min()) and int(kept.max()) < DRAWS
        assert len({tuple(row.tolist()) for row in positions}) > 60  # every row draws its own
        draws[stack] = positions[:, :5]
    assert not torch.equal(draws["encoder"], draws["decoder"])
    (cross,) = seen["cross"]
    torch.testing.assert_close(cross.query_positions, torch.arange(7)[None], atol=0, rtol=0)
    torch.testing.assert_close(cross.key_positions, (mask.cumsum(-1) - 1).clamp(min=0), atol=0, rtol=0)


def test_randomized_positions_are_a_uniform_subset_per_row_padded_or_not(monkeypatch, tiny_model):
    """A row of n real tokens takes a uniform n-subset of 0..L-1: every position is drawn with probability n / L,
    in a padded row as in a full one (the first n of the batch's T sorted draws would favour small positions)."""
    model = tiny_model(position_encoding="sinusoidal", randomized_positions_max=16).train()
    seen = record_contexts(model, monkeypatch)
    src, mask, labels = training_batch(batch=4000, length=8)
    with torch.no_grad():
        model.get_encoder()(input_ids=src, attention_mask=mask)
    positions = seen["encoder"][0].query_positions
    for rows, n in ((slice(0, None, 2), 8), (slice(1, None, 2), 5)):
        real = positions[rows][mask[rows].bool()].reshape(-1, n)
        frequency = torch.bincount(real.flatten(), minlength=16).float() / real.shape[0]  # (L,)
        torch.testing.assert_close(frequency, torch.full((16,), n / 16), atol=0.05, rtol=0)


def test_randomized_positions_leave_inference_unchanged_and_deterministic(
    tiny_model, source_batch, target_batch
):
    """Only training draws: in eval mode the model gives the logits of the same model without the option, on
    every call."""
    src, mask = source_batch()
    logits = []
    for draws in (0, DRAWS, DRAWS):
        model = tiny_model(position_encoding="learned", randomized_positions_max=draws)
        with torch.no_grad():
            logits.append(model(input_ids=src, attention_mask=mask, decoder_input_ids=target_batch()).logits)
    for other in logits[1:]:
        torch.testing.assert_close(other, logits[0], atol=0, rtol=0)


@pytest.mark.parametrize("name", ["rope", "alibi", "t5_bias", "learned", "posnet_embed"])
def test_randomized_positions_reach_tables_rotations_and_biases(name, tiny_model, source_batch, target_batch):
    """Without dropout, a training forward with randomized positions differs from one without (the positions
    reach the table, the rotation or the bias), and a model takes an optimizer step with finite loss and
    gradients."""
    src, mask = source_batch()
    labels = target_batch()[:, 1:].clone()
    outputs = []
    for draws in (0, DRAWS):
        model = tiny_model(position_encoding=name, randomized_positions_max=draws, dropout=0.0).train()
        outputs.append(model(input_ids=src, attention_mask=mask, labels=labels))
    # each forward is deterministic but for the draw: the logits are equal unless the positions count
    assert not torch.equal(outputs[0].logits, outputs[1].logits)
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-3)
    outputs[1].loss.backward()
    assert all(p.grad is None or torch.isfinite(p.grad).all() for p in model.parameters())
    before = [p.detach().clone() for p in model.parameters()]
    optimizer.step()
    assert any(not torch.equal(b, p) for b, p in zip(before, model.parameters(), strict=True))
    assert torch.isfinite(model(input_ids=src, attention_mask=mask, labels=labels).loss)


def test_randomized_positions_refuse_a_cached_training_decode_and_a_too_long_sequence(
    tiny_model, source_batch, target_batch
):
    model = tiny_model(position_encoding="rope", randomized_positions_max=8).train()
    src, mask = source_batch(length=8)
    tgt = target_batch()
    out = model(input_ids=src, attention_mask=mask, decoder_input_ids=tgt[:, :2], use_cache=True)
    with pytest.raises(ValueError, match=r"randomized_positions_max=8.*after 2 cached ones.*model.eval"):
        model(
            input_ids=src,
            attention_mask=mask,
            decoder_input_ids=tgt[:, 2:3],
            past_key_values=out.past_key_values,
        )
    with pytest.raises(ValueError, match=r"got 9 new tokens.*fit in 8 positions"):
        model(input_ids=src, attention_mask=mask, decoder_input_ids=tgt)
    model.eval()
    decode_with_cache(model, model.get_encoder()(input_ids=src, attention_mask=mask), mask, tgt)


@pytest.mark.parametrize(
    "overrides, message",
    [
        ({"randomized_positions_max": -1}, r"randomized_positions_max=-1 must be >= 0"),
        (
            {"randomized_positions_max": 8, "shape_max_shift": 4},
            r"randomized_positions_max=8 and shape_max_shift=4",
        ),
        (
            {"randomized_positions_max": 8, "position_encoding": "shaw"},
            r"encoder_position_encoding='shaw'.*indices",
        ),
        (
            {"randomized_positions_max": 100, "position_encoding": "learned"},
            r"randomized_positions_max=100 .* encoder_position_encoding='learned' has a table of "
            r"max_position_embeddings=64 positions: set max_position_embeddings >= 100",
        ),
        (
            {
                "randomized_positions_max": 40,
                "position_encoding": "posnet_embed",
                "posnet_embed_max_positions": 32,
            },
            r"posnet_embed_max_positions=32 positions: set posnet_embed_max_positions >= 40",
        ),
        (
            {
                "randomized_positions_max": 100,
                "position_encoding": "rope",
                "decoder_self_attention": "rposnet",
            },
            r"decoder_self_attention='rposnet' has a table of max_position_embeddings=64",
        ),
        (
            {"randomized_positions_max": 8, "sentence_end_token_ids": [5]},
            r"randomized_positions_max=8 and sentence_end_token_ids=\[5\] cannot both be set",
        ),
        (
            {"randomized_positions_max": 8, "randomized_positions_inference": "mean"},
            r"randomized_positions_inference='mean' is not allowed: one of 'plain', 'spread'",
        ),
        (
            {"randomized_positions_inference": "spread"},
            r"randomized_positions_inference='spread' would do nothing.*randomized_positions_max",
        ),
    ],
)
def test_randomized_positions_config_errors_name_the_fields(overrides, message, tiny_config):
    with pytest.raises(ValueError, match=message):
        tiny_config(**overrides)


def test_spread_positions_are_the_expected_positions_of_the_training_draw(
    monkeypatch, tiny_model, source_batch, target_batch
):
    """Eq. 1 at inference: p_i = floor((i + 1)(L + 1) / (n + 1)) - 1 for each source of n real tokens (the mean of
    the (i + 1)-th smallest of n positions drawn from 0..L-1, which the training draws average to), and the
    decoder's tokens at their source's rate; a cached decode gets the positions of the full forward."""
    model = tiny_model(position_encoding="kerple", randomized_positions_max=DRAWS)
    model.config.randomized_positions_inference = "spread"
    src, mask = source_batch()
    tgt = target_batch()
    seen = record_positions(model, monkeypatch)
    with torch.no_grad():
        full = model(input_ids=src, attention_mask=mask, decoder_input_ids=tgt).logits
    lengths = mask.sum(-1, keepdim=True)  # (B, 1)
    expected = torch.arange(src.shape[1])[None] + 1
    expected = (expected * (DRAWS + 1)) // (lengths + 1) - 1  # (B, S)
    encoder = seen["encoder"][0].query_positions
    assert torch.equal(encoder[mask.bool()], expected[mask.bool()])
    decoder = seen["decoder"][0].query_positions  # (B, T): past L - 1 where the target outgrows its source
    assert torch.equal(decoder, (torch.arange(1, tgt.shape[1] + 1)[None] * (DRAWS + 1)) // (lengths + 1) - 1)
    generator = torch.Generator().manual_seed(0)  # 20,000 training draws of 9 positions average to Eq. 1
    draws = torch.rand(20000, DRAWS, generator=generator).argsort(-1)[:, :9].sort(-1).values.float().mean(0)
    torch.testing.assert_close(draws, (torch.arange(1, 10) * (DRAWS + 1) / 10 - 1).float(), atol=0.3, rtol=0)
    stepped = decode_with_cache(model, model.get_encoder()(input_ids=src, attention_mask=mask), mask, tgt)
    torch.testing.assert_close(stepped, full, atol=1e-5, rtol=1e-5)
    with torch.no_grad():  # and not the plain positions' logits
        model.config.randomized_positions_inference = "plain"
        assert not torch.allclose(
            model(input_ids=src, attention_mask=mask, decoder_input_ids=tgt).logits, full
        )


def test_spread_positions_refuse_a_source_longer_than_the_drawn_range(tiny_model, source_batch, target_batch):
    model = tiny_model(
        position_encoding="kerple", randomized_positions_max=8, randomized_positions_inference="spread"
    )
    src, mask = source_batch(length=9)
    with pytest.raises(
        PositionLimitError, match=r"9 positions is longer than the 8 positions.*randomized_positions_max"
    ):
        model(input_ids=src, attention_mask=torch.ones_like(mask), decoder_input_ids=target_batch())


def test_unbounded_encodings_take_any_randomized_range(tiny_config):
    config = tiny_config(position_encoding="rope", randomized_positions_max=1000)
    assert MarianPosEncForConditionalGeneration(config).config.randomized_positions_max == 1000


# Log-length attention scaling


def site_weights(model, src, mask, tgt, site: str) -> torch.Tensor:
    """Layer 0's attention weights at `site` (eager, returned by the model)."""
    out = model(input_ids=src, attention_mask=mask, decoder_input_ids=tgt, output_attentions=True)
    name = {
        "encoder_self_attention": "encoder_attentions",
        "decoder_self_attention": "decoder_attentions",
        "cross_attention": "cross_attentions",
    }[site]
    return getattr(out, name)[0]


@pytest.mark.parametrize("site", ATTENTION_SITES)
@pytest.mark.parametrize("encoding", ["sinusoidal", "t5_bias"])
def test_log_length_scaling_multiplies_the_logits_by_log_n(
    site, encoding, tiny_model, source_batch, target_batch
):
    """At the scaled site, softmax(log n · logits): n the keys each query may attend to (a padded source's real
    tokens; query position + 1 in the decoder's self-attention), recovered from the unscaled weights (log w is
    the logits up to a per-query constant). A score bias (T5) is added unscaled."""
    src, mask = source_batch()
    tgt = target_batch()
    weights = {}
    for sites in ([], [site]):
        model = tiny_model(position_encoding=encoding, log_length_scaling=sites, attn_implementation="eager")
        with torch.no_grad():
            weights[bool(sites)] = site_weights(model, src, mask, tgt, site)
    plain, scaled = weights[False], weights[True]  # (B, H, q, k)
    allowed = plain > 0
    counts = allowed.sum(-1, keepdim=True)  # (B, H, q, 1)
    if site == "decoder_self_attention":
        torch.testing.assert_close(counts[0, 0, :, 0], torch.arange(1, tgt.shape[1] + 1), atol=0, rtol=0)
    else:
        torch.testing.assert_close(counts[:, 0, 0, 0], mask.sum(-1), atol=0, rtol=0)
    if encoding == "t5_bias" and site != "cross_attention":
        assert not torch.allclose(scaled, torch.softmax(counts.log() * plain.log(), dim=-1).nan_to_num())
        return
    logits = plain.log().masked_fill(~allowed, 0) * counts.log()
    expected = torch.softmax(logits.masked_fill(~allowed, float("-inf")), dim=-1)
    torch.testing.assert_close(scaled, expected, atol=1e-5, rtol=1e-4)


def test_log_length_scaling_is_exact_with_the_cache_under_sdpa_and_eager(
    tiny_model, source_batch, target_batch
):
    """Incremental decoding equals the full forward at every scaled site (the decoder's n grows by one a step;
    cross-attention's is the source's real length), with SDPA's masks (None or boolean) and eager's float ones,
    and both give the same logits."""
    src, mask = source_batch()
    tgt = target_batch()
    results = []
    for implementation in ("sdpa", "eager"):
        model = tiny_model(log_length_scaling=list(ATTENTION_SITES), attn_implementation=implementation)
        with torch.no_grad():
            encoder_outputs = model.get_encoder()(input_ids=src, attention_mask=mask)
            full = model(encoder_outputs=encoder_outputs, attention_mask=mask, decoder_input_ids=tgt).logits
            incremental = decode_with_cache(model, encoder_outputs, mask, tgt)
        torch.testing.assert_close(incremental, full, atol=1e-5, rtol=1e-4)
        results.append(full)
    torch.testing.assert_close(results[0], results[1], atol=1e-5, rtol=1e-4)


@pytest.mark.parametrize(
    "overrides, message",
    [
        (
            {"log_length_scaling": ["encoder_self_attention"], "encoder_self_attention": "fourier"},
            r"log_length_scaling names 'encoder_self_attention', but encoder_self_attention='fourier'.*"
            r"encoder_self_attention='attention'",
        ),
        (
            {"log_length_scaling": ["cross_attention"], "cross_attention": "rposnet"},
            r"cross_attention='rposnet'",
        ),
        (
            {"log_length_scaling": ["decoder"]},
            r"log_length_scaling='decoder' is not known; allowed values: cross",
        ),
        ({"log_length_scaling": ["cross_attention"] * 2}, r"names a site twice"),
    ],
)
def test_log_length_scaling_config_errors(overrides, message, tiny_config):
    with pytest.raises(ValueError, match=message):
        tiny_config(**overrides)


# RoPE scaling


@pytest.fixture
def rope_logits(tiny_model, source_batch, target_batch):
    """`rope_logits(**overrides)`: a tiny rope model's logits on the shared batch."""

    def build(**overrides) -> torch.Tensor:
        src, mask = source_batch()
        model = tiny_model(position_encoding="rope", **overrides)
        with torch.no_grad():
            return model(input_ids=src, attention_mask=mask, decoder_input_ids=target_batch()).logits

    return build


def test_rope_scaling_absent_or_of_factor_one_is_bit_identical_to_rope(rope_logits, rope_encoding):
    heads = {"encoder_attention_heads": 2, "decoder_attention_heads": 2}  # d_h = 16: transformers' float32
    plain = rope_logits(**heads)  # frequencies differ from RoFormer's table in the last bit there
    for scaling in (None, {"rope_type": "linear", "factor": 1.0}, {**YARN, "factor": 1}):
        torch.testing.assert_close(rope_logits(rope_scaling=scaling, **heads), plain, atol=0, rtol=0)
    factor_one = {**YARN, "factor": 1, "attention_factor": 2.0}
    assert not torch.allclose(rope_logits(rope_scaling=factor_one, **heads), plain)
    assert not torch.allclose(rope_logits(rope_scaling=LINEAR, **heads), plain)
    table = rope_encoding(None, **heads).inverse_frequencies
    for scaling in ({"rope_type": "linear", "factor": 1.0}, {**YARN, "factor": 1}):
        torch.testing.assert_close(rope_encoding(scaling, **heads).inverse_frequencies, table, atol=0, rtol=0)


@pytest.fixture
def rope_encoding(tiny_model):
    """`rope_encoding(scaling, stack="encoder", **overrides)`: the rope encoding of a tiny model with `scaling`."""

    def build(scaling, stack="encoder", **overrides):
        model = tiny_model(position_encoding="rope", rope_scaling=scaling, **overrides)
        return getattr(model.model, stack).position_encoding

    return build


def test_linear_rope_scaling_turns_position_p_as_unscaled_rope_turns_p_over_f(rope_encoding):
    states = torch.randn(2, 4, 40, 8)  # (B, H, L, Dh)
    positions = torch.arange(40)[None]
    scaled = rope_encoding(LINEAR).rotate(states, positions)
    torch.testing.assert_close(
        scaled, rope_encoding(None).rotate(states, positions / 4), atol=1e-5, rtol=1e-5
    )


def transformers_rope(scaling: dict, trained: int):
    """A Llama config of the tiny model's head size with `scaling`: transformers' own path to the frequencies."""
    return LlamaConfig(
        hidden_size=32,
        num_attention_heads=4,
        head_dim=8,
        max_position_embeddings=trained,
        rope_parameters={**scaling, "rope_theta": 10000.0},
    )


def test_yarn_frequencies_and_attention_factor_are_transformers_own(rope_encoding):
    encoding = rope_encoding(YARN)
    inverse, factor = ROPE_INIT_FUNCTIONS["yarn"](transformers_rope(YARN, 4), None)
    torch.testing.assert_close(encoding.inverse_frequencies, inverse, atol=0, rtol=0)
    assert encoding.attention_factor == factor > 1
    states, positions = torch.randn(1, 4, 6, 8), torch.arange(6)[None]
    cos, sin = (
        (positions[0, :, None] * inverse).cos() * factor,
        (positions[0, :, None] * inverse).sin() * factor,
    )
    first, second = states.chunk(2, dim=-1)
    expected = torch.cat((first * cos - second * sin, second * cos + first * sin), dim=-1)
    torch.testing.assert_close(encoding.rotate(states, positions), expected, atol=1e-6, rtol=1e-5)


def test_dynamic_frequencies_are_transformers_own_per_source_and_per_decoder_position(rope_encoding):
    """The encoder rotates a source of n tokens with transformers' dynamic frequencies for seq_len = n (each
    source its own n, so padding changes nothing); the decoder rotates position p with those for p + 1 (what
    transformers' dynamic layer uses while decoding with a cache); within the training length both are
    RoFormer's, bit for bit."""
    reference = transformers_rope(DYNAMIC, 4)
    plain = rope_encoding(None).inverse_frequencies

    def expected(length):
        if length <= 4:
            return plain
        return ROPE_INIT_FUNCTIONS["dynamic"](reference, None, seq_len=length)[0]

    encoder = rope_encoding(DYNAMIC)
    for length in (3, 4, 7, 11):
        frequencies = encoder.dynamic_frequencies(torch.tensor([[length]]))[0][0, 0]
        torch.testing.assert_close(frequencies, expected(length), atol=0, rtol=0)
    captured = []
    decoder = rope_encoding(DYNAMIC, "decoder")
    original = decoder.dynamic_frequencies
    decoder.dynamic_frequencies = lambda lengths: captured.append(lengths) or original(lengths)
    query = key = torch.randn(1, 4, 6, 8)
    positions = torch.arange(6)[None]
    decoder.rotate_queries_keys(0, query, key, PositionContext(decoder, positions, positions))
    torch.testing.assert_close(captured[0], positions + 1, atol=0, rtol=0)
    encoder_positions = torch.tensor([[0, 1, 2, 3, 4, 5], [0, 1, 2, 2, 2, 2]])  # the second padded after 3
    captured.clear()
    encoder.dynamic_frequencies = lambda lengths: captured.append(lengths) or original(lengths)
    encoder.rotate_queries_keys(0, query, key, PositionContext(encoder, encoder_positions, encoder_positions))
    torch.testing.assert_close(captured[0], torch.tensor([[6], [3]]), atol=0, rtol=0)


def test_dynamic_yarn_is_transformers_yarn_at_the_factor_the_length_sets(rope_encoding):
    """Dynamic YaRN rotates a sequence of n tokens with transformers' YaRN frequencies and attention factor at the
    factor min(f, n / N) (N = 4, f = 4): RoFormer's, bit for bit, and 1 up to N; the encoder takes each source's
    own n, the decoder p + 1 for position p."""
    plain = rope_encoding(None).inverse_frequencies
    encoder = rope_encoding(DYNAMIC_YARN)
    assert encoder.attention_factor == 1.0  # nothing static
    states = torch.randn(1, 4, 6, 8)
    factors = []
    for length in (3, 4, 6, 11, 16, 40):
        frequencies, factor = encoder.dynamic_frequencies(torch.tensor([[length]]))
        if length <= 4:
            expected, expected_factor = plain, 1.0
        else:
            scaled = {**YARN, "factor": min(4.0, length / 4)}
            expected, expected_factor = ROPE_INIT_FUNCTIONS["yarn"](transformers_rope(scaled, 4), None)
        torch.testing.assert_close(frequencies[0, 0], expected, atol=0, rtol=0)
        assert factor[0, 0, 0].item() == pytest.approx(expected_factor, rel=1e-6)
        factors.append(factor.item())
        positions = torch.arange(6)[None]
        angles = positions[0, :, None] * expected
        first, second = states.chunk(2, dim=-1)
        cos, sin = angles.cos() * expected_factor, angles.sin() * expected_factor
        rotated = torch.cat((first * cos - second * sin, second * cos + first * sin), dim=-1)
        actual = encoder.rotate(states, positions, torch.tensor([[length]]))
        torch.testing.assert_close(actual, rotated, atol=1e-6, rtol=1e-5)
    assert factors[:2] == [1.0, 1.0] and factors[2] < factors[3] < factors[4] == factors[5]  # capped at f = 4
    decoder = rope_encoding(DYNAMIC_YARN, "decoder")
    captured, original = [], decoder.dynamic_frequencies
    decoder.dynamic_frequencies = lambda lengths: captured.append(lengths) or original(lengths)
    positions = torch.arange(6)[None]
    decoder.rotate_queries_keys(0, states, states, PositionContext(decoder, positions, positions))
    torch.testing.assert_close(captured[0], positions + 1, atol=0, rtol=0)
    mixed = decoder.dynamic_frequencies(torch.tensor([[2, 9], [9, 2]]))[0]  # one call, several lengths
    torch.testing.assert_close(mixed[0, 0], plain, atol=0, rtol=0)
    torch.testing.assert_close(mixed[0, 1], mixed[1, 0], atol=0, rtol=0)
    assert not torch.equal(mixed[0, 1], plain)


@pytest.mark.parametrize(
    "scaling", [LINEAR, DYNAMIC, YARN, DYNAMIC_YARN], ids=["linear", "dynamic", "yarn", "dynamic-yarn"]
)
def test_rope_scaling_is_exact_with_the_cache_and_changes_the_logits(
    scaling, tiny_model, source_batch, target_batch, rope_logits
):
    model = tiny_model(position_encoding="rope", rope_scaling=scaling)
    src, mask = source_batch()
    tgt = target_batch()
    with torch.no_grad():
        encoder_outputs = model.get_encoder()(input_ids=src, attention_mask=mask)
        full = model(encoder_outputs=encoder_outputs, attention_mask=mask, decoder_input_ids=tgt).logits
        for prefill in (1, 4):
            torch.testing.assert_close(decode_with_cache(model, encoder_outputs, mask, tgt, prefill), full)
    assert not torch.allclose(full, rope_logits())


def test_rope_scaling_is_set_at_load_time_and_saved(tmp_path, tiny_model, source_batch, target_batch):
    """A trained rope model reloaded with `from_pretrained(folder, rope_scaling=...)` computes what a model built
    with that config computes, and saves the setting in config.json; reloaded without it, it is plain rope."""
    model = tiny_model(position_encoding="rope")
    model.save_pretrained(tmp_path / "plain")
    src, mask = source_batch()
    scaled = MarianPosEncForConditionalGeneration.from_pretrained(
        tmp_path / "plain", rope_scaling=YARN
    ).eval()
    assert scaled.config.rope_scaling == YARN
    with torch.no_grad():
        logits = scaled(input_ids=src, attention_mask=mask, decoder_input_ids=target_batch()).logits
        reference = tiny_model(position_encoding="rope", rope_scaling=YARN)
        torch.testing.assert_close(
            logits, reference(input_ids=src, attention_mask=mask, decoder_input_ids=target_batch()).logits
        )
    scaled.save_pretrained(tmp_path / "scaled")
    assert json.loads((tmp_path / "scaled" / "config.json").read_text())["rope_scaling"] == YARN
    again = MarianPosEncForConditionalGeneration.from_pretrained(tmp_path / "scaled")
    assert (
        again.model.decoder.position_encoding.attention_factor
        == scaled.model.decoder.position_encoding.attention_factor
    )
    plain = MarianPosEncForConditionalGeneration.from_pretrained(tmp_path / "plain")
    assert plain.config.rope_scaling is None


@pytest.mark.parametrize(
    "overrides, message",
    [
        (
            {"rope_scaling": {"rope_type": "longrope", "factor": 2.0}},
            r"rope_scaling\['rope_type'\]='longrope' is not known; allowed values: linear, dynamic, yarn",
        ),
        (
            {"rope_scaling": LINEAR, "position_encoding": "sinusoidal"},
            r"rescales the 'rope' position encoding, which neither stack uses \(encoder_position_encoding="
            r"'sinusoidal', decoder_position_encoding='sinusoidal'\)",
        ),
        (
            {"rope_scaling": {"rope_type": "dynamic", "factor": 2.0}},
            r"needs original_max_position_embeddings",
        ),
        ({"rope_scaling": {**LINEAR, "rope_theta": 5.0}}, r"takes no rope_theta.*config field rope_theta"),
        ({"rope_scaling": {**LINEAR, "factor": 0.5}}, r"rope_scaling\['factor'\]=0.5 must be a number >= 1"),
        (
            {"rope_scaling": {**YARN, "beta_fast": 1, "beta_slow": 2}},
            r"beta_fast=1 must be larger than beta_slow=2",
        ),
        (
            {"rope_scaling": {**DYNAMIC, "original_max_position_embeddings": 0}},
            r"original_max_position_embeddings'\]=0 must be an integer >= 1",
        ),
        (
            {"rope_scaling": {**YARN, "dynamic": "yes"}},
            r"rope_scaling\['dynamic'\]='yes' must be True or False",
        ),
        (
            {"rope_scaling": {**DYNAMIC, "dynamic": True}},
            r"of type 'dynamic' takes no dynamic; its keys: factor, original_max_position_embeddings",
        ),
    ],
)
def test_rope_scaling_config_errors(overrides, message, tiny_config):
    with pytest.raises(ValueError, match=message):
        tiny_config(**{"position_encoding": "rope", **overrides})


def test_rope_scaling_applies_to_the_rope_stack_of_a_mixed_model(tiny_model, rope_encoding):
    model = tiny_model(
        encoder_position_encoding="sinusoidal", decoder_position_encoding="rope", rope_scaling=LINEAR
    )
    torch.testing.assert_close(
        model.model.decoder.position_encoding.inverse_frequencies, rope_encoding(None).inverse_frequencies / 4
    )
