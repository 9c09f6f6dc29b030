"""Training progress and the budget check (hf_posenc/pipeline/training/progress.py), driven with a fake Trainer state
and clock: a budget shows minutes, logs off a terminal are plain lines, too slow updates warn loudly, and time
spent compiling is spent from the budget but is not the speed of an update."""

import io
import logging

import pytest
from transformers import TrainerControl, TrainerState, TrainingArguments

from hf_posenc.pipeline.training.hardware import Hardware
from hf_posenc.pipeline.training.progress import TrainingProgressCallback, UpdateBudgetCheck

ARGS = TrainingArguments(output_dir="unused", report_to="none")
AVX2_MACHINE = Hardware("cpu", "Intel Xeon (AVX2 only)", "AVX2", 2, "2.13.0+cpu")


class FakeClock:
    def __init__(self):
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now


class Terminal(io.StringIO):
    def isatty(self) -> bool:
        return True


class LabelTokens:
    """What the trainer will count for the progress callback: label tokens trained on so far."""

    def __init__(self):
        self.total = 0

    def __call__(self) -> int:
        return self.total


class Run:
    """A Trainer driving `callbacks` (which share one fake clock) through updates of 500 label tokens."""

    def __init__(self, callbacks, max_steps=1_000_000, label_tokens=None):
        self.state = TrainerState(max_steps=max_steps)
        self.control = TrainerControl()
        self.clock = callbacks[0].clock
        self.label_tokens = label_tokens or LabelTokens()
        self.callbacks = callbacks
        for callback in callbacks:
            callback.on_train_begin(ARGS, self.state, self.control)

    def step(self, seconds: float, loss: float | None = None) -> None:
        self.clock.now += seconds
        self.state.global_step += 1
        self.label_tokens.total += 500
        for callback in self.callbacks:
            if loss is not None:
                callback.on_log(ARGS, self.state, self.control, logs={"loss": loss, "learning_rate": 1e-3})
            callback.on_step_end(ARGS, self.state, self.control)

    def end(self) -> None:
        for callback in self.callbacks:
            callback.on_train_end(ARGS, self.state, self.control)


def progress_run(minutes, stream, every_seconds=30.0, max_steps=1_000_000):
    label_tokens = LabelTokens()
    progress = TrainingProgressCallback(label_tokens, minutes, every_seconds, stream, clock=FakeClock())
    return Run([progress], max_steps, label_tokens), progress


def test_with_a_budget_the_bar_shows_minutes_of_the_budget_not_steps_of_max_steps():
    terminal = Terminal()
    run, _ = progress_run(minutes=16, stream=terminal)
    for _ in range(90):
        run.step(2.0, loss=4.2)  # 3 minutes, 0.5 updates/s, 250 target tokens/s
    run.end()  # draws the last frame (tqdm redraws at most every 0.1 s of real time)
    shown = terminal.getvalue()
    assert "3.0/16 min (13.0 min left)" in shown and "90 updates" in shown
    assert "2.0 s/update" in shown and "250 target tokens/s" in shown and "loss 4.200" in shown
    assert "1000000" not in shown
    assert "19%|" in shown  # the bar fills with the budget's time


def test_without_a_budget_the_bar_shows_updates_of_max_steps():
    terminal = Terminal()
    run, _ = progress_run(minutes=None, stream=terminal, max_steps=200)
    for _ in range(50):
        run.step(1.0)
    run.end()
    assert "50/200 updates" in terminal.getvalue() and " 25%|" in terminal.getvalue()


def test_off_a_terminal_progress_is_plain_log_lines_every_n_seconds(caplog):
    caplog.set_level(logging.INFO, logger="hf_posenc.pipeline.training.progress")
    stream = io.StringIO()
    run, _ = progress_run(minutes=16, stream=stream, every_seconds=30)
    for _ in range(10):
        run.step(10.0, loss=3.5)  # a line at 30, 60 and 90 s
    run.end()  # and a last one
    assert stream.getvalue() == ""  # no bar frames, no carriage returns
    lines = [record.getMessage() for record in caplog.records]
    assert len(lines) == 4 and all("\n" not in line and "\r" not in line for line in lines)
    assert (
        lines[0].startswith("training: 0.5/16 min") and "loss 3.500" in lines[0] and "lr 1.00e-03" in lines[0]
    )
    assert lines[-1].startswith("training: 1.7/16 min")


def test_disable_tqdm_gives_log_lines_on_a_terminal_too(caplog):
    caplog.set_level(logging.INFO, logger="hf_posenc.pipeline.training.progress")
    terminal = Terminal()
    progress = TrainingProgressCallback(LabelTokens(), 16, 30.0, terminal, clock=FakeClock())
    run = Run([progress])
    run.callbacks = []  # started with the Trainer's default arguments; now as --disable_tqdm starts it
    quiet = TrainingArguments(output_dir="unused", report_to="none", disable_tqdm=True)
    progress.on_train_begin(quiet, run.state, run.control)
    run.callbacks = [progress]
    for _ in range(4):
        run.step(10.0)
    run.end()
    assert "%|" not in terminal.getvalue().split("\n")[-1]  # no bar frame after --disable_tqdm took effect
    assert any(record.getMessage().startswith("training: 0.5/16 min") for record in caplog.records)


