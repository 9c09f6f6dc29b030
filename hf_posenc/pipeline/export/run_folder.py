"""Where a run writes, and how it never destroys one: the run folder, its checkpoint folder, the dry-run copy
and the Hub upload.

- Before any work, every folder the run will write is checked: a file where a folder is expected, a location
  that cannot be written, an existing run (without `--resume_from_checkpoint` or `--overwrite_output_dir`) and
  a non-empty `--hub_dry_run` folder are errors naming the path.
- `--overwrite_output_dir` replaces a run only once the new one is complete: the old checkpoint folder is moved
  aside (`<run>-checkpoints.replaced`) when training starts, the old run folder is swapped for the new one in
  one rename, and only then is the old run removed. A run that fails leaves the old one where it was.
- The run folder is written into `<run>.partial` and renamed into place, so a folder under the run's name is
  always complete; a failed write (a full disk) removes the partial folder and names it.
- `export` (the last stage of a run) writes the Hub folder: weights, config + model code, tokenizer, generation
  config, model card, scores.json and the test translations. The card and scores.json name no absolute local
  path (a home, cache or data folder of this machine): a path under the data root is written relative to it,
  any other absolute path as its bare file name (`portable_paths`).
- The upload honours every Hub field the Trainer defines (token, private, revision); a private repository
  that exists as a public one is refused before anything is uploaded.
"""

import json
import logging
import os
import re
import shutil
import tempfile
from pathlib import Path

from safetensors import SafetensorError

from ..data.files import data_root
from .model_card import dataset_of, write_model_card

logger = logging.getLogger(__name__)

REPLACED = ".replaced"  # the suffix of an old run moved aside by --overwrite_output_dir
# An absolute POSIX path in a text: a '/' that starts the text or follows a space, bracket, quote, '=' or ',' (not
# the '/' of a URL, a Hub id or the " / " between a source and a target file), up to the next space.
ABSOLUTE_PATH = re.compile(r"(?<![^\s(\['\"=,])/[^/\s]+(?:/[^/\s]+)*")


def portable_paths(value, root: Path | None):
    """`value` (a string, or a dict or list of them, as scores.json holds) with every absolute path made
    portable: relative to the data root `root` where it lies under it, else its bare file name."""
    if isinstance(value, dict):
        return {key: portable_paths(item, root) for key, item in value.items()}
    if isinstance(value, list | tuple):
        return [portable_paths(item, root) for item in value]
    if not isinstance(value, str):
        return value
    roots = [] if root is None else [root.absolute(), root.resolve()]

    def portable(match: re.Match) -> str:
        path = Path(match.group())
        for base in roots:
            for candidate in (path, path.resolve()):
                if candidate.is_relative_to(base):
                    return candidate.relative_to(base).as_posix()
        return path.name

    return ABSOLUTE_PATH.sub(portable, value)


def check_writable(folder: Path, flag: str) -> None:
    """The folder exists (created if missing) and a file can be written in it; otherwise a ValueError naming it."""
    try:
        folder.mkdir(parents=True, exist_ok=True)
        with tempfile.TemporaryFile(dir=folder):
            pass
    except OSError as error:
        raise ValueError(f"{flag}: cannot write in {folder} ({error.strerror or error})") from None


def holds_files(folder: Path) -> bool:
    return folder.is_dir() and any(folder.iterdir())


