"""The encodings built for inputs longer than the training ones: FIRE and KERPLE against their equations computed
pair by pair, their constraints and long inputs, and the SHAPE training option (random position shifts)."""

import math

import pytest
import torch
from conftest import PAD, VOCAB, decode_with_cache, source_batch, target_batch, tiny_config, tiny_model

from hf_posenc import POSITION_ENCODINGS, MarianPosEncForConditionalGeneration, PositionContext
from hf_posenc.base import all_positions_context
from hf_posenc.posenc_kerple import MAX_POWER, PARAMETER_FLOOR


def encoder_context(encoding, lengths: list[int], total: int) -> PositionContext:
    """Right-padded encoder positions (B, total), counted as the model counts them (padding clamped)."""
    keep = torch.arange(total)[None] < torch.tensor(lengths)[:, None]  # (B, L)
    positions = (keep.long().cumsum(-1) - 1).clamp(min=0)
    return PositionContext(encoding, positions, positions)


def decoder_context(encoding, past: int, new: int, offsets=(0,)) -> PositionContext:
    """Decoder self-attention after `past` cached tokens: queries past..past+new-1, keys 0..past+new-1, each
    row shifted by its offset (SHAPE)."""
    keys = torch.arange(past + new)[None] + torch.tensor(offsets)[:, None]  # (B, k)
    return PositionContext(encoding, keys[:, past:], keys)


def visible_pairs(context: PositionContext, causal: bool) -> torch.Tensor:
    """(B, 1, q, k) bool: the (query, key) pairs whose bias attention uses."""
    visible = torch.ones(context.query_positions.shape[1], context.key_positions.shape[1], dtype=torch.bool)
    if causal:
        visible = context.key_positions[:, None, :] <= context.query_positions[:, :, None]
    return visible.expand(context.key_positions.shape[0], -1, -1)[:, None]


# ---------------------------------------------------------------------------------------------------- FIRE


def fire_reference(encoding, context: PositionContext) -> torch.Tensor:
    """b_h(i, j) = f_θ(ψ(|i - j|) / (ψ(max(L, s)) + 1e-6))_h, ψ(x) = log(|c| x + 1), pair by pair in float64:
    s = i and the first MLP for keys j <= i; in the encoder s = n - 1 - i and the second MLP for keys j > i.
    Returns (B, H, q, k)."""
    c = abs(float(encoding.c.detach()))
    threshold = abs(float(encoding.threshold_multiplier.detach())) * encoding.initial_threshold
    hidden_weight, hidden_bias, output_weight, output_bias = (
        parameter.detach().double()
        for parameter in (
            encoding.hidden_weight,
            encoding.hidden_bias,
            encoding.output_weight,
            encoding.output_bias,
        )
    )

    def psi(x):
        return math.log(c * x + 1)

    batch, queries = context.query_positions.shape
    keys = context.key_positions.shape[1]
    bias = torch.zeros(batch, output_bias.shape[-1], queries, keys, dtype=torch.float64)
    for b in range(batch):
        last = int(context.key_positions[b].max())
        for q, i in enumerate(context.query_positions[b].tolist()):
            for k, j in enumerate(context.key_positions[b].tolist()):
                direction, size = (1, last - i) if encoding.bidirectional and j > i else (0, i)
                x = psi(abs(i - j)) / (psi(max(threshold, size)) + 1e-6)
                hidden = torch.relu(x * hidden_weight[direction] + hidden_bias[direction])
                bias[b, :, q, k] = hidden @ output_weight[direction] + output_bias[direction]
    return bias


def randomised_fire(model, stack: str):
    """The stack's FIRE with large random MLP weights, |c| = 0.7 stored as -0.7, L = 4.5 stored as m = -1.5, so
    that a wrong index, a missing absolute value or a wrong normaliser row cannot hide."""
    encoding = getattr(model.model, stack).position_encoding
    with torch.no_grad():
        for parameter in (
            encoding.hidden_weight,
            encoding.hidden_bias,
            encoding.output_weight,
            encoding.output_bias,
        ):
            parameter.normal_()
        encoding.c.fill_(-0.7)
        encoding.threshold_multiplier.fill_(-1.5)
    return encoding


