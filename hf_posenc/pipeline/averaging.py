"""Checkpoint averaging (fairseq's `average_checkpoints.py`, which the HF stack lacks).

Paper 1 averages the last 5 checkpoints; paper 2 takes the checkpoint with the best validation perplexity
and the ones that follow it. Tensors are read from safetensors only.
"""

import json
import math
import re
from pathlib import Path

import safetensors
import torch
from safetensors import safe_open

CHECKPOINT_PATTERN = re.compile(r"^checkpoint-(\d+)$")


def list_checkpoints(checkpoints_dir) -> list[Path]:
    """`checkpoint-<step>` folders of a Trainer run, by step."""
    checkpoints_dir = Path(checkpoints_dir)
    if not checkpoints_dir.is_dir():
        raise FileNotFoundError(f"checkpoint folder {checkpoints_dir} does not exist")
    found = [p for p in checkpoints_dir.iterdir() if CHECKPOINT_PATTERN.match(p.name) and p.is_dir()]
    return sorted(found, key=lambda p: int(CHECKPOINT_PATTERN.match(p.name).group(1)))


def validation_perplexities(checkpoint: Path) -> dict[int, float]:
    """step -> validation perplexity, from the Trainer state saved with a checkpoint."""
    state = json.loads((checkpoint / "trainer_state.json").read_text())
    return {
        entry["step"]: math.exp(entry["eval_loss"]) for entry in state["log_history"] if "eval_loss" in entry
    }


def select_checkpoints(checkpoints_dir, last: int | None = None, best: int | None = None) -> list[Path]:
    """The last `last` checkpoints, or the best-perplexity checkpoint and its `best - 1` followers."""
    if (last is None) == (best is None):
        raise ValueError("choose exactly one of last=N or best=N")
    checkpoints = list_checkpoints(checkpoints_dir)
    wanted = last if last is not None else best
    if wanted < 1:
        raise ValueError(f"the number of checkpoints to average must be at least 1, got {wanted}")
    if len(checkpoints) < wanted:
        raise ValueError(f"asked to average {wanted} checkpoints, {checkpoints_dir} has {len(checkpoints)}")
    if last is not None:
        return checkpoints[-last:]
    perplexity = validation_perplexities(checkpoints[-1])
    steps = [int(CHECKPOINT_PATTERN.match(p.name).group(1)) for p in checkpoints]
    missing = [s for s in steps if s not in perplexity]
    if missing:
        raise ValueError(f"no validation loss logged at checkpoint steps {missing}; evaluate at every save")
    start = min(range(len(steps) - wanted + 1), key=lambda i: perplexity[steps[i]])
    return checkpoints[start : start + wanted]


# config.json entries that may differ between checkpoints of one run
RUN_SPECIFIC_CONFIG_KEYS = {"_name_or_path", "transformers_version", "dtype", "torch_dtype"}


def checkpoint_config(checkpoint: Path) -> dict:
    path = checkpoint / "config.json"
    if not path.is_file():
        raise FileNotFoundError(f"{path} is missing: {checkpoint} is not a complete model checkpoint")
    return {k: v for k, v in json.loads(path.read_text()).items() if k not in RUN_SPECIFIC_CONFIG_KEYS}


def average_state_dicts(checkpoints: list[Path]) -> dict[str, torch.Tensor]:
    """Element-wise mean of the floating-point tensors of `model.safetensors` in each checkpoint (fp32 sums).

    The checkpoints must be of one model: the same config (two models with the same tensor names, e.g.
    sinusoidal and ALiBi, are not averaged) and the same tensor names and shapes; errors name the paths."""
    if not checkpoints:
        raise ValueError("no checkpoints to average")
    reference = checkpoint_config(checkpoints[0])
    total: dict[str, torch.Tensor] = {}
    for checkpoint in checkpoints:
        config = checkpoint_config(checkpoint)
        differing = sorted(
            key for key in reference.keys() | config.keys() if reference.get(key) != config.get(key)
        )
        if differing:
            raise ValueError(
                f"{checkpoint} is another model than {checkpoints[0]}: config fields {differing} differ "
                f"({', '.join(f'{k}={reference.get(k)!r} vs {config.get(k)!r}' for k in differing[:3])})"
            )
        path = checkpoint / "model.safetensors"
        if not path.is_file():
            raise FileNotFoundError(f"{path} is missing (only safetensors checkpoints are averaged)")
        try:
            with safe_open(path, "pt") as weights:
                keys = set(weights.keys())
                if total and keys != set(total):
                    raise ValueError(f"{path} holds different tensors than {checkpoints[0]}")
                for key in keys:
                    tensor = weights.get_tensor(key)
                    if key in total and tensor.shape != total[key].shape:
                        raise ValueError(
                            f"{path}: {key} has shape {tuple(tensor.shape)}, {checkpoints[0]} has {tuple(total[key].shape)}"
                        )
                    value = tensor.float() if tensor.is_floating_point() else tensor
                    total[key] = total[key] + value if key in total and tensor.is_floating_point() else value
        except (OSError, safetensors.SafetensorError) as error:
            raise ValueError(f"{path} cannot be read (truncated or damaged?): {error}") from None
    return {
        key: (value / len(checkpoints) if value.is_floating_point() else value)
        for key, value in total.items()
    }


def average_into(model, checkpoints: list[Path]) -> None:
    """Load the average of `checkpoints` into `model`, whose tensors they must hold exactly (tied ones re-tied)."""
    missing, unexpected = model.load_state_dict(average_state_dicts(checkpoints), strict=False)
    # tied weights are saved once; stock Marian does not save its fixed sinusoid tables
    tied = set(getattr(model, "_tied_weights_keys", None) or {}) | set(model._keys_to_ignore_on_save or [])
    if unexpected or set(missing) - tied:
        raise ValueError(
            f"the checkpoints {[str(c) for c in checkpoints]} do not fit the model: missing {sorted(set(missing) - tied)}, "
            f"unexpected {unexpected}"
        )
    model.tie_weights()
