"""Extrapolation past the training length in the report: the extrapolation systems, trained on 2-4 joined pairs
(`tables.CONCAT4`), measured with k = 1..16 joined test sentences, each against its **ceiling**: the same model's
k = 1 translations of the same sentences, joined like the inputs (`length_generalisation`'s ceiling, recomputed
here from each run's recorded translations, so every recorded run has one).

Kept: the joined BLEU over the ceiling's, on the same groups. The rule written before any run of the length
options (docs/length.md, "The rule"), two bars:

* **target**: at k = 8 keep ≥ 90% of the ceiling with length ratio in [0.95, 1.05] and ≥ 95% of the references'
  sentence ends; at k = 16 keep ≥ 75% with ratio ≥ 0.9; and at k = 1 be non-inferior (margin `NON_INFERIORITY`
  BLEU) to `REFERENCE_ROW`.
* **floor** (progress): at k = 8 keep ≥ 80% with ratio ≥ 0.9; at k = 16 keep ≥ 60% with ratio ≥ 0.85.

Each quantity is tested on a seeds × groups bootstrap as `bootstrap.bootstrap_gaps` draws it: the k-input g joins
test sentences kg .. kg + k - 1, so group g holds its joined translation, its ceiling and its reference; a sample
draws the groups with replacement (the same groups for every seed: the seeds translate the same inputs) and the
seeds with replacement, and its kept share is the mean over the drawn seeds of BLEU(joined) / BLEU(ceiling) on the
drawn groups (length ratio and sentence-end share likewise). A bar is **met** where every `CONFIDENCE` interval
lies inside its bound (one-sided tests at α = 0.05), **missed** where one lies wholly outside, and **undecided
(n seeds)** otherwise; one seed gets no call, as a claim does not. A degenerate run (`Results.degenerate`: its
output hardly depends on the source) is left out, and a system whose every run is degenerate gets
`NO_USABLE_SEED`.

Where the translations stop (`stopping_lines`): the median length in words of each system's translations of the
joined inputs at k = 4, 8 and 16, against the references'. A decoder that has learned when to stop from its
training lengths writes about as much for 16 joined sentences as for 8; one that extrapolates grows with the input,
and one that has lost its place in the input grows by repeating itself (the repeated sentences at k = 16).

What the translations leave out (`coverage_lines`): for each place i = 1..8 of the k = 8 inputs, the share of the
content words (`CONTENT_WORD`, clipped counts) of the i-th joined reference sentence that its input's translation
holds, against chance (the same share in the translation of the next input). A decoder that stops at a learned
length covers the first places and drops the last ones (the end holds less than the middle); one that covers both
ends drops the middle. The "where it misses" column names both: how much it writes and what it leaves out.
"""

import math
import re
import statistics
from collections import Counter
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from hf_posenc.analysis.length_generalisation import count_sentence_ends, join_consecutive
from hf_posenc.pipeline.data.files import read_lines

from .bootstrap import bleu_of_statistics, percentile_interval, sentence_statistics
from .claims import CONFIDENCE, MARGIN, interval_verdict
from .length import kept_cell
from .results import Results, table_lines
from .runs import JOINED_TRANSLATIONS, Run, test_set
from .tables import EXTRAPOLATION_K, TABLES


@dataclass(frozen=True)
class Bound:
    """One condition of a bar at one k: keep ≥ `kept` of the ceiling BLEU, with a length ratio in `ratio` and at
    least `ends` of the references' sentence ends."""

    k: int
    kept: float
    ratio: tuple[float, float]
    ends: float = 0.0


# The rule (docs/length.md, written before any run of the length options).
TARGET = (Bound(8, 0.90, (0.95, 1.05), 0.95), Bound(16, 0.75, (0.9, math.inf)))
FLOOR = (Bound(8, 0.80, (0.9, math.inf)), Bound(16, 0.60, (0.85, math.inf)))
REFERENCE_ROW = (
    "sinusoidal+concat4"  # the target's k = 1 non-inferiority is against it, with the claims' margin
)
NON_INFERIORITY = MARGIN
BEST_ROWS = (
    "fire+concat4",
    "kerple+concat4",
)  # the best rows before the length options: every row against them
TARGET_K = 8  # the k of the coverage table and of the first bound
STOPPING_K = (4, 8, 16)  # 4: the size of the longest training examples; 8 and 16: twice and four times that
SENTENCE_BREAK = re.compile(r"(?<=[.!?])\s+")  # the space after a full stop, question or exclamation mark
# Words of four letters or more: mostly content words in German and French.
CONTENT_WORD = re.compile(r"\w{4,}")
NO_USABLE_SEED = "no call: every seed degenerate"  # the row cannot answer: its model ignores the source
MIDDLE, END = slice(2, TARGET_K - 2), slice(TARGET_K - 2, TARGET_K)  # places 3-6 and 7-8 of the k = 8 inputs
# The rows the rule judges: those of the extrapolation and length-options tables, without their plain reference.
RULED_ROWS = [system.name for table in ("extrapolation", "length_options") for system in TABLES[table][1:]]
REPEATED_LOOP = 0.05  # a share of repeated sentences at k = 16 above this (the references: 0-1%) is a loop


