"""Training data that scales: read once, tokenised once into memory-mapped Arrow files, filtered, reused.

Held as Python lists, 1M training pairs took 7.9 GB and 6 minutes before the first update, and every run and
every resume learned the BPE and tokenised again. Here the corpus goes through three stages, each cached on
disk under the cache folder by a key of everything it depends on, so that a second run, a resumed run or
another module's run on the same data opens files instead of redoing the work:

1. tokenizer (`tokenizers/<key>/`): joint BPE learned on a deterministic sample of at most `bpe_sample_pairs`
   pairs (`bpe_sample`: all pairs in corpus order when there are no more, as `train_joint_bpe` always had
   them), or an existing tokenizer (`--tokenizer_name_or_path`, else `--model_name_or_path`'s: checked by
   `load_tokenizer`, not copied).
   Key: the data, `train_limit`, the vocabulary and sample sizes.
2. pairs (`pairs/<key>/`): every pair tokenised, with its lengths and whether a side is empty. Key: the data,
   `train_limit` and the tokenizer's fingerprint (sha256 of its tokenizer.json and special tokens).
3. examples (`examples/<key>/`): what the Trainer reads (input_ids, labels, length): the pairs the filters
   keep, joined by concatenation augmentation where asked. Key: the pairs' key, the filters and the
   augmentation. Where every pair is kept and none joined, the pairs' own files are the examples (no copy).

The data are keyed as make keys files: each file's resolved path, size and modification time (a content hash
would read a 1 GB corpus on every run); a `datasets` corpus by its id, config, split and Hub revision, a local
`datasets` folder by its files. Changing a filter re-filters the cached pairs from their lengths (seconds)
without tokenising again.

Nothing holds the corpus as Python objects: `Dataset.from_generator` streams the two files (or the streamed
`datasets` corpus) into Arrow in batches, `Dataset.map(batched=True, num_proc=...)` tokenises it, BPE reads its
sample from the memory-mapped text, and filtering, joining and batching (`batching.py`) work on numpy arrays of
lengths and offsets.

Invalid TRAINING pairs are skipped and counted by reason (validation and test sets keep every pair):

* `empty`: a side empty or blank (an error instead with `--empty_lines error`);
* `too_long`: more than `max_length` tokens on a side (or `max_train_length`, if lower), `</s>` included;
* `length_ratio`: the longer side has more than `max_length_ratio` times the tokens of the shorter, `</s>`
  excluded: the `-ratio` of Moses' `clean-corpus-n.perl`, whose default, 9, is ours; fairseq's
  `prepare-wmt14en2de.sh` runs it with `-ratio 1.5` and lengths 1-250 on the BPE text, which the WMT14 recipes
  follow.

Processes that prepare the same data at once (the ranks of a multi-process run) take turns through a file lock;
entries are written into a staging folder and renamed into place, so a killed run leaves no half entry. The
cache may be deleted at any time. An entry damaged afterwards (a file truncated, overwritten or deleted) is
named and built again. A cache this process cannot write (a complete one a team shares read-only) is read
without the lock; an entry it lacks or holds damaged is an error naming it. A full disk is an error naming the
cache folder.
"""

import logging
import os
import shutil
import tempfile
import time
from collections.abc import Callable, Iterator
from contextlib import nullcontext
from dataclasses import dataclass, fields
from functools import partial
from pathlib import Path

import datasets
import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
from datasets.arrow_writer import ArrowWriter
from filelock import FileLock
from transformers import PreTrainedTokenizerBase, PreTrainedTokenizerFast

from ..cli import disk_full
from ..training.arguments import DataArguments
from .augmentation import GROUP_SIZES, concatenation_groups
from .cache import (
    CACHE_VERSION,
    cache_write_error,
    counted,
    default_cache_dir,
    digest,
    file_key,
    open_cache,
    open_entry,
    write_entry,
)
from .files import find_split_file, iter_parallel, stream_hf_translation
from .tokenization import load_tokenizer, tokenizer_fingerprint, train_joint_bpe

