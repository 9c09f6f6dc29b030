"""`make compare`: every system of the comparison tables is a valid training command, runs are planned seed by
seed, a tiny real comparison writes the tracked results and the report (scores, significance, length
generalisation, claims, probe) and resumes, and verdicts need seed noise as well as significance."""

import gzip
import json
import logging
import shutil

import compare  # noqa: E402
import pytest

from hf_posenc.pipeline import arguments
from hf_posenc.pipeline.hardware import Hardware
from hf_posenc.pipeline.systems import paper_deviations

MACHINE = Hardware("cpu", "a test machine", "AVX2", 1, "2.13.0+cpu")
TINY_RUN = "--d_model 32 --layers 1 --heads 2 --ffn_dim 64 --vocab_size 300 --train_limit 600"


@pytest.mark.parametrize("system", sorted(compare.SYSTEMS))
def test_every_system_is_a_valid_training_command(system):
    """train.py accepts each run's arguments and builds the system's model."""
    run = compare.Run(compare.DEFAULT_RECIPE, "en-de", system, 1)
    args = compare.parse_args([])
    args.run_precision = "fp32"
    train_args = arguments.parse_args([*compare.train_arguments(run, args), "--output_dir", "unused"])
    config = arguments.model_config(train_args, 100, 0, 1)
    for field, value in compare.SYSTEMS[system].overrides.items():
        assert getattr(config, field) == value
    for field, value in compare.SYSTEMS[system].training.items():  # training options: train.py's data fields
        assert getattr(train_args.data, field) == value


def test_rows_name_where_the_model_departs_from_the_paper():
    def deviations(name):
        return paper_deviations(compare.row_config(compare.SYSTEMS[name], "multi30k-en-de-compare"))

    assert deviations("mpr_head@decoder") == [
        "decoder: d_r = 128 (paper: 256 at d_model 512; scaled to d_model 256, rounded down to a multiple of 4)"
    ]
    assert deviations("rpe_head")[0].startswith("encoder and decoder: d_r = 128 (paper: 320 at d_model 512")
    assert deviations("mpr_head-dr64") == deviations("sinusoidal") == []


def test_every_table_holds_the_baseline_and_claims_name_known_systems():
    for table, systems in compare.TABLES.items():
        assert compare.BASELINE in [s.name for s in systems], table
    for _paper, claim, system, reference, expected in compare.CLAIMS:
        assert system in compare.SYSTEMS and reference in compare.SYSTEMS, claim
        assert expected in ("<", ">", "≈", "≥", "≤")


def test_runs_are_planned_seed_by_seed_and_ablations_use_the_first_seeds():
    args = compare.parse_args(
        ["--tables", "main", "gating", "--seeds", "1", "2", "3", "--ablation_seeds", "2"]
    )
    runs = compare.planned_runs(args)
    seeds = [run.seed for run in runs]
    assert seeds == sorted(seeds)  # a cut-off command leaves whole seeds
    assert {run.system for run in runs if run.seed == 3} == {s.name for s in compare.TABLES["main"]}
    assert "rposnet-no-gating" in {run.system for run in runs if run.seed == 2}
    assert len(runs) == len(set(runs))  # systems in two tables are trained once


def test_unknown_system_or_recipe_lists_the_valid_ones(capsys):
    with pytest.raises(SystemExit):
        compare.parse_args(["--systems", "rotary"])
    assert "unknown systems ['rotary']; available: none, sinusoidal" in capsys.readouterr().err
    with pytest.raises(SystemExit):
        compare.parse_args(["--bootstrap_samples", "0"])
    assert "--bootstrap_samples=0 must be at least 1" in capsys.readouterr().err