@dataclass(frozen=True)
class Groups:
    """One run's inputs of k joined sentences, per group (G groups): BLEU statistics of the joined translation and
    of the ceiling, (G, STATISTICS) each, and the sentence ends of the translation and of the reference, (G,)."""

    joined: np.ndarray
    ceiling: np.ndarray
    hypothesis_ends: np.ndarray
    reference_ends: np.ndarray

    def kept(self) -> float:
        return float(bleu_of_statistics(self.joined.sum(0)) / bleu_of_statistics(self.ceiling.sum(0)))

    def ratio(self) -> float:
        return float(self.joined[:, 0].sum() / self.joined[:, 1].sum())

    def ends(self) -> float:
        return float(self.hypothesis_ends.sum() / max(self.reference_ends.sum(), 1))


def joined_translations(results: Results, run: Run, k: int) -> list[str] | None:
    """The run's translations of the inputs of k joined test sentences; None where it kept none for k (a k it
    could not take)."""
    path = run.folder(results.root) / JOINED_TRANSLATIONS.format(k=k, lang=run.target_lang)
    return read_lines(path) if path.is_file() else None


def groups(results: Results, run: Run, k: int) -> Groups | None:
    """The run's `Groups` at k (its ceiling from its recorded k = 1 translations), once per run and k; None where
    it kept no translation for k (a k it could not take)."""
    key = (run, k)
    if key not in results.groups:
        joined = joined_translations(results, run, k)
        if joined is None:
            results.groups[key] = None
        else:
            test = test_set(run.recipe, run.pair, results.args.test_limit)
            ceiling, references = join_consecutive(results.hypotheses(run), test.target, k)
            results.groups[key] = Groups(
                sentence_statistics(joined, references),
                sentence_statistics(ceiling, references),
                np.array([count_sentence_ends(text) for text in joined]),
                np.array([count_sentence_ends(text) for text in references]),
            )
    return results.groups[key]


def bar_samples(runs: list[Groups], samples: int, seed: int = 0) -> dict[str, np.ndarray]:
    """Kept share, length ratio and sentence-end share, each (samples,): the seeds × groups bootstrap of the module
    docstring over a system's seeds at one k. `seed` seeds the resampling, so a rebuilt report gives the same
    intervals."""
    rng = np.random.default_rng(seed)
    count = len(runs[0].joined)
    weights = rng.multinomial(count, np.full(count, 1.0 / count), size=samples)  # (samples, groups)
    with np.errstate(divide="ignore", invalid="ignore"):  # a sample whose ceiling BLEU is 0 keeps nan
        values = {
            "kept": [
                bleu_of_statistics(weights @ g.joined) / bleu_of_statistics(weights @ g.ceiling) for g in runs
            ],
            "ratio": [(weights @ g.joined[:, 0]) / (weights @ g.joined[:, 1]) for g in runs],
            "ends": [(weights @ g.hypothesis_ends) / (weights @ g.reference_ends) for g in runs],
        }
    drawn = rng.integers(0, len(runs), size=(samples, len(runs)))  # the seeds of each sample
    return {
        name: np.take_along_axis(np.stack(seeds, 1), drawn, axis=1).mean(axis=1)
        for name, seeds in values.items()
    }


def bound_call(bound: Bound, intervals: dict[str, tuple[float, float]]) -> str:
    """met / missed / undecided of one bound from the intervals of its three quantities."""
    limits = {"kept": (bound.kept, math.inf), "ratio": bound.ratio, "ends": (bound.ends, math.inf)}
    if all(low <= intervals[name][0] and intervals[name][1] <= high for name, (low, high) in limits.items()):
        return "met"
    if any(intervals[name][1] < low or intervals[name][0] > high for name, (low, high) in limits.items()):
        return "missed"
    return "undecided"


