"""Train and evaluate a translation model, and write a Hub-ready folder.

    python train_scripts/train.py                                   # recipe multi30k-en-de-small, sinusoidal
    python train_scripts/train.py --recipe wmt14-en-de-base --position_encoding learned
    python train_scripts/train.py --recipe multi30k-en-de-tiny --encoder_self_attention rposnet --minutes 2

Every setting is a field of one of four dataclasses, parsed by `HfArgumentParser`: `RunArguments` (budget,
precision, evaluation and export), `DataArguments`, `ModelArguments` (the module choices and model size;
unset fields keep the defaults of `MarianPosEncConfig`) and transformers' own `Seq2SeqTrainingArguments`
(any Trainer field: learning rate, schedule, Adam, checkpoints, logging, seed, ...). A recipe
(`train_scripts/recipes/<name>.yaml`, which may `extends:` another) sets any of them; the command line wins.

Stages: `prepare_data` (read and validate the text, joint BPE, tokenise) -> `build_model` (config from what
was set, precision and attention backend chosen by measuring this machine) -> `train` (`Seq2SeqTrainer`,
token-budget batches, time and update budgets, checkpoints) -> `evaluate` (checkpoint averaging, decoding the
test set with the model's saved generation config, sacreBLEU BLEU and chrF++, a check for degenerate output)
-> `export` (the Hub folder: weights, config + model code, tokenizer, generation config, model card,
scores.json, translations; written to a temporary folder and renamed, then pushed if asked).

`--architecture stock_marian` trains `transformers.MarianMTModel` with the Trainer's own sentence batches on
the same data, budget and evaluation (the baseline of `make train-stock`).
"""

import dataclasses
import json
import logging
import os
import shutil
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Literal

import torch
import transformers
import yaml
from safetensors import SafetensorError, safe_open
from transformers import (
    DataCollatorForSeq2Seq,
    HfArgumentParser,
    MarianConfig,
    MarianMTModel,
    Seq2SeqTrainingArguments,
)
from transformers.trainer_callback import ProgressCallback

from hf_posenc import MarianPosEncConfig, MarianPosEncForConditionalGeneration
from hf_posenc.modeling_marian_posenc import MAX_NEW_TOKENS_OVER_SOURCE, PAPER_1_DECODING
from hf_posenc.pipeline.augmentation import check_augmentation, concatenate_consecutive
from hf_posenc.pipeline.averaging import average_into, list_checkpoints, select_checkpoints
from hf_posenc.pipeline.batching import TokenBudgetBatchSampler
from hf_posenc.pipeline.cli import run_cli
from hf_posenc.pipeline.data import ParallelText, read_hf_translation, read_parallel, read_split
from hf_posenc.pipeline.evaluation import (
    degenerate_output,
    encoder_token_cosine,
    score_translations,
    translate,
)
from hf_posenc.pipeline.hardware import (
    choose_attention_backend,
    choose_precision,
    describe_hardware,
    matmul_peak_flops,
    model_flops_per_target_token,
)
from hf_posenc.pipeline.model_card import MULTI30K_NOTE, write_model_card
from hf_posenc.pipeline.progress import TrainingProgressCallback, UpdateBudgetCheck
from hf_posenc.pipeline.tokenization import train_joint_bpe
from hf_posenc.pipeline.training import (
    TimeBudgetCallback,
    TranslationTrainer,
    leave_process_group,
    tokenize_parallel,
    translation_metrics,
)

logger = logging.getLogger("train")
REPO = Path(__file__).resolve().parents[1]
RECIPES = REPO / "train_scripts" / "recipes"


@dataclass
class RunArguments:
    recipe: str = field(default="multi30k-en-de-small", metadata={"help": "a train_scripts/recipes name"})
    description: str = field(default="", metadata={"help": "what the recipe is (set by recipes)"})
    minutes: float = field(default=0.0, metadata={"help": "wall-clock training budget in minutes (0: none)"})
    precision: Literal["auto", "bf16", "fp16", "fp32"] = field(
        default="auto",
        metadata={"help": "auto: bf16 on CUDA where supported; on CPU only if measured faster"},
    )
    threads: int | None = field(default=None, metadata={"help": "torch CPU threads (default: all cores)"})
    eval_bleu: bool = field(default=False, metadata={"help": "score generated validation translations too"})
    average_last: int = field(default=0, metadata={"help": "average the last N checkpoints (paper 1)"})
    average_best: int = field(default=0, metadata={"help": "average the best-perplexity one + N-1 after it"})
    overwrite_output_dir: bool = field(default=False, metadata={"help": "replace an existing run's folders"})
    fail_on_degenerate: bool = field(
        default=True, metadata={"help": "exit non-zero when the translations are degenerate"}
    )
    examples: int = field(default=5, metadata={"help": "example translations to print"})
    hub_dry_run: str | None = field(
        default=None, metadata={"help": "write the folder that would be uploaded"}
    )


