"""The papers' claims the comparison tests, each as the paper states it (its words and where), those it cannot
test and why, and the verdict rules: of a measured gap (`verdict`, the better/worse rule) and of a claim
(`claim_verdict`: the test that matches the claim's wording), with the calls that sit on a margin
(`fragile_call`, `fragile_interval`).

A claim's relation decides its test:

* ">" / "<" (the papers' "better", "best", "helps", "outperformed", "worse", "decreased"): superiority, the
  better/worse rule (`verdict`). A tie does not reproduce it.
* "≥" / "≤" ("as well or better", "only beneficial if"): non-inferiority / non-superiority with the margin
  `MARGIN`, from the seeds × sentences bootstrap interval (`bootstrap.py`).
* "≈" ("on par", "similar", "negligible", or a table whose gaps the paper calls equal): equivalence, two one-sided
  tests (TOST) at α = 0.05 with the margin `MARGIN`: the 90% interval must lie inside ±MARGIN.

Where the interval straddles a margin the verdict is "undecided (n seeds)": the seeds cannot tell at that margin.
"""

import statistics
from dataclasses import dataclass

from .tables import REFERENCE_SYSTEM

# The equivalence and non-inferiority margin in BLEU, fixed from the seed noise alone before any interval was
# computed: a system's BLEU moves by a median 0.485 between seeds (sd of the 21 En-De main-table rows besides the
# baseline, three seeds each), so a gap under 0.5 is one that retraining the same system produces by itself.
MARGIN = 0.5
CONFIDENCE = 0.90  # the interval's coverage: each one-sided test at α = (1 − CONFIDENCE) / 2 = 0.05
SEED_SDS = 2  # the better/worse rule's bar: this many times the larger of the two systems' seed sds
SIGNIFICANT_P = 0.10  # the per-seed bootstrap's level (paper 1's "+", p < 0.10)
STRONG_P = 0.05  # paper 1's "++"
FRAGILE_BAND = (
    0.25  # BLEU: a call whose deciding number is this close to its bar could move with one more seed
)

TESTS = {
    ">": "superiority",
    "<": "superiority",
    "≥": "non-inferiority",
    "≤": "non-superiority",
    "≈": "equivalence (TOST)",
}


@dataclass(frozen=True)
class Claim:
    """A paper's claim as a relation of `system` to `reference` (`TESTS` names the test each relation gets);
    `source` says where the paper states it and what its table shows, `quote` is the paper's sentence (empty
    where only a table states it)."""

    paper: str
    claim: str
    system: str
    reference: str
    relation: str
    source: str
    quote: str = ""

    @property
    def test(self) -> str:
        return TESTS[self.relation]


# (source, quote) that several claims share
P1_SWEEP = (
    "§4.2 Effect of positional kernel's dimension, Fig. 3 (validation BLEU, d_model 512)",
    "Notably, d_p = 96 has a detrimental effect on the performance of PosNet-Embed and d_p = 128 with the best "
    "performance.",
)
P2_LIGHTCONV = (
    "Both cannot match rPosNet's translation quality, with gLinearNet on average lacking behind by 1.3% relative "
    "and LightConv by 2.4%."
)
P2_GATING = (
    "Figure 2 shows that gating in position-based attention approaches increases COMET by 3.5 points for aPosNet "
    "and rPosNet."
)
P2_PLACEMENT = (
    "Additionally, Table 5 shows that using rPosNet within decoder self-attention is only beneficial if encoder "
    "self-attention leverages rPosNet, whereas the usage within encoder self-attention always positively impacts "
    "translation quality."
)
P3_MAIN = (
    "1) For the proposed methods, both RPEHead (base) and MPRHead (base) outperformed Transformer (base)"
)
P3_ABLATION = (
    "Ablation Experiments (its table is not in our copy); the paper's one-side settings leave the other stack "
    "without positions, ours keep sinusoids there: both compare RPEs with PEs on the one stack",
    "1) For Enc/Dec/Enc&Dec, the proposed RPE-Head/MPRHead outperformed the Transformer in corresponding ablation "
    "settings, indicating that our methods worked well on both the encoder and decoder.",
)
P3_SWEEP = (
    "Effect of RPEs, Fig. 2 (d_model 512; here d_model 256, so the same shares are 160 and 128)",
    "For +RPEHead (or +MPRHead), with the increasing in the dimension of d r, BLEU scores are gradually "
    "increasing, but BLEU scores begin to decrease when d r is more than 320 (or 256).",
)

