"""Training-time position randomization of the Marian encoder-decoder's stacks (modeling_marian_posenc.py), so that a
model trained on short sequences meets, in training, the positions of longer ones:

* SHAPE (Kiyono et al., EMNLP 2021, "SHAPE: Shifted Absolute Position Embedding for Transformers"): every position
  of a sequence shifted by one random offset k ~ U{0, ..., K}, K = `config.shape_max_shift`;
* randomized positional encodings (Ruoss et al., ACL 2023, "Randomized Positional Encodings Boost Length
  Generalization of Transformers", §3): the n tokens of a sequence take n sorted distinct positions drawn from
  {0, ..., L - 1}, L = `config.randomized_positions_max`.

Both act in training; at inference SHAPE's positions are the plain ones, and randomized positions are the plain
ones or, with `config.randomized_positions_inference = "spread"`, the expected positions of the training draw:

    p_i = ⌊(i + 1)(L + 1) / (n + 1)⌋ − 1,   i = 0, ..., n − 1                                    (1)

the mean of the (i + 1)-th smallest of n distinct positions drawn uniformly from {0, ..., L − 1}, rounded down,
n the source's real tokens, in the encoder; the decoder's token t takes p_t of Eq. 1 with its source's n (the
target continues at the source's rate, past L − 1 when it is longer than its source). The stacks compute
positions once per forward (modeling_marian_posenc.py) and call these methods there; `shape_offsets` states
where it deviates from the SHAPE authors' code.
"""

import torch

from .base import PosEncCache, PositionContext, PositionLimitError

RANDOMIZED_INFERENCE = ("plain", "spread")  # `config.randomized_positions_inference`

SHAPE_OFFSETS = "shape_offsets"  # the decoder's SHAPE offsets in `PosEncCache.extra_state`, (B, 1)


