"""Extrapolation past the training length in the report: the extrapolation table's systems, trained on 2-4 joined
pairs (`tables.CONCAT4`), measured with k = 1..16 joined test sentences; how much of its k = 1 BLEU each keeps, its
length ratio, and a verdict on the target (keep ≥ `TARGET_KEPT` of the k = 1 BLEU at k = `TARGET_K`, twice the
longest joined training example, with length ratio ≥ `TARGET_RATIO`).

The verdict is a threshold test under the claims' rules (`claims.py`): a seeds × groups bootstrap as
`bootstrap.bootstrap_gaps` draws it. The k = 8 input g joins test sentences 8g .. 8g + 7, so the group g holds both
its joined translation and those 8 sentences' own (k = 1) translations; a sample draws the groups with replacement
(the same groups for every seed: the seeds translate the same inputs) and the seeds with replacement, and its kept
share is the mean over the drawn seeds of BLEU(k = 8) / BLEU(k = 1) on the drawn groups (the length ratio likewise).
The target is **met** where the lower bounds of the `CONFIDENCE` intervals of both are at or above their thresholds
(one-sided tests at α = 0.05), **missed** where an upper bound is below its threshold, and **undecided (n seeds)**
otherwise; one seed gets no call, as a claim does not. A degenerate run (`Results.degenerate`: its output hardly
depends on the source) is left out of the test, and a system whose every run is degenerate gets `NO_USABLE_SEED`.

Where the translations stop (`stopping_lines`): the median length in words of each system's translations of the
joined inputs at k = 4, 8 and 16, against the references'. A decoder that has learned when to stop from its
training lengths writes about as much for 16 joined sentences as for 8; one that extrapolates grows with the input,
and one that has lost its place in the input grows by repeating itself (the repeated sentences at k = 16).

What the translations leave out (`coverage_lines`): for each place i = 1..8 of the k = 8 inputs, the share of the
content words (`CONTENT_WORD`, clipped counts) of the i-th joined reference sentence that its input's translation
holds, against chance (the same share in the translation of the next input). A decoder that stops at a learned
length covers the first places and drops the last ones (the end holds less than the middle); one that covers both
ends drops the middle.
"""

import re
import statistics
from collections import Counter
from pathlib import Path

import numpy as np

from hf_posenc.analysis.length_generalisation import join_consecutive
from hf_posenc.pipeline.data.files import read_lines

from .bootstrap import bleu_of_statistics, percentile_interval, sentence_statistics
from .claims import CONFIDENCE
from .length import joined_at, kept_cell, kept_over_seeds
from .results import Results, table_lines
from .runs import JOINED_TRANSLATIONS, Run, test_set
from .tables import EXTRAPOLATION_K, TABLES

TARGET_K, TARGET_KEPT, TARGET_RATIO = 8, 0.7, 0.9
STOPPING_K = (4, 8, 16)  # 4: the size of the longest training examples; 8 and 16: twice and four times that
SENTENCE_BREAK = re.compile(r"(?<=[.!?])\s+")  # the space after a full stop, question or exclamation mark
# Words of four letters or more: mostly content words in German and French.
CONTENT_WORD = re.compile(r"\w{4,}")
NO_USABLE_SEED = "no call: every seed degenerate"  # the row cannot answer: its model ignores the source
MIDDLE, END = slice(2, TARGET_K - 2), slice(TARGET_K - 2, TARGET_K)  # places 3-6 and 7-8 of the k = 8 inputs


def joined_translations(results: Results, run: Run, k: int) -> list[str] | None:
    """The run's translations of the inputs of k joined test sentences; None where it kept none for k (a k it
    could not take)."""
    path = run.folder(results.root) / JOINED_TRANSLATIONS.format(k=k, lang=run.target_lang)
    return read_lines(path) if path.is_file() else None


def grouped_statistics(results: Results, run: Run, k: int) -> tuple[np.ndarray, np.ndarray] | None:
    """(groups, STATISTICS) twice: the k = 1 statistics of each group of k test sentences summed, and the statistics
    of the group's joined translation; None where the run kept no translation for k (a k it could not take)."""
    joined = joined_translations(results, run, k)
    if joined is None:
        return None
    test = test_set(run.recipe, run.pair, results.args.test_limit)
    _, references = join_consecutive(test.source, test.target, k)
    plain = results.statistics(run, test.target)[: len(references) * k]
    return plain.reshape(len(references), k, -1).sum(axis=1), sentence_statistics(joined, references)


