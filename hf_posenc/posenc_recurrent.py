"""Recurrent positional embeddings: RPEHead and MPRHead (Chen, Wang, Utiyama, Sumita, EMNLP-IJCNLP 2019).

Instead of adding a fixed sinusoid to the whole embedding (Eq. 1-2), each scaled token embedding x_j is split
into x^p_j (d_p features) and x^r_j (d_r features), d_model = d_p + d_r (Sec. 3):

* P: p_j = x^p_j + pe_j, a sinusoid of dimension d_p (Eq. 1-2 at the reduced width);
* R: r_j = tanh(f_RNN(x^r_j, r_{j-1}) W_r + b_r) (Eq. 6), a bidirectional RNN in the encoder and a forward
  RNN in the decoder.

The two layouts differ in how P and R fill the heads of the first self-attention layer:

* RPEHead (Eq. 7-8): T = [P : R], so the RPEs occupy their own d_r / d_h heads;
* MPRHead (Eq. 9-11): every head h reads [p^h : r^h], m_j = [p^1 : r^1 : ... : p^H : r^H].

With full projections (Eq. 4) the two are the same model up to a permutation of the residual-stream features
(exactly so but for the tied output embedding). `rpe_head_projection="per_head"` (the default) makes the
first self-attention layer's Q/K/V projections block-diagonal over heads, the reading under which "independent
RPE heads" and "RPE part of each head" are different models; see docs/recurrent.md.

**What the RNN recurs on** (`rpe_recurrence`). Eq. 6 gives f_RNN the previous *projected* state r_{j-1}:

* "projected" (the default, Eq. 6 as written): h_j = f_RNN(x^r_j, r_{j-1}), r_j = tanh(W_r h_j + b_r). W_r,
  b_r and tanh sit inside the recurrence, so the loop runs here step by step (the input projections of all
  steps are computed before it, in one matrix product per direction, as cuDNN-style RNNs do). Per cell, r_{j-1}
  takes the place of the state the cell reads back: the hidden state of the tanh RNN and of the GRU (also in
  the GRU's interpolation h_j = (1 - z) n + z r_{j-1}); the LSTM's hidden state, while its memory cell c_j
  recurs on itself; the SRU's state c_{j-1}, its only recurrent input (see `SimpleRecurrentUnit`).
* "hidden": h_j = f_RNN(x^r_j, h_{j-1}), r_j = tanh(W_r h_j + b_r): the RNN recurs on its own hidden state and
  W_r, b_r, tanh are a per-position output layer, so PyTorch's fused nn.RNN/GRU/LSTM run the whole sequence.
  **Every model trained before `rpe_recurrence` existed computes this form**, parameter for parameter; its
  config.json has no `rpe_recurrence` and loads as "projected" unless told otherwise: pass
  `rpe_recurrence="hidden"` to `from_pretrained` to keep its meaning (with an RPE encoder the "projected" form
  would also refuse its W_r, which has another shape, see below; an RPE decoder alone loads without complaint
  and computes another function).

In the encoder the two directions recur separately, each on its own projected state: the forward direction
reads r^fwd_{j-1}, the backward one r^bwd_{j+1}. A W_r that mixed the directions would make each direction's
state depend on the other's future, so under "projected" W_r is block-diagonal, one (d_r/2, d_r/2) block per
direction (`rpe_projection`, `rpe_projection_reverse`), and r_j = [r^fwd_j : r^bwd_j]. Under "hidden" W_r is
the full (d_r, d_r) matrix over the concatenated hidden states, as before. In the decoder W_r is (d_r, d_r) in
both forms.

Deviations from the paper: the sinusoid is Marian's (sin half, cos half; not interleaved as in Eq. 1), so that
the baseline and the P part share one table; the paper does not say which features form x^r: we take the last
d_r; nor what r_0 is: zeros. In the decoder the recurrent state is part of the generation cache
(`PosEncCache.extra_state`, the state after every token, so that assisted decoding can crop the cache back to
the accepted tokens), so incremental decoding, beam search and assisted decoding give the full-forward states.
"""

import math

import torch
from torch import nn
from torch.nn import functional as F
from torch.nn.utils.rnn import pack_padded_sequence, pad_packed_sequence
from transformers import initialization as init

from .base import ENCODER, PAPER_3, Hyperparameter, PosEncCache, PositionEncoding, check_max_positions
from .posenc_absolute import marian_sinusoid_table