# Paper 1: Zhang et al. 2023; paper 2: the gated position-based attention paper (Schmidt & Di Gangi 2023); paper
# 3: Chen et al. 2019 (shared/papers/README.md). Paper 2 states its gaps in BLEU, BLEURT and COMET; these rows test
# the BLEU side (UNTESTABLE_CLAIMS says why not the others), with its BLEU numbers in the source.
CLAIMS = [
    Claim(
        "1",
        "no PE ≪ SAPE",
        "none",
        REFERENCE_SYSTEM,
        "<",
        "§4.2 Positional Information is Critical; Table 1: w/o PE 13.49, SAPE 27.48 BLEU (En-De)",
        "we conduct experiments on Transformer without any positional encodings (w/o PE). As a result, the "
        "performance decreases drastically.",
    ),
    Claim(
        "1",
        "LAPE < SAPE",
        "learned",
        REFERENCE_SYSTEM,
        "<",
        "Table 1 only: LAPE 24.34 and 39.75, SAPE 27.48 and 40.46 BLEU (En-De, En-Fr)",
    ),
    Claim(
        "1",
        "RPE ≈ SAPE",
        "shaw",
        REFERENCE_SYSTEM,
        "≈",
        "Table 1 only: RPE 27.07 and 40.61, SAPE 27.48 and 40.46 BLEU (En-De, En-Fr; -0.41 and +0.15)",
    ),
    Claim(
        "1",
        "Adaptive-T5 ≈ SAPE",
        "adaptive_t5",
        REFERENCE_SYSTEM,
        "≈",
        "Table 1 only: Adaptive-T5 27.02 and 40.36, SAPE 27.48 and 40.46 BLEU (En-De, En-Fr; -0.46 and -0.10)",
    ),
    Claim(
        "1",
        "PosNet-Attn < SAPE",
        "posnet_attn",
        REFERENCE_SYSTEM,
        "<",
        "§4.2 Performance of PosNet; Table 1: PosNet-Attn 23.12, SAPE 27.48 BLEU (En-De)",
        "PosNet-Attn outperforms the w/o PE, indicating that it effectively encodes positional information, "
        "although it is worse than the baseline.",
    ),
    Claim(
        "1",
        "PosNet-Embed > SAPE",
        "posnet_embed",
        REFERENCE_SYSTEM,
        ">",
        "§4.2 Performance of PosNet; Table 1: PosNet-Embed 27.68 and 40.81, SAPE 27.48 and 40.46 BLEU",
        "the PosNet-Embed achieves better performance in terms of both BLEU and ChrF++ than the baseline on both "
        "of WMT 2014 En-De and En-Fr translation tasks.",
    ),
    *(
        Claim(
            "1", f"d_p sweep: {what} (128 > {dim})", "posnet_embed", f"posnet_embed-dp{dim}", ">", *P1_SWEEP
        )
        for what, dim in (("96 detrimental", 96), ("128 best", 64), ("128 best", 256))
    ),
    Claim(
        "2",
        "rPosNet ≥ Transformer",
        "rposnet",
        REFERENCE_SYSTEM,
        "≥",
        "§6 Gated position-based attention; Table 2: rPosNet 26.6, Transformer 26.3 BLEU (En-De)",
        "In all experiments, we observe rPosNet performing as well or slightly better than the Transformer with an "
        "average translation quality increase of 0.7%.",
    ),
    Claim(
        "2",
        "rPosNet ≈ Shaw RPE",
        "rposnet",
        "shaw",
        "≈",
        "§6 Gated position-based attention; Table 2: rPosNet 26.6, Shaw et al. 26.3 BLEU (En-De)",
        "rPosNet outperforms other position-based methods and is on par with Shaw et al. (2018) and the "
        "Transformer across all model sizes and data conditions.",
    ),
    Claim(
        "2",
        "aPosNet < Transformer",
        "aposnet",
        REFERENCE_SYSTEM,
        "<",
        "§6 Gated position-based attention; Table 2: aPosNet 25.9, Transformer 26.3 BLEU (En-De)",
        "aPosNet cannot match this expressiveness and underperforms the Transformer with an average relative "
        "degradation of 1.8%.",
    ),
    Claim(
        "2",
        "rPosNet > aPosNet",
        "rposnet",
        "aposnet",
        ">",
        "§6 Gated position-based attention; Table 2: rPosNet 26.6, aPosNet 25.9 BLEU (En-De)",
        "The significant difference between aPosNet and rPosNet highlights the importance of relative position "
        "information in α.",
    ),
    Claim(
        "2",
        "rPosNet > gLinearNet",
        "rposnet",
        "glinear",
        ">",
        "§6 Gated position-based attention; Table 2: rPosNet 26.6, gLinearNet 26.1 BLEU (En-De)",
        P2_LIGHTCONV,
    ),
    Claim(
        "2",
        "rPosNet > LightConv",
        "rposnet",
        "lightconv",
        ">",
        "§6 Gated position-based attention; Table 2: rPosNet 26.6, LightConv 26.0 BLEU (En-De)",
        P2_LIGHTCONV,
    ),
    Claim(
        "2",
        "hard-coded FourierNet < hard-coded GaussianNet",
        "fourier",
        "gaussian",
        "<",
        "§6 Hard-coded token-mixing weights; Table 2: FourierNet 22.8, GaussianNet 25.3 BLEU (En-De)",
        "In GaussianNet, weights are manually designed to follow the normal distribution of Transformer "
        "self-attention patterns, which significantly reduces the degradation to 6.3%.",
    ),
    Claim(
        "2",
        "hard-coded GaussianNet ≈ learned LinearNet in BLEU",
        "gaussian",
        "linear",
        "≈",
        "§6 Hard-coded token-mixing weights; Table 2: GaussianNet 25.3, LinearNet 25.3 BLEU (En-De)",
        "The difference between LinearNet and GaussianNet is negligible in BLEU but made visible with BLEURT and "
        "COMET",
    ),
    Claim(
        "2",
        "gating helps aPosNet",
        "aposnet",
        "aposnet-no-gating",
        ">",
        "§7.2, Fig. 2; Table 6: aPosNet 25.4 without gating, 25.9 with (BLEU, En-De)",
        P2_GATING,
    ),
    Claim(
        "2",
        "gating helps rPosNet",
        "rposnet",
        "rposnet-no-gating",
        ">",
        "§7.2, Fig. 2; Table 6: rPosNet 25.3 without gating, 26.6 with (BLEU, En-De)",
        P2_GATING,
    ),
    Claim(
        "2",
        "gating helps relative attention",
        "relative_attention",
        "relative_attention-no-gating",
        ">",
        "§7.2, Fig. 2; Table 6: relative self-attention 25.7 without gating, 26.5 with (BLEU, En-De)",
        "While relative attention can leverage gating with a lower but significant absolute COMET increase of 2.6 "
        "points",
    ),
    Claim(
        "2",
        "gating adds little to content attention (≈ in BLEU)",
        "attention+gating",
        REFERENCE_SYSTEM,
        "≈",
        "§7.2, Fig. 2; Table 6: Transformer 26.3 without gating, 26.6 with (BLEU, En-De): +0.3, inside the margin, "
        "so the BLEU side is tested as equal",
        "the increment for the Transformer is only 2 points and 0.9 points for Shaw et al. (2018). Thus, gating is "
        "less helpful if α can capture content-dependent patterns",
    ),
    Claim(
        "2",
        "rPosNet in cross-attention alone < Transformer",
        "rposnet@C",
        REFERENCE_SYSTEM,
        "<",
        "§7.3; Table 5 row 4: 24.6 against the Transformer's 26.3 BLEU (En-De)",
        "The model using rPosNet only for cross-attention while all other layers employ multi-head attention "
        "(row 4) significantly decreases translation quality by 5.7% relative to the Transformer.",
    ),
    Claim(
        "2",
        "placement: encoder self-attention helps (alone)",
        "rposnet@ES",
        REFERENCE_SYSTEM,
        ">",
        "§7.3; Table 5: ES 26.4, none 26.3 BLEU",
        P2_PLACEMENT,
    ),
    Claim(
        "2",
        "placement: encoder self-attention helps (with DS)",
        "rposnet",
        "rposnet@DS",
        ">",
        "§7.3; Table 5: ES+DS 26.6, DS 26.1 BLEU",
        P2_PLACEMENT,
    ),
    Claim(
        "2",
        "placement: encoder self-attention helps (with C)",
        "rposnet@ES+C",
        "rposnet@C",
        ">",
        "§7.3; Table 5: ES+C 24.8, C 24.6 BLEU",
        P2_PLACEMENT,
    ),
    Claim(
        "2",
        "placement: encoder self-attention helps (with DS+C)",
        "rposnet@ES+DS+C",
        "rposnet@DS+C",
        ">",
        "§7.3; Table 5: ES+DS+C 24.9, DS+C 24.3 BLEU",
        P2_PLACEMENT,
    ),
    Claim(
        "2",
        "placement: decoder self-attention alone does not help (≤)",
        "rposnet@DS",
        REFERENCE_SYSTEM,
        "≤",
        "§7.3; Table 5: DS 26.1, none 26.3 BLEU",
        P2_PLACEMENT,
    ),
    Claim(
        "2",
        "placement: decoder self-attention helps with it in the encoder",
        "rposnet",
        "rposnet@ES",
        ">",
        "§7.3; Table 5: ES+DS 26.6, ES 26.4 BLEU",
        P2_PLACEMENT,
    ),
    Claim(
        "2",
        "chain: GLU makes no difference to light convolution (≈)",
        "lightconv",
        "lightconv-no-glu",
        "≈",
        "Appendix E, Table 7 rows 3 and 4 (En-Zh; row 4 is not in our copy's table)",
        "Light Convolution (row 3) shows similar translation quality to LightConv (row 4).",
    ),
    Claim(
        "2",
        "chain: GeLU gating > GLU",
        "lightconv+gelu-gating",
        "lightconv",
        ">",
        "Appendix E, Table 7 row 5: 33.5 BLEU (En-Zh)",
        "Replacing GLU gating with the gating mechanism of Section 2.3, denoted GeLU gating (row 5), increases "
        "translation quality noticeably by 0.5 points in BLEU, 0.2 points in BLEURT, and 1.3 points in COMET.",
    ),
    Claim(
        "2",
        "chain: global context negligible (≈)",
        "lightconv+gelu-gating+global-context",
        "lightconv+gelu-gating",
        "≈",
        "Appendix E, Table 7 rows 5 and 6: 33.5 and 33.6 BLEU (En-Zh), '+0.1 BLEU', called negligible",
        "While the global context seems negligible for machine translation, GeLU gating, training scheme, and "
        "unshared token-mixing weights are the most important.",
    ),
    Claim(
        "2",
        "chain: rPosNet > gated LightConv with global context",
        "rposnet",
        "lightconv+gelu-gating+global-context",
        ">",
        "Appendix E, Table 7 rows 6 and 7: 33.6 and 33.8 BLEU (En-Zh)",
        "The remaining difference to rPosNet (row 7) is the different training scheme and rPosNet's unshared "
        "kernel weights across query positions. Together they add additional 0.2 points in BLEU",
    ),
    Claim("3", "RPEHead > Transformer", "rpe_head", REFERENCE_SYSTEM, ">", "Main Results, Table 1", P3_MAIN),
    Claim("3", "MPRHead > Transformer", "mpr_head", REFERENCE_SYSTEM, ">", "Main Results, Table 1", P3_MAIN),
    Claim(
        "3",
        "MPRHead > RPEHead",
        "mpr_head",
        "rpe_head",
        ">",
        "Main Results, Table 1",
        "2) Moreover, +MPRHead (base) performed better than RPEHead/RPE (base).",
    ),
    *(
        Claim(
            "3", f"{head} in the {side} > PE there", f"{system}@{side}", REFERENCE_SYSTEM, ">", *P3_ABLATION
        )
        for head, system in (("RPEHead", "rpe_head"), ("MPRHead", "mpr_head"))
        for side in ("encoder", "decoder")
    ),
    Claim("3", "d_r sweep: RPEHead rises with d_r (128 > 64)", "rpe_head", "rpe_head-dr64", ">", *P3_SWEEP),
    Claim(
        "3",
        "d_r sweep: MPRHead rises with d_r up to d_model/2 (128 > 64)",
        "mpr_head",
        "mpr_head-dr64",
        ">",
        *P3_SWEEP,
    ),
    Claim(
        "3",
        "d_r sweep: MPRHead falls past d_model/2 (128 > 192)",
        "mpr_head",
        "mpr_head-dr192",
        ">",
        *P3_SWEEP,
    ),
    Claim(
        "3",
        "no PE in the decoder: slightly lower",
        "nope-decoder",
        REFERENCE_SYSTEM,
        "<",
        "Ablation Experiments (its table is not in our copy)",
        "2) For PE/RPEs, performance became slightly lower when PE was removed from the decoder.",
    ),
    Claim(
        "3",
        "PE matters more in the encoder: removing it there too costs far more",
        "none",
        "nope-decoder",
        "<",
        "Ablation Experiments (its table is not in our copy)",
        "However, when PE was removed from the encoder, the translation performance drastically decreased.",
    ),
]