@dataclass
class DataArguments:
    """Explicit files win over `hf_dataset`, which wins over the `data_dir` splits."""

    data_dir: str = str(REPO.parent / "shared" / "data" / "multi30k")
    source_lang: str = "en"
    target_lang: str = "de"
    train_split: str = "train"
    valid_split: str = "val"
    test_split: str = "test_2016_flickr"
    train_source: str | None = None
    train_target: str | None = None
    valid_source: str | None = None
    valid_target: str | None = None
    test_source: str | None = None
    test_target: str | None = None
    hf_dataset: str | None = field(default=None, metadata={"help": "training data from `datasets` (online)"})
    hf_config: str | None = None
    empty_lines: Literal["error", "skip"] = "error"
    train_limit: int | None = field(default=None, metadata={"help": "use only the first N training pairs"})
    test_limit: int | None = field(default=None, metadata={"help": "evaluate only the first N test pairs"})
    vocab_size: int = field(default=8000, metadata={"help": "joint BPE vocabulary size"})
    max_length: int = field(default=128, metadata={"help": "longest tokenised training sentence accepted"})
    max_train_length: int | None = field(
        default=None, metadata={"help": "train only on pairs of at most N tokens (train short, test long)"}
    )
    concat_probability: float = field(
        default=0.0,
        metadata={"help": "concatenation augmentation (Varis & Bojar 2021): share of joined pairs"},
    )
    concat_group_sizes: list[int] | None = field(
        default=None,
        metadata={
            "help": "pairs per joined example, drawn uniformly from these (concatenate_consecutive's default: 2)"
        },
    )
    max_tokens: int | None = field(
        default=None,
        metadata={"help": "padded tokens per batch (None: per_device_train_batch_size sentences)"},
    )


@dataclass
class ModelArguments:
    """Unset fields keep the defaults of `MarianPosEncConfig` (and of each module class)."""

    architecture: Literal["marian_posenc", "stock_marian"] = "marian_posenc"
    position_encoding: str | None = field(default=None, metadata={"help": "both stacks (shorthand)"})
    encoder_position_encoding: str | None = None
    decoder_position_encoding: str | None = None
    encoder_self_attention: str | None = None
    decoder_self_attention: str | None = None
    cross_attention: str | None = None
    d_model: int | None = None
    layers: int | None = field(default=None, metadata={"help": "encoder and decoder layers each"})
    heads: int | None = field(default=None, metadata={"help": "attention heads of both stacks"})
    ffn_dim: int | None = field(default=None, metadata={"help": "feed-forward width of both stacks"})
    dropout: float | None = None
    max_position_embeddings: int | None = None
    config_overrides: str = field(
        default="{}", metadata={"help": "JSON of further MarianPosEncConfig fields"}
    )
    attention_backend: Literal["auto", "eager", "sdpa"] = field(
        default="auto", metadata={"help": "auto: the faster of eager and sdpa, measured on this machine"}
    )
    num_beams: int | None = field(default=None, metadata={"help": "saved in the generation config"})
    length_penalty: float | None = field(default=None, metadata={"help": "saved in the generation config"})


ARGUMENT_CLASSES = (RunArguments, DataArguments, ModelArguments, Seq2SeqTrainingArguments)
# Trainer fields that --precision decides.
PRECISION_FIELDS = ("bf16", "fp16")


@dataclass
class Arguments:
    run: RunArguments
    data: DataArguments
    model: ModelArguments
    training: Seq2SeqTrainingArguments

    @property
    def checkpoints_dir(self) -> Path:
        return Path(f"{self.training.output_dir}-checkpoints")


def recipe_names() -> list[str]:
    return sorted(path.stem for path in RECIPES.glob("*.yaml"))


def load_recipe(name: str, seen: tuple[str, ...] = ()) -> dict:
    """A recipe's settings, those of the recipe it `extends` first; errors name the recipe file."""
    path = RECIPES / f"{name}.yaml"
    if not path.is_file():
        raise ValueError(f"unknown recipe {name!r}; available: {', '.join(recipe_names())}")
    if name in seen:
        raise ValueError(f"recipe {path} extends itself through {' -> '.join(seen)}")
    try:
        settings = yaml.safe_load(path.read_text(encoding="utf-8")) or {}
    except (yaml.YAMLError, UnicodeDecodeError) as error:
        raise ValueError(f"recipe {path} is not valid YAML: {error}") from None
    if not isinstance(settings, dict):
        raise ValueError(f"recipe {path} must be a mapping of settings, got a {type(settings).__name__}")
    parent = load_recipe(settings.pop("extends"), (*seen, name)) if "extends" in settings else {}
    overrides = settings.get("config_overrides", {})
    if not isinstance(overrides, dict):
        raise ValueError(f"recipe {path}: config_overrides must be a mapping of MarianPosEncConfig fields")
    return {**parent, **settings, "config_overrides": {**parent.get("config_overrides", {}), **overrides}}


