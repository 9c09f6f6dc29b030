"""The verdicts of the papers' claims (`study.claims`, `bootstrap`, `verdicts`): each claim gets the test
its wording names. An equivalence claim is reproduced only when the seeds × sentences bootstrap interval lies
inside the margin (TOST), a real difference fails it and noisy seeds leave it undecided; non-inferiority holds
on the lower bound; a tie never reproduces a strict claim; the report states the smallest gap the seeds can
detect, prints p-values without rounding them across a significance level, takes the median of the systems'
seed noise without the baseline, and lists the calls that sit on a margin."""

import json

import numpy as np
import pytest
from sacrebleu.metrics import BLEU

from hf_posenc.pipeline.evaluation import scoring
from hf_posenc.pipeline.training.hardware import Hardware
from study import bootstrap, claims, cli, report, results, runs, verdicts
from study.claims import MARGIN, Interval, claim_verdict, interval_verdict

SIGNIFICANT = {"bleu": {"significance": "**", "p_value": 0.001}}
NOT_SIGNIFICANT = {"bleu": {"significance": "", "p_value": 0.3}}
SENTENCES, LENGTH = 2000, 20  # synthetic test set: sentences of 20 tokens
SAMPLES = 1000


def synthetic_run(rng, precision: float, spread: float = 0.0) -> np.ndarray:
    """Sentence statistics of a run whose n-gram precision is about precision^n on every sentence (BLEU about
    100 · precision^2.5), each sentence's precision moved by up to ±`spread`."""
    totals = np.array([LENGTH - n + 1 for n in range(1, 5)])  # (4,)
    per_sentence = np.clip(precision + rng.uniform(-spread, spread, SENTENCES), 0.05, 0.95)  # (S,)
    matched = rng.binomial(totals, per_sentence[:, None] ** np.arange(1, 5))  # (S, 4)
    lengths = np.full((SENTENCES, 2), LENGTH)
    return np.concatenate([lengths, matched, np.broadcast_to(totals, (SENTENCES, 4))], axis=1)


def shifted(run: np.ndarray, extra_matches: int, share: float, rng) -> np.ndarray:
    """The same translations with `extra_matches` more matched n-grams of every order on a share of sentences."""
    run = run.copy()
    chosen = rng.random(len(run)) < share
    matched, totals = run[:, 2:6], run[:, 6:]
    matched[chosen] = np.minimum(matched[chosen] + extra_matches, totals[chosen])
    return run


def interval_of(system, reference) -> Interval:
    gaps = bootstrap.bootstrap_gaps(system, reference, SAMPLES)
    return Interval(*bootstrap.percentile_interval(gaps, claims.CONFIDENCE), len(system))


def test_bleu_of_summed_sentence_statistics_is_the_corpus_score():
    """The bootstrap's BLEU of summed sentence statistics is the project's one corpus score
    (`scoring.corpus_score`: sacreBLEU, 13a, exp smoothing), including its smoothing of orders without a match
    and its zero for no match at all."""
    hypotheses = ["Ein Mann fährt Fahrrad.", "Zwei Hunde spielen im Schnee", "Eine Frau", "x y z"]
    references = ["Ein Mann fährt ein Fahrrad.", "Zwei Hunde spielen im Schnee.", "Eine Frau singt.", "a b c"]
    statistics = bootstrap.sentence_statistics(hypotheses, references)
    expected = scoring.corpus_score(BLEU(), hypotheses, references).score
    assert bootstrap.bleu_of_statistics(statistics.sum(axis=0)) == pytest.approx(expected, abs=1e-9)
    rng = np.random.default_rng(3)
    for _ in range(500):
        total = rng.integers(0, 12, 4)
        matched = np.minimum(total, rng.integers(0, 4, 4) * (rng.random(4) < 0.6))
        lengths = [int(rng.integers(0, 20)), int(rng.integers(1, 20))]
        score = BLEU.compute_bleu(list(matched), list(total), *lengths, smooth_method="exp").score
        statistics = np.array([*lengths, *matched, *total])
        assert bootstrap.bleu_of_statistics(statistics) == pytest.approx(score, abs=1e-9)