def test_tiny_real_comparison_writes_results_and_report_and_resumes(tmp_path, caplog):
    readme = tmp_path / "README.md"
    readme.write_text((compare.REPO / "README.md").read_text())
    arguments = [
        "--recipe", "multi30k-en-de-tiny", "--systems", "sinusoidal", "none", "learned", "--tables", "main",
        "--seeds", "1", "--max_steps", "2", "--precision", "fp32", "--train_args", TINY_RUN, "--test_limit", "16",
        "--models_dir", str(tmp_path / "models"), "--results_dir", str(tmp_path / "results"),
        "--report", str(tmp_path / "docs" / "results.md"), "--probe_sentences", "4", "--bootstrap_samples", "50",
        "--length_k", "1", "2", "--readme", str(readme),
    ]  # fmt: skip
    compare.main(arguments)
    results = tmp_path / "results" / "multi30k-en-de-tiny" / "en-de" / "none" / "seed1"
    assert json.loads((results / "scores.json").read_text())["steps"] == 2
    assert {p.name for p in results.iterdir()} == {
        "scores.json", "test.hyp.de.gz", "word_order_probe.json", "length_generalisation.json", "settings.json"
    }  # fmt: skip
    assert [
        row["k"] for row in json.loads((results / "length_generalisation.json").read_text())["joined"]
    ] == [1, 2]
    page = (tmp_path / "docs" / "results.md").read_text()
    main_table = page.split("### Gating")[0].split("### Length generalisation")[0]
    rows = {
        line.split(" | ")[0].strip("| "): line for line in main_table.splitlines() if line.startswith("| ")
    }
    assert "not run" in rows["shaw"]
    # two updates: garbage output, named as such in the verdict column (not as a baseline or a tie)
    assert rows["sinusoidal"].endswith(
        "| degenerate: seed 1: BLEU 0.00 is below 1 with position encoding 'sinusoidal' |"
    )
    assert "p=" in rows["none"] and "not run" not in rows["none"]
    assert "### The papers' claims" in page and "| 1 | no PE ≪ SAPE | `none` vs `sinusoidal` |" in page
    assert "| 3 | the gains carry over to NIST Zh-En | | | the LDC/NIST corpora" in page  # and why not
    probe = json.loads((results / "word_order_probe.json").read_text())
    assert (
        probe["shuffle"]["equivariance_gap"] < 1e-5
    )  # no positions anywhere: Eq. 9 holds in the trained model
    none_bleu = json.loads((results / "scores.json").read_text())["bleu"]
    assert f"| none | 1 | {none_bleu:.2f} | 0.000 | 0.000 | " in page  # the probe table's row
    module_rows = {
        line.split(" | ")[0].strip("| `"): line.split(" | ") for line in readme.read_text().splitlines()
        if line.startswith("| `")
    }  # fmt: skip
    assert module_rows["none"][-2:] == [f"{none_bleu:.2f} (1 seed)", "not measured at k = 4 |"]
    assert module_rows["attention"][-2] == module_rows["sinusoidal"][-2] != "not run yet"
    assert module_rows["shaw"][-2:] == ["not run yet", "not run yet |"]
    summary = readme.read_text().split(compare.SUMMARY_START)[1].split(compare.SUMMARY_END)[0]
    assert (
        f"3 of {len(compare.TABLES['main'])} main-table systems measured (3 with 1 seed)" in summary
        and "`sinusoidal`" in summary
    )
    docs = tmp_path / "docs"
    assert (docs / "results_en-de_learned_positions.png").is_file() and (
        docs / "results_en-de_length.png"
    ).is_file()
    report = docs / "results.md"
    report.write_text(report.read_text() + "Reading of the numbers, by hand.\n")
    scores_written = (results / "scores.json").stat().st_mtime
    caplog.clear()
    caplog.set_level(logging.INFO, logger="compare")
    compare.main(arguments)
    assert (results / "scores.json").stat().st_mtime == scores_written
    assert "none seed 1 en-de: done before" in caplog.text
    assert report.read_text().endswith(compare.NOTES_MARKER + "\nReading of the numbers, by hand.\n")  # kept


