"""Training throughput of train.py's training stage, A/B in one process: several arms, each a full `Trainer.train()`
of the same recipe, data and initial weights, take turns every few updates, so that load on a shared machine
hits every arm alike.

    python -m benchmarks.train_throughput --arms before default --max_steps 300 --threads 2
    python -m benchmarks.train_throughput --arms default compile --max_steps 300 -- --recipe multi30k-en-de-small

Arms (`ARMS`): `default` is train.py as it is; `before` is the training step before label smoothing was computed
by torch's cross_entropy (transformers' `LabelSmoother`) and before the CPU dropout's packed draws (torch's
dropout: `hf_posenc.base.PACKED_CPU_DROPOUT` off during its turns); `buckets` pads the batches to the length
buckets a compiled run uses; `compile` trains under `torch.compile` (with those buckets); `adamw` steps with
torch's plain AdamW instead of the fused one. Flags after `--` are train.py's, for every arm (default: the
default recipe with a fixed schedule, no time budget, no checkpoints).

Each arm trains in a thread of its own (where a step runs slower than in the main thread: the ratios understate
a speed-up; docs/training.md); a callback hands the turn to the next arm every `--turn` updates, and an arm
computes only while it holds the turn, so each arm's clock counts its own work: target tokens/s is the label tokens
it trained on over its own seconds. The first turn of a compiled arm holds its compilation, which the table shows
apart. With `--evaluate` every arm's model is decoded on the test set and scored, as train.py does (BLEU at the same
number of updates). The arms share torch's random number generator, so their dropout masks differ from those of
separate runs: their losses agree in distribution, not bit for bit.
"""

import argparse
import logging
import statistics
import threading
import time
from dataclasses import dataclass, field

import torch
from transformers import TrainerCallback
from transformers.trainer_pt_utils import LabelSmoother

from hf_posenc import base
from hf_posenc.pipeline.training import run
from hf_posenc.pipeline.training.arguments import COMPILE_LENGTH_BUCKETS, parse_args
from hf_posenc.pipeline.training.hardware import busy_share, describe_hardware, keep_freed_memory

# Arm name -> (train.py flags, whether it trains the step before: transformers' LabelSmoother, torch's dropout).
ARMS = {
    "before": ([], True),
    "default": ([], False),
    "buckets": (["--length_buckets", *map(str, COMPILE_LENGTH_BUCKETS)], False),
    "compile": (["--torch_compile", "true"], False),
    "adamw": (["--optim", "adamw_torch"], False),
}
# What every arm runs unless the flags after `--` say otherwise: a fixed number of updates, nothing saved.
BASE_FLAGS = ["--minutes", "0", "--max_steps", "300", "--schedule", "fixed", "--save_strategy", "no"]
BASE_FLAGS += ["--average_last", "0", "--logging_steps", "50", "--disable_tqdm", "true"]


class Turns:
    """Round-robin turns among named arms; an arm that finishes leaves the round."""

    def __init__(self, names: list[str]):
        self.order = list(names)
        self.current = 0
        self.condition = threading.Condition()

    def wait(self, name: str) -> None:
        with self.condition:
            self.condition.wait_for(lambda: self.order[self.current] == name)

    def hand_on(self, name: str, leave: bool = False) -> None:
        with self.condition:
            index = self.order.index(name)
            if leave:
                self.order.pop(index)
                self.current = index % len(self.order) if self.order else 0
            else:
                self.current = (index + 1) % len(self.order)
            self.condition.notify_all()


@dataclass
class ArmClock(TrainerCallback):
    """Takes the arm's turn when training begins, hands it on every `every` updates and at the end, and adds up
    the seconds the arm held it (the first turn, which holds any compilation, apart)."""

    name: str
    turns: Turns
    every: int
    packed_dropout: bool = True
    seconds: list[float] = field(default_factory=list)
    held_since: float = 0.0

    def take(self) -> None:
        self.turns.wait(self.name)
        base.PACKED_CPU_DROPOUT = self.packed_dropout  # one arm computes at a time
        self.held_since = time.perf_counter()

    def release(self, leave: bool = False) -> None:
        self.seconds.append(time.perf_counter() - self.held_since)
        self.turns.hand_on(self.name, leave)

    def on_train_begin(self, args, state, control, **kwargs):
        self.take()

    def on_step_end(self, args, state, control, **kwargs):
        if state.global_step % self.every == 0 and state.global_step < state.max_steps:
            self.release()
            self.take()

    def on_train_end(self, args, state, control, **kwargs):
        self.release(leave=True)


@dataclass
class Arm:
    name: str
    args: object
    trainer: object
    clock: ArmClock
    precision: object
    scores: dict | None = None
    error: BaseException | None = None


