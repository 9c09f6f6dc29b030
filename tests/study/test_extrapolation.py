"""The report's extrapolation section: shares of each run's ceiling kept at k = 2..16, the seeds × groups bootstrap
and the rule's two bars (target, floor), from runs written the way the study writes them."""

import gzip
import json

import numpy as np
import pytest

from hf_posenc.analysis.length_generalisation import join_consecutive
from hf_posenc.pipeline.training.hardware import Hardware
from study import cli, extrapolation, runs
from study.bootstrap import sentence_statistics
from study.results import Results

TEST_LIMIT = 32  # 4 groups of 8 sentences at k = 8, 2 inputs of 16 at k = 16


def report_args(root):
    return cli.parse_args(
        ["--results_dir", str(root), "--test_limit", str(TEST_LIMIT), "--bootstrap_samples", "200"]
    )


def write_run(root, args, system: str, seed: int, joined: dict[int, list[str]], ratio: dict[int, float]):
    """A finished run whose k = 1 translations are the references and whose k > 1 translations are `joined`."""
    run = runs.Run(args.recipe, "en-de", system, seed)
    folder = run.folder(root)
    folder.mkdir(parents=True)
    test = runs.test_set(args.recipe, "en-de", TEST_LIMIT)
    hardware = Hardware("cpu", "a test machine", "AVX2", 1, "2.13.0+cpu").as_dict()
    scores = {"bleu": 100.0, "chrf++": 100.0, "parameters": 1, "steps": 1600, "hardware": hardware}
    (folder / "scores.json").write_text(json.dumps({**scores, "test_pairs": TEST_LIMIT, "precision": "bf16"}))
    (folder / "test.hyp.de.gz").write_bytes(gzip.compress("".join(f"{t}\n" for t in test.target).encode()))
    rows = [{"k": 1, "bleu": 100.0, "length_ratio": 1.0, "cannot": None}]
    for k, hypotheses in joined.items():
        path = folder / runs.JOINED_TRANSLATIONS.format(k=k, lang="de")
        path.write_bytes(gzip.compress("".join(f"{h}\n" for h in hypotheses).encode()))
        ends = sum(h.count(".") for h in hypotheses)
        rows.append(
            {"k": k, "bleu": 100.0 * ratio[k], "length_ratio": ratio[k], "cannot": None}
            | {"hyp_sentence_ends": ends, "ref_sentence_ends": TEST_LIMIT}
        )
    (folder / "length_generalisation.json").write_text(json.dumps({"joined": rows, "buckets": []}))
    probe = {kind: {"equivariance_gap": 0.5, "bleu_vs_original": 20.0} for kind in ("shuffle", "local_swap")}
    (folder / "word_order_probe.json").write_text(json.dumps({"sentences": 3, **probe}))
    (folder / "settings.json").write_text(json.dumps(runs.run_settings(run, args)))
    return run


def joined_references(k: int) -> list[str]:
    test = runs.test_set(cli.COMPARISON_RECIPE, "en-de", TEST_LIMIT)
    return join_consecutive(test.source, test.target, k)[1]


