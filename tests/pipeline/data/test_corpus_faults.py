"""The data cache under faults (pipeline/data/corpus.py): an entry truncated, overwritten or deleted is named and
built again; a read-only cache (a complete one a team shares) is read without its lock, and what it cannot give
is named with the command that fixes it; a cache path that is a file and a full disk are errors naming the
folder."""

import errno
import gc
import os

import pytest
from datasets.arrow_writer import ArrowWriter
from transformers import PreTrainedTokenizerFast

from hf_posenc.pipeline.data.corpus import CorpusSettings, file_source, prepare_training_corpus
from tests.pipeline.data.test_corpus import make_corpus, token_lists


def settings(tmp_path, **overrides):
    return CorpusSettings(**{"vocab_size": 120, "cache_dir": str(tmp_path / "cache"), **overrides})


def entry(cache, stage):
    (folder,) = (cache / stage).iterdir()
    return folder


def read_only(monkeypatch, folder):
    """`folder` as a read-only file system shows it to this process (the tests may run as root, whom permission
    bits do not stop): making, writing, renaming or removing anything in it fails with EROFS."""
    real = {name: getattr(os, name) for name in ("open", "mkdir", "rename", "unlink", "rmdir")}

    def inside(path, dir_fd=None):
        if dir_fd is not None:
            path = os.path.join(os.readlink(f"/proc/self/fd/{dir_fd}"), path)
        return os.path.abspath(os.fspath(path)).startswith(str(folder))

    def guard(name):
        def call(path, *args, **kwargs):
            writes = name != "open" or args[0] & (os.O_WRONLY | os.O_RDWR | os.O_CREAT)
            if writes and inside(path, kwargs.get("dir_fd") or kwargs.get("src_dir_fd")):
                raise OSError(errno.EROFS, os.strerror(errno.EROFS), os.fspath(path))
            return real[name](path, *args, **kwargs)

        return call

    for name in real:
        monkeypatch.setattr(os, name, guard(name))


DAMAGES = {
    "truncated pairs": (
        "pairs",
        lambda e: (e / "pairs.arrow").write_bytes((e / "pairs.arrow").read_bytes()[:500]),
    ),
    "deleted pairs": ("pairs", lambda e: (e / "pairs.arrow").unlink()),
    "overwritten manifest": ("pairs", lambda e: (e / "manifest.json").write_text('{"files": ["pai')),
    "truncated tokenizer": ("tokenizers", lambda e: (e / "tokenizer.json").write_text('{"version"')),
    "truncated examples": (
        "examples",
        lambda e: (e / "examples.arrow").write_bytes((e / "examples.arrow").read_bytes()[:300]),
    ),
}


@pytest.mark.parametrize("damage", DAMAGES)
def test_a_damaged_cache_entry_is_named_and_built_again(tmp_path, caplog, damage):
    stage, harm = DAMAGES[damage]
    source = file_source(*make_corpus(tmp_path))
    options = settings(tmp_path, concat_probability=0.5 if stage == "examples" else 0.0)
    expected = token_lists(prepare_training_corpus(source, options).examples)
    gc.collect()  # its memory maps closed: a file truncated under a map is a bus error on reading it
    damaged = entry(tmp_path / "cache", stage)
    harm(damaged)
    again = prepare_training_corpus(source, options)
    assert f"the data cache entry {damaged} is damaged" in caplog.text
    assert again.report["cache"][stage.removesuffix("s") if stage == "tokenizers" else stage] == "built"
    assert token_lists(again.examples) == expected
    assert prepare_training_corpus(source, options).report["cache"]["pairs"] == "reused"


def test_a_read_only_cache_is_read_without_its_lock_and_names_what_it_cannot_give(tmp_path, monkeypatch):
    source = file_source(*make_corpus(tmp_path))
    expected = token_lists(prepare_training_corpus(source, settings(tmp_path)).examples)
    gc.collect()
    cache = tmp_path / "cache"
    for folder in ("locks", "build"):  # a team's pre-built copy need not hold them
        os.rmdir(cache / folder) if folder == "build" else [os.unlink(p) for p in (cache / folder).iterdir()]
    read_only(monkeypatch, cache)
    shared = prepare_training_corpus(source, settings(tmp_path))
    assert (shared.report["cache"]["tokenizer"], shared.report["cache"]["pairs"]) == ("reused", "reused")
    assert token_lists(shared.examples) == expected
    del shared
    gc.collect()
    with pytest.raises(ValueError, match=f"the data cache {cache} cannot be written .*give a writable"):
        prepare_training_corpus(source, settings(tmp_path, vocab_size=110))  # entries it lacks
    pairs = entry(cache, "pairs")
    monkeypatch.undo()
    (pairs / "pairs.arrow").write_bytes(b"overwritten")
    read_only(monkeypatch, cache)
    with pytest.raises(ValueError, match=f"the data cache entry {pairs} is damaged .*`rm -r {pairs}`"):
        prepare_training_corpus(source, settings(tmp_path))


def test_a_cache_folder_that_is_a_file_is_refused_naming_it(tmp_path):
    source = file_source(*make_corpus(tmp_path))
    (tmp_path / "cache").write_text("not a folder")
    with pytest.raises(ValueError, match=f"the data cache folder {tmp_path / 'cache'} .* is the file"):
        prepare_training_corpus(source, settings(tmp_path))
    nested = CorpusSettings(vocab_size=120, cache_dir=str(tmp_path / "cache" / "sub"))
    with pytest.raises(ValueError, match=f"lies under the file {tmp_path / 'cache'}"):
        prepare_training_corpus(source, nested)


def test_a_full_disk_is_an_error_naming_the_cache_folder(tmp_path, monkeypatch):
    source = file_source(*make_corpus(tmp_path))

    def full(*args, **kwargs):
        raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC))

    monkeypatch.setattr(ArrowWriter, "write_table", full)
    with pytest.raises(ValueError, match=f"the data cache {tmp_path / 'cache'} ran out of disk space"):
        prepare_training_corpus(source, settings(tmp_path))
    monkeypatch.undo()
    monkeypatch.setattr(PreTrainedTokenizerFast, "save_pretrained", full)  # writing an entry's files
    with pytest.raises(ValueError, match=f"the data cache {tmp_path / 'cache'} ran out of disk space"):
        prepare_training_corpus(source, settings(tmp_path))