logger = logging.getLogger(__name__)

TEXT_FEATURES = datasets.Features({"source": datasets.Value("string"), "target": datasets.Value("string")})
TOKEN_IDS = datasets.List(datasets.Value("int32"))
EXAMPLE_FEATURES = datasets.Features(
    {"input_ids": TOKEN_IDS, "labels": TOKEN_IDS, "length": datasets.Value("int32")}
)
PAIR_FEATURES = datasets.Features(
    {
        **EXAMPLE_FEATURES,
        "source_length": datasets.Value("int32"),
        "target_length": datasets.Value("int32"),
        "empty": datasets.Value("bool"),
    }
)
DATA_DEFAULTS = {f.name: f.default for f in fields(DataArguments)}  # each setting's one home: DataArguments
SKIP_REASONS = ("empty", "too_long", "length_ratio")
BPE_SAMPLE_SEED = 0  # fixed, not the training seed: runs with different seeds share one vocabulary
BPE_MIN_FREQUENCY = 2
READ_BATCH = 10_000  # pairs per batch when BPE reads its sample
ENCODE_BATCH = 10_000  # pairs per batch tokenised (the Rust tokenizer spreads a batch over the cores)
PAIRS_PER_WORKER = 100_000  # fewer pairs per tokenising process cost more to start than they save
EXAMPLES_PER_CHUNK = 200_000  # examples joined and written at a time (tens of MB of token ids)


@dataclass(frozen=True)
class PairSource:
    """Where the training pairs come from: `name` for logs and the model card, `key` for the cache (what
    identifies the content), `reader` streams the (source, target) pairs."""

    name: str
    key: dict
    reader: Callable[[], Iterator[tuple[str, str]]]


def file_source(source_path, target_path) -> PairSource:
    paths = [Path(source_path), Path(target_path)]
    for path in paths:
        if not path.is_file():
            raise FileNotFoundError(f"parallel data file {path} does not exist")
    return PairSource(
        f"{source_path} / {target_path}",
        {"files": [file_key(p) for p in paths]},
        partial(iter_parallel, *paths),
    )


def hf_source(dataset: str, config: str | None, split: str, source_lang: str, target_lang: str) -> PairSource:
    """A `datasets` corpus, streamed: a Hub id (keyed by its revision) or a local folder (keyed by its files)."""
    local = Path(dataset)
    if local.exists():
        files = sorted(path for path in local.rglob("*") if path.is_file())
        key = {"folder": str(local.resolve()), "files": [file_key(path) for path in files]}
    else:
        key = {"hub": dataset, "revision": hub_revision(dataset)}
    key.update(config=config, split=split, languages=[source_lang, target_lang])
    reader = partial(stream_hf_translation, dataset, config, split, source_lang, target_lang)
    return PairSource(f"{dataset}/{config}:{split}", key, reader)


def hub_revision(dataset: str) -> str | None:
    """The commit of a Hub dataset, so that a new revision makes new cache entries; None when the Hub cannot
    be asked (offline: the entries of the last revision read are used)."""
    from huggingface_hub import HfApi

    try:
        return HfApi().dataset_info(dataset).sha
    except (
        Exception
    ) as error:  # offline, no such repository, a proxy: the data are still read (or fail) later
        logger.warning(
            "cannot read the Hub revision of %s (%s): the cache is keyed without it", dataset, error
        )
        return None


def training_source(data) -> PairSource:
    """The training pairs `DataArguments` name: explicit files, else `hf_dataset`, else the `data_dir` split."""
    if (data.train_source is None) != (data.train_target is None):
        raise ValueError(
            f"--train_source and --train_target go together (got {data.train_source!r}, {data.train_target!r})"
        )
    if data.train_source is not None:
        return file_source(data.train_source, data.train_target)
    if data.hf_dataset:
        return hf_source(
            data.hf_dataset, data.hf_config, data.hf_train_split, data.source_lang, data.target_lang
        )
    directory = Path(data.data_dir)
    return file_source(
        find_split_file(directory, data.train_split, data.source_lang),
        find_split_file(directory, data.train_split, data.target_lang),
    )


