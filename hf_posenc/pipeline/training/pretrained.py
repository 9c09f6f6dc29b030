"""Starting a run from an existing model: `--model_name_or_path`, the first flag of transformers'
run_translation.py. The model is a MarianPosEnc model or a stock Marian one (an opus-mt folder, say), from a
folder or the Hub (`from_pretrained` either way).

* The model keeps its config: size, vocabulary, token ids, module choices and hyperparameters. Model flags of
  the command line change it: module choices and module hyperparameters (`--config_overrides`) swap positional
  modules, parameters the new config shares with the loaded model keep their trained values and the others are
  initialised (`swap_modules`; a stock model goes through `MarianPosEncForConditionalGeneration.from_marian`,
  which follows the same rule); `--dropout` is applied. A flag that would resize a loaded tensor or move a
  token id (`SHAPE_FIELDS`) and disagrees with the model is an error naming both values (`pretrained_config`).
* A stock Marian model given no module flag becomes MarianPosEnc with sinusoidal positions and content
  attention, which computes stock Marian's outputs bit for bit (`from_marian`).
* The tokenizer is the model's (the data stage loads it with `AutoTokenizer`), or `--tokenizer_name_or_path`;
  it must agree with the model's vocabulary and token ids (`check_tokenizer`).
* Weights are loaded in float32 whatever the checkpoint's dtype: training keeps float32 master weights, and
  `--precision` decides what the training step computes in.
"""

import dataclasses
import logging

import torch
from huggingface_hub.errors import StrictDataclassFieldValidationError
from transformers import AutoConfig, MarianConfig, MarianMTModel

from ...configuration_marian_posenc import MarianPosEncConfig
from ...modeling_marian_posenc import MarianPosEncForConditionalGeneration

logger = logging.getLogger("train")

# Config fields that size a loaded tensor or give a token id its meaning: always the loaded model's.
SHAPE_FIELDS = (
    "vocab_size",
    "d_model",
    "encoder_layers",
    "decoder_layers",
    "encoder_attention_heads",
    "decoder_attention_heads",
    "encoder_ffn_dim",
    "decoder_ffn_dim",
    "max_position_embeddings",
    "pad_token_id",
    "eos_token_id",
    "forced_eos_token_id",
    "decoder_start_token_id",
)
MODEL_TYPES = {MarianConfig.model_type: "stock Marian", MarianPosEncConfig.model_type: "MarianPosEnc"}
CONFIG_FIELDS = {field.name for field in dataclasses.fields(MarianPosEncConfig)} - {"architectures", "dtype"}
MARIAN_FIELDS = {field.name for field in dataclasses.fields(MarianConfig)}


def load_config(name: str):
    """The config of `name` (a folder or a Hub id), which must be a stock Marian or a MarianPosEnc model."""
    try:
        config = AutoConfig.from_pretrained(name)
    except (OSError, ValueError) as error:
        raise ValueError(f"--model_name_or_path {name}: no model config can be loaded ({error})") from None
    if config.model_type not in MODEL_TYPES:
        raise ValueError(
            f"--model_name_or_path {name} is a {config.model_type!r} model; allowed: "
            + ", ".join(f"{kind} ({model_type!r})" for model_type, kind in MODEL_TYPES.items())
        )
    return config


def converted_config(config, fields: dict) -> MarianPosEncConfig:
    """The MarianPosEnc config of `config`'s model with `fields` set (`from_marian`'s rule: every field the
    loaded config has is kept)."""
    kept = {key: value for key, value in config.to_dict().items() if key in CONFIG_FIELDS}
    try:
        return MarianPosEncConfig(**{**kept, **fields})
    except (ValueError, TypeError, StrictDataclassFieldValidationError) as error:
        raise ValueError(f"invalid model settings for --model_name_or_path: {error}") from None


def pretrained_config(
    name: str, fields: dict, architecture: str, flags: dict[str, str]
) -> MarianPosEncConfig:
    """The config `name`'s model becomes with the command line's model `fields` (`flags` names the flag of
    each); a size or token flag that disagrees with the model is a ValueError naming both values."""
    config = load_config(name)
    conflicts = dict.fromkeys(
        f"{flags[key]} {fields[key]} (the model's {key} is {getattr(config, key)})"
        for key in SHAPE_FIELDS
        if key in fields and fields[key] != getattr(config, key)
    )
    if conflicts:
        raise ValueError(
            f"--model_name_or_path {name} decides the model's size and token ids, and these flags disagree with "
            f"it: {'; '.join(conflicts)}. Drop them"
        )
    if architecture == "stock_marian":
        if config.model_type != MarianConfig.model_type:
            raise ValueError(
                f"--architecture stock_marian trains a stock MarianMTModel; {name} is a "
                f"{MODEL_TYPES[config.model_type]} model (drop --architecture to train it)"
            )
        modules = sorted(set(fields) - MARIAN_FIELDS)
        if modules:
            raise ValueError(
                f"--architecture stock_marian has no positional modules to set: "
                f"{', '.join(flags[key] for key in modules)}"
            )
    return converted_config(config, fields)


def check_tokenizer(tokenizer, config, name: str) -> None:
    """The tokenizer fits the model: no id beyond its embedding table, the model's padding (decoder start) and
    end ids. A ValueError names each disagreement."""
    problems = []
    if len(tokenizer) > config.vocab_size:
        problems.append(f"{len(tokenizer)} tokens, more than the model's vocab_size={config.vocab_size}")
    for token, token_id, field in (
        ("pad", tokenizer.pad_token_id, "pad_token_id"),
        ("pad", tokenizer.pad_token_id, "decoder_start_token_id"),
        ("end", tokenizer.eos_token_id, "eos_token_id"),
    ):
        if token_id != getattr(config, field):
            problems.append(
                f"its {token} token is id {token_id}, the model's {field} is {getattr(config, field)}"
            )
    if problems:
        raise ValueError(
            f"the tokenizer {name} does not fit the model of --model_name_or_path: {'; '.join(problems)}"
        )


def load_pretrained(name: str, fields: dict, architecture: str):
    """The model a run starts from: `name`'s weights in float32, converted to MarianPosEnc (a stock model) with
    `fields` set, or for `--architecture stock_marian` the stock model itself."""
    stock = load_config(name).model_type == MarianConfig.model_type
    if architecture == "stock_marian":
        return MarianMTModel.from_pretrained(name, dtype=torch.float32, **fields)
    if stock:
        marian = MarianMTModel.from_pretrained(name, dtype=torch.float32)
        return MarianPosEncForConditionalGeneration.from_marian(marian, **fields)
    source = MarianPosEncForConditionalGeneration.from_pretrained(name, dtype=torch.float32)
    return swap_modules(source, fields) if fields else source


def swap_modules(source: MarianPosEncForConditionalGeneration, fields: dict):
    """`source` rebuilt with `fields` set: each parameter of the new model that `source` has in the same shape
    keeps its value; the others (a new module's, or one whose size a hyperparameter changed) are initialised."""
    model = type(source)(converted_config(source.config, fields))
    target, state = model.state_dict(), source.state_dict()
    kept = {key: value for key, value in state.items() if key in target and target[key].shape == value.shape}
    missing, _ = model.load_state_dict(kept, strict=False)
    dropped = sorted(set(state) - set(kept))
    if dropped:
        logger.info("--model_name_or_path: parameters the new modules do not use: %s", dropped)
    if missing:
        logger.info("--model_name_or_path: newly initialised parameters: %s", missing)
    model.generation_config = source.generation_config
    return model
