"""Position-only token mixers compared in paper 2 (§2.2, Appendix A, Table 2): FourierNet, GaussianNet,
LinearNet, gLinearNet and LightConv, the `"fourier"`, `"gaussian"`, `"linear"`, `"glinear"`, `"lightconv"`
token mixers.

Every mixer is a `PositionMixer` (posenc_gated.py): values W^V x_m are cached like content attention's, and
the mixing weights W_nm come from the query/key positions of the `PositionContext` only. Each is written as
an explicit (q × k) weight matrix, so the same code serves training, padding and one-token decoding steps.
Recommended input embedding for all five: `position_encoding="sinusoidal"` (paper 2 §5.2).
"""

import math

import torch
from torch import nn
from transformers import initialization as init

from .posenc_base import DECODER_SELF_ATTENTION, ENCODER_SELF_ATTENTION, check_max_positions
from .posenc_gated import PositionMixer, allowed_keys


def zero_disallowed(weights, attention_mask, context, is_causal) -> torch.Tensor:
    """Unnormalised weights with padded (and, causally, future) keys set to 0."""
    allowed = allowed_keys(attention_mask, context, is_causal)
    return weights if allowed is None else weights.masked_fill(~allowed, 0.0)


class FourierNet(PositionMixer):
    """FourierNet (paper 2 Eq. 11): c_n = Re(Σ_m exp(−2πi·nm/M) W^V x_m) = Σ_m cos(2π nm/M) W^V x_m.

    A 1-D DFT along the sequence with value and output projections (paper 2 §2.2, not FNet's 2-D transform).
    M is each sequence's own length (the largest key position + 1), so padding does not change the transform.
    The DFT depends on the whole sequence, hence encoder only (paper 2 §5.2).
    """

    allowed_sites = (ENCODER_SELF_ATTENTION,)

    def mixing_weights(self, attention_mask, context, dtype):
        lengths = context.key_positions.amax(-1, keepdim=True) + 1  # (B|1, 1)
        phase = context.query_positions[:, :, None] * context.key_positions[:, None, :]  # (B|1, q, k)
        weights = torch.cos(2 * math.pi * phase.double() / lengths[:, :, None]).to(dtype)[:, None]
        return zero_disallowed(weights, attention_mask, context, self.is_causal)  # (B|1, 1, q, k)


class GaussianNet(PositionMixer):
    """Hard-coded Gaussian attention (You et al. 2020; paper 2 Eq. 12): W_nm = N(m; n + o_h, σ = 1).

    Head h is centred on offset o_h = offsets[h mod len(offsets)] (encoder: previous/next token, decoder:
    previous/current token, as in the reference code); the weights are not renormalised, masked keys get 0.
    Self-attention only: You et al. report a large loss in cross-attention and paper 2 keeps it content-based.
    """

    allowed_sites = (ENCODER_SELF_ATTENTION, DECODER_SELF_ATTENTION)
    encoder_offsets = (-1, 1)
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


class LinearNet(PositionMixer):
    """LinearNet (Tolstikhin et al. 2021; paper 2 Eq. 13): c_n = Σ_m W_nm W^V x_m with a learned per-head
    L_max × L_max matrix W indexed by (query position, key position); not normalised, causal in the decoder.
    """

    def __init__(self, config, site, layer_idx):
        super().__init__(config, site, layer_idx)
        self.max_positions = config.max_position_embeddings
        self.mixing = nn.Parameter(torch.empty(self.num_heads, self.max_positions, self.max_positions))
        self.reset_parameters()

    def reset_parameters(self):
        init.xavier_uniform_(self.mixing)

    def mixing_weights(self, attention_mask, context, dtype):
        check_max_positions(context, self.max_positions, type(self).__name__)
        rows = context.query_positions[:, :, None]  # (B|1, q, 1)
        columns = context.key_positions[:, None, :]  # (B|1, 1, k)
        weights = self.mixing[:, rows, columns].transpose(0, 1).to(dtype)  # (B|1, H, q, k)
        return zero_disallowed(weights, attention_mask, context, self.is_causal)


class GLinearNet(LinearNet):
    """gLinearNet (Liu et al. 2021; paper 2 §2.2): LinearNet with the gating of paper 2 Eq. 4."""

    gated = True


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
