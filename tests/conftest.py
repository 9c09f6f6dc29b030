"""Shared fixtures: tiny configs, deterministic batches, and the location of the shipped data."""

import os
from pathlib import Path

import pytest
import torch

torch.set_num_threads(int(os.environ.get("HF_POSENC_TEST_THREADS", "2")))

REPO = Path(__file__).resolve().parents[1]
DATA_DIR = REPO.parent / "shared" / "data" / "multi30k"

PAD, EOS, VOCAB = 0, 1, 60


# The tiny Marian dimensions every test model shares (stock MarianConfig accepts them too).
TINY_FIELDS = dict(
    vocab_size=VOCAB,
    d_model=32,
    encoder_layers=2,
    decoder_layers=2,
    encoder_attention_heads=4,
    decoder_attention_heads=4,
    encoder_ffn_dim=64,
    decoder_ffn_dim=64,
    max_position_embeddings=64,
    dropout=0.1,
    pad_token_id=PAD,
    decoder_start_token_id=PAD,
    eos_token_id=EOS,
    forced_eos_token_id=EOS,
)


def tiny_config(**overrides):
    from hf_posenc import MarianPosEncConfig

    return MarianPosEncConfig(**{**TINY_FIELDS, **overrides})


def tiny_model(seed=0, **overrides):
    from hf_posenc import MarianPosEncForConditionalGeneration

    torch.manual_seed(seed)
    return MarianPosEncForConditionalGeneration(tiny_config(**overrides)).eval()


def source_batch(seed=0, batch=3, length=11):
    """Right-padded sources of different lengths, with their mask."""
    generator = torch.Generator().manual_seed(seed)
    ids = torch.randint(2, VOCAB, (batch, length), generator=generator)
    mask = torch.ones_like(ids)
    for row in range(1, batch):
        cut = length - 2 * row
        ids[row, cut:] = PAD
        mask[row, cut:] = 0
    ids[torch.arange(batch), mask.sum(1) - 1] = EOS
    return ids, mask


def target_batch(seed=1, batch=3, length=9):
    generator = torch.Generator().manual_seed(seed)
    ids = torch.randint(2, VOCAB, (batch, length), generator=generator)
    ids[:, 0] = PAD  # decoder start token
    return ids


def decode_with_cache(model, encoder_outputs, mask, target, prefill: int = 1) -> torch.Tensor:
    """Logits of `target` (B, T) fed with the generation cache: the first `prefill` tokens in one call, then one
    token per call; (B, T, V), to compare with the full forward."""
    steps, cache = [], None
    for start, end in [(0, prefill), *((p, p + 1) for p in range(prefill, target.shape[1]))]:
        out = model(encoder_outputs=encoder_outputs, attention_mask=mask, decoder_input_ids=target[:, start:end],
                    past_key_values=cache, use_cache=True)  # fmt: skip
        cache = out.past_key_values
        steps.append(out.logits)
    return torch.cat(steps, dim=1)


@pytest.fixture(scope="session")
def multi30k_dir():
    if not DATA_DIR.is_dir():
        pytest.skip(f"shared data folder {DATA_DIR} is absent on this machine")
    return DATA_DIR
