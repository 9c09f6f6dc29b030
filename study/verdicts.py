"""The papers' claims in the report and the README: how each claim is tested and in the paper's words, what a
pair's runs say about each (`Evidence`), the tally, the smallest gap the seeds can detect, and the verdicts that
sit on a margin one more seed could move."""

import math
import statistics
from collections import Counter
from dataclasses import dataclass, field

from .claims import (
    CLAIMS,
    CONFIDENCE,
    FRAGILE_BAND,
    MARGIN,
    SEED_SDS,
    TESTS,
    TIE_NOT_REPRODUCED,
    UNTESTABLE_CLAIMS,
    Claim,
    Interval,
    claim_verdict,
    fragile_call,
    fragile_interval,
    seed_sds,
)
from .results import Results
from .tables import REFERENCE_SYSTEM, SYSTEMS, TABLES

NOT_RUN = "not run"
VERDICT_WORDS = {"tie": "a tie with", "better": "better than", "worse": "worse than"}
NOISE_WORDS = {"tie": ", within the seed noise"}
GPU_BATCH = 10  # runs one GPU trains at a time in this protocol (docs/results.md, machines)


@dataclass(frozen=True)
class Evidence:
    """What one pair's runs say about one claim: the paired seeds, the gap, its interval, the better/worse
    rule's bar and call, the claim's verdict and why one more seed could move it."""

    claim: Claim
    seeds: int = 0
    delta: float | None = None
    interval: Interval | None = None
    bar: float | None = None
    measured: str = NOT_RUN
    verdict: str = ""
    reasons: list[str] = field(default_factory=list)


def claim_evidence(results: Results, pair: str, claim: Claim, references: list[str]) -> Evidence:
    """A claim's evidence in one pair (an empty one where either system has no run of the other's seeds)."""
    runs, bleu, base_bleu, delta, tests, measured = results.comparison(
        pair, claim.system, claim.reference, references
    )
    if not runs or delta is None:
        return Evidence(claim)
    interval = results.interval(pair, claim.system, claim.reference, references)
    sds = seed_sds(bleu, base_bleu)
    if claim.relation in ("<", ">"):
        seeds = [run.seed for run in results.paired(pair, claim.system, claim.reference)[0]]
        reasons = fragile_call(delta, bleu, base_bleu, tests, seeds)
    else:
        reasons = fragile_interval(claim.relation, interval) if interval else []
    bar = SEED_SDS * max(sds) if sds else None
    verdict = claim_verdict(claim.relation, measured, interval)
    return Evidence(claim, len(tests), delta, interval, bar, measured, verdict, reasons)


def pair_evidence(results: Results, pair: str, references: list[str]) -> list[Evidence]:
    """Every claim's evidence in one pair (claims naming a system outside the tables are left out)."""
    claims = [c for c in CLAIMS if c.system in SYSTEMS and c.reference in SYSTEMS]
    return [claim_evidence(results, pair, claim, references) for claim in claims]


def verdict_kind(verdict: str) -> str:
    """The tally's kind of a claim verdict: reproduced, tie (a strict claim measured as a tie), not reproduced,
    undecided, one seed or not run."""
    kinds = (("tie:", "tie"), ("not reproduced", "not reproduced"), ("reproduced", "reproduced"))
    kinds += (("undecided", "undecided"), ("one seed", "one seed"))
    return next((kind for start, kind in kinds if verdict.startswith(start)), NOT_RUN)


def tally(evidence: list[Evidence]) -> str:
    """'of 44 claims 9 reproduced, 14 not reproduced (11 of them a strict claim measured as a tie), 16 undecided,
    5 not run; 5 more not testable here'."""
    counts = Counter(verdict_kind(each.verdict) for each in evidence)
    parts = [
        f"{counts['reproduced']} reproduced",
        f"{counts['not reproduced'] + counts['tie']} not reproduced",
    ]
    if counts["tie"]:
        parts[-1] += f" ({counts['tie']} of them a strict claim measured as a tie)"
    parts += [f"{counts[kind]} {kind}" for kind in ("undecided", "one seed", NOT_RUN) if counts[kind]]
    return f"of {len(evidence)} claims {', '.join(parts)}; {len(UNTESTABLE_CLAIMS)} more not testable here"


def interval_cell(interval: Interval | None) -> str:
    return (
        ""
        if interval is None
        else f"[{interval.lower:+.2f}, {interval.upper:+.2f}] (±{interval.half_width:.2f})"
    )


