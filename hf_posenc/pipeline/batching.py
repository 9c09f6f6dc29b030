"""Token-budget batching (fairseq's `--max-tokens`) for the HF Trainer.

Examples of similar length are grouped so that a batch's padded size, batch_size × longest example, stays
within `max_tokens`. Batches are formed from a length-sorted order with seeded noise and shuffled every
epoch: deterministic per (seed, epoch). Under Accelerate the batch sampler is sharded per process by
`accelerator.prepare`, so each rank sees different batches.
"""

import math

import torch


class TokenBudgetBatchSampler:
    """Yields lists of example indices; `set_epoch` reshuffles (the Trainer calls it each epoch)."""

    def __init__(self, lengths: list[int], max_tokens: int, seed: int = 0, shuffle: bool = True):
        longest = max(lengths)
        if max_tokens < longest:
            raise ValueError(
                f"max_tokens={max_tokens} is smaller than the longest example ({longest} tokens, example "
                f"{lengths.index(longest)}); raise max_tokens or filter long examples"
            )
        self.lengths = torch.as_tensor(lengths)
        self.max_tokens = max_tokens
        self.seed = seed
        self.shuffle = shuffle
        self.epoch = 0
        self.batches = self.make_batches()

    def set_epoch(self, epoch: int):
        self.epoch = epoch
        self.batches = self.make_batches()

    def make_batches(self) -> list[list[int]]:
        generator = torch.Generator().manual_seed(self.seed + self.epoch)
        # Sort by length with a random tie-break, so batch composition changes between epochs.
        noise = (
            torch.rand(len(self.lengths), generator=generator)
            if self.shuffle
            else torch.zeros(len(self.lengths))
        )
        order = sorted(range(len(self.lengths)), key=lambda i: (int(self.lengths[i]), float(noise[i])))
        batches, current, current_longest = [], [], 0
        for index in order:
            longest = max(current_longest, int(self.lengths[index]))
            if current and longest * (len(current) + 1) > self.max_tokens:
                batches.append(current)
                current, longest = [], int(self.lengths[index])
            current.append(index)
            current_longest = longest
        if current:
            batches.append(current)
        if self.shuffle:
            permutation = torch.randperm(len(batches), generator=generator).tolist()
            batches = [batches[i] for i in permutation]
        return batches

    def __iter__(self):
        return iter(self.batches)

    def __len__(self):
        return len(self.batches)

    def padding_ratio(self) -> float:
        """Share of padded positions in the batches (0 = no padding)."""
        padded = sum(len(b) * int(self.lengths[b].max()) for b in self.batches)
        real = int(self.lengths.sum())
        return 1 - real / padded if padded else 0.0


def random_batches_padding_ratio(lengths: list[int], batch_size: int, seed: int = 0) -> float:
    """Padding share of plain random batches of `batch_size` examples, for comparison."""
    lengths = torch.as_tensor(lengths)
    order = torch.randperm(len(lengths), generator=torch.Generator().manual_seed(seed))
    padded = sum(len(chunk) * int(lengths[chunk].max()) for chunk in order.split(batch_size))
    return 1 - int(lengths.sum()) / padded if padded else math.nan
