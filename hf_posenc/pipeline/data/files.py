"""Reading parallel text: local files (plain or gzip, one sentence per line) and HF `datasets` splits.

Bad input fails loudly with the file and the counts: a missing file, a byte that is not UTF-8, source/target
line counts that differ, an empty split, empty lines (rejected by default, or dropped in pairs and counted
with `empty_lines="skip"`). Nothing is truncated or dropped silently.

Validation and test sets are read whole (`read_parallel`, a few thousand lines); training data are streamed
(`iter_parallel`, `stream_hf_translation`) into the tokenised cache of `corpus.py`, which skips and counts
invalid training pairs instead.
"""

import gzip
import logging
import os
import zlib
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

logger = logging.getLogger(__name__)

EMPTY_LINE_POLICIES = ("error", "skip")
# The data root: the folder a recipe's relative data paths are read under (`--data_root`, else this variable).
DATA_ROOT_VARIABLE = "HF_POSENC_DATA"
BYTE_ORDER_MARK = "\ufeff"


@dataclass
class ParallelText:
    source: list[str]
    target: list[str]
    name: str

    def __len__(self):
        return len(self.source)


def read_lines(path: Path) -> list[str]:
    """Lines of a UTF-8 text file, plain or gzip; a byte that is not UTF-8 or a damaged gzip stream is an
    error naming the file (and the line)."""
    return list(iter_lines(path))


def iter_lines(path: Path) -> Iterator[str]:
    """`read_lines` one line at a time: what the training corpus streams, so that no file is held in memory."""
    path = Path(path)
    if path.is_dir():
        raise IsADirectoryError(f"parallel data file {path} is a folder; give the text file of one language")
    if not path.is_file():
        raise FileNotFoundError(f"parallel data file {path} does not exist")
    opener = gzip.open if path.suffix == ".gz" else open
    try:
        with opener(path, "rb") as handle:
            for number, raw in enumerate(handle, start=1):
                try:
                    # a byte-order mark (at the file's start, or where files were joined) is no text
                    yield raw.decode("utf-8").rstrip("\n").rstrip("\r").removeprefix(BYTE_ORDER_MARK)
                except UnicodeDecodeError as error:
                    raise ValueError(
                        f"{path}, line {number}: byte {raw[error.start : error.start + 1]!r} at column {error.start + 1} "
                        "is not UTF-8; the data must be UTF-8 text"
                    ) from None
    except (EOFError, OSError, zlib.error) as error:
        raise ValueError(
            f"{path} is not a readable {'gzip' if opener is gzip.open else 'text'} file: {error}"
        ) from None


def iter_parallel(source_path, target_path) -> Iterator[tuple[str, str]]:
    """Line-aligned pairs of two files, streamed; line counts that differ are an error naming both counts (raised
    when the shorter file ends, after counting the rest of the longer one)."""
    sources, targets = iter_lines(source_path), iter_lines(target_path)
    count = 0
    while True:
        source, target = next(sources, None), next(targets, None)
        if source is None or target is None:
            break
        count += 1
        yield source, target
    if source is not None or target is not None:
        rest_source = (source is not None) + sum(1 for _ in sources)
        rest_target = (target is not None) + sum(1 for _ in targets)
        raise ValueError(
            f"line counts differ: {source_path} has {count + rest_source} lines, "
            f"{target_path} has {count + rest_target}"
        )


def data_root(flag: str | None = None) -> Path | None:
    """The data root: `--data_root` when given, else $HF_POSENC_DATA, else None (not set)."""
    value = flag or os.environ.get(DATA_ROOT_VARIABLE)
    return Path(value) if value else None


def data_root_hint(root: Path | None) -> str:
    """What an error about missing data says of the data root, naming both ways to set it."""
    where = f"the data root is {root}" if root else "no data root is set"
    return (
        f"{where}: a recipe's relative data paths are read under --data_root DIR or {DATA_ROOT_VARIABLE}=DIR "
        "(the folder that holds multi30k/, wmt14/, ...)"
    )


def find_split_file(data_dir: Path, split: str, lang: str) -> Path:
    """`{split}.{lang}` or `{split}.{lang}.gz` inside data_dir (the shipped Multi30k layout)."""
    for candidate in (data_dir / f"{split}.{lang}.gz", data_dir / f"{split}.{lang}"):
        if candidate.is_file():
            return candidate
    hint = "" if data_dir.is_dir() else f"; {data_root_hint(data_root())}"
    raise FileNotFoundError(f"no file {split}.{lang}[.gz] in {data_dir}{hint}")


def read_parallel(
    source_path, target_path, empty_lines: str = "error", limit: int | None = None
) -> ParallelText:
    """Line-aligned source and target files -> ParallelText, validated."""
    source, target = read_lines(source_path), read_lines(target_path)
    if len(source) != len(target):
        raise ValueError(
            f"line counts differ: {source_path} has {len(source)} lines, {target_path} has {len(target)}"
        )
    if not source:
        raise ValueError(f"empty split: {source_path} and {target_path} contain no lines")
    text = drop_or_reject_empty(
        ParallelText(source, target, name=f"{source_path} / {target_path}"), empty_lines
    )
    if limit is not None:
        text = ParallelText(text.source[:limit], text.target[:limit], text.name)
    return text