def combined_call(calls: list[str], seeds: int) -> str:
    """A bar's verdict from its bounds' calls (module docstring)."""
    if seeds < 2:
        return "one seed (no call)"
    if "missed" in calls:
        return "**missed**"
    return "**met**" if set(calls) == {"met"} else f"undecided ({seeds} seeds)"


def usable_runs(results: Results, runs: list[Run]) -> list[Run]:
    """The runs a bar is tested on: the degenerate ones left out (their output does not depend on the source)."""
    return [run for run in runs if not results.degenerate(run)]


def bound_intervals(results: Results, runs: list[Run], k: int) -> dict[str, tuple[float, float]] | None:
    """The `CONFIDENCE` intervals of kept share, length ratio and sentence-end share at k; None where a run kept no
    translation for k."""
    found = [groups(results, run, k) for run in runs]
    if None in found:
        return None
    samples = bar_samples(found, results.args.bootstrap_samples)
    return {name: percentile_interval(values, CONFIDENCE) for name, values in samples.items()}


def non_inferior_call(results: Results, pair: str, system: str) -> str:
    """met / missed / undecided of the target's k = 1 condition: non-inferior to `REFERENCE_ROW` (claims' rule)."""
    if system == REFERENCE_ROW:
        return "met"
    references = test_set(results.runs_of(pair, system)[0].recipe, pair, results.args.test_limit).target
    interval = results.interval(pair, system, REFERENCE_ROW, references)
    if interval is None:
        return "undecided"
    verdict = interval_verdict("≥", interval, NON_INFERIORITY)
    return {"reproduced": "met", "not reproduced": "missed"}.get(verdict, "undecided")


def bar_verdicts(results: Results, pair: str, system: str, runs: list[Run]) -> dict | None:
    """{"floor", "target": verdict, k: intervals} of one system; None where a run kept no translation for a bound's
    k; {"floor" and "target": NO_USABLE_SEED} where every run is degenerate."""
    usable = usable_runs(results, runs)
    if not usable:
        return {"floor": NO_USABLE_SEED, "target": NO_USABLE_SEED}
    intervals = {bound.k: bound_intervals(results, usable, bound.k) for bound in TARGET}
    if None in intervals.values():
        return None
    floor = [bound_call(bound, intervals[bound.k]) for bound in FLOOR]
    target = [bound_call(bound, intervals[bound.k]) for bound in TARGET]
    target.append(non_inferior_call(results, pair, system))
    return {
        "floor": combined_call(floor, len(usable)),
        "target": combined_call(target, len(usable)),
        **intervals,
    }


def why_missed(results: Results, runs: list[Run], gap: int | None) -> str:
    """What a miss comes from, over the usable runs at k = TARGET_K: how much the translations write (length ratio,
    sentence ends), whether they loop (repeated sentences at the longest k) and what they leave out (`gap`: end −
    middle coverage in points)."""
    found = [groups(results, run, TARGET_K) for run in usable_runs(results, runs)]
    ratio = statistics.mean(g.ratio() for g in found)
    ends = statistics.mean(g.ends() for g in found)
    reasons = []
    if ratio < TARGET[0].ratio[0]:
        reasons.append(f"stops early (ratio {ratio:.2f}, {ends:.0%} of the sentence ends)")
    elif ratio > TARGET[0].ratio[1]:
        reasons.append(f"writes too much (ratio {ratio:.2f})")
    longest = [joined_translations(results, run, STOPPING_K[-1]) for run in runs]
    if None not in longest and (repeats := repeated_share(sum(longest, []))) > REPEATED_LOOP:
        reasons.append(f"loops ({repeats:.0%} repeated sentences at k = {STOPPING_K[-1]})")
    if gap is not None and gap <= -5:
        reasons.append(f"drops the end (end − middle {gap:+d} points)")
    elif gap is not None and gap >= 5:
        reasons.append(f"skips the middle (end − middle {gap:+d} points)")
    return "; ".join(reasons) or "writes the whole length with fewer correct n-grams"