def parse_args(argv=None) -> Arguments:
    """Command line over recipe over the dataclass defaults; unknown recipes and recipe keys are errors."""
    parser = HfArgumentParser(ARGUMENT_CLASSES, description=__doc__)
    parser.set_defaults(output_dir=None)
    recipe_name = parser.parse_known_args(argv)[0].recipe
    try:
        recipe = load_recipe(recipe_name)
    except ValueError as error:
        parser.error(str(error))
    known = {action.dest for action in parser._actions}
    unknown = sorted(set(recipe) - known, key=str)
    if unknown:
        parser.error(f"recipe {recipe_name} has unknown keys {unknown}; allowed: {', '.join(sorted(known))}")
    recipe_overrides = recipe.pop("config_overrides")
    given = set(recipe) | given_flags(argv)
    if given & set(PRECISION_FIELDS):
        flags = " ".join(f"--{name}" for name in sorted(given & set(PRECISION_FIELDS)))
        parser.error(f"set the precision with --precision (auto, bf16, fp16, fp32), not {flags}")
    parser.set_defaults(**recipe)
    try:
        run, data, model, training = parser.parse_args_into_dataclasses(argv, look_for_args_file=False)
    except ValueError as error:  # the Trainer's own checks of its fields
        parser.error(str(error))
    args = Arguments(run, data, model, training)
    check_arguments(parser, args, recipe_overrides)
    if "output_dir" not in given:  # the Trainer's own default ("trainer_output") names no run
        training.output_dir = str(REPO / "outputs" / f"{run.recipe}-{module_name(args)}")
    return args


def given_flags(argv) -> set[str]:
    return {arg[2:].split("=")[0] for arg in (sys.argv[1:] if argv is None else argv) if arg.startswith("--")}


def check_arguments(parser, args: Arguments, recipe_overrides: dict) -> None:
    """Errors for settings whose value alone shows they are wrong, before any data is read; merges the recipe's
    config_overrides under those of the command line."""
    run, data, model, training = args.run, args.data, args.model, args.training
    if training.push_to_hub and not training.hub_model_id:
        parser.error("--push_to_hub needs --hub_model_id")
    if run.average_last and run.average_best:
        parser.error("choose one of --average_last and --average_best")
    if (run.average_last or run.average_best) and training.save_strategy != "steps":
        parser.error("checkpoint averaging needs checkpoints: --save_strategy steps --save_steps N")
    if run.eval_bleu and training.eval_strategy == "no":
        parser.error(
            "--eval_bleu scores the validation set at each evaluation: set --eval_strategy steps --eval_steps N"
        )
    planned_checkpoints = (
        training.max_steps // training.save_steps if training.max_steps > 0 and not run.minutes else None
    )
    if planned_checkpoints is not None and planned_checkpoints < (run.average_last or run.average_best):
        parser.error(f"--max_steps={training.max_steps} with --save_steps={training.save_steps} writes "
                     f"{planned_checkpoints} checkpoints, fewer than the {run.average_last or run.average_best} "
                     "to average (--average_last / --average_best)")  # fmt: skip
    if run.average_best and training.eval_steps != training.save_steps:
        parser.error(
            "--average_best needs the validation loss at every checkpoint: --eval_steps = --save_steps"
        )
    positive = {
        "--minutes": (run.minutes, 0), "--average_last": (run.average_last, 0), "--average_best": (run.average_best, 0),
        "--vocab_size": (data.vocab_size, 1), "--max_length": (data.max_length, 1), "--train_limit": (data.train_limit, 1),
        "--test_limit": (data.test_limit, 1), "--max_train_length": (data.max_train_length, 1),
        "--max_tokens": (data.max_tokens, 1), "--threads": (run.threads, 1), "--d_model": (model.d_model, 1),
        "--layers": (model.layers, 1), "--heads": (model.heads, 1), "--ffn_dim": (model.ffn_dim, 1),
        "--num_beams": (model.num_beams, 1), "--gradient_accumulation_steps": (training.gradient_accumulation_steps, 1),
        "--save_steps": (training.save_steps, 1), "--eval_steps": (training.eval_steps, 1),
    }  # fmt: skip
    for flag, (value, minimum) in positive.items():
        if value is not None and value < minimum:
            parser.error(f"{flag}={value} must be at least {minimum}")
    if training.max_steps == 0 or training.max_steps < -1:
        parser.error(f"--max_steps={training.max_steps} must be positive (or -1: --num_train_epochs decides)")
    if not run.minutes and training.max_steps == -1 and training.num_train_epochs <= 0:
        parser.error("no training budget: set --minutes, --max_steps or a positive --num_train_epochs")
    if not 0.0 <= data.concat_probability <= 1.0:
        parser.error(f"--concat_probability={data.concat_probability} must be in [0, 1]")
    if data.concat_group_sizes is not None:
        if not data.concat_probability:
            parser.error(
                "--concat_group_sizes needs --concat_probability above 0 (no example is joined without it)"
            )
        try:
            check_augmentation(data.concat_probability, data.concat_group_sizes)
        except ValueError as error:  # names the value: "group_sizes=[2, 1]: expected ..."
            parser.error(f"--concat_{error}")
    try:
        overrides = json.loads(model.config_overrides)
    except json.JSONDecodeError as error:
        parser.error(f"--config_overrides is not valid JSON ({error}): {model.config_overrides!r}")
    if not isinstance(overrides, dict):
        parser.error(
            f"--config_overrides must be a JSON object of config fields, got {model.config_overrides!r}"
        )
    model.config_overrides = json.dumps({**recipe_overrides, **overrides})
    if model.architecture == "marian_posenc":
        try:
            model_config(args, vocab_size=data.vocab_size, pad=0, eos=1)  # validates every model setting now
        except (ValueError, TypeError) as error:
            parser.error(f"invalid model settings: {error}")