@dataclass(frozen=True)
class CorpusSettings:
    """What the training corpus depends on (`from_arguments` reads them from `DataArguments`)."""

    vocab_size: int = DATA_DEFAULTS["vocab_size"]
    tokenizer_name_or_path: str | None = None
    bpe_sample_pairs: int = DATA_DEFAULTS["bpe_sample_pairs"]
    limit: int | None = None
    max_length: int = DATA_DEFAULTS["max_length"]
    max_train_length: int | None = None
    max_length_ratio: float = DATA_DEFAULTS["max_length_ratio"]  # 0: no ratio filter
    empty_lines: str = "skip"  # DataArguments' unset: training pairs are skipped and counted
    concat_probability: float = 0.0
    concat_group_sizes: tuple[int, ...] = GROUP_SIZES
    seed: int = 0
    cache_dir: str | None = None
    num_proc: int | None = None

    @classmethod
    def from_arguments(cls, data, seed: int) -> "CorpusSettings":
        return cls(
            vocab_size=data.vocab_size,
            tokenizer_name_or_path=data.tokenizer_name_or_path,
            bpe_sample_pairs=data.bpe_sample_pairs,
            limit=data.train_limit,
            max_length=data.max_length,
            max_train_length=data.max_train_length,
            max_length_ratio=data.max_length_ratio,
            empty_lines=data.empty_lines or "skip",
            concat_probability=data.concat_probability,
            concat_group_sizes=tuple(data.concat_group_sizes or GROUP_SIZES),
            seed=seed,
            cache_dir=data.data_cache_dir,
            num_proc=data.preprocessing_num_workers,
        )

    @property
    def length_bound(self) -> int:
        """The most tokens a training pair may have on a side."""
        return min(self.max_length, self.max_train_length or self.max_length)


@dataclass(frozen=True)
class CorpusSummary:
    """What the model card says of the training data, without the text: its name and how many examples."""

    name: str
    examples: int

    def __len__(self) -> int:
        return self.examples


@dataclass
class TrainingCorpus:
    tokenizer: PreTrainedTokenizerBase
    examples: datasets.Dataset  # input_ids, labels, length; memory-mapped from the cache
    summary: CorpusSummary
    report: dict  # JSON: pairs read, kept, skipped by reason, examples, cache use, token counts


class CorpusText:
    """The training text as a memory-mapped Arrow file in a build folder, read from the source the first time
    a stage needs it (and not at all when the tokenizer and the tokenised pairs are cached)."""

    def __init__(self, source: PairSource, limit: int | None, folder: Path):
        self.source, self.limit, self.folder = source, limit, folder
        self.dataset: datasets.Dataset | None = None

    def read(self) -> datasets.Dataset:
        if self.dataset is None:
            started = time.monotonic()
            try:
                self.dataset = datasets.Dataset.from_generator(
                    text_rows,
                    features=TEXT_FEATURES,
                    cache_dir=str(self.folder / "text"),
                    gen_kwargs={"source": self.source, "limit": self.limit},
                    fingerprint=digest({"text": self.source.key, "limit": self.limit}),
                )
            except (
                datasets.exceptions.DatasetGenerationError
            ) as error:  # the reader's own error, not the wrapper
                raise (error.__cause__ or error) from None
            if not len(self.dataset):
                raise ValueError(f"empty split: {self.source.name} contains no lines")
            logger.info(
                "read %d training pairs from %s in %.0f s",
                len(self.dataset),
                self.source.name,
                time.monotonic() - started,
            )
        return self.dataset


