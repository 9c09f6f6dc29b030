"""Training glue around `Seq2SeqTrainer`: what the HF stack lacks for NMT recipes.

* `TranslationTrainer`: the Trainer with token-budget batches (`max_tokens`) instead of a fixed number of
  sentences, through its `get_train_dataloader` hook, padded to length buckets where `length_buckets` are
  given (`batching.BucketPadding`), a count of the target tokens it trained on, and the learning-rate schedule
  planned for a time budget (`schedule.SchedulePlan`) where one is given, label smoothing computed by torch's
  `cross_entropy` (`CrossEntropyLabelSmoother`), and under `--torch_compile` its compilations timed and its
  bucketed batches marked for graph reuse (`compilation.py`);
* `TimeBudgetCallback`: stops training after a wall-clock budget, counted across resumes;
* `tokenize_parallel`: tokenised pairs with their lengths, over-long pairs rejected;
* `translation_metrics`: BLEU and chrF++ of generated validation translations for `compute_metrics`;
* `leave_process_group`: the end of a multi-process run without a hang or an abort on the way out.
"""

import signal
import threading
import time

import datasets
import torch
from torch.optim.lr_scheduler import LambdaLR
from torch.utils.data import DataLoader
from transformers import Seq2SeqTrainer, TrainerCallback
from transformers.trainer_callback import ExportableState
from transformers.trainer_pt_utils import LabelSmoother

from ..data.batching import BucketPadding, TokenBudgetBatchSampler, as_lengths
from ..evaluation.scoring import score_translations
from .compilation import CompileClock, mark_batch_shapes, recompile_limit


