"""Marian encoder-decoder with pluggable positional modules.

Marian's post-norm architecture (Junczys-Dowmunt et al. 2018, as in `transformers.MarianMTModel`; its layers in
modeling_layers.py), with two changes of structure and none of arithmetic:

* each stack owns a position encoding from `POSITION_ENCODINGS` (config `encoder_position_encoding`,
  `decoder_position_encoding`) that builds its input from the token embeddings and hooks into its
  self-attention;
* each attention site is a token mixer from `TOKEN_MIXERS` (config `encoder_self_attention`,
  `decoder_self_attention`, `cross_attention`).

Positions are computed here, once per forward, and handed down: in the encoder from the padding mask (a
token's position counts from the start of its own sequence), in the decoder from the number of cached
positions; in training with `shape_max_shift` > 0 both are shifted by a random offset per sequence (SHAPE,
`MarianPosEncStack.shape_offsets`), with `randomized_positions_max` > 0 replaced by sorted random draws
(`MarianPosEncStack.randomized_positions`; both in position_randomization.py), and with `sentence_end_token_ids`
they restart at each sentence (sentence_positions.py). `generate` ties the decoding budget and length control to
the source (generation_length.py). With `"sinusoidal"` + `"attention"` the model reproduces `MarianMTModel` logits
exactly; `from_marian` converts stock checkpoints.
"""

import dataclasses
import inspect
import math

import torch
from torch import nn
from transformers import GenerationMixin, PreTrainedModel
from transformers import initialization as init
from transformers.cache_utils import Cache, DynamicCache, EncoderDecoderCache
from transformers.masking_utils import create_bidirectional_mask, create_causal_mask
from transformers.modeling_outputs import (
    BaseModelOutput,
    BaseModelOutputWithPastAndCrossAttentions,
    Seq2SeqLMOutput,
    Seq2SeqModelOutput,
)
from transformers.utils import can_return_tuple, logging

from .attention_windows import cross_window_mask, decoder_window_mask, encoder_window_mask
from .base import (
    DECODER,
    ENCODER,
    PosEncCache,
    PositionContext,
    PositionEncoding,
    TokenMixer,
    apply_dropout,
    positions_from_padding_mask,
    stack_score_mask,
)
from .configuration_marian_posenc import MarianPosEncConfig
from .generation_length import LENGTH_CONTROL_DEFAULTS, LengthControlGenerationMixin
from .model_checks import CheckedLoading, check_num_items_in_batch, check_token_ids
from .modeling_layers import MarianPosEncDecoderLayer, MarianPosEncEncoderLayer
from .position_randomization import PositionRandomizationMixin
from .registry import POSITION_ENCODINGS
from .sentence_positions import (
    SentenceBoundaries,
    SentenceCrossAttentionBias,
    SentenceEmbedding,
    SentencePositionsMixin,
)

logger = logging.get_logger(__name__)

MAX_NEW_TOKENS_OVER_SOURCE = 50  # paper 1 decodes up to source length + 50 tokens
# Paper 1's evaluation (§4.1): beam 4, length penalty 0.6; the saved generation config of every model.
PAPER_1_DECODING = {"num_beams": 4, "length_penalty": 0.6}
# transformers 5.24 renamed `create_causal_mask`'s `past_key_values` to `cache` (the old name warns until 5.40)
MASK_CACHE_ARGUMENT = (
    "cache" if "cache" in inspect.signature(create_causal_mask).parameters else "past_key_values"
)
# ... and the model outputs' `past_key_values` field to `cache` (writing or reading the old name logs a deprecation)
OUTPUT_CACHE_FIELD = "cache" if "cache" in Seq2SeqLMOutput.__dataclass_fields__ else "past_key_values"


def shift_tokens_right(labels: torch.Tensor, pad_token_id: int, decoder_start_token_id: int) -> torch.Tensor:
    """Teacher-forcing decoder input: labels shifted right behind the start token, -100 replaced by pad."""
    shifted = labels.new_zeros(labels.shape)
    shifted[:, 1:] = labels[:, :-1]
    shifted[:, 0] = decoder_start_token_id
    return shifted.masked_fill(shifted == -100, pad_token_id)


