"""Content multi-head attention (Vaswani et al. 2017), the `"attention"` token mixer.

softmax(Q K^T / sqrt(d_h) + B) V, computed through transformers' attention interface (SDPA by default,
eager when attention weights are requested). Position encodings hook in at five points, all no-ops by
default: the query/key/value projection weights are masked (RPEHead/MPRHead per-head projections),
queries/keys are rotated (RoPE), values are transformed before caching (PosNet-Attn), a score
bias B is folded into the mask so SDPA stays on its fused path (T5, ALiBi, Adaptive-T5), or the encoding
takes over the whole attention (Shaw's value term). Cross-attention receives no position encoding.

Log-length scaling (Chiang & Cholak 2022; config `log_length_scaling`, per site): the logits are multiplied by
log n, n the number of keys the query may attend to, by scaling the queries (`log_key_counts`), so SDPA keeps
its fused kernel. It scales q · k (and, under Shaw, q · a^K), not an additive score bias.

With the "none"/"sinusoidal"/"learned" encodings this is numerically `MarianAttention`.
"""

import math

import torch
from torch import nn
from transformers.modeling_utils import ALL_ATTENTION_FUNCTIONS

from .base import (
    ATTENTION_SITES,
    VASWANI,
    Hyperparameter,
    PositionContext,
    TokenMixer,
    additive_mask,
    apply_dropout,
    causal_mask,
)
from .mixer_base import GeluGating, cached_cross_attention_states, update_site_cache


def log_key_counts(attention_mask, query, key, is_causal: bool) -> torch.Tensor:
    """log n for every query of (B, H, q, Dh) against the keys (B, H, k, Dh), n the keys it may attend to
    (Chiang & Cholak 2022), in the query's dtype: (B|1, 1|H, q, 1), (q, 1) or (1, 1).

    n is counted in the mask the mixer receives (SDPA: True where allowed; eager: the dtype's minimum where not,
    0 or a folded bias elsewhere), so padded keys never count, whatever the positions are (SHAPE, randomized
    positions).
    Without a mask every key counts, or, causal, the keys up to the query: the queries are the last q of the k
    keys, so query i sees k - q + i + 1 of them (a decoding step sees its cache and itself). n >= 1 always.
    """
    if attention_mask is not None:
        if attention_mask.dtype == torch.bool:
            allowed = attention_mask
        else:
            allowed = attention_mask > torch.finfo(attention_mask.dtype).min
        counts = allowed.sum(dim=-1, keepdim=True)  # (B|1, 1|H, q, 1)
    elif is_causal:
        keys = key.shape[2]
        counts = torch.arange(keys - query.shape[2] + 1, keys + 1, device=query.device)[:, None]  # (q, 1)
    else:
        return torch.full((1, 1), math.log(key.shape[2]), dtype=query.dtype, device=query.device)  # (1, 1)
    return counts.clamp(min=1).float().log().to(query.dtype)


def eager_attention(module, query, key, value, attention_mask, scaling, dropout=0.0, **kwargs):
    """Reference attention that also returns the weights: (B, H, q, Dh) x3 -> (B, q, H, Dh), (B, H, q, k)."""
    scores = torch.matmul(query, key.transpose(2, 3)) * scaling  # (B, H, q, k)
    if attention_mask is not None:
        if attention_mask.dtype == torch.bool:
            scores = scores.masked_fill(~attention_mask, torch.finfo(scores.dtype).min)
        else:
            scores = scores + attention_mask
    weights = nn.functional.softmax(scores, dim=-1)
    weights = apply_dropout(weights, p=dropout, training=module.training)
    output = torch.matmul(weights, value).transpose(1, 2).contiguous()  # (B, q, H, Dh)
    return output, weights


