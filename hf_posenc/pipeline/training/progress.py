"""Readable progress for training and decoding, and an early warning when the time budget is too short.

* `ProgressReport`: a tqdm bar when the stream is a terminal, plain `logging` lines at most every N seconds
  when it is not (CI logs, files), so a log never fills with carriage-return bar frames;
* `TrainingProgressCallback`: replaces transformers' `ProgressCallback` (`trainer.remove_callback(
  ProgressCallback)`): with a wall-clock budget it shows minutes of the budget used and left, not steps of a
  `max_steps` that the budget ends long before; plus updates/s, target tokens/s, loss and learning rate;
* `UpdateBudgetCheck`: after the first minute or the first 20 updates, estimates the updates the budget
  allows at the measured speed and warns loudly, with the measured cause and the fixes, when they are too few
  for a translation model to learn anything (a CPU emulating bf16 trained 23 updates in 16 minutes and
  scored BLEU 0.00 without a word of warning).

Both callbacks measure time from `on_train_begin` unless given `start`, as `TimeBudgetCallback` does, and take
a `clock` (tests drive them with a fake one).
"""

import logging
import sys
import time
from collections.abc import Callable

import torch
from tqdm import tqdm
from transformers import TrainerCallback

from .hardware import Hardware

logger = logging.getLogger(__name__)

# The text follows the bar: it changes width every update, a bar after it would jump.
BAR_FORMAT = "{percentage:3.0f}%|{bar}| {desc}"
LOG_EVERY_SECONDS = 30.0
# Fewer updates than this leave a translation model with nothing to show: at 100 updates the default recipe's
# inverse-sqrt schedule (150 warm-up updates) has not reached its peak learning rate.
MIN_UPDATES = 100


def is_terminal(stream) -> bool:
    isatty = getattr(stream, "isatty", None)
    return bool(isatty is not None and isatty())


def human_count(value: float) -> str:
    """1234 -> "1.2k", 2500000 -> "2.5M"."""
    for scale, suffix in ((1e6, "M"), (1e3, "k")):
        if abs(value) >= scale:
            return f"{value / scale:.1f}{suffix}"
    return f"{value:.0f}"


class ProgressReport:
    """Progress towards `total` (any unit): a tqdm bar on a terminal `stream`, else a log line whenever
    `every_seconds` have passed since the last one, and a last line on `close`."""

    def __init__(
        self,
        total: float,
        name: str,
        every_seconds: float = LOG_EVERY_SECONDS,
        stream=None,
        clock: Callable[[], float] = time.monotonic,
        bar: bool = True,
    ):
        self.name = name
        self.every_seconds = every_seconds
        self.clock = clock
        self.last_logged = clock()
        self.text = ""  # the latest progress text
        self.unlogged = False  # whether no log line has shown `text` yet
        stream = sys.stderr if stream is None else stream
        self.bar = (
            tqdm(total=total, file=stream, bar_format=BAR_FORMAT, dynamic_ncols=True)
            if bar and is_terminal(stream)
            else None
        )

    def update(self, done: float, text: str) -> None:
        """`done` of `total` so far, described by `text`."""
        self.text, self.unlogged = text, True
        if self.bar is not None:
            self.bar.set_description_str(f"{self.name} {text}", refresh=False)
            self.bar.update(done - self.bar.n)  # tqdm redraws at most every 0.1 s
        elif self.clock() - self.last_logged >= self.every_seconds:
            self.write(text)
            self.unlogged = False

    def write(self, text: str) -> None:
        """A line outside the bar (evaluation results, summaries)."""
        if self.bar is not None:
            self.bar.write(f"{self.name}: {text}")
        else:
            logger.info("%s: %s", self.name, text)
            self.last_logged = self.clock()

    def close(self) -> None:
        if self.bar is not None:
            self.bar.close()
        elif self.unlogged:
            self.write(self.text)


def format_logs(logs: dict) -> str:
    return ", ".join(
        f"{key} {value:.4g}" if isinstance(value, float) else f"{key} {value}" for key, value in logs.items()
    )