def test_evaluation_results_are_written_as_lines(caplog):
    caplog.set_level(logging.INFO, logger="hf_posenc.pipeline.training.progress")
    run, progress = progress_run(minutes=16, stream=io.StringIO())
    progress.on_log(ARGS, run.state, run.control, logs={"eval_loss": 2.3456789, "total_flos": 1e12})
    assert [record.getMessage() for record in caplog.records] == ["training: eval_loss 2.346"]


def budget_run(seconds_per_update, precision="bf16", hardware=AVX2_MACHINE, max_steps=1_000_000):
    check = UpdateBudgetCheck(minutes=16, precision=precision, hardware=hardware, clock=FakeClock())
    return Run([check], max_steps=max_steps), check


def test_budget_warning_fires_with_cause_and_fix_when_updates_are_too_slow(caplog):
    """The failure this guards against: bf16 emulated on an AVX2 CPU, ~40 s per update, 23 updates in 16 min."""
    run, check = budget_run(seconds_per_update=41.0)
    for _ in range(2):
        run.step(41.0)  # the first minute passes after 2 updates
    warnings = [record.getMessage() for record in caplog.records if record.levelno == logging.WARNING]
    assert len(warnings) == 1
    assert "TOO FEW UPDATES" in warnings[0] and "41.00 s per update" in warnings[0]
    assert (
        "precision bf16; Intel Xeon (AVX2 only), CPU capability AVX2, no bf16 flags, 2 threads" in warnings[0]
    )
    assert "--precision fp32" in warnings[0] and "--minutes 68" in warnings[0]
    assert check.estimate["too_few_updates"] and check.estimate["expected_updates"] == 23
    assert check.estimate["seconds_per_update"] == 41.0 and check.estimate["measured_updates"] == 2


def test_budget_check_is_quiet_and_records_the_estimate_when_updates_are_fast(caplog):
    run, check = budget_run(seconds_per_update=0.5)
    for _ in range(25):
        run.step(0.5)
    assert not [record for record in caplog.records if record.levelno >= logging.WARNING]
    assert check.estimate["measured_updates"] == 20  # measured once, after the first 20 updates
    assert check.estimate["expected_updates"] == 1920 and not check.estimate["too_few_updates"]


def test_budget_check_does_not_warn_when_max_steps_asks_for_few_updates(caplog):
    run, check = budget_run(seconds_per_update=41.0, max_steps=5)
    for _ in range(2):
        run.step(41.0)
    assert not [record for record in caplog.records if record.levelno >= logging.WARNING]
    assert check.estimate["expected_updates"] == 5


def test_budget_check_still_estimates_a_run_that_ends_before_its_measurement_point():
    run, check = budget_run(seconds_per_update=2.0, max_steps=3)
    for _ in range(3):
        run.step(2.0)
    run.end()
    assert check.estimate["measured_updates"] == 3 and check.estimate["seconds_per_update"] == 2.0


def test_on_a_bf16_cpu_in_fp32_the_fix_suggests_auto(caplog):
    machine = Hardware("cpu", "AMD EPYC", "AVX512", 2, "2.13.0+cpu", ("avx512_bf16",))
    run, check = budget_run(seconds_per_update=20.0, precision="fp32", hardware=machine)
    for _ in range(3):
        run.step(20.0)
    assert any("--precision auto" in fix for fix in check.estimate["fixes"])
    assert not any("--precision fp32" in fix for fix in check.estimate["fixes"])


def test_with_stop_a_budget_too_short_ends_training_at_the_measurement_instead_of_spending_it():
    check = UpdateBudgetCheck(
        minutes=16, precision="fp32", hardware=AVX2_MACHINE, clock=FakeClock(), stop=True
    )
    run = Run([check])
    for _ in range(3):
        run.step(60.0)  # a minute per update: about 16 updates in the budget
    assert run.control.should_training_stop and check.estimate["stopped_at"] == 1
    assert any("multi30k-en-de-tiny" in fix for fix in check.estimate["fixes"])
    fast = UpdateBudgetCheck(
        minutes=16, precision="fp32", hardware=AVX2_MACHINE, clock=FakeClock(), stop=True
    )
    run = Run([fast])
    for _ in range(25):
        run.step(0.5)
    assert not run.control.should_training_stop and "stopped_at" not in fast.estimate


def test_compile_time_is_spent_from_the_budget_but_not_counted_as_the_speed_of_an_update():
    """Under torch.compile the first updates compile their graphs (here 300 s of the first minute's 301): the
    check must neither read 300 s per update (and stop a healthy run) nor forget the 300 s spent."""
    compiled = {"seconds": 0.0}
    check = UpdateBudgetCheck(
        minutes=16,
        precision="bf16",
        clock=FakeClock(),
        stop=True,
        compile_seconds=lambda: compiled["seconds"],
    )
    run = Run([check])
    compiled["seconds"] = 300.0
    run.step(301.0)  # the first update compiles
    assert check.estimate is None  # one second of training measured, not 301
    for _ in range(19):
        run.step(1.0)
    assert not run.control.should_training_stop
    assert check.estimate["seconds_per_update"] == 1.0 and check.estimate["compile_seconds"] == 300.0
    assert check.estimate["updates_allowed_by_budget"] == 16 * 60 - 300


def test_budget_check_needs_a_budget():
    with pytest.raises(ValueError, match="minutes=0"):
        UpdateBudgetCheck(minutes=0, precision="fp32")