def kept_cells(results: Results, runs: list[Run]) -> tuple[list[str], dict[int, float]]:
    """Per k > 1: every usable seed's kept share of its ceiling (`kept_cell`), and their means for the figure."""
    cells, means = [], {}
    for k in EXTRAPOLATION_K[1:]:
        found = [groups(results, run, k) for run in usable_runs(results, runs) or runs]
        if None in found:
            cells.append("cannot")
            continue
        shares = [g.kept() for g in found]
        cells.append(kept_cell(shares))
        means[k] = statistics.mean(shares)
    return cells, means


def mean_over(results: Results, runs: list[Run], k: int, quantity: str) -> float | None:
    found = [groups(results, run, k) for run in usable_runs(results, runs) or runs]
    return None if None in found else statistics.mean(getattr(g, quantity)() for g in found)


def joined_bleu(results: Results, runs: list[Run], k: int) -> float | None:
    """The mean over a system's usable seeds of its BLEU on the k-inputs (from the recorded translations)."""
    found = [groups(results, run, k) for run in usable_runs(results, runs) or runs]
    return (
        None if None in found else statistics.mean(float(bleu_of_statistics(g.joined.sum(0))) for g in found)
    )


def against_best(results: Results, pair: str, runs: list[Run]) -> str:
    """The k = TARGET_K BLEU and its gap to each of `BEST_ROWS`' (that have runs)."""
    own = joined_bleu(results, runs, TARGET_K)
    if own is None:
        return "–"
    gaps = []
    for best in BEST_ROWS:
        if (found := results.runs_of(pair, best)) and (
            theirs := joined_bleu(results, found, TARGET_K)
        ) is not None:
            gaps.append(f"{own - theirs:+.1f}")
    return f"{own:.1f}" + (f" ({', '.join(gaps)})" if gaps else "")


def interval_cell(intervals: dict | None, k: int) -> str:
    if intervals is None:
        return "–"
    low, high = intervals[k]["kept"]
    return f"[{100 * low:.0f}%, {100 * high:.0f}%]"


def system_cells(results: Results, pair: str, name: str, found: list[Run], gap: int | None):
    """(the table cells of one system, its mean kept share per k for the figure)."""
    degenerate = [f"seed {run.seed}" for run in found if results.degenerate(run)]
    label = f"`{name}`" + (f" (degenerate: {', '.join(degenerate)})" if degenerate else "")
    cells = [label, str(len(found)), f"{statistics.mean(results.bleu(run) for run in found):.2f}"]
    kept, means = kept_cells(results, found)
    cells += kept
    for k, quantity in ((8, "ratio"), (16, "ratio"), (8, "ends")):
        value = mean_over(results, found, k, quantity)
        cells.append("–" if value is None else f"{value:.0%}" if quantity == "ends" else f"{value:.2f}")
    cells.append(against_best(results, pair, found))
    verdicts = bar_verdicts(results, pair, name, found)
    if verdicts is None:
        return cells + ["no translations kept", "", "", "", ""], means
    usable = "floor" in verdicts and 8 in verdicts
    cells += [interval_cell(verdicts if usable else None, k) for k in (8, 16)]
    cells += [verdicts["floor"], verdicts["target"]]
    missed = "missed" in verdicts["floor"] + verdicts["target"]
    cells.append(why_missed(results, found, gap) if missed and usable else "")
    return cells, means


