"""KERPLE (posenc_kerple.py): the bias against the kernel computed pair by pair, the parameters' ranges and
projection, and the kernel choice."""

import pytest
import torch

from hf_posenc import PositionContext
from hf_posenc.base import all_positions_context
from hf_posenc.posenc_kerple import MAX_POWER, PARAMETER_FLOOR


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
def test_kerple_bias_equals_the_kernel_pair_by_pair(
    kernel, stack, decoder_context, encoder_context, tiny_model
):
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
def test_kerple_parameters_start_in_range_and_are_projected_back_before_use(kernel, tiny_model):
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


def test_kerple_rejects_an_unknown_kernel(tiny_config):
    with pytest.raises(ValueError, match="kerple_kernel='cauchy' is not known; allowed values: log, power"):
        tiny_config(position_encoding="kerple", kerple_kernel="cauchy")