@dataclasses.dataclass
class MarianPosEncEncoderOutput(BaseModelOutput):
    """`BaseModelOutput` with each source token's sentence index, (B, S), when the model finds sentences
    (`sentence_end_token_ids`; sentence_positions.py): the decoder's cross-attention sentence bias reads them, and
    `generate` repeats them over beams with the rest of the encoder output."""

    sentence_indices: torch.LongTensor | None = None


def as_posenc_cache(cache: Cache | None, config) -> PosEncCache | None:
    """The decoder's cache as a `PosEncCache` (the one place that converts): an `EncoderDecoderCache` keeps its
    two halves (and which cross-attention layers are filled), a lone cache becomes the self-attention half."""
    if cache is None or isinstance(cache, PosEncCache):
        return cache
    if isinstance(cache, EncoderDecoderCache):
        return PosEncCache(cache.self_attention_cache, cache.cross_attention_cache)
    return PosEncCache(cache, DynamicCache(config=config))


class MarianPosEncPreTrainedModel(CheckedLoading, PreTrainedModel):
    config_class = MarianPosEncConfig
    config: MarianPosEncConfig
    base_model_prefix = "model"
    supports_gradient_checkpointing = True
    _supports_sdpa = True
    _no_split_modules = ["MarianPosEncEncoderLayer", "MarianPosEncDecoderLayer"]

    def __init__(self, config: MarianPosEncConfig, *args, **kwargs):
        config.check_choices()  # again: fields may have been set since the config was built
        super().__init__(config, *args, **kwargs)

    @torch.no_grad()
    def _init_weights(self, module):
        """Transformers' defaults, then every positional module re-initialises what it owns.

        `from_pretrained` builds the model without PyTorch's default init and runs this for whatever the
        checkpoint lacks, so each `PositionEncoding`/`TokenMixer` re-creates its tables, buffers and RNNs in
        `reset_parameters` (with `transformers.initialization`, which leaves loaded tensors alone).
        """
        super()._init_weights(module)
        positional = (PositionEncoding, TokenMixer, SentenceEmbedding, SentenceCrossAttentionBias)
        if isinstance(module, positional) and hasattr(module, "reset_parameters"):
            module.reset_parameters()
        elif isinstance(module, MarianPosEncForConditionalGeneration):
            init.zeros_(module.final_logits_bias)

    def precompute_position_attention(self) -> None:
        """Fold position-only attention energies into per-layer tables (paper 2 §4, e.g. rPosNet, aPosNet).

        Each mixer drops what produced its energies; the config is marked, so the folded model saves and
        reloads folded. Outputs do not change.
        """
        for module in self.modules():
            if isinstance(module, TokenMixer):
                module.precompute_position_attention()
        self.config.position_attention_precomputed = True


