"""LinearNet (paper 2 Eq. 13) and gLinearNet (with Eq. 4 gating), the `"linear"` and `"glinear"` token
mixers: a learned per-head matrix over (query position, key position)."""

import torch
from torch import nn
from transformers import initialization as init

from .base import PAPER_2, check_max_positions
from .mixer_base import PositionMixer, zero_disallowed


class LinearNet(PositionMixer):
    """LinearNet (Tolstikhin et al. 2021; paper 2 Eq. 13): c_n = Σ_m W_nm W^V x_m with a learned per-head
    L_max × L_max matrix W indexed by (query position, key position); not normalised, causal in the decoder.
    """

    title = "LinearNet"
    reference = "paper 2 Eq. 13"
    citations = (PAPER_2,)
    position_table_fields = ("max_position_embeddings",)

    def __init__(self, config, site, layer_idx):
        super().__init__(config, site, layer_idx)
        self.max_positions = config.max_position_embeddings
        self.mixing = nn.Parameter(torch.empty(self.num_heads, self.max_positions, self.max_positions))
        self.reset_parameters()

    def reset_parameters(self):
        init.xavier_uniform_(self.mixing)

    def mixing_weights(self, attention_mask, context, dtype):
        check_max_positions(context, self.max_positions, type(self).__name__)
        rows = context.query_positions[:, :, None]  # (B|1, q, 1)
        columns = context.key_positions[:, None, :]  # (B|1, 1, k)
        weights = self.mixing[:, rows, columns].transpose(0, 1).to(dtype)  # (B|1, H, q, k)
        return zero_disallowed(weights, attention_mask, context, self.is_causal)


class GLinearNet(LinearNet):
    """gLinearNet (Liu et al. 2021; paper 2 §2.2): LinearNet with the gating of paper 2 Eq. 4."""

    title = "gLinearNet"
    reference = "paper 2 §2.2 + Eq. 4 gating"
    gated = True
