"""The learning curve of one training run: validation loss and BLEU against updates and wall-clock minutes.

    python train_scripts/train.py --recipe multi30k-en-de-small --minutes 0 --max_steps 4000 \\
        --eval_strategy steps --eval_steps 250 --eval_bleu --save_strategy steps --save_steps 250 \\
        --output_dir outputs/curve 2>&1 | tee outputs/curve.log
    python train_scripts/learning_curve.py outputs/curve-checkpoints --log outputs/curve.log --plot curve.png

Reads the validation entries of the newest checkpoint's trainer_state.json (and, from the training log, the
elapsed time the progress bar showed at each evaluated update), prints them as a markdown table with the
relative change of the validation loss over the last fifth of training up to each point (the plateau
criterion of docs/results.md), and draws the curve.
"""

import argparse
import json
import re
from pathlib import Path

from hf_posenc.pipeline.cli import run_cli
from hf_posenc.pipeline.training.averaging import list_checkpoints


def evaluations(checkpoints_dir) -> list[dict]:
    """Validation entries (step, eval_loss, eval_bleu, ...) of the newest checkpoint's trainer state."""
    state = json.loads((list_checkpoints(checkpoints_dir)[-1] / "trainer_state.json").read_text())
    return [entry for entry in state["log_history"] if "eval_loss" in entry]


def elapsed_minutes(log_text: str, step: int) -> float | None:
    """Minutes the Trainer's progress bar showed when it reached `step` (first occurrence), if logged."""
    match = re.search(rf"\| {step}/\d+ \[(?:(\d+):)?(\d+):(\d+)", log_text)
    if not match:
        return None
    hours, minutes, seconds = (int(value or 0) for value in match.groups())
    return 60 * hours + minutes + seconds / 60


def loss_at(points: list[dict], step: float) -> float:
    """Validation loss at `step`, linearly interpolated between evaluations."""
    for before, after in zip(points, points[1:], strict=False):
        if before["step"] <= step <= after["step"]:
            share = (step - before["step"]) / (after["step"] - before["step"])
            return before["eval_loss"] + share * (after["eval_loss"] - before["eval_loss"])
    raise ValueError(f"step {step} is outside the evaluated range {points[0]['step']}..{points[-1]['step']}")


def last_fifth_change(points: list[dict], step: int) -> float | None:
    """Relative change of the validation loss from 0.8 x step to step (negative: still improving)."""
    if 0.8 * step < points[0]["step"]:
        return None
    return loss_at(points, step) / loss_at(points, 0.8 * step) - 1


COLUMNS = ["updates", "minutes", "validation loss", "change over the last fifth", "validation BLEU (greedy)"]


def table(points: list[dict], log_text: str) -> str:
    rows = ["| " + " | ".join(COLUMNS) + " |", "|" + " --- |" * len(COLUMNS)]
    for point in points:
        minutes, change = elapsed_minutes(log_text, point["step"]), last_fifth_change(points, point["step"])
        cells = [
            str(point["step"]),
            "" if minutes is None else f"{minutes:.1f}",
            f"{point['eval_loss']:.3f}",
            "" if change is None else f"{100 * change:+.1f}%",
            f"{point.get('eval_bleu', float('nan')):.2f}",
        ]
        rows.append("| " + " | ".join(cells) + " |")
    return "\n".join(rows)


def plot(points: list[dict], log_text: str, path) -> None:
    import matplotlib
    import numpy as np

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    steps = [p["step"] for p in points]
    figure, (loss_axis, bleu_axis) = plt.subplots(1, 2, figsize=(10, 3.6))
    loss_axis.plot(steps, [p["eval_loss"] for p in points], marker="o")
    loss_axis.set_ylabel("validation loss (label-smoothed)")
    bleu_axis.plot(steps, [p.get("eval_bleu") for p in points], marker="o", color="tab:green")
    bleu_axis.set_ylabel("validation BLEU (greedy)")
    minutes = [elapsed_minutes(log_text, step) for step in steps]
    for axis in (loss_axis, bleu_axis):
        axis.set_xlabel("updates")
        if all(m is not None for m in minutes):
            to_minutes = (lambda x: np.interp(x, steps, minutes), lambda x: np.interp(x, minutes, steps))
            axis.secondary_xaxis("top", functions=to_minutes).set_xlabel(
                "minutes (one thread, shared machine)"
            )
    figure.tight_layout()
    figure.savefig(path, dpi=110)
    plt.close(figure)


def main(argv=None):
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("checkpoints_dir", type=Path)
    parser.add_argument(
        "--log", type=Path, default=None, help="the run's training log (for wall-clock minutes)"
    )
    parser.add_argument("--plot", type=Path, default=None, help="write the curve as a PNG here")
    args = parser.parse_args(argv)
    points = evaluations(args.checkpoints_dir)
    if len(points) < 2:
        raise ValueError(
            f"{args.checkpoints_dir} holds {len(points)} validation entries; the curve needs two or more"
        )
    log_text = args.log.read_text() if args.log else ""
    print(table(points, log_text))
    if args.plot:
        plot(points, log_text, args.plot)


if __name__ == "__main__":
    run_cli(main)