@pytest.mark.parametrize(
    "stack, layout",
    [
        ("encoder", "padded"),
        ("decoder", "full"),
        ("decoder", "cached"),
        ("decoder", "shifted"),
    ],
)
def test_fire_bias_equals_the_equation_pair_by_pair(stack, layout):
    """FIRE's grid-and-gather bias equals f_θ(ψ(|i - j|) / ψ(max(L, s))) for every visible pair: the decoder's
    causal form (full forward, a cached step, rows shifted by SHAPE) and our bidirectional encoder extension
    (mirrored normaliser n - 1 - i and a second MLP for keys after the query), with queries on both sides of
    L = 4.5 and right padding."""
    model = tiny_model(position_encoding="fire", fire_init_threshold=3.0)
    encoding = randomised_fire(model, stack)
    context = {
        "padded": lambda: encoder_context(encoding, [9, 5], 9),
        "full": lambda: decoder_context(encoding, 0, 9),
        "cached": lambda: decoder_context(encoding, 6, 3),
        "shifted": lambda: decoder_context(encoding, 0, 7, offsets=(0, 3)),
    }[layout]()
    with torch.no_grad():
        actual = encoding.score_bias(0, context)
    expected = fire_reference(encoding, context).float()
    visible = visible_pairs(context, causal=stack == "decoder").expand_as(actual)
    assert actual.shape == expected.shape
    torch.testing.assert_close(actual[visible], expected[visible], atol=1e-5, rtol=1e-5)


def test_fire_piecewise_linear_evaluation_equals_the_relu_mlp():
    """f_θ is evaluated piece by piece between the kinks of its hidden units; values equal the plain ReLU MLP on
    any inputs, kinks included, with units of zero slope (never switching) and units sharing a kink, and so do
    the gradients away from the kinks (at a kink either one-sided derivative is a valid subgradient)."""
    model = tiny_model(position_encoding="fire", fire_mlp_width=8)
    encoding = model.model.encoder.position_encoding
    with torch.no_grad():
        for parameter in (encoding.hidden_weight, encoding.hidden_bias, encoding.output_weight):
            parameter.normal_()
        encoding.hidden_weight[1, :2] = 0.0  # no slope: always on (bias > 0) or always off
        encoding.hidden_bias[1, :2] = torch.tensor([0.5, -0.5])
        encoding.hidden_weight[1, 2:4] = torch.tensor([2.0, -1.0])  # both switch at x = 0.25
        encoding.hidden_bias[1, 2:4] = torch.tensor([-0.5, 0.25])
    inputs = torch.cat([torch.randn(5, 40) * 3, torch.tensor([[0.25, 0.0, 1.0]]).expand(5, -1)], dim=1)
    parameters = [encoding.hidden_weight, encoding.hidden_bias, encoding.output_weight, encoding.output_bias]
    for direction in (0, 1):
        hidden = torch.relu(
            inputs[..., None] * encoding.hidden_weight[direction] + encoding.hidden_bias[direction]
        )
        plain = (hidden @ encoding.output_weight[direction] + encoding.output_bias[direction]).movedim(-1, 0)
        piecewise = encoding.mlp(direction, inputs)
        torch.testing.assert_close(piecewise, plain)
        weights = torch.randn_like(plain)[..., :40]  # the random inputs, none of them at a kink
        for expected, actual in zip(
            torch.autograd.grad((plain[..., :40] * weights).sum(), parameters),
            torch.autograd.grad((piecewise[..., :40] * weights).sum(), parameters),
            strict=True,
        ):
            torch.testing.assert_close(actual, expected, atol=1e-4, rtol=1e-4)


@pytest.mark.parametrize("threshold", [512.0, 4.0])
def test_fire_normalised_distances_stay_in_the_unit_interval_for_1000_positions(threshold):
    """Progressive interpolation: with f_θ the identity, the bias is the MLP's input, which lies in [0, 1] for
    every pair of a 1000-token encoder and decoder, with the threshold above and below the length; the
    encoder's keys after the query (our mirrored normaliser) reach 1 too instead of growing past it."""
    model = tiny_model(position_encoding="fire", fire_mlp_width=2, fire_init_threshold=threshold)
    for stack in ("encoder", "decoder"):
        encoding = getattr(model.model, stack).position_encoding
        with torch.no_grad():
            for parameter in (encoding.hidden_bias, encoding.output_bias, encoding.output_weight):
                parameter.zero_()
            encoding.hidden_weight.fill_(1.0)  # relu(x): the identity on x >= 0
            encoding.output_weight[:, 0].fill_(1.0)  # every head reads the first hidden unit
            context = all_positions_context(encoding, 1000)
            bias = encoding.score_bias(0, context)[0]  # (H, P, P)
        visible = visible_pairs(context, causal=stack == "decoder")[0, 0]  # (P, P)
        assert torch.isfinite(bias).all()
        assert bias[:, visible].min() >= 0 and bias[:, visible].max() <= 1 + 1e-5
        # the last query's first key sits at the largest distance its context allows, 999 > L: x = 1
        torch.testing.assert_close(bias[:, -1, 0], torch.ones(bias.shape[0]), atol=1e-5, rtol=0)
        if stack == "encoder":  # and the first query's last key, normalised by s = n - 1 - 0
            torch.testing.assert_close(bias[:, 0, -1], torch.ones(bias.shape[0]), atol=1e-5, rtol=0)


