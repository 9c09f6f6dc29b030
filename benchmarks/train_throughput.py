"""Training throughput of train.py's training stage, A/B: several arms, each a full `Trainer.train()` of the same
recipe, data and initial weights in a process of its own, take turns every few updates, so that load on a shared
machine hits every arm alike.

    python -m benchmarks.train_throughput --arms before default --max_steps 300 --threads 2
    python -m benchmarks.train_throughput --arms default compile --max_steps 300 -- --recipe multi30k-en-de-small

Arms (`ARMS`): `default` is train.py as it is; `before` is the training step before label smoothing was computed
by torch's cross_entropy (transformers' `LabelSmoother`) and before the CPU dropout's packed draws (torch's
dropout: `hf_posenc.base.PACKED_CPU_DROPOUT` off in its process); `buckets` pads the batches to the length
buckets a compiled run uses; `compile` trains under `torch.compile` (with those buckets); `adamw` steps with
torch's plain AdamW instead of the fused one. Flags after `--` are train.py's, for every arm (default: the
default recipe with a fixed schedule, no time budget, no checkpoints).

Each arm trains in the main thread of a process of its own (spawned: a training step in another thread of a
process ran 1.5x slower, docs/training.md), once every arm is built; a callback hands the turn to the next arm
every `--turn` updates, and an arm computes only while it holds the turn, so each arm's clock counts its own work:
target tokens/s is the label tokens it trained on over its own seconds. The first turn of a compiled arm holds its
compilation, which the table shows apart. With `--evaluate` every arm's model is decoded on the test set and
scored once all have trained, as train.py does (BLEU at the same number of updates). Each arm draws from its own
generator with the run's seed, as a separate run would.
"""

import argparse
import logging
import multiprocessing
import queue
import statistics
import time
import traceback
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
    """Round-robin turns among the arms' processes, by index; an arm that finishes leaves the round."""

    def __init__(self, count: int, context):
        self.active = context.Array("b", [1] * count, lock=False)  # (arms,) 1 while an arm is in the round
        self.current = context.Value("i", 0, lock=False)  # the index holding the turn, -1 once all have left
        self.condition = context.Condition()

    def wait(self, index: int) -> None:
        with self.condition:
            self.condition.wait_for(lambda: self.current.value == index)

    def hand_on(self, index: int, leave: bool = False) -> None:
        with self.condition:
            if leave:
                self.active[index] = 0
            count = len(self.active)
            following = [(index + step) % count for step in range(1, count + 1)]  # the others, then itself
            self.current.value = next((i for i in following if self.active[i]), -1)
            self.condition.notify_all()


@dataclass
class ArmClock(TrainerCallback):
    """Takes the arm's turn when training begins, hands it on every `every` updates and at the end, and adds up
    the seconds the arm held it (the first turn, which holds any compilation, apart)."""

    index: int
    turns: Turns
    every: int
    seconds: list[float] = field(default_factory=list)
    held_since: float = 0.0

    def take(self) -> None:
        self.turns.wait(self.index)
        self.held_since = time.perf_counter()

    def release(self, leave: bool = False) -> None:
        self.seconds.append(time.perf_counter() - self.held_since)
        self.turns.hand_on(self.index, leave)

    def on_train_begin(self, args, state, control, **kwargs):
        self.take()

    def on_step_end(self, args, state, control, **kwargs):
        if state.global_step % self.every == 0 and state.global_step < state.max_steps:
            self.release()
            self.take()

    def on_train_end(self, args, state, control, **kwargs):
        self.release(leave=True)


@dataclass
class Rendezvous:
    """What the arms' processes share: the turns, a barrier before training and one before decoding, and the
    queue their summaries come back on."""

    turns: Turns
    built: object
    trained: object
    results: object


def build_arm(name: str, flags: list[str], data, output_root: str):
    """The arm's Trainer as train.py builds it (model from the same seed, precision and attention probed)."""
    arm_flags, before = ARMS[name]
    args = parse_args([*BASE_FLAGS, *flags, *arm_flags, "--output_dir", f"{output_root}/{name}"])
    model, precision, _ = run.build_model(args, data)
    training = run.trainer_arguments(args, precision)
    trainer, *_ = run.build_trainer(args, model, data, training, precision)
    if before and trainer.label_smoother is not None:
        trainer.label_smoother = LabelSmoother(epsilon=trainer.label_smoother.epsilon)
    base.PACKED_CPU_DROPOUT = not before
    return args, trainer, precision


