"""Token-budget batching (fairseq's `--max-tokens`) for the HF Trainer.

Examples of similar length are grouped so that a batch's padded size, batch_size × longest example, stays
within `max_tokens`. Batches are formed from a length-sorted order with seeded noise and shuffled every
epoch: deterministic per (seed, epoch), so a resumed run, whose Trainer skips the batches it already trained
on, sees the very batches the interrupted run would have. Under Accelerate the batch sampler is sharded per
process by `accelerator.prepare`, so each rank sees different batches.

The sampler holds numpy arrays (the lengths, the sorted order, the batch boundaries), a few bytes per example
and no Python object per example, so that millions of cached pairs batch in memory that does not grow with
Python objects; a batch becomes a list of indices only when the DataLoader asks for it.

Length buckets (`BucketPadding`): a batch's source and target are padded on the right up to one of a few bucket
lengths, so that an epoch's batches come in a few sequence lengths instead of one per length (a compiled model
then reuses its graphs). The batches hold the same examples as without buckets: `max_tokens` bounds the batch
padded to its longest example, and bucket padding adds positions beyond it (`padding_report` counts them).
Padding is masked (attention mask 0, labels -100), so the loss is unchanged.
"""

import math
from collections.abc import Sequence

import numpy as np
import torch
from datasets import Dataset
from datasets.arrow_dataset import Column


def as_lengths(lengths) -> np.ndarray:
    """Example lengths as an int64 array: from a list, an array, or a `datasets` column, read as one Arrow
    column (iterating it element by element takes seconds per million examples, and a list of its values
    costs a Python int each)."""
    if isinstance(lengths, Column) and isinstance(lengths.source, Dataset):
        name = lengths.column_name
        lengths = lengths.source.select_columns([name]).with_format("arrow")[:].column(name).to_numpy()
    return np.asarray(lengths, dtype=np.int64)