def extrapolation_section(results: Results, pair: str, docs: Path) -> list[str]:
    """The report's extrapolation section of a pair (none before a row of the table has a run), its figure drawn
    into `docs`."""
    runs = {name: found for name in RULED_ROWS if (found := results.runs_of(pair, name))}
    if not runs:
        return []
    gaps = coverage_gaps(results, runs)
    header = ["system", "seeds", "BLEU k=1", *(f"kept k={k}" for k in EXTRAPOLATION_K[1:])]
    header += ["ratio k=8", "ratio k=16", "sentence ends k=8", "BLEU k=8 (vs " + ", ".join(BEST_ROWS) + ")"]
    header += [f"kept k={k}, {CONFIDENCE:.0%} interval" for k in (8, 16)]
    header += ["floor", "target", "where it misses"]
    lines, curves = table_lines(header), {}
    for name, found in runs.items():
        cells, curves[name] = system_cells(results, pair, name, found, gaps.get(name))
        lines.append("| " + " | ".join(cells) + " |")
    figure = f"results_{pair}_extrapolation.png"
    plot_kept(curves, docs / figure, f"share of the ceiling BLEU kept, {pair}, mean over seeds")
    return [
        "### Extrapolation past the training length",
        "",
        "Every system here (the rows of the extrapolation and length-options tables) trained on the comparison "
        "protocol with half its training examples 2-4 joined pairs (at most the recipe's 128 tokens a side, about 4 "
        "test sentences) and a 512-position table, or decodes the models of such a row its own way (a decode-time "
        "option), and was measured with k = 1, 2, 4, 8, 16 consecutive test sentences joined into one input. Kept: "
        "the joined BLEU "
        "over the **ceiling**'s, the same model's k = 1 translations of the same sentences joined (mean over seeds; "
        "± their standard deviation); ratio: the hypothesis / reference length ratio; sentence ends: the share of "
        "the references' sentence ends the translations hold. The rule (docs/length.md): target: keep "
        f"≥ {TARGET[0].kept:.0%} at k = 8 with ratio in [{TARGET[0].ratio[0]}, {TARGET[0].ratio[1]}] and "
        f"≥ {TARGET[0].ends:.0%} of the sentence ends, ≥ {TARGET[1].kept:.0%} at k = 16 with ratio "
        f"≥ {TARGET[1].ratio[0]}, and non-inferior (margin {NON_INFERIORITY} BLEU) to `{REFERENCE_ROW}` at k = 1; "
        f"floor: ≥ {FLOOR[0].kept:.0%} at k = 8 with ratio ≥ {FLOOR[0].ratio[0]}, ≥ {FLOOR[1].kept:.0%} at k = 16 "
        f"with ratio ≥ {FLOOR[1].ratio[0]}. Each is tested on a seeds × groups bootstrap "
        f"({results.args.bootstrap_samples} samples; `study/extrapolation.py`): met where every {CONFIDENCE:.0%} "
        "interval lies inside its bound, missed where one lies wholly outside; a degenerate run (its output hardly "
        "depends on the source) is left out.",
        "",
        *lines,
        "",
        f"![extrapolation]({figure})",
        "",
        *stopping_lines(results, runs),
        *coverage_lines(results, runs, gaps),
    ]


def median_words(texts: list[str]) -> float:
    return statistics.median(len(text.split()) for text in texts)


def repeated_share(texts: list[str]) -> float:
    """The share of the sentences of the translations that repeat, word for word, an earlier sentence of the same
    translation: a decoder that has lost its place in a long input loops."""
    sentences = repeats = 0
    for text in texts:
        seen = set()
        for sentence in filter(None, SENTENCE_BREAK.split(text.strip())):
            sentences, repeats = sentences + 1, repeats + (sentence in seen)
            seen.add(sentence)
    return repeats / max(sentences, 1)


def stopping_lines(results: Results, runs: dict[str, list[Run]]) -> list[str]:
    """The paragraph and table of where the translations stop (module docstring): median words per joined input
    at k in STOPPING_K, every seed's translations pooled, the growth from k = TARGET_K to the longest k, and the
    repeated sentences there."""
    first = next(iter(runs.values()))[0]
    test = test_set(first.recipe, first.pair, results.args.test_limit)
    shortest, longest = STOPPING_K[0], STOPPING_K[-1]
    joined = {k: join_consecutive(test.source, test.target, k)[1] for k in STOPPING_K}
    references = {k: median_words(texts) for k, texts in joined.items()}
    header = ["system", *(f"median words k={k}" for k in STOPPING_K), f"growth k={TARGET_K} to {longest}"]
    header.append(f"repeated sentences k={longest}")
    lines = table_lines(header)
    growth = {"references": references[longest] - references[TARGET_K]}
    cells = [f"{references[k]:.0f}" for k in STOPPING_K]
    cells += [f"{growth['references']:+.0f}", f"{repeated_share(joined[longest]):.0%}"]
    lines.append(f"| references | {' | '.join(cells)} |")
    for name, found in runs.items():
        degenerate = " (degenerate)" if any(results.degenerate(run) for run in found) else ""
        translated = {k: [joined_translations(results, run, k) for run in found] for k in STOPPING_K}
        pooled = {k: sum(t, []) for k, t in translated.items() if None not in t}
        cells = [f"{median_words(pooled[k]):.0f}" if k in pooled else "cannot" for k in STOPPING_K]
        if TARGET_K in pooled and longest in pooled and not degenerate:  # garbage stops anywhere: no growth
            growth[name] = median_words(pooled[longest]) - median_words(pooled[TARGET_K])
        cells.append(f"{growth[name]:+.0f}" if name in growth else "–")
        cells.append(f"{repeated_share(pooled[longest]):.0%}" if longest in pooled else "–")
        lines.append(f"| `{name}`{degenerate} | {' | '.join(cells)} |")
    flat = sorted(
        f"`{name}` ({words:+.0f})"
        for name, words in growth.items()
        if name != "references" and words < growth["references"] / 4
    )
    return [
        "Where the translations stop: the median length in words of the translations of the joined inputs (every "
        "seed's pooled) against the references', and the share of the sentences of a translation that repeat an "
        f"earlier one of it word for word (a decoder that has lost its place loops). Inputs of {shortest} joined "
        f"sentences are the size of the longest training examples ({references[shortest]:.0f} words in the test "
        f"references). From k = {TARGET_K} to k = {longest} the references grow by {growth['references']:.0f} "
        "words; translations that grow by less than a quarter of that stop at a length learned in training, "
        "whatever the input: "
        f"{', '.join(flat) if flat else 'none'}.",
        "",
        *lines,
        "",
    ]


