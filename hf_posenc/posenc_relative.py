"""Relative and bias position encodings inside self-attention: Shaw RPE, T5 bias, Adaptive-T5, ALiBi (RoPE:
posenc_rotary.py).

None of them touches the embeddings and none has an absolute-length limit (no `max_positions`). All work
from the explicit positions of the `PositionContext` (query i, key j, relative distance r = j - i), so
incremental decoding uses query row t against keys 0..t exactly as the full forward does; Shaw's kernel
takes the same distances from the token indices (`ClippedDistances`), which agree with the positions for
every pair of real tokens. Cross-attention gets no position encoding (its context carries none), as in all
of these papers.

* `"shaw"` — Shaw, Uszkoreit & Vaswani (NAACL 2018), Eq. 3-5: e_ij = q_i (k_j + a^K_ij)^T / sqrt(d_h) and
  z_i = sum_j alpha_ij (v_j + a^V_ij), a_ij = w[clip(j - i, -k, k)]. The only scheme that cannot be a score
  bias (the value term), so it runs its own attention (`attend`).
* `"t5_bias"` — Raffel et al. (JMLR 2020), Sec. 2.1: a learned scalar per head and log-bucketed distance.
* `"adaptive_t5"` — Wu et al. (AAAI 2021): T5's bias with learned soft buckets and a per-head MLP.
* `"alibi"` — Press, Smith & Lewis (ICLR 2022), Sec. 3: bias -m_h |i - j| with fixed head slopes m_h.

The bias schemes return a (B|1, H, q, k) bias from `score_bias`, which content attention folds into the
mask, so SDPA keeps its fused kernel.
"""

import math
from dataclasses import dataclass

import torch
from torch import nn
from transformers import initialization as init

from .base import (
    ENCODER,
    PAPER_1,
    DerivedTables,
    Hyperparameter,
    PositionContext,
    PositionEncoding,
    PositionPanel,
    apply_dropout,
    causal_mask,
    cosine_similarity_matrix,
    full_precision,
    lookup_columns,
)


def relative_distances(context: PositionContext) -> torch.Tensor:
    """r_ij = j - i for every query i and key j: (B|1, q, k), negative for keys in the past."""
    return context.key_positions[:, None, :] - context.query_positions[:, :, None]


def distinct_distances(context: PositionContext) -> tuple[torch.Tensor, torch.Tensor]:
    """The distances r = j - i a context can contain, as a range (R,) taken from its host-side spans (R = q + k - 1
    for unpadded inputs), and the entry of every (i, j) in it, (B|1, q, k). Biases that depend on r only are
    computed over the R distances and gathered."""
    relative = relative_distances(context)  # (B|1, q, k)
    nearest = context.key_span[0] - context.query_span[1]
    farthest = context.key_span[1] - context.query_span[0]
    return torch.arange(nearest, farthest + 1, device=relative.device), relative - nearest


class DistanceBias(DerivedTables):
    """Mixin of the encodings whose score bias depends on the distance r = j - i alone (T5, Adaptive-T5): the bias
    of a decoding step's query row is read from a kept per-distance table instead of being recomputed over the
    distances to its whole prefix at every step."""

    def distance_bias(
        self, name: str, sources, per_distance, context: PositionContext, stochastic: bool = False
    ) -> torch.Tensor:
        """bias_h(j - i) of every query i and key j of `context`, (B|1, H, q, k), from `per_distance`, which maps
        distances (R,) to their bias (H, R) and draws from `sources` (randomly in training if `stochastic`).

        With gradients to the sources (training), or a stochastic bias in training, `per_distance` runs over the
        context's distinct distances and the result is gathered. Otherwise it runs once over the distances
        -(L-1)..L-1, L the power of two that covers the context, in full precision, and the table is kept under
        `name` (`DerivedTables`: rebuilt when the sources change or a longer context needs more of it), so a
        decoding step only reads the k entries of its query row.
        """
        learning = torch.is_grad_enabled() and any(source.requires_grad for source in sources)
        if learning or (stochastic and self.training):
            self.forget(name)  # the sources may be stepped after this
            distances, index = distinct_distances(context)  # (R,), (B|1, q, k)
            return lookup_columns(per_distance(distances), index).movedim(0, 1)  # (B|1, H, q, k)
        (query_first, query_last), (key_first, key_last) = context.query_span, context.key_span
        covered = 1 << max(query_last - key_first, key_last - query_first, 0).bit_length()  # L > every |r|
        device = context.key_positions.device

        def build():
            distances = torch.arange(1 - covered, covered, device=device)  # (2L-1,)
            with torch.no_grad(), full_precision(device):
                return per_distance(distances).contiguous()  # (H, 2L-1)

        table = self.derived_table(name, sources, build, fits=lambda kept: kept.shape[-1] >= 2 * covered - 1)
        index = relative_distances(context) + table.shape[-1] // 2  # (B|1, q, k); r = 0 is the middle column
        return lookup_columns(table, index).movedim(0, 1)  # (B|1, H, q, k)


