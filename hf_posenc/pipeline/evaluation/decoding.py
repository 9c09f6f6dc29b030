"""Decoding: `translate` is the one decoding loop (evaluation, the analyses and the study go through it) and
`load_translation_model` the one loader of a saved model folder, each with errors that name the bad setting or
the missing file. Needs only the base install (no scoring library), so the CTranslate2 export can use it."""

import json
import re
import time
from collections.abc import Sequence
from concurrent.futures import ThreadPoolExecutor
from contextlib import contextmanager
from functools import partial
from pathlib import Path

import torch

from ...generation_length import LengthControl
from ...model_checks import check_generation_settings
from ..cli import check_number
from ..training.hardware import SCORE_BYTES, check_memory
from ..training.pretrained import MODEL_TYPES
from ..training.progress import LOG_EVERY_SECONDS, ProgressReport
from .quantization import is_int8, quantize_int8

# The files `from_pretrained` reads a model's weights from (one of them).
WEIGHT_FILES = (
    "model.safetensors",
    "model.safetensors.index.json",
    "pytorch_model.bin",
    "pytorch_model.bin.index.json",
)


# Decoding settings that count something: below 1 they decode nothing or fail deep inside `generate`.
def source_kind(index: int, source) -> str:
    """ "text" or "ids" for one source of `translate`; an error naming `sources[index]` for anything else (the
    tokenizer would fail on it deep inside, or read a `bytes` object as token ids) and for an empty source, which
    has nothing to translate."""
    if isinstance(source, str):
        if not source.strip():
            raise ValueError(
                f"sources[{index}]={source!r} is empty: there is nothing to translate; drop it from the sources"
            )
        return "text"
    ids = source.tolist() if isinstance(source, torch.Tensor) else source
    if isinstance(ids, (list, tuple)) and all(isinstance(i, int) and not isinstance(i, bool) for i in ids):
        if not ids:
            raise ValueError(f"sources[{index}] holds no token id: there is nothing to translate; drop it")
        return "ids"
    raise TypeError(
        f"sources[{index}]={source!r:.60} is neither a text (str) nor a list of token ids (ints) made by the "
        "tokenizer"
    )


def check_sources(sources) -> str:
    """The kind of every source of `translate` ("text" or "ids", one for all); a TypeError for a single text
    (whose characters would each be translated), a generator or any other non-list, and a mixture of kinds."""
    if isinstance(sources, (str, bytes)) or not isinstance(sources, Sequence):
        raise TypeError(
            f"sources must be a list of texts (or of token-id lists), got a {type(sources).__name__}"
            + (": put one text in a list, [text]" if isinstance(sources, str) else "")
        )
    kinds = {source_kind(index, source) for index, source in enumerate(sources)}
    if len(kinds) > 1:
        raise TypeError("sources mix texts and token-id lists: give one kind")
    return next(iter(kinds), "text")


def check_decoding_settings(model, generate_kwargs: dict) -> None:
    """Refuse decoding settings that would decode garbage without an error: a non-finite float (a NaN length
    penalty ranks every beam alike and collapses the output) or a count below 1, given by the caller or saved
    in the model's generation config: the model's own rule (`check_generation_settings`), before any decoding."""
    saved = model.generation_config.to_dict()
    check_generation_settings(
        saved, generate_kwargs, "in the model's generation_config.json", "given to translate"
    )


# A sentence ends at sentence-final punctuation, with any closing quotes or brackets, followed by white space
# (group 1: the white space the sentences are cut at).
SENTENCE_BREAK = re.compile(r"[.!?。！？][\"'»”’)\]]*(\s+)")


