"""The training corpus at scale (pipeline/data/corpus.py): tokenised once into an on-disk cache that the next run
reuses and that a change of data, tokenizer or filter replaces; invalid training pairs skipped and counted, the
test set untouched; concatenation on the cache; BPE learned on a bounded sample or an existing tokenizer reused."""

import gzip
import json
import random

import numpy as np
import pytest

from hf_posenc.pipeline.data import corpus
from hf_posenc.pipeline.data.augmentation import concatenate_consecutive
from hf_posenc.pipeline.data.corpus import CorpusSettings, file_source, prepare_training_corpus
from hf_posenc.pipeline.data.files import ParallelText
from hf_posenc.pipeline.data.tokenization import load_tokenizer, train_joint_bpe
from hf_posenc.pipeline.training import arguments, run
from hf_posenc.pipeline.training.trainer import tokenize_parallel

WORDS = "the a dog cat runs sits on red blue small big house tree".split()
WÖRTER = "der die ein hund katze läuft sitzt auf rot blau klein groß haus baum".split()


def sentences(count, seed, words, shortest=2, longest=9):
    generator = random.Random(seed)
    return [" ".join(generator.choices(words, k=generator.randint(shortest, longest))) for _ in range(count)]


def write(path, lines):
    opener = gzip.open if path.suffix == ".gz" else open
    with opener(path, "wt", encoding="utf-8") as handle:
        handle.write("".join(line + "\n" for line in lines))
    return path


def make_corpus(folder, count=300, seed=0, extra=()):
    """Line-aligned En/De files of `count` short random pairs, then the `extra` pairs."""
    source = sentences(count, seed, WORDS) + [s for s, _ in extra]
    target = sentences(count, seed + 1, WÖRTER) + [t for _, t in extra]
    return write(folder / "train.en.gz", source), write(folder / "train.de", target)


def settings(tmp_path, **overrides):
    return CorpusSettings(**{"vocab_size": 120, "cache_dir": str(tmp_path / "cache"), **overrides})


def token_lists(dataset):
    return dataset["input_ids"][:], dataset["labels"][:], dataset["length"][:]


def entry_times(cache):
    return {
        path: path.stat().st_mtime_ns
        for path in cache.rglob("*")
        if path.is_file() and "locks" not in path.parts
    }


def test_second_preparation_reuses_the_cache_without_reading_or_tokenising(tmp_path, monkeypatch):
    source = file_source(*make_corpus(tmp_path))
    first = prepare_training_corpus(source, settings(tmp_path))
    assert first.report["cache"] | {"folder": None} == {
        "folder": None,
        "tokenizer": "built",
        "pairs": "built",
        "examples": "pairs",
    }
    written = entry_times(tmp_path / "cache")

    def no_work(*args, **kwargs):
        raise AssertionError("the cached corpus was read, learned or tokenised again")

    for name in ("text_rows", "learn_bpe", "encode_pairs"):
        monkeypatch.setattr(corpus, name, no_work)
    second = prepare_training_corpus(source, settings(tmp_path))
    assert (second.report["cache"]["tokenizer"], second.report["cache"]["pairs"]) == ("reused", "reused")
    assert entry_times(tmp_path / "cache") == written  # nothing rewritten
    assert token_lists(second.examples) == token_lists(first.examples)
    assert second.tokenizer.get_vocab() == first.tokenizer.get_vocab()
    assert second.examples.cache_files  # memory-mapped from the cache, not held in memory


def test_cached_token_ids_are_those_of_the_tokenizer(tmp_path):
    source_path, target_path = make_corpus(tmp_path, count=120)
    prepared = prepare_training_corpus(file_source(source_path, target_path), settings(tmp_path))
    text = [line.rstrip("\n") for line in gzip.open(source_path, "rt", encoding="utf-8")]
    reference = tokenize_parallel(
        prepared.tokenizer, text, open(target_path, encoding="utf-8").read().splitlines()
    )
    assert token_lists(prepared.examples) == token_lists(reference)


def test_a_changed_data_file_tokenizer_or_filter_makes_new_entries(tmp_path):
    source_path, target_path = make_corpus(tmp_path)
    first = prepare_training_corpus(file_source(source_path, target_path), settings(tmp_path))

    write(target_path, sentences(300, 7, WÖRTER))  # new content: size and modification time change
    changed = prepare_training_corpus(file_source(source_path, target_path), settings(tmp_path))
    assert (changed.report["cache"]["tokenizer"], changed.report["cache"]["pairs"]) == ("built", "built")
    assert changed.examples["labels"][:] != first.examples["labels"][:]

    shorter = prepare_training_corpus(file_source(source_path, target_path), settings(tmp_path, max_length=8))
    assert shorter.report["cache"] | {"folder": None} == {
        "folder": None,
        "tokenizer": "reused",
        "pairs": "reused",  # a filter re-filters the cached pairs, it does not tokenise again
        "examples": "built",
    }
    assert max(shorter.examples["length"][:]) <= 8 < max(changed.examples["length"][:])

    folder = tmp_path / "other-tokenizer"
    train_joint_bpe(sentences(50, 3, WORDS + WÖRTER), vocab_size=80).save_pretrained(folder)
    other = prepare_training_corpus(
        file_source(source_path, target_path), settings(tmp_path, tokenizer_name_or_path=str(folder))
    )
    assert (other.report["cache"]["tokenizer"], other.report["cache"]["pairs"]) == ("given", "built")