def stack_heads_layers(config, stack: str) -> tuple[int, int]:
    """(number of heads, number of layers) of a stack's self-attention."""
    if stack == ENCODER:
        return config.encoder_attention_heads, config.encoder_layers
    return config.decoder_attention_heads, config.decoder_layers


SHAW = "Shaw, Uszkoreit, Vaswani 2018. Self-Attention with Relative Position Representations. NAACL."
T5 = "Raffel et al. 2020. Exploring the Limits of Transfer Learning with a Unified Text-to-Text Transformer. JMLR."
# Small clipping and bucket settings, so that clipped Shaw distances and T5's logarithmic buckets are reached
# within the conformance suite's test lengths.
SHORT_RANGE = {
    "max_relative_position": 2,
    "t5_bias_num_buckets": 8,
    "t5_bias_max_distance": 8,
}


@dataclass(frozen=True)
class ClippedDistances:
    """Where every (query i, key j) of a self-attention grid falls among the 2k + 1 clipped distances.

    Self-attention queries are the last q of the k keys (all of them in training, the new ones when
    decoding), so r_ij = clip(j - (k - q) - i, -k_max, k_max) in index space. For real tokens this is the
    distance of their positions (`positions_from_padding_mask`): padding sits on one side of a sequence and
    shifts both ends of a pair alike. Pairs involving padding differ, but padded keys are masked and padded
    queries' outputs are never read by a real token. In causal attention the keys after a query are masked, so
    their weights and score gradients are 0 and the +k_max end is not summed (`causal`).
    """

    index: torch.Tensor  # (1, 1, q, k) long: the table row r_ij + k_max of each pair
    interior_keys: torch.Tensor  # (q, 2k_max - 1) long: the key at each distance -k_max+1..k_max-1 (clamped)
    interior_valid: torch.Tensor  # (q, 2k_max - 1) bool: whether that key exists
    far_keys: torch.Tensor  # (2 | 1, q, k) 0/1: the keys clipped to -k_max (row 0) and to +k_max (row 1)
    causal: bool  # keys after the query are masked: no +k_max row in `far_keys`

    @classmethod
    def of_grid(
        cls, queries: int, keys: int, max_distance: int, device, dtype, causal: bool = False
    ) -> "ClippedDistances":
        rows = torch.arange(queries, device=device)[:, None]
        distance = torch.arange(keys, device=device)[None] - (keys - queries) - rows  # (q, k)
        interior = rows + (keys - queries) + torch.arange(1 - max_distance, max_distance, device=device)
        far_ends = [distance <= -max_distance] + ([] if causal else [distance >= max_distance])
        return cls(
            index=(distance.clamp(-max_distance, max_distance) + max_distance)[None, None],
            interior_keys=interior.clamp(0, keys - 1),
            interior_valid=(interior >= 0) & (interior < keys),
            far_keys=torch.stack(far_ends).to(dtype),
            causal=causal,
        )

    def sum_per_distance(self, weights: torch.Tensor) -> torch.Tensor:
        """Sum of (B, H, q, k) weights over the keys at each clipped distance: (B, H, q, 2k_max + 1).

        Each interior distance has one key per query, read with a small gather; the two clipped ends are
        masked row sums (`vecdot` with 0/1 rows). On the CPU this is about 2x faster than scatter-adding the
        (B, H, q, k) map into the distances (2.7-3.8 vs 6.5 ms on a (2, 4, 512, 512) map, one thread).
        """
        lead = weights.shape[:3]
        interior = weights.gather(-1, self.interior_keys.expand(*lead, -1))
        interior.masked_fill_(~self.interior_valid, 0)  # (B, H, q, 2k_max - 1)
        far = self.far_keys.to(weights.dtype)  # (2 | 1, q, k); built in the weights' dtype, so no copy
        nearest = torch.linalg.vecdot(weights, far[0])  # (B, H, q): keys at distance <= -k_max
        # keys at distance >= k_max: none unmasked in causal attention
        farthest = torch.zeros_like(nearest) if self.causal else torch.linalg.vecdot(weights, far[1])
        return torch.cat([nearest[..., None], interior, farthest[..., None]], dim=-1)


