"""The model's guards, apart from its arithmetic: inputs that torch would fail on deep inside (or misread) get an
error naming the value, decoding settings that would decode garbage without an error are refused, and loading
names the folder, the code that builds the model, a pickled checkpoint torch will not read safely, a checkpoint
that lacks the parameters of the positional modules its config asks for and an unreadable generation_config.json
(a folder without one keeps the model's own decoding settings).

`MarianPosEncPreTrainedModel` takes `CheckedLoading` before `PreTrainedModel`; the forwards call `check_token_ids`
and `check_num_items_in_batch`, `generate` calls `check_generation_settings`.
"""

import inspect
import json
import math
import os
import pickle
import re
from pathlib import Path

import torch
from safetensors import SafetensorError
from transformers.utils import logging

from .base import PositionEncoding, TokenMixer
from .sentence_positions import SentenceCrossAttentionBias, SentenceEmbedding

logger = logging.get_logger(__name__)


def check_token_ids(ids: torch.Tensor, vocab_size: int, name: str, ignore_index: int | None = None) -> None:
    """Clear errors for inputs the embedding or the loss would fail on deep inside torch (or misread): ids that
    are not a (batch, length) integer tensor, no token at all, ids outside the vocabulary (`ignore_index`
    excepted).

    Shape and dtype are host-side metadata, checked always. The values are checked only for tensors on the CPU:
    reading them back to the host is free there, while on an accelerator it waits for the device, once per
    training step and once per decoding step.
    """
    if ids.dtype.is_floating_point or ids.dtype.is_complex or ids.dtype == torch.bool:
        raise TypeError(f"{name} must hold integer token ids (torch.long), got dtype {ids.dtype}.")
    if ids.ndim != 2:
        raise ValueError(
            f"{name} of shape {tuple(ids.shape)} must be 2-D, (batch, length)"
            + (": add the batch dimension, ids[None]." if ids.ndim == 1 else ".")
        )
    if ids.numel() == 0:
        raise ValueError(f"{name} of shape {tuple(ids.shape)} hold no token; every row needs at least one.")
    if ids.device.type != "cpu":
        return
    valid = ids if ignore_index is None else ids[ids != ignore_index]
    if valid.numel() == 0:
        raise ValueError(f"{name} are all {ignore_index} (ignored): there is no token to compute a loss on.")
    low, high = torch.aminmax(valid)
    low, high = int(low), int(high)
    if low < 0 or high >= vocab_size:
        raise ValueError(
            f"{name} hold token id {low if low < 0 else high}, outside the vocabulary 0..{vocab_size - 1}"
            + (f" (or {ignore_index}, ignored)" if ignore_index is not None else "")
            + "."
        )


def check_num_items_in_batch(num_items_in_batch, tokens: torch.Tensor) -> None:
    """The Trainer's label-token count of the whole batch (all accumulation steps and processes) divides the
    summed loss: it must be positive when this batch has label tokens (0 gave an infinite loss). Checked for a
    number or a CPU tensor only: reading a device tensor back would sync every training step."""
    on_host = not isinstance(num_items_in_batch, torch.Tensor) or num_items_in_batch.device.type == "cpu"
    if on_host and tokens.device.type == "cpu" and not num_items_in_batch > 0:
        raise ValueError(
            f"num_items_in_batch={int(num_items_in_batch)} must be positive: it counts the label tokens of the "
            f"whole batch, and this part alone holds {int(tokens)}."
        )


# Generation settings that count something: below 1 they decode nothing or fail deep inside `generate`.
GENERATION_COUNTS = ("num_beams", "max_new_tokens", "max_length", "num_return_sequences")
# Settings that count from 0: below it (or a fraction) transformers turns them off or fails on them deep inside
# (`max_new_tokens_over_source`: new tokens allowed beyond the source length; the loop guard's n, 0 = off).
GENERATION_COUNTS_FROM_ZERO = ("max_new_tokens_over_source", "no_repeat_ngram_size")
GENERATION_CONFIG_FILE = "generation_config.json"
# The decoding settings a warning names when a folder's generation config is missing (the model's own are kept).
OWN_DECODING_SETTINGS = ("num_beams", "length_penalty", "max_new_tokens_over_source")


