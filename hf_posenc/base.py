"""The interface every positional module of hf_posenc implements, and the plumbing they share.

A model makes two orthogonal choices (see docs/architecture.md):

* a :class:`PositionEncoding` per stack (encoder, decoder) says how positions enter: it may change the
  embeddings (`embed`) and it may hook into the content attention of each self-attention layer
  (`projection_per_head`, `rotate_queries_keys`, `transform_values`, `score_bias`, or a whole `attend`
  of its own);
* a :class:`TokenMixer` per attention site (encoder self-attention, decoder self-attention, cross-attention)
  says how tokens are mixed; content attention is one mixer among several.

Positions never get guessed inside a module: the model computes them once per forward (from the padding
mask in the encoder, from the cache length in the decoder) and hands them down in a :class:`PositionContext`.
"""

import contextlib
from dataclasses import dataclass, field, replace
from typing import Any

import torch
from torch import nn
from transformers.cache_utils import EncoderDecoderCache

# The project's three papers (docs cite them as paper 1, 2, 3), and the Transformer, for the model cards.
PAPER_1 = (
    "Zhang, Liu, Liu, Liang 2023. Interpreting Positional Information in Perspective of Word Order. ACL."
)
PAPER_2 = (
    "Schmidt, Di Gangi 2023. Bridging the Gap between Position-Based and Content-Based Self-Attention for "
    "Neural Machine Translation. WMT."
)
PAPER_3 = (
    "Chen, Wang, Utiyama, Sumita 2019. Recurrent Positional Embedding for Neural Machine Translation. "
    "EMNLP-IJCNLP."
)
VASWANI = "Vaswani et al. 2017. Attention Is All You Need. NeurIPS."

ENCODER = "encoder"
DECODER = "decoder"
STACKS = (ENCODER, DECODER)

ENCODER_SELF_ATTENTION = "encoder_self_attention"
DECODER_SELF_ATTENTION = "decoder_self_attention"
CROSS_ATTENTION = "cross_attention"
ATTENTION_SITES = (ENCODER_SELF_ATTENTION, DECODER_SELF_ATTENTION, CROSS_ATTENTION)


def is_number(value) -> bool:
    """An int or float that is not a bool (a config or generation setting read from JSON)."""
    return isinstance(value, (int, float)) and not isinstance(value, bool)


def positions_from_padding_mask(attention_mask: torch.Tensor | None, length: int, device) -> torch.Tensor:
    """Position of every token counted from the first real token of its own sequence.

    Sources are normally right-padded, where this is simply 0..L-1; counting from the mask keeps a token's
    position independent of the batch's padding on either side. Returns (B, L), or (1, L) without a mask.
    """
    if attention_mask is None:
        return torch.arange(length, device=device)[None]  # (1, L)
    return (attention_mask.long().cumsum(-1) - 1).clamp(min=0)  # (B, L)


class PositionLimitError(ValueError):
    """An input needs more positions than a bounded table holds (raised by :func:`check_max_positions`).

    Its own class so that callers which expect long inputs (the length-generalisation harness) can tell "this
    model cannot represent that length" from every other ValueError. The numbers are kept as attributes;
    `field` is the config field that sizes the table."""

    def __init__(
        self, positions: int, max_positions: int, module_name: str, field: str = "max_position_embeddings"
    ):
        super().__init__(
            f"Sequence of {positions} positions is longer than the {max_positions} positions of the "
            f"'{module_name}' table (config.{field}={max_positions}); shorten the input or "
            f"build the model with a larger {field}."
        )
        self.positions = positions
        self.max_positions = max_positions
        self.module_name = module_name
        self.field = field

    def __reduce__(self):  # picklable across processes despite the multi-argument constructor
        return type(self), (self.positions, self.max_positions, self.module_name, self.field)


def check_max_positions(
    context: "PositionContext", max_positions: int, module_name: str, field: str = "max_position_embeddings"
) -> None:
    """Bounded tables raise a clear :class:`PositionLimitError` instead of an IndexError deep inside
    `nn.Embedding`; `field` is the config field that sizes the table."""
    longest = context.position_count
    if longest > max_positions:
        raise PositionLimitError(longest, max_positions, module_name, field)