def module_name(args: Arguments) -> str:
    model = args.model
    if model.architecture == "stock_marian":
        return "stock-marian"
    return (
        model.position_encoding
        or model.encoder_position_encoding
        or model.encoder_self_attention
        or MarianPosEncConfig().encoder_position_encoding
    )


def repo_path(path: str) -> Path:
    """Recipe paths are relative to the repository root (where ../shared lives)."""
    path = Path(path)
    return path if path.is_absolute() else REPO / path


# ----------------------------------------------------------------------------------------------------------
# Stages


@dataclass
class PreparedData:
    tokenizer: object
    train: object  # datasets.Dataset with input_ids, labels, length
    valid: object | None
    test: ParallelText
    train_text: ParallelText


def load_split(data: DataArguments, split: str, limit=None) -> ParallelText:
    source, target = getattr(data, f"{split}_source"), getattr(data, f"{split}_target")
    if (source is None) != (target is None):
        raise ValueError(f"--{split}_source and --{split}_target go together (got {source!r}, {target!r})")
    if source is not None:
        return read_parallel(repo_path(source), repo_path(target), empty_lines=data.empty_lines, limit=limit)
    if split == "train" and data.hf_dataset:
        return read_hf_translation(data.hf_dataset, data.hf_config, "train", data.source_lang, data.target_lang,
                                   empty_lines=data.empty_lines, limit=limit)  # fmt: skip
    return read_split(repo_path(data.data_dir), getattr(data, f"{split}_split"), data.source_lang,
                      data.target_lang, empty_lines=data.empty_lines, limit=limit)  # fmt: skip


def prepare_data(args: Arguments) -> PreparedData:
    """Read and validate the splits, learn the joint BPE on the training text, tokenise."""
    data = args.data
    train_text = load_split(data, "train", limit=data.train_limit)
    test = load_split(data, "test", limit=data.test_limit)
    logger.info("data: %d training pairs from %s, %d test pairs from %s", len(train_text), train_text.name,
                len(test), test.name)  # fmt: skip
    tokenizer = train_joint_bpe(train_text.source + train_text.target, vocab_size=data.vocab_size)
    if len(tokenizer) > data.vocab_size:  # BPE keeps every character of the text whatever the size asked for
        raise ValueError(f"--vocab_size={data.vocab_size} is smaller than the {len(tokenizer)} characters and special "
                         f"tokens of the training text; ask for more (the recipes use 6000-40000)")  # fmt: skip
    if data.max_train_length:
        train_text = shorter_pairs(tokenizer, train_text, data.max_train_length)
    if data.concat_probability:  # after the length filter: joined examples may exceed it, that is their point
        sizes = {"group_sizes": data.concat_group_sizes} if data.concat_group_sizes else {}
        train_text = concatenate_consecutive(
            train_text, data.concat_probability, seed=args.training.seed, **sizes
        )
        logger.info(
            "concatenation augmentation (p=%s): %d training examples",
            data.concat_probability,
            len(train_text),
        )
    train = tokenize_parallel(tokenizer, train_text.source, train_text.target, data.max_length)
    valid = None
    if args.training.eval_strategy != "no":
        valid_text = load_split(data, "valid")
        valid = tokenize_parallel(tokenizer, valid_text.source, valid_text.target, data.max_length)
    return PreparedData(tokenizer, train, valid, test, train_text)


def shorter_pairs(tokenizer, text: ParallelText, max_tokens: int) -> ParallelText:
    """Train short, test long: the pairs with at most `max_tokens` tokens on both sides (logged)."""
    lengths = [max(len(s), len(t)) for s, t in zip(tokenizer(text.source)["input_ids"],
                                                     tokenizer(text_target=text.target)["input_ids"], strict=True)]  # fmt: skip
    kept = [i for i, length in enumerate(lengths) if length <= max_tokens]
    if not kept:
        raise ValueError(f"no training pair has at most --max_train_length={max_tokens} tokens")
    logger.info(
        "train short: %d of %d pairs have at most %d tokens; training on those only",
        len(kept),
        len(text),
        max_tokens,
    )
    return ParallelText([text.source[i] for i in kept], [text.target[i] for i in kept], text.name)


