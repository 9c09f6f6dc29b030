"""A synthetic training corpus of any size from the shipped Multi30k En-De captions, for data-scaling runs.

    python -m benchmarks.make_corpus /tmp/corpus-1m --pairs 1000000 [--seed 0]

writes OUT/train.en.gz and OUT/train.de.gz (never commit them): `pairs` lines, each a Multi30k training pair drawn
uniformly with replacement, or, with probability 0.4, two drawn pairs joined with a space on both sides. Captions
are 13 words on average, so the lines are ~1.4 captions long: the shape of corpus whose 1M pairs take 7.9 GB as
Python lists (docs/training.md, the corpus cache).
"""

import argparse
import gzip
from pathlib import Path

import numpy as np

from hf_posenc.pipeline.data.files import read_split

from .systems import MULTI30K

JOINED_SHARE = 0.4  # lines that are two captions joined
LINES_PER_WRITE = 100_000
COMPRESSION = 6  # gzip's default level; 9 takes twice as long for 3% less


def make_corpus(out: Path, pairs: int, seed: int = 0, data_dir: Path = MULTI30K) -> tuple[Path, Path]:
    text = read_split(data_dir, "train", "en", "de")
    rng = np.random.default_rng(seed)
    out.mkdir(parents=True, exist_ok=True)
    paths = out / "train.en.gz", out / "train.de.gz"
    with (
        gzip.open(paths[0], "wt", COMPRESSION, "utf-8") as source,
        gzip.open(paths[1], "wt", COMPRESSION, "utf-8") as target,
    ):
        for start in range(0, pairs, LINES_PER_WRITE):
            count = min(LINES_PER_WRITE, pairs - start)
            first = rng.integers(0, len(text), count)
            second = np.where(rng.random(count) < JOINED_SHARE, rng.integers(0, len(text), count), -1)
            for side, handle in ((text.source, source), (text.target, target)):
                handle.write(
                    "".join(
                        side[a] + (" " + side[b] if b >= 0 else "") + "\n"
                        for a, b in zip(first.tolist(), second.tolist(), strict=True)
                    )
                )
    return paths


def main(argv=None) -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("out", type=Path, help="folder for train.en.gz and train.de.gz")
    parser.add_argument("--pairs", type=int, default=1_000_000)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--data_dir", type=Path, default=MULTI30K, help="the Multi30k folder")
    args = parser.parse_args(argv)
    if args.pairs < 1:
        parser.error(f"--pairs={args.pairs} must be at least 1")
    for path in make_corpus(args.out, args.pairs, args.seed, args.data_dir):
        print(f"wrote {path} ({path.stat().st_size / 1e6:.0f} MB)")


if __name__ == "__main__":
    main()