# Claims this comparison cannot test, and why: (paper, claim, reason).
UNTESTABLE_CLAIMS = [
    (
        "1",
        "the gains hold for Transformer big (Table 2)",
        "needs big models trained on WMT14 (4.5M/36M pairs): the WMT14 training sets cannot be loaded offline "
        "(shared/data holds the dev and test sets only), and this protocol trains a 7.6M-parameter model on "
        "Multi30k's 29k pairs",
    ),
    (
        "2",
        "rPosNet on par with the Transformer at every data size (160k to 36M pairs) and on En-Zh",
        "one data condition here (Multi30k, 29k pairs); the IWSLT14, WMT14 and WMT18 training sets are not "
        "available offline",
    ),
    (
        "2",
        "the BLEURT and COMET side of every claim (gating +3.5 COMET for aPosNet/rPosNet, +2 for the "
        "Transformer; GaussianNet < LinearNet)",
        "both metrics are neural models that would have to be downloaded, and nothing is downloaded at run "
        "time: the rows above test the BLEU side",
    ),
    (
        "3",
        "MPRHead big > Transformer big; MPRHead base ≈ Transformer big",
        "needs big models trained on WMT14, as paper 1's Table 2",
    ),
    ("3", "the gains carry over to NIST Zh-En", "the LDC/NIST corpora are licensed and not available here"),
]