def check_output_folders(
    output_dir: Path, checkpoints_dir: Path, resume: bool, overwrite: bool, dry_run
) -> None:
    """Refuse, before any work, every write that would fail late or mix or destroy a run."""
    for folder, name in (
        (output_dir, "--output_dir"),
        (checkpoints_dir, "the checkpoint folder of --output_dir"),
    ):
        if folder.exists() and not folder.is_dir():
            raise ValueError(f"{name} {folder} is a file, not a folder; choose another --output_dir")
    check_writable(output_dir.parent, "--output_dir")
    if dry_run is not None:
        dry_run = Path(dry_run)
        if dry_run.resolve() in (output_dir.resolve(), checkpoints_dir.resolve()):
            raise ValueError(f"--hub_dry_run {dry_run} is the run's own folder; give a new folder")
        if dry_run.exists() and (not dry_run.is_dir() or holds_files(dry_run)):
            raise ValueError(
                f"--hub_dry_run {dry_run} already exists and is not an empty folder; give a new folder"
            )
        check_writable(dry_run.parent, "--hub_dry_run")
    used = [folder for folder in (output_dir, checkpoints_dir) if holds_files(folder)]
    if not used or resume:
        return
    if not overwrite:
        raise ValueError(
            f"{' and '.join(map(str, used))} already hold a run; resume it with --resume_from_checkpoint last, "
            "replace it with --overwrite_output_dir, or choose another --output_dir"
        )
    aside = set_aside_path(checkpoints_dir)
    if aside.exists():
        raise ValueError(
            f"{aside} holds the checkpoints of a run that an earlier --overwrite_output_dir attempt set aside "
            f"and did not finish replacing; remove it, or move it back to {checkpoints_dir}, first"
        )


def set_aside_path(checkpoints_dir: Path) -> Path:
    return checkpoints_dir.with_name(checkpoints_dir.name + REPLACED)


def set_aside_checkpoints(checkpoints_dir: Path) -> Path | None:
    """--overwrite_output_dir, when training starts: the old checkpoints move aside, kept until the new run is
    written (`remove_set_aside`)."""
    if not holds_files(checkpoints_dir):
        return None
    aside = set_aside_path(checkpoints_dir)
    os.replace(checkpoints_dir, aside)
    logger.warning(
        "--overwrite_output_dir: the old checkpoints wait in %s until the new run is written", aside
    )
    return aside


def remove_set_aside(checkpoints_dir: Path) -> None:
    aside = set_aside_path(checkpoints_dir)
    if aside.exists():
        shutil.rmtree(aside)
        logger.info("removed the replaced run's checkpoints %s", aside)


def write_run_folder(output_dir: Path, write, checkpoints_dir: Path | None = None) -> Path:
    """`write(folder)` fills `<run>.partial`, which then replaces `output_dir` in one rename; the run it replaces
    is removed only after that. A failed write removes the partial folder and leaves `output_dir` as it was; the
    error advises resuming only where `checkpoints_dir` holds a checkpoint."""
    partial = output_dir.with_name(output_dir.name + ".partial")
    shutil.rmtree(partial, ignore_errors=True)
    try:
        write(partial)
    except (OSError, SafetensorError) as error:
        shutil.rmtree(partial, ignore_errors=True)
        raise ValueError(
            f"writing the run folder {partial} failed ({error}); {output_dir} is as it was. "
            + rerun_advice(checkpoints_dir)
        ) from None
    if output_dir.exists():
        replaced = output_dir.with_name(output_dir.name + REPLACED)
        shutil.rmtree(replaced, ignore_errors=True)
        os.replace(output_dir, replaced)
        os.replace(partial, output_dir)
        shutil.rmtree(replaced)
    else:
        os.replace(partial, output_dir)
    return output_dir


def rerun_advice(checkpoints_dir: Path | None) -> str:
    """What to run after a failed write: resume where a checkpoint is saved (the Trainer writes its
    trainer_state.json last), else train again."""
    saved = sorted(checkpoints_dir.glob("checkpoint-*/trainer_state.json")) if checkpoints_dir else []
    if saved:
        return (
            f"The trained weights are in {checkpoints_dir} ({saved[-1].parent.name} and earlier): free the space "
            "and run again with --resume_from_checkpoint last"
        )
    return "No checkpoint was saved, so the training must run again: free the space and rerun the command"


def copy_training_logs(checkpoints_dir: Path, folder: Path) -> None:
    """The files `--report_to` loggers wrote (TensorBoard's event files: `TENSORBOARD_LOGGING_DIR`, or the
    Trainer's `runs/` beside the checkpoints) go into the run folder's `runs/`, so they are uploaded with it."""
    logs = Path(os.environ.get("TENSORBOARD_LOGGING_DIR") or checkpoints_dir / "runs")
    if holds_files(logs):
        shutil.copytree(logs, folder / "runs")