def test_fire_config_rejects_a_non_positive_c_or_threshold():
    for field in ("fire_init_c", "fire_init_threshold"):
        with pytest.raises(ValueError, match=rf"{field}=0.0 must be positive"):
            tiny_config(position_encoding="fire", **{field: 0.0})


def test_fire_defaults_are_the_papers():
    """f_θ: 1 -> 32 -> H with a ReLU; c = 0.1; L = 512 (a multiplier of 1 on it); in the encoder one MLP per
    direction."""
    model = tiny_model(position_encoding="fire")
    encoder, decoder = model.model.encoder.position_encoding, model.model.decoder.position_encoding
    assert encoder.hidden_weight.shape == (2, 32) and decoder.hidden_weight.shape == (1, 32)
    assert decoder.output_weight.shape == (1, 32, model.config.decoder_attention_heads)
    assert decoder.c.item() == pytest.approx(0.1)
    assert decoder.threshold().item() == 512.0


# -------------------------------------------------------------------------------------------------- KERPLE


def kerple_reference(encoding, context: PositionContext) -> torch.Tensor:
    """-r1_h log(1 + r2_h |i - j|) or -r1_h |i - j|^r2_h, pair by pair in float64: (B, H, q, k)."""
    r1, r2 = encoding.r1.detach().double(), encoding.r2.detach().double()
    batch, queries = context.query_positions.shape
    keys = context.key_positions.shape[1]
    bias = torch.zeros(batch, r1.shape[0], queries, keys, dtype=torch.float64)
    for b in range(batch):
        for q, i in enumerate(context.query_positions[b].tolist()):
            for k, j in enumerate(context.key_positions[b].tolist()):
                distance = abs(i - j)
                if encoding.kernel == "log":
                    bias[b, :, q, k] = -r1 * torch.log(1 + r2 * distance)
                else:
                    bias[b, :, q, k] = -r1 * distance**r2
    return bias


@pytest.mark.parametrize("kernel", ["log", "power"])
@pytest.mark.parametrize("stack", ["encoder", "decoder"])
def test_kerple_bias_equals_the_kernel_pair_by_pair(kernel, stack):
    """KERPLE-log and KERPLE-power: the bias from the distinct distances, gathered, equals the kernel of |i - j|
    for every pair, symmetric in the encoder (right padding) and after cached steps in the decoder."""
    model = tiny_model(position_encoding="kerple", kerple_kernel=kernel)
    encoding = getattr(model.model, stack).position_encoding
    with torch.no_grad():
        encoding.r1.copy_(torch.tensor([0.3, 1.7, 0.05, 4.0]))
        encoding.r2.copy_(torch.tensor([0.2, 1.9, 0.6, 1.0]))
    context = encoder_context(encoding, [8, 5], 8) if stack == "encoder" else decoder_context(encoding, 4, 4)
    with torch.no_grad():
        actual = encoding.score_bias(0, context)
    torch.testing.assert_close(actual, kerple_reference(encoding, context).float())