LEI_2018 = (
    "Lei, Zhang, Wang, Dai, Artzi 2018. Simple Recurrent Units for Highly Parallelizable Recurrence. EMNLP."
)
TORCH_CELLS = {"rnn": nn.RNN, "gru": nn.GRU, "lstm": nn.LSTM}
CELLS = (*TORCH_CELLS, "sru")
RECURRENCES = ("projected", "hidden")
HEAD_PROJECTIONS = ("full", "per_head")
#: Parameter-name suffixes of the forward and backward direction (PyTorch's RNN naming).
DIRECTION_SUFFIXES = ("_l0", "_l0_reverse")
#: The model width at which the paper tuned d_r (Sec. 4.2, Fig. 2).
PAPER_D_MODEL = 512


def attention_heads(config, stack: str) -> int:
    return config.encoder_attention_heads if stack == ENCODER else config.decoder_attention_heads


class SimpleRecurrentUnit(nn.Module):
    """The weights of one SRU layer (Lei et al. 2018, Eq. 1-4), per direction, named like PyTorch's RNNs.

        f_t = sigmoid(W_f x_t + v_f * c_{t-1} + b_f)          (1)  forget gate
        c_t = f_t * c_{t-1} + (1 - f_t) * (W x_t)             (2)  element-wise recurrence on the state
        r_t = sigmoid(W_r x_t + v_r * c_{t-1} + b_r)          (3)  reset gate
        h_t = r_t * c_t + (1 - r_t) * x_t                     (4)  highway connection

    `weight_ih_l0` = [W; W_f; W_r] (3h, in), `weight_c_l0` = [v_f; v_r] (2h), `bias_l0` = [b_f; b_r] (2h), and
    the same with `_l0_reverse` for the backward direction; `SRURecurrence` runs them. The highway of Eq. 4
    needs x_t at the hidden width: the decoder's forward SRU has input width = hidden width; each encoder
    direction has half the input's width and its highway reads its own half of x_t (the forward direction the
    first d_r / 2 features, the backward one the rest), as the authors' code does for a bidirectional layer.

    With Eq. 6's literal recurrence (`rpe_recurrence="projected"`) c_{t-1} is replaced by r_{t-1} of Eq. 6 in
    Eq. 1-3: the SRU's only recurrent input is its state c, so that is where the previous RPE enters; c_t then
    lives for one step (it feeds h_t and is not carried). This puts W_r (a full matrix) inside the recurrence,
    so the step is no longer element-wise: the parallelism SRU was designed for survives only under
    `rpe_recurrence="hidden"`, where c recurs on itself and W_r, tanh follow the loop.

    Deviation: the weights get the same U(-1/sqrt(h), 1/sqrt(h)) initialisation as the other cells, not the
    paper's recipe for deep SRU stacks (weight variance 1/d and a scaling correction on the highway term),
    which targets many stacked layers; here one SRU layer is followed by W_r and tanh.
    """

    def __init__(self, input_size: int, hidden_size: int, bidirectional: bool):
        super().__init__()
        directions = 2 if bidirectional else 1
        if input_size != directions * hidden_size:
            raise ValueError(
                f"SRU highway needs input_size={input_size} == {directions} x hidden_size={hidden_size}."
            )
        self.hidden_size = hidden_size
        for suffix in DIRECTION_SUFFIXES[:directions]:
            self.register_parameter(
                f"weight_ih{suffix}", nn.Parameter(torch.empty(3 * hidden_size, input_size))
            )
            self.register_parameter(f"weight_c{suffix}", nn.Parameter(torch.empty(2 * hidden_size)))
            self.register_parameter(f"bias{suffix}", nn.Parameter(torch.empty(2 * hidden_size)))


class Recurrence:
    """One cell's step for D directions at once, its weights stacked per direction (built once per forward).

    `input_gates` is everything that does not depend on the previous state, for all steps in one matrix product
    per direction; `step` is the rest. The state that Eq. 6 replaces by r_{j-1} is `state`; `memory` is what a
    cell carries besides it (the LSTM's memory cell), None otherwise.
    """

    has_memory = False

    def __init__(self, weights: nn.Module, directions: int):
        self.weights = weights
        self.suffixes = DIRECTION_SUFFIXES[:directions]

    def stacked(self, name: str) -> torch.Tensor:
        """The forward (and backward) direction's `name` parameter, (D, ...)."""
        return torch.stack([getattr(self.weights, name + suffix) for suffix in self.suffixes])

    def input_gates(self, inputs: torch.Tensor) -> torch.Tensor:
        """(B, L, in) -> (D, B, L, G*h), the input part of every gate at every step."""
        raise NotImplementedError

    def step(self, gates: torch.Tensor, state: torch.Tensor, memory):
        """gates (D, B, G*h), previous state (D, B, h) -> output h_t, the next state (hidden form), memory."""
        raise NotImplementedError


