"""Gated position-based attention: the `"aposnet"` and `"rposnet"` token mixers (paper 2).

Paper 2: "Gated Position-based Attention for Neural Machine Translation" (WMT23 as "Bridging the Gap between
Position-Based and Content-Based Self-Attention for NMT"). The mixing weights come from positions only:

* aPosNet (Eq. 8):  α̂_nm = (W^Q ñ)(W^K m̃)ᵀ / √D_h with ñ, m̃ fixed sinusoids of the query/key positions;
* rPosNet (Eq. 9-10): α̂_nm = (W^Q ñ) · d̃_nmᵀ / √D_h, d̃_nm = Emb_rel(clip(⌊γ n⌋ − m, K)), ñ learned;

followed by the softmax (Eq. 2) and the gating of Eq. 4 (`GeluGating`, switchable with `position_attention_gating`).
Because α̂ depends on positions only, `model.precompute_position_attention()` folds it into per-layer tables
(aPosNet: H×N×N, rPosNet: H×N×(2K+1) indexed by the clipped offset) and drops W^Q, W^K and the position
vectors (paper 2 §4.1-4.2, "Theoretical Complexity").

`PositionMixer` (mixer_base.py) is the base of every mixer whose weights ignore the token contents, these two
and the position-only mixers of mixer_fourier.py, mixer_gaussian.py, mixer_linear.py and mixer_lightconv.py.

ñ is shared across layers (paper 2 §4.1): the unfolded rPosNet layers of one stack read one learned table,
held by the stack's first rPosNet layer (`share_within_stack`); decoder self- and cross-attention share the
decoder's table (ñ are target positions in both, as in the reference code). aPosNet's ñ, m̃ are fixed
sinusoids, the same in every layer.

Deviations from the reference code (github apptek/posnet-position_based_attention): there ñ is the stack's
input position embedding itself (layer-normalised, with dropout, for the learned one); here rPosNet's ñ is a
table of its own (L_max × D per stack before folding, nothing after), so the mixer stays independent of
the input position encoding. The reference pre-norm layers are Marian's post-norm layers here.
"""

import torch
from torch import nn
from transformers import initialization as init

from .base import (
    CROSS_ATTENTION,
    PAPER_2,
    DerivedTables,
    Hyperparameter,
    PositionContext,
    additive_mask,
    check_max_positions,
    full_precision,
)
from .mixer_base import PositionMixer
from .posenc_absolute import marian_sinusoid_table

CAUSAL_WEIGHTS = "causal_weights"
POSITION_KEYS = "position_keys"


