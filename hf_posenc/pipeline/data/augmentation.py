"""Concatenation augmentation: some training examples are several consecutive training pairs joined.

Varis & Bojar (EMNLP 2021, "Sequence Length is a Domain: Length-based Overfitting in Transformer Models") show
that a Transformer trained on one range of sentence lengths translates sentences outside it badly, and that the
drop follows the hypothesis lengths the model saw in training more than the input length; synthetic longer
training examples made by concatenating shorter sentences bring it close to a model trained on genuinely long
data. Kondo et al. (NAACL-SRW 2021) join two sentence pairs to help long-sentence translation, and Nguyen,
Murray & Chiang (IWSLT 2021) trace the gains of concatenation to length diversity and position shifting.
Only the abstracts and summaries of these papers were reachable when this was written, not their setups
(how many sentences are joined, whether joined examples are added to or replace the originals), so the
choices below are ours:

* The corpus is walked in order. At each position, with probability p, the next g pairs (g drawn uniformly
  from `group_sizes`, default 2) become one example: sources joined with a space, targets joined with a space;
  otherwise the next pair stays an example on its own. So each emitted example is a joined one with
  probability p, and the joined examples *replace* their parts: every training pair appears exactly once, in
  its original order, so an epoch holds the same sentences as without augmentation, in fewer and longer
  examples (runs with and without it see the same data under the same time budget; adding joined copies to
  the originals would make each epoch longer instead).
* Pairs are joined with their corpus neighbours ("consecutive"), not random partners; in Multi30k
  neighbouring captions are unrelated, so this adds length, not discourse context.
* A group that would run past the end of the corpus takes the pairs that are left (a single leftover pair
  stays on its own).
* The result is pure and deterministic for a seed (its own `random.Random`, no global state).

Joined examples are up to max(group_sizes) times longer than the longest training pair: when training
sentences are first limited to a length (train short, test long), augment *after* that filter. The training
corpus (`corpus.py`) does: it walks the pairs its filters keep, joins their cached token ids (the end token of
every part but the last dropped, which is what tokenising the joined text gives for text that does not start
with a space), and leaves the parts of a joined example longer than `max_length` tokens as examples on their
own (counted), so that every kept pair is trained on and every batch fits `max_tokens`.
"""

import logging
import random
from array import array
from collections.abc import Sequence

import numpy as np

from .files import ParallelText

logger = logging.getLogger(__name__)

GROUP_SIZES = (2,)  # pairs joined into one example, by default: two consecutive pairs


def check_augmentation(probability: float, group_sizes: Sequence[int]) -> tuple[float, tuple[int, ...]]:
    if isinstance(probability, bool) or not isinstance(probability, int | float) or not 0 <= probability <= 1:
        raise ValueError(f"probability={probability!r}: expected a number between 0 and 1 (inclusive)")
    sizes = tuple(group_sizes)
    if not sizes or any(isinstance(size, bool) or not isinstance(size, int) or size < 2 for size in sizes):
        raise ValueError(
            f"group_sizes={list(sizes)!r}: expected one or more whole numbers >= 2 (pairs joined per example), "
            "e.g. [2] or [2, 3, 4]"
        )
    return float(probability), sizes


def concatenation_groups(
    count: int, probability: float, group_sizes: Sequence[int] = GROUP_SIZES, seed: int = 0
) -> np.ndarray:
    """Where each example of the walk described in the module docstring starts, over `count` pairs: `starts`
    (int64, one more than there are examples, ending with `count`); example e holds pairs
    `starts[e]:starts[e + 1]`. Only numbers: the training corpus joins its cached token ids with it."""
    probability, sizes = check_augmentation(probability, group_sizes)
    rng = random.Random(seed)
    starts = array("q", [0])  # 8 bytes an example, not a Python int
    start = 0
    while start < count:
        size = rng.choice(sizes) if rng.random() < probability else 1
        start = min(start + size, count)
        starts.append(start)
    return np.frombuffer(starts, dtype=np.int64)


def concatenate_consecutive(
    text: ParallelText, probability: float, group_sizes: Sequence[int] = GROUP_SIZES, seed: int = 0
) -> ParallelText:
    """`text` with each emitted example, with probability `probability`, a join of consecutive pairs (see the
    module docstring). The same arguments always give the same result."""
    probability, sizes = check_augmentation(probability, group_sizes)
    starts = concatenation_groups(len(text), probability, sizes, seed).tolist()
    source = [" ".join(text.source[start:end]) for start, end in zip(starts, starts[1:], strict=False)]
    target = [" ".join(text.target[start:end]) for start, end in zip(starts, starts[1:], strict=False)]
    joined = sum(end - start > 1 for start, end in zip(starts, starts[1:], strict=False))
    logger.info(
        "concatenation augmentation: %d of %d examples join 2 or more of the %d training pairs",
        joined,
        len(source),
        len(text),
    )
    name = f"{text.name} (concatenated: p={probability}, group sizes {list(sizes)}, seed {seed})"
    return ParallelText(source, target, name)
