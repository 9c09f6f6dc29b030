"""The layers of the Marian encoder-decoder (modeling_marian_posenc.py): Marian's post-norm encoder and decoder
layers (Junczys-Dowmunt et al. 2018, as `transformers.models.marian.modeling_marian`'s `MarianEncoderLayer` and
`MarianDecoderLayer`), whose attention sites are token mixers from `TOKEN_MIXERS` (config `encoder_self_attention`,
`decoder_self_attention`, `cross_attention`). The arithmetic is Marian's; the positions arrive in a
`PositionContext` computed by the stack.
"""

from torch import nn
from transformers.activations import ACT2FN
from transformers.modeling_layers import GradientCheckpointingLayer

from .base import (
    CROSS_ATTENTION,
    DECODER_SELF_ATTENTION,
    ENCODER_SELF_ATTENTION,
    PositionContext,
    apply_dropout,
    with_score_mask,
)
from .configuration_marian_posenc import MarianPosEncConfig
from .registry import TOKEN_MIXERS


class MarianPosEncLayer(GradientCheckpointingLayer):
    """What encoder and decoder layers share: the post-norm feed-forward block x = LN(x + FFN(x))."""

    def __init__(self, config: MarianPosEncConfig, ffn_dim: int):
        super().__init__()
        self.dropout = config.dropout
        self.activation_fn = ACT2FN[config.activation_function]
        self.activation_dropout = config.activation_dropout
        self.fc1 = nn.Linear(config.d_model, ffn_dim)
        self.fc2 = nn.Linear(ffn_dim, config.d_model)
        self.final_layer_norm = nn.LayerNorm(config.d_model)

    def residual_norm(self, hidden_states, update, norm: nn.LayerNorm):
        """Post-norm residual: LN(x + dropout(update))."""
        return norm(hidden_states + apply_dropout(update, p=self.dropout, training=self.training))

    def feed_forward(self, hidden_states):
        update = self.activation_fn(self.fc1(hidden_states))
        update = apply_dropout(update, p=self.activation_dropout, training=self.training)
        return self.residual_norm(hidden_states, self.fc2(update), self.final_layer_norm)


class MarianPosEncEncoderLayer(MarianPosEncLayer):
    """Post-norm encoder layer: x = LN(x + Mix(x)); x = LN(x + FFN(x))."""

    def __init__(self, config: MarianPosEncConfig, layer_idx: int):
        super().__init__(config, config.encoder_ffn_dim)
        self.self_attn = TOKEN_MIXERS[config.encoder_self_attention](
            config, ENCODER_SELF_ATTENTION, layer_idx
        )
        self.self_attn_layer_norm = nn.LayerNorm(config.d_model)

    def forward(
        self, hidden_states, attention_mask, score_mask, context: PositionContext, output_attentions=False
    ):
        mixed, weights = self.self_attn(
            hidden_states,
            attention_mask=attention_mask,
            context=with_score_mask(context, score_mask),
            output_attentions=output_attentions,
        )
        hidden_states = self.residual_norm(hidden_states, mixed, self.self_attn_layer_norm)
        return self.feed_forward(hidden_states), weights


class MarianPosEncDecoderLayer(MarianPosEncLayer):
    """Post-norm decoder layer: causal self-mixing, cross-mixing over the encoder output, FFN."""

    def __init__(self, config: MarianPosEncConfig, layer_idx: int):
        super().__init__(config, config.decoder_ffn_dim)
        self.self_attn = TOKEN_MIXERS[config.decoder_self_attention](
            config, DECODER_SELF_ATTENTION, layer_idx
        )
        self.self_attn_layer_norm = nn.LayerNorm(config.d_model)
        self.encoder_attn = TOKEN_MIXERS[config.cross_attention](config, CROSS_ATTENTION, layer_idx)
        self.encoder_attn_layer_norm = nn.LayerNorm(config.d_model)

    def forward(
        self,
        hidden_states,
        attention_mask,
        score_mask,
        encoder_hidden_states,
        encoder_attention_mask,
        self_context: PositionContext,
        cross_context: PositionContext,
        past_key_values=None,
        output_attentions=False,
    ):
        mixed, self_weights = self.self_attn(
            hidden_states,
            past_key_values=past_key_values,
            attention_mask=attention_mask,
            context=with_score_mask(self_context, score_mask),
            output_attentions=output_attentions,
        )
        hidden_states = self.residual_norm(hidden_states, mixed, self.self_attn_layer_norm)
        mixed, cross_weights = self.encoder_attn(
            hidden_states,
            key_value_states=encoder_hidden_states,
            past_key_values=past_key_values,
            attention_mask=encoder_attention_mask,
            context=cross_context,
            output_attentions=output_attentions,
        )
        hidden_states = self.residual_norm(hidden_states, mixed, self.encoder_attn_layer_norm)
        return self.feed_forward(hidden_states), self_weights, cross_weights
