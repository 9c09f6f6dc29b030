"""`torch.compile` in training (`--torch_compile true`): the time spent compiling, and batches whose shapes a
compiled model reuses.

* `CompileClock`: the wall-clock seconds torch spends compiling (Dynamo tracing, AOTAutograd, Inductor and its
  C++ compiler; the backward graph too, which is compiled when it first runs), read from torch's compilation
  callbacks. The time budget spends them like any other second; the learning-rate plan and the budget check
  leave them out of the speed they measure, because a graph is compiled once per batch shape and the updates
  that follow do not pay for it again;
* `mark_batch_shapes`: with length buckets, a batch's lengths are marked static (one graph per source and target
  bucket) and its number of sentences dynamic (token-budget batches hold as many sentences as fit, so that number
  changes with every length), so that the graphs of an epoch are those of its bucket pairs;
* `recompile_limit`: torch's limit on graphs per compiled function (8), raised to the bucket pairs there can be.

Measured on the default recipe (docs/training.md): on a CPU the compiled step is no faster than the eager one,
so compilation stays off unless asked for.
"""

import time
from collections.abc import Callable

import torch
from torch._dynamo.callback import CallbackArgs, callback_handler

# torch's own limit on graphs per compiled function (torch._dynamo.config.recompile_limit in torch 2.13)
TORCH_RECOMPILE_LIMIT = 8


class CompileClock:
    """Seconds spent compiling while it is entered (a context manager), and the number of compilations; calling
    it gives the seconds so far, a compilation under way included. `clock` is the time source (tests)."""

    def __init__(self, clock: Callable[[], float] = time.monotonic):
        self.clock = clock
        self.seconds = 0.0
        self.compilations = 0
        self.started: float | None = None

    def start(self, args: CallbackArgs) -> None:
        self.started = self.clock()

    def end(self, args: CallbackArgs) -> None:
        if self.started is not None:
            self.seconds += self.clock() - self.started
            self.compilations += 1
        self.started = None

    def __call__(self) -> float:
        running = self.clock() - self.started if self.started is not None else 0.0
        return self.seconds + running

    def __enter__(self) -> "CompileClock":
        callback_handler.register_start_callback(self.start)
        callback_handler.register_end_callback(self.end)
        return self

    def __exit__(self, *exc_info) -> None:
        callback_handler.remove_start_callback(self.start)
        callback_handler.remove_end_callback(self.end)


def mark_batch_shapes(inputs: dict) -> None:
    """Mark every (sentences, length) tensor of a bucket-padded batch: sentences dynamic, length static."""
    for value in inputs.values():
        if isinstance(value, torch.Tensor) and value.ndim == 2:  # input_ids, masks, labels, decoder_input_ids
            if (
                value.shape[0] > 1
            ):  # torch specializes a dimension of size 1: such a batch gets a graph of its own
                torch._dynamo.mark_dynamic(value, 0)
            torch._dynamo.mark_static(value, 1)


def recompile_limit(buckets: list[int]) -> int:
    """Graphs per compiled function to allow: one per (source, target) pair of buckets, with room for sides longer
    than the largest bucket (they keep their length), and never below torch's own limit."""
    return max(TORCH_RECOMPILE_LIMIT, (len(buckets) + 1) ** 2)