class TrainingProgressCallback(TrainerCallback):
    """Training progress in minutes of the budget (or updates of `max_steps` without one), updates/s, target
    tokens/s (from `target_tokens()`, the number of label tokens trained on so far), and the last logged loss
    and learning rate. Logs without a training loss (evaluation, the final summary) are written as lines.
    Shown on the main process only."""

    def __init__(
        self,
        target_tokens: Callable[[], int],
        minutes: float | None = None,
        every_seconds: float = LOG_EVERY_SECONDS,
        stream=None,
        start: float | None = None,
        clock: Callable[[], float] = time.monotonic,
    ):
        self.target_tokens = target_tokens
        self.minutes = minutes or None
        self.every_seconds = every_seconds
        self.stream = stream
        self.given_start = start
        self.clock = clock
        self.report = None
        self.loss = self.learning_rate = None

    def on_train_begin(self, args, state, control, **kwargs):
        if not state.is_world_process_zero:
            return
        self.start = self.clock() if self.given_start is None else self.given_start
        self.first_step, self.first_tokens = state.global_step, self.target_tokens()
        total = self.minutes * 60 if self.minutes else state.max_steps
        # --disable_tqdm: log lines instead of a bar, on a terminal too
        self.report = ProgressReport(
            total,
            "training",
            self.every_seconds,
            self.stream,
            self.clock,
            bar=not getattr(args, "disable_tqdm", False),
        )

    def status(self, state) -> str:
        """The progress line: budget or steps, speed, loss, learning rate."""
        elapsed = max(self.clock() - self.start, 1e-9)
        updates_per_second = (state.global_step - self.first_step) / elapsed
        tokens_per_second = (self.target_tokens() - self.first_tokens) / elapsed
        if self.minutes:
            left = max(0.0, self.minutes - elapsed / 60)
            parts = [
                f"{elapsed / 60:.1f}/{self.minutes:g} min ({left:.1f} min left)",
                f"{state.global_step} updates",
            ]
        else:
            parts = [f"{state.global_step}/{state.max_steps} updates", f"{elapsed / 60:.1f} min"]
        speed = f"{updates_per_second:.2f} updates/s"
        if 0 < updates_per_second < 1:
            speed = f"{1 / updates_per_second:.1f} s/update"
        parts += [speed, f"{human_count(tokens_per_second)} target tokens/s"]
        if self.loss is not None:
            parts.append(f"loss {self.loss:.3f}")
        if self.learning_rate is not None:
            parts.append(f"lr {self.learning_rate:.2e}")
        return ", ".join(parts)

    def refresh(self, state) -> None:
        done = min(self.clock() - self.start, self.minutes * 60) if self.minutes else state.global_step
        self.report.update(done, self.status(state))

    def on_step_end(self, args, state, control, **kwargs):
        if self.report is not None:
            self.refresh(state)

    def on_log(self, args, state, control, logs=None, **kwargs):
        if not state.is_world_process_zero or not logs:
            return
        if "loss" in logs or "learning_rate" in logs:
            self.loss = logs.get("loss", self.loss)
            self.learning_rate = logs.get("learning_rate", self.learning_rate)
            return
        shown = {key: value for key, value in logs.items() if key != "total_flos"}
        if self.report is not None:
            self.report.write(format_logs(shown))
        else:
            logger.info("%s", format_logs(shown))

    def on_train_end(self, args, state, control, **kwargs):
        if self.report is not None:
            self.refresh(state)
            self.report.close()
            self.report = None