class MarianPosEncStack(SentencePositionsMixin, PositionRandomizationMixin, MarianPosEncPreTrainedModel):
    """What encoder and decoder share: scaled token embeddings, the stack's position encoding, its layers; the
    sentence-aware positions (`SentencePositionsMixin`) and training's randomized positions
    (`PositionRandomizationMixin`) the stacks compute their positions with.

    Each stack owns its `embed_tokens`, as Marian's do; in a model they are tied to `shared` through
    `_tied_weights_keys` (one parameter, not one module: transformers' loading then reports a checkpoint
    without embeddings as missing them instead of leaving them on the meta device).
    """

    def __init__(self, config, stack: str, layer_class, num_layers: int):
        super().__init__(config)
        self.dropout = config.dropout
        self.embed_scale = math.sqrt(config.d_model) if config.scale_embedding else 1.0
        self.embed_tokens = nn.Embedding(config.vocab_size, config.d_model, config.pad_token_id)
        self.position_encoding = POSITION_ENCODINGS[getattr(config, f"{stack}_position_encoding")](
            config, stack
        )
        # Sentence-aware positions (sentence_positions.py): where sentences start, and the sentence index's table.
        sentences = bool(config.sentence_end_token_ids)
        self.sentence_boundaries = SentenceBoundaries(config) if sentences else None
        learned = sentences and config.sentence_embedding == "learned"
        self.sentence_embedding = SentenceEmbedding(config) if learned else None
        cross_bias = stack == DECODER and config.sentence_cross_attention_bias
        self.sentence_cross_attention_bias = SentenceCrossAttentionBias(config) if cross_bias else None
        self.layers = nn.ModuleList([layer_class(config, i) for i in range(num_layers)])
        mixers = [module for module in self.layers.modules() if isinstance(module, TokenMixer)]
        for mixer in mixers:
            mixer.share_within_stack(mixers)
        self.gradient_checkpointing = False
        self.post_init()

    def scaled_embeddings(self, input_ids, inputs_embeds, prefix: str) -> torch.Tensor:
        """The stack's input, (B, L, D): the ids' embeddings, or given `inputs_embeds`, times `embed_scale`.
        Given embeddings are scaled like the ids' in both stacks, so `get_input_embeddings()(ids)` gives the
        same output as the ids (stock Marian's encoder takes them already scaled). `prefix` names the
        arguments in errors: "" for the encoder's, "decoder_" for the decoder's."""
        if (input_ids is None) == (inputs_embeds is None):
            raise ValueError(
                f"Pass exactly one of {prefix}input_ids or {prefix}inputs_embeds to the "
                f"{'decoder' if prefix else 'encoder'}."
            )
        if inputs_embeds is None:
            check_token_ids(input_ids, self.embed_tokens.num_embeddings, f"{prefix}input_ids")
            inputs_embeds = self.embed_tokens(input_ids)
        return inputs_embeds * self.embed_scale

    def run_layers(
        self, hidden_states, layer_args: tuple, output_attentions, output_hidden_states, **layer_kwargs
    ):
        """Every layer in turn on `hidden_states` (B, L, D). Returns the last hidden states; all of them, the
        embedding output first (or None); and for each kind of attention weights a layer returns (the encoder's
        one, the decoder's self and cross) the tuple over layers (or None). Unset output flags take the
        config's."""
        output_attentions = self.config.output_attentions if output_attentions is None else output_attentions
        if output_hidden_states is None:
            output_hidden_states = self.config.output_hidden_states
        all_hidden_states = (hidden_states,) if output_hidden_states else None
        all_weights = None
        for layer in self.layers:
            hidden_states, *weights = layer(
                hidden_states, *layer_args, output_attentions=bool(output_attentions), **layer_kwargs
            )
            if output_hidden_states:
                all_hidden_states += (hidden_states,)
            all_weights = [
                (*kind, w) for kind, w in zip(all_weights or [()] * len(weights), weights, strict=True)
            ]
        return (
            hidden_states,
            all_hidden_states,
            all_weights if output_attentions else [None] * len(all_weights),
        )