def model_config(args: Arguments, vocab_size: int, pad: int, eos: int, train=None) -> MarianPosEncConfig:
    """The config from what the user (or recipe) set: unset fields keep MarianPosEncConfig's defaults."""
    model = args.model
    fields = {
        "encoder_layers": model.layers, "decoder_layers": model.layers,
        "encoder_attention_heads": model.heads, "decoder_attention_heads": model.heads,
        "encoder_ffn_dim": model.ffn_dim, "decoder_ffn_dim": model.ffn_dim,
        **{name: getattr(model, name) for name in (
            "position_encoding", "encoder_position_encoding", "decoder_position_encoding", "encoder_self_attention",
            "decoder_self_attention", "cross_attention", "d_model", "dropout", "max_position_embeddings")},
    }  # fmt: skip
    fields = {name: value for name, value in fields.items() if value is not None}
    fields.update(json.loads(model.config_overrides))
    tokens = dict(
        vocab_size=vocab_size,
        pad_token_id=pad,
        decoder_start_token_id=pad,
        eos_token_id=eos,
        forced_eos_token_id=eos,
    )
    config = MarianPosEncConfig(**tokens, **fields)
    if config.cross_attention == "rposnet" and "rposnet_length_ratio" not in fields and train is not None:
        config.rposnet_length_ratio = source_target_length_ratio(train)
        logger.info(
            "rPosNet cross-attention: gamma = %.4f (source/target length ratio)", config.rposnet_length_ratio
        )
    return config


def source_target_length_ratio(dataset) -> float:
    """gamma of paper 2 Eq. 10: total source tokens / total target tokens of the training data."""
    source_tokens = sum(len(ids) for ids in dataset["input_ids"])
    target_tokens = sum(len(ids) for ids in dataset["labels"])
    return round(source_tokens / target_tokens, 4)