@pytest.mark.parametrize("kernel", ["log", "power"])
def test_kerple_parameters_start_in_range_and_are_projected_back_before_use(kernel):
    """r1, r2 start in the authors' ranges (log: r1 in (0, 2], r2 in (0, 1]; power: r1 in (0, 1], r2 in (0, 2]),
    floored at 0.01; values an optimizer step pushed out (negative, or a power above 2) are clamped back before
    the bias uses them, and the gradient reaches the clamped parameters."""
    model = tiny_model(position_encoding="kerple", kerple_kernel=kernel, seed=3)
    encoding = model.model.encoder.position_encoding
    r1_range, r2_range = (2.0, 1.0) if kernel == "log" else (1.0, 2.0)
    assert encoding.r1.min() >= PARAMETER_FLOOR and encoding.r1.max() <= r1_range
    assert encoding.r2.min() >= PARAMETER_FLOOR and encoding.r2.max() <= r2_range

    with torch.no_grad():  # as if an optimizer step had left the allowed range
        encoding.r1.copy_(torch.tensor([-1.0, 0.5, 3.0, 0.001]))
        encoding.r2.copy_(torch.tensor([-0.5, 2.5, 0.3, 1.0]))
    context = all_positions_context(encoding, 6)
    bias = encoding.score_bias(0, context)
    projected_r2 = [PARAMETER_FLOOR, 2.5 if kernel == "log" else MAX_POWER, 0.3, 1.0]
    torch.testing.assert_close(
        encoding.r1.detach(), torch.tensor([PARAMETER_FLOOR, 0.5, 3.0, PARAMETER_FLOOR])
    )
    torch.testing.assert_close(encoding.r2.detach(), torch.tensor(projected_r2))
    torch.testing.assert_close(bias.detach(), kerple_reference(encoding, context).float())
    bias.sum().backward()
    assert torch.isfinite(encoding.r1.grad).all() and (encoding.r1.grad != 0).all()
    assert torch.isfinite(encoding.r2.grad).all() and (encoding.r2.grad != 0).all()


def test_kerple_rejects_an_unknown_kernel():
    with pytest.raises(ValueError, match="kerple_kernel='cauchy' is not known; allowed values: log, power"):
        tiny_config(position_encoding="kerple", kerple_kernel="cauchy")


# ------------------------------------------------------------------------------------------ both encodings


@pytest.mark.parametrize("name", ["fire", "kerple"])
def test_a_1000_token_input_gives_finite_logits(name):
    """Both encodings have no length limit: a source of 1000 tokens (beyond FIRE's default threshold of 512)
    and a decoder prefix of 600 give finite logits."""
    model = tiny_model(position_encoding=name)
    generator = torch.Generator().manual_seed(0)
    src = torch.randint(2, VOCAB, (1, 1000), generator=generator)
    tgt = torch.randint(2, VOCAB, (1, 600), generator=generator)
    with torch.no_grad():
        logits = model(input_ids=src, decoder_input_ids=tgt).logits
    assert torch.isfinite(logits).all()


# --------------------------------------------------------------------------------------------------- SHAPE


def record_positions(model, monkeypatch) -> dict[str, list[PositionContext]]:
    """The contexts each stack's position encoding receives in `embed`."""
    seen = {"encoder": [], "decoder": []}
    for stack in seen:
        encoding = getattr(model.model, stack).position_encoding
        monkeypatch.setattr(
            encoding,
            "embed",
            lambda inputs, context, *args, f=encoding.embed, stack=stack: (
                seen[stack].append(context) or f(inputs, context, *args)
            ),
        )
    return seen


@pytest.mark.parametrize("name", ["sinusoidal", "learned", "posnet_embed"])
def test_shape_leaves_inference_unchanged(name):
    """SHAPE is a training-time shift: in eval mode a model built with shape_max_shift gives the logits of the
    same model without it."""
    src, mask = source_batch()
    logits = []
    for shift in (0, 8):
        model = tiny_model(position_encoding=name, shape_max_shift=shift)
        with torch.no_grad():
            logits.append(model(input_ids=src, attention_mask=mask, decoder_input_ids=target_batch()).logits)
    torch.testing.assert_close(logits[1], logits[0], atol=0, rtol=0)


def test_shape_shifts_each_training_sequence_by_one_offset_independently_per_stack(monkeypatch):
    """In training, every sequence's positions are its unshifted ones plus one offset k in [0, K] (both ends
    drawn), offsets differ between sequences, and encoder and decoder draw theirs independently (the paper's
    code shifts each stack's positions on its own). The spans handed along bound the shifted positions."""
    max_shift, batch, length = 3, 64, 6
    model = tiny_model(position_encoding="sinusoidal", shape_max_shift=max_shift).train()
    seen = record_positions(model, monkeypatch)
    src = torch.randint(2, VOCAB, (batch, length))
    mask = torch.ones_like(src)
    mask[1::2, 4:] = 0  # half the rows padded: their real tokens are shifted alike
    src[mask == 0] = PAD
    model(input_ids=src, attention_mask=mask, labels=torch.randint(2, VOCAB, (batch, 5)))

    offsets = {}
    for stack, unshifted in (
        ("encoder", (mask.cumsum(-1) - 1).clamp(min=0)),
        ("decoder", torch.arange(5).expand(batch, -1)),
    ):
        (context,) = seen[stack]
        positions = context.query_positions
        shift = positions[:, :1] - unshifted[:, :1]  # (B, 1)
        torch.testing.assert_close(positions, unshifted + shift, atol=0, rtol=0)
        assert set(shift.flatten().tolist()) == set(range(max_shift + 1))
        assert context.query_span[0] <= int(positions.min()) and int(positions.max()) <= context.query_span[1]
        assert context.key_span[0] <= int(context.key_positions.min())
        assert int(context.key_positions.max()) <= context.key_span[1]
        offsets[stack] = shift
    assert not torch.equal(offsets["encoder"], offsets["decoder"])


