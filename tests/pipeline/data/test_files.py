"""Data reading fails loudly on bad input; token-budget batches respect their budget and cover every example;
the joint BPE tokenizer round-trips through AutoTokenizer."""

import gzip

import pytest
from transformers import AutoTokenizer

from hf_posenc.pipeline.data.batching import TokenBudgetBatchSampler, random_batches_padding_ratio
from hf_posenc.pipeline.data.files import read_parallel, read_split
from hf_posenc.pipeline.data.tokenization import train_joint_bpe
from hf_posenc.pipeline.training.trainer import tokenize_parallel


def write(path, lines, compressed=False):
    opener = gzip.open if compressed else open
    with opener(path, "wt", encoding="utf-8") as handle:
        handle.write("".join(line + "\n" for line in lines))
    return path


def test_missing_file_is_named(tmp_path):
    present = write(tmp_path / "a.en", ["x"])
    with pytest.raises(FileNotFoundError, match=r"b\.de does not exist"):
        read_parallel(present, tmp_path / "b.de")


def test_mismatched_line_counts_name_both_files_and_counts(tmp_path):
    source = write(tmp_path / "a.en.gz", ["one", "two", "three"], compressed=True)
    target = write(tmp_path / "a.de", ["eins", "zwei"])
    with pytest.raises(ValueError, match=r"a\.en\.gz has 3 lines, .*a\.de has 2"):
        read_parallel(source, target)


def test_empty_split_is_an_error(tmp_path):
    with pytest.raises(ValueError, match="empty split"):
        read_parallel(write(tmp_path / "e.en", []), write(tmp_path / "e.de", []))


def test_empty_lines_are_rejected_or_dropped_in_pairs_on_request(tmp_path):
    source = write(tmp_path / "s.en", ["a", "", "c"])
    target = write(tmp_path / "s.de", ["A", "B", "C"])
    with pytest.raises(ValueError, match=r"1 empty line.*line 2"):
        read_parallel(source, target)
    kept = read_parallel(source, target, empty_lines="skip")
    assert (kept.source, kept.target) == (["a", "c"], ["A", "C"])
    with pytest.raises(ValueError, match=r"empty_lines='drop'.*error, skip"):
        read_parallel(source, target, empty_lines="drop")


def test_shipped_multi30k_reads_aligned(multi30k_dir):
    test = read_split(multi30k_dir, "test_2016_flickr", "en", "de")
    assert len(test) == 1000 and len(test.target) == 1000


def test_tokenizer_round_trips_through_auto_tokenizer(multi30k_dir, tmp_path):
    text = read_split(multi30k_dir, "val", "en", "de")
    tokenizer = train_joint_bpe(text.source + text.target, vocab_size=600)
    assert [tokenizer.pad_token_id, tokenizer.eos_token_id, tokenizer.unk_token_id] == [0, 1, 2]
    tokenizer.save_pretrained(tmp_path)
    reloaded = AutoTokenizer.from_pretrained(tmp_path)
    sample = text.source[:20] + text.target[:20]
    assert reloaded(sample)["input_ids"] == tokenizer(sample)["input_ids"]
    ids = reloaded(sample)["input_ids"]
    assert all(row[-1] == 1 for row in ids)  # </s> closes every sequence
    assert reloaded.batch_decode(ids, skip_special_tokens=True) == sample


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
