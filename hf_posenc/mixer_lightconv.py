"""Lightweight convolution (Wu et al. 2019; paper 2 Eq. 14), the `"lightconv"` token mixer, with the steps of
paper 2 Appendix E (Table 7) that lead from it to rPosNet."""

import torch
from torch import nn
from transformers import initialization as init

from .base import (
    DECODER_SELF_ATTENTION,
    ENCODER_SELF_ATTENTION,
    PAPER_2,
    Hyperparameter,
    additive_mask,
    apply_dropout,
    lookup_columns,
)
from .mixer_base import PositionMixer, zero_disallowed

GATINGS = ("glu", "none", "gelu")


class LightConv(PositionMixer):
    """Lightweight convolution (Wu et al. 2019; paper 2 Eq. 14):
    c_n = Σ_k softmax(W_h)_k · GLU(W^V x)_{n+k−K}, 2K+1 taps shared by the D_h channels of head h.

    Centred in the encoder (keys n−K..n+K); causal in the decoder (keys n−2K..n, Wu et al.'s left padding).
    The kernel gets DropConnect (`lightconv_weight_dropout`) while training; a weight matrix over (q, k)
    replaces the convolution so that one decoding step reads the cached values like attention does.

    Paper 2 Appendix E (Table 7) walks from LightConv to rPosNet; two options make its rows:

    * `lightconv_gating`: `"glu"` (Eq. 14, the default), `"none"` (Table 7 "Light Convolution": plain values
      W^V x, no gate) or `"gelu"` (Table 7 "+ GeLU Gating": GLU replaced by the gating of Eq. 4,
      c_n = [Σ_m w_nm LayerNorm(GELU(W^V x_m))] ⊙ GELU(W^G y_n)).
    * `lightconv_global_context` (Table 7 "+ Global Context", "spreading the outer kernel weights across the
      whole sequence"): a key beyond the window takes the logit of the outermost tap on its side, W_h[clip(tap,
      0, 2K)], as rPosNet's offsets are clipped (Eq. 10), and the softmax of Eq. 14 runs over the keys of the
      sequence (Eq. 2) instead of over the 2K+1 taps; padded and (in the decoder) future keys are left out of
      it. Every far key then weighs exactly what the outermost key of the window on its side weighs. In the
      decoder the far keys are those before n−2K and share tap 0; a query's weights depend on keys 0..n only,
      so decoding with the cache stays exact. What then remains between this and rPosNet (Appendix E: "the
      different training scheme and rPosNet's unshared kernel weights across query positions"): rPosNet's
      logits also depend on the query position (Eq. 9), and it learns W^Q, ñ and Emb_rel instead of them.

    With global context, DropConnect (`lightconv_weight_dropout`) applies to the normalised (q, k) weights, the
    kernel being normalised per query row. Deviation: the reference code normalises the local kernel over the
    window keys inside the sequence; here (without global context) it is normalised over the 2K+1 taps, as Wu
    et al.'s zero padding does.
    """

    title = "LightConv"
    reference = "paper 2 Eq. 14 (Wu et al. 2019); Appendix E, Table 7 options"
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
        "lightconv_gating": Hyperparameter(
            str,
            "glu",
            "values and gate: 'glu' (Eq. 14), 'none' (Table 7 'Light Convolution'), 'gelu' (Eq. 4, Table 7)",
            choices=GATINGS,
        ),
        "lightconv_global_context": Hyperparameter(
            bool,
            False,
            "keys beyond the window share the outer taps, softmax over the sequence (paper 2 Table 7)",
        ),
    }
    variants = {"gelu-gating-global-context": {"lightconv_gating": "gelu", "lightconv_global_context": True}}
    allowed_sites = (ENCODER_SELF_ATTENTION, DECODER_SELF_ATTENTION)

    def __init__(self, config, site, layer_idx):
        self.glu = config.lightconv_gating == "glu"
        self.gated = config.lightconv_gating == "gelu"
        super().__init__(config, site, layer_idx)
        self.kernel_radius = config.lightconv_kernel_radius
        self.weight_dropout = config.lightconv_weight_dropout
        self.global_context = config.lightconv_global_context
        if self.glu:
            self.v_proj = nn.Linear(self.embed_dim, 2 * self.embed_dim)  # GLU input
        self.kernel = nn.Parameter(torch.empty(self.num_heads, 2 * self.kernel_radius + 1))
        self.reset_parameters()

    def reset_parameters(self):
        init.xavier_uniform_(self.kernel)

    def project_values(self, states):
        if self.glu:
            return nn.functional.glu(self.v_proj(states), dim=-1)  # (B, k, D)
        return super().project_values(states)  # W^V x, or LayerNorm(GELU(W^V x)) with Eq. 4 gating

    def mixing_weights(self, attention_mask, context, dtype):
        # Tap index of each key: 0 is the leftmost tap, K the query itself in the encoder, 2K in the decoder.
        last_tap = 2 * self.kernel_radius if self.is_causal else self.kernel_radius
        tap = (
            context.key_positions[:, None, :] - context.query_positions[:, :, None] + last_tap
        )  # (B|1, q, k)
        if self.global_context:
            return self.global_weights(tap, attention_mask, context, dtype)
        kernel = torch.softmax(self.kernel, dim=-1)
        kernel = apply_dropout(kernel, p=self.weight_dropout, training=self.training)  # (H, 2K+1)
        inside = (tap >= 0) & (tap <= 2 * self.kernel_radius)
        clipped = tap.clamp(0, 2 * self.kernel_radius)
        weights = lookup_columns(kernel, clipped).transpose(0, 1)  # (B|1, H, q, k)
        weights = weights.masked_fill(~inside[:, None], 0.0).to(dtype)
        return zero_disallowed(weights, attention_mask, context, self.is_causal)

    def global_weights(self, tap, attention_mask, context, dtype) -> torch.Tensor:
        """Kernel logits of the clipped taps, softmax over the allowed keys of the sequence, (B|1, H, q, k)."""
        clipped = tap.clamp(0, 2 * self.kernel_radius)  # far keys take the outermost tap on their side
        logits = lookup_columns(self.kernel, clipped).transpose(0, 1).to(dtype)  # (B|1, H, q, k)
        weights = torch.softmax(additive_mask(attention_mask, logits, context, self.is_causal), dim=-1)
        return apply_dropout(weights, p=self.weight_dropout, training=self.training)
