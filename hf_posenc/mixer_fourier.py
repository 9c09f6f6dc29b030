"""FourierNet (paper 2 Eq. 11), the `"fourier"` token mixer: a 1-D DFT along the sequence."""

import math

import torch

from .base import ENCODER_SELF_ATTENTION, PAPER_2
from .mixer_base import PositionMixer, zero_disallowed


class FourierNet(PositionMixer):
    """FourierNet (paper 2 Eq. 11): c_n = Re(Σ_m exp(−2πi·nm/M) W^V x_m) / √M = Σ_m cos(2π nm/M) W^V x_m / √M.

    A 1-D DFT along the sequence with value and output projections (paper 2 §2.2, not FNet's 2-D transform).
    M is each sequence's own length (the largest key position + 1), so padding does not change the transform.
    The 1/√M is the reference code's (its DFT matrix is unitary; Eq. 11 leaves the scale out): without it the
    output grows with the sentence length, which fixed projections cannot undo. The DFT depends on the whole
    sequence, hence encoder only (paper 2 §5.2).
    """

    title = "FourierNet"
    reference = "paper 2 Eq. 11"
    citations = (PAPER_2,)
    allowed_sites = (ENCODER_SELF_ATTENTION,)

    def mixing_weights(self, attention_mask, context, dtype):
        lengths = context.key_positions.amax(-1, keepdim=True) + 1  # (B|1, 1)
        phase = context.query_positions[:, :, None] * context.key_positions[:, None, :]  # (B|1, q, k)
        lengths = lengths[:, :, None].double()  # (B|1, 1, 1)
        weights = (torch.cos(2 * math.pi * phase.double() / lengths) / lengths.sqrt()).to(dtype)[:, None]
        return zero_disallowed(weights, attention_mask, context, self.is_causal)  # (B|1, 1, q, k)