def test_the_seeds_share_one_resample_of_the_test_sentences():
    """Two seeds that translated alike give the interval of one: the seeds translate the same sentences, so one
    resample serves them all (resampling each seed's sentences apart would narrow it by √2)."""
    rng = np.random.default_rng(0)
    reference, system = synthetic_run(rng, 0.7, 0.3), synthetic_run(rng, 0.7, 0.3)
    one = bootstrap.bootstrap_gaps([system], [reference], SAMPLES)
    two = bootstrap.bootstrap_gaps([system, system], [reference, reference], SAMPLES)
    np.testing.assert_allclose(two, one)
    with pytest.raises(ValueError, match="same test set"):
        bootstrap.bootstrap_gaps([system[:10]], [reference], SAMPLES)


def test_tost_equivalent_within_the_margin_is_reproduced():
    rng = np.random.default_rng(1)
    references = [synthetic_run(rng, 0.7, 0.2) for _ in range(3)]
    systems = [shifted(reference, 1, 0.01, rng) for reference in references]  # a gap of about +0.05 BLEU
    interval = interval_of(systems, references)
    assert -MARGIN < interval.lower < interval.upper < MARGIN
    assert claim_verdict("≈", "tie", interval) == "reproduced"


def test_tost_a_real_one_bleu_difference_is_not_equivalent():
    rng = np.random.default_rng(2)
    references = [synthetic_run(rng, 0.7, 0.2) for _ in range(3)]
    systems = [shifted(reference, 1, 0.18, rng) for reference in references]
    gap = np.mean(
        [
            bootstrap.bleu_of_statistics(s.sum(0)) - bootstrap.bleu_of_statistics(r.sum(0))
            for s, r in zip(systems, references, strict=True)
        ]
    )
    assert 0.8 < gap < 1.5
    interval = interval_of(systems, references)
    assert interval.lower > MARGIN
    assert claim_verdict("≈", "tie", interval) == "not reproduced"


def test_tost_with_seeds_too_noisy_to_tell_is_undecided():
    """Seeds that disagree (one +0.8 BLEU, the other -0.8) average to no gap, but the interval spans both: the
    seeds cannot decide at the margin. The old rule called this "reproduced" (a tie counted as equal)."""
    rng = np.random.default_rng(4)
    references = [synthetic_run(rng, 0.7, 0.2) for _ in range(2)]
    systems = [shifted(references[0], 1, 0.25, rng), shifted(references[1], -1, 0.25, rng)]
    interval = interval_of(systems, references)
    assert interval.lower < -MARGIN and interval.upper > MARGIN
    assert claim_verdict("≈", "tie", interval) == "undecided (2 seeds)"
    assert claim_verdict("≈", "tie", Interval(-0.3, 0.3, 1)) == claims.ONE_SEED  # no call on one seed


@pytest.mark.parametrize(
    "relation, lower, upper, expected",
    [
        ("≥", -0.3, 0.8, "reproduced"),  # no worse than the margin
        ("≥", -0.9, 0.2, "undecided (3 seeds)"),  # could be worse by more than the margin
        ("≥", -1.5, -0.7, "not reproduced"),  # worse by more than the margin
        ("≥", -0.49, 1.5, "reproduced"),
        ("≤", -0.8, 0.3, "reproduced"),
        ("≤", -0.2, 0.9, "undecided (3 seeds)"),
        ("≤", 0.6, 1.4, "not reproduced"),
        ("≈", -0.4, 0.45, "reproduced"),
        ("≈", -0.77, 0.49, "undecided (3 seeds)"),  # RPE ≈ SAPE on En-De
        ("≈", -2.30, -0.93, "not reproduced"),  # Adaptive-T5 ≈ SAPE on En-De
    ],
)
def test_non_inferiority_and_equivalence_read_the_interval(relation, lower, upper, expected):
    assert interval_verdict(relation, Interval(lower, upper, 3)) == expected
    assert claim_verdict(relation, "tie", Interval(lower, upper, 3)) == expected


@pytest.mark.parametrize("relation", [">", "<"])
@pytest.mark.parametrize("measured", ["tie", "tie" + claims.PROVISIONAL])
def test_superiority_is_never_passed_by_a_tie(relation, measured):
    """A strict claim ("better", "best", "helps", "outperformed") measured as a tie is not reproduced, whatever
    the interval shows (the old rules passed a tie as "≥" and called it "tie within noise" for ">")."""
    for interval in (None, Interval(0.1, 1.9, 3), Interval(-1.9, -0.1, 3), Interval(-0.2, 0.2, 3)):
        result = claim_verdict(relation, measured, interval)
        assert result.startswith(claims.TIE_NOT_REPRODUCED), result
        assert not result.startswith("reproduced")