def copy_dry_run(output_dir: Path, dry_run: Path) -> None:
    """The folder that would be uploaded, at a new path (checked empty before the run started)."""
    if holds_files(dry_run):  # filled while the run trained
        raise ValueError(
            f"--hub_dry_run {dry_run} was filled while this run trained; the run is in {output_dir}"
        )
    if dry_run.exists():
        dry_run.rmdir()
    shutil.copytree(output_dir, dry_run)


def push_to_hub(folder: Path, training, commit_message: str) -> str:
    """Upload `folder` with the Trainer's Hub fields: `hub_model_id`, `hub_token`, `hub_private_repo`,
    `hub_revision` (a branch, created if missing). Returns the commit URL. An upload the Hub refuses (no write
    access, a rate limit, a server error) is an error saying that the folder is written and safe, with the
    command that uploads it again."""
    from huggingface_hub.errors import HfHubHTTPError

    try:
        return upload_run_folder(folder, training, commit_message)
    except HfHubHTTPError as error:
        status = getattr(error.response, "status_code", None)
        again = [f"hf upload {training.hub_model_id} {folder} ."]
        again += [f"--revision {training.hub_revision}"] if training.hub_revision else []
        again += ["--private"] if training.hub_private_repo else []
        raise ValueError(
            f"the Hub refused the upload to {training.hub_model_id} (HTTP {status}: {str(error).splitlines()[0]}); "
            f"the run folder {folder} is written and safe. Upload it again, logged in with a token that may write "
            f"there (hf auth login), with: {' '.join(again)}"
        ) from None


def upload_run_folder(folder: Path, training, commit_message: str) -> str:
    from huggingface_hub import HfApi

    api = HfApi(token=training.hub_token)
    repo_id = training.hub_model_id
    private = training.hub_private_repo
    repo = api.create_repo(repo_id, private=private, exist_ok=True)
    repo_id = repo.repo_id
    if private and not api.repo_info(repo_id).private:
        raise ValueError(
            f"--hub_private_repo true, but the repository {repo_id} exists and is public; nothing was uploaded. "
            f"Make it private on the Hub or choose another --hub_model_id (the run is in {folder})"
        )
    if training.hub_revision:
        api.create_branch(repo_id, branch=training.hub_revision, exist_ok=True)
    commit = api.upload_folder(
        repo_id=repo_id,
        folder_path=str(folder),
        revision=training.hub_revision,
        commit_message=commit_message,
    )
    logger.info("uploaded %s to %s", folder, getattr(commit, "commit_url", repo_id))
    return getattr(commit, "commit_url", repo_id)


def card_fields(args, data, evaluation, record: dict) -> dict:
    """The model card's fields of a run (`write_model_card`), before its paths are made portable."""
    output_dir, training = Path(args.training.output_dir), args.training
    uses_tokens = args.data.max_tokens and args.model.architecture == "marian_posenc"
    batching = (
        f"{args.data.max_tokens} tokens"
        if uses_tokens
        else f"{training.per_device_train_batch_size} sentences"
    )
    averaged = f", average of {', '.join(evaluation.averaged)}" if evaluation.averaged else ""
    test_split = (
        args.data.test_split
        if args.data.test_source is None
        else Path(args.data.test_source).name.removesuffix(".gz").rsplit(".", 1)[0]
    )
    return dict(
        model_name=output_dir.name,
        source_lang=args.data.source_lang,
        target_lang=args.data.target_lang,
        parameters=f"{record['parameters'] / 1e6:.2f}M",
        repo_or_folder=training.hub_model_id or str(output_dir),
        test_split=test_split,
        longest_training=max(data.data_report["longest_source"], data.data_report["longest_target"]),
        data_note=f"Training: {training_data_text(data.data_report, data.train_text.name)} Test: {data.test.name}, "
        f"{len(data.test):,} pairs scored.",
        training=f"recipe `{args.run.recipe}`: {updates_text(record)}, {record['precision']}, {batching} per batch x "
        f"{training.gradient_accumulation_steps}, lr {training.learning_rate} {schedule_text(record, training)}, "
        f"label smoothing {training.label_smoothing_factor}{averaged}",
        hardware=f"{record['hardware']['line']}; {record['training_target_tokens_per_second']:.0f} target tokens/s, "
        f"MFU {100 * record['mfu']:.1f}% of the measured {record['precision']} matmul peak",
        warning=f"\n**Warning: degenerate output.** {' '.join(evaluation.degenerate)}\n"
        if evaluation.degenerate
        else "",
    )


