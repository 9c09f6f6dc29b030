"""Token-budget batches (pipeline/data/batching.py): they respect their budget and cover every example once, are
identical for a seed and epoch (also after a resume) and are held in numpy arrays."""

import tracemalloc

import numpy as np
import pytest
from accelerate import skip_first_batches
from torch.utils.data import DataLoader

from hf_posenc.pipeline.data.batching import TokenBudgetBatchSampler, random_batches_padding_ratio
from hf_posenc.pipeline.data.files import (
    read_split,
)
from hf_posenc.pipeline.data.tokenization import train_joint_bpe
from hf_posenc.pipeline.training.trainer import tokenize_parallel


def test_token_budget_batches_respect_the_budget_and_cover_every_example_once(multi30k_dir):
    text = read_split(multi30k_dir, "val", "en", "de")
    tokenizer = train_joint_bpe(text.source + text.target, vocab_size=600)
    lengths = tokenize_parallel(tokenizer, text.source, text.target, max_length=256)["length"]
    sampler = TokenBudgetBatchSampler(lengths, max_tokens=800, seed=3)
    for epoch in range(2):
        sampler.set_epoch(epoch)
        batches = list(sampler)
        assert all(len(b) * max(lengths[i] for i in b) <= 800 for b in batches)
        assert sorted(i for b in batches for i in b) == list(range(len(lengths)))
    assert [list(b) for b in TokenBudgetBatchSampler(lengths, 800, seed=3)] == TokenBudgetBatchSampler(
        lengths, 800, seed=3
    ).batches
    first_epoch = TokenBudgetBatchSampler(lengths, 800, seed=3).batches
    assert first_epoch != batches  # reshuffled per epoch
    random_padding = random_batches_padding_ratio(lengths, batch_size=len(lengths) // len(batches))
    assert sampler.padding_ratio() < 0.25 * random_padding


def test_budget_smaller_than_the_longest_example_is_an_error():
    with pytest.raises(
        ValueError, match=r"max_tokens=10 is smaller than the longest example \(12 tokens, example 1\)"
    ):
        TokenBudgetBatchSampler([5, 12, 3], max_tokens=10)


def test_over_long_pairs_are_an_error_not_truncated(multi30k_dir):
    text = read_split(multi30k_dir, "val", "en", "de", limit=50)
    tokenizer = train_joint_bpe(text.source + text.target, vocab_size=300)
    with pytest.raises(ValueError, match=r"exceed max_length=5 tokens"):
        tokenize_parallel(tokenizer, text.source, text.target, max_length=5)


def test_batches_are_identical_for_a_seed_and_epoch_and_after_a_resume():
    lengths = np.random.default_rng(0).integers(2, 60, 5000)
    first, second = (
        TokenBudgetBatchSampler(lengths, 600, seed=5),
        TokenBudgetBatchSampler(lengths, 600, seed=5),
    )
    for epoch in (0, 3):
        first.set_epoch(epoch)
        second.set_epoch(epoch)
        assert list(first) == list(second)
    assert list(TokenBudgetBatchSampler(lengths, 600, seed=6)) != list(
        TokenBudgetBatchSampler(lengths, 600, seed=5)
    )
    # a resumed run: a new sampler, the Trainer's skip of the batches already trained on (accelerate)
    resumed = TokenBudgetBatchSampler(lengths, 600, seed=5)
    loader = DataLoader(range(len(lengths)), batch_sampler=resumed, collate_fn=list)
    skipped = skip_first_batches(loader, 7)
    resumed.set_epoch(3)
    assert list(skipped) == list(first)[7:]


def test_the_sampler_holds_numpy_arrays_not_a_python_object_per_example():
    count = 200_000
    lengths = np.random.default_rng(1).integers(2, 100, count)
    tracemalloc.start()
    sampler = TokenBudgetBatchSampler(lengths, 4096, seed=0)
    batches = sum(1 for _ in sampler)
    peak = tracemalloc.get_traced_memory()[1]
    tracemalloc.stop()
    assert batches == len(sampler)
    assert all(not isinstance(value, list | tuple | dict) for value in vars(sampler).values())
    assert peak / count < 64  # bytes per example: a few arrays of 8 bytes, no list of ints (>= 36 bytes each)