class MarianPosEncEncoder(MarianPosEncStack):
    """Token embeddings -> position encoding -> `config.encoder_layers` encoder layers."""

    def __init__(self, config: MarianPosEncConfig):
        super().__init__(config, ENCODER, MarianPosEncEncoderLayer, config.encoder_layers)

    @can_return_tuple
    def forward(
        self,
        input_ids=None,
        attention_mask=None,
        inputs_embeds=None,
        output_attentions=None,
        output_hidden_states=None,
        **kwargs,
    ) -> BaseModelOutput:
        inputs_embeds = self.scaled_embeddings(input_ids, inputs_embeds, "")  # (B, L, D)
        if attention_mask is not None and attention_mask.shape != inputs_embeds.shape[:2]:
            raise ValueError(
                f"attention_mask has shape {tuple(attention_mask.shape)}, the inputs {tuple(inputs_embeds.shape[:2])}."
            )

        length = inputs_embeds.shape[1]
        position_ids = positions_from_padding_mask(attention_mask, length, inputs_embeds.device)  # (B|1, L)
        order = position_ids  # the tokens' order, which the attention window reads, whatever the positions
        # Without a mask the positions are 0..L-1; with one, their span is read once per encoder forward.
        span = (0, length - 1) if attention_mask is None else None
        sentences = None
        if self.sentence_boundaries is not None:  # positions restart at each sentence: span read off them
            sentences = self.sentence_boundaries(input_ids, position_ids, attention_mask)
            position_ids, span = sentences.positions, None  # (B, L)
        offsets = self.shape_offsets(inputs_embeds.shape[0], inputs_embeds.device)
        if offsets is not None:  # SHAPE: bounded by the largest shift, so a short table fails on every batch
            position_ids = position_ids + offsets  # (B, L)
            span = (0, length - 1 + self.config.shape_max_shift)
        randomized = self.randomized_positions(position_ids, inputs_embeds.shape[0])
        if randomized is not None:  # bounded by L, so a table shorter than L fails on every training batch
            position_ids, span = randomized, (0, self.config.randomized_positions_max - 1)  # (B, L)
        context = PositionContext(self.position_encoding, position_ids, position_ids, span, span)
        if sentences is not None:
            context.query_order = context.key_order = sentences.order
        hidden_states = self.position_encoding.embed(inputs_embeds, context, attention_mask, None)
        hidden_states = self.embed_sentences(hidden_states, sentences, length - 1)
        hidden_states = apply_dropout(hidden_states, p=self.dropout, training=self.training)

        mask = create_bidirectional_mask(
            config=self.config, inputs_embeds=inputs_embeds, attention_mask=attention_mask
        )
        mask = encoder_window_mask(mask, order, self.config.attention_window)
        score_mask = stack_score_mask(self.position_encoding, mask, context, is_causal=False)
        hidden_states, all_hidden_states, (all_attentions,) = self.run_layers(
            hidden_states, (mask, score_mask, context), output_attentions, output_hidden_states
        )
        return MarianPosEncEncoderOutput(
            last_hidden_state=hidden_states,
            hidden_states=all_hidden_states,
            attentions=all_attentions,
            sentence_indices=sentences.indices if sentences is not None else None,
        )


def check_encoder_states(encoder_hidden_states) -> None:
    """The decoder cross-attends to the encoder's output in every layer: without it there is nothing to decode."""
    if encoder_hidden_states is None:
        raise ValueError(
            "the decoder needs encoder_hidden_states, the encoder's output (B, S, D): every decoder layer "
            "cross-attends to it (there is no decoder-only use); call the whole model, or pass "
            "encoder_hidden_states=model.get_encoder()(input_ids).last_hidden_state."
        )