def train_arm(index: int, name: str, flags: list[str], options, meet: Rendezvous) -> None:
    """One arm, in its process: built, trained in turns once every arm is built, decoded once every arm has
    trained (with --evaluate); its summary, or its error, goes on the results queue."""
    torch.set_num_threads(options.threads)
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(name)s: %(message)s")
    summary = {"name": name}
    try:
        data = run.prepare_data(parse_args([*BASE_FLAGS, *flags]))  # the tokenizer the parent cached
        args, trainer, precision = build_arm(name, flags, data, options.output_root)
        clock = ArmClock(index, meet.turns, options.turn)
        trainer.add_callback(clock)
        if args.run.cpu_memory == "reuse":
            keep_freed_memory("cpu")  # as train.py does
        meet.built.wait()
        trainer.train()
        summary |= {
            "updates": trainer.state.global_step,
            "target_tokens": trainer.target_tokens,
            "seconds": clock.seconds,
            "losses": [entry["loss"] for entry in trainer.state.log_history if "loss" in entry],
            "label_smoother": type(trainer.label_smoother).__name__,
            "length_buckets": trainer.length_buckets,
            "packed_dropout": base.PACKED_CPU_DROPOUT,
        }
        meet.trained.wait()
        if options.evaluate:
            model, averaged = run.trained_model(args, trainer)
            report = run.TrainingReport(trainer.state.global_step, 0.0, trainer.target_tokens, 0.0, None)
            summary["scores"] = run.evaluate(args, model, data, precision, report, averaged).scores
    except BaseException:  # the parent reports it and fails the run; no arm is left waiting for this one
        summary["error"] = traceback.format_exc()
        if meet.turns.active[index]:
            meet.turns.hand_on(index, leave=True)
        meet.built.abort()
        meet.trained.abort()
    meet.results.put(summary)


def table(arms: list[dict]) -> str:
    """Per arm: its updates, target tokens, seconds of its first turn and of the others, target tokens/s over all
    its turns and its ratio to the first arm's, and the median over turns 2.. of the first arm's seconds over this
    arm's in the same turn (the arms train the same batches in the same order, so a turn's ratio is a speed ratio,
    and the median discards the turns a burst of other work hit)."""
    rows = [
        "| arm | updates | target tokens | first turn (s) | other turns (s) | target tokens/s | ratio | median turn "
        "ratio | final loss |",
        "| --- | --- | --- | --- | --- | --- | --- | --- | --- |",
    ]
    speed = {arm["name"]: arm["target_tokens"] / sum(arm["seconds"]) for arm in arms}
    first = arms[0]
    for arm in arms:
        seconds, losses = arm["seconds"], arm["losses"]
        turns = [b / a for a, b in zip(seconds[1:], first["seconds"][1:], strict=False)]
        rows.append(
            f"| {arm['name']} | {arm['updates']} | {arm['target_tokens']} | {seconds[0]:.1f} | "
            f"{sum(seconds[1:]):.1f} | {speed[arm['name']]:.0f} | {speed[arm['name']] / speed[first['name']]:.3f} | "
            f"{statistics.median(turns) if turns else float('nan'):.3f} | "
            f"{losses[-1] if losses else float('nan'):.3f} |"
        )
    return "\n".join(rows)


def collect_summaries(results, processes, poll_seconds: float = 5.0) -> dict:
    """Every arm's summary by name, as the arms put them on `results`. An arm whose process ended without one
    (killed, crashed) would hold the others' turns forever: the arms are stopped and the error names it."""
    summaries = {}
    while len(summaries) < len(processes):
        try:
            summary = results.get(timeout=poll_seconds)
        except queue.Empty:
            dead = [f"{p.name} (exit code {p.exitcode})" for p in processes if p.exitcode not in (None, 0)]
            if dead:
                for process in processes:
                    process.terminate()
                raise RuntimeError(f"arm {', '.join(dead)} ended without its summary") from None
            continue
        summaries[summary["name"]] = summary
    return summaries


def run_arms(options, flags: list[str]) -> list[dict]:
    """Every arm in a spawned process of its own; their summaries in the order of `--arms`."""
    context = multiprocessing.get_context("spawn")
    count = len(options.arms)
    meet = Rendezvous(Turns(count, context), context.Barrier(count), context.Barrier(count), context.Queue())
    processes = [
        context.Process(target=train_arm, args=(index, name, flags, options, meet), name=name)
        for index, name in enumerate(options.arms)
    ]
    for process in processes:
        process.start()
    summaries = collect_summaries(meet.results, processes)
    for process in processes:
        process.join()
    for summary in summaries.values():
        if "error" in summary:
            raise RuntimeError(f"arm {summary['name']} failed:\n{summary['error']}")
    return [summaries[name] for name in options.arms]


def main(argv=None) -> list[dict]:
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
    if len(set(options.arms)) < len(options.arms):
        parser.error(f"--arms {' '.join(options.arms)} names an arm twice")
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(name)s: %(message)s")
    torch.set_num_threads(options.threads)  # as the arms run (the machine line says it)
    busy = busy_share()
    run.prepare_data(parse_args([*BASE_FLAGS, *flags]))  # learns and caches the tokenizer the arms load
    arms = run_arms(options, flags)
    print(
        f"\n<!-- {describe_hardware('cpu').line()}; other work took {100 * busy:.0f}% of the CPU time at the start; "
        f"load average {open('/proc/loadavg').read().split()[0]} at the end; {options.turn} updates per turn -->"
    )
    print(table(arms))
    for arm in arms:
        if "scores" in arm:
            print(f"{arm['name']}: BLEU {arm['scores']['bleu']:.2f}, chrF++ {arm['scores']['chrf++']:.2f}")
    return arms


if __name__ == "__main__":
    main()
