"""Checkpoint averaging (fairseq's `average_checkpoints.py`, which the HF stack lacks).

Paper 1 averages the last 5 checkpoints; paper 2 takes the checkpoint with the best validation perplexity
and the ones that follow it. Tensors are read from safetensors only. Checkpoints of different models (configs)
or different tokenizers are refused; the averaged folder is written whole (`check_output_dir`,
`write_whole`), never into its inputs or over a finished run.
"""

import argparse
import contextlib
import hashlib
import json
import math
import re
import shutil
import uuid
from pathlib import Path

import safetensors
import torch
from safetensors import safe_open
from transformers import AutoConfig, AutoModelForSeq2SeqLM, AutoTokenizer

from ..cli import check_number

CHECKPOINT_PATTERN = re.compile(r"^checkpoint-(\d+)$")


def list_checkpoints(checkpoints_dir) -> list[Path]:
    """`checkpoint-<step>` folders of a Trainer run, by step."""
    checkpoints_dir = Path(checkpoints_dir)
    if checkpoints_dir.is_file():
        raise NotADirectoryError(
            f"checkpoint folder {checkpoints_dir} is a file; give the folder of checkpoint-<step>"
        )
    if not checkpoints_dir.is_dir():
        raise FileNotFoundError(f"checkpoint folder {checkpoints_dir} does not exist")
    found = [p for p in checkpoints_dir.iterdir() if CHECKPOINT_PATTERN.match(p.name) and p.is_dir()]
    return sorted(found, key=lambda p: int(CHECKPOINT_PATTERN.match(p.name).group(1)))


def read_json(path: Path):
    """The JSON content of a checkpoint's file; one that cannot be read is an error naming it."""
    try:
        return json.loads(path.read_text(encoding="utf-8"))
    except (UnicodeDecodeError, json.JSONDecodeError) as error:
        raise ValueError(
            f"{path} is not readable JSON ({error}): the checkpoint is damaged; leave it out of the average (move "
            "it out of the folder) or save it again"
        ) from None


def validation_perplexities(checkpoint: Path) -> dict[int, float]:
    """step -> validation perplexity, from the Trainer state saved with a checkpoint."""
    path = checkpoint / "trainer_state.json"
    if not path.is_file():
        raise FileNotFoundError(
            f"{path} is missing: the best checkpoint is chosen by the validation losses it logs"
        )
    state = read_json(path)
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
    """A checkpoint's config.json, with the defaults of its model type's config class for the fields it lacks
    (a checkpoint saved before the class gained a field ran with the field's default)."""
    path = checkpoint / "config.json"
    if not path.is_file():
        raise FileNotFoundError(f"{path} is missing: {checkpoint} is not a complete model checkpoint")
    saved = read_json(path)
    defaults = config_defaults(saved.get("model_type"))
    return {k: v for k, v in (defaults | saved).items() if k not in RUN_SPECIFIC_CONFIG_KEYS}


def config_defaults(model_type: str | None) -> dict:
    """Every field of `model_type`'s config class at its default, as config.json writes it; {} for a model type
    this process does not know. A config saved before its class gained a field ran with that field's default."""
    try:
        return json.loads(AutoConfig.for_model(model_type).to_json_string(use_diff=False))
    except ValueError:
        return {}


# The files a saved tokenizer consists of (fast and slow tokenizers, BPE, WordPiece, SentencePiece, Marian's spm).
TOKENIZER_FILES = (
    "tokenizer*.json",
    "special_tokens_map.json",
    "added_tokens.json",
    "vocab*",
    "merges.txt",
    "*.spm",
    "*.model",
)
# tokenizer_config.json entries that record how a tokenizer was loaded, not what it does
LOADING_TOKENIZER_KEYS = {"is_local", "local_files_only", "name_or_path", "_commit_hash"}


def tokenizer_fingerprint(checkpoint: Path) -> dict[str, str]:
    """file name -> sha256 of each tokenizer file of a checkpoint (tokenizer_config.json without its loading
    entries): two checkpoints of one run have the same; {} when it holds no tokenizer."""
    fingerprint = {}
    for path in sorted({path for pattern in TOKENIZER_FILES for path in checkpoint.glob(pattern)}):
        content = path.read_bytes()
        if path.name == "tokenizer_config.json":
            settings = {k: v for k, v in read_json(path).items() if k not in LOADING_TOKENIZER_KEYS}
            content = json.dumps(settings, sort_keys=True).encode()
        fingerprint[path.name] = hashlib.sha256(content).hexdigest()[:12]
    return fingerprint