class UpdateBudgetCheck(TrainerCallback):
    """Estimates, once `measure_updates` updates or `measure_seconds` have passed, how many updates the
    `minutes` budget allows at the measured seconds per update, and warns when they are fewer than
    `min_updates` (unless `max_steps` asks for fewer anyway). With `stop`, such a run ends there instead of
    spending its budget on a model that cannot learn (the caller exits saying so). The estimate is kept in
    `self.estimate` (a dict for scores.json; made at the end of training if it ends before the measurement
    point). Under `torch.compile`, `compile_seconds()` gives the seconds spent compiling, which the measured
    speed leaves out (a graph is compiled once per batch shape; `compilation.CompileClock`)."""

    def __init__(
        self,
        minutes: float,
        precision: str,
        hardware: Hardware | None = None,
        min_updates: int = MIN_UPDATES,
        measure_seconds: float = 60.0,
        measure_updates: int = 20,
        start: float | None = None,
        clock: Callable[[], float] = time.monotonic,
        stop: bool = False,
        compile_seconds: Callable[[], float] | None = None,
    ):
        if not minutes or minutes <= 0:
            raise ValueError(f"minutes={minutes!r}: the budget check needs a positive wall-clock budget")
        self.minutes = minutes
        self.precision = precision
        self.hardware = hardware
        self.min_updates = min_updates
        self.measure_seconds = measure_seconds
        self.measure_updates = measure_updates
        self.given_start = start
        self.clock = clock
        self.stop = stop
        self.compile_seconds = compile_seconds or (lambda: 0.0)
        self.estimate: dict | None = None

    def on_train_begin(self, args, state, control, **kwargs):
        self.start = self.clock() if self.given_start is None else self.given_start
        self.first_step = state.global_step

    def elapsed(self) -> float:
        """Seconds since the start, less those spent compiling."""
        return self.clock() - self.start - self.compile_seconds()

    def on_step_end(self, args, state, control, **kwargs):
        if self.estimate is not None:
            return
        updates, elapsed = state.global_step - self.first_step, self.elapsed()
        if updates >= self.measure_updates or elapsed >= self.measure_seconds:
            self.assess(state, updates, elapsed)
            if self.stop and self.estimate["too_few_updates"]:
                self.estimate["stopped_at"] = state.global_step
                control.should_training_stop = True

    def on_train_end(self, args, state, control, **kwargs):
        updates = state.global_step - self.first_step
        if self.estimate is None and updates > 0:
            self.assess(state, updates, self.elapsed())

    def fixes(self, seconds_per_update: float) -> list[str]:
        """What would give enough updates, most likely first."""
        on_cpu = self.hardware is None or self.hardware.device == "cpu"
        fixes = []
        if on_cpu and self.precision == "bf16":
            fixes.append(
                "--precision fp32 (or auto, which times both): a CPU without bf16 units emulates bf16, about 25x "
                "slower per update than fp32"
            )
        elif on_cpu and self.precision == "fp32" and self.hardware is not None and self.hardware.bf16_flags:
            fixes.append("--precision auto: this CPU has bf16 units, bf16 may be several times faster")
        needed_minutes = self.min_updates * seconds_per_update / 60
        fixes += [
            "a smaller model: a smaller recipe (multi30k-en-de-tiny for Multi30k) or --d_model, --layers, --ffn_dim; "
            "or smaller batches (--max_tokens)",
            f"more time: --minutes {needed_minutes:.0f} allows about {self.min_updates} updates at this speed",
        ]
        return fixes

    def assess(self, state, updates: int, elapsed: float) -> None:
        seconds_per_update = elapsed / updates if updates else float("inf")
        compiling = self.compile_seconds()  # spent from the budget, not part of the speed
        by_budget = self.first_step + int(max(0.0, self.minutes * 60 - compiling) / seconds_per_update)
        threads = self.hardware.threads if self.hardware is not None else torch.get_num_threads()
        too_few = by_budget < min(self.min_updates, state.max_steps)
        self.estimate = {
            "seconds_per_update": round(seconds_per_update, 3),
            "measured_updates": updates,
            "measured_seconds": round(elapsed, 1),
            "compile_seconds": round(compiling, 1),
            "budget_minutes": self.minutes,
            "updates_allowed_by_budget": by_budget,
            "expected_updates": min(by_budget, state.max_steps),
            "min_updates": self.min_updates,
            "too_few_updates": too_few,
            "precision": self.precision,
            "threads": threads,
        }
        if not state.is_world_process_zero:
            return
        machine = self.hardware.line() if self.hardware is not None else f"{threads} threads"
        measured = (
            f"{seconds_per_update:.2f} s per update (measured over {updates} updates in {elapsed:.0f} s; "
            f"precision {self.precision}; {machine})"
        )
        if not too_few:
            logger.info(
                "budget check: %s -> about %d updates in %g minutes", measured, by_budget, self.minutes
            )
            return
        self.estimate["fixes"] = self.fixes(seconds_per_update)
        logger.warning(
            "\n%s\nTOO FEW UPDATES FOR THE TIME BUDGET: at %s the %g-minute budget allows about %d updates, "
            "fewer than the %d a translation model needs to output more than empty or repeated sentences "
            "(BLEU ~0).\nFixes:\n%s\n%s",
            "!" * 100,
            measured,
            self.minutes,
            by_budget,
            self.min_updates,
            "\n".join(f"  - {fix}" for fix in self.estimate["fixes"]),
            "!" * 100,
        )