def split_sentences(text: str) -> list[str]:
    """The sentences of `text`, cut at the white space after sentence-final punctuation (`SENTENCE_BREAK`); a
    text without such a break is one sentence. A punctuation rule, not a trained splitter: an abbreviation's
    dot followed by a space ("Mr. Smith") also ends a sentence."""
    if not isinstance(text, str):
        raise TypeError(f"split_sentences takes a text (str), got a {type(text).__name__}: {text!r:.60}")
    pieces, start = [], 0
    for match in SENTENCE_BREAK.finditer(text):
        pieces.append(text[start : match.start(1)])
        start = match.end(1)
    pieces.append(text[start:])
    return [piece for piece in pieces if piece.strip()] or [text]


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
    split_sentences: bool = False,
    **generate_kwargs,
) -> list[str]:
    """Translate in length-sorted batches (less padding), returning outputs in the input order.

    `sources` are texts, or token ids `tokenizer` made (the word-order probe permutes tokens, which must not be
    tokenised again), in a list (`check_sources`: not one text, no empty source); the tokenizer pads each batch. Decoding settings come from the model's saved generation
    config unless given in `generate_kwargs` (`check_decoding_settings` refuses NaN and counts below 1). Under
    `bf16` decoding runs in bf16 autocast. Progress (sentences done/total) goes to a tqdm bar when
    `progress_stream` (default stderr) is a terminal and `progress_bar` is on, else to log lines every
    `progress_every_seconds`. hf_posenc's models decode through the fast loop (`fast_decoding=True`, token-identical
    to transformers' loop; fast_decoding.py) unless `generate_kwargs` say `fast_decoding=False`. On the CPU with
    several torch threads, the batches decode side by side (`decoding_workers`). A model made int8
    (`load_translation_model(..., int8=True)`, quantization.py) computes in float32 around its int8 layers: `bf16`
    is refused for it.

    With `split_sentences`, every source text is cut into its sentences (`split_sentences`), the sentences of all
    texts are translated as one set, and each text's translations are joined with a space in their order: a
    document translated sentence by sentence, so that no input is longer than the sentences the model was trained
    on (the length harness's ceiling, docs/length.md).
    """
    check_number("batch_size", batch_size, minimum=1, integer=True)
    if not isinstance(bf16, bool):
        raise TypeError(f"bf16={bf16!r} must be True or False")
    if bf16 and is_int8(model):
        raise ValueError(
            "bf16=True: the model's linear layers are int8 (quantize_int8), which compute in float32; allowed "
            "with an int8 model: bf16=False"
        )
    kind = check_sources(sources)
    progress = {"progress_every_seconds": progress_every_seconds, "progress_stream": progress_stream}
    progress["progress_bar"] = progress_bar
    if split_sentences:
        if kind != "text":
            raise ValueError(
                "split_sentences=True needs source texts, not token ids (ids cannot be cut into sentences)"
            )
        return translate_by_sentence(
            model, tokenizer, sources, batch_size, bf16, **progress, **generate_kwargs
        )
    check_decoding_settings(model, generate_kwargs)
    beams = generate_kwargs.get("num_beams") or model.generation_config.num_beams or 1
    vocabulary = model.get_output_embeddings().out_features  # as train.py's check reads it
    order = sorted(range(len(sources)), key=lambda i: len(sources[i]))
    batches = [order[start : start + batch_size] for start in range(0, len(order), batch_size)]
    workers = decoding_workers(model, len(batches), generate_kwargs)
    check_decoding_memory(min(batch_size * workers, len(sources)), beams, vocabulary, model.device)
    model.eval()
    outputs = [None] * len(sources)
    report = ProgressReport(
        len(sources), "decoding", progress_every_seconds, progress_stream, bar=progress_bar
    )
    started, done = time.monotonic(), 0
    decode = partial(decode_batch, model, tokenizer, sources, bf16, beams, generate_kwargs)
    with batch_map(workers) as decoded:
        for indices, texts in zip(batches, decoded(decode, batches), strict=True):
            for index, text in zip(indices, texts, strict=True):
                outputs[index] = text
            done += len(indices)
            rate = done / max(time.monotonic() - started, 1e-9)
            report.update(done, f"{done}/{len(sources)} sentences, {rate:.1f} sentences/s")
    report.close()
    return outputs


# generate's arguments that are the caller's objects, which may hold state across the rows of one call: their
# batches decode one after another
CALLER_OBJECTS = ("logits_processor", "stopping_criteria", "prefix_allowed_tokens_fn", "streamer")


