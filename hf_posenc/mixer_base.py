"""What token mixers share beyond the `TokenMixer` interface: the gating of paper 2 (Eq. 4), the cache of an
attention site, and `PositionMixer`, the base of every mixer whose weights come from positions only.

`PositionMixer` subclasses (aPosNet, rPosNet, FourierNet, GaussianNet, LinearNet, gLinearNet, LightConv):
values are projected (and gated-normalised) once, cached like content attention's values, mixed with weights
(B|1, H|1, q, k) computed from `PositionContext` positions, then gated and projected.
"""

import torch
from torch import nn

from .base import (
    PositionContext,
    PositionPanel,
    TokenMixer,
    all_positions_context,
    apply_dropout,
    causal_mask,
)

# Parameters of a position mixer that do not depend on positions.
PARAMETERS_WITHOUT_POSITIONS = ("v_proj.", "out_proj.", "gating.")
SITE_SHORT_NAMES = {
    "encoder_self_attention": ("enc", "self"),
    "decoder_self_attention": ("dec", "self"),
    "cross_attention": ("dec", "cross"),
}


class GeluGating(nn.Module):
    """Gating of paper 2 (Eq. 4): c_n = [Σ_m α_nm · LayerNorm(GELU(v_m))] ⊙ GELU(W^G y_n).

    Shared by the gated position mixers (aPosNet, rPosNet, gLinearNet) and, with `config.attention_gating`,
    by content attention (paper 2 Table 6 ablation). The value side is applied before caching.
    """

    def __init__(self, embed_dim: int):
        super().__init__()
        self.gate_proj = nn.Linear(embed_dim, embed_dim)
        self.value_norm = nn.LayerNorm(embed_dim)

    def normalize_values(self, value: torch.Tensor) -> torch.Tensor:
        return self.value_norm(nn.functional.gelu(value))  # (B, k, D)

    def gate(self, context: torch.Tensor, queries: torch.Tensor) -> torch.Tensor:
        return context * nn.functional.gelu(self.gate_proj(queries))  # (B, q, D)


def cached_cross_attention_states(mixer: TokenMixer, past_key_values):
    """The (keys, values) a cross-attention site stored at the first decoding step (computed from the encoder
    output once per sequence), or None: not cached yet, not caching, or a self-attention site."""
    if (
        mixer.is_cross_attention
        and past_key_values is not None
        and past_key_values.is_updated.get(mixer.layer_idx)
    ):
        layer = past_key_values.cross_attention_cache.layers[mixer.layer_idx]
        return layer.keys, layer.values
    return None


def update_site_cache(mixer: TokenMixer, past_key_values, key, value):
    """Store a site's new keys and values, (B, H, k_new, Dh) each, in its half of the model's `PosEncCache`
    (marking a cross-attention layer as filled) and return all of the site's keys and values; without a cache,
    the new ones."""
    if past_key_values is None:
        return key, value
    if not mixer.is_cross_attention:
        return past_key_values.self_attention_cache.update(key, value, mixer.layer_idx)
    key, value = past_key_values.cross_attention_cache.update(key, value, mixer.layer_idx)
    past_key_values.is_updated[mixer.layer_idx] = True
    return key, value


def allowed_keys(attention_mask, context: PositionContext, is_causal: bool) -> torch.Tensor | None:
    """Boolean (B|1, 1, q, k) "query may read key" from any of transformers' masks, or None (all allowed)."""
    if attention_mask is None:
        return causal_mask(context) if is_causal else None
    if attention_mask.dtype == torch.bool:
        return attention_mask
    return attention_mask == 0  # eager float masks hold 0 where allowed and the dtype's minimum elsewhere


def zero_disallowed(weights, attention_mask, context, is_causal) -> torch.Tensor:
    """Unnormalised weights with padded (and, causally, future) keys set to 0."""
    allowed = allowed_keys(attention_mask, context, is_causal)
    return weights if allowed is None else weights.masked_fill(~allowed, 0.0)