class PositionAttention(DerivedTables, PositionMixer):
    """Softmax over position-only energies (paper 2 §4); energies computed, or read from a folded table.

    A folded layer (`config.position_attention_precomputed`) holds `energies`, a per-head table indexed by
    query position (and by key position or clipped offset), instead of W^Q, W^K and the position vectors.
    """

    citations = (PAPER_2,)
    hyperparameters = {
        "position_attention_gating": Hyperparameter(
            bool, True, "Eq. 4 gating (False: Table 6 'without gating')"
        ),
        "position_attention_precomputed": Hyperparameter(
            bool,
            False,
            "energies folded into per-layer tables (set by model.precompute_position_attention())",
        ),
    }
    position_table_fields = ("max_position_embeddings",)

    def __init__(self, config, site, layer_idx):
        self.gated = config.position_attention_gating
        super().__init__(config, site, layer_idx)
        self.keep_derived_tables()  # tables for decoding without gradients (`DerivedTables`)
        self.scaling = self.head_dim**-0.5
        self.max_positions = config.max_position_embeddings
        self.precomputed = config.position_attention_precomputed
        if self.precomputed:
            self.energies = nn.Parameter(torch.empty(self.energy_table_shape()))
        else:
            self.q_proj = nn.Linear(self.embed_dim, self.embed_dim)
        self.reset_parameters()

    def energy_table_shape(self) -> tuple[int, ...]:
        raise NotImplementedError

    def computed_energies(self, context: PositionContext) -> torch.Tensor:
        """Energies from the position vectors, (B|1, H, q, k) or per offset (B|1, H, q, 2K+1)."""
        raise NotImplementedError

    def table_energies(self, context: PositionContext) -> torch.Tensor:
        """The same, read from the folded table."""
        raise NotImplementedError

    def all_positions_context(self, length: int | None = None) -> PositionContext:
        """Queries and keys at positions 0..length-1 (default: every position of the table)."""
        length = length or self.max_positions
        positions = torch.arange(length, device=self.out_proj.weight.device)[None]
        return PositionContext(None, positions, positions, (0, length - 1), (0, length - 1))  # (1, N)

    def query_position_vectors(self) -> torch.Tensor:
        """ñ for every position, (N, D)."""
        raise NotImplementedError

    def projected_queries(self, positions: torch.Tensor) -> torch.Tensor:
        """W^Q ñ at `positions` (B|1, q) -> (B|1, H, q, Dh)."""
        queries = self.q_proj(self.query_position_vectors()[positions].to(self.q_proj.weight.dtype))
        return queries.view(*positions.shape, self.num_heads, -1).transpose(1, 2)

    def energies_for(self, context: PositionContext) -> torch.Tensor:
        check_max_positions(context, self.max_positions, type(self).__name__)
        return self.table_energies(context) if self.precomputed else self.computed_energies(context)

    def position_weights(self, context):
        return self.energies_for(context)  # the energies α̂ before the softmax

    def mixing_weights(self, attention_mask, context, dtype):
        if self.reads_causal_weight_table(attention_mask):
            check_max_positions(context, self.max_positions, type(self).__name__)
            rows = context.query_positions[:, :, None]  # (1, q, 1)
            columns = context.key_positions[:, None, :]  # (1, 1, k)
            table = self.causal_weight_table(context.query_span[1] + 1)  # (H, n, n)
            return table[:, rows, columns].transpose(0, 1).to(dtype)
        if torch.is_grad_enabled():  # the energies may be stepped after this: forget what came from them
            self.forget(CAUSAL_WEIGHTS)
        energies = self.energies_for(context).to(dtype)  # (B|1, H, q, k)
        return torch.softmax(additive_mask(attention_mask, energies, context, self.is_causal), dim=-1)

    def reads_causal_weight_table(self, attention_mask) -> bool:
        """Folded decoder self-attention without padding and without gradients to the energies: the softmax
        weights of query n over keys 0..n depend on n alone, so each decoding step reads its row."""
        return (
            self.precomputed
            and self.is_causal
            and attention_mask is None
            and not (torch.is_grad_enabled() and self.energies.requires_grad)
        )

    @torch.no_grad()
    def causal_weight_table(self, needed_rows: int) -> torch.Tensor:
        """softmax over keys m ≤ n of the folded energies, (H, L, L) with zeros above the diagonal.

        Built for the first L positions (L a power of two ≥ `needed_rows`, at most N): row n of a causal
        softmax does not depend on the later columns, so a longer table only extends it. Rebuilt whenever the
        energies change (`derived_table`).
        """

        def build():
            length = min(self.max_positions, max(64, 1 << (needed_rows - 1).bit_length()))
            context = self.all_positions_context(length)
            energies = self.energies_for(context)  # (1, H, L, L)
            return torch.softmax(additive_mask(None, energies, context, is_causal=True), dim=-1)[0]

        return self.derived_table(
            CAUSAL_WEIGHTS, [self.energies], build, fits=lambda table: table.shape[-1] >= needed_rows
        )

    @torch.no_grad()
    def precompute_position_attention(self) -> None:
        """Fold the energies of every position pair into `energies`; drop what produced them (paper 2 §4)."""
        if self.precomputed:
            return
        table = self.computed_energies(self.all_positions_context())[0]  # (H, N, ·)
        for name in self.folded_away:
            delattr(self, name)
        self.energies = nn.Parameter(table.contiguous())
        self.precomputed = True


