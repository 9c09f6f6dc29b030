"""Absolute position encodings added to the token embeddings: none, sinusoidal (SAPE), learned (LAPE).

These are the baselines of paper 1 (Zhang et al., ACL 2023, Table 1: "no PE", SAPE, LAPE): the stack input
is x_j + p_j (paper 1 Eq. 6), with p_j a fixed sinusoid (Vaswani et al. 2017) or a learned vector.
"""

import math

import torch
from torch import nn
from transformers import initialization as init

from .base import (
    PAPER_1,
    VASWANI,
    PositionEncoding,
    PositionPanel,
    check_max_positions,
    cosine_similarity_matrix,
)


class NoPositionEncoding(PositionEncoding):
    """No positional information at all: self-attention is then permutation-equivariant (paper 1 Eq. 9).

    In the decoder alone, with a positional encoder, this is NoPE for the causal stack (Kazemnejad et al.
    2023): causal attention can still count positions; the length tables compare it.
    """

    title = "no PE"
    reference = "paper 1 Table 1 (w/o PE); permutation equivariance, Eq. 9"
    citations = (PAPER_1,)


def marian_sinusoid_table(num_positions: int, dim: int) -> torch.Tensor:
    """Marian's sinusoid table: sin features in the first half, cos in the second (not interleaved).

    p_{pos, i} = sin(pos / 10000^(2i/d)) for i < ceil(d/2), cos(...) for the rest, the frequencies of the
    cos half taken from the odd feature indices as in `MarianSinusoidalPositionalEmbedding`, so that a
    converted opus-mt checkpoint gives bit-identical embeddings.
    """
    positions = torch.arange(num_positions, dtype=torch.float64)[:, None]  # (N, 1)
    feature = torch.arange(dim, dtype=torch.float64)
    angles = positions / torch.pow(10000.0, 2 * torch.div(feature, 2, rounding_mode="floor") / dim)  # (N, D)
    sin_width = math.ceil(dim / 2)
    table = torch.empty(num_positions, dim, dtype=torch.float64)
    table[:, :sin_width] = torch.sin(angles[:, 0::2])
    table[:, sin_width:] = torch.cos(angles[:, 1::2])
    return table.float()


class SinusoidalPositionEncoding(PositionEncoding):
    """SAPE: x_j + p_j with Marian's fixed sinusoid table (a non-persistent buffer, rebuilt on load)."""

    title = "SAPE (sinusoidal)"
    reference = "Vaswani et al. 2017; paper 1 Eq. 6 (SAPE)"
    citations = (VASWANI, PAPER_1)
    position_table_fields = ("max_position_embeddings",)

    def __init__(self, config, stack):
        super().__init__(config, stack)
        self.max_positions = config.max_position_embeddings
        self.register_buffer(
            "table", marian_sinusoid_table(self.max_positions, config.d_model), persistent=False
        )

    def reset_parameters(self):
        init.copy_(self.table, marian_sinusoid_table(self.max_positions, self.config.d_model))

    def embed(self, inputs_embeds, context, padding_mask, cache):
        check_max_positions(context, self.max_positions, "sinusoidal")
        return inputs_embeds + self.table[context.query_positions].to(inputs_embeds.dtype)  # (B, L, D)


class LearnedPositionEncoding(PositionEncoding):
    """LAPE: x_j + p_j with a learned table p ∈ R^{L_max × d} (Gehring et al. 2017), saved with the model."""

    title = "LAPE (learned)"
    reference = "Gehring et al. 2017; paper 1 Eq. 6 (LAPE)"
    citations = ("Gehring et al. 2017. Convolutional Sequence to Sequence Learning. ICML.", PAPER_1)
    # SHAPE (`shape_max_shift`) and randomized positions (`randomized_positions_max`), training options of the
    # model, with the table they most affect: training positions reach length + K, and L - 1 (L: the tiny table).
    variants = {
        "decoder-none": {"decoder_position_encoding": "none"},
        "shape": {"shape_max_shift": 8},
        "randomized": {"randomized_positions_max": 64},
    }
    position_table_fields = ("max_position_embeddings",)

    def __init__(self, config, stack):
        super().__init__(config, stack)
        self.max_positions = config.max_position_embeddings
        self.weight = nn.Parameter(torch.empty(self.max_positions, config.d_model))
        self.reset_parameters()

    def reset_parameters(self):
        # fairseq's LearnedPositionalEmbedding initialisation, N(0, d^-1/2).
        init.normal_(self.weight, mean=0.0, std=self.config.d_model**-0.5)

    def embed(self, inputs_embeds, context, padding_mask, cache):
        check_max_positions(context, self.max_positions, "learned")
        return inputs_embeds + self.weight[context.query_positions]  # (B, L, D)

    def position_panels(self, positions):
        similarity = cosine_similarity_matrix(self.weight[:positions])
        return [PositionPanel(f"{self.stack}: learned position similarity", "map", similarity)]