PROVISIONAL = " (provisional)"  # one seed on one side: the seed noise is the other side's alone
ONE_SEED = "one seed (no call)"
TIE_NOT_REPRODUCED = "tie: not reproduced"


def seed_sds(bleu: list[float], base_bleu: list[float]) -> list[float]:
    """The seed standard deviations of the two systems that have two seeds or more."""
    return [statistics.stdev(values) for values in (bleu, base_bleu) if len(values) >= 2]


def gap_call(delta: float, bar: float, tests: list[dict]) -> str:
    """better/worse when every seed's bootstrap is significant and |delta| exceeds `bar`; else tie."""
    significant = bool(tests) and all(test["bleu"]["significance"] for test in tests)
    if abs(delta) <= bar or not significant:
        return "tie"
    return "better" if delta > 0 else "worse"


def verdict(delta, bleu, base_bleu, tests) -> str:
    """The better/worse rule, one reading: **better**/**worse** only when every paired seed's bootstrap is
    significant (p < 0.10) and |delta| exceeds twice the LARGER of the two systems' seed standard deviations
    (each over all of its seeds); else a tie. The larger one, because a gap inside the noisier system's own spread
    is one that retraining that system can produce alone: the smaller one would let the quieter side (the
    baseline's 0.09) vouch for a gap the other side's seeds do not hold. With one seed of both, no seed noise is
    measured and the bootstrap alone cannot call a gap: "one seed". With one seed on one side only, the bar is the
    other side's: the call is marked PROVISIONAL."""
    if delta is None:
        return "baseline"
    sds = seed_sds(bleu, base_bleu)
    if not sds:
        return "one seed"
    call = gap_call(delta, SEED_SDS * max(sds), tests)
    return call + PROVISIONAL if min(len(bleu), len(base_bleu)) < 2 else call


