"""FIRE (posenc_fire.py): the bias against the equation computed pair by pair, the piecewise-linear evaluation of
the MLP, the normalised distances, the constraints and defaults; FIRE and KERPLE on a 1000-token input."""

import math

import pytest
import torch

from hf_posenc import PositionContext
from hf_posenc.base import all_positions_context
from tests.helpers import VOCAB


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
def test_fire_bias_equals_the_equation_pair_by_pair(
    stack, layout, tiny_model, decoder_context, encoder_context
):
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


def test_fire_piecewise_linear_evaluation_equals_the_relu_mlp(tiny_model):
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
def test_fire_normalised_distances_stay_in_the_unit_interval_for_1000_positions(threshold, tiny_model):
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


def test_fire_config_rejects_a_non_positive_c_or_threshold(tiny_config):
    for field in ("fire_init_c", "fire_init_threshold"):
        with pytest.raises(ValueError, match=rf"{field}=0.0 must be positive"):
            tiny_config(position_encoding="fire", **{field: 0.0})


def test_fire_defaults_are_the_papers(tiny_model):
    """f_θ: 1 -> 32 -> H with a ReLU; c = 0.1; L = 512 (a multiplier of 1 on it); in the encoder one MLP per
    direction."""
    model = tiny_model(position_encoding="fire")
    encoder, decoder = model.model.encoder.position_encoding, model.model.decoder.position_encoding
    assert encoder.hidden_weight.shape == (2, 32) and decoder.hidden_weight.shape == (1, 32)
    assert decoder.output_weight.shape == (1, 32, model.config.decoder_attention_heads)
    assert decoder.c.item() == pytest.approx(0.1)
    assert decoder.threshold().item() == 512.0


# ------------------------------------------------------------------------------------------ both encodings


@pytest.mark.parametrize("name", ["fire", "kerple"])
def test_a_1000_token_input_gives_finite_logits(name, tiny_model):
    """Both encodings have no length limit: a source of 1000 tokens (beyond FIRE's default threshold of 512)
    and a decoder prefix of 600 give finite logits."""
    model = tiny_model(position_encoding=name)
    generator = torch.Generator().manual_seed(0)
    src = torch.randint(2, VOCAB, (1, 1000), generator=generator)
    tgt = torch.randint(2, VOCAB, (1, 600), generator=generator)
    with torch.no_grad():
        logits = model(input_ids=src, decoder_input_ids=tgt).logits
    assert torch.isfinite(logits).all()