def content_words(text: str) -> Counter:
    return Counter(CONTENT_WORD.findall(text.lower()))


def coverage_by_place(sentences: list[str], translations: list[str], k: int) -> tuple[np.ndarray, np.ndarray]:
    """(found, total), each (k,): over the inputs of k joined sentences, the content words of the sentence at each
    place (clipped counts) that its input's translation holds, and how many it has; `sentences` are the test
    references in order, `translations` one per input."""
    found, total = np.zeros(k), np.zeros(k)
    for group, translation in enumerate(translations):
        held = content_words(translation)
        for place in range(k):
            words = content_words(sentences[group * k + place])
            found[place] += sum(min(count, held[word]) for word, count in words.items())
            total[place] += sum(words.values())
    return found, total


def coverage_of(results: Results, found: list[Run]) -> tuple[np.ndarray, float] | None:
    """(the share of each place's content words held, (TARGET_K,); chance) at k = TARGET_K, every seed's pooled;
    None for a system that kept no k = TARGET_K translation or has a degenerate run."""
    translated = [joined_translations(results, run, TARGET_K) for run in found]
    if None in translated or any(results.degenerate(run) for run in found):
        return None
    references = test_set(found[0].recipe, found[0].pair, results.args.test_limit).target
    held, chance = np.zeros((2, TARGET_K)), np.zeros((2, TARGET_K))
    for translations in translated:
        held += coverage_by_place(references, translations, TARGET_K)
        chance += coverage_by_place(references, translations[1:] + translations[:1], TARGET_K)
    return held[0] / held[1], chance[0].sum() / chance[1].sum()


def coverage_gaps(results: Results, runs: dict[str, list[Run]]) -> dict[str, int]:
    """End − middle coverage in percentage points (module docstring) of every system `coverage_of` measures."""
    gaps = {}
    for name, found in runs.items():
        if (coverage := coverage_of(results, found)) is not None:
            gaps[name] = round(100 * (coverage[0][END].mean() - coverage[0][MIDDLE].mean()))
    return gaps


def coverage_lines(results: Results, runs: dict[str, list[Run]], gaps: dict[str, int]) -> list[str]:
    """The paragraph and table of what the translations at k = TARGET_K leave out (module docstring)."""
    if not gaps:
        return []
    header = ["system", *(f"place {place}" for place in range(1, TARGET_K + 1)), "chance", "end − middle"]
    lines = table_lines(header)
    for name, gap in gaps.items():
        share, chance = coverage_of(results, runs[name])
        cells = [f"{value:.0%}" for value in share] + [f"{chance:.0%}", f"{gap:+d} points"]
        lines.append(f"| `{name}` | {' | '.join(cells)} |")
    end = ", ".join(f"`{name}` ({gap:+d})" for name, gap in gaps.items() if gap < 0) or "none"
    middle = ", ".join(f"`{name}` ({gap:+d})" for name, gap in gaps.items() if gap > 0) or "none"
    return [
        f"What the translations leave out at k = {TARGET_K}: for each place of the {TARGET_K} joined sentences, the "
        "share of that sentence's content words (four letters or more, clipped counts) held by its input's "
        "translation, every seed's pooled; chance: the same share in the translation of the next input; end − "
        "middle: the mean share of places 7-8 less that of places 3-6, in percentage points. Translations that hold "
        f"less of the end than of the middle: {end}; more of the end than of the middle: {middle}.",
        "",
        *lines,
        "",
    ]