def test_invalid_training_pairs_are_skipped_and_counted_by_reason(tmp_path):
    bad = [
        ("", "leer"),  # empty source
        ("a dog", "   "),  # blank target
        (" ".join(["dog"] * 40), " ".join(["hund"] * 40)),  # too long on both sides
        ("the", " ".join(["hund"] * 12)),  # 1 token against 12: ratio 12 > 9
    ]
    source_path, target_path = make_corpus(tmp_path, count=100, extra=bad)
    prepared = prepare_training_corpus(
        file_source(source_path, target_path), settings(tmp_path, max_length=30)
    )
    report = prepared.report
    assert report["skipped"] == {"empty": 2, "too_long": 1, "length_ratio": 1}
    assert (report["pairs_read"], report["pairs_kept"], report["examples"]) == (104, 100, 100)
    assert len(prepared.examples) == len(prepared.summary) == 100
    json.dumps(report)  # goes into scores.json as it is

    unbounded = prepare_training_corpus(
        file_source(source_path, target_path), settings(tmp_path, max_length=30, max_length_ratio=0)
    )
    assert unbounded.report["skipped"] == {"empty": 2, "too_long": 1, "length_ratio": 0}
    with pytest.raises(ValueError, match=r"2 empty line\(s\) in .*train\.en\.gz.*first at line 101"):
        prepare_training_corpus(
            file_source(source_path, target_path), settings(tmp_path, empty_lines="error")
        )


def test_training_pairs_are_skipped_not_fatal_and_the_test_set_keeps_every_pair(tmp_path, multi30k_dir):
    """Through prepare_data: over-long and empty training pairs are counted in `data_report`; the validation and
    test sets, over-long sentences included, are kept whole."""
    folder = tmp_path / "data"
    folder.mkdir()
    make_corpus(folder, count=200, extra=[("", "leer")])
    test_source = write(folder / "test.en", ["a dog", " ".join(["dog"] * 30)])
    test_target = write(folder / "test.de", ["ein hund", " ".join(["hund"] * 30)])
    flags = [
        "--recipe",
        "multi30k-en-de-tiny",
        "--train_source",
        str(folder / "train.en.gz"),
        "--train_target",
        str(folder / "train.de"),
        "--valid_source",
        str(test_source),
        "--valid_target",
        str(test_target),
        "--test_source",
        str(test_source),
        "--test_target",
        str(test_target),
        "--eval_strategy",
        "steps",
        "--vocab_size",
        "120",
        "--max_train_length",
        "6",
        "--data_cache_dir",
        str(tmp_path / "cache"),
        "--output_dir",
        str(tmp_path / "unused"),
    ]
    data = run.prepare_data(arguments.parse_args(flags))
    assert data.data_report["skipped"]["empty"] == 1 and data.data_report["skipped"]["too_long"] > 0
    assert max(data.train["length"][:]) <= 6
    assert data.data_report["pairs_kept"] == len(data.train) == len(data.train_text)
    assert len(data.test) == 2 and len(data.valid) == 2 and max(data.valid["length"][:]) > 6
    assert run.source_target_length_ratio(data.train) == round(
        data.data_report["source_tokens"] / data.data_report["target_tokens"], 4
    )
    with pytest.raises(ValueError, match="empty line"):
        run.prepare_data(arguments.parse_args([*flags, "--empty_lines", "error"]))


def test_concatenation_on_the_cache_equals_joining_the_text(tmp_path):
    source_path, target_path = make_corpus(tmp_path, count=400)
    base = prepare_training_corpus(file_source(source_path, target_path), settings(tmp_path))
    joined = prepare_training_corpus(
        file_source(source_path, target_path),
        settings(tmp_path, concat_probability=0.5, concat_group_sizes=(2, 3), seed=4),
    )
    source = [line.rstrip("\n") for line in gzip.open(source_path, "rt", encoding="utf-8")]
    target = open(target_path, encoding="utf-8").read().splitlines()
    text = concatenate_consecutive(ParallelText(source, target, "t"), 0.5, (2, 3), seed=4)
    assert token_lists(joined.examples) == token_lists(
        tokenize_parallel(base.tokenizer, text.source, text.target)
    )
    assert joined.report["concatenation"]["joined"] > 0 and joined.report["pairs_kept"] == 400


