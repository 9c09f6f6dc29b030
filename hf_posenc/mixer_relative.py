"""Relative attention (paper 2 §7.2, Table 6, Fig. 2), the `"relative_attention"` token mixer.

Shaw et al. (2018)'s relative position keys against content queries, without the query-key dot product:

    α̂_nm = (W^Q y_n) · a^K_{clip(m − n, K)}ᵀ / √D_h      (Eq. 9 with the query token y_n in place of ñ)
    α_nm = softmax_m(α̂_nm)                                (Eq. 2, over the keys the mask allows)
    c_n  = Σ_m α_nm · W^V x_m                             (Eq. 3), or gated: Eq. 4

Queries come from the tokens, keys from a clipped relative embedding table a^K, values from the tokens. The
energies hold token–position interactions only (the x-axis of paper 2 Fig. 2: between rPosNet's
position–position and the Transformer's token–token): a key token's content reaches the output through its
value, never through the weights. Offsets beyond ±K share the outer rows of a^K and the softmax runs over the
whole sequence, so this equals a dynamic convolution (Wu et al. 2019) with global context (Chang et al. 2021),
as paper 2 §7.2 puts it.

What the paper leaves implicit, and how it is settled here:

* **No a^V, no W^K.** Paper 2 Table 6 counts 63.6M parameters (66.7M gated) against the Transformer's 66.5M:
  the Transformer minus W^K (12 × (D² + D) = 3.15M) plus one (2K+1) × D table per layer (12 × 33 × 512 =
  0.2M). A value table would add another 0.2M; paper 2's own Shaw baseline has no a^V either (Table 8: K̂D
  parameters, as rPosNet). The reference code (`RelativeMultiHeadAttention` with `only_rel_attention`) agrees.
* **a^K per head.** A (2K+1) × D table read as D_h features per head (rPosNet's Emb_rel, Eq. 10, and the
  parameter count above), not Shaw's single (2K+1) × D_h table shared by the heads.
* **Offsets m − n** (key minus query), Shaw's convention; rPosNet's Eq. 10 writes n − m, which only mirrors the
  rows of the learned table.
* **K** = `relative_attention_max_relative_position`, 16 (paper 2 §5.2 and the reference configuration: 16
  Base, 8 Big).
* **Gated by default** (`relative_attention_gating`): paper 2 §7.2 finds that gating pays off for mixers whose
  weights hold no token–token interactions (+2.6 COMET for relative attention, which gated comes close to
  rPosNet); the Table 6 counterpart without gating is the variant `no-gating`.
* **Self-attention only**: an offset between a target and a source position is undefined without a length
  ratio (rPosNet's γ), and paper 2 uses relative attention in self-attention only.
* **No input position embedding by default** (`recommended_position_encoding = "none"`): the mixer carries
  its own relative positions, like Shaw et al. (2018), and the reference code builds its relative models
  without absolute embeddings (paper 2 footnote 6: the position embeddings differ between the Fig. 2
  approaches). An explicit `position_encoding` still wins.
* **No folding** (`precompute_position_attention` is the no-op of `TokenMixer`): the energies depend on the
  query tokens, so there is no position-only table to fold (paper 2 §4).

Deviations: Marian's post-norm layers instead of the reference's pre-norm; a^K is initialised xavier-normal like
rPosNet's Emb_rel in this library (the reference code: xavier-uniform for every matrix).
"""

import torch
from torch import nn
from transformers import initialization as init

from .base import (
    DECODER_SELF_ATTENTION,
    ENCODER_SELF_ATTENTION,
    PAPER_2,
    Hyperparameter,
    PositionContext,
    PositionPanel,
    additive_mask,
    cosine_similarity_matrix,
)
from .mixer_base import SITE_SHORT_NAMES, ValueMixer
from .posenc_relative import SHAW


class RelativeAttention(ValueMixer):
    """Content queries against clipped relative position keys (paper 2 Table 6 "Rel. Self-Attention").

    Values are projected (and, gated, normalised: Eq. 4) once and cached as content attention caches them;
    each decoding step projects its own query and reads the energies of its offsets to the cached keys.
    """

    title = "relative attention"
    reference = "paper 2 §7.2, Table 6 / Fig. 2 (Shaw et al. 2018 keys, Eq. 2-4)"
    citations = (SHAW, PAPER_2)
    hyperparameters = {
        "relative_attention_max_relative_position": Hyperparameter(
            int,
            16,
            "K of the relative_attention mixer: offsets clipped to ±K (paper 2 §5.2: 16 base, 8 big)",
            minimum=0,
        ),
        "relative_attention_gating": Hyperparameter(
            bool, True, "Eq. 4 gating of the relative_attention mixer (False: Table 6 'without gating')"
        ),
    }
    variants = {"no-gating": {"relative_attention_gating": False}}
    allowed_sites = (ENCODER_SELF_ATTENTION, DECODER_SELF_ATTENTION)
    recommended_position_encoding = "none"

    def __init__(self, config, site, layer_idx):
        self.gated = config.relative_attention_gating
        super().__init__(config, site, layer_idx)
        self.max_relative_position = config.relative_attention_max_relative_position
        self.scaling = self.head_dim**-0.5
        self.q_proj = nn.Linear(self.embed_dim, self.embed_dim)
        # a^K: one row per clipped offset −K..K, D_h features per head
        self.relative_keys = nn.Parameter(torch.empty(2 * self.max_relative_position + 1, self.embed_dim))
        self.reset_parameters()

    def reset_parameters(self):
        init.xavier_normal_(self.relative_keys)

    def offset_index(self, context: PositionContext) -> torch.Tensor:
        """clip(m − n, K) + K for every query n and key m, (B|1, q, k): the row of a^K each pair reads."""
        offsets = context.key_positions[:, None, :] - context.query_positions[:, :, None]
        K = self.max_relative_position
        return offsets.clamp(-K, K) + K

    def energies(self, query: torch.Tensor, context: PositionContext) -> torch.Tensor:
        """α̂ (B, H, q, k): each query against the 2K+1 relative keys, then gathered by the pairs' offsets."""
        heads = (-1, self.num_heads, self.head_dim)
        relative_keys = self.relative_keys.to(query.dtype).view(heads)  # (2K+1, H, Dh)
        per_offset = torch.einsum("bhqd,khd->bhqk", query, relative_keys) * self.scaling  # (B, H, q, 2K+1)
        index = self.offset_index(context)[:, None]  # (B|1, 1, q, k)
        index = index.expand(query.shape[0], self.num_heads, -1, -1)  # (B, H, q, k)
        return per_offset.gather(-1, index)  # (B, H, q, k)

    def mixing_weights_for(self, hidden_states, attention_mask, context, dtype):
        """softmax over the keys the mask allows of the queries' energies (Eq. 2), (B, H, q, k)."""
        query = self.q_proj(hidden_states)
        query = query.view(*hidden_states.shape[:-1], self.num_heads, -1).transpose(1, 2)  # (B, H, q, Dh)
        energies = additive_mask(attention_mask, self.energies(query, context), context, self.is_causal)
        return torch.softmax(energies, dim=-1).to(dtype)  # (B, H, q, k)

    def position_panels(self, positions):
        """Cosine similarity of the relative keys a^K of every pair of clipped offsets −K..K."""
        stack, kind = SITE_SHORT_NAMES[self.site]
        similarity = cosine_similarity_matrix(self.relative_keys)  # (2K+1, 2K+1)
        return [PositionPanel(f"{stack} L{self.layer_idx} {kind}: a^K similarity", "map", similarity)]
