"""Lightweight convolution (Wu et al. 2019; paper 2 Eq. 14), the `"lightconv"` token mixer."""

import torch
from torch import nn
from transformers import initialization as init

from .base import DECODER_SELF_ATTENTION, ENCODER_SELF_ATTENTION, PAPER_2, Hyperparameter
from .mixer_base import PositionMixer, zero_disallowed


class LightConv(PositionMixer):
    """Lightweight convolution (Wu et al. 2019; paper 2 Eq. 14):
    c_n = Σ_k softmax(W_h)_k · GLU(W^V x)_{n+k−K}, 2K+1 taps shared by the D_h channels of head h.

    Centred in the encoder (keys n−K..n+K); causal in the decoder (keys n−2K..n, Wu et al.'s left padding).
    The kernel gets DropConnect (`lightconv_weight_dropout`) while training; a weight matrix over (q, k)
    replaces the convolution so that one decoding step reads the cached values like attention does.
    """

    title = "LightConv"
    reference = "paper 2 Eq. 14 (Wu et al. 2019)"
    citations = (
        "Wu, Fan, Baevski, Dauphin, Auli 2019. Pay Less Attention with Lightweight and Dynamic Convolutions. ICLR.",
        PAPER_2,
    )
    hyperparameters = {
        "lightconv_kernel_radius": Hyperparameter(
            int, 16, "K: kernels have 2K+1 taps (paper 2 §5.2: 16 base, 8 big)", minimum=0
        ),
        "lightconv_weight_dropout": Hyperparameter(
            float,
            0.1,
            "DropConnect on the softmax-normalised kernel (Wu et al. 2019)",
            minimum=0.0,
            below=1.0,
        ),
    }
    allowed_sites = (ENCODER_SELF_ATTENTION, DECODER_SELF_ATTENTION)

    def __init__(self, config, site, layer_idx):
        super().__init__(config, site, layer_idx)
        self.kernel_radius = config.lightconv_kernel_radius
        self.weight_dropout = config.lightconv_weight_dropout
        self.v_proj = nn.Linear(self.embed_dim, 2 * self.embed_dim)  # GLU input
        self.kernel = nn.Parameter(torch.empty(self.num_heads, 2 * self.kernel_radius + 1))
        self.reset_parameters()

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