def test_readme_length_cell_reads_k4_share_ratio_and_cannot(tmp_path):
    args = compare.parse_args(["--results_dir", str(tmp_path), "--seeds", "1", "2"])
    rows = {
        "sinusoidal": [{"k": 1, "bleu": 30.0, "cannot": None}, {"k": 4, "bleu": 12.0, "length_ratio": 0.61, "cannot": None}],
        "learned": [{"k": 1, "bleu": 28.0, "cannot": None}, {"k": 4, "bleu": None, "cannot": {"max_positions": 128}}],
        "sinusoidal+concat4": [{"k": 1, "bleu": 29.0, "cannot": None}, {"k": 4, "bleu": 29.0, "length_ratio": 1.0, "cannot": None}],
    }  # fmt: skip
    # sinusoidal's second seed keeps less at k = 4: the length cells are means over seeds with their spread
    second = {"sinusoidal": [{"k": 1, "bleu": 30.0, "cannot": None}, {"k": 4, "bleu": 9.0, "length_ratio": 0.51, "cannot": None}]}  # fmt: skip
    for system, first in rows.items():
        for seed, bleu in ((1, 30.0), (2, 31.0)):
            joined = second.get(system, first) if seed == 2 else first
            run = compare.Run(args.recipe, "en-de", system, seed)
            folder = run.folder(tmp_path)
            folder.mkdir(parents=True)
            machine = {"hardware": {**MACHINE.as_dict(), "line": "1 threads"}, "precision": "fp32"}
            (folder / "scores.json").write_text(json.dumps({"bleu": bleu, **machine}))
            (folder / "length_generalisation.json").write_text(json.dumps({"joined": joined}))
            # 120 distinct translations; learned's second seed repeats one sentence (a degenerate run)
            lines = (
                ["Ein Satz."] * 120
                if (system, seed) == ("learned", 2)
                else [f"Satz {i}." for i in range(120)]
            )
            (folder / "test.hyp.de.gz").write_bytes(gzip.compress("\n".join(lines).encode() + b"\n"))
            (folder / "settings.json").write_text(json.dumps(compare.run_settings(run, args)))
    stale = compare.Run(args.recipe, "en-de", "alibi", 1)  # a run of another protocol (another recipe)
    shutil.copytree(
        compare.Run(args.recipe, "en-de", "sinusoidal", 1).folder(tmp_path), stale.folder(tmp_path)
    )
    settings = {**compare.run_settings(stale, args), "recipe": {"warmup_steps": 1}}
    (stale.folder(tmp_path) / "settings.json").write_text(json.dumps(settings))
    chunk = compare.Report(
        compare.parse_args(["--results_dir", str(tmp_path), "--seeds", "2", "--tables", "main"])
    )
    assert chunk.module_cells("en-de", "sinusoidal")[0] == "30.50 ± 0.71 (2 seeds)"  # seed 1 is reported too
    report = compare.Report(args)
    assert report.module_cells("en-de", "alibi") == ("not run yet", "not run yet")
    assert report.current[stale] is False
    assert report.module_cells("en-de", "sinusoidal") == (
        "30.50 ± 0.71 (2 seeds)", "k = 4: 35 ± 7% of k = 1 BLEU, length ratio 0.56"
    )  # fmt: skip
    assert report.module_cells("en-de", "learned") == (
        "30.50 ± 0.71 (2 seeds, 1 degenerate)",
        "k = 4: cannot (>128 pos.)",
    )
    assert report.module_cells("en-de", "shaw") == ("not run yet", "not run yet")
    summary = report.summary("en-de")[0]  # a length-table row leads the length results, not the BLEU ones
    assert (
        f"2 of {len(compare.TABLES['main'])} main-table systems measured (2 with 2 seeds)" in summary
        and "best `sinusoidal` 30.50" in summary
    )
    assert (
        "kept: `sinusoidal+concat4` 100 ± 0% (length ratio 1.00), `sinusoidal` 35 ± 7% (length ratio 0.56)."
        in summary
    )
    # the machine line is rebuilt from the recorded fields (an older run's stored line may read differently)
    assert f"; {MACHINE.line()}, fp32 (6 runs))" in summary and ", 1 thread, " in summary
    assert report.comparison("en-de", "learned", "shaw", [])[-1] == "no shaw run of these seeds"


def test_report_covers_every_pair_with_runs_and_names_the_ablation_tables_not_run(tmp_path):
    """A chunk that trained another pair (an En-Fr main table beside the En-De tables) is reported with the
    `--pairs` of a later chunk; an ablation table whose own rows have no run of a pair is named, not drawn."""
    flags = ["--results_dir", str(tmp_path), "--seeds", "1"]
    args = compare.parse_args(flags)
    for pair, system in (("en-de", "sinusoidal"), ("en-de", "rposnet-no-gating"), ("en-fr", "sinusoidal"),
                         ("en-fr", "rposnet")):  # fmt: skip
        run = compare.Run(args.recipe, pair, system, 1)
        run.folder(tmp_path).mkdir(parents=True)
        scores = {"bleu": 30.0, "steps": 1600, "hardware": MACHINE.as_dict(), "precision": "bf16"}
        (run.folder(tmp_path) / "scores.json").write_text(json.dumps(scores))
        joined = [
            {"k": 1, "bleu": 30.0, "cannot": None},
            {"k": 4, "bleu": 6.0, "length_ratio": 0.5, "cannot": None},
        ]
        (run.folder(tmp_path) / "length_generalisation.json").write_text(json.dumps({"joined": joined}))
        hypotheses = "\n".join(f"Phrase {i}." for i in range(120)).encode()
        (run.folder(tmp_path) / f"test.hyp.{run.target_lang}.gz").write_bytes(gzip.compress(hypotheses))
        (run.folder(tmp_path) / "settings.json").write_text(json.dumps(compare.run_settings(run, args)))
    report = compare.Report(args)
    assert report.pairs == ["en-de", "en-fr"]
    assert report.shown_tables("en-de") == (
        ["main", "gating"],
        [t for t in compare.TABLES if t not in ("main", "gating")],
    )
    # rposnet is a main-table system: its En-Fr run does not draw the gating table
    assert report.shown_tables("en-fr") == (["main"], [t for t in compare.TABLES if t != "main"])
    assert report.machines().endswith("bf16 (4 runs)")  # the report's header: every pair
    assert report.machines(["en-fr"]).endswith("bf16 (2 runs)")  # a pair's summary: its own runs
    assert compare.Report(compare.parse_args([*flags, "--pairs", "en-fr"])).pairs == ["en-fr", "en-de"]
    readme = tmp_path / "README.md"
    readme.write_text((compare.REPO / "README.md").read_text())
    report.write_readme(readme, "en-de")
    summary = readme.read_text().split(compare.SUMMARY_START)[1].split(compare.SUMMARY_END)[0]
    assert [line.split(", test_2016_flickr")[0] for line in summary.strip().splitlines()] == [
        f"- Comparison of every module (`{args.recipe}`, {pair}" for pair in ("en-de", "en-fr")
    ]
    assert summary.count("(#positional-modules)") == 1  # the module table is the first pair's