def check_same_tokenizer(checkpoints: list[Path]) -> None:
    """Refuse checkpoints whose tokenizer files differ from the first's, naming the checkpoint and the files:
    the same vocabulary size does not make the same tokenizer, and averaged embeddings of two vocabularies
    are garbage."""
    reference = tokenizer_fingerprint(checkpoints[0])
    for checkpoint in checkpoints[1:]:
        fingerprint = tokenizer_fingerprint(checkpoint)
        differing = [
            f"{name} (sha256 {reference.get(name, 'absent')} vs {fingerprint.get(name, 'absent')})"
            for name in sorted(reference.keys() | fingerprint.keys())
            if reference.get(name) != fingerprint.get(name)
        ]
        if differing:
            raise ValueError(
                f"{checkpoint} has another tokenizer than {checkpoints[0]}: {', '.join(differing)} differ; "
                "only checkpoints of one run, with one tokenizer, are averaged"
            )


def check_one_model(checkpoints: list[Path]) -> None:
    """Refuse checkpoints that are not of one model: a config (but for its run-specific entries) or tokenizer
    files that differ from the first checkpoint's; the error names both checkpoints and what differs."""
    if not checkpoints:
        raise ValueError("no checkpoints to average")
    reference = checkpoint_config(checkpoints[0])
    for checkpoint in checkpoints[1:]:
        config = checkpoint_config(checkpoint)
        differing = sorted(
            key for key in reference.keys() | config.keys() if reference.get(key) != config.get(key)
        )
        if differing:
            raise ValueError(
                f"{checkpoint} is another model than {checkpoints[0]}: config fields {differing} differ "
                f"({', '.join(f'{k}={reference.get(k)!r} vs {config.get(k)!r}' for k in differing[:3])})"
            )
    check_same_tokenizer(checkpoints)


def average_state_dicts(checkpoints: list[Path]) -> dict[str, torch.Tensor]:
    """Element-wise mean of the floating-point tensors of `model.safetensors` in each checkpoint (fp32 sums).

    The checkpoints must be of one model: the same config (two models with the same tensor names, e.g.
    sinusoidal and ALiBi, are not averaged), the same tokenizer files (`check_same_tokenizer`: two vocabularies
    of one size would pass every other check) and the same tensor names and shapes; errors name the paths.
    Configs and tokenizers are compared (`check_one_model`) before any tensor is read."""
    check_one_model(checkpoints)
    total: dict[str, torch.Tensor] = {}
    for checkpoint in checkpoints:
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


# Files that make a folder a finished model or run (train.py's scores, card and translations, the weights).
RUN_FILES = ("scores.json", "README.md", "model.safetensors", "config.json", "evaluation.json")


def check_output_dir(output_dir, checkpoints_dir, chosen: list[Path], overwrite: bool = False) -> Path:
    """The output folder of an averaging, refused (naming both folders) when it is one of the checkpoints, lies
    inside the checkpoints folder or holds it (writing there would change or delete the inputs, even with
    `overwrite`), or already holds files and `overwrite` is not set (new weights beside an old run's scores,
    card and translations would be a mixture no one asked for)."""
    output, source = Path(output_dir), Path(checkpoints_dir)
    resolved, source_resolved = output.resolve(), source.resolve()
    for checkpoint in chosen:
        if resolved == checkpoint.resolve():
            raise ValueError(
                f"--output_dir {output} is {checkpoint}, one of the checkpoints being averaged; write the "
                f"average to a folder outside {source}"
            )
    if resolved.is_relative_to(source_resolved):
        raise ValueError(
            f"--output_dir {output} is inside the checkpoints folder {source} that is being averaged; write "
            f"the average to a folder outside it"
        )
    if source_resolved.is_relative_to(resolved):
        raise ValueError(
            f"--output_dir {output} holds the checkpoints folder {source} that is being averaged; write the "
            f"average to a folder outside it"
        )
    if output.exists() and not output.is_dir():
        raise NotADirectoryError(f"--output_dir {output} is a file, not a folder")
    present = sorted(path.name for path in output.iterdir()) if output.is_dir() else []
    if present and not overwrite:
        present.sort(key=lambda name: name not in RUN_FILES)  # what makes it a run first
        shown = ", ".join(present[:5]) + (f" and {len(present) - 5} more" if len(present) > 5 else "")
        raise ValueError(
            f"--output_dir {output} already holds a model or run ({shown}); averaged weights there would sit "
            "beside its old scores, card and translations. Choose a new folder, or pass --overwrite_output_dir "
            "to replace the whole folder"
        )
    return output