def position_span(positions: torch.Tensor) -> tuple[int, int]:
    """(smallest, largest) entry of a position tensor, read back to the host (a device sync)."""
    if not positions.numel():
        return 0, -1
    return int(positions.min()), int(positions.max())


def tensors_identity(tensors) -> list[tuple]:
    """What tells that a table's source tensors are still the same: the tensor objects (kept, so their ids are
    not reused), their storage, dtype and device (`.to()` and `.data =` swap them under the same object)."""
    return [(t, t.data_ptr(), t.dtype, t.device) for t in tensors]


def same_tensors(kept: list[tuple], current: list[tuple]) -> bool:
    if len(kept) != len(current):
        return False
    return all(a[0] is b[0] and a[1:] == b[1:] for a, b in zip(kept, current, strict=True))


def forget_derived_tables(module, incompatible_keys=None) -> None:
    """`load_state_dict` post-hook (a module-level function, so the model stays picklable)."""
    module.derived_tables.clear()


class DerivedTables:
    """Mixin for modules that keep tables derived from their parameters for forwards without gradients (decoding),
    so that a decoding step reads rows of a table instead of recomputing them over its whole prefix.

    Call `keep_derived_tables()` in `__init__`. Sources change by being replaced, cast or moved (seen by
    `tensors_identity`) or in place, which happens in an optimizer step, `load_state_dict` or a
    re-initialisation. The tables are forgotten on `load_state_dict`, on `train()`/`eval()`, and by the module
    whenever a forward computes with gradients to their sources (it precedes any optimizer step: `forget`). An
    in-place edit outside these (`p.mul_(2)` under torch.no_grad() in eval mode) is not seen: call
    `model.eval()` after it. (Earlier versions keyed the tables on torch's private `Tensor._version`.)
    """

    def keep_derived_tables(self) -> None:
        # Tables derived from parameters, by name: (identity of their sources, table).
        self.derived_tables: dict[str, tuple[list[tuple], torch.Tensor]] = {}
        self.register_load_state_dict_post_hook(forget_derived_tables)

    def derived_table(self, name: str, sources, build, fits=None) -> torch.Tensor:
        """`build()`, kept under `name` while the `sources` it is computed from stay the same tensors and
        `fits(table)` holds."""
        identity = tensors_identity(sources)
        kept = self.derived_tables.get(name)
        if kept is None or not same_tensors(kept[0], identity) or (fits is not None and not fits(kept[1])):
            kept = self.derived_tables[name] = (identity, build())
        return kept[1]

    def forget(self, name: str) -> None:
        """Drop one table (its sources may be stepped after a forward with gradients)."""
        self.derived_tables.pop(name, None)

    def train(self, mode: bool = True):
        forget_derived_tables(self)
        return super().train(mode)


def full_precision(device: torch.device):
    """A region where autocast is off on `device`, so that a kept table does not depend on the autocast region
    that built it (meta has no autocast)."""
    if torch.amp.is_autocast_available(device.type):
        return torch.autocast(device.type, enabled=False)
    return contextlib.nullcontext()


DROPOUT_RESOLUTION = 2**16  # the CPU dropout's draws: p is rounded to a multiple of 1 / DROPOUT_RESOLUTION
# False: torch's own dropout on the CPU too (the masks of runs trained before the packed draws; the `before` arm
# of benchmarks/train_throughput.py)
PACKED_CPU_DROPOUT = True