def test_joined_examples_over_max_length_are_split_back_into_their_pairs(tmp_path):
    source_path, target_path = make_corpus(tmp_path, count=200)
    limit = settings(tmp_path, max_length=16)
    single = prepare_training_corpus(file_source(source_path, target_path), limit)
    joined = prepare_training_corpus(
        file_source(source_path, target_path), settings(tmp_path, max_length=16, concat_probability=1.0)
    )
    concatenation = joined.report["concatenation"]
    assert concatenation["split_too_long"] > 0 and max(joined.examples["length"][:]) <= 16
    # every kept pair is trained on: a pair's tokens are either alone or inside a joined example
    assert (
        joined.report["source_tokens"] + (single.report["examples"] - joined.report["examples"])
        == (single.report["source_tokens"])
    )


def test_a_local_datasets_corpus_goes_through_the_same_streaming_and_cache(tmp_path, monkeypatch):
    """--hf_dataset reads with `datasets.load_dataset(..., streaming=True)`, here from a local folder (the Hub
    path is the same call with an id)."""
    folder = tmp_path / "corpus"
    folder.mkdir()
    rows = [
        {"translation": {"en": s, "de": t}}
        for s, t in zip(sentences(150, 0, WORDS), sentences(150, 1, WÖRTER), strict=True)
    ]
    (folder / "train.jsonl").write_text("".join(json.dumps(row) + "\n" for row in rows))
    monkeypatch.setenv("HF_POSENC_CACHE", str(tmp_path / "cache"))
    args = arguments.parse_args(["--hf_dataset", str(folder), "--output_dir", str(tmp_path / "unused")])
    source = corpus.training_source(args.data)
    first = prepare_training_corpus(source, CorpusSettings(vocab_size=120))
    assert first.report["pairs_read"] == 150 and (tmp_path / "cache" / "pairs").is_dir()
    second = prepare_training_corpus(corpus.training_source(args.data), CorpusSettings(vocab_size=120))
    assert second.report["cache"]["pairs"] == "reused"
    (folder / "train.jsonl").write_text("".join(json.dumps(row) + "\n" for row in rows[:100]))
    assert (
        prepare_training_corpus(corpus.training_source(args.data), CorpusSettings(vocab_size=120)).report[
            "pairs_read"
        ]
        == 100
    )
    with pytest.raises(ValueError, match=r"languages \['de', 'en'\]; 'fr' is not among them"):
        prepare_training_corpus(corpus.hf_source(str(folder), None, "train", "en", "fr"), CorpusSettings())


def test_streamed_files_with_different_line_counts_are_an_error(tmp_path):
    source = write(tmp_path / "a.en", ["one", "two", "three"])
    target = write(tmp_path / "a.de.gz", ["eins", "zwei"])
    with pytest.raises(ValueError, match=r"a\.en has 3 lines, .*a\.de\.gz has 2"):
        prepare_training_corpus(file_source(source, target), settings(tmp_path))
    assert not list((tmp_path / "cache").glob("pairs/*"))  # no entry left behind


def test_bpe_learns_on_a_bounded_deterministic_sample(tmp_path, monkeypatch, texts):
    seen = []

    def counting_bpe(texts, **kwargs):
        texts = [text for batch in texts for text in batch]
        seen.append(len(texts))
        return train_joint_bpe(texts, **kwargs)

    monkeypatch.setattr(corpus, "train_joint_bpe", counting_bpe)
    source = file_source(*make_corpus(tmp_path, count=200))
    prepared = prepare_training_corpus(source, settings(tmp_path, bpe_sample_pairs=50))
    assert seen == [100]  # 50 sources and their 50 targets
    assert prepared.report["pairs_read"] == 200  # every pair is still tokenised
    sample = corpus.bpe_sample(200, 50)
    assert len(set(sample.tolist())) == 50 and np.array_equal(sample, corpus.bpe_sample(200, 50))
    assert corpus.bpe_sample(200, 200) is None  # all pairs, in corpus order


def test_an_existing_tokenizer_is_reused_and_checked(tmp_path):
    source = file_source(*make_corpus(tmp_path))
    learned = prepare_training_corpus(source, settings(tmp_path))
    folder = tmp_path / "run-tokenizer"
    learned.tokenizer.save_pretrained(folder)
    reused = prepare_training_corpus(source, settings(tmp_path / "fresh", tokenizer_name_or_path=str(folder)))
    assert reused.report["cache"]["tokenizer"] == "given"
    assert token_lists(reused.examples) == token_lists(learned.examples)

    no_end = train_joint_bpe(sentences(30, 2, WORDS), vocab_size=60)
    no_end.backend_tokenizer.post_processor = None  # sequences without </s>
    no_end.save_pretrained(tmp_path / "no-end")
    with pytest.raises(ValueError, match=r"must end with '</s>'"):
        load_tokenizer(str(tmp_path / "no-end"))
    with pytest.raises(ValueError, match="holds no loadable fast tokenizer"):
        load_tokenizer(str(tmp_path / "nothing-here"))