@dataclass(frozen=True)
class Interval:
    """The seeds × sentences bootstrap interval of a BLEU gap (`CONFIDENCE` coverage) over `seeds` paired seeds."""

    lower: float
    upper: float
    seeds: int

    @property
    def half_width(self) -> float:
        """The smallest gap this interval tells from zero: a margin below it can never be shown equivalent."""
        return (self.upper - self.lower) / 2


def interval_verdict(relation: str, interval: Interval, margin: float = MARGIN) -> str:
    """reproduced / not reproduced / undecided (n seeds) of a "≥", "≤" or "≈" claim from its interval:
    "≥" holds when the lower bound is above −margin and fails when the upper one is below it; "≤" mirrors it at
    +margin; "≈" holds when the interval lies inside ±margin (TOST) and fails when it lies wholly outside."""
    lower, upper = interval.lower, interval.upper
    if relation == "≥":
        holds, fails = lower > -margin, upper < -margin
    elif relation == "≤":
        holds, fails = upper < margin, lower > margin
    elif relation == "≈":
        holds, fails = -margin < lower and upper < margin, lower > margin or upper < -margin
    else:
        raise ValueError(f"relation {relation!r} has no interval test; those that do: ≥, ≤, ≈")
    return "reproduced" if holds else "not reproduced" if fails else f"undecided ({interval.seeds} seeds)"


