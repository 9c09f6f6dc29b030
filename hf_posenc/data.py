"""Reading parallel text: local files (plain or gzip, one sentence per line) and HF `datasets` splits.

Bad input fails loudly with the file and the counts: a missing file, source/target line counts that
differ, an empty split, empty lines (rejected by default, or dropped in pairs and counted with
`empty_lines="skip"`). Nothing is truncated or dropped silently.
"""

import gzip
import logging
from dataclasses import dataclass
from pathlib import Path

logger = logging.getLogger(__name__)

EMPTY_LINE_POLICIES = ("error", "skip")


@dataclass
class ParallelText:
    source: list[str]
    target: list[str]
    name: str

    def __len__(self):
        return len(self.source)


def read_lines(path: Path) -> list[str]:
    path = Path(path)
    if not path.is_file():
        raise FileNotFoundError(f"parallel data file {path} does not exist")
    opener = gzip.open if path.suffix == ".gz" else open
    with opener(path, "rt", encoding="utf-8") as handle:
        return [line.rstrip("\n").rstrip("\r") for line in handle]


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
    if empty_lines not in EMPTY_LINE_POLICIES:
        raise ValueError(f"empty_lines={empty_lines!r}; allowed: {', '.join(EMPTY_LINE_POLICIES)}")
    source, target = read_lines(source_path), read_lines(target_path)
    if len(source) != len(target):
        raise ValueError(
            f"line counts differ: {source_path} has {len(source)} lines, {target_path} has {len(target)}"
        )
    if not source:
        raise ValueError(f"empty split: {source_path} and {target_path} contain no lines")
    empty = [
        i + 1 for i, (s, t) in enumerate(zip(source, target, strict=True)) if not s.strip() or not t.strip()
    ]
    if empty and empty_lines == "error":
        raise ValueError(
            f"{len(empty)} empty line(s) in {source_path} / {target_path} (first at line {empty[0]}); "
            "clean the data or pass empty_lines='skip' to drop those pairs"
        )
    if empty:
        logger.warning(
            "dropping %d pairs with an empty side from %s / %s", len(empty), source_path, target_path
        )
        dropped = set(empty)
        pairs = [(s, t) for i, (s, t) in enumerate(zip(source, target, strict=True)) if i + 1 not in dropped]
        source, target = [s for s, _ in pairs], [t for _, t in pairs]
    if limit is not None:
        source, target = source[:limit], target[:limit]
    return ParallelText(source, target, name=str(source_path))


def read_split(data_dir, split: str, source_lang: str, target_lang: str, **kwargs) -> ParallelText:
    data_dir = Path(data_dir)
    return read_parallel(
        find_split_file(data_dir, split, source_lang), find_split_file(data_dir, split, target_lang), **kwargs
    )
