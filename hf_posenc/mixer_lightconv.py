"""Lightweight convolution (Wu et al. 2019; paper 2 Eq. 14), the `"lightconv"` token mixer."""

import torch
from torch import nn
from transformers import initialization as init

from .base import DECODER_SELF_ATTENTION, ENCODER_SELF_ATTENTION
from .mixer_base import PositionMixer, zero_disallowed


class LightConv(PositionMixer):
    """Lightweight convolution (Wu et al. 2019; paper 2 Eq. 14):
    c_n = Σ_k softmax(W_h)_k · GLU(W^V x)_{n+k−K}, 2K+1 taps shared by the D_h channels of head h.

    Centred in the encoder (keys n−K..n+K); causal in the decoder (keys n−2K..n, Wu et al.'s left padding).
    The kernel gets DropConnect (`lightconv_weight_dropout`) while training; a weight matrix over (q, k)
    replaces the convolution so that one decoding step reads the cached values like attention does.
    """

    allowed_sites = (ENCODER_SELF_ATTENTION, DECODER_SELF_ATTENTION)

    def __init__(self, config, site, layer_idx):
        super().__init__(config, site, layer_idx)
        self.kernel_radius = config.lightconv_kernel_radius
        self.weight_dropout = config.lightconv_weight_dropout
        self.v_proj = nn.Linear(self.embed_dim, 2 * self.embed_dim)  # GLU input
        self.kernel = nn.Parameter(torch.empty(self.num_heads, 2 * self.kernel_radius + 1))
        self.reset_parameters()

    @classmethod
    def check_config(cls, config, site):
        if config.lightconv_kernel_radius < 0:
            raise ValueError(f"lightconv_kernel_radius={config.lightconv_kernel_radius} must be >= 0.")
        if not 0.0 <= config.lightconv_weight_dropout < 1.0:
            raise ValueError(f"lightconv_weight_dropout={config.lightconv_weight_dropout} must be in [0, 1).")

    def reset_parameters(self):
        init.xavier_uniform_(self.kernel)

    def project_values(self, states):
        return nn.functional.glu(self.v_proj(states), dim=-1)  # (B, k, D)

    def mixing_weights(self, attention_mask, context, dtype):
        kernel = torch.softmax(self.kernel, dim=-1)
        kernel = nn.functional.dropout(kernel, p=self.weight_dropout, training=self.training)  # (H, 2K+1)
        # Tap index of each key: 0 is the leftmost tap, K the query itself in the encoder, 2K in the decoder.
        last_tap = 2 * self.kernel_radius if self.is_causal else self.kernel_radius
        tap = (
            context.key_positions[:, None, :] - context.query_positions[:, :, None] + last_tap
        )  # (B|1, q, k)
        inside = (tap >= 0) & (tap <= 2 * self.kernel_radius)
        weights = kernel[:, tap.clamp(0, 2 * self.kernel_radius)].transpose(0, 1)  # (B|1, H, q, k)
        weights = weights.masked_fill(~inside[:, None], 0.0).to(dtype)
        return zero_disallowed(weights, attention_mask, context, self.is_causal)
