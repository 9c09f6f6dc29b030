"""Reading parallel text: local files (plain or gzip, one sentence per line) and HF `datasets` splits.

Bad input fails loudly with the file and the counts: a missing file, source/target line counts that
differ, an empty split, empty lines (rejected by default, or dropped in pairs and counted with
`empty_lines="skip"`). Nothing is truncated or dropped silently.
"""

import gzip
import logging
import os
import zlib
from dataclasses import dataclass
from pathlib import Path

logger = logging.getLogger(__name__)

EMPTY_LINE_POLICIES = ("error", "skip")
# Where the data live: relative data paths of a recipe are read under it. The shipped data sit beside the
# checkout (../shared/data); HF_POSENC_DATA points elsewhere.
DATA_ROOT = Path(os.environ.get("HF_POSENC_DATA") or Path(__file__).resolve().parents[3] / "shared" / "data")
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
    path = Path(path)
    if not path.is_file():
        raise FileNotFoundError(f"parallel data file {path} does not exist")
    opener = gzip.open if path.suffix == ".gz" else open
    lines = []
    try:
        with opener(path, "rb") as handle:
            for number, raw in enumerate(handle, start=1):
                try:
                    # a byte-order mark (at the file's start, or where files were joined) is no text
                    lines.append(raw.decode("utf-8").rstrip("\n").rstrip("\r").removeprefix(BYTE_ORDER_MARK))
                except UnicodeDecodeError as error:
                    raise ValueError(
                        f"{path}, line {number}: byte {raw[error.start : error.start + 1]!r} at column {error.start + 1} "
                        "is not UTF-8; the data must be UTF-8 text"
                    ) from None
    except (EOFError, OSError, zlib.error) as error:
        raise ValueError(
            f"{path} is not a readable {'gzip' if opener is gzip.open else 'text'} file: {error}"
        ) from None
    return lines


def find_split_file(data_dir: Path, split: str, lang: str) -> Path:
    """`{split}.{lang}` or `{split}.{lang}.gz` inside data_dir (the shipped Multi30k layout)."""
    for candidate in (data_dir / f"{split}.{lang}.gz", data_dir / f"{split}.{lang}"):
        if candidate.is_file():
            return candidate
    raise FileNotFoundError(f"no file {split}.{lang}[.gz] in {data_dir}")


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


def read_hf_translation(
    dataset_name: str, config_name: str | None, split: str, source_lang: str, target_lang: str, **kwargs
) -> ParallelText:
    """Training data from the Hub (needs network), e.g. `wmt14` / `de-en`."""
    import datasets

    dataset = datasets.load_dataset(dataset_name, config_name, split=split)
    return parallel_from_translation_dataset(
        dataset, source_lang, target_lang, name=f"{dataset_name}/{config_name}:{split}", **kwargs
    )