def claim_verdict(
    relation: str, measured: str, interval: Interval | None = None, margin: float = MARGIN
) -> str:
    """A claim's verdict from the test its relation names (module docstring): ">"/"<" from the better/worse
    call `measured` (a tie is "tie: not reproduced"; provisional where the call is), "≥"/"≤"/"≈" from the
    interval. No call on fewer than two paired seeds."""
    if relation in ("<", ">"):
        if measured.startswith("one seed"):
            return ONE_SEED
        call = measured.removesuffix(PROVISIONAL)
        expected = "better" if relation == ">" else "worse"
        result = (
            "reproduced" if call == expected else TIE_NOT_REPRODUCED if call == "tie" else "not reproduced"
        )
        return result + measured.removeprefix(call)
    if interval is None or interval.seeds < 2:
        return ONE_SEED
    return interval_verdict(relation, interval, margin)


def fragile_call(
    delta: float, bleu: list[float], base_bleu: list[float], tests: list[dict], seeds: list[int]
) -> list[str]:
    """Why a better/worse call could move with one more seed: |delta| within FRAGILE_BAND of the bar with every
    seed significant (the bar alone decides), a better/worse call resting on a seed at STRONG_P <= p < 0.10, or a
    call the other reading of the rule (twice the smaller sd) would make differently. `seeds` numbers the
    paired seeds of `tests`."""
    sds = seed_sds(bleu, base_bleu)
    if delta is None or not sds or min(len(bleu), len(base_bleu)) < 2:
        return []
    bar, call = SEED_SDS * max(sds), gap_call(delta, SEED_SDS * max(sds), tests)
    reasons = []
    significant = bool(tests) and all(test["bleu"]["significance"] for test in tests)
    if significant and abs(abs(delta) - bar) < FRAGILE_BAND:
        side = "over" if abs(delta) > bar else "under"
        reasons.append(f"|Δ| {abs(delta):.2f} is {abs(abs(delta) - bar):.2f} {side} the bar 2 sd = {bar:.2f}")
    if call != "tie":
        weak = [(seed, test["bleu"]["p_value"]) for seed, test in zip(seeds, tests, strict=True)]
        reasons += [f"seed {seed} at p = {p_text(p)}" for seed, p in weak if p >= STRONG_P]
    other = gap_call(delta, SEED_SDS * min(sds), tests)
    if other != call:
        reasons.append(
            f"the other reading (2 × the smaller sd, {SEED_SDS * min(sds):.2f}) would call it {other}"
        )
    return reasons


def fragile_interval(relation: str, interval: Interval, margin: float = MARGIN) -> list[str]:
    """Why an interval verdict could move with one more seed: a bound that decides it within FRAGILE_BAND of
    the margin it is tested against. "≈" is reproduced only with both bounds inside ±margin, so its inner edges
    count only where both bounds are within reach of them; its outer edges (a gap beyond the margin) always."""
    lower, upper = interval.lower, interval.upper
    if relation == "≥":
        edges = [("lower", lower, -margin), ("upper", upper, -margin)]
    elif relation == "≤":
        edges = [("upper", upper, margin), ("lower", lower, margin)]
    else:
        edges = [("lower", lower, margin), ("upper", upper, -margin)]
        if -margin - FRAGILE_BAND < lower and upper < margin + FRAGILE_BAND:
            edges += [("lower", lower, -margin), ("upper", upper, margin)]
    return [
        f"{name} bound {bound:+.2f} is {abs(bound - edge):.2f} from {edge:+.2f}"
        for name, bound, edge in edges
        if abs(bound - edge) < FRAGILE_BAND
    ]


def p_text(p: float) -> str:
    """A bootstrap p-value as the report prints it: three decimals, four where three would round it across a
    significance level (0.0999 is "0.0999", not "0.100", which reads as not significant at 0.10)."""
    short = f"{p:.3f}"
    crosses = any((p < level) != (float(short) < level) for level in (STRONG_P, SIGNIFICANT_P))
    return f"{p:.4f}" if crosses else short
