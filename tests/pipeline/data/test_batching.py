"""Token-budget batches (pipeline/data/batching.py): they respect their budget and cover every example once, are
identical for a seed and epoch (also after a resume) and are held in numpy arrays; length buckets put every
batch's sides on a bucket without changing the loss or its gradients, and their padding is counted."""

import tracemalloc

import numpy as np
import pytest
import torch
from accelerate import skip_first_batches
from torch.utils.data import DataLoader
from transformers import DataCollatorForSeq2Seq
from transformers.trainer_pt_utils import LabelSmoother

from hf_posenc import POSITION_ENCODINGS
from hf_posenc.pipeline.data.batching import (
    BucketPadding,
    TokenBudgetBatchSampler,
    bucket_lengths,
    check_length_buckets,
    padding_report,
    random_batches_padding_ratio,
)
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


def test_lengths_rise_to_the_smallest_bucket_that_holds_them_and_longer_ones_are_kept():
    assert bucket_lengths([1, 8, 9, 16, 17, 40], [8, 16, 32]).tolist() == [8, 8, 16, 16, 32, 40]


@pytest.mark.parametrize(
    ("buckets", "message"),
    [
        ([8, 0, 16], r"\[0\] are not positive whole numbers"),
        ([8, 2.5], r"\[2.5\] are not positive whole numbers"),
        ([16, 8], r"bucket lengths must increase, and 8 follows 16"),
        ([8, 8], r"bucket lengths must increase, and 8 follows 8"),
        ([], r"give at least one bucket length"),
    ],
)
def test_bad_bucket_lengths_are_refused_by_value(buckets, message):
    with pytest.raises(ValueError, match=rf"length_buckets={buckets}: .*{message}".replace("[", r"\[", 1)):
        check_length_buckets(buckets)


def pairs_collator(toy_tokenizer, model):
    """DataCollatorForSeq2Seq over a few toy pairs of different lengths (as the Trainer's train.py collator)."""
    sources = [
        "a man sits on the grass",
        "two dogs run",
        "a red house near the old green house while children play",
    ]
    targets = ["a dog runs", "an old woman and a cat sit on the red grass near the house", "children play"]
    features = [
        {"input_ids": toy_tokenizer(source)["input_ids"], "labels": toy_tokenizer(target)["input_ids"]}
        for source, target in zip(sources, targets, strict=True)
    ]
    return DataCollatorForSeq2Seq(toy_tokenizer, model=model, label_pad_token_id=-100), features


@pytest.mark.parametrize("encoding", sorted(POSITION_ENCODINGS))
def test_bucket_padding_changes_neither_the_loss_nor_its_gradients(encoding, tiny_model, toy_tokenizer):
    """The padded positions are masked: the model's loss, the label-smoothed loss the Trainer computes and every
    gradient are those of the batch padded to its longest example, while both sides land on a bucket."""
    model = tiny_model(position_encoding=encoding, max_position_embeddings=64)
    collator, features = pairs_collator(toy_tokenizer, model)
    plain = collator(features)
    bucketed = BucketPadding(collator, [4, 8, 16, 24], toy_tokenizer.pad_token_id)(features)
    assert plain["input_ids"].shape[1] == 12 and plain["labels"].shape[1] == 15
    assert bucketed["input_ids"].shape == bucketed["attention_mask"].shape == (3, 16)
    assert bucketed["labels"].shape == bucketed["decoder_input_ids"].shape == (3, 16)
    losses, gradients = [], []
    for batch in (plain, bucketed):
        model.zero_grad()
        output = model(**batch)
        smoothed = LabelSmoother(epsilon=0.1)(output, batch["labels"])
        (output.loss + smoothed).backward()
        losses.append((output.loss.item(), smoothed.item()))
        gradients.append({name: p.grad.clone() for name, p in model.named_parameters() if p.grad is not None})
    assert losses[1] == pytest.approx(losses[0], rel=1e-5)
    assert gradients[1].keys() == gradients[0].keys()
    for name, gradient in gradients[0].items():
        torch.testing.assert_close(gradients[1][name], gradient, rtol=1e-4, atol=1e-6, msg=name)


def test_a_side_longer_than_the_largest_bucket_keeps_its_length(tiny_model, toy_tokenizer):
    collator, features = pairs_collator(toy_tokenizer, tiny_model())
    batch = BucketPadding(collator, [4, 8], toy_tokenizer.pad_token_id)(features)
    assert batch["input_ids"].shape[1] == 12 and batch["labels"].shape[1] == 15


def test_the_padding_report_counts_the_positions_the_buckets_add_and_the_largest_batch():
    generator = np.random.default_rng(2)
    source = generator.integers(3, 40, 3000)
    target = np.clip(source + generator.integers(-3, 4, 3000), 2, None)
    sampler = TokenBudgetBatchSampler(np.maximum(source, target), 500, seed=1)
    plain = padding_report(sampler, source, target, None)
    bucketed = padding_report(sampler, source, target, [8, 16, 24, 32, 48])
    by_hand, largest, largest_unbucketed = ({"source": 0, "target": 0} for _ in range(3))
    for batch in sampler:
        for side, lengths in (("source", source), ("target", target)):
            positions = len(batch) * int(bucket_lengths([lengths[batch].max()], [8, 16, 24, 32, 48])[0])
            by_hand[side] += positions
            largest[side] = max(largest[side], positions)
            largest_unbucketed[side] = max(largest_unbucketed[side], len(batch) * int(lengths[batch].max()))
    for side in ("source", "target"):
        assert plain[side]["padded_to_buckets"] == plain[side]["padded_to_longest"]
        assert bucketed[side]["padded_to_longest"] == plain[side]["padded_to_longest"]
        assert bucketed[side]["padded_to_buckets"] == by_hand[side] > plain[side]["padded_to_longest"]
        assert bucketed[side]["tokens"] == int({"source": source, "target": target}[side].sum())
        assert bucketed[side]["largest_batch"] == largest[side] > plain[side]["largest_batch"]
        assert plain[side]["largest_batch"] == largest_unbucketed[side]
    assert bucketed["lengths"] <= 5 * 5 < plain["lengths"]