@pytest.mark.parametrize(
    "relation, measured, expected",
    [
        (">", "better", "reproduced"),
        ("<", "worse", "reproduced"),
        (">", "worse", "not reproduced"),
        ("<", "better", "not reproduced"),
        (">", "tie", "tie: not reproduced"),
        ("<", "worse" + claims.PROVISIONAL, "reproduced" + claims.PROVISIONAL),
        (">", "one seed", claims.ONE_SEED),
    ],
)
def test_strict_claims_follow_the_better_worse_call(relation, measured, expected):
    assert claim_verdict(relation, measured) == expected


def test_the_better_worse_rule_uses_the_larger_seed_sd():
    """One reading: the bar is twice the larger of the two seed sds. kerple's numbers (-1.14; sds 0.72 and 0.09;
    every seed significant) are a tie, which twice the smaller sd would have called worse."""
    kerple, baseline = [36.28, 36.26, 35.03], [36.92, 37.09, 36.98]
    assert claims.verdict(-1.14, kerple, baseline, [SIGNIFICANT] * 3) == "tie"
    assert claims.verdict(-1.14, [35.80, 35.90, 35.85], baseline, [SIGNIFICANT] * 3) == "worse"
    reasons = claims.fragile_call(-1.14, kerple, baseline, [SIGNIFICANT] * 3, [1, 2, 3])
    assert any("other reading" in reason and "worse" in reason for reason in reasons)


def test_a_call_on_the_bar_or_on_a_weak_seed_is_listed_as_fragile():
    """t5_bias: worse by 1.13 against a bar of 1.10, one seed at p = 0.092; a call far from its bar with strong
    seeds is not listed."""
    t5_bias, baseline = [36.31, 35.25, 36.04], [36.92, 37.09, 36.98]
    weak = {"bleu": {"significance": "*", "p_value": 0.092}}
    tests = [weak, SIGNIFICANT, SIGNIFICANT]
    assert claims.verdict(-1.13, t5_bias, baseline, tests) == "worse"
    reasons = claims.fragile_call(-1.13, t5_bias, baseline, tests, [1, 2, 3])
    assert reasons[0] == "|Δ| 1.13 is 0.03 over the bar 2 sd = 1.10"
    assert reasons[1] == "seed 1 at p = 0.092"
    assert claims.fragile_call(-8.21, [29.5, 28.73, 28.13], baseline, [SIGNIFICANT] * 3, [1, 2, 3]) == []
    assert claims.fragile_interval("≤", Interval(-0.98, 0.38, 2)) == ["upper bound +0.38 is 0.12 from +0.50"]
    assert claims.fragile_interval("≈", Interval(-0.77, 0.49, 3)) == []  # the lower bound is out of reach


def test_smallest_detectable_difference():
    """The smallest gap a claim's interval tells from zero is its half-width; the report names the half-widths
    by seed count, how many are narrow enough for the margin, and roughly how many seeds would be."""
    assert Interval(-0.2, 1.0, 3).half_width == pytest.approx(0.6)
    rows = [
        verdicts.Evidence(
            claims.CLAIMS[2], 3, -0.15, Interval(-0.75, 0.45, 3), 0.47, "tie", "undecided (3 seeds)"
        ),
        verdicts.Evidence(claims.CLAIMS[3], 2, -0.10, Interval(-0.5, 0.3, 2), 0.66, "tie", "reproduced"),
    ]
    text = verdicts.detectable(rows)
    assert "0.60-0.60 BLEU over 3 seeds (median 0.60, 1 claims)" in text
    assert "0.40-0.40 BLEU over 2 seeds (median 0.40, 1 claims)" in text
    assert "1 of the 2 intervals are that narrow" in text
    assert "at about 5 seeds" in text  # 3 · (0.6 / 0.5)² = 4.3
    assert (
        verdicts.tally(rows)
        == "of 2 claims 1 reproduced, 0 not reproduced, 1 undecided; 5 more not testable here"
    )


@pytest.mark.parametrize(
    "p, text",
    [
        (0.0999, "0.0999"),
        (0.0499, "0.0499"),
        (0.062, "0.062"),
        (0.001, "0.001"),
        (0.1, "0.100"),
        (0.2106, "0.211"),
    ],
)
def test_p_values_are_never_rounded_across_a_significance_level(p, text):
    assert claims.p_text(p) == text
    mark = "*" if p < 0.1 else ""
    assert report.bootstrap_cell([{"bleu": {"p_value": p, "significance": mark}}]) == f"p={text}{mark}"


