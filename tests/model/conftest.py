"""Fixtures of the model tests: position contexts built as the model builds them, for the score-bias encodings'
pair-by-pair reference checks (FIRE, KERPLE)."""

import pytest
import torch

from hf_posenc import PositionContext


@pytest.fixture(scope="session")
def encoder_context():
    """`encoder_context(encoding, lengths, total)`: right-padded encoder positions (B, total), counted as the model
    counts them (padding clamped)."""

    def build(encoding, lengths: list[int], total: int) -> PositionContext:
        keep = torch.arange(total)[None] < torch.tensor(lengths)[:, None]  # (B, L)
        positions = (keep.long().cumsum(-1) - 1).clamp(min=0)
        return PositionContext(encoding, positions, positions)

    return build


@pytest.fixture(scope="session")
def decoder_context():
    """`decoder_context(encoding, past, new, offsets=(0,))`: decoder self-attention after `past` cached tokens:
    queries past..past+new-1, keys 0..past+new-1, each row shifted by its offset (SHAPE)."""

    def build(encoding, past: int, new: int, offsets=(0,)) -> PositionContext:
        keys = torch.arange(past + new)[None] + torch.tensor(offsets)[:, None]  # (B, k)
        return PositionContext(encoding, keys[:, past:], keys)

    return build