class MarianPosEncDecoder(MarianPosEncStack):
    """Token embeddings -> position encoding -> `config.decoder_layers` decoder layers, with a cache."""

    def __init__(self, config: MarianPosEncConfig):
        super().__init__(config, DECODER, MarianPosEncDecoderLayer, config.decoder_layers)

    @can_return_tuple
    def decoder_masks(
        self, inputs_embeds, attention_mask, encoder_hidden_states, encoder_attention_mask, cache
    ):
        """(the causal self-attention mask over the cached and new positions, the cross-attention mask)."""
        batch_size, query_length = inputs_embeds.shape[:2]
        past_length = cache.get_seq_length() if cache is not None else 0
        if attention_mask is None:
            attention_mask = torch.ones(batch_size, past_length + query_length, device=inputs_embeds.device)
        self_cache = cache.self_attention_cache if cache is not None else None
        causal_mask = create_causal_mask(
            config=self.config,
            inputs_embeds=inputs_embeds,
            attention_mask=attention_mask,
            **{MASK_CACHE_ARGUMENT: self_cache},
        )
        cross_mask = create_bidirectional_mask(
            config=self.config,
            inputs_embeds=inputs_embeds,
            attention_mask=encoder_attention_mask,
            encoder_hidden_states=encoder_hidden_states,
        )
        # Attention windows (attention_windows.py), from the positions of the cached and new tokens.
        device = inputs_embeds.device
        causal_mask = decoder_window_mask(
            causal_mask, past_length, query_length, self.config.attention_window, device
        )
        cross_mask = cross_window_mask(
            cross_mask,
            past_length,
            query_length,
            encoder_attention_mask,
            encoder_hidden_states.shape[1],
            self.config,
            device,
        )
        return causal_mask, cross_mask

    def decoder_contexts(
        self, key_positions, past_length: int, shifted: bool, encoder_hidden_states, source_mask
    ):
        """(self-attention context, cross-attention context) of the new positions after `past_length` cached ones.

        Host-side spans from the cache length (and SHAPE's largest shift, `shifted`): no position tensor is read
        back during decoding. Padded source positions are bounded by the source length. Cross-attention sees the
        source positions unshifted: the encoder's SHAPE offsets are its own (drawn independently)."""
        query_positions = key_positions[:, past_length:]  # (B|1, q)
        source_length = encoder_hidden_states.shape[1]
        source_positions = positions_from_padding_mask(
            source_mask, source_length, key_positions.device
        )  # (B|1, S)
        last = key_positions.shape[1] - 1 + (self.config.shape_max_shift if shifted else 0)
        query_span, source_span = (past_length, last), (0, source_length - 1)
        self_context = PositionContext(
            self.position_encoding, query_positions, key_positions, query_span, (0, last)
        )
        cross_context = PositionContext(None, query_positions, source_positions, query_span, source_span)
        return self_context, cross_context

    def forward(
        self,
        input_ids=None,
        attention_mask=None,
        encoder_hidden_states=None,
        encoder_attention_mask=None,
        past_key_values=None,
        inputs_embeds=None,
        use_cache=None,
        output_attentions=None,
        output_hidden_states=None,
        encoder_sentence_indices=None,
        **kwargs,
    ) -> BaseModelOutputWithPastAndCrossAttentions:
        r"""encoder_sentence_indices (`(B, S)`): the source tokens' sentence indices, from the encoder's output
        (`MarianPosEncEncoderOutput.sentence_indices`); needed with `sentence_cross_attention_bias`."""
        check_encoder_states(encoder_hidden_states)
        inputs_embeds = self.scaled_embeddings(input_ids, inputs_embeds, "decoder_")  # (B, q, D)
        batch_size, query_length = inputs_embeds.shape[:2]
        if use_cache and past_key_values is None:
            past_key_values = DynamicCache(config=self.config)
        past_key_values = as_posenc_cache(past_key_values, self.config)
        # Query positions come from the number of cached positions: the one place that decides them.
        past_length = past_key_values.get_seq_length() if past_key_values is not None else 0
        key_positions = torch.arange(past_length + query_length, device=inputs_embeds.device)[None]  # (1, k)
        order = key_positions[:, past_length:]  # (1, q)
        sentences = self.decoder_sentences(input_ids, order, past_length, past_key_values)
        key_positions, offsets = self.shifted_positions(
            key_positions, batch_size, past_key_values
        )  # (B|1, k)
        causal_mask, cross_mask = self.decoder_masks(
            inputs_embeds, attention_mask, encoder_hidden_states, encoder_attention_mask, past_key_values
        )
        self_context, cross_context = self.decoder_contexts(
            key_positions, past_length, offsets is not None, encoder_hidden_states, encoder_attention_mask
        )
        if sentences is not None:  # self-attention and embeddings; cross-attention keeps the order
            self_context = self.sentence_context(sentences, offsets, self_context)
            cross_mask = self.sentence_cross_mask(
                cross_mask, sentences, encoder_sentence_indices, cross_context, inputs_embeds.dtype
            )
        self_context = self.randomized_context(self_context, cross_context, batch_size, past_length)
        score_mask = stack_score_mask(self.position_encoding, causal_mask, self_context, is_causal=True)
        hidden_states = self.position_encoding.embed(inputs_embeds, self_context, None, past_key_values)
        hidden_states = self.embed_sentences(hidden_states, sentences, past_length + query_length - 1)
        hidden_states = apply_dropout(hidden_states, p=self.dropout, training=self.training)
        hidden_states, all_hidden_states, (all_self_attentions, all_cross_attentions) = self.run_layers(
            hidden_states,
            (causal_mask, score_mask, encoder_hidden_states, cross_mask, self_context, cross_context),
            output_attentions,
            output_hidden_states,
            past_key_values=past_key_values,
        )
        return BaseModelOutputWithPastAndCrossAttentions(
            last_hidden_state=hidden_states,
            **{OUTPUT_CACHE_FIELD: past_key_values},
            hidden_states=all_hidden_states,
            attentions=all_self_attentions,
            cross_attentions=all_cross_attentions,
        )