class PositionRandomizationMixin:
    """The stacks' randomized positions (mixed into `MarianPosEncStack`, which has `config`, `training` and
    `position_encoding`): `shape_offsets` and `randomized_positions` for both stacks, `shifted_positions` and
    `randomized_context` for the decoder, whose positions continue over the steps of a cached decode."""

    def shape_offsets(self, batch_size: int, device) -> torch.Tensor | None:
        """SHAPE's random shifts (Kiyono et al. 2021): one offset k ~ U{0, ..., K} per sequence, (B, 1), with
        K = `config.shape_max_shift`, added to every position of the sequence; None at inference or with K = 0.

        The authors' released code (github.com/butsugiri/shape, an OpenNMT-py fork) gives encoder and decoder
        each their own shifted position module, which draws one offset per sequence, so the two stacks are
        shifted independently; each stack calls this once per forward and so do we. Deviations from that
        code: it draws k in [0, K) and narrows the range where its table would overflow, we draw k in [0, K]
        and let a table too short for length + K raise `check_max_positions`' error; at inference it keeps
        every position shifted by K, we do not shift at all (k = 0).
        """
        if not (self.training and self.config.shape_max_shift):
            return None
        return torch.randint(0, self.config.shape_max_shift + 1, (batch_size, 1), device=device)  # (B, 1)

    def randomized_positions(self, positions: torch.Tensor, batch_size: int, past_length: int = 0):
        """Randomized positional encodings (Ruoss et al. 2023, §3): in training, the n tokens of a sequence take
        n sorted distinct positions drawn uniformly from {0, ..., L - 1}, L = `config.randomized_positions_max`,
        instead of 0..n-1; at inference those of Eq. 1 when `randomized_positions_inference` is "spread"
        (`spread_positions`, the encoder's call), else None, as with L = 0. `positions` (B|1, T) are the plain
        ones.

        Every sequence draws its own subset, and each stack draws for itself (called once per forward, like
        `shape_offsets`). A row's n is its largest plain position + 1: a padded source's real tokens; the
        decoder, which gets no padding mask in training, counts every row as T long, so a row of n < T real
        tokens takes the first n of its T sorted draws. The draws cover one forward: a cached decode cannot be
        continued in training mode (the draw for n + 1 tokens is not the draw for n extended). Padding takes the
        position of the real token its plain position names. Returns (B, T).
        """
        draws = self.config.randomized_positions_max
        if draws and not self.training and self.config.randomized_positions_inference == "spread":
            return spread_positions(positions, positions.amax(dim=-1, keepdim=True) + 1, draws)
        if not (self.training and draws):
            return None
        length = positions.shape[-1]
        if past_length or length > draws:
            raise ValueError(
                f"randomized positions (randomized_positions_max={draws}) draw the positions of a whole sequence "
                f"in one training forward: got {length} new tokens after {past_length} cached ones; sequences "
                f"must fit in {draws} positions, and a cached decode runs in eval mode (model.eval())."
            )
        keys = torch.rand(batch_size, draws, device=positions.device)  # (B, L)
        chosen = keys.argsort(dim=-1)[:, :length]  # (B, T): a uniform random T-subset of 0..L-1, unsorted
        counts = positions.amax(dim=-1, keepdim=True) + 1  # (B|1, 1): a row's real tokens
        ranks = torch.arange(length, device=positions.device)  # (T,)
        chosen = chosen.masked_fill(ranks >= counts, draws).sort(dim=-1).values  # (B, T): a row's first
        return chosen.gather(-1, positions.expand(batch_size, -1))  # (B, T)

    def shifted_positions(self, key_positions, batch_size: int, cache):
        """(key positions with SHAPE's offsets in training, (B, k); the offsets or None): the first step's offsets,
        kept in the cache, serve the later steps."""
        offsets = self.shape_offsets(batch_size, key_positions.device)
        if offsets is None:
            return key_positions, None
        if isinstance(cache, PosEncCache):
            offsets = cache.extra_state.setdefault(SHAPE_OFFSETS, offsets)
        return key_positions + offsets, offsets

    def randomized_context(
        self, context: PositionContext, cross_context: PositionContext, batch_size: int, past_length: int
    ) -> PositionContext:
        """The self-attention `context` with randomized positions for its keys' plain positions in training, or
        at inference with "spread" those of Eq. 1 at the rate of each row's source (its real tokens: one more
        than its last position in `cross_context`; spans read off the positions, a device sync per step); else
        `context`. Embeddings and self-attention take them; cross-attention keeps plain positions."""
        key_positions = context.key_positions  # (B|1, k): plain, as SHAPE and sentence positions are excluded
        draws = self.config.randomized_positions_max
        if draws and not self.training and self.config.randomized_positions_inference == "spread":
            sources = cross_context.key_positions.amax(dim=-1, keepdim=True) + 1  # (B|1, 1)
            spread = spread_positions(key_positions, sources, draws, source=False)  # (B|1, k)
            return PositionContext(self.position_encoding, spread[:, past_length:], spread)
        randomized = self.randomized_positions(key_positions, batch_size, past_length)
        if randomized is None:
            return context
        span = (0, draws - 1)
        return PositionContext(self.position_encoding, randomized, randomized, span, span)


def spread_positions(
    positions: torch.Tensor, lengths: torch.Tensor, draws: int, source: bool = True
) -> torch.Tensor:
    """Eq. 1: the expected positions of the training draw for plain `positions` (B|1, T) of sequences of
    `lengths` (B|1, 1) real tokens, L = `draws`. A source longer than L, which training's
    draws could not hold, raises `PositionLimitError` naming `randomized_positions_max`; a target (`source`
    False) continues past L - 1 at its source's rate. Returns (B|1, T)."""
    if source and (longest := int(lengths.max())) > draws:
        raise PositionLimitError(longest, draws, "randomized positions", "randomized_positions_max")
    return torch.div((positions + 1) * (draws + 1), lengths + 1, rounding_mode="floor") - 1  # (B|1, T)
