"""Sentence-aware positions: positions that restart at every sentence, the sentence index as its own signal, and
a relative sentence bias in cross-attention. On when the config lists the tokens that end a sentence
(`sentence_end_token_ids`, e.g. from `generation_length.sentence_end_token_ids(tokenizer)`).

For the tokens x_0..x_{n-1} of one sequence (a source, or a target with its start token) and the set E of
sentence-end tokens, a new sentence starts at x_t when x_{t-1} ∈ E and x_t is neither `</s>` nor padding (the
sequence's closing `</s>` belongs to the sentence it closes). With start_t = 1 for such t (and 0 for t = 0),

    s_t = Σ_{u ≤ t} start_u                                   (sentence index, 0, 1, 2, ...)
    p_t = t − max{u ≤ t : start_u = 1 or u = 0}              (position inside the sentence, 0 at its first token)

where t counts the real tokens of the sequence (left padding is skipped, as `positions_from_padding_mask` does).
The stack's position encoding receives p_t wherever it received t (SHAPE's offset is added to p_t), so every
sentence of a joined input is seen at the positions of a sentence alone: a decoder trained on one to four joined
sentences meets no position it was not trained on at eight or sixteen, as long as each sentence is no longer than
the training sentences. The sentence index enters

* the input: x_t + S[s_t] with a learned table S (`sentence_embedding="learned"`, `max_sentences` rows), the
  segment embedding of Ma, Zhang & Zhou (ACL 2020, "A Simple and Effective Unified Encoder for Document-Level
  Machine Translation"; BERT's and Marian's type embeddings). Rows past the largest sentence count of training
  keep their initialisation, as a learned position table's do;
* cross-attention (`sentence_cross_attention_bias`): score(i, j) += w_h[clip(s^src_j − s^tgt_i, −C, C)] with a
  learned w ∈ R^{H × (2C+1)}, C = `sentence_cross_attention_max_distance`, one table for all decoder layers. It is
  T5's relative bias (Raffel et al. 2020, JMLR, §2.1) over sentence indices instead of token positions, with
  clipping instead of log buckets (sentence distances are small integers), and the soft form of G-Transformer's
  group attention (Bao et al., ACL 2021, "G-Transformer for Document-level Machine Translation"), which lets the
  target tokens of sentence k attend only to the source sentence k in its lower layers: a head that puts a large
  negative w_h at every d ≠ 0 does exactly that. It gives cross-attention the position information that
  P-Transformer (Li et al., TASLP 2023) finds missing in document-to-document MT, in a form that extrapolates:
  every clipped difference |d| ≥ C shares one trained value, so a model trained on groups of C + 1 or more
  sentences has seen every bucket it meets on longer inputs. Keep C below the largest sentence count of the
  training examples.

Deviations: Ma et al. mark context against current sentence (two segments), not a running index; G-Transformer
uses hard group masks in its lower layers only. The bias is shared by all layers, as T5 shares its bias within a
stack, and folded into the cross-attention mask, so SDPA keeps its fused kernel.

In the decoder the in-sentence position and sentence index of the next token depend on the tokens generated so
far: the state after every cached token (the last one's continues the count; the others let assisted decoding crop
the cache back to the accepted tokens) and the in-sentence positions of every cached token (the keys of later
steps) travel in `PosEncCache.extra_state`, which beam search reorders, selects and repeats with the key/value
caches.
"""

import dataclasses

import torch
from torch import nn
from transformers import initialization as init

from .base import (
    CROSS_ATTENTION,
    DECODER_SELF_ATTENTION,
    ENCODER_SELF_ATTENTION,
    STACKS,
    PositionContext,
    PositionLimitError,
    additive_mask,
    lookup_columns,
)

# The decoder's per-token entries in `PosEncCache.extra_state`: each token's (sentence index, position of its
# sentence's first token, ends a sentence), (B, k, 3), and each token's in-sentence position, (B, k).
SENTENCE_STATE = "sentence_state"
SENTENCE_POSITIONS = "sentence_positions"
SENTENCE_EMBEDDINGS = ("learned", "none")
SENTENCE_FIELDS = (
    "sentence_embedding",
    "max_sentences",
    "sentence_cross_attention_bias",
    "sentence_cross_attention_max_distance",
)