def check_generation_settings(
    saved: dict,
    given: dict,
    saved_origin: str = "in the generation config",
    given_origin: str = "given to generate",
) -> None:
    """Refuse generation settings that decode garbage without an error: a non-finite float (a NaN length
    penalty ranks every beam alike and returns NaN scores; a NaN temperature or top_p samples from NaN), alone or
    inside a list or tuple (`exponential_decay_length_penalty`), a count of `GENERATION_COUNTS` below 1 or one of
    `GENERATION_COUNTS_FROM_ZERO` below 0 (a negative n-gram size silently turns the loop guard off; a negative
    or fractional `max_new_tokens_over_source` gives a budget shorter than the source, or fails in `generate`).
    `saved`: the generation config's settings (`GenerationConfig.to_dict()`), `given`: the call's keyword
    arguments, which take precedence; the error names the setting, its value and where it came from.
    `transformers` checks neither (NaN passes every range comparison)."""
    for name, value in {**saved, **given}.items():
        origin = given_origin if name in given else saved_origin
        numbers = value if isinstance(value, (list, tuple)) else [value]
        if any(isinstance(number, float) and not math.isfinite(number) for number in numbers):
            raise ValueError(
                f"{name}={value} must be a finite number ({origin}): give a finite value, or leave the setting "
                "out to use transformers' default."
            )
        counts = name in GENERATION_COUNTS and value is not None and not isinstance(value, bool)
        if counts and (not isinstance(value, int) or value < 1):
            raise ValueError(
                f"{name}={value} must be at least 1 ({origin})"
                + ("; 1: greedy decoding." if name == "num_beams" else ".")
            )
        from_zero = name in GENERATION_COUNTS_FROM_ZERO and value is not None
        if from_zero and (not isinstance(value, int) or isinstance(value, bool) or value < 0):
            raise ValueError(f"{name}={value!r} must be a whole number of at least 0 ({origin}).")


def could_be_hub_id(name) -> bool:
    """Whether `name` may be a Hub model id ("name" or "owner/name") rather than only a local path."""
    if isinstance(name, os.PathLike):
        return False
    return not (os.path.isabs(name) or name.startswith((".", "~")) or name.count("/") > 1 or "\\" in name)


def differing_code_files(folder: Path, package: Path) -> list[str]:
    """The model code files a saved folder holds (its copy of the model closure) that differ from `package`'s."""
    return [
        copy.name
        for copy in sorted(folder.glob("*.py"))
        if (ours := package / copy.name).is_file()
        and copy.resolve() != ours.resolve()
        and copy.read_bytes() != ours.read_bytes()
    ]


def pickled_weights_message(folder: Path | None, error: Exception) -> str:
    """What to do about a pickled checkpoint (pytorch_model.bin) that torch's safe loader refuses: it holds
    objects besides tensors (a training script's arguments, a whole model), which only an unsafe unpickling,
    able to run any code the file carries, would read."""
    files = (
        sorted(path.name for path in folder.glob("pytorch_model*.bin")) if folder and folder.is_dir() else []
    )
    where = (
        f"{folder}/{files[0]}" if len(files) == 1 else f"the pickled weights in {folder or 'the checkpoint'}"
    )
    refused = re.search(r"GLOBAL (\S+)", str(error))  # the object torch's message names
    return (
        f"{where} holds objects besides tensors"
        + (f" ({refused.group(1)})" if refused else "")
        + ", which torch's safe loader (weights_only=True) refuses. Convert it to safetensors where "
        "you trust its source: state = torch.load(path, weights_only=False); keep only its tensors; "
        "model.load_state_dict(...) and model.save_pretrained(folder), which writes model.safetensors (then "
        "delete the .bin). Do not load files of unknown origin with weights_only=False: unpickling runs code."
    )


def check_generation_config_file(folder: Path) -> None:
    """A folder's generation_config.json that is not a JSON object is an error naming it: transformers would fall
    back, with an info message only, to a generation config built from config.json (greedy, at most 20 tokens)."""
    path = folder / GENERATION_CONFIG_FILE
    if not path.is_file():
        return
    try:
        settings = json.loads(path.read_text(encoding="utf-8"))
    except (UnicodeDecodeError, json.JSONDecodeError) as error:
        raise ValueError(
            f"{path} cannot be read ({error}): correct it, or delete it to decode with the model's own settings."
        ) from None
    if not isinstance(settings, dict):
        raise ValueError(
            f"{path} holds a {type(settings).__name__}, not a mapping of generation settings: correct it, or "
            "delete it to decode with the model's own settings."
        )