class MarianPosEncModel(MarianPosEncPreTrainedModel):
    """Encoder and decoder sharing one token embedding table (as Marian does)."""

    _tied_weights_keys = {
        "encoder.embed_tokens.weight": "shared.weight",
        "decoder.embed_tokens.weight": "shared.weight",
    }

    def __init__(self, config: MarianPosEncConfig):
        super().__init__(config)
        self.shared = nn.Embedding(config.vocab_size, config.d_model, config.pad_token_id)
        self.encoder = MarianPosEncEncoder(config)
        self.decoder = MarianPosEncDecoder(config)
        self.decoder.position_encoding.tie_to_encoder(self.encoder.position_encoding)
        self.post_init()

    def get_input_embeddings(self):
        return self.shared

    def set_input_embeddings(self, value):
        self.shared = value
        self.encoder.embed_tokens = value
        self.decoder.embed_tokens = value

    def get_encoder(self):
        return self.encoder

    @can_return_tuple
    def forward(
        self,
        input_ids=None,
        attention_mask=None,
        decoder_input_ids=None,
        decoder_attention_mask=None,
        encoder_outputs=None,
        past_key_values=None,
        inputs_embeds=None,
        decoder_inputs_embeds=None,
        use_cache=None,
        output_attentions=None,
        output_hidden_states=None,
        cache=None,
        **kwargs,
    ) -> Seq2SeqModelOutput:
        # transformers >= 5.24 passes the cache as `cache`
        past_key_values = cache if past_key_values is None else past_key_values
        use_cache = use_cache if use_cache is not None else self.config.use_cache
        if encoder_outputs is None:
            encoder_outputs = self.encoder(
                input_ids=input_ids,
                attention_mask=attention_mask,
                inputs_embeds=inputs_embeds,
                output_attentions=output_attentions,
                output_hidden_states=output_hidden_states,
                return_dict=True,
            )
        elif not isinstance(encoder_outputs, BaseModelOutput):  # a tuple: what return_dict=False gave
            encoder_outputs = BaseModelOutput(
                last_hidden_state=encoder_outputs[0],
                hidden_states=encoder_outputs[1] if len(encoder_outputs) > 1 else None,
                attentions=encoder_outputs[2] if len(encoder_outputs) > 2 else None,
            )
        decoder_outputs = self.decoder(
            input_ids=decoder_input_ids,
            attention_mask=decoder_attention_mask,
            encoder_hidden_states=encoder_outputs.last_hidden_state,
            encoder_attention_mask=attention_mask,
            encoder_sentence_indices=getattr(encoder_outputs, "sentence_indices", None),
            past_key_values=past_key_values,
            inputs_embeds=decoder_inputs_embeds,
            use_cache=use_cache,
            output_attentions=output_attentions,
            output_hidden_states=output_hidden_states,
            return_dict=True,
        )
        return Seq2SeqModelOutput(
            last_hidden_state=decoder_outputs.last_hidden_state,
            **{OUTPUT_CACHE_FIELD: getattr(decoder_outputs, OUTPUT_CACHE_FIELD)},
            decoder_hidden_states=decoder_outputs.hidden_states,
            decoder_attentions=decoder_outputs.attentions,
            cross_attentions=decoder_outputs.cross_attentions,
            encoder_last_hidden_state=encoder_outputs.last_hidden_state,
            encoder_hidden_states=encoder_outputs.hidden_states,
            encoder_attentions=encoder_outputs.attentions,
        )


def token_loss(logits, labels, num_items_in_batch=None):
    """The summed token cross-entropy (labels -100 ignored) over `num_items_in_batch` when the Trainer passes it
    (the label tokens of the whole batch, all accumulation steps and processes), else over this batch's."""
    loss = nn.functional.cross_entropy(
        logits.float().view(-1, logits.shape[-1]),  # (B·T, V)
        labels.reshape(-1),
        ignore_index=-100,
        reduction="sum",
    )
    tokens = (labels != -100).sum()
    if num_items_in_batch is None:
        return loss / tokens
    check_num_items_in_batch(num_items_in_batch, tokens)
    return loss / num_items_in_batch