def build_model(args: Arguments, data: PreparedData):
    """The model, with the precision and attention backend this machine runs fastest (or as asked)."""
    tokenizer = data.tokenizer
    torch.manual_seed(args.training.seed)
    pad, eos = tokenizer.pad_token_id, tokenizer.eos_token_id
    if args.model.architecture == "stock_marian":
        dims = {k: v for k, v in model_config(args, len(tokenizer), pad, eos).to_dict().items()
                if k in MarianConfig.__dataclass_fields__ and k not in ("architectures", "dtype")}  # fmt: skip
        model = MarianMTModel(MarianConfig(**dims))
        # our models' decoding; Marian has no source + 50 rule, so it may write the longest accepted sentence + 50
        model.generation_config.update(**PAPER_1_DECODING, bad_words_ids=[[pad]],
                                       max_new_tokens=args.data.max_length + MAX_NEW_TOKENS_OVER_SOURCE)  # fmt: skip
    else:
        model = MarianPosEncForConditionalGeneration(model_config(args, len(tokenizer), pad, eos, data.train))
    generation = {k: v for k, v in (("num_beams", args.model.num_beams), ("length_penalty", args.model.length_penalty))
                  if v is not None}  # fmt: skip
    model.generation_config.update(**generation)
    config = model.config
    device = args.training.device.type
    tokens = min(args.data.max_tokens or 512, 512)
    precision = choose_precision(
        args.run.precision, device, config.d_model, config.encoder_ffn_dim, tokens=tokens
    )
    heads = config.encoder_attention_heads
    backend = choose_attention_backend(args.model.attention_backend, precision.precision, device, heads,
                                       config.d_model // heads, tokens=tokens)  # fmt: skip
    model.set_attn_implementation(backend.backend)
    logger.info("model: %s, %.2fM parameters; precision %s (%s); attention %s (%s)", type(model).__name__,
                model.num_parameters() / 1e6, precision.precision, precision.reason, backend.backend, backend.reason)  # fmt: skip
    return model, precision, backend


@dataclass
class TrainingReport:
    steps: int  # the run's updates, earlier attempts included
    minutes: float  # of this attempt, as the rest
    target_tokens: int
    tokens_per_second: float
    budget: dict
    resumed_from: str | None = None  # the checkpoint this attempt continued
    updates_this_attempt: int = 0


def check_output_folders(args: Arguments) -> None:
    """Refuse to mix two runs: an existing run folder or checkpoint folder needs --resume_from_checkpoint or
    --overwrite_output_dir (which deletes both)."""
    folders = [Path(args.training.output_dir), args.checkpoints_dir]
    used = [folder for folder in folders if folder.is_dir() and any(folder.iterdir())]
    if not used or args.training.resume_from_checkpoint:
        return
    if not args.run.overwrite_output_dir:
        raise SystemExit(
            f"{' and '.join(map(str, used))} already hold a run; resume it with --resume_from_checkpoint last, "
            "replace it with --overwrite_output_dir, or choose another --output_dir"
        )
    for folder in used:
        logger.warning("--overwrite_output_dir: deleting %s", folder)
        shutil.rmtree(folder)


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
    checkpoints = sorted(args.checkpoints_dir.glob("checkpoint-*"), key=lambda p: int(p.name.split("-")[-1]))
    for checkpoint in reversed(checkpoints):
        problem = checkpoint_problem(checkpoint)
        if not problem:
            return str(checkpoint)
        logger.warning("%s is incomplete (%s): trying the one before", checkpoint, problem)
    raise ValueError(f"--resume_from_checkpoint last: no complete checkpoint in {args.checkpoints_dir}")


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


def train(args: Arguments, model, data: PreparedData, precision) -> tuple[TranslationTrainer, TrainingReport]:
    """`Seq2SeqTrainer` run with token-budget batches, the time budget, progress and a budget check."""
    # checkpoints go beside the run folder; `export` uploads the finished folder, not the Trainer
    # --eval_bleu scores generated validation translations: the Trainer must generate when it evaluates
    training = dataclasses.replace(args.training, output_dir=str(args.checkpoints_dir), push_to_hub=False,
                                   predict_with_generate=args.training.predict_with_generate or args.run.eval_bleu)  # fmt: skip
    training.bf16, training.fp16 = precision.precision == "bf16", precision.precision == "fp16"
    budget = [f"{args.run.minutes} minutes"] if args.run.minutes else []
    budget.append(
        f"{training.max_steps} updates" if training.max_steps > 0 else f"{training.num_train_epochs} epochs"
    )
    logger.info("training budget: %s, whichever ends first", " or ".join(budget))
    # the stock baseline trains on the Trainer's own batches of per_device_train_batch_size sentences
    max_tokens = args.data.max_tokens if args.model.architecture == "marian_posenc" else None
    if max_tokens:
        sampler = TokenBudgetBatchSampler(data.train["length"], max_tokens, seed=training.seed)
        logger.info(
            "token-budget batching: %d batches per epoch, %.1f%% padding",
            len(sampler),
            100 * sampler.padding_ratio(),
        )
    time_budget = [TimeBudgetCallback(args.run.minutes)] if args.run.minutes else []
    trainer = TranslationTrainer(
        model=model,
        args=training,
        train_dataset=data.train if max_tokens else data.train.remove_columns(["length"]),
        eval_dataset=data.valid,
        data_collator=DataCollatorForSeq2Seq(data.tokenizer, model=model, label_pad_token_id=-100),
        processing_class=data.tokenizer,
        callbacks=time_budget,
        compute_metrics=translation_metrics(data.tokenizer) if args.run.eval_bleu else None,
        max_tokens=max_tokens,
    )
    trainer.remove_callback(ProgressCallback)
    trainer.add_callback(TrainingProgressCallback(lambda: trainer.target_tokens, args.run.minutes or None))
    check = None
    if args.run.minutes:
        check = UpdateBudgetCheck(args.run.minutes, precision.precision, describe_hardware(training.device))
        trainer.add_callback(check)
    resume = resume_checkpoint(args)
    first_step = json.loads((Path(resume) / "trainer_state.json").read_text())["global_step"] if resume else 0
    started = time.monotonic()
    if resume and 0 < training.max_steps <= first_step:  # the Trainer would make one update past the budget
        logger.info(
            "%s holds the whole budget of %d updates: loading it, no further update", resume, first_step
        )
        average_into(trainer.model, [Path(resume)])
        steps = first_step
    else:
        steps = trainer.train(resume_from_checkpoint=resume).global_step
    seconds = time.monotonic() - started
    report = TrainingReport(steps, seconds / 60, trainer.target_tokens, trainer.target_tokens / seconds,
                            check.estimate if check else None, resume and Path(resume).name,
                            steps - first_step)  # fmt: skip
    return trainer, report


@dataclass
class Evaluation:
    hypotheses: list[str]
    scores: dict
    decode_seconds: float
    averaged: list[str]
    degenerate: list[str]


def trained_model(args: Arguments, trainer: TranslationTrainer):
    """The trained weights, reloaded from what every process saved (under FSDP/DeepSpeed the Trainer gathers
    the shards there), averaged over checkpoints if asked. Returns None on every process but the first."""
    trained_dir = args.checkpoints_dir / "trained"
    trainer.save_model(str(trained_dir))
    if not trainer.is_world_process_zero():
        return None, []
    model = type(trainer.model).from_pretrained(trained_dir).to(args.training.device)
    asked = args.run.average_last or args.run.average_best
    if not asked:
        return model, []
    available = len(list_checkpoints(args.checkpoints_dir)) if args.checkpoints_dir.is_dir() else 0
    if available < asked:  # a time budget can end before the checkpoints asked for exist
        logger.warning("asked to average %d checkpoints, %d exist: %s", asked, available,
                       f"averaging those {available}" if available else "evaluating the final weights")  # fmt: skip
        if not available:
            return model, []
    wanted = min(asked, available)
    chosen = select_checkpoints(args.checkpoints_dir, last=wanted if args.run.average_last else None,
                                best=wanted if args.run.average_best else None)  # fmt: skip
    average_into(model, chosen)
    return model, [path.name for path in chosen]


def evaluate(
    args: Arguments, model, data: PreparedData, precision, report, averaged: list[str]
) -> Evaluation:
    """Decode the test set with the model's generation config and score it; flag degenerate output."""
    started = time.monotonic()
    hypotheses = translate(model, data.tokenizer, data.test.source, bf16=precision.precision == "bf16")
    seconds = time.monotonic() - started
    scores = score_translations(hypotheses, data.test.target)
    encoding = getattr(
        model.config, "encoder_position_encoding", MarianPosEncConfig().encoder_position_encoding
    )
    degenerate = degenerate_output(hypotheses, scores["bleu"], encoding, updates=report.steps,
                                   warmup_steps=args.training.warmup_steps, precision=precision.precision,
                                   device=args.training.device.type,
                                   encoder_cosine=encoder_token_cosine(model, data.tokenizer, data.test.source))  # fmt: skip
    for reason in degenerate:
        logger.warning("DEGENERATE OUTPUT: %s", reason)
    return Evaluation(hypotheses, scores, seconds, averaged, degenerate)


def run_record(
    args: Arguments, model, data, precision, backend, report: TrainingReport, evaluation: Evaluation, started
) -> dict:
    """scores.json: the scores, the run's settings, the machine and what it achieved."""
    hardware = describe_hardware(args.training.device.type)
    dtype = torch.bfloat16 if precision.precision == "bf16" else None
    lengths = data.train["length"]
    mean_length = max(1, round(sum(lengths) / len(lengths)))
    flops_per_token = model_flops_per_target_token(
        model, mean_length, mean_length, 8, args.training.device, dtype
    )
    peak = matmul_peak_flops(precision.precision, args.training.device.type)
    return {
        **evaluation.scores,
        "recipe": args.run.recipe,
        "steps": report.steps,
        "train_minutes": round(report.minutes, 2),
        "resumed_from": report.resumed_from,
        "updates_this_attempt": report.updates_this_attempt,
        "decode_seconds": round(evaluation.decode_seconds, 1),
        "total_minutes": round((time.monotonic() - started) / 60, 2),
        "parameters": model.num_parameters(),
        "architecture": args.model.architecture,
        "averaged_checkpoints": evaluation.averaged,
        "test_set": data.test.name,
        "test_pairs": len(data.test),
        "degenerate": evaluation.degenerate,
        "hardware": {**hardware.as_dict(), "line": hardware.line()},
        "transformers_version": transformers.__version__,
        "precision": precision.precision,
        "precision_probe": precision.as_dict(),
        "attention_backend": backend.backend,
        "attention_probe": backend.as_dict(),
        "training_target_tokens": report.target_tokens,
        "training_target_tokens_per_second": round(report.tokens_per_second, 1),
        "model_flops_per_target_token": flops_per_token,
        "matmul_peak_flops": peak,
        "mfu": round(flops_per_token * report.tokens_per_second / peak, 4),
        "budget_check": report.budget,
    }


def export(args: Arguments, model, data: PreparedData, evaluation: Evaluation, record: dict) -> Path:
    """Write the Hub folder into a temporary sibling and rename it into place, so that a folder under the run's
    name is always complete; then the dry run copy and the upload."""
    output_dir = Path(args.training.output_dir)
    partial = output_dir.with_name(output_dir.name + ".partial")
    shutil.rmtree(partial, ignore_errors=True)
    model.save_pretrained(partial)
    data.tokenizer.save_pretrained(partial)
    (partial / "scores.json").write_text(json.dumps(record, indent=2) + "\n")
    (partial / f"test.hyp.{args.data.target_lang}").write_text("\n".join(evaluation.hypotheses) + "\n")
    batching = (
        f"{args.data.max_tokens} tokens"
        if args.data.max_tokens and args.model.architecture == "marian_posenc"
        else f"{args.training.per_device_train_batch_size} sentences"
    )
    write_model_card(
        partial, model, record, model_name=output_dir.name,
        source_lang=args.data.source_lang, target_lang=args.data.target_lang,
        parameters=f"{record['parameters'] / 1e6:.2f}M", repo_or_folder=args.training.hub_model_id or str(output_dir),
        dataset=args.data.hf_dataset or repo_path(args.data.data_dir).name,
        test_split=Path(data.test.name.split(" / ")[0]).name,
        data_note=MULTI30K_NOTE if "multi30k" in args.run.recipe and not args.data.train_source
        else f"Training data: {data.train_text.name} ({len(data.train_text)} pairs). Test: {data.test.name}.",
        training=(f"recipe `{args.run.recipe}`: {updates_text(record)}, "
                  f"{record['precision']}, {batching} per batch x {args.training.gradient_accumulation_steps}, "
                  f"lr {args.training.learning_rate} {getattr(args.training.lr_scheduler_type, 'value', args.training.lr_scheduler_type)} "
                  f"(warm-up {args.training.warmup_steps}), "
                  f"label smoothing {args.training.label_smoothing_factor}"
                  + (f", average of {', '.join(evaluation.averaged)}" if evaluation.averaged else "")),
        hardware=(f"{record['hardware']['line']}; {record['training_target_tokens_per_second']:.0f} target tokens/s, "
                  f"MFU {100 * record['mfu']:.1f}% of the measured {record['precision']} matmul peak"),
        warning=("\n**Warning: degenerate output.** " + " ".join(evaluation.degenerate) + "\n") if evaluation.degenerate else "",
    )  # fmt: skip
    if output_dir.exists():
        replaced = output_dir.with_name(output_dir.name + ".replaced")
        os.replace(output_dir, replaced)
        os.replace(partial, output_dir)
        shutil.rmtree(replaced)
    else:
        os.replace(partial, output_dir)
    if args.run.hub_dry_run:
        shutil.copytree(output_dir, args.run.hub_dry_run, dirs_exist_ok=True)
    if args.training.push_to_hub:
        from huggingface_hub import HfApi

        api = HfApi()
        api.create_repo(args.training.hub_model_id, exist_ok=True)
        api.upload_folder(repo_id=args.training.hub_model_id, folder_path=str(output_dir),
                          commit_message="hf_posenc training run")  # fmt: skip
    return output_dir


def updates_text(record: dict) -> str:
    """'1003 updates in 16.0 min', or for a resumed run how many of them this attempt made, and in what time."""
    if record["resumed_from"]:
        return (f"{record['steps']} updates ({record['updates_this_attempt']} of them in this attempt's "
                f"{record['train_minutes']:.1f} min, resumed from {record['resumed_from']})")  # fmt: skip
    return f"{record['steps']} updates in {record['train_minutes']:.1f} min"


def print_summary(
    args: Arguments, data: PreparedData, evaluation: Evaluation, record: dict, output_dir: Path
) -> None:
    scores = evaluation.scores
    print(f"\nBLEU    {scores['bleu']:6.2f}  {scores['bleu_signature']}")
    print(f"chrF++  {scores['chrf++']:6.2f}  {scores['chrf++_signature']}")
    print(
        f"{updates_text(record)}, decoding {record['decode_seconds']:.0f} s, total {record['total_minutes']:.1f} min"
    )
    print(f"{record['hardware']['line']}; precision {record['precision']}, attention {record['attention_backend']}; "
          f"{record['training_target_tokens_per_second']:.0f} target tokens/s = "
          f"{record['model_flops_per_target_token'] * record['training_target_tokens_per_second'] / 1e9:.1f} GFLOP/s, "
          f"MFU {100 * record['mfu']:.1f}% of the measured {record['matmul_peak_flops'] / 1e9:.0f} GFLOP/s peak")  # fmt: skip
    for source, hypothesis, reference in list(zip(data.test.source, evaluation.hypotheses, data.test.target,
                                                  strict=True))[: args.run.examples]:  # fmt: skip
        print(f"\n  src: {source}\n  hyp: {hypothesis}\n  ref: {reference}")
    print(f"\nwrote {output_dir}")


def main(argv=None) -> dict | None:
    args = parse_args(argv)
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(name)s: %(message)s")
    started = time.monotonic()
    if args.run.threads:
        torch.set_num_threads(args.run.threads)
    check_output_folders(args)
    data = prepare_data(args)
    model, precision, backend = build_model(args, data)
    trainer, report = train(args, model, data, precision)
    model, averaged = trained_model(args, trainer)
    leave_process_group()  # the processes need each other no more; the first one evaluates alone
    if model is None:
        return None  # one process evaluates and writes the folder
    evaluation = evaluate(args, model, data, precision, report, averaged)
    record = run_record(args, model, data, precision, backend, report, evaluation, started)
    output_dir = export(args, model, data, evaluation, record)
    print_summary(args, data, evaluation, record, output_dir)
    if evaluation.degenerate and args.run.fail_on_degenerate:
        print("\nDEGENERATE OUTPUT (exit 3): " + " ".join(evaluation.degenerate), file=sys.stderr)
        raise SystemExit(3)
    return record


if __name__ == "__main__":
    run_cli(main)