@dataclasses.dataclass
class SentencePositions:
    """One forward's tokens: in-sentence positions p_t and sentence indices s_t, (B, L) each, the state after each
    token, (B, L, 3) (`SENTENCE_STATE`), and the tokens' order t, (B|1, L), that causality is read from."""

    positions: torch.Tensor
    indices: torch.Tensor
    states: torch.Tensor
    order: torch.Tensor

    @property
    def state(self) -> torch.Tensor:
        """The state after the last token, (B, 3): where the next tokens continue."""
        return self.states[:, -1]


class SentenceBoundaries:
    """Finds where sentences start in token ids; holds the id sets on each device they were asked for (so that a
    decoding step copies nothing from the host)."""

    def __init__(self, config):
        eos = config.eos_token_id if isinstance(config.eos_token_id, list) else [config.eos_token_id]
        self.end_ids = list(config.sentence_end_token_ids)
        self.continuation_ids = [i for i in (*eos, config.pad_token_id) if i is not None]
        self.on_device: dict[torch.device, tuple[torch.Tensor, torch.Tensor]] = {}

    def ids(self, device) -> tuple[torch.Tensor, torch.Tensor]:
        device = torch.device(device)
        if device not in self.on_device:
            self.on_device[device] = (
                torch.tensor(self.end_ids, dtype=torch.long, device=device),
                torch.tensor(self.continuation_ids, dtype=torch.long, device=device),
            )
        return self.on_device[device]

    def __call__(self, token_ids, order, padding_mask=None, state=None) -> SentencePositions:
        """`token_ids` (B, L); `order` (B|1, L): each token's place among the real tokens of its sequence (from
        the first one, or the cache length in the decoder); `padding_mask` (B, L) or None; `state` (B, 3): the
        state after the tokens before these (None: these begin the sequence)."""
        if token_ids is None or token_ids.dtype.is_floating_point:
            raise ValueError(
                "sentence-aware positions (sentence_end_token_ids) find sentence ends in the token ids: pass "
                "input_ids / decoder_input_ids, not inputs_embeds."
            )
        end_ids, continuation_ids = self.ids(token_ids.device)
        if state is None:
            state = token_ids.new_zeros(token_ids.shape[0], 3)  # sentence 0, starting at 0, no end before
        ends = torch.isin(token_ids, end_ids)  # (B, L)
        after_end = torch.cat([state[:, 2:].bool(), ends[:, :-1]], dim=1)  # (B, L)
        starts = after_end & ~torch.isin(token_ids, continuation_ids)
        if padding_mask is not None:
            starts = starts & padding_mask.bool()
        indices = state[:, :1] + starts.long().cumsum(1)  # (B, L)
        first = (
            torch.where(starts, order, state[:, 1:2]).cummax(1).values
        )  # (B, L): order of the sentence start
        states = torch.stack([indices, first, ends.long()], dim=2)  # (B, L, 3)
        return SentencePositions(order - first, indices, states, order)


class SentenceEmbedding(nn.Module):
    """x_t + S[s_t]: a learned sentence-index table of `max_sentences` rows (Ma et al. 2020's segment embedding),
    initialised N(0, d^−1/2) as the learned position table; a longer input raises `PositionLimitError`."""

    # The config choice it belongs to, named by `from_pretrained`'s check of missing positional parameters.
    config_field = "sentence_embedding"

    def __init__(self, config):
        super().__init__()
        self.config = config
        self.weight = nn.Parameter(torch.empty(config.max_sentences, config.d_model))
        self.reset_parameters()

    def reset_parameters(self):
        init.normal_(self.weight, mean=0.0, std=self.config.d_model**-0.5)

    def forward(self, hidden_states, indices, largest: int) -> torch.Tensor:
        """(B, L, D) + S[indices (B, L)]; `largest` bounds the indices on the host (read off them when it does not
        fit the table, so that decoding reads nothing back until then)."""
        rows = self.weight.shape[0]
        if largest >= rows and (largest := int(indices.max())) >= rows:
            raise PositionLimitError(largest + 1, rows, "sentence embedding", "max_sentences")
        return hidden_states + self.weight[indices].to(hidden_states.dtype)  # (B, L, D)