def claims_table(evidence: list[Evidence]) -> list[str]:
    """A pair's claims table: the test, the gap over the paired seeds, its interval, the bar, the better/worse
    call and the verdict; then the claims this protocol cannot test."""
    lines = [
        "| paper | claim | test | system vs reference | seeds | Δ BLEU | "
        f"{CONFIDENCE:.0%} interval (± half-width) | 2 sd | measured | verdict |",
        "|" + " --- |" * 10,
    ]
    for each in evidence:
        claim = each.claim
        start = f"| {claim.paper} | {claim.claim} | {claim.test} | `{claim.system}` vs `{claim.reference}` |"
        if each.delta is None:
            lines.append(f"{start} | | | | {NOT_RUN} | |")
            continue
        bar = "" if each.bar is None else f"{each.bar:.2f}"
        cells = [str(each.seeds), f"{each.delta:+.2f}", interval_cell(each.interval), bar, each.measured]
        lines.append(f"{start} {' | '.join(cells)} | {each.verdict} |")
    for paper, claim, reason in UNTESTABLE_CLAIMS:
        lines.append(f"| {paper} | {claim} | | | | | | | {reason} | not testable here |")
    return lines


def detectable(evidence: list[Evidence]) -> str:
    """The smallest gap the pair's seeds can tell from zero (the intervals' half-widths, by seed count), what
    that means for the margin, and the better/worse rule's bars."""
    widths: dict[int, list[float]] = {}
    for each in evidence:
        if each.interval is not None:
            widths.setdefault(each.seeds, []).append(each.interval.half_width)
    if not widths:
        return ""
    spans = [
        f"{min(values):.2f}-{max(values):.2f} BLEU over {seeds} seeds (median {statistics.median(values):.2f}, "
        f"{len(values)} claims)"
        for seeds, values in sorted(widths.items(), reverse=True)
    ]
    most = max(widths)
    median = statistics.median(widths[most])
    needed = math.ceil(most * (median / MARGIN) ** 2)
    narrow = sum(width < MARGIN for values in widths.values() for width in values)
    bars = [each.bar for each in evidence if each.bar is not None]
    return (
        f"The smallest gap this table tells from zero is the half-width of a claim's {CONFIDENCE:.0%} interval: "
        f"{'; '.join(spans)}. An equivalence or non-inferiority claim can be shown within ±{MARGIN} only where "
        f"the half-width is below {MARGIN} and the gap below {MARGIN} minus it: {narrow} of the "
        f"{sum(map(len, widths.values()))} intervals are that narrow. If the half-width fell as 1/√n with the "
        f"seeds (the test-set part does not shrink, so this is optimistic), the median one at {most} seeds would "
        f"reach {MARGIN} at about {needed} seeds. The better/worse rule's bar (2 × the larger seed sd) is "
        f"{min(bars):.2f}-{max(bars):.2f} BLEU over these claims."
    )


def verdict_reasons(
    results: Results, pair: str, references: list[str]
) -> list[tuple[str, str, str, list[str]]]:
    """(system, reference, verdict, reasons) of every table verdict against the reference system that one more
    seed could move (`claims.fragile_call`)."""
    found = []
    systems = dict.fromkeys(system.name for table in TABLES.values() for system in table)
    for system in systems:
        if system == REFERENCE_SYSTEM:
            continue
        runs, bleu, base_bleu, delta, tests, call = results.comparison(
            pair, system, REFERENCE_SYSTEM, references
        )
        seeds = [run.seed for run in results.paired(pair, system, REFERENCE_SYSTEM)[0]]
        if runs and delta is not None and (reasons := fragile_call(delta, bleu, base_bleu, tests, seeds)):
            found.append((system, REFERENCE_SYSTEM, call, reasons))
    return found


def margin_section(results: Results, pair: str, evidence: list[Evidence], references: list[str]) -> list[str]:
    """The verdicts of a pair that sit on a margin (within FRAGILE_BAND of the bar that decides them, on a seed
    at p >= 0.05, or read differently by the rule's other reading), and what one more seed of each costs."""
    items, needed = [], {}
    for system, reference, call, reasons in verdict_reasons(results, pair, references):
        items.append(f"- `{system}` vs `{reference}`, the tables' verdict **{call}**: {'; '.join(reasons)}.")
        needed.update(dict.fromkeys((system, reference)))
    for each in evidence:
        if each.reasons:
            claim = each.claim
            items.append(
                f"- paper {claim.paper}'s claim {claim.claim} ({claim.test}, `{claim.system}` vs `{claim.reference}`), "
                f"**{each.verdict}**: {'; '.join(each.reasons)}."
            )
            needed.update(dict.fromkeys((claim.system, claim.reference)))
    if not items:
        return []
    runs = [f"`{system}` seed {max(r.seed for r in results.runs_of(pair, system)) + 1}" for system in needed]
    return [
        "### Verdicts on a margin (one more seed could move them)",
        "",
        f"A verdict is listed where the number that decides it is within {FRAGILE_BAND} BLEU of its bar (the "
        f"better/worse rule's 2 sd, or ±{MARGIN} for an interval), where a better/worse call rests on a seed at "
        "p ≥ 0.05, or where the rule's other reading (twice the smaller seed sd) calls it differently. Nothing "
        "was trained for this list.",
        "",
        *items,
        "",
        f"One more seed of each system named is {len(runs)} runs ({', '.join(runs)}): "
        f"{math.ceil(len(runs) / GPU_BATCH)} batch{'es' * (len(runs) > GPU_BATCH)} of up to {GPU_BATCH} runs on "
        "one GPU, 3-6 minutes a run there (Machines and what a run costs, below).",
        "",
    ]