def export(args, model, data, evaluation, record: dict) -> Path:
    """The Hub folder, written whole into place (`write_run_folder`); then the dry-run copy and the upload."""
    output_dir, training = Path(args.training.output_dir), args.training
    root = data_root(args.data.data_root)
    # the data's name: the `datasets` id, or the folder the files are in (multi30k for the shipped data)
    folder = Path(args.data.train_source).parent if args.data.train_source else Path(args.data.data_dir)
    dataset = dataset_of(
        args.data.hf_dataset or folder.name,
        args.data.source_lang,
        args.data.target_lang,
        portable_paths(data.train_text.name, root),
    )
    card = card_fields(args, data, evaluation, record)
    card, record = portable_paths(card, root), portable_paths(record, root)

    def write(folder: Path) -> None:
        model.save_pretrained(folder)
        data.tokenizer.save_pretrained(folder)
        (folder / "scores.json").write_text(json.dumps(record, indent=2) + "\n")
        (folder / f"test.hyp.{args.data.target_lang}").write_text("\n".join(evaluation.hypotheses) + "\n")
        write_model_card(folder, model, record, dataset, base_model=hub_base_model(args), **card)
        copy_training_logs(args.checkpoints_dir, folder)

    write_run_folder(output_dir, write, args.checkpoints_dir)
    remove_set_aside(args.checkpoints_dir)
    if args.run.hub_dry_run:
        copy_dry_run(output_dir, Path(args.run.hub_dry_run))
    if training.push_to_hub:
        push_to_hub(output_dir, training, commit_message="hf_posenc training run")
    return output_dir


def hub_base_model(args) -> str | None:
    """The Hub id of the model training started from (the card's `base_model`), or None: no pretrained model, or
    a local folder (which the Hub cannot link to, and whose path the card does not name)."""
    name = args.model.model_name_or_path
    if not name or Path(name).exists() or name.startswith((".", "/", "~")) or name.count("/") > 1:
        return None
    return name


def training_data_text(report: dict, name: str) -> str:
    """The training data as read, filtered and joined (`corpus.prepare_training_corpus`'s report)."""
    skipped, filters = report["skipped"], report["filters"]
    joined, ratio = report["concatenation"], filters["max_length_ratio"]
    return (
        f"{name}: {report['pairs_read']:,} pairs read, {report['pairs_kept']:,} kept; skipped "
        f"{skipped['empty']:,} with an empty side, {skipped['too_long']:,} longer than {filters['max_length']} tokens"
        + (f" and {skipped['length_ratio']:,} with a length ratio over {ratio:g}" if ratio else "")
        + (f"; {joined['joined']:,} examples join consecutive pairs" if joined else "")
        + f"; {report['examples']:,} training examples."
    )


def schedule_text(record: dict, training) -> str:
    """The schedule the run used: the plan for its time budget, or the Trainer's fixed one."""
    plan = record.get("schedule_plan")
    if plan and plan["end"]:
        replans = f", re-planned {plan['replans']} times as the speed changed" if plan["replans"] else ""
        return (
            f"planned for the time budget (warm-up {plan['warmup_steps']}, linear decay to {plan['floor']:g} x "
            f"at update {plan['end']}{replans})"
        )
    if plan:
        return f"linear warm-up over {plan['warmup_steps']} (the budget ended before the speed was measured)"
    schedule = getattr(training.lr_scheduler_type, "value", training.lr_scheduler_type)
    return f"{schedule} (warm-up {training.warmup_steps})"


def updates_text(record: dict) -> str:
    """'1003 updates in 16.0 min', or for a resumed run how many of them this attempt made, and in what time."""
    if record["resumed_from"]:
        return (
            f"{record['steps']} updates ({record['updates_this_attempt']} of them in this attempt's "
            f"{record['train_minutes']:.1f} min, resumed from {record['resumed_from']})"
        )
    return f"{record['steps']} updates in {record['train_minutes']:.1f} min"
