"""Recurrent positional embeddings: RPEHead and MPRHead (Chen, Wang, Utiyama, Sumita, EMNLP-IJCNLP 2019).

Instead of adding a fixed sinusoid to the whole embedding (Eq. 1-2), each scaled token embedding x_j is split
into x^p_j (d_p features) and x^r_j (d_r features), d_model = d_p + d_r (Sec. 3):

* P: p_j = x^p_j + pe_j, a sinusoid of dimension d_p (Eq. 1-2 at the reduced width);
* R: r_j = tanh(f_RNN(x^r_j, r_{j-1}) W_r + b_r) (Eq. 6), a bidirectional RNN in the encoder (directions
  concatenated to d_r) and a forward RNN in the decoder.

The two layouts differ in how P and R fill the heads of the first self-attention layer:

* RPEHead (Eq. 7-8): T = [P : R], so the RPEs occupy their own d_r / d_h heads;
* MPRHead (Eq. 9-11): every head h reads [p^h : r^h], m_j = [p^1 : r^1 : ... : p^H : r^H].

With full projections (Eq. 4) the two are the same model up to a permutation of the residual-stream features
(exactly so but for the tied output embedding). `rpe_head_projection="per_head"` (the default) makes the
first self-attention layer's Q/K/V projections block-diagonal over heads, the reading under which "independent
RPE heads" and "RPE part of each head" are different models; see docs/recurrent.md.

Deviations from the paper: the sinusoid is Marian's (sin half, cos half; not interleaved as in Eq. 1), so that
the baseline and the P part share one table; the paper does not say which features form x^r: we take the last
d_r. In the decoder the RNN state is part of the generation cache (`PosEncCache.extra_state`), so incremental
decoding and beam search give exactly the full-forward states.
"""

import math

import torch
from torch import nn
from torch.nn.utils.rnn import pack_padded_sequence, pad_packed_sequence
from transformers import initialization as init

from .base import ENCODER, PAPER_3, Hyperparameter, PosEncCache, PositionEncoding, check_max_positions
from .posenc_absolute import marian_sinusoid_table

RNN_CELLS = {"rnn": nn.RNN, "gru": nn.GRU, "lstm": nn.LSTM}
HEAD_PROJECTIONS = ("full", "per_head")
#: The model width at which the paper tuned d_r (Sec. 4.2, Fig. 2).
PAPER_D_MODEL = 512


def attention_heads(config, stack: str) -> int:
    return config.encoder_attention_heads if stack == ENCODER else config.decoder_attention_heads


def head_block_mask(num_heads: int, head_dim: int) -> torch.Tensor:
    """(D, D) 0/1 mask that keeps, in a projection weight (out, in), only each head's own input slice."""
    return torch.kron(torch.eye(num_heads), torch.ones(head_dim, head_dim))


def bidirectional_states(
    rnn: nn.RNNBase, inputs: torch.Tensor, padding_mask: torch.Tensor | None
) -> torch.Tensor:
    """Bidirectional RNN outputs (B, L, d_r) in which padding never reaches a real token's state.

    Each row's tokens are moved to the front (a no-op for right padding), packed with their lengths so the
    backward direction starts at each row's own last token, and the outputs are put back in place; padded
    positions get zero states.
    """
    if padding_mask is None:
        return rnn(inputs)[0]
    order = torch.argsort((padding_mask == 0).int(), dim=1, stable=True)[..., None]  # (B, L, 1): tokens first
    lengths = padding_mask.ne(0).sum(-1).cpu().clamp(min=1)  # an all-padding row keeps one (ignored) step
    packed = pack_padded_sequence(
        inputs.gather(1, order.expand_as(inputs)), lengths, batch_first=True, enforce_sorted=False
    )
    outputs, _ = pad_packed_sequence(rnn(packed)[0], batch_first=True, total_length=inputs.shape[1])
    return torch.empty_like(outputs).scatter_(1, order.expand_as(outputs), outputs)  # (B, L, d_r)