def first_sentence_only(k: int) -> list[str]:
    """A model that stops after the first sentence of each joined input."""
    test = runs.test_set(cli.COMPARISON_RECIPE, "en-de", TEST_LIMIT)
    return test.target[::k][: TEST_LIMIT // k]


def first_half_only(k: int) -> list[str]:
    """A model that translates the first half of each joined input and drops the end."""
    test = runs.test_set(cli.COMPARISON_RECIPE, "en-de", TEST_LIMIT)
    return [" ".join(test.target[i : i + max(k // 2, 1)]) for i in range(0, TEST_LIMIT - k + 1, k)]


@pytest.mark.usefixtures("multi30k_dir")  # reads the shipped data
def test_a_perfect_extrapolator_meets_the_target_and_one_that_stops_early_misses_both_bars(tmp_path):
    args = report_args(tmp_path)
    perfect = {k: joined_references(k) for k in (2, 4, 8, 16)}
    early = {k: first_sentence_only(k) for k in (2, 4, 8, 16)}
    half = {k: first_half_only(k) for k in (2, 4, 8, 16)}
    for seed in (1, 2):
        write_run(tmp_path, args, "sinusoidal+concat4", seed, perfect, dict.fromkeys(perfect, 1.0))
        write_run(tmp_path, args, "alibi+concat4", seed, perfect, dict.fromkeys(perfect, 1.0))
        write_run(tmp_path, args, "rope+concat4", seed, early, {2: 0.5, 4: 0.25, 8: 0.12, 16: 0.06})
        write_run(tmp_path, args, "kerple+concat4", seed, half, dict.fromkeys(half, 0.5))
    write_run(tmp_path, args, "fire+concat4", 1, perfect, dict.fromkeys(perfect, 1.0))
    lines = extrapolation.extrapolation_section(Results(args), "en-de", tmp_path)
    rows = {}
    for line in lines:  # the first table's rows
        if line.startswith("| `"):
            rows.setdefault(line.split(" | ")[0].strip("| `"), line)
    assert set(rows) == {
        "sinusoidal+concat4",
        "alibi+concat4",
        "rope+concat4",
        "kerple+concat4",
        "fire+concat4",
    }
    assert (
        "| 100 ± 0% |" in rows["alibi+concat4"]
        and "[100%, 100%] | [100%, 100%] | **met** | **met** |" in (rows["alibi+concat4"])
    )
    assert (
        "| 100.0 (+0.0, +6" in rows["alibi+concat4"]
    )  # k = 8 BLEU against FIRE's (perfect) and KERPLE's (half)
    assert "**missed** | **missed** | stops early (ratio 0." in rows["rope+concat4"]
    assert "drops the end (end − middle" in rows["kerple+concat4"]
    assert "one seed (no call) | one seed (no call)" in rows["fire+concat4"]
    assert (tmp_path / "results_en-de_extrapolation.png").is_file()
    words = {k: extrapolation.median_words(joined_references(k)) for k in (4, 8, 16)}
    growth = words[16] - words[8]
    assert f"| references | {words[4]:.0f} | {words[8]:.0f} | {words[16]:.0f} | {growth:+.0f} | 0% |" in lines
    assert (
        f"| `alibi+concat4` | {words[4]:.0f} | {words[8]:.0f} | {words[16]:.0f} | {growth:+.0f} | 0% |"
        in lines
    )
    stops = [extrapolation.median_words(first_sentence_only(k)) for k in (8, 16)]
    assert f"whatever the input: `rope+concat4` ({stops[1] - stops[0]:+.0f})." in "\n".join(lines)
    coverage = next(line for line in lines if line.startswith("What the translations leave out"))
    assert "| `alibi+concat4` | 100% | 100% | 100% | 100% | 100% | 100% | 100% | 100% |" in "\n".join(lines)
    assert "| `rope+concat4` | 100% |" in "\n".join(lines)  # the first sentence of each input, whole
    assert "| `kerple+concat4` | 100% | 100% | 100% | 100% |" in "\n".join(lines)  # the first half, whole
    assert "less of the end than of the middle: `kerple+concat4` (" in coverage
    summary = extrapolation.target_summary(Results(args), "en-de")
    assert (
        "met: `sinusoidal+concat4`, `alibi+concat4`; missed: `rope+concat4`, `kerple+concat4`; one seed "
        in summary
    )


@pytest.mark.usefixtures("multi30k_dir")  # reads the shipped data
def test_the_ceiling_is_each_runs_own_joined_one_sentence_translations(tmp_path):
    """A run whose k = 1 translations are poor has a low ceiling: joined translations as good as its k = 1 ones keep
    all of it, although they keep little of the references' BLEU."""
    args = report_args(tmp_path)
    run = write_run(tmp_path, args, "alibi+concat4", 1, {8: first_half_only(8)}, {8: 0.5})
    test = runs.test_set(args.recipe, "en-de", TEST_LIMIT)
    own = [" ".join(test.target[i : i + 4]) if i % 8 == 0 else "" for i in range(TEST_LIMIT)]
    (run.folder(tmp_path) / "test.hyp.de.gz").write_bytes(
        gzip.compress("".join(f"{h}\n" for h in own).encode())
    )
    groups = extrapolation.groups(Results(args), run, 8)
    assert groups.kept() == pytest.approx(1.0) and groups.ratio() < 0.6
    assert groups.ends() == pytest.approx(0.5)


def test_coverage_by_place_counts_the_content_words_each_joined_sentence_keeps_in_its_translation():
    sentences = ["Ein Hund läuft.", "Eine Katze schläft.", "Zwei Vögel singen.", "Ein Mann liest."] * 2
    both_ends = ["Ein Hund läuft. Ein Mann liest.", "Ein Hund läuft. Ein Mann liest. Ein Mann liest."]
    found, total = extrapolation.coverage_by_place(sentences, both_ends, 4)
    assert total.tolist() == [4, 6, 6, 4]  # two inputs; "Ein" has three letters and is no content word
    assert found.tolist() == [
        4,
        0,
        0,
        4,
    ]  # "Mann liest" twice in a translation counts as often as the sentence has it


def test_repeated_share_counts_sentences_that_repeat_an_earlier_one_of_the_same_translation():
    looping = "Ein Hund läuft. Eine Frau sitzt. Ein Hund läuft. Ein Hund läuft."
    assert extrapolation.repeated_share([looping]) == 0.5
    assert extrapolation.repeated_share(["Ein Hund läuft.", "Ein Hund läuft! Ein Mann?"]) == 0.0
    assert extrapolation.repeated_share([""]) == 0.0


@pytest.mark.usefixtures("multi30k_dir")  # reads the shipped data
def test_no_section_before_a_row_has_a_run(tmp_path):
    args = report_args(tmp_path)
    write_run(tmp_path, args, "sinusoidal", 1, {}, {})
    assert extrapolation.extrapolation_section(Results(args), "en-de", tmp_path) == []
    assert extrapolation.target_summary(Results(args), "en-de") == ""


@pytest.mark.usefixtures("multi30k_dir")  # reads the shipped data
def test_the_bootstrap_draws_the_same_groups_for_every_seed_and_keeps_exact_shares():
    references = joined_references(8)
    ends = np.array([r.count(".") for r in references])
    exact = extrapolation.Groups(*(2 * [sentence_statistics(references, references)]), ends, ends)
    samples = extrapolation.bar_samples([exact, exact], samples=100)
    assert {name: values.shape for name, values in samples.items()} == dict.fromkeys(
        ("kept", "ratio", "ends"), (100,)
    )
    assert all(np.allclose(values, 1.0) for values in samples.values())
    early = first_sentence_only(8)
    halved = extrapolation.Groups(
        sentence_statistics(early, references), exact.ceiling, np.array([h.count(".") for h in early]), ends
    )
    samples = extrapolation.bar_samples([halved], samples=100)
    assert (samples["kept"] < 0.5).all() and (samples["ratio"] < 0.3).all() and (samples["ends"] < 0.2).all()


TARGET_AT_8 = extrapolation.TARGET[0]


@pytest.mark.parametrize(
    "kept, ratio, ends, call",
    [
        ((0.92, 0.97), (0.96, 1.04), (0.96, 1.0), "met"),
        ((0.85, 0.97), (0.96, 1.04), (0.96, 1.0), "undecided"),
        ((0.92, 0.97), (1.0, 1.08), (0.96, 1.0), "undecided"),
        ((0.92, 0.97), (1.06, 1.08), (0.96, 1.0), "missed"),
        ((0.5, 0.89), (0.96, 1.04), (0.96, 1.0), "missed"),
        ((0.92, 0.97), (0.96, 1.04), (0.7, 0.9), "missed"),
    ],
)
def test_a_bound_is_met_inside_its_limits_and_missed_wholly_outside_one(kept, ratio, ends, call):
    assert extrapolation.bound_call(TARGET_AT_8, {"kept": kept, "ratio": ratio, "ends": ends}) == call


@pytest.mark.parametrize(
    "calls, seeds, verdict",
    [
        (["met", "met", "met"], 2, "**met**"),
        (["met", "undecided", "met"], 3, "undecided (3 seeds)"),
        (["met", "undecided", "missed"], 2, "**missed**"),
        (["met", "met"], 1, "one seed (no call)"),
    ],
)
def test_a_bar_is_met_when_every_bound_is_and_missed_when_one_is(calls, seeds, verdict):
    assert extrapolation.combined_call(calls, seeds) == verdict


@pytest.mark.usefixtures("multi30k_dir")  # reads the shipped data
def test_degenerate_runs_are_left_out_of_the_target_test(tmp_path, monkeypatch):
    """A run whose output ignores its source measures nothing: with one of two seeds degenerate the row has one
    seed (no call); with both, the row says it cannot answer, in the table and in the README's summary, and is not
    named among the translations that stop at a learned length."""
    args = report_args(tmp_path)
    perfect = {k: joined_references(k) for k in (2, 4, 8, 16)}
    early = {k: first_sentence_only(k) for k in (2, 4, 8, 16)}
    for seed in (1, 2):
        write_run(tmp_path, args, "alibi+concat4", seed, perfect, dict.fromkeys(perfect, 1.0))
        write_run(tmp_path, args, "nope-decoder+concat4", seed, early, {2: 0.5, 4: 0.25, 8: 0.12, 16: 0.06})
    collapsed = {("alibi+concat4", 1), ("nope-decoder+concat4", 1), ("nope-decoder+concat4", 2)}
    monkeypatch.setattr(
        Results, "degenerate", lambda self, run: ["collapsed"] if (run.system, run.seed) in collapsed else []
    )
    lines = extrapolation.extrapolation_section(Results(args), "en-de", tmp_path)
    rows = {line.split(" | ")[0].strip("| `"): line for line in lines if line.startswith("| `")}
    assert "one seed (no call)" in rows["alibi+concat4` (degenerate: seed 1)"]
    nope = rows["nope-decoder+concat4` (degenerate: seed 1, seed 2)"]
    no_call = extrapolation.NO_USABLE_SEED
    assert nope.endswith(f"| – | – | {no_call} | {no_call} |  |")
    assert "whatever the input: none." in "\n".join(lines)  # garbage is not a decoder that stops early
    summary = extrapolation.target_summary(Results(args), "en-de")
    assert f"one seed (no call): `alibi+concat4`; {no_call}: `nope-decoder+concat4`." in summary


def test_the_figure_has_a_panel_of_the_encodings_and_one_per_base_with_its_options():
    curves = {
        name: {8: 0.5, 16: 0.25}
        for name in ("fire+concat4", "rope+concat4", "fire+concat4+windows4", "kerple+concat4+cross-window")
    }
    panels = extrapolation.kept_panels(curves)
    assert list(panels) == ["one pass", "fire+concat4", "kerple+concat4"]  # a panel per base with options
    assert list(panels["one pass"]) == ["rope+concat4", "fire+concat4"]  # the extrapolation table's order
    assert list(panels["fire+concat4"]) == ["one pass", "+windows4"]  # the base's own curve first
    assert list(panels["kerple+concat4"]) == ["+cross-window"]  # a base without runs: its options alone
