"""The checks of train.py's settings (arguments.py) that read more than one field's value: a recipe's raw values
against the flags they set (`check_recipe_values`), the numbers (`check_numbers`), the Hub upload (`check_hub`) and
the settings that contradict one another (`check_combinations`). Each raises a ValueError naming the setting (the
recipe and key, or the flag), its value and what is allowed."""

import json
import math
from typing import TYPE_CHECKING

from .pretrained import MARIAN_FIELDS

if TYPE_CHECKING:
    from .arguments import Arguments

# The Hub upload happens once, when the run's folder is complete; the Trainer's pushes during training do not.
HUB_STRATEGIES = ("end",)
# YAML reads these words, unquoted, as booleans: a recipe's `eval_strategy: no` is False, not "no".
YAML_BOOLEAN_WORDS = "yes/no, on/off, true/false"


def check_recipe_values(parser, recipe: dict, name: str) -> None:
    """Refuse (`parser.error`: one line, exit 2) a recipe value that the command line would refuse for the flag of
    its key. A recipe's values become the parser's defaults, which argparse neither checks against a flag's
    choices nor converts unless they are strings: `schedule: budgett` trained with the fixed schedule, `minutes:
    [1, 2]` or `learning_rate: null` failed deep inside the Trainer or torch, `eval_strategy: no` (a YAML
    boolean) failed naming neither the recipe nor the key."""
    actions = {action.dest: action for action in parser._actions}
    for key, value in recipe.items():
        action = actions.get(key)
        problem = None if action is None or key == "config_overrides" else value_problem(action, value)
        if problem:
            parser.error(f"recipe {name}: {key}={value!r} {problem}")


def value_problem(action, value) -> str | None:
    """What is wrong with `value` as the default of `action` (an argparse action of HfArgumentParser), or None."""
    if value is None:
        return None if action.default is None else "is empty (null): give a value, or leave the key out"
    if action.choices is not None:
        if value in action.choices:
            return None
        hint = f" (YAML reads an unquoted {YAML_BOOLEAN_WORDS} as a boolean: quote it)" * isinstance(
            value, bool
        )
        return f"is not allowed; allowed: {', '.join(map(str, action.choices))}{hint}"
    if action.nargs in ("+", "*"):
        if not isinstance(value, list):
            return f"must be a list, e.g. [{value!r}]"
        return next(filter(None, (number_problem(action.type, item) for item in value)), None)
    return number_problem(action.type, value)


def number_problem(kind, value) -> str | None:
    """What is wrong with `value` for a flag of type `kind` (int or float; others are not checked), or None."""
    if kind not in (int, float):
        return None
    if isinstance(value, str):
        try:
            kind(value)
        except ValueError:
            return f"is not a {'whole ' * (kind is int)}number"
        return None
    if isinstance(value, bool) or not isinstance(value, int | float):
        return f"must be a {'whole ' * (kind is int)}number, not a {type(value).__name__}"
    return "must be a whole number" if kind is int and not isinstance(value, int) else None


def check_numbers(args: "Arguments") -> None:
    """Counts at least their minimum, rates and probabilities finite and in range, before anything runs."""
    run, data, model, training = args.run, args.data, args.model, args.training
    at_least = {
        "--average_last": (run.average_last, 0),
        "--average_best": (run.average_best, 0),
        "--vocab_size": (data.vocab_size, 1),
        "--max_length": (data.max_length, 1),
        "--train_limit": (data.train_limit, 1),
        "--test_limit": (data.test_limit, 1),
        "--max_train_length": (data.max_train_length, 1),
        "--max_tokens": (data.max_tokens, 1),
        "--threads": (run.threads, 1),
        "--d_model": (model.d_model, 1),
        "--layers": (model.layers, 1),
        "--heads": (model.heads, 1),
        "--ffn_dim": (model.ffn_dim, 1),
        "--num_beams": (model.num_beams, 1),
        "--window_sentences": (model.window_sentences, 1),
        "--gradient_accumulation_steps": (training.gradient_accumulation_steps, 1),
        "--save_steps": (training.save_steps, 1),
        "--eval_steps": (training.eval_steps, 1),
        "--examples": (run.examples, 0),
        "--warmup_steps": (training.warmup_steps, 0),
        "--per_device_train_batch_size": (training.per_device_train_batch_size, 1),
        "--per_device_eval_batch_size": (training.per_device_eval_batch_size, 1),
        "--seed": (training.seed, 0),
    }
    for flag, (value, minimum) in at_least.items():
        if value is not None and not (math.isfinite(value) and value >= minimum):  # NaN passes `<`
            raise ValueError(
                f"{flag}={value} must be {'' if math.isfinite(value) else 'a finite number, '}at least {minimum}"
            )
    ranges = {  # flag: (value, low, high), inclusive
        "--minutes": (run.minutes, 0.0, math.inf),
        "--learning_rate": (training.learning_rate, 0.0, math.inf),
        "--concat_probability": (data.concat_probability, 0.0, 1.0),
        "--dropout": (model.dropout, 0.0, 1.0),
        "--length_penalty": (model.length_penalty, -math.inf, math.inf),
        "--label_smoothing_factor": (training.label_smoothing_factor, 0.0, 1.0),
        "--weight_decay": (training.weight_decay, 0.0, math.inf),
        "--max_grad_norm": (training.max_grad_norm, 0.0, math.inf),
    }
    for flag, (value, low, high) in ranges.items():
        if value is not None and not (math.isfinite(value) and low <= value <= high):
            bounds = [f"at least {low:g}"] if math.isfinite(low) else []
            bounds += [f"at most {high:g}"] if math.isfinite(high) else []
            raise ValueError(
                f"{flag}={value} must be a finite number" + (f", {' and '.join(bounds)}" if bounds else "")
            )
    if training.learning_rate == 0:
        raise ValueError("--learning_rate=0 trains nothing: give a positive learning rate")


