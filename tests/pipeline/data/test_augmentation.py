"""Concatenation augmentation (pipeline/data/augmentation.py): deterministic for a seed, consecutive pairs joined
with every pair kept once in order, the probability is the share of joined examples, bad arguments named."""

import pytest

from hf_posenc.pipeline.data.augmentation import concatenate_consecutive
from hf_posenc.pipeline.data.files import ParallelText


def numbered_text(count):
    return ParallelText([f"s{i}" for i in range(count)], [f"t{i}" for i in range(count)], "numbered")


def test_augmentation_is_deterministic_for_a_seed():
    text = numbered_text(300)
    first = concatenate_consecutive(text, 0.5, [2, 3], seed=7)
    assert first == concatenate_consecutive(text, 0.5, [2, 3], seed=7)
    assert first.source != concatenate_consecutive(text, 0.5, [2, 3], seed=8).source


def test_augmentation_joins_consecutive_pairs_and_keeps_every_pair_once_in_order():
    text = numbered_text(500)
    augmented = concatenate_consecutive(text, 0.4, [2, 4], seed=0)
    assert " ".join(augmented.source) == " ".join(text.source)
    assert " ".join(augmented.target) == " ".join(text.target)
    for source, target in zip(augmented.source, augmented.target, strict=True):
        indices = [int(word[1:]) for word in source.split()]
        assert [int(word[1:]) for word in target.split()] == indices  # sides stay aligned
        assert len(indices) in (1, 2, 4) or indices[-1] == 499  # only the corpus end may cut a group short
        assert indices == list(range(indices[0], indices[0] + len(indices)))  # consecutive


def test_augmentation_probability_is_the_share_of_joined_examples():
    assert concatenate_consecutive(numbered_text(50), 0.0).source == numbered_text(50).source
    assert concatenate_consecutive(numbered_text(7), 1.0).source == ["s0 s1", "s2 s3", "s4 s5", "s6"]
    augmented = concatenate_consecutive(numbered_text(20000), 0.3, [2, 3], seed=1)
    sizes = [len(source.split()) for source in augmented.source]
    joined = [size for size in sizes if size > 1]
    assert abs(len(joined) / len(sizes) - 0.3) < 0.02
    assert abs(sum(joined) / len(joined) - 2.5) < 0.05  # group sizes drawn uniformly


def test_augmentation_rejects_bad_arguments_naming_them():
    text = numbered_text(4)
    for probability in (-0.1, 1.5, "0.5", True):
        with pytest.raises(ValueError, match=r"probability=.*between 0 and 1"):
            concatenate_consecutive(text, probability)
    for sizes in ([], [1], [2, 1], [2.0]):
        with pytest.raises(ValueError, match=r"group_sizes=.*whole numbers >= 2"):
            concatenate_consecutive(text, 0.5, sizes)