class APosNetAttention(PositionAttention):
    """aPosNet (paper 2 Eq. 8 + Eq. 4): α̂_nm = (W^Q ñ)(W^K m̃)ᵀ/√D_h with fixed sinusoid position vectors.

    Recommended input embedding: `position_encoding="sinusoidal"` (paper 2 §5.2).
    """

    title = "aPosNet"
    reference = "paper 2 Eq. 8 + Eq. 4 gating, folding §4"
    variants = {
        "precomputed-ungated-cross": {
            "cross_attention": "aposnet",
            "position_attention_precomputed": True,
            "position_attention_gating": False,
        }
    }

    folded_away = ("q_proj", "k_proj", "position_vectors")

    def __init__(self, config, site, layer_idx):
        super().__init__(config, site, layer_idx)
        if not self.precomputed:
            self.k_proj = nn.Linear(self.embed_dim, self.embed_dim)
            self.register_buffer(
                "position_vectors",
                marian_sinusoid_table(self.max_positions, self.embed_dim),
                persistent=False,
            )

    def reset_parameters(self):
        if self.precomputed:
            init.zeros_(self.energies)
        elif hasattr(self, "position_vectors"):
            init.copy_(self.position_vectors, marian_sinusoid_table(self.max_positions, self.embed_dim))

    def query_position_vectors(self):
        return self.position_vectors

    def energy_table_shape(self):
        return (self.num_heads, self.max_positions, self.max_positions)

    def computed_energies(self, context):
        queries = self.projected_queries(context.query_positions)  # (B|1, H, q, Dh)
        sources = (self.k_proj.weight, self.k_proj.bias, self.position_vectors)
        if not (torch.is_grad_enabled() and any(w.requires_grad for w in sources)):
            return self.energies_against_kept_keys(queries, context, sources)
        self.forget(POSITION_KEYS)  # W^K may be stepped after this
        vectors = self.position_vectors[context.key_positions].to(self.k_proj.weight.dtype)  # (B|1, k, D)
        keys = self.k_proj(vectors).to(queries.dtype)  # (B|1, k, D)
        keys = keys.view(*context.key_positions.shape, self.num_heads, -1).transpose(1, 2)  # (B|1, H, k, Dh)
        return torch.matmul(queries, keys.transpose(2, 3)) * self.scaling  # (B|1, H, q, k)

    def energies_against_kept_keys(self, queries, context, sources) -> torch.Tensor:
        """q_n · W^K m̃ / √D_h of queries (B|1, H, q, Dh) against the keys of `context`, without gradients:
        (B|1, H, q, k).

        Keys depend on positions only, so the keys of all N positions are projected once and kept (until W^K
        changes, `DerivedTables`) as per-head columns in the queries' dtype. A step multiplies its queries with
        the columns of positions 0..L-1 (a view; L the power of two that covers the key positions, at most N)
        and reads each key's energy from the product: no key is gathered, cast or copied, so a decoding step
        grows with its prefix only as content attention's read of its key cache does. (Gathering the prefix's
        keys from the table at every step took a layer's mixing weights from 0.12 ms at 10 keys to 0.34 ms at
        400, one CPU thread in bf16; this way 0.14 to 0.16 ms.)"""
        heads, head_dim = self.num_heads, self.head_dim

        def build():
            with torch.no_grad(), full_precision(self.k_proj.weight.device):
                keys = self.k_proj(self.position_vectors.to(self.k_proj.weight.dtype))  # (N, D)
            columns = keys.view(-1, heads, head_dim).permute(1, 2, 0)  # (H, Dh, N)
            return columns.to(queries.dtype).contiguous()

        columns = self.derived_table(POSITION_KEYS, sources, build, fits=lambda t: t.dtype == queries.dtype)
        covered = min(self.max_positions, 1 << context.key_span[1].bit_length())
        batch, _, length, _ = queries.shape
        rows = queries.transpose(0, 1).reshape(heads, batch * length, head_dim)  # (H, B|1 * q, Dh)
        energies = torch.matmul(rows, columns[:, :, :covered]) * self.scaling  # (H, B|1 * q, L)
        energies = energies.view(heads, batch, length, covered).transpose(0, 1)  # (B|1, H, q, L)
        positions = context.key_positions  # (B|1, k)
        batch = max(batch, positions.shape[0])
        index = positions[:, None, None, :].expand(batch, heads, length, -1)  # (B, H, q, k)
        return energies.expand(batch, -1, -1, -1).gather(-1, index)  # (B|1, H, q, k)

    def table_energies(self, context):
        rows = context.query_positions[:, :, None]  # (B|1, q, 1)
        columns = context.key_positions[:, None, :]  # (B|1, 1, k)
        return self.energies[:, rows, columns].transpose(0, 1)  # (B|1, H, q, k)


