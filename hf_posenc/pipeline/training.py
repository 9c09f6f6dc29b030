"""Training and evaluation glue around `Seq2SeqTrainer`: what the HF stack lacks for NMT recipes.

* `TokenBudgetSeq2SeqTrainer`: the Trainer with token-budget batches (`max_tokens`) instead of a fixed
  number of sentences, through its `get_train_dataloader` hook;
* `TimeBudgetCallback`: stops training after a wall-clock budget (the default recipe trains for minutes,
  not epochs);
* `tokenize_parallel`: tokenised pairs with their lengths, over-long pairs rejected.
"""

import time

import datasets
from torch.utils.data import DataLoader
from transformers import Seq2SeqTrainer, TrainerCallback

from .batching import TokenBudgetBatchSampler


def tokenize_parallel(tokenizer, source: list[str], target: list[str], max_length: int) -> datasets.Dataset:
    """Tokenised pairs with `input_ids`, `labels` and the padded cost `length` = max(source, target) tokens.

    Pairs longer than `max_length` tokens on either side are an error, not silently truncated.
    """
    source_ids = tokenizer(source)["input_ids"]
    target_ids = tokenizer(text_target=target)["input_ids"]
    too_long = [
        i
        for i, (s, t) in enumerate(zip(source_ids, target_ids, strict=True))
        if max(len(s), len(t)) > max_length
    ]
    if too_long:
        raise ValueError(
            f"{len(too_long)} pair(s) exceed max_length={max_length} tokens (first: pair {too_long[0]}, "
            f"{max(len(source_ids[too_long[0]]), len(target_ids[too_long[0]]))} tokens); filter them or raise the limit"
        )
    return datasets.Dataset.from_dict(
        {
            "input_ids": source_ids,
            "labels": target_ids,
            "length": [max(len(s), len(t)) for s, t in zip(source_ids, target_ids, strict=True)],
        }
    )


class TokenBudgetSeq2SeqTrainer(Seq2SeqTrainer):
    """`Seq2SeqTrainer` whose training batches hold at most `max_tokens` padded tokens."""

    def __init__(self, *args, max_tokens: int, **kwargs):
        super().__init__(*args, **kwargs)
        self.max_tokens = max_tokens

    def get_train_dataloader(self) -> DataLoader:
        dataset = self.train_dataset.remove_columns(["length"])
        sampler = TokenBudgetBatchSampler(self.train_dataset["length"], self.max_tokens, seed=self.args.seed)
        loader = DataLoader(
            dataset,
            batch_sampler=sampler,
            collate_fn=self.data_collator,
            num_workers=self.args.dataloader_num_workers,
            pin_memory=self.args.dataloader_pin_memory,
        )
        return self.accelerator.prepare(loader)


class TimeBudgetCallback(TrainerCallback):
    """Ends training once `minutes` of wall-clock time have passed since training began."""

    def __init__(self, minutes: float):
        self.seconds = minutes * 60
        self.start = None

    def on_train_begin(self, args, state, control, **kwargs):
        self.start = time.monotonic()

    def on_step_end(self, args, state, control, **kwargs):
        if time.monotonic() - self.start > self.seconds:
            control.should_training_stop = True