def write_run(root, args, system: str, seed: int, bleu: float) -> None:
    run = runs.Run(args.recipe, "en-de", system, seed)
    folder = run.folder(root)
    folder.mkdir(parents=True)
    scores = {"bleu": bleu, "steps": 1600, "hardware": Hardware("cpu", "cpu", "AVX2", 1, "2").as_dict()}
    (folder / "scores.json").write_text(json.dumps({**scores, "precision": "bf16"}))
    (folder / "settings.json").write_text(json.dumps(runs.run_settings(run, args)))


def test_the_median_seed_noise_leaves_the_baseline_out(tmp_path):
    """The margin rests on the median seed sd of the systems besides the baseline: with the baseline's small sd
    among them the median of three systems (0.485 in the study) would read lower (0.47)."""
    args = cli.parse_args(["--results_dir", str(tmp_path), "--seeds", "1", "2"])
    seeds = {"sinusoidal": (37.0, 37.1), "learned": (35.0, 35.2), "none": (29.0, 29.8), "shaw": (36.0, 37.0)}
    for system, bleu in seeds.items():
        for seed, value in enumerate(bleu, 1):
            write_run(tmp_path, args, system, seed, value)
    baseline, others = verdicts.seed_noise(report.Report(args), "en-de")
    assert baseline == pytest.approx(0.0707, abs=1e-4)
    assert sorted(others) == ["learned", "none", "shaw"]
    assert np.median(list(others.values())) == pytest.approx(0.5657, abs=1e-4)  # none's, the middle one
    section = "\n".join(verdicts.protocol_section(report.Report(args)))
    assert "en-de: `sinusoidal` 0.07, the median of the other 3 main-table systems 0.566" in section


def test_a_paired_bootstrap_is_kept_and_reused_only_for_the_same_texts_and_seed(
    tmp_path, monkeypatch, caplog
):
    """A report rebuild recomputes only the new runs' bootstraps: a kept result is the computed one, read back for
    the same texts, samples and seed; other texts, an unseeded resampling or a damaged entry are computed."""
    monkeypatch.setenv("HF_POSENC_CACHE", str(tmp_path / "cache"))
    monkeypatch.delenv("SACREBLEU_SEED", raising=False)
    references = ["a man sleeps on a bench .", "two dogs run in the park .", "a child eats an apple ."]
    baseline = ["a man sleeps .", "two dogs run .", "a child eats ."]
    system = ["a man sleeps on a bench .", "two dogs run in a park .", "a child eats ."]
    computed = []

    def counting(*args):
        computed.append(args)
        return scoring.paired_bootstrap(*args)

    monkeypatch.setattr(results, "paired_bootstrap", counting)
    first = results.kept_paired_bootstrap(baseline, system, references, 50)
    assert first == scoring.paired_bootstrap(baseline, system, references, 50) and len(computed) == 1
    assert results.kept_paired_bootstrap(baseline, system, references, 50) == first and len(computed) == 1
    results.kept_paired_bootstrap(baseline, system[::-1], references, 50)
    results.kept_paired_bootstrap(baseline, system, references, 60)
    assert len(computed) == 3
    (entry,) = [
        path
        for path in (tmp_path / "cache" / "paired-bootstrap").iterdir()
        if path.read_text() == json.dumps(first)
    ]
    entry.write_text('{"bleu": ')  # cut off
    assert results.kept_paired_bootstrap(baseline, system, references, 50) == first and len(computed) == 4
    monkeypatch.setenv("SACREBLEU_SEED", "None")
    results.kept_paired_bootstrap(baseline, system, references, 50)
    results.kept_paired_bootstrap(baseline, system, references, 50)
    assert len(computed) == 6 and len(list((tmp_path / "cache" / "paired-bootstrap").iterdir())) == 3
    monkeypatch.setenv("SACREBLEU_SEED", "12345")
    monkeypatch.setenv("HF_POSENC_CACHE", str(entry))  # a file: nothing can be kept under it
    assert (
        results.kept_paired_bootstrap(baseline, system, references, 40)["bleu"]["system"]
        == first["bleu"]["system"]
    )
    assert "the paired bootstrap cannot be kept" in caplog.text
