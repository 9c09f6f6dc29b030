"""The README's results (`--readme`): the BLEU and length-generalisation cells of its module table, from one pair's
runs, and between its markers a summary line for every reported pair."""

import statistics
import time
from pathlib import Path

from hf_posenc.analysis.length_generalisation import cannot_cell

from .extrapolation import target_summary
from .length import joined_at, kept_at_4, kept_cell, kept_over_seeds
from .results import Results, mean_sd
from .runs import test_set
from .tables import REFERENCE_SYSTEM, SYSTEMS, TABLES
from .verdicts import best_system_text, readme_tally

SUMMARY_START = "<!-- results summary: written by python -m study from results/ -->"
SUMMARY_END = "<!-- end of results summary -->"
MODULE_TABLE_HEADER = "| name | kind | paper / equation | docs | status | BLEU | length generalisation |"
NOT_RUN = "not run yet"


def readme_lines(readme: Path) -> list[str]:
    """The README's lines; a ValueError names the file unless it holds the module table and the summary markers
    (checked before a comparison starts, so that no result is lost on a README it cannot update)."""
    if not readme.is_file():
        raise ValueError(f"--readme {readme} does not exist")
    lines = readme.read_text().split("\n")
    missing = [marker for marker in (MODULE_TABLE_HEADER, SUMMARY_START, SUMMARY_END) if marker not in lines]
    if missing:
        raise ValueError(
            f"--readme {readme} lacks the line{'s' * (len(missing) > 1)} {' and '.join(missing)}"
        )
    return lines


def write_readme(results: Results, readme: Path, pair: str) -> None:
    """The module table's cells from `pair`'s results (its `attention` row is the reference system's model), and
    the summary of every pair."""
    lines = readme_lines(readme)
    start = lines.index(MODULE_TABLE_HEADER) + 2
    end = next((i for i in range(start, len(lines)) if not lines[i].startswith("| `")), len(lines))
    for i in range(start, end):
        cells = lines[i].split(" | ")
        name = cells[0].removeprefix("| ").strip("`")
        system = REFERENCE_SYSTEM if name == "attention" else name
        if system in SYSTEMS:
            bleu, length = module_cells(results, pair, system)
            cells[-2:] = [bleu, f"{length} |"]
            lines[i] = " | ".join(cells)
    first, last = lines.index(SUMMARY_START), lines.index(SUMMARY_END)
    lines[first + 1 : last] = [
        line for each in results.pairs for line in summary(results, each, each == pair)
    ]
    readme.write_text("\n".join(lines))


def module_cells(results: Results, pair: str, system: str) -> tuple[str, str]:
    """(BLEU mean ± sd over seeds, share of the k = 1 BLEU kept at k = 4 with the length ratio)."""
    runs = results.runs_of(pair, system)
    if not runs:
        return NOT_RUN, NOT_RUN
    bleu = [results.bleu(run) for run in runs]
    degenerate = sum(bool(results.degenerate(run)) for run in runs)
    lengths, _ = results.length_runs(pair, system)
    fourth = joined_at(lengths[0], 4)
    if fourth is not None and fourth["cannot"] is not None:
        length = f"k = 4: {cannot_cell(fourth['cannot'])}"
    elif (kept := kept_over_seeds(lengths, 4)) is None:
        length = "not measured at k = 4"
    else:
        length = f"k = 4: {kept_cell(kept[0])} of k = 1 BLEU, length ratio {kept[1]:.2f}"
    seeds = f"{len(bleu)} seed{'s' * (len(bleu) > 1)}" + (f", {degenerate} degenerate" if degenerate else "")
    return f"{mean_sd(bleu)} ({seeds})", length


def summary(results: Results, pair: str, in_module_table: bool = True) -> list[str]:
    """The README's summary line of a pair: the runs, the reference's and the best mean BLEU (with the best one's
    verdict, so a tie does not read as a win), the length generalisation and the claims' tally;
    `in_module_table`: the README's module table shows this pair."""
    recipe = results.args.recipe
    measured = {s.name: runs for s in TABLES["main"] if (runs := results.runs_of(pair, s.name))}
    if not measured:
        return [f"Comparison (`{recipe}`, {pair}): no run finished yet."]
    mean = {name: statistics.mean(map(results.bleu, runs)) for name, runs in measured.items()}
    best = max(mean, key=mean.get)
    counts = [len(runs) for runs in measured.values()]
    seeds = ", ".join(
        f"{counts.count(n)} with {n} seed{'s' * (n > 1)}" for n in sorted(set(counts), reverse=True)
    )
    reference = f"{mean[REFERENCE_SYSTEM]:.2f}" if REFERENCE_SYSTEM in mean else NOT_RUN
    references = test_set(recipe, pair, results.args.test_limit).target
    length = ""
    kept = {system: (cell, ratio) for _, cell, ratio, system in kept_at_4(*results.length_results(pair))}
    if kept:
        longest = next(iter(kept))  # kept_at_4 sorts best first
        shown = (
            [longest]
            if longest == REFERENCE_SYSTEM or REFERENCE_SYSTEM not in kept
            else [longest, REFERENCE_SYSTEM]
        )
        cells = [f"`{s}` {kept[s][0]} (length ratio {kept[s][1]:.2f})" for s in shown]
        length = f" Inputs of 4 test sentences joined (over seeds), 1-sentence BLEU kept: {', '.join(cells)}."
    pointer = (
        "BLEU and length generalisation per module: the table under [Positional modules](#positional-modules); "
        "tables, verdicts and the papers' claims: "
        if in_module_table
        else "Tables, verdicts and the papers' claims: "
    )
    return [
        f"- Comparison of every module (`{recipe}`, {pair}, {results.test_split}, written "
        f"{time.strftime('%Y-%m-%d')}; {results.machines([pair])}): {len(measured)} of {len(TABLES['main'])} "
        f"main-table systems measured ({seeds}). Mean BLEU: `{REFERENCE_SYSTEM}` {reference}, "
        f"{best_system_text(results, pair, references, best, mean[best])}.{length}{target_summary(results, pair)}"
        f"{readme_tally(results, pair, references)} {pointer}[docs/results.md](docs/results.md).",
    ]
