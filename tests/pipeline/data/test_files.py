"""Parallel text (pipeline/data/files.py): reading fails loudly on bad input (missing files, mismatched lines,
empty splits, bad bytes), the shipped Multi30k reads aligned, and Hub translation datasets are adapted."""

import gzip

import datasets
import pytest

from hf_posenc.pipeline.data.files import (
    parallel_from_translation_dataset,  # noqa: E402
    read_lines,
    read_parallel,
    read_split,
)


def write(path, lines, compressed=False):
    opener = gzip.open if compressed else open
    with opener(path, "wt", encoding="utf-8") as handle:
        handle.write("".join(line + "\n" for line in lines))
    return path


def test_missing_file_is_named(tmp_path):
    present = write(tmp_path / "a.en", ["x"])
    with pytest.raises(FileNotFoundError, match=r"b\.de does not exist"):
        read_parallel(present, tmp_path / "b.de")


def test_a_folder_given_as_a_data_file_is_named_as_a_folder(tmp_path):
    """Before: "does not exist", of a path that exists."""
    present = write(tmp_path / "a.en", ["x"])
    (tmp_path / "b.de").mkdir()
    with pytest.raises(IsADirectoryError, match=r"b\.de is a folder; give the text file of one language"):
        read_parallel(present, tmp_path / "b.de")


def test_mismatched_line_counts_name_both_files_and_counts(tmp_path):
    source = write(tmp_path / "a.en.gz", ["one", "two", "three"], compressed=True)
    target = write(tmp_path / "a.de", ["eins", "zwei"])
    with pytest.raises(ValueError, match=r"a\.en\.gz has 3 lines, .*a\.de has 2"):
        read_parallel(source, target)


def test_empty_split_is_an_error(tmp_path):
    with pytest.raises(ValueError, match="empty split"):
        read_parallel(write(tmp_path / "e.en", []), write(tmp_path / "e.de", []))


def test_empty_lines_are_rejected_or_dropped_in_pairs_on_request(tmp_path):
    source = write(tmp_path / "s.en", ["a", "", "c"])
    target = write(tmp_path / "s.de", ["A", "B", "C"])
    with pytest.raises(ValueError, match=r"1 empty line.*line 2"):
        read_parallel(source, target)
    kept = read_parallel(source, target, empty_lines="skip")
    assert (kept.source, kept.target) == (["a", "c"], ["A", "C"])
    with pytest.raises(ValueError, match=r"empty_lines='drop'.*error, skip"):
        read_parallel(source, target, empty_lines="drop")


def test_shipped_multi30k_reads_aligned(multi30k_dir):
    test = read_split(multi30k_dir, "test_2016_flickr", "en", "de")
    assert len(test) == 1000 and len(test.target) == 1000


def test_data_files_with_bad_bytes_or_damaged_gzip_name_the_file(tmp_path):
    (tmp_path / "bad.txt").write_bytes(b"fine\n\xff not utf-8\n")
    with pytest.raises(ValueError, match=r"bad\.txt, line 2: byte b'\\xff' at column 1 is not UTF-8"):
        read_lines(tmp_path / "bad.txt")
    (tmp_path / "cut.gz").write_bytes(gzip.compress(b"a line\n" * 1000)[:40])
    with pytest.raises(ValueError, match=r"cut\.gz is not a readable gzip file"):
        read_lines(tmp_path / "cut.gz")


def test_hub_translation_schema_adapter_on_a_local_dataset():
    dataset = datasets.Dataset.from_dict(
        {"translation": [{"de": "Ein Hund.", "en": "A dog."}, {"de": "Zwei Katzen.", "en": "Two cats."}]}
    )
    text = parallel_from_translation_dataset(dataset, "en", "de", name="wmt14/de-en:train")
    assert text.source == ["A dog.", "Two cats."] and text.target == ["Ein Hund.", "Zwei Katzen."]
    with pytest.raises(ValueError, match=r"languages \['de', 'en'\]; 'fr' is not among them"):
        parallel_from_translation_dataset(dataset, "en", "fr", name="wmt14/de-en:train")