class TorchCellRecurrence(Recurrence):
    """Steps of an nn.RNN/GRU/LSTM's weights (PyTorch's gate order and equations)."""

    #: Whether b_hh joins the input gates: it is added to every gate's input, but for the GRU's candidate
    #: the reset gate scales it.
    folds_recurrent_bias = True

    def __init__(self, weights, directions):
        super().__init__(weights, directions)
        self.recurrent_weight = self.stacked("weight_hh").transpose(1, 2)  # (D, h, G*h)

    def input_gates(self, inputs):
        gates = []
        for suffix in self.suffixes:
            bias = getattr(self.weights, "bias_ih" + suffix)
            if self.folds_recurrent_bias:
                bias = bias + getattr(self.weights, "bias_hh" + suffix)
            gates.append(F.linear(inputs, getattr(self.weights, "weight_ih" + suffix), bias))
        return torch.stack(gates)  # (D, B, L, G*h)


class ElmanRecurrence(TorchCellRecurrence):
    """h_j = tanh(W_ih x_j + b_ih + W_hh s + b_hh), s the previous state."""

    def step(self, gates, state, memory):
        hidden = torch.tanh(torch.baddbmm(gates, state, self.recurrent_weight))  # (D, B, h)
        return hidden, hidden, memory


class GRURecurrence(TorchCellRecurrence):
    """Gates (reset, update, candidate) as nn.GRU; h_j = (1 - z) n + z s, s the previous state."""

    folds_recurrent_bias = False

    def __init__(self, weights, directions):
        super().__init__(weights, directions)
        self.recurrent_bias = self.stacked("bias_hh")[:, None]  # (D, 1, 3h)

    def step(self, gates, state, memory):
        size = state.shape[-1]
        recurrent = torch.baddbmm(self.recurrent_bias, state, self.recurrent_weight)  # (D, B, 3h)
        reset, update = torch.sigmoid(gates[..., : 2 * size] + recurrent[..., : 2 * size]).chunk(2, dim=-1)
        candidate = torch.tanh(torch.addcmul(gates[..., 2 * size :], reset, recurrent[..., 2 * size :]))
        hidden = torch.lerp(candidate, state, update)  # (1 - z) n + z h_{j-1}
        return hidden, hidden, memory


class LSTMRecurrence(TorchCellRecurrence):
    """Gates (input, forget, cell, output) as nn.LSTM; the memory cell c recurs on itself in both forms."""

    has_memory = True

    def step(self, gates, state, memory):
        gates = torch.baddbmm(gates, state, self.recurrent_weight)  # (D, B, 4h)
        in_gate, forget_gate, _, out_gate = torch.sigmoid(gates).chunk(4, dim=-1)
        cell_input = torch.tanh(gates[..., 2 * state.shape[-1] : 3 * state.shape[-1]])
        memory = torch.addcmul(forget_gate * memory, in_gate, cell_input)  # c_j = f c_{j-1} + i g
        hidden = out_gate * torch.tanh(memory)  # (D, B, h)
        return hidden, hidden, memory