def text_rows(source: PairSource, limit: int | None) -> Iterator[dict]:
    number = 0
    for number, (source_text, target_text) in enumerate(source.reader(), start=1):
        yield {"source": source_text, "target": target_text}
        if limit is not None and number >= limit:
            return
    if not number:
        raise ValueError(
            f"the training data {source.name} hold no lines; give files with one sentence per line"
        )


def bpe_sample(count: int, sample_pairs: int, seed: int = BPE_SAMPLE_SEED) -> np.ndarray | None:
    """The pairs BPE learns from: all of them (None) when there are at most `sample_pairs`, else a uniform
    sample without replacement, in corpus order; the same for the same count and seed."""
    if count <= sample_pairs:
        return None
    return np.sort(np.random.default_rng(seed).choice(count, sample_pairs, replace=False))


def learn_bpe(text: datasets.Dataset, vocab_size: int, sample_pairs: int) -> PreTrainedTokenizerFast:
    indices = bpe_sample(len(text), sample_pairs)
    sample = text if indices is None else text.select(indices)
    logger.info(
        "learning a joint BPE of %d tokens on %d of %d training pairs", vocab_size, len(sample), len(text)
    )

    def texts() -> Iterator[list[str]]:
        for column in ("source", "target"):  # all sources, then all targets
            for batch in sample.select_columns([column]).iter(batch_size=READ_BATCH):
                yield batch[column]

    return train_joint_bpe(texts(), vocab_size=vocab_size, min_frequency=BPE_MIN_FREQUENCY)


def encode_pairs(batch: dict, tokenizer: PreTrainedTokenizerBase) -> dict:
    """`Dataset.map` function: a batch of text pairs -> token ids (with `</s>`), lengths, empty flags. A fast
    tokenizer's Rust core encodes the batch on every core, without the offsets and masks the Python wrapper would
    build; a Python tokenizer (a stock Marian model's) encodes the target side with `text_target` (Marian's target
    SentencePiece model). The ids are those `tokenize_parallel` makes (the tests check it)."""
    if isinstance(tokenizer, PreTrainedTokenizerFast):
        encode = tokenizer.backend_tokenizer.encode_batch_fast
        source = [encoding.ids for encoding in encode(batch["source"])]
        target = [encoding.ids for encoding in encode(batch["target"])]
    else:
        source = tokenizer(batch["source"])["input_ids"]
        target = tokenizer(text_target=batch["target"])["input_ids"]
    source_length = [len(ids) for ids in source]
    target_length = [len(ids) for ids in target]
    return {
        "input_ids": source,
        "labels": target,
        "length": [max(lengths) for lengths in zip(source_length, target_length, strict=True)],
        "source_length": source_length,
        "target_length": target_length,
        "empty": [
            not s.strip() or not t.strip() for s, t in zip(batch["source"], batch["target"], strict=True)
        ],
    }


def corpus_tokenizer(
    text: CorpusText, settings: CorpusSettings, cache: Path, data_key: dict
) -> tuple[PreTrainedTokenizerBase, str]:
    """The given tokenizer (`--tokenizer_name_or_path`, or `--model_name_or_path`'s), or the BPE learned on this
    data's sample (cached). Returns it and how it came."""
    if settings.tokenizer_name_or_path:
        return load_tokenizer(settings.tokenizer_name_or_path), "given"
    key = {
        **data_key,
        "stage": "tokenizer",
        "vocab_size": settings.vocab_size,
        "bpe_sample_pairs": settings.bpe_sample_pairs,
        "bpe_sample_seed": BPE_SAMPLE_SEED,
        "min_frequency": BPE_MIN_FREQUENCY,
    }
    folder = cache / "tokenizers" / digest(key)
    opened = open_entry(folder, open_tokenizer)
    if opened is not None:
        return opened[0], "reused"
    learned = learn_bpe(text.read(), settings.vocab_size, settings.bpe_sample_pairs)
    if len(learned) > settings.vocab_size:  # BPE keeps every character of the text whatever the size asked
        raise ValueError(
            f"--vocab_size={settings.vocab_size} is smaller than the {len(learned)} characters and special "
            "tokens of the training text; ask for more (the recipes use 6000-40000)"
        )

    def save(staging: Path) -> dict:
        learned.save_pretrained(staging)
        return {"vocabulary": len(learned)}

    write_entry(folder, key, save)
    return PreTrainedTokenizerFast.from_pretrained(folder), "built"