class MarianPosEncForConditionalGeneration(
    LengthControlGenerationMixin, MarianPosEncPreTrainedModel, GenerationMixin
):
    """Translation model: `MarianPosEncModel` + tied LM head + Marian's final logits bias; `generate` with the
    source-tied budget and length control (`LengthControlGenerationMixin`)."""

    _tied_weights_keys = {
        "lm_head.weight": "model.shared.weight",
        "model.encoder.embed_tokens.weight": "model.shared.weight",
        "model.decoder.embed_tokens.weight": "model.shared.weight",
    }
    # The Trainer passes `num_items_in_batch`, and the loss below divides by it, so gradient accumulation and
    # data parallelism give the true token-level mean (Marian's own mean loss gets scaled up instead).
    accepts_loss_kwargs = True

    def __init__(self, config: MarianPosEncConfig):
        super().__init__(config)
        self.model = MarianPosEncModel(config)
        self.register_buffer("final_logits_bias", torch.zeros(1, config.vocab_size))
        self.lm_head = nn.Linear(config.d_model, config.vocab_size, bias=False)
        self.post_init()
        # Paper 1's evaluation setting: beam 4, length penalty 0.6, up to source length + 50 new tokens.
        self.generation_config.update(**PAPER_1_DECODING, bad_words_ids=[[config.pad_token_id]])
        self.generation_config.max_new_tokens_over_source = MAX_NEW_TOKENS_OVER_SOURCE
        for (
            key,
            default,
        ) in LENGTH_CONTROL_DEFAULTS.items():  # off; `generate` reads them (generation_length.py)
            setattr(self.generation_config, key, default)
        # transformers' loop unless switched on, and the fast loop token-identical to it (fast_decoding.py)
        self.generation_config.fast_decoding = False
        self.generation_config.shared_cross_attention = False
        self.generation_config._from_model_config = False  # a deliberate config: keep it on save/load

    def save_pretrained(self, *args, **kwargs):
        """`PreTrainedModel.save_pretrained`; config.json's `auto_map` also names the base model, so that
        `AutoModel.from_pretrained(folder, trust_remote_code=True)` works too (transformers writes only the class
        being saved)."""
        if self._auto_class is not None:
            module = type(self).__module__.rsplit(".", 1)[-1]
            self.config.auto_map = {
                **(getattr(self.config, "auto_map", None) or {}),
                "AutoModel": f"{module}.MarianPosEncModel",
            }
        return super().save_pretrained(*args, **kwargs)

    def get_output_embeddings(self):
        return self.lm_head

    def set_output_embeddings(self, new_embeddings):
        self.lm_head = new_embeddings

    def get_encoder(self):
        return self.model.encoder

    def resize_token_embeddings(self, new_num_tokens=None, pad_to_multiple_of=None, mean_resizing=True):
        """`PreTrainedModel.resize_token_embeddings`, resizing Marian's `final_logits_bias` with the shared
        table (kept values, 0 for new tokens) and keeping `config.decoder_vocab_size` equal to the new size."""
        embeddings = super().resize_token_embeddings(new_num_tokens, pad_to_multiple_of, mean_resizing)
        size, old = embeddings.num_embeddings, self.final_logits_bias
        if old.shape[-1] != size:
            kept = min(size, old.shape[-1])
            self.final_logits_bias = torch.cat(
                [old[:, :kept], old.new_zeros(1, size - kept)], dim=-1
            )  # (1, V)
        self.config.decoder_vocab_size = size
        return embeddings

    def prepare_decoder_input_ids_from_labels(self, labels: torch.Tensor):
        return shift_tokens_right(labels, self.config.pad_token_id, self.config.decoder_start_token_id)

    def _prepare_cache_for_generation(self, generation_config, model_kwargs, *args, **kwargs):
        """Let `generate` use `PosEncCache`, so position state is reordered with the beams."""
        super()._prepare_cache_for_generation(generation_config, model_kwargs, *args, **kwargs)
        for name in ("past_key_values", "cache"):  # "cache" from transformers 5.24 on
            if model_kwargs.get(name) is not None:
                model_kwargs[name] = as_posenc_cache(model_kwargs[name], self.config)

    @can_return_tuple
    def forward(
        self,
        input_ids=None,
        attention_mask=None,
        decoder_input_ids=None,
        decoder_attention_mask=None,
        encoder_outputs=None,
        past_key_values=None,
        inputs_embeds=None,
        decoder_inputs_embeds=None,
        labels=None,
        use_cache=None,
        output_attentions=None,
        output_hidden_states=None,
        num_items_in_batch=None,
        cache=None,
        **kwargs,
    ) -> Seq2SeqLMOutput:
        r"""labels (`(B, T)`, -100 = ignored): teacher forcing; the loss is the summed token cross-entropy
        divided by `num_items_in_batch` when the Trainer passes it, else by the number of label tokens.
        `cache` is `past_key_values` under the name transformers 5.24's `generate` passes."""
        past_key_values = cache if past_key_values is None else past_key_values
        if labels is not None:
            check_token_ids(labels, self.config.vocab_size, "labels", ignore_index=-100)
            use_cache = False
            if decoder_input_ids is None and decoder_inputs_embeds is None:
                decoder_input_ids = self.prepare_decoder_input_ids_from_labels(labels)

        outputs = self.model(
            input_ids,
            attention_mask=attention_mask,
            decoder_input_ids=decoder_input_ids,
            encoder_outputs=encoder_outputs,
            decoder_attention_mask=decoder_attention_mask,
            past_key_values=past_key_values,
            inputs_embeds=inputs_embeds,
            decoder_inputs_embeds=decoder_inputs_embeds,
            use_cache=use_cache,
            output_attentions=output_attentions,
            output_hidden_states=output_hidden_states,
            return_dict=True,
        )
        logits = self.lm_head(outputs.last_hidden_state) + self.final_logits_bias  # (B, T, V)

        return Seq2SeqLMOutput(
            loss=None if labels is None else token_loss(logits, labels, num_items_in_batch),
            logits=logits,
            **{OUTPUT_CACHE_FIELD: getattr(outputs, OUTPUT_CACHE_FIELD)},
            decoder_hidden_states=outputs.decoder_hidden_states,
            decoder_attentions=outputs.decoder_attentions,
            cross_attentions=outputs.cross_attentions,
            encoder_last_hidden_state=outputs.encoder_last_hidden_state,
            encoder_hidden_states=outputs.encoder_hidden_states,
            encoder_attentions=outputs.encoder_attentions,
        )

    @classmethod
    def from_marian(cls, model_or_path, **overrides) -> "MarianPosEncForConditionalGeneration":
        """Convert a stock `MarianMTModel` (instance or local folder) into this class.

        `overrides` are config fields, e.g. `position_encoding="learned"` or `encoder_self_attention=...`:
        parameters the stock model has keep their trained values, new ones (a learned table, a relative
        bias, a new mixer) are initialised, and Marian's sinusoid table is dropped (ours is rebuilt).
        """
        from transformers import MarianConfig, MarianMTModel

        marian = model_or_path
        if not isinstance(marian, MarianMTModel):
            marian = MarianMTModel.from_pretrained(model_or_path)
        known = {field.name for field in dataclasses.fields(MarianConfig)} - {"architectures", "dtype"}
        fields = {key: value for key, value in marian.config.to_dict().items() if key in known}
        config = MarianPosEncConfig(**{**fields, **overrides})
        model = cls(config)
        state = {k: v for k, v in marian.state_dict().items() if not k.endswith("embed_positions.weight")}
        missing, unexpected = model.load_state_dict(state, strict=False)
        if unexpected:
            logger.warning("from_marian: parameters not used by the new positional modules: %s", unexpected)
        if missing:
            logger.info("from_marian: newly initialised parameters: %s", missing)
        model.generation_config = marian.generation_config
        return model.to(marian.dtype)