class SentenceCrossAttentionBias(nn.Module):
    """b_h(i, j) = w_h[clip(s^src_j − s^tgt_i, −C, C) + C], (B, H, q, S), added to the cross-attention scores of
    every decoder layer; w is initialised N(0, d^−1/2) (T5 draws its bias table at the same scale)."""

    config_field = "sentence_cross_attention_bias"

    def __init__(self, config):
        super().__init__()
        self.config = config
        self.max_distance = config.sentence_cross_attention_max_distance
        self.weight = nn.Parameter(torch.empty(config.decoder_attention_heads, 2 * self.max_distance + 1))
        self.reset_parameters()

    def reset_parameters(self):
        init.normal_(self.weight, mean=0.0, std=self.config.d_model**-0.5)

    def forward(self, target_indices, source_indices) -> torch.Tensor:
        """`target_indices` (B, q), `source_indices` (B, S) -> (B, H, q, S)."""
        distance = source_indices[:, None, :] - target_indices[:, :, None]  # (B, q, S)
        bucket = distance.clamp(-self.max_distance, self.max_distance) + self.max_distance
        return lookup_columns(self.weight, bucket).transpose(0, 1)  # (B, H, q, S)


class SentencePositionsMixin:
    """The stacks' use of sentence-aware positions (mixed into `MarianPosEncStack`, which builds
    `sentence_boundaries`, `sentence_embedding` and `sentence_cross_attention_bias` from the config, None where
    off): `embed_sentences` for both stacks; `decoder_sentences`, `sentence_context` and `sentence_cross_mask` for
    the decoder, whose sentence state continues over the steps of a cached decode. The encoder calls
    `sentence_boundaries` directly: its positions come whole from the padding mask."""

    def embed_sentences(self, hidden_states, sentences: SentencePositions | None, largest: int):
        """The stack's input plus the learned row of each token's sentence index (unchanged without one);
        `largest` bounds the indices on the host."""
        if sentences is None or self.sentence_embedding is None:
            return hidden_states
        return self.sentence_embedding(hidden_states, sentences.indices, largest)  # (B, L, D)

    def decoder_sentences(self, input_ids, order, past_length: int, cache) -> SentencePositions | None:
        """Sentence positions of the new tokens, with `positions` (B, k) covering the cached tokens too (the keys);
        the state after each token and every token's position travel in the cache (None: sentences off).
        `order` (1, q): the new tokens' places, past_length onwards."""
        if self.sentence_boundaries is None:
            return None
        state = history = None
        if past_length:
            if SENTENCE_STATE not in cache.extra_state:
                raise ValueError(
                    "the decoder cache holds cached tokens but no sentence state (sentence_end_token_ids): "
                    "continue decoding with the cache this model returned."
                )
            state, history = cache.last_token_state(SENTENCE_STATE), cache.extra_state[SENTENCE_POSITIONS]
        new = self.sentence_boundaries(input_ids, order, None, state)
        if cache is not None:
            cache.append_token_state(SENTENCE_STATE, new.states)  # (B, k, 3)
            cache.append_token_state(SENTENCE_POSITIONS, new.positions)  # (B, k)
        if history is not None:
            new.positions = torch.cat([history, new.positions], dim=1)  # (B, k)
        return new

    def sentence_context(self, sentences, offsets, context: PositionContext) -> PositionContext:
        """The self-attention context with in-sentence positions (SHAPE-shifted), ordered by `context`'s."""
        keys = sentences.positions if offsets is None else sentences.positions + offsets  # (B, k)
        queries = keys[:, keys.shape[1] - context.query_positions.shape[1] :]  # (B, q)
        span = (0, context.key_span[1])  # positions restart: the smallest may be 0 at any step
        return PositionContext(
            self.position_encoding,
            queries,
            keys,
            span,
            span,
            query_order=context.query_positions,
            key_order=context.key_positions,
        )

    def sentence_cross_mask(self, cross_mask, sentences, source_indices, context, dtype):
        """The cross-attention mask with the sentence bias folded in, so SDPA keeps its fused kernel."""
        if self.sentence_cross_attention_bias is None:
            return cross_mask
        if source_indices is None:
            raise ValueError(
                "sentence_cross_attention_bias needs the source's sentence indices: pass encoder_outputs as the "
                "encoder returns them (MarianPosEncEncoderOutput.sentence_indices), not a tuple or your own output."
            )
        bias = self.sentence_cross_attention_bias(sentences.indices, source_indices).to(dtype)  # (B, H, q, S)
        return additive_mask(cross_mask, bias, context, is_causal=False)


