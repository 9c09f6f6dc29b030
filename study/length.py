"""Length generalisation in the report: how much of its one-sentence BLEU each system keeps when k consecutive test
sentences are joined into one input (`hf_posenc.analysis.length_generalisation` measures it per run), as shares
over seeds, the report's section and its plots."""

import statistics
from pathlib import Path

from hf_posenc.analysis.length_generalisation import (
    comparison_table,
    mean_over_seeds,
    plot_length_generalisation,
    sentence_ends,
)

from .results import Results

# The share of the k = 1 BLEU a system must keep at k = 4 joined sentences, and its length ratio there.
TARGET_KEPT, TARGET_RATIO = 0.7, 0.9


def joined_at(result: dict, k: int) -> dict | None:
    """The row of one length result with k sentences joined, or None where k was not measured."""
    return next((row for row in result["joined"] if row["k"] == k), None)


def kept_at(result: dict, k: int) -> tuple[float, float] | None:
    """(share of the k = 1 BLEU kept with k sentences joined, length ratio there) of one length result, or None
    where either row has no score (not measured, or more positions than the model holds)."""
    first, joined = joined_at(result, 1), joined_at(result, k)
    if not first or not first["bleu"] or not joined or joined["bleu"] is None:
        return None
    return joined["bleu"] / first["bleu"], joined["length_ratio"]


def kept_over_seeds(results: list[dict], k: int) -> tuple[list[float], float] | None:
    """(every seed's share of its k = 1 BLEU kept with k sentences joined, the mean length ratio there) of one
    system's length results, or None where a seed has no score there."""
    kept = [kept_at(result, k) for result in results]
    if None in kept:
        return None
    return [share for share, _ in kept], statistics.mean(ratio for _, ratio in kept)


def kept_cell(shares: list[float]) -> str:
    """'18%' for one seed, '18 ± 1%' (mean ± standard deviation over seeds) for several."""
    if len(shares) < 2:
        return f"{100 * shares[0]:.0f}%"
    return f"{100 * statistics.mean(shares):.0f} ± {100 * statistics.stdev(shares):.0f}%"


def kept_at_4(measured: dict[str, list[dict]], degenerate: set[str]) -> list[tuple[float, str, float, str]]:
    """(mean share of the k = 1 BLEU kept at k = 4, `kept_cell`, mean length ratio there, system) of every
    system's length results (`Results.length_results`) but the degenerate ones, best first."""
    kept = []
    for system, results in measured.items():
        if system not in degenerate and (over_seeds := kept_over_seeds(results, 4)) is not None:
            shares, ratio = over_seeds
            kept.append((statistics.mean(shares), kept_cell(shares), ratio, system))
    return sorted(kept, reverse=True)


def length_section(results: Results, pair: str, docs: Path) -> list[str]:
    """The report's length-generalisation section of a pair (none without runs), its two plots drawn into
    `docs`."""
    measured, degenerate = results.length_results(pair)
    if not measured:
        return []
    means = {
        f"{s} (degenerate runs)" if s in degenerate else s: mean_over_seeds(r) for s, r in measured.items()
    }
    joined, buckets = f"results_{pair}_length.png", f"results_{pair}_length_buckets.png"
    title = f"length generalisation, {pair}, mean over seeds"
    plot_length_generalisation(means, docs / joined, title=title)
    title = f"source-length buckets, {pair}, mean over seeds"
    plot_length_generalisation(means, docs / buckets, series="buckets", title=title)
    kept = kept_at_4(measured, degenerate)
    best = ", ".join(f"`{s}` {cell} (ratio {ratio:.2f})" for _, cell, ratio, s in kept[:8])
    meeting = [
        f"`{s}` ({cell}, ratio {ratio:.2f})"
        for share, cell, ratio, s in kept
        if share >= TARGET_KEPT and ratio >= TARGET_RATIO
    ]
    ends = [
        f"`{s}` {sentence_ends(row)}"
        for s, result in means.items()
        if (row := joined_at(result, 4)) and row.get("hyp_sentence_ends") is not None
    ]
    ends_text = (
        f" Sentence ends per input at k = 4 (hypotheses / references): {', '.join(ends)}." if ends else ""
    )
    return [
        "### Length generalisation (joined test sentences, every seed)",
        "",
        "k consecutive test sentences joined into one input (sources with sources, references with references); "
        "BLEU and hypothesis/reference length ratio per k, each the mean over the system's seeds (the tables "
        'above give their number; a degenerate run is left out). "cannot": the input needs more positions '
        "than the model's table holds. Share of the k = 1 BLEU kept at k = 4 (mean ± standard deviation of "
        f"the seeds' shares), best first: {best}. Target (≥ {TARGET_KEPT:.0%} kept and length ratio ≥ {TARGET_RATIO} at "
        "k = 4): "
        f"{', '.join(meeting) if meeting else 'met by no system'}.{ends_text}",
        "",
        comparison_table(means),
        "",
        f"![length generalisation]({joined})",
        "",
        "The plain test set by source length in tokens (the harness's default buckets, `--buckets 10 20 30 40`):",
        "",
        comparison_table(means, series="buckets"),
        "",
        f"![length buckets]({buckets})",
        "",
    ]