class ShawAttentionFunction(torch.autograd.Function):
    """Shaw attention (Eq. 3-5) that keeps no (B, H, q, k) tensor for backward: it recomputes the weights.

    Autograd through the plain formula saves the softmax output and the dropped-out weights of every layer,
    (B, H, q, k) each, which content attention's fused SDPA kernel never stores. Here forward saves only
    queries, keys, values, the two tables and the mask, and backward recomputes alpha = softmax(scores) from
    them (one more q.k^T and q.w^K product per layer); with attention dropout it also keeps the (B, H, q, k)
    boolean keep-mask, a byte per weight.

    Gradients, with S the scaled scores, alpha = softmax(S), alpha' = dropout(alpha), dZ the output gradient:
    dalpha' = dZ V^T + (dZ w^V^T)[r_ij];  dS = alpha (dalpha - sum_j alpha dalpha) (softmax);
    dQ = (dS K + scatter_r(dS) w^K) s;  dK = dS^T Q s;  dV = alpha'^T dZ;  dw^K = scatter_r(dS)^T Q s;
    dw^V = scatter_r(alpha')^T dZ, where scatter_r sums a (B, H, q, k) tensor over the keys at each clipped
    distance r, giving (B, H, q, 2k+1). Each (B, H, q, k) map is written by as few passes as PyTorch allows:
    the relative term is the addend of a batched GEMM (`baddbmm_`), softmax and its backward are the fused
    kernels, scatter_r is a gather of the interior distances plus two masked row sums, and the scaling s is
    applied to the (B, H, q, Dh) products rather than to the maps.
    """

    @staticmethod
    def forward(ctx, query, key, value, key_table, value_table, distances, mask, scaling, dropout):
        """query (B, H, q, Dh), key/value (B, H, k, Dh), tables (2k+1, Dh), `ClippedDistances` of the (q, k)
        grid, mask None / bool (True = attend) / float additive, broadcastable to (B, H, q, k).
        Returns the output (B, H, q, Dh) and the (dropped-out) weights alpha' (B, H, q, k)."""
        index = distances.index.expand(*query.shape[:3], key.shape[2])  # (B, H, q, k)
        weights = torch.softmax(shaw_scores(query, key, key_table, index, mask, scaling), dim=-1)
        keep = None
        if dropout > 0:
            keep = torch.rand_like(weights) >= dropout  # (B, H, q, k) bool
            weights.mul_(keep).div_(1 - dropout)
        weights = weights.to(value.dtype)
        output = torch.matmul(weights, value) + torch.matmul(
            distances.sum_per_distance(weights), value_table
        )  # Eq. 3
        ctx.save_for_backward(query, key, value, key_table, value_table, mask, keep)
        ctx.scaling, ctx.dropout, ctx.causal = scaling, dropout, distances.causal
        ctx.mark_non_differentiable(weights)
        return output, weights

    @staticmethod
    @torch.autograd.function.once_differentiable
    def backward(ctx, grad_output, _grad_weights):
        query, key, value, key_table, value_table, mask, keep = ctx.saved_tensors
        distances = ClippedDistances.of_grid(
            query.shape[2], key.shape[2], key_table.shape[0] // 2, query.device, query.dtype, ctx.causal
        )  # rebuilt, not saved: a few passes over one (q, k) grid
        index = distances.index.expand(*query.shape[:3], key.shape[2])  # (B, H, q, k)
        weights = torch.softmax(shaw_scores(query, key, key_table, index, mask, ctx.scaling), dim=-1)
        dropped = weights if keep is None else weights * keep / (1 - ctx.dropout)
        dropped = dropped.to(value.dtype)  # (B, H, q, k)
        grad_value = torch.matmul(dropped.transpose(2, 3), grad_output)  # (B, H, k, Dh)
        grad_value_table = torch.einsum(
            "bhqr,bhqd->rd", distances.sum_per_distance(dropped), grad_output
        )  # (2k+1, Dh)
        grad_dropped = relative_plus_product(grad_output, value, value_table, index)  # (B, H, q, k)
        grad_weights = grad_dropped.to(weights.dtype)
        if keep is not None:
            grad_weights.mul_(keep).div_(1 - ctx.dropout)
        grad_scores = torch._softmax_backward_data(grad_weights, weights, -1, weights.dtype).to(query.dtype)
        grad_per_distance = distances.sum_per_distance(grad_scores)  # (B, H, q, 2k+1)
        grad_query = torch.matmul(grad_scores, key).add_(torch.matmul(grad_per_distance, key_table))
        grad_key = torch.matmul(grad_scores.transpose(2, 3), query)
        grad_key_table = torch.einsum("bhqr,bhqd->rd", grad_per_distance, query)
        return (
            grad_query.mul_(ctx.scaling),
            grad_key.mul_(ctx.scaling),
            grad_value,
            grad_key_table.mul_(ctx.scaling),
            grad_value_table,
            *(None,) * 4,
        )