def kept_samples(runs: list[tuple[np.ndarray, np.ndarray]], samples: int, seed: int = 0):
    """(kept shares, length ratios), each (samples,): the seeds × groups bootstrap of the module docstring over the
    `grouped_statistics` of a system's seeds. `seed` seeds the resampling, so a rebuilt report gives the same
    intervals."""
    rng = np.random.default_rng(seed)
    groups = len(runs[0][0])
    weights = rng.multinomial(groups, np.full(groups, 1.0 / groups), size=samples)  # (samples, groups)
    with np.errstate(divide="ignore", invalid="ignore"):  # a sample whose k = 1 BLEU is 0 keeps nan
        kept = np.stack(
            [bleu_of_statistics(weights @ j) / bleu_of_statistics(weights @ p) for p, j in runs], 1
        )
    ratio = np.stack([(weights @ j[:, 0]) / (weights @ j[:, 1]) for _, j in runs], axis=1)  # (samples, seeds)
    drawn = rng.integers(0, len(runs), size=kept.shape)  # (samples, seeds): the seeds of each sample

    def mean_of_drawn(values: np.ndarray) -> np.ndarray:
        return np.take_along_axis(values, drawn, axis=1).mean(axis=1)

    return mean_of_drawn(kept), mean_of_drawn(ratio)


def target_verdict(kept: tuple[float, float], ratio: tuple[float, float], seeds: int) -> str:
    """The target's verdict from the intervals of the kept share and the length ratio (module docstring)."""
    if seeds < 2:
        return "one seed (no call)"
    if kept[0] >= TARGET_KEPT and ratio[0] >= TARGET_RATIO:
        return "**met**"
    if kept[1] < TARGET_KEPT or ratio[1] < TARGET_RATIO:
        return "**missed**"
    return f"undecided ({seeds} seeds)"


def why_missed(row: dict) -> str:
    """What the k = TARGET_K scores say about a miss: a model that stops early writes fewer sentence ends than the
    references and a short translation; one that translates the whole input worse keeps its length."""
    ends = row["hyp_sentence_ends"] / max(row["ref_sentence_ends"], 1)
    if row["length_ratio"] < TARGET_RATIO:
        return f"stops early (length ratio {row['length_ratio']:.2f}, {ends:.0%} of the references' sentence ends)"
    return f"writes the whole length (ratio {row['length_ratio']:.2f}) with fewer correct n-grams"