class SRURecurrence(Recurrence):
    """Steps of a `SimpleRecurrentUnit` (Lei et al. 2018 Eq. 1-4); the state is c (or r_{j-1} under Eq. 6)."""

    def __init__(self, weights, directions):
        super().__init__(weights, directions)
        self.state_weight = self.stacked("weight_c").unflatten(-1, (2, -1))[:, None]  # (D, 1, 2, h): v_f, v_r

    def input_gates(self, inputs):
        hidden_size = self.weights.hidden_size
        highway = inputs.unflatten(-1, (len(self.suffixes), hidden_size)).movedim(2, 0)  # (D, B, L, h)
        gates = []
        for direction, suffix in enumerate(self.suffixes):
            bias = getattr(self.weights, "bias" + suffix)  # no bias on W x_t (Eq. 2)
            projected = F.linear(
                inputs, getattr(self.weights, "weight_ih" + suffix), F.pad(bias, (hidden_size, 0))
            )
            gates.append(torch.cat([projected, highway[direction]], dim=-1))
        return torch.stack(gates)  # (D, B, L, 4h): W x_t, W_f x_t + b_f, W_r x_t + b_r, x_t

    def step(self, gates, state, memory):
        candidate, gate_inputs, highway = gates.unflatten(-1, (4, -1)).split([1, 2, 1], dim=2)  # (D, B, k, h)
        forget, reset = torch.sigmoid(  # Eq. 1, 3
            torch.addcmul(gate_inputs, self.state_weight, state[:, :, None])
        ).unbind(2)
        cell = torch.lerp(candidate[:, :, 0], state, forget)  # Eq. 2: f c_{t-1} + (1 - f) W x_t
        hidden = torch.lerp(highway[:, :, 0], cell, reset)  # Eq. 4: r c_t + (1 - r) x_t
        return hidden, cell, memory


RECURRENCE_OF_CELL = {
    "rnn": ElmanRecurrence,
    "gru": GRURecurrence,
    "lstm": LSTMRecurrence,
    "sru": SRURecurrence,
}


def recur(cell: Recurrence, gates: torch.Tensor, state, memory, projection=None, every_state: bool = False):
    """Run `cell` over gates (L, D, B, G*h) from (state, memory), (D, B, h) each; returns outputs (L, D, B, h)
    and the final (state, memory), or with `every_state` the (state, memory) after each step, (L, D, B, h) each
    (memory None for cells without one).

    With `projection` = (W_r^T (D, h, h), b_r (D, 1, h)) every step's output becomes r_j = tanh(W_r h_j + b_r),
    which is both the step's output and the next step's state (Eq. 6); without it the cell recurs on its own
    state and outputs h_j.

    The loop runs in the cell's parameter dtype with autocast off: under bf16 autocast the input gates come in
    bf16, and a state that accumulates over steps is kept in full precision (the per-step products are small,
    so this costs little).
    """
    dtype = next(cell.weights.parameters()).dtype
    with torch.autocast(gates.device.type, enabled=False):
        gates, state = gates.to(dtype), state.to(dtype)
        memory = None if memory is None else memory.to(dtype)
        outputs, states, memories = [], [], []
        for step_gates in gates:  # (D, B, G*h)
            hidden, state, memory = cell.step(step_gates, state, memory)
            if projection is not None:
                state = hidden = torch.tanh(torch.baddbmm(projection[1], hidden, projection[0]))  # (D, B, h)
            outputs.append(hidden)
            if every_state:
                states.append(state)
                memories.append(memory)
    if every_state:
        return torch.stack(outputs), torch.stack(states), None if memory is None else torch.stack(memories)
    return torch.stack(outputs), state, memory


def tokens_first(padding_mask: torch.Tensor) -> torch.Tensor:
    """(B, L) order that moves each row's real tokens to the front, keeping their order (a no-op for right
    padding)."""
    return torch.argsort((padding_mask == 0).int(), dim=1, stable=True)


def bidirectional_states(
    rnn: nn.RNNBase, inputs: torch.Tensor, padding_mask: torch.Tensor | None
) -> torch.Tensor:
    """Bidirectional nn.RNN/GRU/LSTM outputs (B, L, d_r) in which padding never reaches a real token's state.

    Each row's tokens are moved to the front, packed with their lengths so the backward direction starts at each
    row's own last token, and the outputs are put back in place; padded positions get zero states.
    """
    if padding_mask is None:
        return rnn(inputs)[0]
    order = tokens_first(padding_mask)[..., None]  # (B, L, 1)
    lengths = padding_mask.ne(0).sum(-1).cpu().clamp(min=1)  # an all-padding row keeps one (ignored) step
    packed = pack_padded_sequence(
        inputs.gather(1, order.expand_as(inputs)), lengths, batch_first=True, enforce_sorted=False
    )
    outputs, _ = pad_packed_sequence(rnn(packed)[0], batch_first=True, total_length=inputs.shape[1])
    return torch.empty_like(outputs).scatter_(1, order.expand_as(outputs), outputs)  # (B, L, d_r)