def tokenize_parallel(
    tokenizer, source: list[str], target: list[str], max_length: int | None = None
) -> datasets.Dataset:
    """Tokenised pairs in memory with `input_ids`, `labels` and the padded cost `length` = max(source, target)
    tokens: for a validation set (every pair kept) or a small corpus. Training corpora go through the on-disk
    cache of `corpus.py`, which skips and counts invalid pairs instead.

    Given `max_length`, pairs longer than that on either side are an error, not silently truncated.
    """
    source_ids = tokenizer(source)["input_ids"]
    target_ids = tokenizer(text_target=target)["input_ids"]
    too_long = [
        i
        for i, (s, t) in enumerate(zip(source_ids, target_ids, strict=True))
        if max_length is not None and max(len(s), len(t)) > max_length
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


class CrossEntropyLabelSmoother(LabelSmoother):
    """transformers' `LabelSmoother` loss, computed by torch's `cross_entropy(label_smoothing=epsilon)`: per label
    token (1 - ε) × its negative log-likelihood + ε × the mean of -log p over the vocabulary (label smoothing,
    Szegedy et al. 2016, "Rethinking the Inception Architecture", §7), summed over the tokens whose label is not
    `ignore_index` and divided by `num_items_in_batch` (or, without it, by their number), in fp32 as
    `LabelSmoother` computes it. The same value and gradients in one fused kernel, where `LabelSmoother` makes a
    negated copy of the log-probabilities, gathers and sums them over the vocabulary: the loss's forward and
    backward take half the time on the default recipe's logits (docs/training.md)."""

    def __call__(self, model_output, labels, shift_labels=False, num_items_in_batch=None):
        logits = model_output["logits"] if isinstance(model_output, dict) else model_output[0]  # (B, T, V)
        if shift_labels:
            logits, labels = logits[..., :-1, :], labels[..., 1:]
        total = torch.nn.functional.cross_entropy(
            logits.float().flatten(0, -2),  # (B·T, V)
            labels.flatten(),  # (B·T,)
            ignore_index=self.ignore_index,
            label_smoothing=self.epsilon,
            reduction="sum",
        )
        if num_items_in_batch is None:
            return total / (labels != self.ignore_index).sum()
        if torch.is_tensor(num_items_in_batch):
            num_items_in_batch = num_items_in_batch.to(total.device)  # the count may be on another device
        return total / num_items_in_batch


class TranslationTrainer(Seq2SeqTrainer):
    """`Seq2SeqTrainer` whose training batches hold at most `max_tokens` padded tokens (None: the Trainer's own
    batches of `per_device_train_batch_size` sentences), each side padded further up to its length bucket where
    `length_buckets` are given, counting the target tokens it trains on; its label smoothing is
    `CrossEntropyLabelSmoother`."""

    def __init__(
        self, *args, max_tokens: int | None, length_buckets: list[int] | None = None, lr_plan=None, **kwargs
    ):
        super().__init__(*args, **kwargs)
        if self.label_smoother is not None:
            self.label_smoother = CrossEntropyLabelSmoother(epsilon=self.label_smoother.epsilon)
        self.max_tokens = max_tokens
        self.length_buckets = length_buckets
        self.lr_plan = lr_plan
        self.target_tokens = 0  # label tokens trained on in this process since it started
        # the seconds spent compiling, under --torch_compile (the budget's callbacks read it)
        self.compile_clock = CompileClock() if self.args.torch_compile else None

    def train(self, *args, **kwargs):
        """The Trainer's training, its compilations timed, with room for a graph per pair of length buckets."""
        if self.compile_clock is None:
            return super().train(*args, **kwargs)
        limit = recompile_limit(self.length_buckets or [])
        with self.compile_clock, torch._dynamo.config.patch(recompile_limit=limit):
            return super().train(*args, **kwargs)

    def create_scheduler(self, num_training_steps: int, optimizer=None):
        if self.lr_plan is None or self.lr_scheduler is not None:
            return super().create_scheduler(num_training_steps, optimizer)
        # the plan is a callable object: LambdaLR saves its attributes with the scheduler's state
        self.lr_scheduler = LambdaLR(optimizer or self.optimizer, self.lr_plan)
        return self.lr_scheduler

    def get_train_dataloader(self) -> DataLoader:
        if self.max_tokens is None:
            return super().get_train_dataloader()
        dataset = self.train_dataset.remove_columns(["length"])
        # the lengths as one numpy array; the batches are the same for the same seed and epoch, so the Trainer's
        # skipping of the batches a resumed run already trained on lands where the interrupted run stopped
        sampler = TokenBudgetBatchSampler(
            as_lengths(self.train_dataset["length"]), self.max_tokens, seed=self.args.seed
        )
        collate = self.data_collator
        if self.length_buckets:
            collate = BucketPadding(collate, self.length_buckets, self.model.config.pad_token_id)
        # pinned memory only speeds copies to an accelerator; on a CPU torch warns once an epoch
        loader = DataLoader(
            dataset,
            batch_sampler=sampler,
            collate_fn=collate,
            num_workers=self.args.dataloader_num_workers,
            pin_memory=self.args.dataloader_pin_memory and torch.accelerator.is_available(),
        )
        return self.accelerator.prepare(loader)

    def log(self, logs: dict, *args, **kwargs) -> None:
        """Under token batches the Trainer's samples/s (updates x per_device_train_batch_size / s) counts
        sentences no batch held: it is replaced by the target tokens/s this process trained on."""
        if self.max_tokens is not None and "train_samples_per_second" in logs:
            logs = {key: value for key, value in logs.items() if key != "train_samples_per_second"}
            logs["train_target_tokens_per_second"] = round(
                self.target_tokens / max(logs["train_runtime"], 1e-9), 1
            )
        super().log(logs, *args, **kwargs)

    def _issue_warnings_after_load(self, load_result) -> None:
        """The Trainer's warnings after loading a checkpoint to resume from, without the tied copies of the
        shared embedding (`lm_head`, the stacks' `embed_tokens`): safetensors saves a tied parameter once, and
        loading its source fills them; any other missing key is still reported."""
        tied = set(getattr(self.model, "all_tied_weights_keys", None) or {})
        missing = [key for key in load_result.missing_keys if key not in tied]
        super()._issue_warnings_after_load(load_result._replace(missing_keys=missing))

    def training_step(self, model, inputs, num_items_in_batch=None):
        self.target_tokens += int((inputs["labels"] != -100).sum())
        if self.compile_clock is not None and self.length_buckets and self.max_tokens is not None:
            mark_batch_shapes(inputs)
        return super().training_step(model, inputs, num_items_in_batch)


class TimeBudgetCallback(TrainerCallback, ExportableState):
    """Ends training once `minutes` of training time have passed, counting the time of earlier attempts of the
    same run: the time spent is saved with each checkpoint and read back when training resumes. A run that saves
    checkpoints every N updates saves one where the budget ends it, as the Trainer does where `max_steps` ends a
    run: the checkpoints averaged then end where training did. In a run of several processes every process takes
    the first one's clock (`shared_clock`), so that all stop after the same update and plan the same learning
    rates: each process started its own clock, and one that stopped an update before the others would leave them
    waiting for it in the next update's gradient exchange."""

    def __init__(self, minutes: float, spent_seconds: float = 0.0):
        self.minutes = minutes
        self.spent_seconds = spent_seconds
        self.start = None

    def on_train_begin(self, args, state, control, **kwargs):
        saved = state.stateful_callbacks.get(type(self).__name__)
        if saved:
            self.spent_seconds = saved["attributes"]["spent_seconds"]
        self.start = time.monotonic() - self.spent_seconds

    def on_step_end(self, args, state, control, **kwargs):
        self.spent_seconds = shared_clock(time.monotonic() - self.start, args.device)
        if self.spent_seconds > self.minutes * 60:
            control.should_training_stop = True
            control.should_save = control.should_save or save_strategy(args) == "steps"

    def state(self) -> dict:
        return {"args": {"minutes": self.minutes}, "attributes": {"spent_seconds": self.spent_seconds}}


def shared_clock(seconds: float, device) -> float:
    """`seconds` of the first process of a multi-process run (a broadcast on `device`), in every process; as it is
    in a single process."""
    if not torch.distributed.is_initialized() or torch.distributed.get_world_size() == 1:
        return seconds
    value = torch.tensor([seconds], dtype=torch.float64, device=device)
    torch.distributed.broadcast(value, src=0)
    return value.item()


def save_strategy(training) -> str:
    """The Trainer arguments' `save_strategy` as its name ("no", "steps", ...; an enum once the arguments are
    built)."""
    return getattr(training.save_strategy, "value", training.save_strategy)


class StopOnInterrupt(TrainerCallback):
    """Ctrl-C (SIGINT) during training: the update under way finishes, a checkpoint is saved where the run saves
    checkpoints, and training stops (`interrupted` says so). A second Ctrl-C interrupts at once, wherever torch or
    a library is (writing a checkpoint, rotating them), which can end in another error than the interrupt. In one
    process, and its main thread, only: processes that trained on would wait for the stopped one forever."""

    def __init__(self):
        self.interrupted = False
        self.previous = None  # the SIGINT handler before training

    def on_train_begin(self, args, state, control, **kwargs):
        if threading.current_thread() is threading.main_thread():
            self.previous = signal.signal(signal.SIGINT, self.interrupt)

    def interrupt(self, signum, frame):
        self.interrupted = True
        signal.signal(signal.SIGINT, self.previous)  # a second Ctrl-C: at once

    def on_step_end(self, args, state, control, **kwargs):
        if self.interrupted:
            control.should_training_stop = True
            control.should_save = save_strategy(args) != "no"

    def on_train_end(self, args, state, control, **kwargs):
        self.restore()

    def restore(self) -> None:
        """The handler before training back (also where training ended in an error, without `on_train_end`)."""
        if self.previous is not None:
            signal.signal(signal.SIGINT, self.previous)
            self.previous = None


def translation_metrics(tokenizer):
    """`compute_metrics` for the Trainer: sacreBLEU BLEU and chrF++ of the generated validation translations."""
    import numpy as np

    def compute_metrics(prediction):
        predictions = np.where(prediction.predictions >= 0, prediction.predictions, tokenizer.pad_token_id)
        labels = np.where(prediction.label_ids >= 0, prediction.label_ids, tokenizer.pad_token_id)
        scores = score_translations(
            tokenizer.batch_decode(predictions, skip_special_tokens=True),
            tokenizer.batch_decode(labels, skip_special_tokens=True),
        )
        return {"bleu": scores["bleu"], "chrf++": scores["chrf++"]}

    return compute_metrics


def leave_process_group() -> None:
    """Leave torch.distributed once the processes need each other no more (no-op in a single process).

    Gloo's worker thread drops a finished collective, and the Python tensors it holds, only once it holds the
    GIL; the process group's destructor joins that thread while holding the GIL. Freeing the trainer right
    after a collective can therefore deadlock (seen: rank 0 of `accelerate launch` on 2 CPU processes stuck in
    `~ProcessGroupGloo` after training, the worker waiting for the GIL), and leaving the group to interpreter
    shutdown can abort ("terminate called without an active exception"). So the ranks line up, the worker gets
    a moment without the GIL to finish, and the group is destroyed.
    """
    if not torch.distributed.is_initialized():
        return
    torch.distributed.barrier()
    time.sleep(0.5)  # the GIL is free: the worker drops the barrier's work and goes idle
    torch.distributed.destroy_process_group()
