"""Decoding: `translate` is the one decoding loop (evaluation, the analyses and the study go through it) and
`load_translation_model` the one loader of a saved model folder, each with errors that name the bad setting or
the missing file. Needs only the base install (no scoring library), so the CTranslate2 export can use it."""

import time
from collections.abc import Sequence
from pathlib import Path

import torch

from ..cli import check_number
from ..training.progress import LOG_EVERY_SECONDS, ProgressReport

# The files `from_pretrained` reads a model's weights from (one of them).
WEIGHT_FILES = (
    "model.safetensors",
    "model.safetensors.index.json",
    "pytorch_model.bin",
    "pytorch_model.bin.index.json",
)


# Decoding settings that count something: below 1 they decode nothing or fail deep inside `generate`.
DECODING_COUNTS = ("num_beams", "max_new_tokens", "max_length", "num_return_sequences")


def check_decoding_settings(model, generate_kwargs: dict) -> None:
    """Refuse decoding settings that would decode garbage without an error: a non-finite float (a NaN length
    penalty ranks every beam alike and collapses the output) or a count below 1, given by the caller or saved
    in the model's generation config."""
    saved = model.generation_config.to_dict()
    for name, value in {**saved, **generate_kwargs}.items():
        origin = "given to translate" if name in generate_kwargs else "in the model's generation_config.json"
        if isinstance(value, float):
            check_number(name, value, hint=f"the decoding setting {origin}")
        elif name in DECODING_COUNTS and value is not None:
            check_number(name, value, minimum=1, integer=True, hint=f"the decoding setting {origin}")


@torch.no_grad()
def translate(
    model,
    tokenizer,
    sources: Sequence[str] | Sequence[Sequence[int]],
    batch_size: int = 64,
    bf16: bool = False,
    *,
    progress_every_seconds: float = LOG_EVERY_SECONDS,
    progress_stream=None,
    progress_bar: bool = True,
    **generate_kwargs,
) -> list[str]:
    """Translate in length-sorted batches (less padding), returning outputs in the input order.

    `sources` are texts, or token ids `tokenizer` made (the word-order probe permutes tokens, which must not be
    tokenised again); the tokenizer pads each batch. Decoding settings come from the model's saved generation
    config unless given in `generate_kwargs` (`check_decoding_settings` refuses NaN and counts below 1). Under
    `bf16` decoding runs in bf16 autocast. Progress (sentences done/total) goes to a tqdm bar when
    `progress_stream` (default stderr) is a terminal and `progress_bar` is on, else to log lines every
    `progress_every_seconds`.
    """
    check_number("batch_size", batch_size, minimum=1, integer=True)
    check_decoding_settings(model, generate_kwargs)
    model.eval()
    order = sorted(range(len(sources)), key=lambda i: len(sources[i]))
    outputs = [None] * len(sources)
    report = ProgressReport(
        len(sources), "decoding", progress_every_seconds, progress_stream, bar=progress_bar
    )
    started = time.monotonic()
    for start in range(0, len(order), batch_size):
        indices = order[start : start + batch_size]
        chunk = [sources[i] for i in indices]
        if isinstance(chunk[0], str):
            batch = tokenizer(chunk, return_tensors="pt", padding=True)
        else:
            batch = tokenizer.pad({"input_ids": [list(ids) for ids in chunk]}, return_tensors="pt")
        with torch.autocast(device_type=model.device.type, dtype=torch.bfloat16, enabled=bf16):
            generated = model.generate(**batch.to(model.device), **generate_kwargs)
        for index, text in zip(
            indices, tokenizer.batch_decode(generated, skip_special_tokens=True), strict=True
        ):
            outputs[index] = text
        done = start + len(indices)
        rate = done / max(time.monotonic() - started, 1e-9)
        report.update(done, f"{done}/{len(sources)} sentences, {rate:.1f} sentences/s")
    report.close()
    return outputs


def load_translation_model(folder, trust_remote_code: bool = False):
    """(model, tokenizer) of a saved model folder, with errors that name what is missing."""
    from transformers import AutoModelForSeq2SeqLM, AutoTokenizer

    folder = Path(folder)
    if not folder.is_dir():
        raise FileNotFoundError(f"model folder {folder} does not exist")
    if not (folder / "config.json").is_file():
        raise ValueError(f"{folder} has no config.json: it is not a saved model")
    if not any((folder / name).is_file() for name in WEIGHT_FILES):
        raise ValueError(f"{folder} has no weights: none of {', '.join(WEIGHT_FILES)} is there")
    if not any((folder / name).is_file() for name in ("tokenizer.json", "tokenizer_config.json")):
        raise ValueError(
            f"{folder} has no tokenizer (tokenizer.json); save the tokenizer beside the model, as train.py does"
        )
    model = AutoModelForSeq2SeqLM.from_pretrained(folder, trust_remote_code=trust_remote_code)
    return model, AutoTokenizer.from_pretrained(folder, trust_remote_code=trust_remote_code)
