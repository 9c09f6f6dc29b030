"""Hard-coded Gaussian attention (You et al. 2020; paper 2 Eq. 12), the `"gaussian"` token mixer."""

import math

import torch
from transformers import initialization as init

from .base import DECODER_SELF_ATTENTION, ENCODER_SELF_ATTENTION, PAPER_2
from .mixer_base import PositionMixer, zero_disallowed


class GaussianNet(PositionMixer):
    """Hard-coded Gaussian attention (You et al. 2020; paper 2 Eq. 12): W_nm = N(m; n + o_h, σ = 1).

    Head h is centred on offset o_h = offsets[h mod len(offsets)] (encoder: previous/current/next token,
    decoder: previous/current token, as in the reference code); the weights are not renormalised, masked keys
    get 0.
    Self-attention only: You et al. report a large loss in cross-attention and paper 2 keeps it content-based.
    """

    title = "GaussianNet"
    reference = "paper 2 Eq. 12 (You et al. 2020)"
    citations = (
        "You, Sun, Iyyer 2020. Hard-Coded Gaussian Attention for Neural Machine Translation. ACL.",
        PAPER_2,
    )
    allowed_sites = (ENCODER_SELF_ATTENTION, DECODER_SELF_ATTENTION)
    encoder_offsets = (-1, 0, 1)
    decoder_offsets = (-1, 0)
    std = 1.0

    def __init__(self, config, site, layer_idx):
        super().__init__(config, site, layer_idx)
        offsets = self.decoder_offsets if self.is_causal else self.encoder_offsets
        self.register_buffer("head_offsets", self.offsets_per_head(offsets), persistent=False)

    def offsets_per_head(self, offsets) -> torch.Tensor:
        return torch.tensor([float(offsets[h % len(offsets)]) for h in range(self.num_heads)])

    def reset_parameters(self):
        offsets = self.decoder_offsets if self.is_causal else self.encoder_offsets
        init.copy_(self.head_offsets, self.offsets_per_head(offsets))

    def mixing_weights(self, attention_mask, context, dtype):
        distance = context.key_positions[:, None, :] - context.query_positions[:, :, None]  # (B|1, q, k)
        deviation = (distance[:, None] - self.head_offsets[None, :, None, None]) / self.std  # (B|1, H, q, k)
        weights = torch.exp(-0.5 * deviation**2) / (self.std * math.sqrt(2 * math.pi))
        return zero_disallowed(weights.to(dtype), attention_mask, context, self.is_causal)