class RPosNetAttention(PositionAttention):
    """rPosNet (paper 2 Eq. 9-10 + Eq. 4): α̂_nm = (W^Q ñ)·d̃_nmᵀ/√D_h, d̃_nm = Emb_rel(clip(⌊γn⌋ − m, K)).

    ñ are learned absolute position vectors, Emb_rel has 2K+1 rows of D features (D_h per head). γ = 1 in
    self-attention and `config.rposnet_length_ratio` in cross-attention. Offsets beyond ±K share the outer
    energies, so every key is reachable (global context). Recommended input embedding:
    `position_encoding="learned"` (paper 2 §5.2).

    ñ is shared across layers (paper 2 §4.1): `table_sharers` lists the unfolded rPosNet mixers of the stack,
    and the first of them holds `position_vectors` for all (a plain list, not submodules, so the table is
    registered, saved and initialised once).
    """

    title = "rPosNet"
    reference = "paper 2 Eq. 9-10 + Eq. 4 gating, folding §4"
    hyperparameters = {
        "rposnet_max_relative_position": Hyperparameter(
            int, 16, "K of Eq. 10 (paper 2 §5.2: 16 base, 8 big)", minimum=0
        ),
        "rposnet_length_ratio": Hyperparameter(
            float, 1.0, "γ of Eq. 10 in cross-attention: mean source/target length ratio", minimum=1e-6
        ),
    }
    variants = {
        "everywhere-precomputed": {
            "cross_attention": "rposnet",
            "rposnet_length_ratio": 1.3,
            "position_attention_precomputed": True,
        }
    }
    folded_away = ("q_proj", "relative_embeddings")
    #: Paper 2 §5.2: rPosNet models take learned absolute input embeddings; the config picks this for a stack
    #: whose self-attention is rPosNet unless its position encoding is set explicitly.
    recommended_position_encoding = "learned"

    def __init__(self, config, site, layer_idx):
        self.max_relative_position = config.rposnet_max_relative_position
        self.length_ratio = config.rposnet_length_ratio if site == CROSS_ATTENTION else 1.0
        super().__init__(config, site, layer_idx)
        self.table_sharers = [self]
        if not self.precomputed:
            self.position_vectors = nn.Parameter(torch.empty(self.max_positions, self.embed_dim))
            self.relative_embeddings = nn.Parameter(
                torch.empty(2 * self.max_relative_position + 1, self.embed_dim)
            )
            self.reset_parameters()

    def share_within_stack(self, stack_mixers):
        """Every unfolded rPosNet mixer of the stack reads the ñ table of the first one; the others drop theirs."""
        if self.precomputed:
            return
        self.table_sharers = [
            m for m in stack_mixers if isinstance(m, RPosNetAttention) and not m.precomputed
        ]
        if self.table_sharers[0] is not self:
            del self.position_vectors

    def query_position_vectors(self):
        return self.table_sharers[0].position_vectors  # (N, D), shared by the stack

    def reset_parameters(self):
        if self.precomputed:
            init.zeros_(self.energies)
        elif hasattr(self, "relative_embeddings"):
            init.xavier_normal_(self.relative_embeddings)
            if hasattr(self, "position_vectors"):  # the stack's table holder
                init.normal_(self.position_vectors, mean=0.0, std=self.embed_dim**-0.5)

    def energy_table_shape(self):
        return (self.num_heads, self.max_positions, 2 * self.max_relative_position + 1)

    def computed_energies(self, context):
        queries = self.projected_queries(context.query_positions)  # (B|1, H, q, Dh)
        relative = self.relative_embeddings.view(-1, self.num_heads, self.head_dim)  # (2K+1, H, Dh)
        return torch.einsum("bhqd,khd->bhqk", queries, relative.to(queries.dtype)) * self.scaling

    def table_energies(self, context):
        return self.energies[:, context.query_positions].transpose(0, 1)  # (B|1, H, q, 2K+1)

    @torch.no_grad()
    def precompute_position_attention(self):
        """Fold this layer; the shared ñ table goes once no rPosNet layer of the stack still reads it."""
        super().precompute_position_attention()
        holder = self.table_sharers[0]
        if hasattr(holder, "position_vectors") and all(m.precomputed for m in self.table_sharers):
            del holder.position_vectors

    def offset_index(self, context: PositionContext) -> torch.Tensor:
        """clip(⌊γ n⌋ − m, K) + K for every query/key pair, (B|1, q, k)."""
        scaled_queries = torch.floor(context.query_positions * self.length_ratio).long()  # (B|1, q)
        offsets = scaled_queries[:, :, None] - context.key_positions[:, None, :]
        K = self.max_relative_position
        return offsets.clamp(-K, K) + K

    def energies_for(self, context):
        per_offset = super().energies_for(context)  # (B|1, H, q, 2K+1)
        index = self.offset_index(context)[:, None]  # (B|1, 1, q, k)
        batch = max(per_offset.shape[0], index.shape[0])
        index = index.expand(batch, self.num_heads, -1, -1)
        return per_offset.expand(batch, -1, -1, -1).gather(-1, index)  # (B, H, q, k)