def field_default(config, name: str):
    return type(config).__dataclass_fields__[name].default


def check_sentence_config(config, position_encodings, token_mixers) -> None:
    """Raise a ValueError naming the bad value and the allowed ones (called by the config's `check_choices`)."""
    ends = config.sentence_end_token_ids
    if any(not isinstance(i, int) or not 0 <= i < config.vocab_size for i in ends) or len(set(ends)) < len(
        ends
    ):
        raise ValueError(
            f"sentence_end_token_ids={ends} must be distinct token ids in 0..{config.vocab_size - 1}."
        )
    eos = config.eos_token_id if isinstance(config.eos_token_id, list) else [config.eos_token_id]
    if clash := sorted({*eos, config.pad_token_id, config.decoder_start_token_id} & set(ends)):
        raise ValueError(
            f"sentence_end_token_ids={ends} holds {clash}, the end-of-sequence, padding or decoder start token: "
            "list only tokens that end a sentence inside the text ('.', '!', '?')."
        )
    if config.sentence_embedding not in SENTENCE_EMBEDDINGS:
        raise ValueError(
            f"sentence_embedding={config.sentence_embedding!r} is not known; allowed values: "
            f"{', '.join(SENTENCE_EMBEDDINGS)}."
        )
    for name in ("max_sentences", "sentence_cross_attention_max_distance"):
        if getattr(config, name) < 1:
            raise ValueError(f"{name}={getattr(config, name)} must be >= 1.")
    check_sentence_fields_used(config)
    if not ends:
        return
    for stack in STACKS:
        encoding = getattr(config, f"{stack}_position_encoding")
        if not position_encodings[encoding].supports_sentence_positions:
            allowed = [name for name, cls in position_encodings.items() if cls.supports_sentence_positions]
            raise ValueError(
                f"{stack}_position_encoding={encoding!r} cannot take positions that restart at each sentence "
                f"(sentence_end_token_ids); allowed with them: {', '.join(allowed)}."
            )
    sites = [ENCODER_SELF_ATTENTION, DECODER_SELF_ATTENTION]
    sites += [CROSS_ATTENTION] if config.sentence_cross_attention_bias else []
    for site in sites:
        mixer = getattr(config, site)
        if not token_mixers[mixer].supports_sentence_positions:
            allowed = [name for name, cls in token_mixers.items() if cls.supports_sentence_positions]
            raise ValueError(
                f"{site}={mixer!r} cannot be used with sentence-aware positions (sentence_end_token_ids"
                f"{', sentence_cross_attention_bias' if site == CROSS_ATTENTION else ''}); allowed there: "
                f"{', '.join(allowed)}."
            )


def check_sentence_fields_used(config) -> None:
    """A sentence field set away from its default where it would silently do nothing is an error."""
    unused = []
    if not config.sentence_end_token_ids:
        unused = [name for name in SENTENCE_FIELDS if getattr(config, name) != field_default(config, name)]
    else:
        if config.sentence_embedding == "none" and config.max_sentences != field_default(
            config, "max_sentences"
        ):
            unused.append("max_sentences")
        distance = "sentence_cross_attention_max_distance"
        if not config.sentence_cross_attention_bias and getattr(config, distance) != field_default(
            config, distance
        ):
            unused.append(distance)
    if unused:
        raise ValueError(
            ", ".join(f"{name}={getattr(config, name)!r}" for name in unused)
            + " would do nothing: sentence-aware positions need sentence_end_token_ids (the tokens that end a "
            "sentence), max_sentences needs sentence_embedding='learned', sentence_cross_attention_max_distance "
            "needs sentence_cross_attention_bias=True."
        )