@contextlib.contextmanager
def write_whole(output_dir):
    """Yield an empty folder beside `output_dir` to write into; when the block ends without an error, it takes
    the place of `output_dir` (an old folder of that name is moved aside first and deleted last, so no moment
    leaves neither, and nothing of the old folder survives in the new one). On an error it is deleted and
    `output_dir` is left as it was."""
    output = Path(output_dir)
    output.parent.mkdir(parents=True, exist_ok=True)
    partial = output.with_name(f".{output.name}.partial-{uuid.uuid4().hex[:8]}")
    partial.mkdir()
    try:
        yield partial
    except BaseException:
        shutil.rmtree(partial, ignore_errors=True)
        raise
    old = output.with_name(f".{output.name}.replaced-{uuid.uuid4().hex[:8]}")
    if output.exists():
        output.rename(old)
    partial.rename(output)
    if old.exists():
        shutil.rmtree(old)


AVERAGE_HELP = """Average Trainer checkpoints into a normal model folder.

    hf-posenc-average RUN-checkpoints --last 5 --output_dir outputs/avg
    hf-posenc-average RUN-checkpoints --best 5 --output_dir outputs/avg

`--last N`: the last N checkpoints (paper 1). `--best N`: the checkpoint with the lowest validation
perplexity and the N-1 after it (paper 2). The folder gets the averaged weights plus the config, model
code, generation config and tokenizer of the newest checkpoint, and nothing else.

The output folder must be new (or empty) unless `--overwrite_output_dir` is given; then it is replaced whole.
It is written beside its final place and renamed into it, so it never holds a mixture of old and new files.
It may not be one of the checkpoints, lie inside the checkpoints folder or hold it. Checkpoints of different
configs or tokenizers are refused. All of this is checked before a tensor is read.
"""


def average_into_folder(checkpoints_dir, output_dir, last=None, best=None, overwrite=False):
    chosen = select_checkpoints(checkpoints_dir, last=last, best=best)
    output = check_output_dir(output_dir, checkpoints_dir, chosen, overwrite=overwrite)
    if not tokenizer_fingerprint(chosen[-1]):
        raise FileNotFoundError(
            f"{chosen[-1]} holds no tokenizer (tokenizer.json): the averaged folder takes the newest "
            "checkpoint's tokenizer"
        )
    check_one_model(chosen)
    model = AutoModelForSeq2SeqLM.from_pretrained(chosen[-1])
    average_into(model, chosen)
    with write_whole(output) as folder:
        model.save_pretrained(folder)
        AutoTokenizer.from_pretrained(chosen[-1]).save_pretrained(folder)
    return chosen


def average_main(argv=None):
    parser = argparse.ArgumentParser(
        description=AVERAGE_HELP, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("checkpoints_dir", help="the folder of checkpoint-<step> folders (RUN-checkpoints)")
    group = parser.add_mutually_exclusive_group(required=True)
    group.add_argument("--last", type=int, help="average the last N checkpoints")
    group.add_argument("--best", type=int, help="the best-perplexity checkpoint and the N-1 after it")
    parser.add_argument("--output_dir", required=True, help="a new folder for the averaged model")
    parser.add_argument(
        "--overwrite_output_dir",
        action="store_true",
        help="replace an --output_dir that already holds files (the whole folder: nothing old stays)",
    )
    args = parser.parse_args(argv)
    flag = "--last" if args.last is not None else "--best"
    try:
        check_number(flag, args.last if args.last is not None else args.best, minimum=1, integer=True)
    except ValueError as error:
        parser.error(str(error))
    chosen = average_into_folder(
        args.checkpoints_dir,
        args.output_dir,
        last=args.last,
        best=args.best,
        overwrite=args.overwrite_output_dir,
    )
    print(f"averaged {', '.join(p.name for p in chosen)} -> {args.output_dir}")
