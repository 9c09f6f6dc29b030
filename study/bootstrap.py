"""The seeds × sentences bootstrap of the BLEU gap between two systems, behind the equivalence and
non-inferiority tests of the papers' claims (`claims.claim_verdict`).

The per-seed paired bootstrap (`pipeline.evaluation.paired_bootstrap`, Koehn 2004) asks whether one trained model
beats another on this test set; a claim is about two systems, whatever seed trained them, so its interval must hold
both sources of noise: the test sentences and the training seed. Each bootstrap sample draws

* one resample of the test sentences (with replacement), shared by every seed: the seeds translate the same
  sentences, so resampling each seed's sentences apart would treat one test set as n independent ones and
  narrow the interval by up to √n;
* n seeds with replacement from the n seeds both systems have (paired by seed, as the per-seed bootstrap);

and its gap is the mean over the drawn seeds of BLEU(system) − BLEU(reference) on the drawn sentences. With two or
three seeds the seed draw is coarse (its variance is (n − 1)/n of the seeds' own), so an interval over few seeds
is, if anything, narrower than the truth; `claims` therefore calls no claim on one seed.

Corpus BLEU of a resample is computed from each sentence's statistics (hypothesis and reference length, matched
and total n-grams; sacreBLEU's 13a tokenisation and exponential smoothing, the reported scores' signature), so a
sample costs a weighted sum, not a re-tokenisation.
"""

import numpy as np
from sacrebleu.metrics import BLEU

NGRAM_ORDER = 4  # BLEU's largest n-gram, sacreBLEU's default and the reported scores'
STATISTICS = 2 + 2 * NGRAM_ORDER  # hypothesis length, reference length, matched n-grams, total n-grams


def sentence_statistics(hypotheses: list[str], references: list[str]) -> np.ndarray:
    """(sentences, STATISTICS): each sentence's BLEU statistics, whose column sums give the corpus score.
    `effective_order` changes only a sentence's own score (unused here), not its counts, and silences
    sacreBLEU's warning about scoring sentences."""
    if len(hypotheses) != len(references):
        raise ValueError(f"{len(hypotheses)} hypotheses and {len(references)} references: need one each")
    bleu = BLEU(effective_order=True)
    rows = []
    for hypothesis, reference in zip(hypotheses, references, strict=True):
        score = bleu.sentence_score(hypothesis, [reference])
        rows.append([score.sys_len, score.ref_len, *score.counts, *score.totals])
    return np.array(rows, dtype=np.int64).reshape(len(rows), STATISTICS)


def bleu_of_statistics(statistics: np.ndarray) -> np.ndarray:
    """sacreBLEU's corpus BLEU (`BLEU.compute_bleu`, exponential smoothing) of summed statistics
    (..., STATISTICS) -> (...): the geometric mean of the n-gram precisions times the brevity penalty; an order
    without a match counts 1 / (2^k · total) for its k-th such order; no match at all, or an order with no
    n-gram, scores 0."""
    statistics = np.asarray(statistics, dtype=np.float64)
    hypothesis_length, reference_length = statistics[..., 0], statistics[..., 1]
    matched, total = statistics[..., 2 : 2 + NGRAM_ORDER], statistics[..., 2 + NGRAM_ORDER :]
    unmatched = matched == 0
    with np.errstate(divide="ignore", invalid="ignore"):
        smoothing = 2.0 ** np.cumsum(unmatched, axis=-1)
        precision = np.where(unmatched, 100.0 / (smoothing * total), 100.0 * matched / total)
        brevity = np.exp(np.minimum(0.0, 1.0 - reference_length / hypothesis_length))
        score = brevity * np.exp(np.log(precision).mean(axis=-1))
    scoreless = (total == 0).any(axis=-1) | unmatched.all(axis=-1) | (hypothesis_length == 0)
    return np.where(scoreless, 0.0, score)


def bootstrap_gaps(
    system: list[np.ndarray], reference: list[np.ndarray], samples: int, seed: int = 0
) -> np.ndarray:
    """(samples,) bootstrap BLEU gaps system − reference over seeds × sentences (the module docstring): `system`
    and `reference` hold `sentence_statistics` of the same seeds, in the same order. `seed` seeds the resampling,
    so that a report rebuilt from the same runs gives the same intervals."""
    if len(system) != len(reference) or not system:
        raise ValueError(
            f"{len(system)} system and {len(reference)} reference runs: need the same seeds, > 0"
        )
    sentences = {len(run) for run in (*system, *reference)}
    if len(sentences) != 1:
        raise ValueError(f"runs of {sorted(sentences)} sentences: every run must translate the same test set")
    if samples < 1:
        raise ValueError(f"bootstrap samples={samples} must be at least 1")
    rng = np.random.default_rng(seed)
    (count,) = sentences
    weights = rng.multinomial(count, np.full(count, 1.0 / count), size=samples)  # (samples, sentences)
    gaps = np.stack(
        [
            bleu_of_statistics(weights @ ours) - bleu_of_statistics(weights @ theirs)
            for ours, theirs in zip(system, reference, strict=True)
        ],
        axis=1,
    )  # (samples, seeds)
    drawn = rng.integers(0, len(system), size=gaps.shape)  # (samples, seeds): the seeds of each sample
    return np.take_along_axis(gaps, drawn, axis=1).mean(axis=1)


def percentile_interval(gaps: np.ndarray, confidence: float) -> tuple[float, float]:
    """The central `confidence` percentile interval of bootstrap gaps: each bound is a one-sided test at
    (1 − confidence) / 2, so a 90% interval inside ±margin is the two one-sided tests (TOST) at α = 0.05."""
    tail = (1.0 - confidence) / 2
    lower, upper = np.quantile(gaps, [tail, 1.0 - tail])
    return float(lower), float(upper)