def shaw_attention_autograd(query, key, value, key_table, value_table, distances, mask, scaling, dropout):
    """Eq. 3-5 as plain tensor operations, for autograd: the output (B, H, q, Dh) and the (dropped-out) weights
    alpha' (B, H, q, k), differentiable with respect to everything they depend on. Same arguments and result as
    `ShawAttentionFunction`, which returns its weights detached; this path keeps the softmax output and the
    dropped-out weights of every layer for backward, as an eager attention that returns its weights does."""
    index = distances.index.expand(*query.shape[:3], key.shape[2])  # (B, H, q, k)
    weights = torch.softmax(shaw_scores(query, key, key_table, index, mask, scaling), dim=-1)
    weights = apply_dropout(weights, p=dropout, training=dropout > 0).to(value.dtype)  # (B, H, q, k)
    output = torch.matmul(weights, value) + torch.matmul(distances.sum_per_distance(weights), value_table)
    return output, weights  # Eq. 3


def relative_plus_product(rows, columns, table, index) -> torch.Tensor:
    """rows_i . columns_j + rows_i . table[r_ij] for (B, H, q, Dh) rows and (B, H, k, Dh) columns: (B, H, q, k).

    The relative term is gathered from the (B, H, q, 2k+1) products with the table and then serves as the
    addend of one batched GEMM, so the (B, H, q, k) map is written once more, not twice."""
    batch, heads, length, dim = rows.shape
    relative = torch.matmul(rows, table.T).gather(-1, index)  # (B, H, q, k)
    relative.view(batch * heads, length, -1).baddbmm_(
        rows.reshape(batch * heads, length, dim), columns.reshape(batch * heads, -1, dim).transpose(1, 2)
    )  # in place: the out-of-place baddbmm would first copy the map into its output
    return relative


def shaw_scores(query, key, key_table, index, mask, scaling) -> torch.Tensor:
    """Eq. 4 with the mask applied: (q_i k_j^T + q_i w^K[r_ij]^T) * scaling, (B, H, q, k), at least float32.
    The scaling multiplies the (B, H, q, Dh) queries, not the map."""
    scores = relative_plus_product(query * scaling, key, key_table, index)  # (B, H, q, k)
    scores = scores.to(torch.promote_types(scores.dtype, torch.float32))
    if mask is None:
        return scores
    if mask.dtype == torch.bool:
        return scores.masked_fill_(~mask, torch.finfo(scores.dtype).min)
    return scores.add_(mask)


# Score elements per batch slice of Shaw's kernel: 2**21 floats = 8 MiB, measured on the CPU (B 8, H 4, L 512,
# one thread, fwd + bwd): slices of 4-8 MiB took ~25 % less CPU time than the whole 128 MiB batch at once.
SHAW_SCORES_PER_SLICE = 1 << 21