def batch_offsets(sorted_lengths: np.ndarray, max_tokens: int) -> np.ndarray:
    """Boundaries of greedy batches over ascending lengths: batch b is `sorted[offsets[b]:offsets[b + 1]]`, as
    many examples as fit, size × its longest (its last) example <= max_tokens. The size a batch starting at i
    can take is found by bisection (size × sorted[i + size - 1] grows with size): one Python step per batch,
    not per example."""
    count = len(sorted_lengths)
    offsets = [0]
    start = 0
    while start < count:
        low, high = 1, min(count - start, max(1, max_tokens // max(1, int(sorted_lengths[start]))))
        while low < high:  # the largest size that fits, at least 1
            middle = (low + high + 1) // 2
            if middle * int(sorted_lengths[start + middle - 1]) <= max_tokens:
                low = middle
            else:
                high = middle - 1
        start += low
        offsets.append(start)
    return np.asarray(offsets, dtype=np.int64)


class TokenBudgetBatchSampler:
    """Yields lists of example indices; `set_epoch` reshuffles (the Trainer calls it each epoch).

    Batch boundaries depend only on the sorted lengths, so they are found once; an epoch's order (length, then
    seeded noise, as Python's sort on (length, noise) would give) and its batch permutation are drawn from
    `torch.Generator().manual_seed(seed + epoch)` when that epoch is first iterated."""

    def __init__(self, lengths: Sequence[int], max_tokens: int, seed: int = 0, shuffle: bool = True):
        self.lengths = as_lengths(lengths)  # (N,)
        longest = int(self.lengths.max())
        if max_tokens < longest:
            raise ValueError(
                f"max_tokens={max_tokens} is smaller than the longest example ({longest} tokens, example "
                f"{int(self.lengths.argmax())}); raise max_tokens or filter long examples"
            )
        self.max_tokens = max_tokens
        self.seed = seed
        self.shuffle = shuffle
        self.epoch = 0
        self.sorted_lengths = np.sort(self.lengths)  # (N,)
        self.offsets = batch_offsets(self.sorted_lengths, max_tokens)  # (B + 1,)
        self.drawn_epoch = None  # the epoch `order` and `permutation` belong to
        # (N,) example indices by length, ties in seeded random order; (B,) the order batches are served in
        self.order = np.empty(0, dtype=np.int64)
        self.permutation = np.empty(0, dtype=np.int64)

    def set_epoch(self, epoch: int):
        self.epoch = epoch

    def draw(self) -> None:
        """The sorted order and batch permutation of the current epoch (once per epoch)."""
        if self.drawn_epoch == self.epoch:
            return
        generator = torch.Generator().manual_seed(self.seed + self.epoch)
        count = len(self.lengths)
        noise = torch.rand(count, generator=generator) if self.shuffle else torch.zeros(count)
        self.order = np.lexsort((noise.numpy(), self.lengths))  # by length, then noise; stable on full ties
        batches = len(self.offsets) - 1
        self.permutation = (
            torch.randperm(batches, generator=generator).numpy() if self.shuffle else np.arange(batches)
        )
        self.drawn_epoch = self.epoch

    def __iter__(self):
        self.draw()
        order, offsets = self.order, self.offsets
        for batch in self.permutation:
            yield order[offsets[batch] : offsets[batch + 1]].tolist()

    def __len__(self):
        return len(self.offsets) - 1

    @property
    def batches(self) -> list[list[int]]:
        """This epoch's batches as lists (one list per batch: for inspection and tests, not for training)."""
        return list(self)

    def padding_ratio(self) -> float:
        """Share of padded positions in the batches (0 = no padding)."""
        sizes = np.diff(self.offsets)  # (B,)
        longest = self.sorted_lengths[self.offsets[1:] - 1]  # (B,) the last of a batch is its longest
        padded = int((sizes * longest).sum())
        real = int(self.lengths.sum())
        return 1 - real / padded if padded else 0.0


def bucket_lengths(lengths, buckets: Sequence[int]) -> np.ndarray:
    """Each length raised to the smallest bucket that holds it; a length above the largest bucket is kept."""
    lengths = np.asarray(lengths, dtype=np.int64)
    buckets = np.asarray(buckets, dtype=np.int64)
    index = np.searchsorted(buckets, lengths, side="left")  # the first bucket >= length
    inside = index < len(buckets)
    return np.where(inside, buckets[np.minimum(index, len(buckets) - 1)], lengths)


def check_length_buckets(buckets: Sequence[int], name: str = "length_buckets") -> None:
    """Bucket lengths must be positive whole numbers in increasing order; the error names the bad values."""
    bad = [value for value in buckets if isinstance(value, bool) or not isinstance(value, int) or value < 1]
    if bad:
        raise ValueError(f"{name}={list(buckets)}: {bad} are not positive whole numbers of tokens")
    if not buckets:
        raise ValueError(f"{name}=[]: give at least one bucket length")
    unordered = [(a, b) for a, b in zip(buckets, buckets[1:], strict=False) if b <= a]
    if unordered:
        raise ValueError(
            f"{name}={list(buckets)}: bucket lengths must increase, and {unordered[0][1]} follows {unordered[0][0]}"
        )


# The columns `BucketPadding` pads, with their padding value (None: the pad token id): the source side's and the
# target side's (DataCollatorForSeq2Seq's output for a seq2seq model).
SOURCE_COLUMNS = {"input_ids": None, "attention_mask": 0}
TARGET_COLUMNS = {"labels": -100, "decoder_input_ids": None, "decoder_attention_mask": 0}


class BucketPadding:
    """A collate function: `collator`'s batch with its source columns padded on the right from their length up
    to the smallest of `buckets` that holds it, and its target columns likewise (each side to its own bucket;
    a side longer than the largest bucket keeps its length). Padded positions are masked: attention mask 0,
    labels -100, token ids `pad_token_id`. The decoder inputs are padded with `pad_token_id` where
    `prepare_decoder_input_ids_from_labels` of the padded labels would put the row's last label at the first
    added position: a position whose label is -100 and that no earlier position attends to (causal), so the
    loss is the same either way."""

    def __init__(self, collator, buckets: Sequence[int], pad_token_id: int):
        check_length_buckets(list(buckets))
        self.collator = collator
        self.buckets = list(buckets)
        self.pad_token_id = pad_token_id

    def __call__(self, features) -> dict:
        batch = self.collator(features)
        for columns in (SOURCE_COLUMNS, TARGET_COLUMNS):
            present = [name for name in columns if name in batch]
            if not present:
                continue
            length = batch[present[0]].shape[1]
            extra = int(bucket_lengths([length], self.buckets)[0]) - length
            if extra == 0:
                continue
            for name in present:
                value = self.pad_token_id if columns[name] is None else columns[name]
                batch[name] = torch.nn.functional.pad(batch[name], (0, extra), value=value)  # (B, bucket)
        return batch


def padding_report(
    sampler: TokenBudgetBatchSampler, source_lengths, target_lengths, buckets: Sequence[int] | None
) -> dict:
    """The padded positions of the sampler's batches in its current epoch, per side: the tokens, the positions
    of the batches padded to their longest example and padded to their bucket (`buckets` None: no buckets), the
    most positions one batch holds (padded to its bucket, or to its longest example without buckets), and
    the number of distinct (sentences, source length, target length) shapes and of (source, target) lengths."""
    sampler.draw()
    sizes = np.diff(sampler.offsets)  # (B,)
    starts = sampler.offsets[:-1]  # (B,)
    report, padded_lengths = {}, []
    for side, lengths in (("source", source_lengths), ("target", target_lengths)):
        lengths = as_lengths(lengths)  # (N,)
        longest = np.maximum.reduceat(lengths[sampler.order], starts)  # (B,) the longest of each batch
        padded = longest if buckets is None else bucket_lengths(longest, buckets)  # (B,)
        padded_lengths.append(padded)
        report[side] = {
            "tokens": int(lengths.sum()),
            "padded_to_longest": int((sizes * longest).sum()),
            "padded_to_buckets": int((sizes * padded).sum()),
            "largest_batch": int((sizes * padded).max()),  # the most positions of one batch, padded
        }
    report["shapes"] = len(
        set(zip(sizes.tolist(), *(padded.tolist() for padded in padded_lengths), strict=True))
    )
    report["lengths"] = len(set(zip(*(padded.tolist() for padded in padded_lengths), strict=True)))
    return report


def describe_padding(report: dict, buckets: Sequence[int]) -> str:
    """One line from `padding_report`: the shapes and each side's padding share without and with the buckets."""
    shares = []
    for side in ("source", "target"):
        tokens, longest, bucketed = (
            report[side][key] for key in ("tokens", "padded_to_longest", "padded_to_buckets")
        )
        shares.append(f"{side} {100 * (1 - tokens / longest):.1f}% -> {100 * (1 - tokens / bucketed):.1f}%")
    return (
        f"length buckets {list(buckets)}: {report['shapes']} batch shapes ({report['lengths']} source x target "
        f"lengths), padded positions {' and '.join(shares)}"
    )


def random_batches_padding_ratio(lengths: Sequence[int], batch_size: int, seed: int = 0) -> float:
    """Padding share of plain random batches of `batch_size` examples, for comparison."""
    lengths = torch.from_numpy(as_lengths(lengths).copy())  # an Arrow column is read-only
    order = torch.randperm(len(lengths), generator=torch.Generator().manual_seed(seed))
    padded = sum(len(chunk) * int(lengths[chunk].max()) for chunk in order.split(batch_size))
    return 1 - int(lengths.sum()) / padded if padded else math.nan