def extrapolation_section(results: Results, pair: str, docs: Path) -> list[str]:
    """The report's extrapolation section of a pair (none before a row of the table has a run), its figure drawn
    into `docs`."""
    systems = [s.name for s in TABLES["extrapolation"][1:]]  # the rows, without the plain reference
    runs = {name: found for name in systems if (found := results.runs_of(pair, name))}
    if not runs:
        return []
    header = ["system", "seeds", "BLEU k=1"]
    header += [f"kept k={k}" for k in EXTRAPOLATION_K[1:]]
    header += [f"ratio k={k}" for k in EXTRAPOLATION_K[2:]]
    header += [f"kept k={TARGET_K}, {CONFIDENCE:.0%} interval", "target", "where it misses"]
    lines = table_lines(header)
    curves = {}
    for name, found in runs.items():
        measured = [results.read(run, "length_generalisation.json") for run in found]
        degenerate = [f"seed {run.seed}" for run in found if results.degenerate(run)]
        label = f"`{name}`" + (f" (degenerate: {', '.join(degenerate)})" if degenerate else "")
        cells = [label, str(len(found)), f"{statistics.mean(results.bleu(run) for run in found):.2f}"]
        shares = {}
        for k in EXTRAPOLATION_K[1:]:
            over_seeds = kept_over_seeds(measured, k)
            shares[k] = over_seeds
            cells.append("cannot" if over_seeds is None else kept_cell(over_seeds[0]))
        for k in EXTRAPOLATION_K[2:]:
            cells.append("–" if shares[k] is None else f"{shares[k][1]:.2f}")
        curves[name] = {k: statistics.mean(s[0]) for k, s in shares.items() if s is not None}
        cells += target_cells(results, found, measured)
        lines.append("| " + " | ".join(cells) + " |")
    figure = f"results_{pair}_extrapolation.png"
    plot_kept(curves, docs / figure, f"share of the k = 1 BLEU kept, {pair}, mean over seeds")
    return [
        "### Extrapolation past the training length",
        "",
        "Every system here trained on the comparison protocol with half its training examples 2-4 joined pairs "
        "(at most the recipe's 128 tokens a side, about 4 test sentences) and a 512-position table, and was "
        "measured with k = 1, 2, 4, 8, 16 consecutive test sentences joined into one input. Kept: the share of "
        "the k = 1 BLEU kept with k joined (mean over seeds; ± their standard deviation); ratio: the hypothesis / "
        f"reference length ratio there. Target: keep ≥ {TARGET_KEPT:.0%} at k = {TARGET_K} (twice the longest "
        f"training example) with ratio ≥ {TARGET_RATIO}, tested on a seeds × groups bootstrap "
        f"({results.args.bootstrap_samples} samples; `study/extrapolation.py`): met where both "
        f"{CONFIDENCE:.0%} intervals lie at or above the thresholds, missed where one lies below; a degenerate run "
        "(its output hardly depends on the source) is left out of the test.",
        "",
        *lines,
        "",
        f"![extrapolation]({figure})",
        "",
        *stopping_lines(results, runs),
        *coverage_lines(results, runs),
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


def coverage_lines(results: Results, runs: dict[str, list[Run]]) -> list[str]:
    """The paragraph and table of what the translations at k = TARGET_K leave out (module docstring), every
    seed's pooled; a system that kept no k = TARGET_K translation is left out."""
    first = next(iter(runs.values()))[0]
    references = test_set(first.recipe, first.pair, results.args.test_limit).target
    header = ["system", *(f"place {place}" for place in range(1, TARGET_K + 1)), "chance", "end − middle"]
    lines = table_lines(header)
    gaps = {}
    for name, found in runs.items():
        translated = [joined_translations(results, run, TARGET_K) for run in found]
        if None in translated or any(results.degenerate(run) for run in found):
            continue
        held, chance = np.zeros((2, TARGET_K)), np.zeros((2, TARGET_K))
        for translations in translated:
            held += coverage_by_place(references, translations, TARGET_K)
            chance += coverage_by_place(references, translations[1:] + translations[:1], TARGET_K)
        share, chance_share = held[0] / held[1], chance[0].sum() / chance[1].sum()
        gaps[name] = round(100 * (share[END].mean() - share[MIDDLE].mean()))
        cells = [f"{value:.0%}" for value in share] + [f"{chance_share:.0%}", f"{gaps[name]:+d} points"]
        lines.append(f"| `{name}` | {' | '.join(cells)} |")
    if not gaps:
        return []
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


def target_test(results: Results, runs: list[Run]) -> tuple[tuple[float, float] | None, str] | None:
    """(the kept share's interval at k = TARGET_K, the target's verdict) of one system's runs, its degenerate runs
    left out (their output does not depend on the source: their kept shares measure nothing); no interval where
    every run is degenerate; None where a run kept no translation for k = TARGET_K."""
    usable = [run for run in runs if not results.degenerate(run)]
    if not usable:
        return None, NO_USABLE_SEED
    grouped = [grouped_statistics(results, run, TARGET_K) for run in usable]
    if None in grouped:
        return None
    kept, ratio = kept_samples(grouped, results.args.bootstrap_samples)
    kept_interval = percentile_interval(kept, CONFIDENCE)
    return kept_interval, target_verdict(kept_interval, percentile_interval(ratio, CONFIDENCE), len(usable))


def target_cells(results: Results, runs: list[Run], measured: list[dict]) -> list[str]:
    """The interval, verdict and reason cells of one system at k = TARGET_K."""
    if (test := target_test(results, runs)) is None:
        return ["no translations kept", "", ""]
    interval, verdict = test
    if interval is None:
        return ["–", verdict, ""]
    low, high = interval
    rows = [
        joined_at(result, TARGET_K)
        for run, result in zip(runs, measured, strict=True)
        if not results.degenerate(run)
    ]
    mean_row = {
        key: statistics.mean(row[key] for row in rows)
        for key in ("length_ratio", "hyp_sentence_ends", "ref_sentence_ends")
    }
    reason = why_missed(mean_row) if verdict == "**missed**" else ""
    return [f"[{100 * low:.0f}%, {100 * high:.0f}%]", verdict, reason]


def target_summary(results: Results, pair: str) -> str:
    """The README's sentence on the extrapolation target: which systems meet it, miss it or cannot yet be called
    (empty before a row of the table has a run)."""
    verdicts: dict[str, list[str]] = {}
    for system in TABLES["extrapolation"][1:]:
        if (runs := results.runs_of(pair, system.name)) and (test := target_test(results, runs)):
            verdicts.setdefault(test[1].strip("*"), []).append(f"`{system.name}`")
    if not verdicts:
        return ""
    calls = "; ".join(f"{verdict}: {', '.join(names)}" for verdict, names in verdicts.items())
    return (
        f" Extrapolation to {TARGET_K} joined sentences (twice the longest training example; target: keep "
        f"≥ {TARGET_KEPT:.0%} of the 1-sentence BLEU with length ratio ≥ {TARGET_RATIO}): {calls}."
    )


def plot_kept(curves: dict[str, dict[int, float]], path: Path, title: str) -> None:
    """Kept share of the k = 1 BLEU against k, one line per system, as a PNG."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    figure, axis = plt.subplots(figsize=(7, 4.5))
    palette = plt.get_cmap("tab20").colors
    colours = palette[::2] + palette[1::2]  # ten distinct hues before their light shades
    for index, (name, kept) in enumerate(curves.items()):
        ks = [1, *kept]
        axis.plot(ks, [1.0, *kept.values()], marker="o", color=colours[index % 20], label=name)
    axis.axhline(TARGET_KEPT, color="grey", linewidth=0.8, linestyle="--")
    axis.axvline(TARGET_K, color="grey", linewidth=0.8, linestyle=":")
    axis.set_xscale("log", base=2)
    axis.set_xticks(list(EXTRAPOLATION_K), [str(k) for k in EXTRAPOLATION_K])
    axis.set_xlabel("test sentences joined into one input (k)")
    axis.set_ylabel("share of the k = 1 BLEU kept")
    axis.set_title(title)
    axis.legend(fontsize=7, ncol=2)
    figure.tight_layout()
    figure.savefig(path, dpi=110)
    plt.close(figure)