def check_hub(args: "Arguments") -> None:
    """The upload is honoured field by field (`export.push_to_hub`); a Hub field this tool cannot honour is
    refused by name instead of being ignored."""
    training = args.training
    hub_fields = {name for name in args.given if name.startswith("hub_")} - {"hub_dry_run"}
    if not training.push_to_hub:
        if hub_fields:
            raise ValueError(f"--{', --'.join(sorted(hub_fields))} given without --push_to_hub")
        return
    if not training.hub_model_id:
        raise ValueError("--push_to_hub needs --hub_model_id")
    strategy = getattr(training.hub_strategy, "value", training.hub_strategy)
    if "hub_strategy" in args.given and strategy not in HUB_STRATEGIES:
        raise ValueError(
            f"--hub_strategy={strategy} is not supported: this tool uploads the run's folder once, when it is "
            f"complete; allowed: {', '.join(HUB_STRATEGIES)}"
        )
    if training.hub_always_push:
        raise ValueError("--hub_always_push is not supported: there is one upload, at the end of the run")


def check_combinations(args: "Arguments", fields: dict, flags: dict) -> None:
    """Settings that contradict one another, or one that the rest would silently ignore: a validation or test
    file without its other side; `--length_buckets` without token-budget batches; `--architecture stock_marian`
    (MarianMTModel: sinusoids, content attention, transformers' own generate) with a module choice, a MarianPosEnc config field, `--sentence_positions`,
    `--length_control` or `--window_sentences`; `--sentence_positions` (the tokenizer's sentence ends) with sentence_end_token_ids in
    --config_overrides. `fields`: the config fields set (`model_fields`), `flags`: the flag of each."""
    data, model = args.data, args.model
    for split in ("valid", "test"):
        source, target = getattr(data, f"{split}_source"), getattr(data, f"{split}_target")
        if (source is None) != (target is None):
            raise ValueError(
                f"--{split}_source and --{split}_target go together (got {source!r}, {target!r})"
            )
    if model.architecture == "stock_marian":
        set_here = sorted(set(fields) - MARIAN_FIELDS)  # --sentence_positions' ids are named as that flag
        ignored = [
            flags[key] for key in set_here if key != "sentence_end_token_ids" or not model.sentence_positions
        ]
        decoding = ("sentence_positions", "length_control", "window_sentences")
        ignored += [f"--{flag}" for flag in decoding if getattr(model, flag)]
        if ignored:
            raise ValueError(
                f"--architecture stock_marian trains transformers' MarianMTModel, which has none of "
                f"{', '.join(ignored)}: drop them, or train --architecture marian_posenc"
            )
    if data.length_buckets is not None and (data.max_tokens is None or model.architecture == "stock_marian"):
        raise ValueError(
            f"--length_buckets {' '.join(map(str, data.length_buckets))} pads token-budget batches, and this run "
            "trains on the Trainer's sentence batches (no --max_tokens, or --architecture stock_marian): drop it, "
            "or set --max_tokens"
        )
    overrides = json.loads(model.config_overrides)
    if model.sentence_positions and "sentence_end_token_ids" in overrides:
        raise ValueError(
            "--sentence_positions takes the tokenizer's sentence-end tokens, and --config_overrides (or the "
            f"recipe's) sets sentence_end_token_ids={overrides['sentence_end_token_ids']} too: give one of them"
        )