def decoding_workers(model, batches: int, generate_kwargs: dict) -> int:
    """How many batches `translate` decodes side by side: on the CPU one per torch thread (at most one per batch),
    each on its share of the threads, which decodes faster than every thread on one batch after another
    (docs/decoding.md); one on other devices, with a single batch, one thread, or an object of the caller's among
    `generate_kwargs` (`CALLER_OBJECTS`). The translations are those of one batch after another."""
    if model.device.type != "cpu" or CALLER_OBJECTS & generate_kwargs.keys():
        return 1
    return max(1, min(torch.get_num_threads(), batches))


@contextmanager
def batch_map(workers: int):
    """`map` over batches in this thread (one worker), or on `workers` threads that share torch's threads out
    between them (torch's thread count restored after; on an error, the batches not started are dropped)."""
    if workers == 1:
        yield map
        return
    threads = torch.get_num_threads()
    torch.set_num_threads(threads // workers)  # the workers' intra-op threads (read when a thread first runs)
    pool = ThreadPoolExecutor(workers, thread_name_prefix="hf-posenc-decoding")
    try:
        yield pool.map
    finally:
        pool.shutdown(cancel_futures=True)
        torch.set_num_threads(threads)


@torch.no_grad()
def decode_batch(
    model, tokenizer, sources, bf16: bool, beams: int, generate_kwargs: dict, indices
) -> list[str]:
    """The translations of `sources[indices]`, one batch (`generate_batch`), with a GPU's out-of-memory error
    named (the CPU's memory is checked before, `check_decoding_memory`)."""
    try:
        return generate_batch(model, tokenizer, [sources[i] for i in indices], bf16, generate_kwargs)
    except torch.OutOfMemoryError:
        raise ValueError(
            f"decoding {len(indices)} sentences x {beams} beams at once ran out of {model.device} memory: "
            "lower batch_size or num_beams"
        ) from None


def check_decoding_memory(sentences: int, beams: int, vocabulary: int, device) -> None:
    """Refuse batches whose decoding steps' scores alone need more memory than `device` has available
    (`check_memory`): rows (sentences x beams) x the vocabulary x `SCORE_BYTES`. Both engines check it (`translate`
    and the CTranslate2 export's)."""
    rows = sentences * beams
    check_memory(
        rows * vocabulary * SCORE_BYTES,
        device,
        f"decoding {sentences} sentence{'s' * (sentences != 1)} x {beams} beams at once (a step's scores: {rows} "
        f"rows x {vocabulary} tokens)",
        "lower batch_size or num_beams",
    )


def generate_batch(model, tokenizer, chunk: list, bf16: bool, generate_kwargs: dict) -> list[str]:
    """One padded batch of texts or token ids through `generate`, decoded to text."""
    if isinstance(chunk[0], str):
        batch = tokenizer(chunk, return_tensors="pt", padding=True)
    else:
        batch = tokenizer.pad({"input_ids": [list(ids) for ids in chunk]}, return_tensors="pt")
    # hf_posenc's models: the fast loop, token-identical to transformers' (fast_decoding.py)
    if hasattr(model, "generate_fast"):
        generate_kwargs = {"fast_decoding": True, **generate_kwargs}
    with torch.autocast(device_type=model.device.type, dtype=torch.bfloat16, enabled=bf16):
        generated = model.generate(**batch.to(model.device), **generate_kwargs)
    return tokenizer.batch_decode(generated, skip_special_tokens=True)


def translate_by_sentence(model, tokenizer, sources: Sequence[str], batch_size: int, bf16: bool, **kwargs):
    """`translate` with `split_sentences`: each text's sentences translated on their own, joined again."""
    texts = [split_sentences(text) for text in sources]
    flat = [sentence for sentences in texts for sentence in sentences]
    translations = iter(translate(model, tokenizer, flat, batch_size, bf16, **kwargs))
    return [" ".join(next(translations) for _ in sentences) for sentences in texts]


def load_translation_model(folder, trust_remote_code: bool = False, *, int8: bool = False, **config_fields):
    """(model, tokenizer) of a saved model folder, with errors that name what is missing or unreadable; the
    generation config is checked as `generate` would check it (`check_saved_generation_config`). `config_fields`
    change the saved config's fields for this load (e.g. `rope_scaling` at inference). With `int8`, the model's
    linear layers are replaced by int8 ones for inference on the CPU (`quantize_int8`; docs/decoding.md)."""
    from transformers import AutoModelForSeq2SeqLM

    if not isinstance(int8, bool):
        raise TypeError(f"int8={int8!r} must be True or False")
    folder = Path(folder)
    check_model_files(folder)
    try:
        model = AutoModelForSeq2SeqLM.from_pretrained(
            folder, trust_remote_code=trust_remote_code, **config_fields
        )
    except RuntimeError as error:
        if "ignore_mismatched_sizes" not in str(error):
            raise
        raise ValueError(
            f"the weights in {folder} have other shapes than its config.json asks for (the loading report above "
            "lists them): config.json was edited, or the weights are another model's; restore the config they "
            "were saved with"
        ) from None
    check_saved_generation_config(model, folder)
    if int8:
        quantize_int8(model.eval(), inplace=True)
    return model, load_tokenizer(folder, trust_remote_code)


def check_model_files(folder: Path) -> None:
    """A model folder holds a readable config.json of a model type the tools decode, weights and a tokenizer."""
    if not folder.is_dir():
        raise FileNotFoundError(f"model folder {folder} does not exist")
    config = folder / "config.json"
    if not config.is_file():
        raise ValueError(f"{folder} has no config.json: it is not a saved model")
    try:
        model_type = json.loads(config.read_text(encoding="utf-8")).get("model_type")
    except (UnicodeDecodeError, json.JSONDecodeError, AttributeError) as error:
        raise ValueError(f"{config} is not a JSON object of model settings ({error})") from None
    if model_type not in MODEL_TYPES:
        raise ValueError(
            f"{config} has model_type={model_type!r}; allowed: "
            + ", ".join(f"{name!r} ({kind})" for name, kind in MODEL_TYPES.items())
        )
    if not any((folder / name).is_file() for name in WEIGHT_FILES):
        raise ValueError(f"{folder} has no weights: none of {', '.join(WEIGHT_FILES)} is there")
    if not any((folder / name).is_file() for name in ("tokenizer.json", "tokenizer_config.json")):
        raise ValueError(
            f"{folder} has no tokenizer (tokenizer.json); save the tokenizer beside the model, as train.py does"
        )


def check_saved_generation_config(model, folder: Path) -> None:
    """The model's generation config, refused by name at load time where `generate` would refuse it (a non-finite
    or out-of-range setting, a bad length-control key), so that nothing (an export, a long decoding) starts with
    it."""
    origin = f"in {folder / 'generation_config.json'}"
    try:
        LengthControl.from_settings(model.generation_config, {}, model.config)
    except ValueError as error:
        raise ValueError(f"{error} ({origin})") from None
    check_generation_settings(model.generation_config.to_dict(), {}, origin)


def load_tokenizer(folder: Path, trust_remote_code: bool = False):
    """The folder's tokenizer; one that cannot be read is an error naming the folder's tokenizer files."""
    from transformers import AutoTokenizer

    try:
        return AutoTokenizer.from_pretrained(folder, trust_remote_code=trust_remote_code)
    except ImportError:  # a package this tokenizer needs (sentencepiece): named by the tools (cli.run_cli)
        raise
    except Exception as error:  # the tokenizers library raises a bare Exception for a file it cannot parse
        files = sorted(path.name for path in folder.glob("tokenizer*.json"))
        raise ValueError(
            f"the tokenizer of {folder} ({', '.join(files)}) cannot be read: {type(error).__name__}: {error}; "
            "save the tokenizer again beside the model (tokenizer.save_pretrained(folder))"
        ) from error