def target_summary(results: Results, pair: str) -> str:
    """The README's sentence on the rule: which systems meet, miss or cannot yet be called on the target and the
    floor (empty before a row of the table has a run)."""
    calls: dict[str, dict[str, list[str]]] = {"target": {}, "floor": {}}
    for name in RULED_ROWS:
        runs = results.runs_of(pair, name)
        if runs and (verdicts := bar_verdicts(results, pair, name, runs)) is not None:
            for bar, by_verdict in calls.items():
                by_verdict.setdefault(verdicts[bar].strip("*"), []).append(f"`{name}`")
    if not calls["target"]:
        return ""
    text = {
        bar: "; ".join(f"{verdict}: {', '.join(names)}" for verdict, names in by_verdict.items())
        for bar, by_verdict in calls.items()
    }
    return (
        f" Translating {TARGET[0].k} and {TARGET[1].k} joined sentences against each model's own sentence-by-sentence "
        f"ceiling (target: keep ≥ {TARGET[0].kept:.0%} at k = {TARGET[0].k} with length ratio "
        f"{TARGET[0].ratio[0]}-{TARGET[0].ratio[1]}, ≥ {TARGET[1].kept:.0%} at k = {TARGET[1].k}): {text['target']}. "
        f"Floor (≥ {FLOOR[0].kept:.0%} and ≥ {FLOOR[1].kept:.0%}): {text['floor']}."
    )


ONE_PASS_PANEL = "one pass"  # the extrapolation table's encodings, each decoded as trained


def kept_panels(curves: dict[str, dict[int, float]]) -> dict[str, dict[str, dict[int, float]]]:
    """The curves by panel: the extrapolation table's encodings in one, then a panel per base encoding (in that
    table's order) with its one-pass curve and each length option on it, labelled by the option."""
    bases = [system.name for system in TABLES["extrapolation"][1:]]
    panels = {ONE_PASS_PANEL: {name: curves[name] for name in bases if name in curves}}
    for base in bases:
        options = {
            name.removeprefix(base): kept for name, kept in curves.items() if name.startswith(base + "+")
        }
        if options:
            panels[base] = ({ONE_PASS_PANEL: curves[base]} if base in curves else {}) | options
    return {title: panel for title, panel in panels.items() if panel}


def plot_kept(curves: dict[str, dict[int, float]], path: Path, title: str) -> None:
    """Kept share of the ceiling BLEU against k as a PNG: a panel of the encodings in one pass, then one per base
    encoding with its length options (`kept_panels`), the rule's target and floor as dashed ticks."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    panels = kept_panels(curves)
    columns = min(len(panels), 3)
    rows = math.ceil(len(panels) / columns)
    figure, axes = plt.subplots(
        rows, columns, figsize=(4.6 * columns, 3.9 * rows), sharey=True, squeeze=False
    )
    palette = plt.get_cmap("tab20").colors
    colours = palette[::2] + palette[1::2]  # ten distinct hues before their light shades
    for axis, (panel, lines) in zip(axes.flat, panels.items(), strict=False):  # more axes than panels
        for index, (name, kept) in enumerate(lines.items()):
            style = (
                {"color": "black", "linewidth": 2.2}
                if name == ONE_PASS_PANEL
                else {"color": colours[index % 20]}
            )
            axis.plot([1, *kept], [1.0, *kept.values()], marker="o", markersize=3, label=name, **style)
        for bounds, label in ((TARGET, "target"), (FLOOR, "floor")):
            for bound in bounds:
                axis.hlines(bound.kept, bound.k / 1.25, bound.k * 1.25, colors="grey", linestyles="--")
                axis.annotate(label, (bound.k * 1.27, bound.kept), fontsize=6, color="grey", va="center")
        axis.set_xscale("log", base=2)
        axis.set_xlim(0.85, 24)
        axis.set_xticks(list(EXTRAPOLATION_K), [str(k) for k in EXTRAPOLATION_K])
        axis.set_title(panel, fontsize=9)
        axis.legend(fontsize=6, loc="lower left")
    for axis in axes.flat[len(panels) :]:
        axis.set_visible(False)
    figure.supxlabel("test sentences joined into one input (k)", fontsize=9)
    figure.supylabel("share of the ceiling BLEU kept", fontsize=9)
    figure.suptitle(title)
    figure.tight_layout()
    figure.savefig(path, dpi=100)
    plt.close(figure)
