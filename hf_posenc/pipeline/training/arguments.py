"""The settings of a training run, and every check that needs nothing but the settings (those that read a
recipe's raw values, the numbers, the Hub fields or several settings at once: argument_checks.py).

Every setting is a field of one of four dataclasses parsed by `HfArgumentParser`: `RunArguments` (budget,
precision, evaluation and export), `DataArguments`, `ModelArguments` (module choices and model size; unset
fields keep the defaults of `MarianPosEncConfig`) and transformers' own `Seq2SeqTrainingArguments` (any Trainer
field). A recipe (a name from `hf_posenc/pipeline/training/recipes/`, or a path to a YAML file; it may `extends:`
another) sets any of them, and the command line wins. A single JSON or YAML file in place of the flags is read
as flags (HF's `args.json` convention). Relative data paths of a recipe are read under the data root
(`--data_root`, else $HF_POSENC_DATA); those of the command line under the current folder.

`--model_name_or_path` starts from an existing model (`pretrained.py`): the model's size and vocabulary are then
the loaded model's, so a recipe's model settings are ignored (and named in a warning) and a size flag of the
command line that disagrees with the model is an error naming both values.
"""

import json
import logging
import math
import os
import sys
from dataclasses import dataclass, field
from pathlib import Path
from typing import Literal

import torch
import yaml
from huggingface_hub.errors import StrictDataclassFieldValidationError
from transformers import HfArgumentParser, Seq2SeqTrainingArguments

from ...configuration_marian_posenc import MarianPosEncConfig
from ..data.augmentation import check_augmentation
from ..data.batching import check_length_buckets
from ..data.files import data_root, data_root_hint
from .argument_checks import check_combinations, check_hub, check_numbers, check_recipe_values
from .hardware import CPU_MEMORY
from .pretrained import pretrained_config

RECIPES = Path(__file__).resolve().parent / "recipes"
DEFAULT_RECIPE = "multi30k-en-de-small"
# The length buckets of a compiled run that sets none: steps of x1.5 (8, 12, 16, 24, ...), so that bucket padding
# adds at most half of a batch's longest side (on Multi30k's default batches: 7 source x target bucket pairs, and
# the padded share of the source positions 7.9% -> 20.8%, of the target positions 4.8% -> 18.1%).
COMPILE_LENGTH_BUCKETS = (8, 12, 16, 24, 32, 48, 64, 96, 128, 192, 256, 384, 512, 768, 1024)
OUTPUTS = Path("outputs")  # run folders are `outputs/<recipe>-<module>` unless --output_dir says otherwise


@dataclass
class RunArguments:
    recipe: str = field(default=DEFAULT_RECIPE, metadata={"help": "a recipe name or a path to a YAML recipe"})
    description: str = field(default="", metadata={"help": "what the recipe is (set by recipes)"})
    minutes: float = field(default=0.0, metadata={"help": "wall-clock training budget in minutes (0: none)"})
    schedule: Literal["fixed", "budget"] = field(
        default="fixed",
        metadata={
            "help": "budget: with --minutes, plan warm-up and linear decay for the updates the measured speed "
            "allows (pipeline/training/schedule.py); --lr_scheduler_type, --warmup_steps or --max_steps on the command "
            "line keep the Trainer's fixed schedule"
        },
    )
    precision: Literal["auto", "bf16", "fp16", "fp32"] = field(
        default="auto",
        metadata={"help": "auto: bf16 on CUDA where supported; on CPU only if measured faster"},
    )
    threads: int | None = field(
        default=None,
        metadata={
            "help": "torch CPU threads (default: one per core that other work leaves free, measured at the start "
            "of a one-process CPU run; all cores otherwise)"
        },
    )
    cpu_memory: Literal[CPU_MEMORY] = field(
        default=CPU_MEMORY[0],
        metadata={
            "help": "reuse: on the CPU under glibc, keep freed tensors' memory in the process for the next update "
            "(no page faults on every large tensor, pipeline/training/hardware.py keep_freed_memory); release: the C "
            "library's default, large blocks go back to the system when freed"
        },
    )
    eval_bleu: bool = field(default=False, metadata={"help": "score generated validation translations too"})
    average_last: int = field(default=0, metadata={"help": "average the last N checkpoints (paper 1)"})
    average_best: int = field(default=0, metadata={"help": "average the best-perplexity one + N-1 after it"})
    overwrite_output_dir: bool = field(
        default=False, metadata={"help": "replace an existing run (removed only once the new one is written)"}
    )
    fail_on_degenerate: bool = field(
        default=True, metadata={"help": "exit non-zero when the translations are degenerate"}
    )
    examples: int = field(default=5, metadata={"help": "example translations to print"})
    hub_dry_run: str | None = field(
        default=None, metadata={"help": "write the folder that would be uploaded (a new or empty folder)"}
    )