def drop_or_reject_empty(text: ParallelText, empty_lines: str) -> ParallelText:
    """Pairs with an empty side: an error naming the first line (default), or dropped in pairs and counted."""
    if empty_lines not in EMPTY_LINE_POLICIES:
        raise ValueError(f"empty_lines={empty_lines!r}; allowed: {', '.join(EMPTY_LINE_POLICIES)}")
    empty = [
        i
        for i, (s, t) in enumerate(zip(text.source, text.target, strict=True))
        if not s.strip() or not t.strip()
    ]
    if not empty:
        return text
    if empty_lines == "error":
        raise ValueError(
            f"{len(empty)} empty line(s) in {text.name} (first at line {empty[0] + 1}); "
            "clean the data or pass empty_lines='skip' to drop those pairs"
        )
    logger.warning("dropping %d pairs with an empty side from %s", len(empty), text.name)
    dropped = set(empty)
    keep = [i for i in range(len(text.source)) if i not in dropped]
    return ParallelText([text.source[i] for i in keep], [text.target[i] for i in keep], text.name)


def read_split(data_dir, split: str, source_lang: str, target_lang: str, **kwargs) -> ParallelText:
    data_dir = Path(data_dir)
    return read_parallel(
        find_split_file(data_dir, split, source_lang), find_split_file(data_dir, split, target_lang), **kwargs
    )


def parallel_from_translation_dataset(
    dataset,
    source_lang: str,
    target_lang: str,
    name: str,
    empty_lines: str = "error",
    limit: int | None = None,
) -> ParallelText:
    """A `datasets` split with the WMT schema (`translation: {lang: text}`) -> validated ParallelText."""
    if "translation" not in dataset.column_names:
        raise ValueError(f"{name} has columns {dataset.column_names}; expected a 'translation' column")
    if limit is not None:
        dataset = dataset.select(range(min(limit, len(dataset))))
    pairs = dataset["translation"]
    if not pairs:
        raise ValueError(f"empty split: {name} contains no examples")
    languages = set(pairs[0])
    for lang in (source_lang, target_lang):
        if lang not in languages:
            raise ValueError(f"{name} has languages {sorted(languages)}; {lang!r} is not among them")
    source = [pair[source_lang] for pair in pairs]
    target = [pair[target_lang] for pair in pairs]
    return drop_or_reject_empty(ParallelText(source, target, name), empty_lines)


def iter_translation_pairs(
    dataset, source_lang: str, target_lang: str, name: str
) -> Iterator[tuple[str, str]]:
    """(source, target) pairs of a `datasets` split with the WMT schema (`translation: {lang: text}`), map-style
    or streamed; a missing column or language, or an empty split, is an error naming the split."""
    count = 0
    for count, row in enumerate(dataset, start=1):
        if count == 1:
            if "translation" not in row:
                raise ValueError(f"{name} has columns {sorted(row)}; expected a 'translation' column")
            for lang in (source_lang, target_lang):
                if lang not in row["translation"]:
                    raise ValueError(
                        f"{name} has languages {sorted(row['translation'])}; {lang!r} is not among them"
                    )
        pair = row["translation"]
        yield pair[source_lang] or "", pair[target_lang] or ""
    if not count:
        raise ValueError(f"empty split: {name} contains no examples")


def stream_hf_translation(
    dataset_name: str, config_name: str | None, split: str, source_lang: str, target_lang: str
) -> Iterator[tuple[str, str]]:
    """Training pairs streamed from a `datasets` corpus: a Hub id (needs the network, e.g. `wmt14` / `de-en`) or
    a local folder of data files. Streaming reads the corpus once, into the training cache (`corpus.py`),
    without a second full copy in the `datasets` cache."""
    try:
        dataset = open_hf_split(dataset_name, config_name, split)
        yield from iter_translation_pairs(
            dataset, source_lang, target_lang, name=f"{dataset_name}/{config_name}:{split}"
        )
    except ConnectionError as error:  # offline, or the Hub down: also while streaming
        raise ValueError(
            f"--hf_dataset {dataset_name}: the Hugging Face Hub could not be reached ({error}); check the network "
            "(and that HF_HUB_OFFLINE and HF_DATASETS_OFFLINE are unset), or give a local copy: a folder to "
            "--hf_dataset, or --train_source and --train_target"
        ) from None


def open_hf_split(dataset_name: str, config_name: str | None, split: str):
    """The split, streamed; a split the corpus lacks is an error naming those it has."""
    import datasets

    try:
        return datasets.load_dataset(dataset_name, config_name, split=split, streaming=True)
    except ValueError:
        splits = datasets.get_dataset_split_names(dataset_name, config_name)
        if split in splits:
            raise
        raise ValueError(
            f"--hf_dataset {dataset_name} has no split {split!r}; its splits: {', '.join(splits)}. Choose the "
            "training split with --hf_train_split"
        ) from None