class CheckedLoading:
    """`from_pretrained` with the loading checks; mixed into the model classes before `PreTrainedModel`."""

    @classmethod
    def from_pretrained(cls, pretrained_model_name_or_path, *args, **kwargs):
        """`PreTrainedModel.from_pretrained`, saying which model code builds the model (the installed package's
        classes win over a folder's own copy whenever `hf_posenc` is imported: a warning names the files of
        that copy that differ), naming the folder when it does not exist or its weights or generation_config.json
        cannot be read (`check_generation_config_file`), and refusing a checkpoint that lacks parameters of the
        model's positional modules (`check_positional_parameters_loaded`)."""
        source = pretrained_model_name_or_path  # a folder, a Hub id, or None with a `state_dict`
        folder = Path(os.fspath(source)).expanduser() if source is not None else None
        if folder is not None:
            cls.check_model_folder(source, folder)
            check_generation_config_file(folder / (kwargs.get("subfolder") or ""))
        wants_loading_info = kwargs.pop("output_loading_info", False)
        try:
            model, loading_info = super().from_pretrained(source, *args, output_loading_info=True, **kwargs)
        except SafetensorError as error:
            raise ValueError(
                f"the weights in {folder} cannot be read (truncated or damaged?): {error}"
            ) from None
        except pickle.UnpicklingError as error:
            raise ValueError(pickled_weights_message(folder, error)) from error
        except OSError as error:
            if folder is None or folder.is_dir():
                raise
            raise OSError(
                f"{source} is not a local folder ({folder.resolve()} does not exist) and could not be loaded "
                f"as a Hub model id: {error}"
            ) from error
        model.check_positional_parameters_loaded(loading_info["missing_keys"], folder or "the state_dict")
        return (model, loading_info) if wants_loading_info else model

    @classmethod
    def check_model_folder(cls, source, folder: Path) -> None:
        """A path that cannot be a Hub id must be an existing folder; a folder's copy of the model code is
        compared with the classes that build the model, file by file."""
        if not folder.is_dir() and not could_be_hub_id(source):
            raise FileNotFoundError(
                f"no model folder at {folder}: the path does not exist or is not a folder."
            )
        package = Path(inspect.getfile(cls)).parent
        if folder.is_dir() and (differing := differing_code_files(folder, package)):
            logger.warning(
                "%s carries model code that differs from %s (%s), which builds the model; load without "
                "importing hf_posenc (trust_remote_code=True) to use the folder's own code.",
                folder,
                package,
                ", ".join(differing),
            )
        logger.info("loading %s with the model code of %s", folder, package)

    def adjust_generation_fn(
        self,
        generation_config,
        from_auto_class,
        from_pipeline,
        pretrained_model_name_or_path,
        *args,
        **kwargs,
    ):
        """`GenerationMixin.adjust_generation_fn` (from_pretrained's loading of the generation config), keeping the
        decoding settings the model's constructor chose (beam 4, length penalty 0.6, source length + 50, length
        control off) for a local folder without generation_config.json, with a warning. transformers would build a
        generation config from config.json instead: greedy, at most 20 tokens (`max_length` 20), every
        translation cut there without an error."""
        own = self.generation_config
        super().adjust_generation_fn(
            generation_config, from_auto_class, from_pipeline, pretrained_model_name_or_path, *args, **kwargs
        )
        if generation_config is not None or pretrained_model_name_or_path is None:
            return
        folder = Path(os.fspath(pretrained_model_name_or_path)).expanduser() / (kwargs.get("subfolder") or "")
        if folder.is_dir() and not (folder / GENERATION_CONFIG_FILE).is_file():
            logger.warning(
                "%s has no %s: decoding with the model's own settings (%s), not transformers' 20-token default; "
                "save model.generation_config into the folder to keep other settings.",
                folder,
                GENERATION_CONFIG_FILE,
                ", ".join(f"{key}={getattr(own, key, None)}" for key in OWN_DECODING_SETTINGS),
            )
            self.generation_config = own

    def check_positional_parameters_loaded(self, missing_keys, source) -> None:
        """Raise when a checkpoint that holds this model's other parameters lacks some of its position
        encodings' or token mixers' parameters.

        That is a checkpoint of another module choice (e.g. a config.json edited to another position
        encoding): transformers would initialise the missing tables at random and only report them. A
        checkpoint without any of the model's parameters keeps transformers' report. Non-persistent buffers
        (the sinusoid table) are never in a checkpoint and do not count; a folded model's tables are parameters
        of its saved folder like any other.
        """
        parameters = {name for name, _ in self.named_parameters(remove_duplicate=False)}
        missing = parameters & set(missing_keys)
        owners = {
            name: module
            for name, module in self.named_modules()
            if isinstance(
                module, (PositionEncoding, TokenMixer, SentenceEmbedding, SentenceCrossAttentionBias)
            )
        }
        positional = {}
        for key in sorted(missing):
            owner = max((name for name in owners if key.startswith(name + ".")), key=len, default=None)
            if owner is not None:
                module = owners[owner]
                field = (
                    f"{module.stack}_position_encoding"
                    if isinstance(module, PositionEncoding)
                    else module.site
                    if isinstance(module, TokenMixer)
                    else module.config_field
                )
                positional.setdefault(f"{field}={getattr(self.config, field)!r}", []).append(key)
        if positional and missing != parameters:
            raise ValueError(
                f"the checkpoint in {source} lacks parameters of the model's positional modules: "
                + "; ".join(f"{choice}: {', '.join(keys)}" for choice, keys in positional.items())
                + ". The config asks for modules these weights were not trained with (config.json edited?) and "
                "they would start random: restore the config the weights were saved with, or convert on purpose "
                "(MarianPosEncForConditionalGeneration.from_marian, or load_state_dict(strict=False))."
            )
