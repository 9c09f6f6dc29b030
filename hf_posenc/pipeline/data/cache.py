"""The data cache's entries: where the cache lives, keys and their digests, and an entry written whole (built in a
staging folder and renamed into place) or opened with its manifest. A damaged entry (unreadable, truncated,
overwritten, gone) is named and removed to be built again; a read-only cache is read without its lock; a cache
folder that is a file, a cache that cannot be written and a full disk are errors naming the folder. What the
entries hold (text, BPE, token ids, examples) is `corpus.py`'s."""

import errno
import hashlib
import json
import logging
import os
import shutil
import tempfile
from collections.abc import Callable
from pathlib import Path

import datasets

from ..cli import disk_full

logger = logging.getLogger(__name__)


CACHE_VERSION = 1  # part of every key: a change of what an entry holds makes new entries


MANIFEST = "manifest.json"


CACHE_ENVIRONMENT = "HF_POSENC_CACHE"


def default_cache_dir() -> Path:
    """`$HF_POSENC_CACHE`, else `hf_posenc` in the user's cache folder (`$XDG_CACHE_HOME`, `~/.cache`): outside
    the run folders, which are uploaded, replaced by `--overwrite_output_dir` and named per module, so that
    reruns, resumed runs and the runs of every module on the same data share one tokenised copy."""
    if os.environ.get(CACHE_ENVIRONMENT):
        return Path(os.environ[CACHE_ENVIRONMENT])
    return Path(os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache") / "hf_posenc"


def digest(key: dict) -> str:
    return hashlib.sha256(json.dumps(key, sort_keys=True).encode("utf-8")).hexdigest()[:20]


def file_key(path: Path) -> dict:
    status = path.stat()
    return {"path": str(path.resolve()), "size": status.st_size, "mtime_ns": status.st_mtime_ns}


def open_entry(folder: Path, opener: Callable[[Path, dict], object]) -> tuple[object, dict] | None:
    """A complete entry opened by `opener(folder, manifest)` and its manifest, or None where there is none. An
    entry whose manifest or files are unreadable, truncated or gone is damaged: it is removed to be built again,
    and named in the log; in a cache this process cannot write, it is an error naming the command that removes
    it."""
    if not (folder / MANIFEST).is_file():
        return None
    try:
        manifest = json.loads((folder / MANIFEST).read_text())
        return opener(folder, manifest), manifest
    # damage shows as whatever the reader raises: json, pyarrow, the tokenizers library (a bare Exception)
    except Exception as error:
        problem = f"{type(error).__name__}: {error}"
    try:
        shutil.rmtree(folder)
    except OSError as error:
        raise ValueError(
            f"the data cache entry {folder} is damaged ({problem}) and cannot be removed here ({error}); remove "
            f"it with `rm -r {folder}` (it is built again), or give another --data_cache_dir"
        ) from None
    logger.warning("the data cache entry %s is damaged (%s): building it again", folder, problem)
    return None


def counted(dataset: datasets.Dataset, manifest: dict, name: str) -> datasets.Dataset:
    """`dataset`, checked to hold the rows the manifest records under `name` (an entry overwritten by another)."""
    if name in manifest and len(dataset) != manifest[name]:
        raise ValueError(f"{len(dataset)} rows where the manifest records {manifest[name]} {name}")
    return dataset


def cache_write_error(cache: Path, error: OSError) -> ValueError:
    """What to do when the cache folder cannot take an entry: a full disk, or no permission to write."""
    if disk_full(error):
        return ValueError(
            f"the data cache {cache} ran out of disk space ({error.strerror}); free space there, or give "
            "--data_cache_dir a folder on a disk with room"
        )
    return ValueError(
        f"the data cache {cache} cannot be written ({error}); give a writable --data_cache_dir, or one that "
        "holds this data's entries"
    )


def cache_of(entry: Path) -> Path:
    """The cache folder an entry (`<cache>/<stage>/<entry>`) lies in."""
    return Path(*entry.parts[:-2])


def write_entry(folder: Path, key: dict, build: Callable[[Path], dict]) -> dict:
    """A cache entry: `build(staging)` writes its files into a staging folder beside `folder` and returns what
    the manifest records; the folder is renamed into place only once complete."""
    try:
        folder.parent.mkdir(parents=True, exist_ok=True)
        if folder.exists():  # a folder without a manifest: not ours to trust
            shutil.rmtree(folder)
        staging = Path(tempfile.mkdtemp(dir=folder.parent, prefix=f".{folder.name}-"))
    except OSError as error:
        raise cache_write_error(cache_of(folder), error) from None
    try:
        manifest = {"key": key, **build(staging)}
        (staging / MANIFEST).write_text(json.dumps(manifest, indent=2) + "\n")
        staging.rename(folder)
    except BaseException as error:
        shutil.rmtree(staging, ignore_errors=True)
        if isinstance(error, OSError) and disk_full(error):
            raise cache_write_error(cache_of(folder), error) from None
        raise
    return manifest


def open_cache(cache: Path) -> bool:
    """The cache folder made ready (its lock and build folders), and whether this process can write it; a
    path that is, or lies under, a file is an error naming it."""
    existing = next(path for path in (cache, *cache.parents) if path.exists())
    if not existing.is_dir():
        raise ValueError(
            f"the data cache folder {cache} (--data_cache_dir, else ${CACHE_ENVIRONMENT}) "
            f"{'is' if existing == cache else 'lies under'} the file {existing}; give a folder"
        )
    try:
        for folder in ("locks", "build"):
            (cache / folder).mkdir(parents=True, exist_ok=True)
        tempfile.TemporaryFile(dir=cache / "locks").close()
    except OSError as error:
        if error.errno not in (errno.EACCES, errno.EPERM, errno.EROFS):
            raise cache_write_error(cache, error) from None
        logger.info(
            "the data cache %s cannot be written (%s): reading it without a lock", cache, error.strerror
        )
        return False
    return True