def beams_as_queries(query, attention_mask, beams: int):
    """The one-token queries of N beams per example, (B·N, H, 1, Dh), as N queries of each example, (B, H, N, Dh),
    and their mask (B·N, H|1, 1, k) as (B, H|1, N, k): the attention's output (B, N, H, Dh) is then the beams'
    rows in order (`shared_cross_attention`, fast_decoding.py)."""
    rows, heads, length, dim = query.shape
    if length != 1:
        raise ValueError(
            f"shared cross-attention takes one new token per beam, got {length}: the keys of an example are "
            "shared by its beams only while decoding step by step"
        )
    query = query.view(rows // beams, beams, heads, dim).transpose(1, 2)
    if attention_mask is not None and attention_mask.shape[0] != 1:
        mask_heads, keys = attention_mask.shape[1], attention_mask.shape[-1]
        attention_mask = attention_mask.view(rows // beams, beams, mask_heads, keys).transpose(1, 2)
    return query, attention_mask


class ContentAttention(TokenMixer):
    """Multi-head scaled dot-product attention with the position-encoding hooks of `PositionEncoding`."""

    title = "content attention"
    reference = "Vaswani et al. 2017 (paper 1 Eq. 3); optional gating paper 2 Eq. 4, Table 6"
    citations = (VASWANI,)
    hyperparameters = {
        "attention_gating": Hyperparameter(bool, False, "Eq. 4 gating of paper 2 on self-attention (Table 6)")
    }
    # Sentence-aware positions (`sentence_end_token_ids`, sentence_positions.py) over sinusoids and over RoPE,
    # whose decoder reads every cached key's in-sentence position; both with the cross-attention sentence bias.
    variants = {
        "gated": {"attention_gating": True},
        "log-length": {"log_length_scaling": list(ATTENTION_SITES)},
        "sentences": {"sentence_end_token_ids": [5, 11, 17, 23, 29], "sentence_cross_attention_bias": True},
        "sentences-rope": {
            "position_encoding": "rope",
            "sentence_end_token_ids": [5, 11, 17, 23, 29],
            "sentence_cross_attention_bias": True,
        },
        # Attention windows (attention_windows.py) narrow enough to mask keys at the suite's lengths, over
        # sinusoids and over KERPLE's bias (folded into the mask the window restricts).
        "windows": {"attention_window": 3, "cross_attention_window": 2, "cross_attention_window_ratio": 1.5},
        "windows-kerple": {"position_encoding": "kerple", "attention_window": 3, "cross_attention_window": 2},
    }
    # Causality comes from the mask or the context's order, and the cross-attention mask may carry a bias.
    supports_sentence_positions = True
    # Scores outside the mask are dropped whatever the encoding adds (attention windows).
    supports_attention_windows = True
    # An example's beams may read one copy of its cross-attention keys and values (`beams_as_queries`).
    supports_shared_cross_attention = True

    def __init__(self, config, site, layer_idx):
        super().__init__(config, site, layer_idx)
        self.scaling = self.head_dim**-0.5
        self.dropout = config.attention_dropout
        self.k_proj = nn.Linear(self.embed_dim, self.embed_dim)
        self.v_proj = nn.Linear(self.embed_dim, self.embed_dim)
        self.q_proj = nn.Linear(self.embed_dim, self.embed_dim)
        self.out_proj = nn.Linear(self.embed_dim, self.embed_dim)
        # Paper 2 Table 6 gates self-attention only; cross-attention stays ungated.
        gated = config.attention_gating and not self.is_cross_attention
        self.gating = GeluGating(self.embed_dim) if gated else None
        self.log_length_scaling = site in config.log_length_scaling

    def project(self, projection: nn.Linear, states, encoding) -> torch.Tensor:
        """`projection(states)`, (..., D) -> (..., D); per head where the encoding asks for it in this layer: head h
        reads input features [h D_h, (h + 1) D_h) through the weights' h-th diagonal block, so the other blocks
        neither count nor get gradients (H times fewer products than the full matrix)."""
        if encoding is None or not encoding.projection_per_head(self.layer_idx):
            return projection(states)
        heads = self.num_heads
        blocks = projection.weight.view(heads, self.head_dim, heads, self.head_dim).diagonal(dim1=0, dim2=2)
        rows = states.reshape(-1, heads, self.head_dim).transpose(0, 1)  # (H, N, D_h)
        outputs = torch.bmm(rows, blocks.permute(2, 1, 0).to(rows.dtype))  # (H, N, D_h): x_h W_hh^T
        outputs = outputs.transpose(0, 1).reshape(states.shape)
        return outputs if projection.bias is None else outputs + projection.bias.to(outputs.dtype)

    def project_keys_values(self, states, context: PositionContext):
        """New keys and values (B, H, k_new, Dh), with the encoding's key rotation and value transform."""
        shape = (*states.shape[:-1], -1, self.head_dim)
        key = self.project(self.k_proj, states, context.encoding).view(shape).transpose(1, 2)
        value = self.project(self.v_proj, states, context.encoding)
        if self.gating is not None:
            value = self.gating.normalize_values(value)
        value = value.view(shape).transpose(1, 2)
        if context.encoding is not None:  # self-attention: the new keys are the queries
            value = context.encoding.transform_values(
                self.layer_idx, value, context.query_positions, context.query_span
            )
        return key, value

    def forward(
        self,
        hidden_states: torch.Tensor,
        key_value_states: torch.Tensor | None = None,
        past_key_values=None,
        attention_mask: torch.Tensor | None = None,
        context: PositionContext | None = None,
        output_attentions: bool = False,
    ):
        query_shape = (*hidden_states.shape[:-1], -1, self.head_dim)
        encoding = context.encoding if context is not None else None
        query = self.project(self.q_proj, hidden_states, encoding)
        query = query.view(query_shape).transpose(1, 2)  # (B, H, q, Dh)

        cached = cached_cross_attention_states(self, past_key_values)
        if cached is not None:
            key, value = cached
            if key.shape[0] < query.shape[0]:  # an example's beams share one copy of its keys (fast loop)
                query, attention_mask = beams_as_queries(
                    query, attention_mask, query.shape[0] // key.shape[0]
                )
        else:
            states = key_value_states if self.is_cross_attention else hidden_states
            key, value = self.project_keys_values(states, context)
            if encoding is not None:
                query, key = encoding.rotate_queries_keys(self.layer_idx, query, key, context)
            key, value = update_site_cache(self, past_key_values, key, value)

        if self.log_length_scaling:  # logits times log n, through the queries (B, H, q, Dh)
            query = query * log_key_counts(attention_mask, query, key, self.is_causal)
        dropout = self.dropout if self.training else 0.0
        if encoding is not None and encoding.has_custom_attention:
            output, weights = encoding.attend(
                self, query, key, value, attention_mask, context, dropout, output_attentions
            )
        else:
            if encoding is not None and context.score_mask is not None:
                attention_mask = context.score_mask.to(query.dtype)  # bias shared by the stack's layers
            elif encoding is not None and (bias := encoding.score_bias(self.layer_idx, context)) is not None:
                attention_mask = additive_mask(attention_mask, bias.to(query.dtype), context, self.is_causal)
            if output_attentions:
                attention_function = eager_attention
                if attention_mask is None and self.is_causal:
                    attention_mask = causal_mask(context)
            else:
                attention_function = ALL_ATTENTION_FUNCTIONS.get_interface(
                    self.config._attn_implementation, eager_attention
                )
            output, weights = attention_function(
                self, query, key, value, attention_mask, scaling=self.scaling, dropout=dropout
            )

        output = output.reshape(*hidden_states.shape[:-1], -1).contiguous()  # (B, q, D)
        if self.gating is not None:
            output = self.gating.gate(output, hidden_states)
        output = self.out_proj(output)
        return output, (weights if output_attentions else None)