def seed_noise(results: Results, pair: str) -> tuple[float | None, dict[str, float]]:
    """(the reference system's seed sd, the seed sd of every other main-table system) of a pair, over the systems
    with two seeds or more."""
    sds = {}
    for system in TABLES["main"]:
        bleu = [results.bleu(run) for run in results.runs_of(pair, system.name)]
        if len(bleu) >= 2:
            sds[system.name] = statistics.stdev(bleu)
    return sds.pop(REFERENCE_SYSTEM, None), sds


def protocol_section(results: Results) -> list[str]:
    """How each claim is tested, the margin and the seed noise that justifies it, and every claim in the paper's
    words (once, for every pair)."""
    noise = []
    for pair in results.pairs:
        baseline, others = seed_noise(results, pair)
        if baseline is not None and others:
            noise.append(
                f"{pair}: `{REFERENCE_SYSTEM}` {baseline:.2f}, the median of the other {len(others)} main-table "
                f"systems {statistics.median(others.values()):.3f} (`{min(others, key=others.get)}` "
                f"{min(others.values()):.2f} to `{max(others, key=others.get)}` {max(others.values()):.2f})"
            )
    lines = [
        "## The papers' claims and how each is tested",
        "",
        "Each claim below is the paper's own sentence (or, where the paper states it only in a table, the table's "
        "numbers), encoded as the relation its words state, and tested accordingly: **>**/**<** (better, best, "
        "helps, outperformed, worse, decreased) by the better/worse rule above, so a tie does not reproduce it "
        f'("{TIE_NOT_REPRODUCED}"); **≥**/**≤** (as well or better; only beneficial if) by a non-inferiority '
        f"(non-superiority) test with the margin δ = {MARGIN} BLEU: reproduced when the {CONFIDENCE:.0%} interval's "
        "lower bound is above −δ (for ≤, its upper bound below +δ), not reproduced when the whole interval is "
        "beyond the margin (its upper bound below −δ; for ≤, its lower bound above +δ); "
        "**≈** (on par, similar, negligible) by an equivalence test, two one-sided tests (TOST) at α = 0.05: "
        f"reproduced when the {CONFIDENCE:.0%} interval lies inside ±δ, not reproduced when it lies wholly "
        "outside. Otherwise the seeds cannot decide at that margin: **undecided (n seeds)**. The interval is a "
        "paired bootstrap over seeds × sentences (study/bootstrap.py): each sample draws one resample of the "
        "test sentences, shared by every seed (they translate the same sentences), and the paired seeds with "
        "replacement, and averages the drawn seeds' BLEU gaps; the percentile interval of "
        f"{results.args.bootstrap_samples} samples. No claim is called on one seed.",
        "",
        f"**The margin, δ = {MARGIN} BLEU**, was fixed from the seed noise before any interval was computed. "
        f"Seed standard deviations of BLEU: {'; '.join(noise) or 'not measured'}. A system's BLEU moves by about "
        f"{MARGIN} BLEU when it is retrained with another seed, so a gap smaller than that is one that reseeding "
        "one system produces by itself: no reader could act on it, and it is what 'equal' can mean at this "
        "model size. It is not the baseline's own spread, the quietest row of the table, which would demand a "
        "precision no other system has. It also admits the gaps paper 1's Table 1 shows for the systems it "
        "lists as comparable (RPE -0.41, Adaptive-T5 -0.46 BLEU En-De).",
        "",
        "| paper | claim | relation | test | where the paper states it | the paper's words |",
        "| --- | --- | --- | --- | --- | --- |",
    ]
    for claim in CLAIMS:
        words = f'"{claim.quote}"' if claim.quote else "(a table only)"
        lines.append(
            f"| {claim.paper} | {claim.claim} | `{claim.system}` {claim.relation} `{claim.reference}` | "
            f"{TESTS[claim.relation]} | {claim.source} | {words} |"
        )
    return [*lines, ""]


def best_system_text(results: Results, pair: str, references: list[str], best: str, mean: float) -> str:
    """'best `rope` 37.76, a tie with `sinusoidal` (+0.76, within the seed noise)': the highest mean named with its
    verdict against the reference, so that a tie does not read as a win."""
    text = f"best `{best}` {mean:.2f}"
    if best == REFERENCE_SYSTEM:
        return text
    _, _, _, delta, _, call = results.comparison(pair, best, REFERENCE_SYSTEM, references)
    if delta is None or call not in VERDICT_WORDS:
        return text
    return f"{text}, {VERDICT_WORDS[call]} `{REFERENCE_SYSTEM}` ({delta:+.2f}{NOISE_WORDS.get(call, '')})"


def readme_tally(results: Results, pair: str, references: list[str]) -> str:
    """ " The papers' claims, of 44 claims 9 reproduced, ..." for the README's summary line; nothing without runs."""
    evidence = pair_evidence(results, pair, references)
    if all(each.delta is None for each in evidence):
        return ""
    return f" The papers' claims, {tally(evidence)}."