class ValueMixer(TokenMixer):
    """Token mixing without keys: out_proj(gate([W · values])), the values projected once and cached per site,
    the weights W (B|1, H|1, q, k) computed by the subclass (`mixing_weights_for`) from positions and, for some,
    from the queries."""

    #: Eq. 4 gating; subclasses fix it or read it from the config.
    gated = False

    def __init__(self, config, site, layer_idx):
        super().__init__(config, site, layer_idx)
        self.dropout = config.attention_dropout
        self.v_proj = nn.Linear(self.embed_dim, self.embed_dim)
        self.out_proj = nn.Linear(self.embed_dim, self.embed_dim)
        self.gating = GeluGating(self.embed_dim) if self.gated else None

    def project_values(self, states: torch.Tensor) -> torch.Tensor:
        """(B, k, D) -> (B, k, D) values before the head split."""
        value = self.v_proj(states)
        return self.gating.normalize_values(value) if self.gating is not None else value

    def cached_values(self, hidden_states, key_value_states, past_key_values) -> torch.Tensor:
        """All values of the site (B, H, k, Dh): new ones appended to the cache, encoder ones computed once.

        The values go into the cache as both keys and values: the decoder reads the number of cached positions
        from the self-attention cache.
        """
        cached = cached_cross_attention_states(self, past_key_values)
        if cached is not None:
            return cached[1]
        states = key_value_states if self.is_cross_attention else hidden_states
        value = self.project_values(states)
        value = value.view(*states.shape[:-1], self.num_heads, -1).transpose(1, 2)  # (B, H, k_new, Dh)
        return update_site_cache(self, past_key_values, value, value)[1]

    def mixing_weights_for(
        self, hidden_states, attention_mask, context: PositionContext, dtype
    ) -> torch.Tensor:
        """The weights of the queries `hidden_states` (B, q, D) over the site's keys, (B|1, H|1, q, k)."""
        raise NotImplementedError

    def forward(
        self,
        hidden_states: torch.Tensor,
        key_value_states: torch.Tensor | None = None,
        past_key_values=None,
        attention_mask: torch.Tensor | None = None,
        context: PositionContext | None = None,
        output_attentions: bool = False,
    ):
        value = self.cached_values(hidden_states, key_value_states, past_key_values)  # (B, H, k, Dh)
        weights = self.mixing_weights_for(
            hidden_states, attention_mask, context, value.dtype
        )  # (B|1, H|1, q, k)
        weights = apply_dropout(weights, p=self.dropout, training=self.training)
        output = torch.matmul(weights, value).transpose(1, 2)  # (B, q, H, Dh)
        output = output.reshape(*hidden_states.shape[:-1], -1)  # (B, q, D)
        if self.gating is not None:
            output = self.gating.gate(output, hidden_states)
        return self.out_proj(output), (weights if output_attentions else None)


class PositionMixer(ValueMixer):
    """A `ValueMixer` whose weights come from positions only (content-independent).

    Subclasses define `mixing_weights(attention_mask, context, dtype) -> (B|1, H|1, q, k)`, already masked
    (padding, causality) and normalised or not as their equation says.
    """

    def mixing_weights(self, attention_mask, context: PositionContext, dtype) -> torch.Tensor:
        raise NotImplementedError

    def mixing_weights_for(self, hidden_states, attention_mask, context, dtype):
        return self.mixing_weights(attention_mask, context, dtype)

    def position_weights(self, context: PositionContext) -> torch.Tensor:
        """What the position panels draw: the mixing weights of an unpadded sequence, (1, H|1, P, P)."""
        return self.mixing_weights(None, context, torch.float32)

    def position_panels(self, positions):
        """Each head's weights as a query × key heat map (future keys of the causal decoder left blank), for
        mixers with trainable position parameters."""
        if all(name.startswith(PARAMETERS_WITHOUT_POSITIONS) for name, _ in self.named_parameters()):
            return []
        weights = self.position_weights(all_positions_context(None, positions, self.out_proj.weight.device))
        if self.is_causal:
            future = torch.ones(positions, positions, dtype=torch.bool, device=weights.device).triu(1)
            weights = weights.masked_fill(future, float("nan"))
        stack, kind = SITE_SHORT_NAMES[self.site]
        name = f"{stack} L{self.layer_idx} {kind}"
        return [PositionPanel(f"{name} head {head}", "map", heat) for head, heat in enumerate(weights[0])]