def build_arm(name: str, flags: list[str], data, turns: Turns, every: int, output_root: str) -> Arm:
    """The arm's Trainer as train.py builds it (model from the same seed, precision and attention probed)."""
    arm_flags, before = ARMS[name]
    args = parse_args([*BASE_FLAGS, *flags, *arm_flags, "--output_dir", f"{output_root}/{name}"])
    model, precision, _ = run.build_model(args, data)
    training = run.trainer_arguments(args, precision)
    trainer, *_ = run.build_trainer(args, model, data, training, precision)
    if before and trainer.label_smoother is not None:
        trainer.label_smoother = LabelSmoother(epsilon=trainer.label_smoother.epsilon)
    arm = Arm(name, args, trainer, ArmClock(name, turns, every, packed_dropout=not before), precision)
    trainer.add_callback(arm.clock)
    return arm


def train_arm(arm: Arm) -> None:
    try:
        arm.trainer.train()
    except BaseException as error:  # reported by the main thread; the other arms go on
        arm.error = error
        if arm.name in arm.clock.turns.order:
            arm.clock.turns.hand_on(arm.name, leave=True)


def table(arms: list[Arm]) -> str:
    """Per arm: its updates, target tokens, seconds of its first turn and of the others, target tokens/s over all
    its turns and its ratio to the first arm's, and the median over turns 2.. of the first arm's seconds over this
    arm's in the same turn (the arms train the same batches in the same order, so a turn's ratio is a speed ratio,
    and the median discards the turns a burst of other work hit)."""
    rows = [
        "| arm | updates | target tokens | first turn (s) | other turns (s) | target tokens/s | ratio | median turn "
        "ratio | final loss |",
        "| --- | --- | --- | --- | --- | --- | --- | --- | --- |",
    ]
    speed = {arm.name: arm.trainer.target_tokens / sum(arm.clock.seconds) for arm in arms}
    base = arms[0]
    for arm in arms:
        losses = [entry["loss"] for entry in arm.trainer.state.log_history if "loss" in entry]
        turns = [b / a for a, b in zip(arm.clock.seconds[1:], base.clock.seconds[1:], strict=False)]
        rows.append(
            f"| {arm.name} | {arm.trainer.state.global_step} | {arm.trainer.target_tokens} | "
            f"{arm.clock.seconds[0]:.1f} | {sum(arm.clock.seconds[1:]):.1f} | {speed[arm.name]:.0f} | "
            f"{speed[arm.name] / speed[base.name]:.3f} | {statistics.median(turns) if turns else float('nan'):.3f} | "
            f"{losses[-1] if losses else float('nan'):.3f} |"
        )
    return "\n".join(rows)


def main(argv=None) -> list[Arm]:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--arms", nargs="+", choices=sorted(ARMS), default=["before", "default"])
    parser.add_argument("--turn", type=int, default=10, help="updates per turn")
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument(
        "--evaluate", action="store_true", help="decode the test set with every arm and score it"
    )
    parser.add_argument(
        "--output_root", default="outputs/train_throughput", help="each arm's run folder is in it"
    )
    options, flags = parser.parse_known_args(argv)
    flags = [flag for flag in flags if flag != "--"]
    if options.turn < 1 or options.threads < 1:
        parser.error(f"--turn={options.turn} and --threads={options.threads} must be at least 1")
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(name)s: %(message)s")
    torch.set_num_threads(options.threads)
    busy = busy_share()
    data = run.prepare_data(parse_args([*BASE_FLAGS, *flags]))
    turns = Turns(options.arms)
    arms = [build_arm(name, flags, data, turns, options.turn, options.output_root) for name in options.arms]
    if arms[0].args.run.cpu_memory == "reuse":
        keep_freed_memory("cpu")  # as train.py does
    threads = [threading.Thread(target=train_arm, args=(arm,), name=arm.name) for arm in arms]
    packed = base.PACKED_CPU_DROPOUT
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    base.PACKED_CPU_DROPOUT = packed  # as the arms found it
    for arm in arms:
        if arm.error is not None:
            raise arm.error
    print(
        f"\n<!-- {describe_hardware('cpu').line()}; other work took {100 * busy:.0f}% of the CPU time at the start; "
        f"load average {open('/proc/loadavg').read().split()[0]} at the end; {options.turn} updates per turn -->"
    )
    print(table(arms))
    if options.evaluate:
        for arm in arms:
            model, averaged = run.trained_model(arm.args, arm.trainer)
            report = run.TrainingReport(
                arm.trainer.state.global_step, 0.0, arm.trainer.target_tokens, 0.0, None
            )
            arm.scores = run.evaluate(arm.args, model, data, arm.precision, report, averaged).scores
            print(f"{arm.name}: BLEU {arm.scores['bleu']:.2f}, chrF++ {arm.scores['chrf++']:.2f}")
    return arms


if __name__ == "__main__":
    main()
