"""Resuming a run: which checkpoint, and whether this run may continue it.

`--resume_from_checkpoint last` takes the newest complete checkpoint (the Trainer writes trainer_state.json
last, so one without it, or with unreadable weights, was cut off while being written and is skipped). A fresh
run records the settings that shape its trajectory in the checkpoint folder (`run_settings.json`); a resumed
run must repeat them: another learning rate, schedule, data or architecture would be ignored by the restored
optimizer and scheduler, or fail deep inside them.
"""

import json
import logging
import pickle
from pathlib import Path

import torch
from safetensors import SafetensorError, safe_open

from .arguments import Arguments
from .averaging import RUN_SPECIFIC_CONFIG_KEYS, config_defaults
from .trainer import save_strategy

logger = logging.getLogger("train")
SETTINGS_FILE = "run_settings.json"  # in the checkpoint folder: what a resumed run must repeat
# config.json fields that saving or training set, not the run's choice
CHECKPOINT_ONLY_CONFIG_KEYS = {"architectures", "auto_map", "use_cache"}


# What shapes the training trajectory: a resumed run must repeat these (the budget may change).
RESUMED_TRAINING_FIELDS = (
    "learning_rate",
    "lr_scheduler_type",
    "lr_scheduler_kwargs",
    "warmup_steps",
    "weight_decay",
    "adam_beta1",
    "adam_beta2",
    "adam_epsilon",
    "max_grad_norm",
    "label_smoothing_factor",
    "gradient_accumulation_steps",
    "per_device_train_batch_size",
    "seed",
    "optim",
)
RESUMED_DATA_FIELDS = (
    "train_source",
    "train_target",
    "hf_dataset",
    "hf_config",
    "data_dir",
    "train_split",
    "source_lang",
    "target_lang",
    "train_limit",
    "tokenizer_name_or_path",
    "vocab_size",
    "max_length",
    "max_train_length",
    "concat_probability",
    "concat_group_sizes",
    "max_tokens",
)


def run_settings(args: Arguments, model) -> dict:
    """The settings that a resumed run must share with the run it continues (JSON-comparable)."""
    training = {name: getattr(args.training, name) for name in RESUMED_TRAINING_FIELDS}
    config = {k: v for k, v in model.config.to_dict().items() if k not in RUN_SPECIFIC_CONFIG_KEYS}
    settings = {
        "training": training,
        "data": {name: getattr(args.data, name) for name in RESUMED_DATA_FIELDS},
        # the model trained from, which brings the tokenizer when --tokenizer_name_or_path is not given
        "start": {"model_name_or_path": args.model.model_name_or_path},
        "model": config,
    }
    return json.loads(json.dumps(settings, default=lambda value: getattr(value, "value", str(value))))


def check_resume_settings(args: Arguments, model, resume: str | None) -> None:
    """A fresh run records its settings; a resumed one must have those of the run that wrote the checkpoint:
    another learning rate, schedule, data or architecture would be ignored by the restored optimizer and
    scheduler, or fail deep inside them. The checkpoint may be another run's, or its run's record may be gone:
    then what the checkpoint holds (its config.json, its scheduler's learning rate) is compared."""
    path = args.checkpoints_dir / SETTINGS_FILE
    settings = run_settings(args, model)
    if resume is not None:
        saved, origin, complete = saved_settings(Path(resume), type(model.config))
        if complete:  # a config field added after the run was recorded: that run had its default
            defaults = config_defaults(model.config.model_type)
            missing = settings["model"].keys() - saved["model"].keys()
            saved["model"] |= {name: defaults[name] for name in missing if name in defaults}
        differing = [
            f"{name}={settings[group].get(name)!r} (the run resumed: {saved[group].get(name)!r})"
            for group in saved
            for name in sorted(settings[group].keys() | saved[group].keys() if complete else saved[group])
            if settings[group].get(name) != saved[group].get(name)
        ]
        if differing:
            raise ValueError(
                f"--resume_from_checkpoint: this run's settings differ from those of {origin}: "
                f"{'; '.join(differing)}. Resume with the same settings, or start a new run (another --output_dir)"
            )
        if path.is_file():
            return
    args.checkpoints_dir.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(settings, indent=2) + "\n")


