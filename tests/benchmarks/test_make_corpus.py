"""The benchmark corpus (benchmarks/make_corpus.py): aligned, resampled captions, the same for a seed."""

import gzip


def test_make_corpus_writes_aligned_resampled_captions_deterministically(tmp_path, multi30k_dir):
    from benchmarks.make_corpus import make_corpus as make_benchmark_corpus

    first = make_benchmark_corpus(tmp_path / "a", 2000, seed=3, data_dir=multi30k_dir)
    second = make_benchmark_corpus(tmp_path / "b", 2000, seed=3, data_dir=multi30k_dir)
    lines = [gzip.open(path, "rt", encoding="utf-8").read().splitlines() for path in first]
    assert len(lines[0]) == len(lines[1]) == 2000
    assert all(gzip.open(a).read() == gzip.open(b).read() for a, b in zip(first, second, strict=True))
    captions = set(gzip.open(multi30k_dir / "train.en.gz", "rt", encoding="utf-8").read().splitlines())
    joined = sum(line not in captions for line in lines[0]) / 2000
    assert 0.35 < joined < 0.45  # 40% of the lines are two captions