class RecurrentPositionEncoding(PositionEncoding):
    """P = x^p + PE (Eq. 1-2), R = tanh(RNN(x^r) W_r + b_r) (Eq. 6), assembled by the subclass's layout.

    `config.rpe_dim` = d_r; None takes the paper's best d_r for the layout (`paper_rpe_dim` at d_model 512)
    scaled to d_model and rounded down to a multiple of `rpe_dim_granule` (and to an even number in the
    encoder, whose two directions each get d_r / 2), so tiny test models get a proportionate RNN.
    """

    #: Registry name, for error messages.
    name: str
    #: The paper's best d_r for this layout in the base model (Sec. 4.2, Fig. 2).
    paper_rpe_dim: int

    citations = (PAPER_3,)
    hyperparameters = {
        "rpe_cell": Hyperparameter(
            str,
            "rnn",
            "f_RNN of Eq. 6 (tanh RNN: the paper's, < 2% extra parameters)",
            choices=tuple(RNN_CELLS),
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
        self.rnn = RNN_CELLS[config.rpe_cell](
            self.rpe_dim,
            self.rpe_dim // 2 if self.bidirectional else self.rpe_dim,
            batch_first=True,
            bidirectional=self.bidirectional,
        )
        self.rpe_projection = nn.Linear(self.rpe_dim, self.rpe_dim)  # W_r, b_r of Eq. 6
        self.register_buffer(
            "table", marian_sinusoid_table(self.max_positions, self.word_dim), persistent=False
        )
        per_head = config.rpe_head_projection == "per_head"
        self.register_buffer(
            "head_mask",
            head_block_mask(self.num_heads, self.head_dim) if per_head else None,
            persistent=False,
        )
        #: Key of the decoder's RNN state in `PosEncCache.extra_state`.
        self.cache_key = f"{stack}_{self.name}_rnn_state"

    @classmethod
    def rpe_dim_granule(cls, num_heads: int, head_dim: int) -> int:
        """d_r must be a multiple of this for the layout to split into heads."""
        raise NotImplementedError

    @classmethod
    def resolve_rpe_dim(cls, config, stack: str) -> int:
        if config.rpe_dim is not None:
            return config.rpe_dim
        num_heads = attention_heads(config, stack)
        granule = cls.rpe_dim_granule(num_heads, config.d_model // num_heads)
        if stack == ENCODER:
            granule = math.lcm(granule, 2)
        return int(cls.paper_rpe_dim * config.d_model / PAPER_D_MODEL) // granule * granule

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
        if self.head_mask is not None:
            init.copy_(self.head_mask, head_block_mask(self.num_heads, self.head_dim))
        bound = self.rnn.hidden_size**-0.5  # PyTorch's RNN initialisation, U(-1/sqrt(h), 1/sqrt(h))
        for weight in self.rnn.parameters():
            init.uniform_(weight, -bound, bound)

    def assemble(self, words: torch.Tensor, rpes: torch.Tensor) -> torch.Tensor:
        """P (B, L, d_p), R (B, L, d_r) -> the stack input (B, L, D) in the layout's head order."""
        raise NotImplementedError

    def projection_weight_mask(self, layer_idx):
        return self.head_mask if layer_idx == 0 else None

    def embed(self, inputs_embeds, context, padding_mask, cache):
        check_max_positions(context, self.max_positions, self.name)
        word_part, recurrent_part = inputs_embeds.split([self.word_dim, self.rpe_dim], dim=-1)
        words = word_part + self.table[context.query_positions].to(inputs_embeds.dtype)  # P, (B, L, d_p)
        if self.bidirectional:
            states = bidirectional_states(self.rnn, recurrent_part, padding_mask)
        else:
            states = self.forward_states(recurrent_part, context.query_span[0], cache)
        rpes = torch.tanh(self.rpe_projection(states))  # R, Eq. 6, (B, L, d_r)
        return self.assemble(words, rpes)

    def forward_states(self, inputs, first_position: int, cache) -> torch.Tensor:
        """Forward RNN outputs (B, q, d_r), continuing from (and updating) the state kept in the cache."""
        if cache is None:
            return self.rnn(inputs)[0]
        if not isinstance(cache, PosEncCache):
            raise TypeError(f"{self.name} keeps its RNN state in a PosEncCache, got {type(cache).__name__}.")
        stored = cache.extra_state.get(self.cache_key)  # (B, 1 or 2 for LSTM's (h, c), d_r)
        if stored is None and first_position != 0:
            raise ValueError(
                f"{self.name}: decoding continues at position {first_position} but the cache holds "
                "no RNN state; the cache must have been filled by this model from position 0."
            )
        outputs, state = self.rnn(inputs, None if stored is None else self.unpack_state(stored))
        cache.extra_state[self.cache_key] = torch.cat(
            state if isinstance(state, tuple) else (state,)
        ).transpose(0, 1)
        return outputs

    def unpack_state(self, stored: torch.Tensor):
        """Batch-first stored state (B, n, d_r) -> what the RNN takes: (1, B, d_r), or (h, c) for an LSTM."""
        state = stored.transpose(0, 1).contiguous()  # (n, B, d_r)
        return (state[:1], state[1:]) if isinstance(self.rnn, nn.LSTM) else state


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
    }
    comparison_rows = {
        "recurrent": {
            "rpe_head@encoder": {"decoder_position_encoding": "sinusoidal"},
            "rpe_head@decoder": {"encoder_position_encoding": "sinusoidal"},
            "rpe_head": None,
        }
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
    }
    comparison_rows = {
        "recurrent": {
            "mpr_head@encoder": {"decoder_position_encoding": "sinusoidal"},
            "mpr_head@decoder": {"encoder_position_encoding": "sinusoidal"},
            "mpr_head": None,
        }
    }

    @classmethod
    def rpe_dim_granule(cls, num_heads, head_dim):
        return num_heads

    def assemble(self, words, rpes):
        per_head = torch.cat(
            [words.unflatten(-1, (self.num_heads, -1)), rpes.unflatten(-1, (self.num_heads, -1))], -1
        )
        return per_head.flatten(-2)  # (B, L, H, d_p/H + d_r/H) -> (B, L, D)