def saved_settings(checkpoint: Path, config_class) -> tuple[dict, str, bool]:
    """The settings of the run that wrote `checkpoint`, where they were read, and whether they are all of them:
    its run's record (`run_settings.json` beside it), else those the checkpoint holds itself: the architecture
    (config.json, read through `config_class` for the defaults it leaves out) and the learning rate (the
    scheduler's base rate)."""
    record = checkpoint.parent / SETTINGS_FILE
    if record.is_file():
        return json.loads(record.read_text()), f"the run in {checkpoint.parent}", True
    logger.warning("%s is missing: comparing this run with what %s holds", record, checkpoint)
    saved = {}
    if (checkpoint / "config.json").is_file():
        config = config_class.from_json_file(checkpoint / "config.json").to_dict()
        ignored = RUN_SPECIFIC_CONFIG_KEYS | CHECKPOINT_ONLY_CONFIG_KEYS
        saved["model"] = json.loads(json.dumps({k: v for k, v in config.items() if k not in ignored}))
    try:
        base_rates = torch.load(checkpoint / "scheduler.pt", weights_only=True).get("base_lrs")
    except (OSError, RuntimeError, pickle.UnpicklingError) as error:  # absent, or not plain data
        logger.warning("cannot read the learning rate of %s (%s): it is not compared", checkpoint, error)
        base_rates = None
    if base_rates:
        saved["training"] = {"learning_rate": base_rates[0]}
    return saved, f"checkpoint {checkpoint}", False


def resume_checkpoint(args: Arguments) -> str | None:
    """The checkpoint to resume from: a folder (checked), or for "last" the newest complete one. The Trainer
    writes trainer_state.json last, so a checkpoint without it, or whose weights cannot be read, was cut off
    while being written: it is skipped, and the log says so."""
    resume = args.training.resume_from_checkpoint
    if resume is None:
        return None
    if resume != "last":
        problem = checkpoint_problem(Path(resume))
        if problem:
            raise ValueError(f"--resume_from_checkpoint {resume}: {problem}")
        return resume
    return last_complete_checkpoint(args.checkpoints_dir)


def last_complete_checkpoint(folder: Path) -> str:
    """The newest Trainer checkpoint in `folder` that is complete (`checkpoint_problem`); a newer one cut off
    while being written (a run killed mid-save) is skipped, and the log says so."""
    checkpoints = sorted(folder.glob("checkpoint-*"), key=lambda p: int(p.name.split("-")[-1]))
    for checkpoint in reversed(checkpoints):
        problem = checkpoint_problem(checkpoint)
        if not problem:
            return str(checkpoint)
        logger.warning("%s is incomplete (%s): trying the one before", checkpoint, problem)
    raise ValueError(f"--resume_from_checkpoint last: no complete checkpoint in {folder}")


def how_to_resume(folder: Path, training) -> str:
    """How a run stopped before its end goes on: the checkpoint `--resume_from_checkpoint last` continues from
    (`last_complete_checkpoint`), or that none is complete yet, or that the run saves none (`training`: its
    `Seq2SeqTrainingArguments`)."""
    strategy = save_strategy(training)
    if strategy == "no":
        return "it saves no checkpoints (--save_strategy no): start it again with --overwrite_output_dir"
    try:
        return f"--resume_from_checkpoint last continues it from {last_complete_checkpoint(folder)}"
    except ValueError:
        every = f" (one every {training.save_steps} updates)" if strategy == "steps" else ""
        return f"no checkpoint is complete yet{every}: start it again with --overwrite_output_dir"


def checkpoint_problem(checkpoint: Path) -> str | None:
    """Why a Trainer checkpoint cannot be resumed from, or None."""
    if not (checkpoint / "trainer_state.json").is_file():
        return "no trainer_state.json"
    try:
        with safe_open(checkpoint / "model.safetensors", "pt") as weights:
            weights.keys()
    except (OSError, SafetensorError) as error:
        return f"{checkpoint / 'model.safetensors'} cannot be read: {error}"
    return None