def apply_dropout(hidden: torch.Tensor, p: float, training: bool) -> torch.Tensor:
    """`nn.functional.dropout` of every module, with its mask drawn faster on the CPU in eager mode (only the
    attention weights' dropout inside transformers' SDPA kernel stays the kernel's).

    torch's CPU dropout draws one Bernoulli sample per element from its generator, serially: 0.7 ms for a
    (39, 16, 256) activation on an AMD EPYC, a fifth of the default recipe's update (docs/training.md). Here
    each element takes 16 bits of one full-range 64-bit draw (`random_`, four elements per draw) from the same
    generator, so the seed and a resumed run's saved generator state decide the masks. An element
    is kept where its 16 bits fall below k = round((1 - p) · 2^16) and scaled by 2^16 / k, the inverse of the
    share kept: the expectation is exact, and p is rounded to a multiple of 2^-16. Elsewhere (another device,
    under torch.compile, p outside that grid's open range, `PACKED_CPU_DROPOUT` False) it is torch's own
    dropout."""
    if not training or p == 0.0:
        return hidden
    kept = round((1 - p) * DROPOUT_RESOLUTION)
    packed = PACKED_CPU_DROPOUT and hidden.device.type == "cpu" and not torch.compiler.is_compiling()
    if not packed or not 0 < kept < DROPOUT_RESOLUTION:
        return nn.functional.dropout(hidden, p=p, training=True)
    words = torch.empty((hidden.numel() + 3) // 4, dtype=torch.int64).random_(-(2**63), None)  # (⌈n/4⌉,)
    draws = words.view(torch.int16)[: hidden.numel()].view(hidden.shape)  # uniform in [-2^15, 2^15)
    return hidden * (draws < kept - DROPOUT_RESOLUTION // 2) * (DROPOUT_RESOLUTION / kept)


def lookup_columns(table: torch.Tensor, index: torch.Tensor) -> torch.Tensor:
    """`table[:, index]`, (R, C) and (...) -> (R, ...), for a small table read at many more places (a kernel's
    taps, FIRE's pieces, a bias per distance over (q, k)), through `index_select`, whose backward sums the
    gradient with `index_add_` in one pass over the index (atomic adds on CUDA, deterministic in torch's
    deterministic mode). Advanced indexing's backward accumulates the repeated indices one after the other: on
    the CPU 3.2 vs 0.9 ms forward + backward for a (4, 33) table at a (512, 512) index and 40 vs 22 ms for (8, 33)
    at (1024, 1024) (one thread, AMD EPYC with AVX512), and on CUDA its kernel gives each distinct index one warp
    that walks all of its repeats (pytorch/pytorch#41162)."""
    return table.index_select(1, index.flatten()).view(table.shape[0], *index.shape)


@dataclass(frozen=True)
class Hyperparameter:
    """A typed config field owned by a module: `MarianPosEncConfig` gains one field per declared name, with
    this type and default (the paper's value), and rejects values outside `choices` or the bounds."""

    type: Any
    default: Any
    doc: str
    choices: tuple | None = None
    minimum: float | None = None  # inclusive
    below: float | None = None  # exclusive upper bound

    def check(self, name: str, value) -> None:
        if value is None:
            return
        if self.choices is not None and value not in self.choices:
            raise ValueError(
                f"{name}={value!r} is not known; allowed values: {', '.join(map(str, self.choices))}."
            )
        if self.minimum is not None and value < self.minimum:
            raise ValueError(f"{name}={value!r} must be >= {self.minimum}.")
        if self.below is not None and value >= self.below:
            raise ValueError(f"{name}={value!r} must be < {self.below}.")


@dataclass(frozen=True)
class PositionPanel:
    """One picture of what a module learned about positions: a heat map ("map", 2-D) or one curve per head
    against the distance j - i ("curves", (H, P) with the query in the middle of P positions)."""

    title: str
    kind: str
    data: torch.Tensor


def cosine_similarity_matrix(rows: torch.Tensor) -> torch.Tensor:
    """(N, ...) -> (N, N) cosine similarities of the flattened rows (e.g. learned positions or kernels)."""
    rows = nn.functional.normalize(rows.detach().float().flatten(1), dim=-1)
    return rows @ rows.T


def all_positions_context(encoding, positions: int, device=None) -> "PositionContext":
    """Queries and keys at positions 0..positions-1, (1, P) each."""
    span = torch.arange(positions, device=device)[None]  # (1, P)
    return PositionContext(encoding, span, span, (0, positions - 1), (0, positions - 1))


class DescribedModule:
    """What a registered module says about itself. The config (`hyperparameters`), the model card (`title`,
    `reference`, `citations`), the position plots (`position_panels`), the benchmark systems and the
    conformance suite (`variants`), and the comparison tables' notes (`paper_deviations`) all read these, so
    adding a module is its file and its registry line."""

    #: Name in tables and cards, e.g. "PosNet-Embed".
    title: str = ""
    #: Paper and equations, e.g. "paper 1 Eq. 22/24 (kernels Eq. 14-17)".
    reference: str = ""
    #: Full references for the model card.
    citations: tuple[str, ...] = ()
    #: Config fields this module owns, name -> Hyperparameter (inherited by subclasses).
    hyperparameters: dict[str, Hyperparameter] = {}
    #: Option sets that deserve their own conformance and benchmark run: name -> config overrides, applied on
    #: top of the module's own system (its name in both stacks, or at its self-attention sites).
    variants: dict[str, dict] = {}
    #: Config fields that size this module's table of positions, the first one set wins (PosNet-Embed:
    #: `posnet_embed_max_positions`, else `max_position_embeddings`); () for modules without such a table. The
    #: config checks that randomized positions (`randomized_positions_max`) fit.
    position_table_fields: tuple[str, ...] = ()

    def position_panels(self, positions: int) -> list[PositionPanel]:
        """Pictures of what this module learned about the first `positions` positions (none by default)."""
        return []

    @classmethod
    def paper_deviations(cls, config, place: str) -> list[str]:
        """Where this module built from `config` at `place` (a stack or an attention site) departs from its
        paper's stated setting although the config asked for the default (e.g. a size scaled to a smaller
        model), each a phrase without the place; the comparison tables print these next to the row. None by
        default."""
        return []


@dataclass
class PositionContext:
    """What an attention site knows about positions during one forward.

    `encoding` is the stack's position encoding for self-attention sites and None for cross-attention
    (the papers keep cross-attention free of positions unless a mixer asks for them explicitly).

    The spans bound the positions as host integers, so that modules size their tables and check lengths
    without reading the position tensors back from the device at every decoding step. The model passes
    them (the decoder knows them from the cache length); when they are left out they are read off the
    tensors. A span may be wider than the positions it bounds (the model bounds padded source positions by
    the source length), never narrower.
    """

    encoding: "PositionEncoding | None"
    query_positions: torch.Tensor  # (B|1, q): absolute position of each query token
    key_positions: torch.Tensor  # (B|1, k): absolute position of each key, cached ones included
    query_span: tuple[int, int] | None = None  # (smallest, largest) query position
    key_span: tuple[int, int] | None = None  # (smallest, largest) key position
    # The stack's self-attention mask with a bias shared by all its layers folded in (`stack_score_mask`),
    # made once per forward by the stack and set by each layer (`with_score_mask`); None when the encoding's
    # bias is per layer or absent.
    score_mask: torch.Tensor | None = field(default=None, repr=False)
    # Each token's place in its sequence where the positions do not follow it (sentence-aware positions restart
    # at every sentence, `sentence_end_token_ids`); None: the positions are in sequence order. Causality is read
    # from these (`causal_mask`), never from restarting positions.
    query_order: torch.Tensor | None = field(default=None, repr=False)  # (B|1, q)
    key_order: torch.Tensor | None = field(default=None, repr=False)  # (B|1, k)

    def __post_init__(self):
        if self.query_span is None:
            self.query_span = position_span(self.query_positions)
        if self.key_span is None:
            self.key_span = (
                self.query_span
                if self.key_positions is self.query_positions
                else position_span(self.key_positions)
            )

    @property
    def position_count(self) -> int:
        """Positions a table must hold for this context: one more than its largest position."""
        return max(self.query_span[1], self.key_span[1]) + 1


class PositionEncoding(DescribedModule, nn.Module):
    """How positions enter one stack. The base class is the identity at every hook ("none").

    Subclasses override only the hooks they need. Hooks receive explicit positions; a hook that returns
    its input unchanged costs nothing, so content attention calls every hook unconditionally.
    """

    #: Set to True by encodings whose attention cannot be expressed as a bias on the scores (Shaw's value
    #: term): content attention then calls `attend` instead of the SDPA/eager kernel.
    has_custom_attention = False
    #: Set to True by encodings whose `score_bias` is the same in every layer of the stack (T5, ALiBi): the
    #: stack then computes it once per forward, merged with its mask (`stack_score_mask`).
    score_bias_shared_by_layers = False
    #: False for encodings that cannot take positions restarting at each sentence (`sentence_end_token_ids`):
    #: the config then refuses the combination.
    supports_sentence_positions = True

    def __init__(self, config, stack: str):
        super().__init__()
        self.config = config
        self.stack = stack

    @classmethod
    def check_config(cls, config, stack: str) -> None:
        """Raise ValueError for hyperparameters this encoding cannot use (called when the config is built)."""

    def tie_to_encoder(self, encoder_encoding: "PositionEncoding") -> None:
        """Called on the decoder's encoding once both stacks exist, with the encoder's encoding.

        Encodings that share modules across the two stacks (PosNet-Embed by default) take them here; the
        default shares nothing.
        """

    def embed(
        self, inputs_embeds: torch.Tensor, context: PositionContext, padding_mask, cache
    ) -> torch.Tensor:
        """Scaled token embeddings (B, L, D) -> stack input (B, L, D), before the stack's dropout.

        The tokens' positions are `context.query_positions`, (B, L) in the encoder and (1, L) in the decoder
        ((B, L) in training with SHAPE, `shape_max_shift`);
        `padding_mask` is the stack's (B, L) 1/0 mask or None; `cache` is the model's :class:`PosEncCache`
        during incremental decoding (encodings with a recurrent state keep it there), else None.
        """
        return inputs_embeds

    def projection_per_head(self, layer_idx: int) -> bool:
        """Whether the query/key/value projections of self-attention layer `layer_idx` read only each head's own
        slice of the input: the diagonal (D_h, D_h) blocks of their weights, one product per head."""
        return False

    def rotate_queries_keys(self, layer_idx: int, query, key, context: PositionContext):
        """(B, H, q, Dh), (B, H, k_new, Dh) -> same; keys are the new ones only (rotated before caching)."""
        return query, key

    def transform_values(self, layer_idx: int, value, value_positions: torch.Tensor, value_span=None):
        """(B, H, k_new, Dh) -> same, applied before caching so each decoding step transforms one value.

        `value_span` is the (smallest, largest) value position as host integers (the model always passes it;
        None: read it off the positions)."""
        return value

    def score_bias(self, layer_idx: int, context: PositionContext) -> torch.Tensor | None:
        """Additive bias on the scaled attention scores, (B|1, H, q, k), or None (any `layer_idx` when
        `score_bias_shared_by_layers`)."""
        return None

    def position_panels(self, positions):
        """Each head's score bias against the distance j - i, seen from the middle query, per biased layer
        (one panel when the stack's layers share the bias)."""
        layers = self.config.encoder_layers if self.stack == ENCODER else self.config.decoder_layers
        context = all_positions_context(self, positions)
        panels = []
        for layer_idx in range(1 if self.score_bias_shared_by_layers else layers):
            bias = self.score_bias(layer_idx, context)
            if bias is not None:
                where = "all layers" if self.score_bias_shared_by_layers else f"layer {layer_idx}"
                curves = bias[0, :, positions // 2, :]  # (H, P): query in the middle, keys on both sides
                panels.append(PositionPanel(f"{self.stack} {where}: bias vs j - i", "curves", curves))
        return panels

    def attend(
        self,
        module,
        query,
        key,
        value,
        attention_mask,
        context: PositionContext,
        dropout: float,
        need_weights: bool,
    ):
        """Whole attention for encodings with `has_custom_attention`; returns (B, q, H, Dh) and the weights
        (B, H, q, k), or None for them when `need_weights` is False."""
        raise NotImplementedError(f"{type(self).__name__} does not define its own attention")


class TokenMixer(DescribedModule, nn.Module):
    """How tokens are mixed at one attention site; replaces `MarianAttention`.

    `forward(hidden_states, key_value_states, past_key_values, attention_mask, context, output_attentions)`
    returns `(output (B, q, D), attention weights or None)`. Decoder self-attention mixers must store their
    keys (or anything with the sequence length on dim -2) in the self-attention cache, so that the decoder
    can read the number of cached positions from it.
    """

    #: The sites where this mixer is well defined (e.g. a Fourier transform cannot be causal).
    allowed_sites = ATTENTION_SITES
    #: Input position encoding of a stack whose self-attention is this mixer, unless one is set explicitly
    #: (paper 2 §5.2 pairs rPosNet with learned absolute embeddings, the other mixers with sinusoids).
    recommended_position_encoding = "sinusoidal"
    #: True for mixers that take positions restarting at each sentence in self-attention (causality from the
    #: context's order, not its positions) and a sentence bias folded into the cross-attention mask
    #: (`sentence_end_token_ids`, `sentence_cross_attention_bias`); the config refuses the others there.
    supports_sentence_positions = False
    #: True for mixers whose weights honour every key the mask they receive excludes, so that the attention
    #: windows (`attention_window`, `cross_attention_window`; attention_windows.py) hold at their sites.
    supports_attention_windows = False
    #: True for cross-attention mixers that take the queries of an example's N beams (B·N, ..., 1, D) against one
    #: copy of its cached keys and values (B, ...): the fast loop's `shared_cross_attention` (fast_decoding.py).
    supports_shared_cross_attention = False

    def __init__(self, config, site: str, layer_idx: int):
        super().__init__()
        self.config = config
        self.site = site
        self.layer_idx = layer_idx
        self.is_causal = site == DECODER_SELF_ATTENTION
        self.is_cross_attention = site == CROSS_ATTENTION
        self.embed_dim = config.d_model
        self.num_heads = (
            config.decoder_attention_heads
            if site != ENCODER_SELF_ATTENTION
            else config.encoder_attention_heads
        )
        self.head_dim = self.embed_dim // self.num_heads

    @classmethod
    def check_config(cls, config, site: str) -> None:
        """Raise ValueError for hyperparameters this mixer cannot use at `site` (called when the config is built)."""

    def share_within_stack(self, stack_mixers: list["TokenMixer"]) -> None:
        """Called once a stack's layers exist, with all of its mixers in layer order (in a decoder layer,
        self-attention before cross-attention). Mixers that share a table across layers (rPosNet's ñ) take it
        here; the default shares nothing."""

    def precompute_position_attention(self) -> None:
        """Fold energies that depend on positions only into per-layer tables; a no-op for other mixers."""


def causal_mask(context: PositionContext) -> torch.Tensor:
    """Boolean (B|1, 1, q, k) mask, True where a query may attend: keys at or before its own position.

    transformers hands SDPA no mask at all for unpadded causal attention (the kernel's `is_causal` does it);
    any other kernel has to rebuild causality from the positions (from the tokens' order where positions restart
    at each sentence).
    """
    queries = context.query_positions if context.query_order is None else context.query_order  # (B|1, q)
    keys = context.key_positions if context.key_order is None else context.key_order  # (B|1, k)
    return keys[:, None, None, :] <= queries[:, None, :, None]


def additive_mask(
    attention_mask: torch.Tensor | None,
    bias: torch.Tensor,
    context: PositionContext,
    is_causal: bool,
) -> torch.Tensor:
    """Merge a positional score bias with whatever mask transformers built, into one float additive mask.

    transformers hands attention an SDPA boolean mask (True = attend), an eager float mask, or None (no
    padding; causality then implicit through `is_causal`). Folding the bias into the mask keeps SDPA's
    fused kernel usable for every bias-type encoding.
    """
    min_value = torch.finfo(bias.dtype).min
    if attention_mask is None and not is_causal:
        return bias
    if attention_mask is None:
        attention_mask = causal_mask(context)
    if attention_mask.dtype == torch.bool:
        return bias.masked_fill(~attention_mask, min_value)
    return bias + attention_mask.to(bias.dtype)


def stack_score_mask(
    encoding: PositionEncoding,
    attention_mask: torch.Tensor | None,
    context: PositionContext,
    is_causal: bool,
) -> torch.Tensor | None:
    """A stack's self-attention mask with its encoding's bias folded in, when that bias is the same in every
    layer (T5 computes it once per stack), else None.

    The stack calls this once per forward, before its layers: the gather of the bias, its gradient and the
    merge with the padding mask are paid once instead of once per layer. The layers take it as a tensor
    argument (`with_score_mask`), so activation checkpoints, reentrant ones included, route its gradient.
    """
    if not encoding.score_bias_shared_by_layers:
        return None
    return additive_mask(attention_mask, encoding.score_bias(0, context), context, is_causal)


def with_score_mask(context: PositionContext, score_mask: torch.Tensor | None) -> PositionContext:
    """The context a layer hands its self-attention mixer: the stack's context with its score mask."""
    return context if score_mask is None else replace(context, score_mask=score_mask)


class PosEncCache(EncoderDecoderCache):
    """`EncoderDecoderCache` that also carries per-sequence state of position encodings (e.g. an RNN state).

    `extra_state` maps a name to a batch-first tensor; beam search's reordering, batch selection and
    repetition apply to it exactly as to the key/value caches, so stateful encodings stay exact under
    `generate`. An entry is either constant over the decoding (SHAPE's offsets, (B, 1)) or, when written through
    `append_token_state`, one row per cached token along dim 1 (the RNN state after each token, (B, k, ...)):
    state that changes with the tokens must be kept per token, so that `crop` (assisted decoding drops the
    rejected draft tokens) can return to the state after the kept prefix.
    """

    def __init__(self, *caches):
        super().__init__(*caches)
        self.extra_state: dict[str, torch.Tensor] = {}
        self.token_state_names: set[str] = set()

    def reset(self):
        super().reset()
        self.extra_state.clear()
        self.token_state_names.clear()

    def append_token_state(self, name: str, states: torch.Tensor) -> None:
        """Append the states after each new token, (B, q, ...), to entry `name`, (B, k, ...)."""
        stored = self.extra_state.get(name)
        self.extra_state[name] = states if stored is None else torch.cat([stored, states], dim=1)
        self.token_state_names.add(name)

    def last_token_state(self, name: str) -> torch.Tensor | None:
        """The state after the last cached token, (B, ...), or None when there is none (no token, or all cropped)."""
        stored = self.extra_state.get(name)
        return None if stored is None or stored.shape[1] == 0 else stored[:, -1]

    def reorder_cache(self, beam_idx: torch.LongTensor):
        super().reorder_cache(beam_idx)
        for name, state in self.extra_state.items():
            self.extra_state[name] = state.index_select(0, beam_idx.to(state.device))

    def batch_repeat_interleave(self, repeats: int):
        super().batch_repeat_interleave(repeats)
        self.repeat_extra_state(repeats)

    def repeat_extra_state(self, repeats: int):
        """Every per-sequence entry repeated `repeats` times along the batch (each sequence's beams)."""
        for name, state in self.extra_state.items():
            self.extra_state[name] = state.repeat_interleave(repeats, dim=0)

    def batch_select_indices(self, indices: torch.Tensor):
        super().batch_select_indices(indices)
        for name, state in self.extra_state.items():
            self.extra_state[name] = state[indices]

    def crop(self, tokens_to_remove: int):
        """Drop the last `-tokens_to_remove` cached tokens (transformers' convention: a negative count) from the
        key/value caches and from every per-token entry; constant entries stay."""
        super().crop(tokens_to_remove)
        kept = self.get_seq_length()
        for name in self.token_state_names:
            self.extra_state[name] = self.extra_state[name][:, :kept]