def open_tokenizer(folder: Path, manifest: dict) -> PreTrainedTokenizerFast:
    tokenizer = PreTrainedTokenizerFast.from_pretrained(folder)
    if len(tokenizer) != manifest["vocabulary"]:
        raise ValueError(f"{len(tokenizer)} tokens where the manifest records {manifest['vocabulary']}")
    return tokenizer


def open_pairs(folder: Path, manifest: dict) -> datasets.Dataset:
    shards = [datasets.Dataset.from_file(str(folder / name)) for name in manifest["files"]]
    return counted(
        shards[0] if len(shards) == 1 else datasets.concatenate_datasets(shards), manifest, "pairs"
    )


def tokenised_pairs(
    text: CorpusText, tokenizer, cache: Path, key: dict, num_proc: int | None
) -> tuple[datasets.Dataset, str]:
    """Every pair tokenised (cached): input_ids, labels, length, source_length, target_length, empty."""
    folder = cache / "pairs" / digest(key)
    opened = open_entry(folder, open_pairs)
    if opened is not None:
        return opened[0], "reused"
    raw = text.read()
    workers = num_proc or max(1, min(len(os.sched_getaffinity(0)), len(raw) // PAIRS_PER_WORKER))
    started = time.monotonic()
    pairs = raw.map(
        encode_pairs,
        batched=True,
        batch_size=ENCODE_BATCH,
        num_proc=workers if workers > 1 else None,
        remove_columns=["source", "target"],
        features=PAIR_FEATURES,
        fn_kwargs={"tokenizer": tokenizer},
        cache_file_name=str(text.folder / "pairs.arrow"),
        new_fingerprint=digest(key),
        desc="tokenising the training pairs",
    )
    produced = [Path(entry["filename"]) for entry in pairs.cache_files]
    logger.info(
        "tokenised %d training pairs in %.0f s (%d process%s)",
        len(pairs),
        time.monotonic() - started,
        workers,
        "es" if workers > 1 else "",
    )
    del pairs

    def move(staging: Path) -> dict:
        for path in produced:
            shutil.move(path, staging / path.name)
        return {"files": [path.name for path in produced], "pairs": len(raw)}

    manifest = write_entry(folder, key, move)
    return open_pairs(folder, manifest), "built"


def column(dataset: datasets.Dataset, name: str) -> np.ndarray:
    """A scalar column of a cached table (no index mapping) as one numpy array."""
    return dataset.data.column(name).to_numpy()


def list_lengths(dataset: datasets.Dataset, name: str) -> np.ndarray:
    """The lengths of the lists in a column, from their offsets, in batches of Arrow slices (the token ids
    themselves are not read)."""
    batches = dataset.select_columns([name]).with_format("arrow").iter(batch_size=EXAMPLES_PER_CHUNK)
    return np.concatenate([pc.list_value_length(batch[name]).to_numpy() for batch in batches])


def filter_pairs(pairs: datasets.Dataset, settings: CorpusSettings, name: str) -> tuple[np.ndarray, dict]:
    """The indices of the pairs kept (in corpus order) and the count skipped for each reason (a pair counts
    for the first reason it meets: empty, too_long, length_ratio)."""
    source_length, target_length = column(pairs, "source_length"), column(pairs, "target_length")
    empty = column(pairs, "empty")
    if settings.empty_lines == "error" and empty.any():
        raise ValueError(
            f"{int(empty.sum())} empty line(s) in {name} (first at line {int(empty.argmax()) + 1}); clean the "
            "data or pass --empty_lines skip to skip those pairs"
        )
    too_long = ~empty & (np.maximum(source_length, target_length) > settings.length_bound)
    bad_ratio = np.zeros_like(empty)
    if settings.max_length_ratio:
        source_tokens, target_tokens = source_length - 1, target_length - 1  # without </s>
        shorter = np.maximum(np.minimum(source_tokens, target_tokens), 1)
        longer = np.maximum(source_tokens, target_tokens)
        bad_ratio = ~empty & ~too_long & (longer > settings.max_length_ratio * shorter)
    kept = np.flatnonzero(~(empty | too_long | bad_ratio))
    skipped = {
        "empty": int(empty.sum()),
        "too_long": int(too_long.sum()),
        "length_ratio": int(bad_ratio.sum()),
    }
    if not len(kept):
        raise ValueError(
            f"no training pair of {name} passes the filters (skipped: {skipped}; at most {settings.length_bound} "
            f"tokens a side, a length ratio of at most {settings.max_length_ratio})"
        )
    return kept, skipped


def example_groups(
    pairs: datasets.Dataset, kept: np.ndarray, settings: CorpusSettings
) -> tuple[np.ndarray, int]:
    """Starts of the training examples over the kept pairs (see `augmentation.concatenation_groups`), joined
    examples longer than `max_length` tokens on a side split back into their pairs; and how many were split."""
    count = len(kept)
    if not settings.concat_probability:
        return np.arange(count + 1, dtype=np.int64), 0
    starts = concatenation_groups(
        count, settings.concat_probability, settings.concat_group_sizes, seed=settings.seed
    )
    sizes = np.diff(starts)  # (E,)
    joined_length = np.zeros(len(sizes), dtype=np.int64)
    for name in ("source_length", "target_length"):  # each part but the last loses its </s>
        lengths = column(pairs, name)[kept].astype(np.int64)
        joined_length = np.maximum(joined_length, np.add.reduceat(lengths, starts[:-1]) - (sizes - 1))
    too_long = (sizes > 1) & (joined_length > settings.max_length)
    if not too_long.any():
        return starts, 0
    is_start = np.zeros(count, dtype=bool)
    is_start[starts[:-1]] = True
    is_start |= np.repeat(too_long, sizes)  # every pair of a split example starts its own
    return np.append(np.flatnonzero(is_start), count), int(too_long.sum())


def join_rows(ids: pa.ChunkedArray | pa.ListArray, starts: np.ndarray) -> pa.ListArray:
    """Consecutive rows of token ids joined into one list per example (rows `starts[e]:starts[e + 1]`), the
    last token (`</s>`) of every row but an example's last dropped: the ids of the joined text."""
    if isinstance(ids, pa.ChunkedArray):
        ids = ids.combine_chunks()
    offsets = ids.offsets.to_numpy()  # (R + 1,) into ids.values
    values = ids.values.to_numpy()[offsets[0] : offsets[-1]]
    offsets = offsets - offsets[0]
    last = np.zeros(len(offsets) - 1, dtype=bool)  # (R,) the last row of its example
    last[starts[1:] - 1] = True
    keep = np.ones(len(values), dtype=bool)
    keep[offsets[1:][~last] - 1] = False
    row_lengths = np.diff(offsets) - ~last
    example_offsets = np.concatenate([[0], np.cumsum(np.add.reduceat(row_lengths, starts[:-1]))])
    return pa.ListArray.from_arrays(pa.array(example_offsets, pa.int32()), pa.array(values[keep], pa.int32()))


def write_examples(pairs: datasets.Dataset, kept: np.ndarray, starts: np.ndarray, path: Path) -> None:
    """The training examples into one Arrow file, EXAMPLES_PER_CHUNK examples at a time."""
    token_ids = pairs.select_columns(["input_ids", "labels"]).with_format("arrow")
    writer = ArrowWriter(path=str(path), features=EXAMPLE_FEATURES)
    for first in range(0, len(starts) - 1, EXAMPLES_PER_CHUNK):
        chunk = starts[first : first + EXAMPLES_PER_CHUNK + 1]
        rows = token_ids[kept[chunk[0] : chunk[-1]]]
        local = chunk - chunk[0]
        source, target = join_rows(rows["input_ids"], local), join_rows(rows["labels"], local)
        length = pc.max_element_wise(pc.list_value_length(source), pc.list_value_length(target))
        writer.write_table(pa.table({"input_ids": source, "labels": target, "length": length}))
    writer.finalize()


def training_examples(
    pairs: datasets.Dataset, kept: np.ndarray, settings: CorpusSettings, cache: Path, pairs_key: dict
) -> tuple[datasets.Dataset, str, dict]:
    """The examples the Trainer reads (input_ids, labels, length), how they came, and what joining did."""
    if len(kept) == len(pairs) and not settings.concat_probability:
        return pairs.select_columns(list(EXAMPLE_FEATURES)), "pairs", {}
    augmentation = (
        {
            "probability": settings.concat_probability,
            "group_sizes": list(settings.concat_group_sizes),
            "seed": settings.seed,
        }
        if settings.concat_probability
        else None
    )
    key = {
        **pairs_key,
        "stage": "examples",
        "length_bound": settings.length_bound,
        "max_length": settings.max_length,
        "max_length_ratio": settings.max_length_ratio,
        "concatenation": augmentation,
    }
    folder = cache / "examples" / digest(key)
    opened = open_entry(folder, open_examples)
    status = "reused"
    if opened is None:
        starts, split = example_groups(pairs, kept, settings)

        def build(staging: Path) -> dict:
            write_examples(pairs, kept, starts, staging / "examples.arrow")
            joined = int((np.diff(starts) > 1).sum())
            examples = len(starts) - 1
            return {
                "files": ["examples.arrow"],
                "joined": joined,
                "split_too_long": split,
                "examples": examples,
            }

        manifest = write_entry(folder, key, build)
        opened, status = (open_examples(folder, manifest), manifest), "built"
    examples, manifest = opened
    concatenation = (
        {**augmentation, "joined": manifest["joined"], "split_too_long": manifest["split_too_long"]}
        if augmentation
        else {}
    )
    return examples, status, concatenation


def open_examples(folder: Path, manifest: dict) -> datasets.Dataset:
    return counted(datasets.Dataset.from_file(str(folder / "examples.arrow")), manifest, "examples")


@dataclass
class CorpusBuild:
    """What the cache stages gave: the tokenizer, the pairs read, those kept and why the others were skipped,
    the examples, each stage's cache status, and what joining did ({} without concatenation)."""

    tokenizer: PreTrainedTokenizerBase
    pairs: datasets.Dataset
    kept: np.ndarray
    skipped: dict
    examples: datasets.Dataset
    cache_status: dict
    concatenation: dict


def prepare_training_corpus(source: PairSource, settings: CorpusSettings) -> TrainingCorpus:
    """The tokenizer and the training examples of `source`, from the cache where it holds them."""
    started = time.monotonic()
    cache = Path(settings.cache_dir) if settings.cache_dir else default_cache_dir()
    build = build_corpus(source, settings, cache)
    report = corpus_report(source, settings, cache, build, started)
    log_corpus_report(report)
    name = source.name
    if build.concatenation:
        name += (
            f" (concatenated: p={settings.concat_probability}, group sizes {list(settings.concat_group_sizes)}, "
            f"seed {settings.seed})"
        )
    summary = CorpusSummary(name, len(build.examples))
    return TrainingCorpus(build.tokenizer, build.examples, summary, report)


def build_corpus(source: PairSource, settings: CorpusSettings, cache: Path) -> CorpusBuild:
    """Each stage (tokenizer, tokenised pairs, examples) from the cache or built into it, under a lock per
    data key, so processes preparing the same data wait for one another. A cache this process cannot write is
    read without the lock (nothing is written into it), its build folder in the system's temporary folder."""
    data_key = {"version": CACHE_VERSION, "data": source.key, "limit": settings.limit}
    writable = open_cache(cache)
    lock = FileLock(str(cache / "locks" / f"{digest(data_key)}.lock")) if writable else nullcontext()
    try:
        with lock, tempfile.TemporaryDirectory(dir=cache / "build" if writable else None) as build:
            text = CorpusText(source, settings.limit, Path(build))
            tokenizer, tokenizer_status = corpus_tokenizer(text, settings, cache, data_key)
            pairs_key = {**data_key, "stage": "pairs", "tokenizer": tokenizer_fingerprint(tokenizer)}
            pairs, pairs_status = tokenised_pairs(text, tokenizer, cache, pairs_key, settings.num_proc)
            kept, skipped = filter_pairs(pairs, settings, source.name)
            examples, examples_status, concatenation = training_examples(
                pairs, kept, settings, cache, pairs_key
            )
    except OSError as error:
        if disk_full(error):  # the build folder's writes are in the cache too
            raise cache_write_error(cache, error) from None
        raise
    status = {"tokenizer": tokenizer_status, "pairs": pairs_status, "examples": examples_status}
    return CorpusBuild(tokenizer, pairs, kept, skipped, examples, status, concatenation)


def corpus_report(
    source: PairSource, settings: CorpusSettings, cache: Path, build: CorpusBuild, started: float
) -> dict:
    """The JSON report: pairs read, kept, skipped by reason, examples, token counts, cache use, and the seconds
    since `started` (a `time.monotonic()` reading)."""
    source_lengths = list_lengths(build.examples, "input_ids")
    target_lengths = list_lengths(build.examples, "labels")
    return {
        "source": source.name,
        "pairs_read": len(build.pairs),
        "pairs_kept": len(build.kept),
        "skipped": build.skipped,
        "filters": {
            "max_length": settings.length_bound,
            "max_length_ratio": settings.max_length_ratio,
            "empty_lines": settings.empty_lines,
        },
        "examples": len(build.examples),
        "concatenation": build.concatenation or None,
        "source_tokens": int(source_lengths.sum()),
        "target_tokens": int(target_lengths.sum()),
        "longest_source": int(source_lengths.max()),
        "longest_target": int(target_lengths.max()),
        "tokenizer": settings.tokenizer_name_or_path or f"joint BPE, {len(build.tokenizer)} tokens",
        "cache": {"folder": str(cache), **build.cache_status},
        "seconds": round(time.monotonic() - started, 1),
    }


def log_corpus_report(report: dict) -> None:
    skipped, filters, concatenation, cache = (
        report["skipped"],
        report["filters"],
        report["concatenation"],
        report["cache"],
    )
    logger.info(
        "training data: %d pairs read from %s, %d kept, skipped %d with an empty side, %d longer than %d tokens, "
        "%d with a length ratio over %g; %d training examples%s; cache %s (tokenizer %s, pairs %s, examples %s), "
        "%.0f s",
        report["pairs_read"],
        report["source"],
        report["pairs_kept"],
        skipped["empty"],
        skipped["too_long"],
        filters["max_length"],
        skipped["length_ratio"],
        filters["max_length_ratio"],
        report["examples"],
        f" ({concatenation['joined']} joined, {concatenation['split_too_long']} split back for length)"
        if concatenation
        else "",
        cache["folder"],
        cache["tokenizer"],
        cache["pairs"],
        cache["examples"],
        report["seconds"],
    )