class ShawRelativePositionEncoding(PositionEncoding):
    """Shaw et al. 2018, Eq. 3-5 (relative position representations), separate key and value tables.

    a^K_ij = w^K[clip(j - i, -k, k)] and a^V_ij = w^V[...] are learned per layer, shared across heads
    (Sec. 3.3), each of shape (2k + 1, d_h); k = `config.max_relative_position` (16 for base in paper 1,
    8 for big). Deviation from OpenNMT-py, which shares one table for keys and values: we keep Shaw's two.

    Efficiency (Sec. 3.3, the tensor2tensor reshaping idea): no (B, H, q, k, d_h) tensor is formed. The key
    term is q_i . w^K[r] for the 2k + 1 distances r, a (B, H, q, 2k+1) matmul, then gathered to (B, H, q, k);
    the value term sums the weights alpha_ij that fall on each clipped distance
    (`ClippedDistances.sum_per_distance`, into (B, H, q, 2k+1)) and multiplies by w^V. `ShawAttentionFunction`
    recomputes the weights in backward, so, like SDPA, a layer keeps no (B, H, q, k) float tensor for the
    backward pass; its weights carry no gradient. When the weights are asked for (`output_attentions`) with
    autograd on, `shaw_attention_autograd` computes the same attention with plain operations instead, so a loss
    on the returned weights trains the queries, keys and w^K (at the memory cost of keeping the maps).
    """

    title = "RPE (Shaw)"
    reference = "Shaw et al. 2018 Eq. 3-5; paper 1 Table 1 (RPE)"
    citations = (SHAW, PAPER_1)
    hyperparameters = {
        "max_relative_position": Hyperparameter(
            int, 16, "clipping distance k (Shaw et al. 2018: 16 base, 8 big)", minimum=1
        ),
    }
    variants = {"short-range-decoder": {"encoder_position_encoding": "t5_bias", **SHORT_RANGE}}
    has_custom_attention = True
    # Its distances come from the token indices of the score grid, not from the context's positions: positions
    # restarting at each sentence would be ignored.
    supports_sentence_positions = False

    def __init__(self, config, stack):
        super().__init__(config, stack)
        heads, layers = stack_heads_layers(config, stack)
        self.max_relative_position = config.max_relative_position
        num_distances = 2 * self.max_relative_position + 1
        head_dim = config.d_model // heads
        self.key_tables = nn.Parameter(torch.empty(layers, num_distances, head_dim))  # w^K per layer
        self.value_tables = nn.Parameter(torch.empty(layers, num_distances, head_dim))  # w^V per layer
        self.reset_parameters()

    def reset_parameters(self):
        # tensor2tensor initialises the relative embeddings like other embeddings: N(0, d_h^-1/2).
        std = self.key_tables.shape[-1] ** -0.5
        init.normal_(self.key_tables, mean=0.0, std=std)
        init.normal_(self.value_tables, mean=0.0, std=std)

    def position_panels(self, positions):
        """Cosine similarity of the relative key embeddings w^K of every pair of clipped distances, per layer."""
        return [
            PositionPanel(f"{self.stack} layer {i}: w^K similarity", "map", cosine_similarity_matrix(table))
            for i, table in enumerate(self.key_tables)
        ]

    def attend(self, module, query, key, value, attention_mask, context, dropout, need_weights):
        """Eq. 3-5 through `ShawAttentionFunction`, a slice of the batch at a time so that each slice's
        (b, H, q, k) maps (at most `SHAW_SCORES_PER_SLICE` floats) stay in the CPU caches across the kernel's
        dozen passes over them; returns (B, q, H, Dh) and the weights alpha (B, H, q, k) if asked for."""
        if attention_mask is None and module.is_causal:
            attention_mask = causal_mask(context)  # (B|1, 1, q, k)
        key_table = self.key_tables[module.layer_idx].to(query.dtype)  # (2k+1, Dh)
        value_table = self.value_tables[module.layer_idx].to(query.dtype)  # (2k+1, Dh)
        batch, heads, length, _ = query.shape
        distances = ClippedDistances.of_grid(
            length, key.shape[2], self.max_relative_position, query.device, query.dtype, module.is_causal
        )
        if need_weights and torch.is_grad_enabled():  # weights a loss may read: autograd through Eq. 3-5
            output, weights = shaw_attention_autograd(
                query, key, value, key_table, value_table, distances, attention_mask, module.scaling, dropout
            )
            return output.transpose(1, 2).contiguous(), weights  # (B, q, H, Dh)
        rows = max(1, SHAW_SCORES_PER_SLICE // (heads * length * key.shape[2]))
        outputs, weights = [], []
        for start in range(0, batch, rows):
            part = slice(start, start + rows)
            output, part_weights = ShawAttentionFunction.apply(
                query[part],
                key[part],
                value[part],
                key_table,
                value_table,
                distances,
                batch_rows(attention_mask, part),
                module.scaling,
                dropout,
            )
            outputs.append(output)
            weights.append(part_weights)
        output = torch.cat(outputs) if len(outputs) > 1 else outputs[0]
        weights = (torch.cat(weights) if len(weights) > 1 else weights[0]) if need_weights else None
        return output.transpose(1, 2).contiguous(), weights  # (B, q, H, Dh)


def batch_rows(tensor: torch.Tensor | None, rows: slice) -> torch.Tensor | None:
    """Rows of a tensor that is batch-first or broadcast over the batch (leading size 1)."""
    if tensor is None or tensor.shape[0] == 1:
        return tensor
    return tensor[rows]


T5_BIAS_TABLE = "bias_per_distance"  # T5's kept bias per distance (`DistanceBias`)


def t5_relative_bucket(
    relative: torch.Tensor, bidirectional: bool, num_buckets: int, max_distance: int
) -> torch.Tensor:
    """T5's bucket of a relative distance r = j - i (Raffel et al. 2020, Sec. 2.1).

    Bidirectional: half the buckets for keys after the query (r > 0), half for the rest. Causal: only the
    past, r <= 0, all future keys fall into bucket 0 (they are masked anyway). Within a half, distances below
    half its size get a bucket each; larger ones share logarithmically wider buckets up to `max_distance`,
    beyond which everything lands in the last bucket.
    """
    if bidirectional:
        num_buckets //= 2
        offset = (relative > 0).long() * num_buckets
        distance = relative.abs()
    else:
        offset = torch.zeros_like(relative)
        distance = (-relative).clamp(min=0)
    exact = num_buckets // 2
    # log(0) would be -inf: the clamp only touches distances that take the exact branch.
    log_ratio = torch.log(distance.clamp(min=1).float() / exact) / math.log(max_distance / exact)
    logarithmic = exact + (log_ratio * (num_buckets - exact)).long()
    logarithmic = logarithmic.clamp(max=num_buckets - 1)
    return offset + torch.where(distance < exact, distance, logarithmic)


class T5BiasPositionEncoding(DistanceBias, PositionEncoding):
    """T5 relative attention bias: scores_h(i, j) += b_h[bucket(j - i)] (Raffel et al. 2020, Sec. 2.1).

    One (num_buckets, H) table per stack, shared by all its layers as in T5; bidirectional buckets in the
    encoder, causal ones in the decoder. Deviation: T5 does not scale q.k by 1/sqrt(d_h); Marian does, and
    the bias is added after that scaling (the softmax sees content/sqrt(d_h) + bias). As in T5 the bias is
    computed once per stack forward and shared by the layers (`stack_score_mask`): buckets for the at most
    q + k - 1 distinct distances, then one gather to (B|1, H, q, k); without gradients the bias per distance is
    kept (`DistanceBias`), so a decoding step reads its row instead of bucketing the distances to its prefix.
    """

    title = "T5 bias"
    reference = "Raffel et al. 2020 §2.1"
    citations = (T5,)
    hyperparameters = {
        "t5_bias_num_buckets": Hyperparameter(int, 32, "buckets per stack (T5: 32)", minimum=1),
        "t5_bias_max_distance": Hyperparameter(
            int, 128, "distance where the last bucket starts (T5: 128)", minimum=1
        ),
    }
    variants = {"short-range-decoder": {"encoder_position_encoding": "shaw", **SHORT_RANGE}}
    score_bias_shared_by_layers = True

    def __init__(self, config, stack):
        super().__init__(config, stack)
        self.keep_derived_tables()  # the bias per distance for decoding (`DistanceBias`)
        heads, _ = stack_heads_layers(config, stack)
        self.num_buckets = config.t5_bias_num_buckets
        self.max_distance = config.t5_bias_max_distance
        self.bidirectional = stack == ENCODER
        # a parameter of this module, not an nn.Embedding: transformers' generic init would re-draw a child
        # embedding at init_std after `reset_parameters` ran (children are initialised first)
        self.table = nn.Parameter(torch.empty(self.num_buckets, heads))  # (buckets, H)
        self.reset_parameters()

    @classmethod
    def check_config(cls, config, stack):
        # the smallest exact region is num_buckets / 4 (bidirectional) and must hold distance 0 and 1
        if config.t5_bias_num_buckets < 8 or config.t5_bias_num_buckets % 4:
            raise ValueError(
                f"t5_bias_num_buckets={config.t5_bias_num_buckets} must be a multiple "
                "of 4 and at least 8 (T5 uses 32)."
            )
        if config.t5_bias_max_distance <= config.t5_bias_num_buckets // 2:
            raise ValueError(
                f"t5_bias_max_distance={config.t5_bias_max_distance} must exceed half "
                f"of t5_bias_num_buckets={config.t5_bias_num_buckets}."
            )

    def reset_parameters(self):
        # T5's initialisation of the relative attention bias: N(0, d_model^-1/2).
        init.normal_(self.table, mean=0.0, std=self.config.d_model**-0.5)

    def bias_per_distance(self, distances: torch.Tensor) -> torch.Tensor:
        """b_h[bucket(r)] for distances r (R,): (H, R)."""
        buckets = t5_relative_bucket(distances, self.bidirectional, self.num_buckets, self.max_distance)
        return self.table[buckets].T

    def score_bias(self, layer_idx, context):
        return self.distance_bias(T5_BIAS_TABLE, [self.table], self.bias_per_distance, context)


MLP_INIT_STD, MLP_INIT_BIAS = 0.1, 0.1  # Adaptive-T5's MLP initialisation in the authors' code


class AdaptiveT5PositionEncoding(DistanceBias, PositionEncoding):
    """Adaptive-T5 (Wu et al., AAAI 2021): T5's bias with learned soft buckets.

    With r = j - i, head h:  f_h(r) = 1 - exp(-alpha_h r) for r > 0 and f_h(r) = 1 - exp(beta_h r) for
    r <= 0, where alpha_h = ReLU(a_h) / L and beta_h = ReLU(b_h) / L, L = `adaptive_t5_max_length`, a_h and
    b_h initialised uniform in [1, 15]. The bias is bias_h(i, j) = g_h^{sign r}(f_h(r)), a per-head,
    per-direction MLP 1 -> l1 -> l2 -> 1 with sigmoid hidden activations (l1, l2 =
    `adaptive_t5_hidden_sizes`, 32 and 4 in the authors' MT setup) and dropout (`adaptive_t5_dropout`, 0.5 in
    the authors' code) on the first hidden layer in training, added after the 1/sqrt(d_h) scaling.
    Encoder and decoder have their own parameters. The decoder is causal: only the r <= 0 direction exists
    there (the r > 0 one could never receive a gradient). By default only the first layer gets the bias (the
    authors' choice); `adaptive_t5_every_layer=True` gives every layer its own parameters.

    The bias depends on r only, so the MLP runs over the distinct distances (at most q + k - 1 per head)
    and is then gathered to (B|1, H, q, k). Without gradients and dropout (decoding) it runs once over a range
    of distances in full precision and the result is kept (`DistanceBias`): a decoding step reads its row of
    the table instead of running the MLP over the distances to its whole prefix in every biased layer. Deviation from the authors' released code: it slices the
    decoder bias to [:1, :1] during incremental inference, dropping the positional signal at test time; here
    query row t sees keys 0..t exactly as in training. The rest follows the authors' released MT code: L =
    256 (their A = 1 / max_length with THUMT's max_length 256), MLP weights from a normal with std 0.1
    truncated at two standard deviations, every MLP bias 0.1. There the dropout mask is drawn per (i, j)
    pair; here the MLP runs once per distinct distance, so pairs at the same distance share a mask.
    """

    title = "Adaptive-T5"
    reference = "Wu et al. 2021; paper 1 Table 1"
    citations = (
        "Wu, Zhang, Mao, Chen 2021. On Scalar Embedding of Relative Positions in Attention Models. AAAI.",
        PAPER_1,
    )
    hyperparameters = {
        "adaptive_t5_hidden_sizes": Hyperparameter(
            list[int] | tuple[int, ...], (32, 4), "MLP widths l1, l2 (the authors' MT setup: 32, 4)"
        ),
        "adaptive_t5_max_length": Hyperparameter(
            int, 256, "L in alpha_h = ReLU(a_h) / L (the authors' code: 256)", minimum=1
        ),
        "adaptive_t5_dropout": Hyperparameter(
            float,
            0.5,
            "dropout on the MLP's first hidden layer (the authors' code: 0.5)",
            minimum=0.0,
            below=1.0,
        ),
        "adaptive_t5_every_layer": Hyperparameter(
            bool, False, "a bias in every layer instead of the first only"
        ),
    }
    variants = {"every-layer": {"adaptive_t5_every_layer": True}}

    def __init__(self, config, stack):
        super().__init__(config, stack)
        self.keep_derived_tables()  # the bias per distance for decoding (`DistanceBias`)
        heads, layers = stack_heads_layers(config, stack)
        self.every_layer = config.adaptive_t5_every_layer
        self.max_length = config.adaptive_t5_max_length
        self.dropout = config.adaptive_t5_dropout
        self.bidirectional = stack == ENCODER
        tables = layers if self.every_layer else 1
        directions = 2 if self.bidirectional else 1  # index 0: r <= 0, index 1: r > 0
        first, second = config.adaptive_t5_hidden_sizes
        shape = (tables, directions, heads)
        self.decay = nn.Parameter(torch.empty(*shape))  # b_h (direction 0) and a_h (direction 1)
        self.hidden1_weight = nn.Parameter(torch.empty(*shape, first))
        self.hidden1_bias = nn.Parameter(torch.empty(*shape, first))
        self.hidden2_weight = nn.Parameter(torch.empty(*shape, first, second))
        self.hidden2_bias = nn.Parameter(torch.empty(*shape, second))
        self.output_weight = nn.Parameter(torch.empty(*shape, second))
        self.output_bias = nn.Parameter(torch.empty(*shape))
        self.reset_parameters()

    @classmethod
    def check_config(cls, config, stack):
        sizes = config.adaptive_t5_hidden_sizes
        if len(sizes) != 2 or min(sizes) <= 0:
            raise ValueError(f"adaptive_t5_hidden_sizes={sizes} must be two positive integers (l1, l2).")

    def reset_parameters(self):
        init.uniform_(self.decay, 1.0, 15.0)
        for weight in (self.hidden1_weight, self.hidden2_weight, self.output_weight):
            init.trunc_normal_(weight, std=MLP_INIT_STD, a=-2 * MLP_INIT_STD, b=2 * MLP_INIT_STD)
        for bias in (self.hidden1_bias, self.hidden2_bias, self.output_bias):
            init.constant_(bias, MLP_INIT_BIAS)

    def bias_per_distance(self, table: int, distances: torch.Tensor) -> torch.Tensor:
        """bias_h(r) for distances r (R,): (H, R)."""
        dtype = self.decay.dtype
        rate = nn.functional.relu(self.decay[table]) / self.max_length  # (dirs, H)
        # f = 1 - exp(-alpha r) for r > 0 and 1 - exp(beta r) = 1 - exp(-beta |r|) for r <= 0
        soft_bucket = 1 - torch.exp(-rate[..., None] * distances.abs().to(dtype))  # (dirs, H, R)
        hidden = torch.sigmoid(
            soft_bucket[..., None] * self.hidden1_weight[table, :, :, None]
            + self.hidden1_bias[table, :, :, None]
        )  # (dirs, H, R, l1)
        hidden = apply_dropout(hidden, p=self.dropout, training=self.training)
        hidden = torch.sigmoid(
            torch.matmul(hidden, self.hidden2_weight[table]) + self.hidden2_bias[table, :, :, None]
        )  # (dirs, H, R, l2)
        bias = torch.matmul(hidden, self.output_weight[table, ..., None])[..., 0]  # (dirs, H, R)
        bias = bias + self.output_bias[table, :, :, None]
        if not self.bidirectional:
            return bias[0]
        return torch.where(distances > 0, bias[1], bias[0])  # (H, R)

    def score_bias(self, layer_idx, context):
        if layer_idx > 0 and not self.every_layer:
            return None
        table = layer_idx if self.every_layer else 0
        return self.distance_bias(
            f"bias_per_distance_{table}",
            list(self.parameters()),
            lambda distances: self.bias_per_distance(table, distances),
            context,
            stochastic=self.dropout > 0,
        )


def alibi_slopes(num_heads: int) -> torch.Tensor:
    """ALiBi head slopes m_h (Press et al. 2022, Sec. 3): the geometric sequence 2^(-8/H), 2^(-16/H), ...

    For a head count that is not a power of two, the slopes of the nearest smaller power of two are followed
    by every other slope of the next larger one (the authors' recipe).
    """
    power = 2 ** math.floor(math.log2(num_heads))
    slopes = [2 ** (-8 * (h + 1) / power) for h in range(power)]
    if power < num_heads:
        slopes += [2 ** (-8 * (h + 1) / (2 * power)) for h in range(0, 2 * (num_heads - power), 2)]
    return torch.tensor(slopes)


class AlibiPositionEncoding(PositionEncoding):
    """ALiBi (Press et al. 2022, Sec. 3, Fig. 3): scores_h(i, j) += -m_h |i - j|, no parameters.

    The decoder uses the paper's causal form, -m_h (i - j) for j <= i. The encoder uses the symmetric
    -m_h |i - j|: the paper only tested causal language models, so this bidirectional form is our extension
    (it is the natural one, and the one BLOOM-style encoders use). The bias is the same in every layer, so
    the stack computes it once per forward (`stack_score_mask`).
    """

    title = "ALiBi"
    reference = "Press et al. 2022 §3 (symmetric encoder form: ours)"
    citations = ("Press, Smith, Lewis 2022. Train Short, Test Long: Attention with Linear Biases. ICLR.",)
    score_bias_shared_by_layers = True

    def __init__(self, config, stack):
        super().__init__(config, stack)
        heads, _ = stack_heads_layers(config, stack)
        self.num_heads = heads
        self.register_buffer("slopes", alibi_slopes(heads), persistent=False)  # (H,)

    def reset_parameters(self):
        init.copy_(self.slopes, alibi_slopes(self.num_heads))

    def score_bias(self, layer_idx, context):
        distance = relative_distances(context).abs()  # (B|1, q, k); |i - j| = i - j for the causal keys
        return -self.slopes[:, None, None] * distance[:, None]  # (B|1, H, q, k)
