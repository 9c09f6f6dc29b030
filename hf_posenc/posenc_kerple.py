"""KERPLE (Chi, Fan, Ramadge & Rudnicky, NeurIPS 2022): kernelized relative position biases for extrapolation.

KERPLE adds a conditionally positive definite (CPD) kernel of the distance |m - n| between query m and key n
to the attention scores; the constant that would turn the CPD kernel into a positive definite one cancels in
the softmax. Of the kernels the paper derives, two are practical, each with learned r1, r2 > 0 per head:

* logarithmic (the paper's best, our default):  b_h(m, n) = -r1_h * log(1 + r2_h |m - n|);
* power (`kerple_kernel="power"`):             b_h(m, n) = -r1_h * |m - n|^r2_h, with 0 < r2_h <= 2.

The bias depends on the distance only and, as in the authors' code (one module passed to every layer), is
shared by all layers of a stack, so the stack computes it once per forward (`stack_score_mask`) over the
distinct distances and gathers it to (B|1, H, q, k), as T5's bias does.
"""

import torch
from torch import nn
from transformers import initialization as init

from .base import Hyperparameter, PositionEncoding, lookup_columns
from .posenc_relative import distinct_distances, stack_heads_layers

KERPLE = (
    "Chi, Fan, Ramadge, Rudnicky 2022. KERPLE: Kernelized Relative Positional Embedding for Length "
    "Extrapolation. NeurIPS."
)

# The authors' floor for r1 and r2 (their released code, `ParallelKerpleLog` / `ParallelKerplePower`).
PARAMETER_FLOOR = 1e-2
# |m - n|^p is conditionally positive definite for 0 < p <= 2 only.
MAX_POWER = 2.0
# The authors' initialisation, per kernel: r1 ~ U(0, a), r2 ~ U(0, b) with (a, b) below.
INITIAL_RANGES = {"log": (2.0, 1.0), "power": (1.0, 2.0)}


class KerplePositionEncoding(PositionEncoding):
    """KERPLE-log or KERPLE-power bias, b_h(i, j) = -r1_h log(1 + r2_h |i - j|) or -r1_h |i - j|^r2_h.

    Positivity, as the authors keep it: every use of the bias first projects the stored parameters into
    their range, r1, r2 >= 0.01 (and r2 <= 2 for the power kernel), clamping the parameter values in place
    (`project`), so each optimizer step is projected back before the parameters are used again. Gradients
    flow to the projected values unchanged (projected gradient descent). The authors initialise per head
    r1 ~ U(0, 2), r2 ~ U(0, 1) for the log kernel and r1 ~ U(0, 1), r2 ~ U(0, 2) for the power kernel; we
    do the same and project at once (they project at the first forward, which gives the same values).

    The paper trains causal language models; its kernels are defined on |m - n|, so the encoder uses them as
    they are, symmetric in the two directions, and the decoder's masked future keys get finite values that
    the mask discards. Deviation: we compute log(1 + x) as `log1p` (more accurate for small x).
    """

    title = "KERPLE"
    reference = "Chi et al. 2022, KERPLE-log / KERPLE-power"
    citations = (KERPLE,)
    hyperparameters = {
        "kerple_kernel": Hyperparameter(
            str,
            "log",
            "KERPLE kernel: -r1 log(1 + r2 |i - j|) (the paper's best) or -r1 |i - j|^r2",
            choices=("log", "power"),
        ),
    }
    # With randomized positions decoded at the training draw's expected positions (position_randomization.py
    # Eq. 1), which continue past L - 1 for a target longer than its source: no table bounds KERPLE's.
    variants = {
        "power": {"kerple_kernel": "power"},
        "randomized-spread": {"randomized_positions_max": 64, "randomized_positions_inference": "spread"},
    }
    score_bias_shared_by_layers = True

    def __init__(self, config, stack):
        super().__init__(config, stack)
        heads, _ = stack_heads_layers(config, stack)
        self.kernel = config.kerple_kernel
        self.r1 = nn.Parameter(torch.empty(heads))  # (H,): the bias scale
        self.r2 = nn.Parameter(
            torch.empty(heads)
        )  # (H,): the log kernel's distance scale, the power's exponent
        self.reset_parameters()

    def reset_parameters(self):
        r1_range, r2_range = INITIAL_RANGES[self.kernel]
        init.uniform_(self.r1, 0.0, r1_range)
        init.uniform_(self.r2, 0.0, r2_range)
        self.project()

    def project(self) -> None:
        """Clamp r1, r2 into their allowed range in place, as the authors do before every use (see class)."""
        self.r1.data.clamp_(min=PARAMETER_FLOOR)
        self.r2.data.clamp_(min=PARAMETER_FLOOR, max=MAX_POWER if self.kernel == "power" else None)

    def bias_per_distance(self, distances: torch.Tensor) -> torch.Tensor:
        """b_h(r) for distances r (R,): (H, R), computed in float32 and returned in the parameters' dtype."""
        self.project()
        r1, r2 = self.r1.float()[:, None], self.r2.float()[:, None]  # (H, 1) each
        distance = distances.abs().float()  # (R,)
        if self.kernel == "log":
            bias = -r1 * torch.log1p(r2 * distance)
        else:
            bias = -r1 * distance.pow(r2)
        return bias.to(self.r1.dtype)  # (H, R)

    def score_bias(self, layer_idx, context):
        distances, index = distinct_distances(context)  # (R,), (B|1, q, k)
        return lookup_columns(self.bias_per_distance(distances), index).movedim(0, 1)  # (B|1, H, q, k)