def test_shape_needs_a_learned_table_of_length_plus_max_shift():
    """With SHAPE, training positions reach length - 1 + K: a learned table shorter than that fails on every
    training batch with the error naming both sizes (not only when a large offset happens to be drawn), while
    the same input is fine at inference."""
    model = tiny_model(position_encoding="learned", shape_max_shift=8)  # max_position_embeddings = 64
    src = torch.randint(2, VOCAB, (2, 60))
    labels = torch.randint(2, VOCAB, (2, 5))
    with torch.no_grad():
        model(input_ids=src, labels=labels)
    model.train()
    with pytest.raises(ValueError, match=r"Sequence of 68 positions is longer than the 64 positions"):
        model(input_ids=src, labels=labels)
    with pytest.raises(ValueError, match=r"Sequence of 68 positions is longer than the 64 positions"):
        model(input_ids=src[:, :5], labels=torch.randint(2, VOCAB, (2, 60)))  # the decoder's table too


@pytest.mark.parametrize("name", ["t5_bias", "alibi", "kerple", "shaw", "rope"])
def test_shape_changes_nothing_for_shift_invariant_encodings(name):
    """Encodings that see only i - j are invariant to SHAPE's shifts: without dropout, a training forward with
    shape_max_shift gives the loss of one without it."""
    src, mask = source_batch()
    labels = target_batch()[:, 1:].clone()
    losses = []
    for shift in (0, 8):
        model = tiny_model(position_encoding=name, shape_max_shift=shift, dropout=0.0).train()
        losses.append(model(input_ids=src, attention_mask=mask, labels=labels).loss)
    torch.testing.assert_close(losses[1], losses[0], atol=1e-6, rtol=1e-5)


@pytest.mark.parametrize("name", list(POSITION_ENCODINGS))
def test_shape_training_step_is_finite_for_every_position_encoding(name):
    """SHAPE breaks no registered encoding: a training step with shifted positions gives a finite loss and
    finite gradients."""
    model = tiny_model(position_encoding=name, shape_max_shift=8).train()
    src, mask = source_batch()
    loss = model(input_ids=src, attention_mask=mask, labels=target_batch()[:, 1:].clone()).loss
    loss.backward()
    assert torch.isfinite(loss)
    for parameter_name, parameter in model.named_parameters():
        assert parameter.grad is None or torch.isfinite(parameter.grad).all(), parameter_name


def test_shape_offsets_stay_fixed_across_the_steps_of_a_cached_decode():
    """A cached decode in training mode keeps each sequence's first decoder offsets for all its steps, so it
    equals the full training forward drawn from the same random state."""
    model = tiny_model(position_encoding="learned", shape_max_shift=8, dropout=0.0).train()
    src, mask = source_batch()
    tgt = target_batch()
    with torch.no_grad():
        torch.manual_seed(5)
        encoder_outputs = model.get_encoder()(input_ids=src, attention_mask=mask)
        full = model(encoder_outputs=encoder_outputs, attention_mask=mask, decoder_input_ids=tgt).logits
        torch.manual_seed(5)
        encoder_outputs = model.get_encoder()(input_ids=src, attention_mask=mask)
        incremental = decode_with_cache(model, encoder_outputs, mask, tgt)
    torch.testing.assert_close(incremental, full, atol=1e-5, rtol=1e-4)


def test_shape_max_shift_must_not_be_negative():
    with pytest.raises(ValueError, match=r"shape_max_shift=-1 must be >= 0"):
        tiny_config(shape_max_shift=-1)
    assert MarianPosEncForConditionalGeneration(tiny_config(shape_max_shift=0)).config.shape_max_shift == 0