def bidirectional_recurrence(
    cell: Recurrence, inputs: torch.Tensor, padding_mask: torch.Tensor | None, projection=None
) -> torch.Tensor:
    """Both directions of `cell` over inputs (B, L, d_r) in one loop: (B, L, d_r) = [forward : backward].

    Each row's real tokens are moved to the front; the backward direction reads them reversed within the row, so
    it starts at the row's own last token and, like the forward one, meets padding only after every real token.
    Padded positions get zero states.
    """
    batch, length, _ = inputs.shape
    steps = torch.arange(length, device=inputs.device)  # (L,)
    if padding_mask is None:
        lengths = torch.full((batch,), length, device=inputs.device)
    else:
        order = tokens_first(padding_mask)[..., None]  # (B, L, 1)
        inputs = inputs.gather(1, order.expand_as(inputs))
        lengths = padding_mask.ne(0).sum(-1)  # (B,)
    real = steps < lengths[:, None]  # (B, L)
    reverse = torch.where(real, lengths[:, None] - 1 - steps, steps)[..., None]  # (B, L, 1), its own inverse
    forward_gates, backward_gates = cell.input_gates(inputs)  # (B, L, G*h) each
    backward_gates = backward_gates.gather(1, reverse.expand_as(backward_gates))
    gates = torch.stack([forward_gates, backward_gates]).permute(2, 0, 1, 3)  # (L, 2, B, G*h)
    longest = (
        length if padding_mask is None else int(lengths.max().clamp(min=1))
    )  # no step past the last token
    state = gates.new_zeros(2, batch, cell.weights.hidden_size)  # r_0 (or h_0, c_0) = 0
    outputs = recur(
        cell, gates[:longest], state, torch.zeros_like(state) if cell.has_memory else None, projection
    )[0]
    outputs = F.pad(outputs, (0, 0, 0, 0, 0, 0, 0, length - longest)).permute(1, 2, 0, 3)  # (2, B, L, h)
    backward = outputs[1].gather(1, reverse.expand_as(outputs[1]))
    states = torch.cat([outputs[0], backward], dim=-1) * real[..., None]  # (B, L, d_r), padding zeroed
    if padding_mask is None:
        return states
    return torch.empty_like(states).scatter_(1, order.expand_as(states), states)