@dataclass
class DataArguments:
    """Explicit files win over `hf_dataset`, which wins over the `data_dir` splits."""

    data_dir: str = field(
        default="multi30k",
        metadata={
            "help": "a folder of {split}.{lang}[.gz] files (the default and a recipe's: under the data root)"
        },
    )
    data_root: str | None = field(
        default=None,
        metadata={
            "help": "the folder a recipe's relative data paths are read under (default: $HF_POSENC_DATA)"
        },
    )
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
    hf_train_split: str = field(default="train", metadata={"help": "the split of --hf_dataset trained on"})
    empty_lines: Literal["error", "skip"] | None = field(
        default=None,
        metadata={
            "help": "pairs with an empty side; unset: training pairs skipped and counted, an empty validation or "
            "test line an error; error: an error everywhere; skip: skipped and counted everywhere"
        },
    )
    train_limit: int | None = field(default=None, metadata={"help": "use only the first N training pairs"})
    test_limit: int | None = field(default=None, metadata={"help": "evaluate only the first N test pairs"})
    vocab_size: int = field(default=8000, metadata={"help": "joint BPE vocabulary size"})
    tokenizer_name_or_path: str | None = field(
        default=None,
        metadata={
            "help": "reuse a fast tokenizer (a folder with tokenizer.json, e.g. a previous run's, or a Hub id) "
            "instead of learning a BPE; it needs a pad and an end token, and must end every sequence with it"
        },
    )
    bpe_sample_pairs: int = field(
        default=1_000_000,
        metadata={
            "help": "learn the BPE on at most N training pairs (a fixed uniform sample; all pairs if fewer): "
            "bounds the memory of BPE learning whatever the corpus size"
        },
    )
    max_length: int = field(
        default=128,
        metadata={
            "help": "longest tokenised training sentence accepted; longer training pairs are skipped and counted"
        },
    )
    max_train_length: int | None = field(
        default=None,
        metadata={
            "help": "train only on pairs of at most N tokens (train short, test long); longer ones are skipped "
            "and counted"
        },
    )
    max_length_ratio: float = field(
        default=9.0,
        metadata={
            "help": "skip (and count) training pairs whose longer side has more than R times the tokens of the "
            "shorter (Moses clean-corpus-n.perl -ratio, default 9; 0: no ratio filter)"
        },
    )
    data_cache_dir: str | None = field(
        default=None,
        metadata={
            "help": "where the tokenised training corpus and learned tokenizers are cached and reused by later "
            "and resumed runs (default: $HF_POSENC_CACHE, else ~/.cache/hf_posenc); safe to delete"
        },
    )
    preprocessing_num_workers: int | None = field(
        default=None,
        metadata={
            "help": "processes tokenising the training corpus (default: one per 100k pairs, at most the cores)"
        },
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
    length_buckets: list[int] | None = field(
        default=None,
        metadata={
            "help": "with --max_tokens: pad each batch's source and target on the right up to the smallest of these "
            "lengths that holds them (increasing; a longer side keeps its length), so that batches come in a few "
            "shapes that a compiled model reuses; the batches hold the same examples and the loss is unchanged "
            "(padding is masked). Unset: with --torch_compile the lengths 8, 12, 16, 24, ... (x1.5 steps) up to "
            "1024, else none (each batch padded to its longest example)"
        },
    )

    def __post_init__(self):
        if self.bpe_sample_pairs < 1:
            raise ValueError(f"--bpe_sample_pairs={self.bpe_sample_pairs} must be at least 1")
        if not (
            math.isfinite(self.max_length_ratio)
            and (self.max_length_ratio == 0 or self.max_length_ratio >= 1)
        ):
            raise ValueError(
                f"--max_length_ratio={self.max_length_ratio} must be 0 (no ratio filter) or a finite number of at "
                "least 1 (a pair's longer side over its shorter)"
            )
        if self.length_buckets is not None:
            check_length_buckets(self.length_buckets, "--length_buckets")
        if self.preprocessing_num_workers is not None and self.preprocessing_num_workers < 1:
            raise ValueError(
                f"--preprocessing_num_workers={self.preprocessing_num_workers} must be at least 1"
            )


DATA_PATH_FIELDS = tuple(
    f"{split}_{side}" for split in ("train", "valid", "test") for side in ("source", "target")
) + ("data_dir",)


@dataclass
class ModelArguments:
    """Unset fields keep the defaults of `MarianPosEncConfig` (and of each module class), or with
    `model_name_or_path` the loaded model's values."""

    model_name_or_path: str | None = field(
        default=None,
        metadata={
            "help": "start from this model (a folder or a Hub id): a MarianPosEnc model keeps its config, a stock "
            "Marian model becomes MarianPosEnc with its sinusoids; module flags swap modules (new parameters "
            "initialised, the others kept); its tokenizer is used (no BPE learned)"
        },
    )
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
    sentence_positions: bool = field(
        default=False,
        metadata={
            "help": "sentence-aware positions (docs/length.md): the tokenizer's sentence-end tokens become the "
            "config's sentence_end_token_ids"
        },
    )
    config_overrides: str = field(
        default="{}", metadata={"help": "JSON of further MarianPosEncConfig fields"}
    )
    attention_backend: Literal["auto", "eager", "sdpa"] = field(
        default="auto", metadata={"help": "auto: the faster of eager and sdpa, measured on this machine"}
    )
    num_beams: int | None = field(default=None, metadata={"help": "saved in the generation config"})
    length_penalty: float | None = field(default=None, metadata={"help": "saved in the generation config"})
    length_control: bool = field(
        default=False,
        metadata={
            "help": "decode-time length control saved in the generation config (docs/length.md): no end before "
            "r x the source length (r: the 5%% quantile of the training pairs' target/source length ratio) nor "
            "before the source's sentence count, with the loop guard they turn on"
        },
    )
    window_sentences: int | None = field(
        default=None,
        metadata={
            "help": "windowed decoding saved in the generation config (docs/length.md): each source translated in "
            "windows of N sentences (the tokenizer's sentence ends), joined; N: the sentences of the longest "
            "training examples"
        },
    )


# The recipe keys that shape a model from scratch: a pretrained model brings its own, so with --model_name_or_path
# a recipe's are ignored (the command line's are used or, for the size, checked against the model).
MODEL_SETTINGS = (
    "vocab_size",
    "bpe_sample_pairs",
    "position_encoding",
    "encoder_position_encoding",
    "decoder_position_encoding",
    "encoder_self_attention",
    "decoder_self_attention",
    "cross_attention",
    "d_model",
    "layers",
    "heads",
    "ffn_dim",
    "dropout",
    "max_position_embeddings",
    "config_overrides",
)
# What learns a BPE: a pretrained model comes with its tokenizer.
VOCABULARY_FLAGS = ("vocab_size", "bpe_sample_pairs")
ARGUMENT_CLASSES = (RunArguments, DataArguments, ModelArguments, Seq2SeqTrainingArguments)
PRECISION_FIELDS = ("bf16", "fp16")  # Trainer fields that --precision decides


@dataclass
class Arguments:
    run: RunArguments
    data: DataArguments
    model: ModelArguments
    training: Seq2SeqTrainingArguments
    given: frozenset = frozenset()  # the flags the command line or the recipe set
    flags: frozenset = frozenset()  # the flags the command line set
    # with --model_name_or_path: the config its model becomes (pretrained.pretrained_config)
    pretrained: MarianPosEncConfig | None = None

    @property
    def planned_schedule(self) -> bool:
        """The learning-rate schedule is planned for the time budget (`schedule.BudgetSchedule`)."""
        fixed = {"lr_scheduler_type", "warmup_steps", "max_steps"} & self.flags
        return self.run.schedule == "budget" and bool(self.run.minutes) and not fixed

    @property
    def length_buckets(self) -> list[int] | None:
        """The length buckets of the token-budget batches: --length_buckets, else under --torch_compile
        `COMPILE_LENGTH_BUCKETS` (so that the compiled graphs are reused), else None (no bucket padding, which
        costs the eager step time for nothing)."""
        if self.data.max_tokens is None or self.model.architecture == "stock_marian":
            return None
        if self.data.length_buckets is not None:
            return self.data.length_buckets
        return list(COMPILE_LENGTH_BUCKETS) if self.training.torch_compile else None

    @property
    def checkpoints_dir(self) -> Path:
        return Path(f"{self.training.output_dir}-checkpoints")


def recipe_names() -> list[str]:
    return sorted(path.stem for path in RECIPES.glob("*.yaml"))


def recipe_path(name: str, relative_to: Path | None = None) -> Path:
    """A recipe name (`multi30k-en-de-small`) or a path to a YAML file (`my.yaml`, `recipes/wmt.yml`): from the
    current folder, or from `relative_to` (the folder of a recipe that `extends` it)."""
    if name.endswith((".yaml", ".yml")) or "/" in name:
        path = Path(name)
        path = path if path.is_absolute() or relative_to is None else relative_to / path
        if not path.is_file():
            raise ValueError(f"recipe file {path} does not exist")
        return path
    path = RECIPES / f"{name}.yaml"
    if not path.is_file():
        raise ValueError(
            f"unknown recipe {name!r}; available: {', '.join(recipe_names())}, or a path to a .yaml"
        )
    return path


def load_recipe(name: str, seen: tuple[Path, ...] = (), relative_to: Path | None = None) -> dict:
    """A recipe's settings over those of the recipe it `extends`, its data paths as written (relative ones are
    read under the data root: `resolve_data_paths`); errors name the recipe file."""
    path = recipe_path(name, relative_to).resolve()
    if path in seen:
        raise ValueError(f"recipe {path} extends itself through {' -> '.join(map(str, seen))}")
    try:
        settings = yaml.safe_load(path.read_text(encoding="utf-8")) or {}
    except (yaml.YAMLError, UnicodeDecodeError) as error:
        raise ValueError(f"recipe {path} is not valid YAML: {error}") from None
    if not isinstance(settings, dict):
        raise ValueError(f"recipe {path} must be a mapping of settings, got a {type(settings).__name__}")
    parent = {}
    if "extends" in settings:
        parent = load_recipe(str(settings.pop("extends")), (*seen, path), relative_to=path.parent)
    overrides = settings.get("config_overrides", {})
    if not isinstance(overrides, dict):
        raise ValueError(f"recipe {path}: config_overrides must be a mapping of MarianPosEncConfig fields")
    return {**parent, **settings, "config_overrides": {**parent.get("config_overrides", {}), **overrides}}


def resolve_data_paths(recipe: dict, name: str, flags: set[str], root: Path | None) -> None:
    """The recipe's relative data paths that the command line does not replace, read under the data root;
    without one, an error that names the path and both ways to set the root."""
    for key in DATA_PATH_FIELDS:
        value = recipe.get(key)
        if not isinstance(value, str) or key in flags or Path(value).is_absolute():
            continue
        if root is None:
            raise ValueError(
                f"recipe {name} reads {key}={value} under the data root, and {data_root_hint(None)}"
            )
        recipe[key] = str(root / value)


def flags_from_file(path: Path) -> list[str]:
    """`train.py args.json`: a JSON or YAML mapping of flags, as the command line would give them."""
    try:
        settings = yaml.safe_load(path.read_text(encoding="utf-8"))  # JSON is YAML
    except (OSError, yaml.YAMLError, UnicodeDecodeError) as error:
        raise ValueError(f"arguments file {path} cannot be read: {error}") from None
    if not isinstance(settings, dict):
        raise ValueError(
            f"arguments file {path} must hold a mapping of flags, got a {type(settings).__name__}"
        )
    argv = []
    for key, value in settings.items():
        if isinstance(value, dict):
            value = json.dumps(value)
        values = value if isinstance(value, list) else [value]
        argv += [f"--{key}", *(str(v).lower() if isinstance(v, bool) else str(v) for v in values)]
    return argv


def parse_args(argv=None) -> Arguments:
    """Command line over recipe over the dataclass defaults; unknown recipes and recipe keys are errors."""
    argv = list(sys.argv[1:] if argv is None else argv)
    if len(argv) == 1 and argv[0].endswith((".json", ".yaml", ".yml")) and not argv[0].startswith("-"):
        argv = flags_from_file(Path(argv[0]))
    parser = HfArgumentParser(ARGUMENT_CLASSES, description=__doc__)
    parser.set_defaults(output_dir=None)
    known = parser.parse_known_args(argv)[0]
    recipe_name = known.recipe
    model_name_or_path = known.model_name_or_path
    try:
        recipe = load_recipe(recipe_name)
        recipe.setdefault("data_dir", DataArguments.data_dir)  # the default is read under the data root too
        resolve_data_paths(recipe, recipe_name, given_flags(argv), data_root(known.data_root))
    except ValueError as error:
        parser.error(str(error))
    known = {action.dest for action in parser._actions}
    unknown = sorted(set(recipe) - known, key=str)
    if unknown:
        parser.error(f"recipe {recipe_name} has unknown keys {unknown}; allowed: {', '.join(sorted(known))}")
    check_recipe_values(parser, recipe, recipe_name)
    if model_name_or_path or recipe.get("model_name_or_path"):
        ignore_recipe_model_settings(recipe, recipe_name, given_flags(argv))
    recipe_overrides = recipe.pop("config_overrides")
    flags = frozenset(given_flags(argv))
    given = frozenset(set(recipe) | flags)
    if given & set(PRECISION_FIELDS):
        flags = " ".join(f"--{name}" for name in sorted(given & set(PRECISION_FIELDS)))
        parser.error(f"set the precision with --precision (auto, bf16, fp16, fp32), not {flags}")
    parser.set_defaults(**recipe)
    if cpu_launch():
        if sharding := sharded_launch():
            parser.error(
                f"{sharding} was launched on CPUs: accelerate shards only over accelerators, and with use_cpu its "
                "processes would run plain DDP (its MULTI_CPU mode) while the config promises sharding; launch "
                "with train_scripts/accelerate/cpu_ddp_2proc.yaml on CPUs, or the FSDP/DeepSpeed config on GPUs"
            )
        if "use_cpu" not in given:
            parser.set_defaults(
                use_cpu=True
            )  # the Trainer's processes form their group (gloo) only with use_cpu
    try:
        run, data, model, training = parser.parse_args_into_dataclasses(argv, look_for_args_file=False)
    except ValueError as error:  # the Trainer's own checks of its fields
        parser.error(str(error))
    args = Arguments(run, data, model, training, given, flags)
    try:
        check_arguments(args, recipe_overrides)
    except ValueError as error:
        parser.error(str(error))
    if "output_dir" not in given:  # the Trainer's own default ("trainer_output") names no run
        training.output_dir = str(OUTPUTS / f"{Path(run.recipe).stem}-{module_name(args)}")
    return args


def cpu_launch() -> bool:
    """Started as one of several processes on CPUs: by `accelerate launch` with `use_cpu: true` (its
    ACCELERATE_USE_CPU), or by any launcher (WORLD_SIZE > 1) on a machine without an accelerator."""
    if os.environ.get("ACCELERATE_USE_CPU", "").lower() in ("1", "true", "yes"):
        return True
    return int(os.environ.get("WORLD_SIZE", "1")) > 1 and not torch.accelerator.is_available()


def sharded_launch() -> str | None:
    """The sharding `accelerate launch` was asked for (its FSDP or DeepSpeed config), or None."""
    for variable, name in (("ACCELERATE_USE_FSDP", "FSDP"), ("ACCELERATE_USE_DEEPSPEED", "DeepSpeed")):
        if os.environ.get(variable, "").lower() in ("1", "true", "yes"):
            return name
    return None


def ignore_recipe_model_settings(recipe: dict, name: str, flags: set[str]) -> None:
    """With --model_name_or_path the loaded model brings its size, modules and tokenizer: the recipe's settings for
    a model built from scratch (`MODEL_SETTINGS`) are dropped, each named in a warning, unless the command line
    sets them too (then the command line's value is used, or checked against the model)."""
    ignored = [key for key in MODEL_SETTINGS if key in recipe and key not in flags]
    ignored = [key for key in ignored if key != "config_overrides" or recipe[key]]
    for key in ignored:
        recipe.pop(key)
    recipe["config_overrides"] = {}
    if ignored:
        logging.getLogger("train").warning(
            "--model_name_or_path: the model and its tokenizer decide the size, modules and vocabulary; recipe %s's "
            "%s ignored",
            name,
            ", ".join(ignored),
        )


def given_flags(argv: list[str]) -> set[str]:
    return {arg[2:].split("=")[0] for arg in argv if arg.startswith("--")}


def check_arguments(args: Arguments, recipe_overrides: dict) -> None:
    """ValueErrors for settings whose value alone shows they are wrong, before any data is read; merges the
    recipe's config_overrides under those of the command line."""
    run, data, model, training = args.run, args.data, args.model, args.training
    check_numbers(args)
    check_hub(args)
    if run.average_last and run.average_best:
        raise ValueError("choose one of --average_last and --average_best")
    if (run.average_last or run.average_best) and training.save_strategy != "steps":
        raise ValueError("checkpoint averaging needs checkpoints: --save_strategy steps --save_steps N")
    if run.eval_bleu and training.eval_strategy == "no":
        raise ValueError(
            "--eval_bleu scores the validation set at each evaluation: set --eval_strategy steps --eval_steps N"
        )
    averaged = run.average_last or run.average_best
    if training.max_steps > 0 and not run.minutes and training.max_steps // training.save_steps < averaged:
        raise ValueError(
            f"--max_steps={training.max_steps} with --save_steps={training.save_steps} writes "
            f"{training.max_steps // training.save_steps} checkpoints, fewer than the {averaged} to average "
            "(--average_last / --average_best)"
        )
    if run.average_best and training.eval_steps != training.save_steps:
        raise ValueError(
            "--average_best needs the validation loss at every checkpoint: --eval_steps = --save_steps"
        )
    if training.max_steps == 0 or training.max_steps < -1:
        raise ValueError(
            f"--max_steps={training.max_steps} must be positive (or -1: --num_train_epochs decides)"
        )
    if not run.minutes and training.max_steps == -1 and training.num_train_epochs <= 0:
        raise ValueError("no training budget: set --minutes, --max_steps or a positive --num_train_epochs")
    if data.max_tokens is not None and data.max_tokens < data.max_length:
        raise ValueError(
            f"--max_tokens={data.max_tokens} cannot hold a sentence of --max_length={data.max_length} tokens: "
            f"a batch must fit the longest accepted sentence (raise --max_tokens or lower --max_length)"
        )
    if data.concat_group_sizes is not None:
        if not data.concat_probability:
            raise ValueError(
                "--concat_group_sizes needs --concat_probability above 0 (no example is joined without it)"
            )
        try:
            check_augmentation(data.concat_probability, data.concat_group_sizes)
        except ValueError as error:  # names the value: "group_sizes=[2, 1]: expected ..."
            raise ValueError(f"--concat_{error}") from None
    model.config_overrides = json.dumps({**recipe_overrides, **config_overrides(model.config_overrides)})
    check_combinations(args, model_fields(args), flag_names(args))
    if model.model_name_or_path:
        vocabulary = [f"--{name}" for name in VOCABULARY_FLAGS if name in args.flags]
        if vocabulary:
            raise ValueError(
                f"{' and '.join(vocabulary)} size a BPE learned on the data; with --model_name_or_path the model's "
                "tokenizer is used (or --tokenizer_name_or_path): drop them"
            )
        args.pretrained = pretrained_config(
            model.model_name_or_path, model_fields(args), model.architecture, flag_names(args)
        )
    elif model.architecture == "marian_posenc":
        model_config(args, vocab_size=data.vocab_size, pad=0, eos=1)  # validates every model setting now


def config_overrides(text: str) -> dict:
    try:
        overrides = json.loads(text)
    except json.JSONDecodeError as error:
        raise ValueError(f"--config_overrides is not valid JSON ({error}): {text!r}") from None
    if not isinstance(overrides, dict):
        raise ValueError(f"--config_overrides must be a JSON object of config fields, got {text!r}")
    return overrides


def module_name(args: Arguments) -> str:
    model = args.model
    if model.architecture == "stock_marian":
        return "stock-marian"
    default = (args.pretrained or MarianPosEncConfig()).encoder_position_encoding
    return (
        model.position_encoding or model.encoder_position_encoding or model.encoder_self_attention or default
    )


def flag_names(args: Arguments) -> dict[str, str]:
    """Each config field that a ModelArguments flag sets, with the flag that sets it (errors name the flag)."""
    flags = {
        "encoder_layers": "--layers",
        "decoder_layers": "--layers",
        "encoder_attention_heads": "--heads",
        "decoder_attention_heads": "--heads",
        "encoder_ffn_dim": "--ffn_dim",
        "decoder_ffn_dim": "--ffn_dim",
    }
    for name in json.loads(args.model.config_overrides):  # --config_overrides wins over the flags
        flags[name] = f"--config_overrides {name}"
    return {name: flags.get(name, f"--{name}") for name in model_fields(args)}


# The sentence-end id the settings check validates `--sentence_positions` with, before the tokenizer exists (not the
# padding, end-of-sequence or decoder-start id of the check's stand-in vocabulary).
SENTENCE_END_STAND_IN = 2


def model_fields(args: Arguments, sentence_end_ids: list[int] | None = None) -> dict:
    """The MarianPosEncConfig fields the user (or recipe) set: the model flags, then --config_overrides; with
    --sentence_positions, `sentence_end_ids` (the tokenizer's) as `sentence_end_token_ids`."""
    model = args.model
    names = (
        "position_encoding",
        "encoder_position_encoding",
        "decoder_position_encoding",
        "encoder_self_attention",
        "decoder_self_attention",
        "cross_attention",
        "d_model",
        "dropout",
        "max_position_embeddings",
    )
    fields = {
        "encoder_layers": model.layers,
        "decoder_layers": model.layers,
        "encoder_attention_heads": model.heads,
        "decoder_attention_heads": model.heads,
        "encoder_ffn_dim": model.ffn_dim,
        "decoder_ffn_dim": model.ffn_dim,
        **{name: getattr(model, name) for name in names},
    }
    fields = {name: value for name, value in fields.items() if value is not None}
    fields.update(json.loads(model.config_overrides))
    if model.sentence_positions:
        fields["sentence_end_token_ids"] = (
            [SENTENCE_END_STAND_IN] if sentence_end_ids is None else sentence_end_ids
        )
    return fields


def model_config(
    args: Arguments, vocab_size: int, pad: int, eos: int, sentence_end_ids: list[int] | None = None
) -> MarianPosEncConfig:
    """The config from what the user (or recipe) set: unset fields keep MarianPosEncConfig's defaults. An
    invalid setting is a ValueError naming the field."""
    fields = model_fields(args, sentence_end_ids)
    tokens = dict(
        vocab_size=vocab_size,
        pad_token_id=pad,
        decoder_start_token_id=pad,
        eos_token_id=eos,
        forced_eos_token_id=eos,
    )
    try:
        return MarianPosEncConfig(**tokens, **fields)
    except (ValueError, TypeError, StrictDataclassFieldValidationError) as error:
        raise ValueError(f"invalid model settings: {error}") from None
