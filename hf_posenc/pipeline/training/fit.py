"""What a run checks before its first update, after the data and the model are built: the data's longest pair
fits the model's position tables (`check_longest_pair`), its largest batches fit the machine's memory
(`check_training_memory`) and its checkpoints fit their disk (`check_disk_space`; `full_disk` says afterwards
whether a failed update or save ran out of it). Each raises a ValueError that names the sizes and the setting to
change."""

import shutil
from pathlib import Path
from typing import TYPE_CHECKING

import torch

from ...base import PositionLimitError
from ..data.corpus import list_lengths
from ..evaluation.decoding import check_decoding_memory
from .hardware import SCORE_BYTES, check_memory, size_text
from .resume import last_complete_checkpoint
from .trainer import save_strategy

if TYPE_CHECKING:
    from .arguments import Arguments
    from .run import PreparedData


def check_longest_pair(model, data: "PreparedData") -> None:
    """The longest source (training, validation or test) and target go through the model once, before any
    training: a bounded position table too short for them is an error now, not when their batch comes up."""
    longest_source, longest_target = data.data_report["longest_source"], data.data_report["longest_target"]
    if data.valid is not None:
        longest_source = max(longest_source, int(list_lengths(data.valid, "input_ids").max()))
        longest_target = max(longest_target, int(list_lengths(data.valid, "labels").max()))
    test_source = max(len(ids) for ids in data.tokenizer(data.test.source)["input_ids"])
    source = torch.full((1, max(longest_source, test_source)), data.tokenizer.eos_token_id)
    target = torch.full((1, longest_target), data.tokenizer.pad_token_id)
    model.eval()
    try:
        with torch.no_grad():
            model(input_ids=source, decoder_input_ids=target)
    except PositionLimitError as error:
        raise ValueError(
            f"the longest pair of the data ({source.shape[1]} source, {target.shape[1]} target tokens) does not fit "
            f"the model: {error}"
        ) from None
    finally:
        model.train()


def check_training_memory(args: "Arguments", model, data: "PreparedData", padding: dict | None) -> None:
    """Refuse, before the first update, batches whose vocabulary-sized tensors alone need more memory than the
    machine has available (`check_memory`): the largest training batch's target positions (the first epoch's
    token-budget batches, or sentence batches of the mean target length) x the vocabulary x `SCORE_BYTES`, for
    every process of a CPU run, and the validation's beams where it is translated (`check_decoding_memory`)."""
    training, vocabulary = args.training, model.get_output_embeddings().out_features
    if padding is not None:
        positions, fix = padding["target"]["largest_batch"], "lower --max_tokens"
    else:
        lengths = list_lengths(data.train, "labels")  # (N,)
        positions = round(min(training.per_device_train_batch_size, len(lengths)) * float(lengths.mean()))
        fix = "lower --per_device_train_batch_size"
    processes = training.world_size if training.device.type == "cpu" else 1  # one machine's memory
    check_memory(
        processes * positions * vocabulary * SCORE_BYTES,
        training.device,
        f"training on batches of {positions} target positions x {vocabulary} tokens"
        + f" in each of {processes} processes" * (processes > 1),
        fix,
    )
    if training.predict_with_generate or args.run.eval_bleu:  # the validation's translations, while training
        beams = model.generation_config.num_beams or 1
        check_decoding_memory(training.per_device_eval_batch_size, beams, vocabulary, training.device)


# Bytes per parameter of a checkpoint (float32 weights and AdamW's two moments: model.safetensors and optimizer.pt;
# the default recipe's checkpoint is 92 MB for 7.58M parameters) and of the run folder's float32 weights.
CHECKPOINT_BYTES, WEIGHT_BYTES = 12, 4


def nearest_existing(path: Path) -> Path:
    """`path`, or the nearest folder above it that exists: the disk it will be written on."""
    path = Path(path).absolute()
    while not path.exists():
        path = path.parent
    return path


def files_bytes(paths) -> int:
    """The bytes of the files among `paths` (folders count nothing)."""
    return sum(path.stat().st_size for path in paths if path.is_file())


def kept_checkpoints(training) -> int:
    """The most checkpoints a run holds at once: `save_total_limit` + 1 (the Trainer writes a new one before it
    deletes the oldest), 1 without a limit, fewer where the update budget saves fewer, none with
    `--save_strategy no`."""
    strategy = save_strategy(training)
    if strategy == "no":
        return 0
    kept = training.save_total_limit + 1 if training.save_total_limit else 1
    if strategy == "steps" and training.max_steps > 0:
        kept = min(kept, training.max_steps // training.save_steps)
    return kept


def check_disk_space(args: "Arguments", model) -> None:
    """Refuse, before the first update, a run whose checkpoints (`kept_checkpoints` x `CHECKPOINT_BYTES` a
    parameter, less those of a resumed run, which the new ones replace) and run folder (its weights) do not fit in
    the free space of their disks (one need where both are on one disk), naming the sizes and the settings to
    change."""
    parameters, training = model.num_parameters(), args.training
    kept = kept_checkpoints(training)
    # a resumed run's checkpoints are rotated out as it saves new ones (an overwritten run's stay until the end)
    saved = args.checkpoints_dir.glob("checkpoint-*/**/*") if training.resume_from_checkpoint else ()
    rotated = files_bytes(saved)
    needs = {}  # disk -> (bytes, a folder on it)
    for folder, need in (
        (args.checkpoints_dir, kept * CHECKPOINT_BYTES * parameters - rotated),
        (Path(training.output_dir), WEIGHT_BYTES * parameters),
    ):
        place = nearest_existing(folder)
        total, _ = needs.get(place.stat().st_dev, (0, place))
        needs[place.stat().st_dev] = (total + need, place)
    for need, place in needs.values():
        free = shutil.disk_usage(place).free
        if need > free:
            raise ValueError(
                f"the run needs at least {size_text(need)} on the disk of {place} ({kept} checkpoints of "
                f"{size_text(CHECKPOINT_BYTES * parameters)} held at once, and the run folder's weights), and "
                f"{size_text(free)} are free: free space, keep fewer checkpoints (--save_total_limit), or write "
                "elsewhere (--output_dir)"
            )


def full_disk(args: "Arguments", model) -> str | None:
    """Why a failed update or save failed, where the checkpoints' disk has less free space than one checkpoint
    takes (the newest complete one, else `CHECKPOINT_BYTES` a parameter); None otherwise. (torch and safetensors
    each word a full disk their own way.)"""
    place = nearest_existing(args.checkpoints_dir)
    try:
        newest = Path(last_complete_checkpoint(args.checkpoints_dir))
        checkpoint = files_bytes(newest.rglob("*"))
    except ValueError:  # none yet
        checkpoint = CHECKPOINT_BYTES * model.num_parameters()
    free = shutil.disk_usage(place).free
    if free >= checkpoint:
        return None
    return (
        f"the disk of {place} is full ({size_text(free)} free, a checkpoint takes {size_text(checkpoint)}): free "
        "space, or keep fewer checkpoints (--save_total_limit)"
    )