class RecurrentPositionEncoding(PositionEncoding):
    """P = x^p + PE (Eq. 1-2), R from Eq. 6 (`rpe_recurrence`, `rpe_cell`), assembled by the subclass's layout.

    `config.rpe_dim` = d_r; None takes the paper's best d_r for the layout (`paper_rpe_dim` at d_model 512)
    scaled to d_model and rounded down to a multiple of `rpe_dim_granule` (and to an even number in the
    encoder, whose two directions each get d_r / 2), so tiny test models get a proportionate RNN.
    """

    #: Registry name, for error messages.
    name: str
    #: The paper's best d_r for this layout in the base model (Sec. 4.2, Fig. 2).
    paper_rpe_dim: int
    position_table_fields = ("max_position_embeddings",)  # P's sinusoid table
    # The RNN counts tokens itself and the decoder resumes it at the first query position: positions that
    # restart at each sentence would only change P's sinusoid and break the resumption.
    supports_sentence_positions = False

    citations = (PAPER_3, LEI_2018)
    hyperparameters = {
        "rpe_cell": Hyperparameter(
            str,
            "rnn",
            "f_RNN of Eq. 6 (tanh RNN: the paper's, < 2% extra parameters; the paper names GRU and SRU beside it)",
            choices=CELLS,
        ),
        "rpe_recurrence": Hyperparameter(
            str,
            "projected",
            "projected: f_RNN recurs on r_{j-1}, Eq. 6 as written; hidden: on its own hidden state, W_r and tanh "
            "after the loop (faster; what models trained before this option computed)",
            choices=RECURRENCES,
        ),
        "rpe_dim": Hyperparameter(
            int | None,
            None,
            "d_r, the features given to the RNN; None: the paper's best for the layout, scaled to d_model",
        ),
        "rpe_head_projection": Hyperparameter(
            str,
            "per_head",
            "per_head: the first self-attention layer's Q/K/V read only each head's slice; full: Eq. 4",
            choices=HEAD_PROJECTIONS,
        ),
    }

    def __init__(self, config, stack):
        super().__init__(config, stack)
        self.num_heads = attention_heads(config, stack)
        self.head_dim = config.d_model // self.num_heads
        self.rpe_dim = self.resolve_rpe_dim(config, stack)  # d_r
        self.word_dim = config.d_model - self.rpe_dim  # d_p
        self.max_positions = config.max_position_embeddings
        self.bidirectional = stack == ENCODER
        self.directions = 2 if self.bidirectional else 1
        self.cell = config.rpe_cell
        self.projected = config.rpe_recurrence == "projected"
        hidden_size = self.rpe_dim // self.directions
        if self.cell == "sru":
            self.rnn = SimpleRecurrentUnit(self.rpe_dim, hidden_size, self.bidirectional)
        else:
            self.rnn = TORCH_CELLS[self.cell](
                self.rpe_dim, hidden_size, batch_first=True, bidirectional=self.bidirectional
            )
        # W_r, b_r of Eq. 6: inside the loop one block per direction, else one matrix over both directions
        projection_size = hidden_size if self.projected else self.rpe_dim
        self.rpe_projection = nn.Linear(projection_size, projection_size)
        if self.projected and self.bidirectional:
            self.rpe_projection_reverse = nn.Linear(hidden_size, hidden_size)
        self.register_buffer(
            "table", marian_sinusoid_table(self.max_positions, self.word_dim), persistent=False
        )
        self.per_head = config.rpe_head_projection == "per_head"
        #: Key of the decoder's recurrent state in `PosEncCache.extra_state`.
        self.cache_key = f"{stack}_{self.name}_rnn_state"
        #: States kept per sequence: r_{j-1} (or h_{j-1}, or the SRU's c_{j-1}), and the LSTM's memory cell.
        self.state_count = 2 if self.cell == "lstm" else 1

    @classmethod
    def rpe_dim_granule(cls, num_heads: int, head_dim: int) -> int:
        """d_r must be a multiple of this for the layout to split into heads."""
        raise NotImplementedError

    @classmethod
    def default_rpe_granule(cls, config, stack: str) -> int:
        """The default d_r is a multiple of this: whole heads of the layout, and even in the encoder."""
        num_heads = attention_heads(config, stack)
        granule = cls.rpe_dim_granule(num_heads, config.d_model // num_heads)
        return math.lcm(granule, 2) if stack == ENCODER else granule

    @classmethod
    def resolve_rpe_dim(cls, config, stack: str) -> int:
        if config.rpe_dim is not None:
            return config.rpe_dim
        granule = cls.default_rpe_granule(config, stack)
        return int(cls.paper_rpe_dim * config.d_model / PAPER_D_MODEL) // granule * granule

    @classmethod
    def paper_deviations(cls, config, stack: str) -> list[str]:
        rpe_dim = cls.resolve_rpe_dim(config, stack)
        if config.rpe_dim is not None or rpe_dim == cls.paper_rpe_dim:
            return []
        granule = cls.default_rpe_granule(config, stack)
        return [
            f"d_r = {rpe_dim} (paper: {cls.paper_rpe_dim} at d_model {PAPER_D_MODEL}; scaled to "
            f"d_model {config.d_model}, rounded down to a multiple of {granule})"
        ]

    @classmethod
    def check_config(cls, config, stack):
        rpe_dim = cls.resolve_rpe_dim(config, stack)
        if not 0 < rpe_dim < config.d_model:
            raise ValueError(
                f"{cls.name} in the {stack}: rpe_dim={rpe_dim} must lie strictly between 0 and "
                f"d_model={config.d_model}"
                + (" (the default rounds to 0; set rpe_dim)." if config.rpe_dim is None else ".")
            )
        if stack == ENCODER and rpe_dim % 2:
            raise ValueError(
                f"{cls.name} in the encoder: rpe_dim={rpe_dim} must be even (two RNN directions of rpe_dim / 2)."
            )
        num_heads = attention_heads(config, stack)
        granule = cls.rpe_dim_granule(num_heads, config.d_model // num_heads)
        if rpe_dim % granule:
            raise ValueError(
                f"{cls.name} in the {stack}: rpe_dim={rpe_dim} must be a multiple of {granule} "
                f"({num_heads} heads of {config.d_model // num_heads} features)."
            )

    def reset_parameters(self):
        init.copy_(self.table, marian_sinusoid_table(self.max_positions, self.word_dim))
        bound = self.rnn.hidden_size**-0.5  # PyTorch's RNN initialisation, U(-1/sqrt(h), 1/sqrt(h)); SRU too
        for weight in self.rnn.parameters():
            init.uniform_(weight, -bound, bound)

    def assemble(self, words: torch.Tensor, rpes: torch.Tensor) -> torch.Tensor:
        """P (B, L, d_p), R (B, L, d_r) -> the stack input (B, L, D) in the layout's head order."""
        raise NotImplementedError

    def projection_per_head(self, layer_idx):
        return self.per_head and layer_idx == 0

    def embed(self, inputs_embeds, context, padding_mask, cache):
        check_max_positions(context, self.max_positions, self.name)
        word_part, recurrent_part = inputs_embeds.split([self.word_dim, self.rpe_dim], dim=-1)
        words = word_part + self.table[context.query_positions].to(inputs_embeds.dtype)  # P, (B, L, d_p)
        if self.bidirectional:
            rpes = self.encoder_rpes(recurrent_part, padding_mask)
        else:
            rpes = self.decoder_rpes(recurrent_part, context.query_span[0], cache)
        return self.assemble(words, rpes)  # R (B, L, d_r)

    def recurrence(self) -> Recurrence:
        return RECURRENCE_OF_CELL[self.cell](self.rnn, self.directions)

    def state_projection(self) -> tuple[torch.Tensor, torch.Tensor]:
        """W_r^T (D, h, h) and b_r (D, 1, h) of Eq. 6, per direction, for the loop of the projected form."""
        layers = (
            [self.rpe_projection, self.rpe_projection_reverse]
            if self.bidirectional
            else [self.rpe_projection]
        )
        return (
            torch.stack([layer.weight.T for layer in layers]),
            torch.stack([layer.bias for layer in layers])[:, None],
        )

    def encoder_rpes(self, inputs: torch.Tensor, padding_mask) -> torch.Tensor:
        """R (B, L, d_r) from the bidirectional recurrence over x^r (B, L, d_r)."""
        if self.projected:
            return bidirectional_recurrence(self.recurrence(), inputs, padding_mask, self.state_projection())
        if self.cell == "sru":
            states = bidirectional_recurrence(self.recurrence(), inputs, padding_mask)
        else:
            states = bidirectional_states(self.rnn, inputs, padding_mask)
        return torch.tanh(self.rpe_projection(states))  # Eq. 6 after the loop

    def decoder_rpes(self, inputs: torch.Tensor, first_position: int, cache) -> torch.Tensor:
        """R (B, q, d_r) of the forward recurrence, continuing from the state kept in the cache and appending the
        state after each new token to it (a prefix state: cropping the cache keeps the kept tokens' states)."""
        stored = self.stored_state(cache, first_position)  # (B, state_count, d_r) or None
        if self.projected or self.cell == "sru":
            outputs, states = self.forward_recurrence(inputs, stored)
        elif cache is None:
            outputs, states = self.torch_cell(inputs, None)[0], None
        else:
            outputs, states = self.torch_cell_steps(inputs, stored)
        if cache is not None:
            cache.append_token_state(self.cache_key, states)  # (B, k, state_count, d_r)
        return outputs if self.projected else torch.tanh(self.rpe_projection(outputs))  # Eq. 6

    def forward_recurrence(self, inputs: torch.Tensor, stored: torch.Tensor | None):
        """The step loop over x^r (B, q, d_r) from the stored state (B, state_count, d_r), zeros without one: the
        outputs (B, q, d_r) and the states after each step, (B, q, state_count, d_r)."""
        cell = self.recurrence()
        gates = cell.input_gates(inputs).permute(2, 0, 1, 3)  # (q, 1, B, G*h)
        if stored is None:
            state = gates.new_zeros(self.state_count, inputs.shape[0], self.rpe_dim)
        else:
            state = stored.transpose(0, 1)  # (state_count, B, d_r)
        projection = self.state_projection() if self.projected else None
        outputs, states, memories = recur(
            cell, gates, state[:1], state[1:] if cell.has_memory else None, projection, every_state=True
        )  # (q, 1, B, d_r) each
        states = (
            states if memories is None else torch.cat([states, memories], dim=1)
        )  # (q, state_count, B, d_r)
        return outputs[:, 0].transpose(0, 1), states.permute(2, 0, 1, 3)

    def torch_cell_steps(self, inputs: torch.Tensor, stored: torch.Tensor | None):
        """nn.RNN/GRU/LSTM over x^r (B, q, d_r) from the stored state: the outputs (B, q, d_r) and the states after
        each step, (B, q, state_count, d_r). The RNN's and GRU's outputs are their states; nn.LSTM returns only
        the last memory cell, so it runs one call per token (as incremental decoding calls it)."""
        state = None if stored is None else self.torch_cell_state(stored)
        if self.cell != "lstm":
            outputs = self.torch_cell(inputs, state)[0]  # (B, q, d_r)
            return outputs, outputs[:, :, None]
        outputs, states = [], []
        for token in inputs.split(1, dim=1):  # (B, 1, d_r)
            output, state = self.torch_cell(token, state)
            outputs.append(output)
            states.append(torch.cat(state).transpose(0, 1))  # (B, 2, d_r): h, c
        return torch.cat(outputs, dim=1), torch.stack(states, dim=1)

    def torch_cell(self, inputs: torch.Tensor, state):
        """self.rnn (nn.RNN/GRU/LSTM, one direction) over inputs (B, q, d_r) from `state`, in the precision of its
        weights with autocast off: under CPU bf16 autocast nn.LSTM would run in bf16, for which oneDNN has no
        kernel on CPUs without bf16 units (AVX2: "could not create a primitive descriptor")."""
        dtype = self.rnn.weight_ih_l0.dtype
        if state is not None:
            state = tuple(part.to(dtype) for part in state) if self.cell == "lstm" else state.to(dtype)
        with torch.autocast(inputs.device.type, enabled=False):
            return self.rnn(inputs.to(dtype), state)

    def stored_state(self, cache, first_position: int) -> torch.Tensor | None:
        """The state the cache holds for this stack, (B, state_count, d_r), or None at the first position."""
        if cache is None:
            return None
        if not isinstance(cache, PosEncCache):
            raise TypeError(f"{self.name} keeps its RNN state in a PosEncCache, got {type(cache).__name__}.")
        stored = cache.last_token_state(self.cache_key)
        if stored is None and first_position != 0:
            raise ValueError(
                f"{self.name}: decoding continues at position {first_position} but the cache holds "
                "no RNN state; the cache must have been filled by this model from position 0."
            )
        return stored

    def torch_cell_state(self, stored: torch.Tensor):
        """Batch-first stored state (B, n, d_r) -> what nn.RNN/GRU take, (1, B, d_r), or LSTM's (h, c)."""
        state = stored.transpose(0, 1).contiguous()  # (n, B, d_r)
        return (state[:1], state[1:]) if self.cell == "lstm" else state


class RPEHeadPositionEncoding(RecurrentPositionEncoding):
    """RPEHead (Eq. 7-8): T = [P : R]; the RPEs fill the last d_r / d_h heads."""

    name = "rpe_head"
    paper_rpe_dim = 320
    title = "RPEHead"
    reference = "paper 3 Eq. 6-8"
    variants = {
        "gru": {"rpe_cell": "gru"},
        "lstm-full": {"rpe_cell": "lstm", "rpe_head_projection": "full"},
        "decoder-gru": {"encoder_position_encoding": "sinusoidal", "rpe_cell": "gru"},
        "sru": {"rpe_cell": "sru"},
        "hidden": {"rpe_recurrence": "hidden"},
    }

    @classmethod
    def rpe_dim_granule(cls, num_heads, head_dim):
        return head_dim

    def assemble(self, words, rpes):
        return torch.cat([words, rpes], dim=-1)  # (B, L, D)


class MPRHeadPositionEncoding(RecurrentPositionEncoding):
    """MPRHead (Eq. 9-11): head h reads [p^h : r^h], m_j = [p^1 : r^1 : ... : p^H : r^H]."""

    name = "mpr_head"
    paper_rpe_dim = 256
    title = "MPRHead"
    reference = "paper 3 Eq. 6, 9-11"
    variants = {
        "lstm": {"rpe_cell": "lstm"},
        "full": {"rpe_head_projection": "full"},
        "encoder-only": {"decoder_position_encoding": "sinusoidal"},
        "sru-hidden": {"rpe_cell": "sru", "rpe_recurrence": "hidden"},
        "lstm-hidden": {"rpe_cell": "lstm", "rpe_recurrence": "hidden"},
    }

    @classmethod
    def rpe_dim_granule(cls, num_heads, head_dim):
        return num_heads

    def assemble(self, words, rpes):
        per_head = torch.cat(
            [words.unflatten(-1, (self.num_heads, -1)), rpes.unflatten(-1, (self.num_heads, -1))], -1
        )
        return per_head.flatten(-2)  # (B, L, H, d_p/H + d_r/H) -> (B, L, D)