def test_verdicts_need_seed_noise_as_well_as_significance():
    """A gap is better/worse only beyond two seed standard deviations and with every seed's bootstrap
    significant; with a single seed of system and baseline no seed noise is known, so no call is made."""
    verdict = compare.verdict
    significant, not_significant = {"bleu": {"significance": True}}, {"bleu": {"significance": False}}
    assert verdict(None, [5.0], [5.0], []) == "baseline"
    assert verdict(+3.0, [8.0, 8.2], [5.0, 5.2], [significant] * 2) == "better"
    assert verdict(-3.0, [2.0, 2.2], [5.0, 5.2], [significant] * 2) == "worse"
    assert verdict(+3.0, [8.0, 8.2], [2.0, 8.0], [significant] * 2) == "tie"  # within 2 sd of the baseline
    assert verdict(+3.0, [8.0, 8.2], [5.0, 5.2], [significant, not_significant]) == "tie"
    assert verdict(+4.8, [13.8], [9.0], [significant]) == "one seed"
    # one seed of the system: the baseline's noise alone decides, and the call says so
    assert verdict(-3.0, [2.0], [5.0, 5.2], [significant]) == "worse" + compare.PROVISIONAL
    assert verdict(+0.1, [5.2], [5.0, 5.2], [significant]) == "tie" + compare.PROVISIONAL


@pytest.mark.parametrize(
    "expected, measured, call",
    [("<", "worse", "reproduced"), ("<", "tie", "tie within noise"), ("<", "better", "not reproduced"),
     ("≈", "tie", "reproduced"), ("≈", "worse", "not reproduced"), ("≥", "tie", "reproduced"),
     ("≥", "better", "reproduced"), ("≤", "tie", "reproduced"), ("≤", "better", "not reproduced"),
     (">", "one seed", "one seed (no call)"),
     ("<", "worse" + compare.PROVISIONAL, "reproduced" + compare.PROVISIONAL),
     ("≈", "worse" + compare.PROVISIONAL, "not reproduced" + compare.PROVISIONAL)],
)  # fmt: skip
def test_claim_verdicts(expected, measured, call):
    assert compare.claim_verdict(expected, measured) == call


def test_runs_off_their_update_budget_or_trained_on_a_gpu_are_marked(tmp_path):
    args = compare.parse_args(["--results_dir", str(tmp_path), "--seeds", "1", "2"])
    gpu = Hardware("cuda", "a test GPU", "9.0", 1, "2.11.0+cu130")
    for seed, steps, machine in ((1, 1600, MACHINE), (2, 1601, gpu)):
        run = compare.Run(args.recipe, "en-de", "sinusoidal", seed)
        run.folder(tmp_path).mkdir(parents=True)
        scores = {
            "steps": steps,
            "hardware": machine.as_dict(),
            "averaged_checkpoints": ["checkpoint-1300", "checkpoint-1601"],
        }
        (run.folder(tmp_path) / "scores.json").write_text(json.dumps(scores))
        (run.folder(tmp_path) / "settings.json").write_text(json.dumps(compare.run_settings(run, args)))
    report, notes = compare.Report(args), {}
    assert [report.marks(run, notes) for run in report.runs_of("en-de", "sinusoidal")] == ["", "†‡"]
    assert notes == {
        "† 1601 updates against a budget of 1600, checkpoint-1300 to checkpoint-1601 averaged": ["`sinusoidal` seed 2"],
        f"‡ trained on {gpu.line()}": ["`sinusoidal` seed 2"],
    }  # fmt: skip
