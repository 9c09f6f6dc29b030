"""`make compare` (`python -m study`): runs are planned seed by seed, a tiny real comparison writes the tracked
results and the report (scores, significance, length generalisation, claims, probe, the k > 1 translations) and
resumes, verdicts need seed noise as well as significance, runs are marked by how they were made, and a results
folder or file the report cannot use is refused by name before anything is written."""

import gzip
import json
import logging
import shutil
import subprocess
import sys

import pytest

from hf_posenc.generation_length import sentence_end_token_ids
from hf_posenc.pipeline.data.files import data_root_hint
from hf_posenc.pipeline.evaluation.decoding import load_translation_model, translate
from hf_posenc.pipeline.training.hardware import Hardware
from study import claims, cli, readme, report, runs, tables
from study.results import check_results, precisions
from tests.helpers import REPO

TEST_PAIRS = 1000  # test_2016_flickr: the README's summary compares systems on it
MACHINE = Hardware("cpu", "a test machine", "AVX2", 1, "2.13.0+cpu")
TINY_RUN = "--d_model 32 --layers 1 --heads 2 --ffn_dim 64 --vocab_size 300 --train_limit 600"
TINY_COMPARISON = (
    "--recipe multi30k-en-de-tiny --systems sinusoidal none learned --tables main --seeds 1 --max_steps 2 "
    "--precision fp32 --test_limit 16 --probe_sentences 4 --bootstrap_samples 50 --length_k 1 2"
).split()


def scored(k: int, bleu: float, length_ratio: float | None = None) -> dict:
    """A length-generalisation row with k sentences joined that was scored."""
    row = {"k": k, "bleu": bleu, "cannot": None}
    return row if length_ratio is None else {**row, "length_ratio": length_ratio}


def write_hypotheses(run: runs.Run, root, lines: list[str]) -> None:
    path = run.folder(root) / f"test.hyp.{run.target_lang}.gz"
    path.write_bytes(gzip.compress("\n".join(lines).encode() + b"\n"))


def test_runs_are_planned_seed_by_seed_and_ablations_use_the_first_seeds():
    args = cli.parse_args(["--tables", "main", "gating", "--seeds", "1", "2", "3", "--ablation_seeds", "2"])
    planned = runs.planned_runs(args)
    seeds = [run.seed for run in planned]
    assert seeds == sorted(seeds)  # a cut-off command leaves whole seeds
    assert {run.system for run in planned if run.seed == 3} == {s.name for s in tables.TABLES["main"]}
    assert "rposnet-no-gating" in {run.system for run in planned if run.seed == 2}
    assert len(planned) == len(set(planned))  # systems in two tables are trained once


def test_unknown_system_or_recipe_lists_the_valid_ones(capsys):
    with pytest.raises(SystemExit):
        cli.parse_args(["--systems", "rotary"])
    assert "unknown systems ['rotary']; available: none, sinusoidal" in capsys.readouterr().err
    with pytest.raises(SystemExit):
        cli.parse_args(["--bootstrap_samples", "0"])
    assert "--bootstrap_samples=0 must be at least 1" in capsys.readouterr().err


@pytest.mark.usefixtures("multi30k_dir")  # reads the shipped data
def test_tiny_real_comparison_writes_results_and_report_and_resumes(tmp_path, caplog):
    readme_path = tmp_path / "README.md"
    readme_path.write_text((REPO / "README.md").read_text())
    folders = [
        *("--models_dir", str(tmp_path / "models"), "--results_dir", str(tmp_path / "results")),
        *("--report", str(tmp_path / "docs" / "results.md"), "--readme", str(readme_path)),
    ]
    flags = [*TINY_COMPARISON, "--train_args", TINY_RUN, *folders]
    cli.main(flags)
    results = tmp_path / "results" / "multi30k-en-de-tiny" / "en-de" / "none" / "seed1"
    assert json.loads((results / "scores.json").read_text())["steps"] == 2
    assert {p.name for p in results.iterdir()} == {
        "scores.json",
        "test.hyp.de.gz",
        "length.hyp.k2.de.gz",
        "word_order_probe.json",
        "length_generalisation.json",
        "settings.json",
    }
    length = json.loads((results / "length_generalisation.json").read_text())
    assert [row["k"] for row in length["joined"]] == [1, 2]
    # the k = 2 translations are kept: one line per pair of the 16 test sentences
    assert len(gzip.decompress((results / "length.hyp.k2.de.gz").read_bytes()).decode().splitlines()) == 8
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
    assert "### The papers' claims" in page
    assert "| 1 | no PE ≪ SAPE | superiority | `none` vs `sinusoidal` | 1 |" in page  # one seed: no call
    assert (
        "| 3 | the gains carry over to NIST Zh-En | | | | | | | the LDC/NIST corpora" in page
    )  # and why not
    assert (
        '"we conduct experiments on Transformer without any positional encodings' in page
    )  # the paper's words
    probe = json.loads((results / "word_order_probe.json").read_text())
    # no positions anywhere: Eq. 9 holds in the trained model
    assert probe["shuffle"]["equivariance_gap"] < 1e-5
    none_bleu = json.loads((results / "scores.json").read_text())["bleu"]
    assert f"| none | 1 | {none_bleu:.2f} | 0.000 | 0.000 | " in page  # the probe table's row
    module_rows = {
        line.split(" | ")[0].strip("| `"): line.split(" | ")
        for line in readme_path.read_text().splitlines()
        if line.startswith("| `")
    }
    assert module_rows["none"][-2:] == [f"{none_bleu:.2f} (1 seed)", "not measured at k = 4 |"]
    assert module_rows["attention"][-2] == module_rows["sinusoidal"][-2] != "not run yet"
    assert module_rows["shaw"][-2:] == ["not run yet", "not run yet |"]
    summary = readme_path.read_text().split(readme.SUMMARY_START)[1].split(readme.SUMMARY_END)[0]
    assert (
        f"3 of {len(tables.TABLES['main'])} main-table systems measured (3 with 1 seed)" in summary
        and "`sinusoidal`" in summary
    )
    docs = tmp_path / "docs"
    assert (docs / "results_en-de_learned_positions.png").is_file()
    assert (docs / "results_en-de_length.png").is_file()
    page_path = docs / "results.md"
    page_path.write_text(page_path.read_text() + "Reading of the numbers, by hand.\n")
    scores_written = (results / "scores.json").stat().st_mtime
    caplog.clear()
    caplog.set_level(logging.INFO, logger="study")
    cli.main(flags)
    assert (results / "scores.json").stat().st_mtime == scores_written
    assert "none seed 1 en-de: done before" in caplog.text
    # the hand-written notes are kept
    assert page_path.read_text().endswith(report.NOTES_MARKER + "\nReading of the numbers, by hand.\n")


@pytest.mark.usefixtures("multi30k_dir")  # reads the shipped data
def test_readme_length_cell_reads_k4_share_ratio_and_cannot(tmp_path):
    args = cli.parse_args(["--results_dir", str(tmp_path), "--seeds", "1", "2", "--bootstrap_samples", "50"])
    rows = {
        "sinusoidal": [scored(1, 30.0), scored(4, 12.0, 0.61)],
        "learned": [scored(1, 28.0), {"k": 4, "bleu": None, "cannot": {"max_positions": 128}}],
        "sinusoidal+concat4": [scored(1, 29.0), scored(4, 29.0, 1.0)],
    }
    # sinusoidal's second seed keeps less at k = 4: the length cells are means over seeds with their spread
    second = {"sinusoidal": [scored(1, 30.0), scored(4, 9.0, 0.51)]}
    for system, first in rows.items():
        for seed, bleu in ((1, 30.0), (2, 31.0)):
            joined = second.get(system, first) if seed == 2 else first
            run = runs.Run(args.recipe, "en-de", system, seed)
            folder = run.folder(tmp_path)
            folder.mkdir(parents=True)
            machine = {"hardware": {**MACHINE.as_dict(), "line": "1 threads"}, "precision": "fp32"}
            (folder / "scores.json").write_text(json.dumps({"bleu": bleu, **machine}))
            (folder / "length_generalisation.json").write_text(json.dumps({"joined": joined}))
            # a translation of each test sentence, all distinct; learned's second seed repeats one sentence (a
            # degenerate run)
            degenerate = (system, seed) == ("learned", 2)
            write_hypotheses(
                run,
                tmp_path,
                ["Ein Satz."] * TEST_PAIRS if degenerate else [f"Satz {i}." for i in range(TEST_PAIRS)],
            )
            (folder / "settings.json").write_text(json.dumps(runs.run_settings(run, args)))
    stale = runs.Run(args.recipe, "en-de", "alibi", 1)  # a run of another protocol (another recipe)
    shutil.copytree(runs.Run(args.recipe, "en-de", "sinusoidal", 1).folder(tmp_path), stale.folder(tmp_path))
    settings = {**runs.run_settings(stale, args), "recipe": {"warmup_steps": 1}}
    (stale.folder(tmp_path) / "settings.json").write_text(json.dumps(settings))
    chunk = report.Report(
        cli.parse_args(["--results_dir", str(tmp_path), "--seeds", "2", "--tables", "main"])
    )
    # seed 1 is reported too
    assert readme.module_cells(chunk, "en-de", "sinusoidal")[0] == "30.50 ± 0.71 (2 seeds)"
    results = report.Report(args)
    assert readme.module_cells(results, "en-de", "alibi") == ("not run yet", "not run yet")
    assert results.current[stale] is False
    assert readme.module_cells(results, "en-de", "sinusoidal") == (
        "30.50 ± 0.71 (2 seeds)",
        "k = 4: 35 ± 7% of k = 1 BLEU, length ratio 0.56",
    )
    assert readme.module_cells(results, "en-de", "learned") == (
        "30.50 ± 0.71 (2 seeds, 1 degenerate)",
        "k = 4: cannot (>128 pos.)",
    )
    assert readme.module_cells(results, "en-de", "shaw") == ("not run yet", "not run yet")
    # a length-table row leads the length results, not the BLEU ones
    summary = readme.summary(results, "en-de")[0]
    assert (
        f"2 of {len(tables.TABLES['main'])} main-table systems measured (2 with 2 seeds)" in summary
        and "best `sinusoidal` 30.50" in summary
    )
    assert (
        "kept: `sinusoidal+concat4` 100 ± 0% (length ratio 1.00), `sinusoidal` 35 ± 7% (length ratio 0.56)."
        in summary
    )
    # the machine line is rebuilt from the recorded fields (an older run's stored line may read differently)
    assert (
        f"; {MACHINE.line()}, trained in fp32, decoded in fp32 (6 runs))" in summary
        and ", 1 thread, " in summary
    )
    assert results.comparison("en-de", "learned", "shaw", [])[-1] == "no shaw run of these seeds"


@pytest.mark.usefixtures("multi30k_dir")  # reads the shipped data
def test_report_covers_every_pair_with_runs_and_names_the_ablation_tables_not_run(tmp_path):
    """A chunk that trained another pair (an En-Fr main table beside the En-De tables) is reported with the
    `--pairs` of a later chunk; an ablation table whose own rows have no run of a pair is named, not drawn."""
    flags = ["--results_dir", str(tmp_path), "--seeds", "1", "--bootstrap_samples", "50"]
    args = cli.parse_args(flags)
    finished = [
        ("en-de", "sinusoidal"),
        ("en-de", "rposnet-no-gating"),
        ("en-fr", "sinusoidal"),
        ("en-fr", "rposnet"),
    ]
    for pair, system in finished:
        run = runs.Run(args.recipe, pair, system, 1)
        run.folder(tmp_path).mkdir(parents=True)
        scores = {"bleu": 30.0, "steps": 1600, "hardware": MACHINE.as_dict(), "precision": "bf16"}
        (run.folder(tmp_path) / "scores.json").write_text(json.dumps(scores))
        joined = [scored(1, 30.0), scored(4, 6.0, 0.5)]
        (run.folder(tmp_path) / "length_generalisation.json").write_text(json.dumps({"joined": joined}))
        write_hypotheses(run, tmp_path, [f"Phrase {i}." for i in range(TEST_PAIRS)])
        (run.folder(tmp_path) / "settings.json").write_text(json.dumps(runs.run_settings(run, args)))
    results = report.Report(args)
    assert results.pairs == ["en-de", "en-fr"]
    assert results.shown_tables("en-de") == (
        ["main", "gating"],
        [t for t in tables.TABLES if t not in ("main", "gating")],
    )
    # rposnet is a main-table system: its En-Fr run does not draw the gating table
    assert results.shown_tables("en-fr") == (["main"], [t for t in tables.TABLES if t != "main"])
    # the report's header (every pair) and a pair's summary (its own runs); recorded without a training autocast,
    # the runs trained in fp32
    assert results.machines().endswith("trained in fp32, decoded in bf16 (4 runs)")
    assert results.machines(["en-fr"]).endswith("trained in fp32, decoded in bf16 (2 runs)")
    assert report.Report(cli.parse_args([*flags, "--pairs", "en-fr"])).pairs == ["en-fr", "en-de"]
    readme_path = tmp_path / "README.md"
    readme_path.write_text((REPO / "README.md").read_text())
    readme.write_readme(results, readme_path, "en-de")
    summary = readme_path.read_text().split(readme.SUMMARY_START)[1].split(readme.SUMMARY_END)[0]
    assert [line.split(", test_2016_flickr")[0] for line in summary.strip().splitlines()] == [
        f"- Comparison of every module (`{args.recipe}`, {pair}" for pair in ("en-de", "en-fr")
    ]
    assert summary.count("(#positional-modules)") == 1  # the module table is the first pair's


def test_verdicts_need_seed_noise_as_well_as_significance():
    """A gap is better/worse only beyond two seed standard deviations and with every seed's bootstrap
    significant; with a single seed of system and baseline no seed noise is known, so no call is made."""
    verdict = claims.verdict
    significant, not_significant = {"bleu": {"significance": True}}, {"bleu": {"significance": False}}
    assert verdict(None, [5.0], [5.0], []) == "baseline"
    assert verdict(+3.0, [8.0, 8.2], [5.0, 5.2], [significant] * 2) == "better"
    assert verdict(-3.0, [2.0, 2.2], [5.0, 5.2], [significant] * 2) == "worse"
    assert verdict(+3.0, [8.0, 8.2], [2.0, 8.0], [significant] * 2) == "tie"  # within 2 sd of the baseline
    assert verdict(+3.0, [8.0, 8.2], [5.0, 5.2], [significant, not_significant]) == "tie"
    assert verdict(+4.8, [13.8], [9.0], [significant]) == "one seed"
    # one seed of the system: the baseline's noise alone decides, and the call says so
    assert verdict(-3.0, [2.0], [5.0, 5.2], [significant]) == "worse" + claims.PROVISIONAL
    assert verdict(+0.1, [5.2], [5.0, 5.2], [significant]) == "tie" + claims.PROVISIONAL


def test_runs_are_marked_by_how_they_were_made(tmp_path):
    """† off the update budget, ʳ resumed from a checkpoint, ‡ on a GPU, ᵏ an attention kernel other than its
    device's usual one, ᵗ a thread count other than most runs'; the footnotes name the runs."""
    args = cli.parse_args(["--results_dir", str(tmp_path), "--seeds", "1", "2", "3", "4"])
    gpu, two_threads = (
        Hardware("cuda", "a test GPU", "9.0", 1, "2.11.0+cu130"),
        Hardware("cpu", "cpu", "AVX2", 2, "2"),
    )
    made = [  # seed: (steps, machine, kernel, resumed from, updates of the last attempt)
        (1600, MACHINE, "eager", None, 1600),
        (1601, gpu, "eager", "checkpoint-1600", 1),
        (1600, gpu, "sdpa", "checkpoint-700", 900),
        (1600, two_threads, None, None, 1600),
    ]
    for seed, (steps, machine, kernel, resumed, updates) in enumerate(made, 1):
        for system in ("sinusoidal", "learned"):  # learned's GPU run sets the GPU's usual kernel: SDPA
            run = runs.Run(args.recipe, "en-de", system, seed)
            run.folder(tmp_path).mkdir(parents=True)
            scores = {
                "steps": steps,
                "hardware": machine.as_dict(),
                "averaged_checkpoints": ["checkpoint-1300", "checkpoint-1601"],
                "attention_backend": "sdpa" if system == "learned" and machine is gpu else kernel,
                "resumed_from": resumed,
                "updates_this_attempt": updates,
            }
            (run.folder(tmp_path) / "scores.json").write_text(json.dumps(scores))
            (run.folder(tmp_path) / "settings.json").write_text(json.dumps(runs.run_settings(run, args)))
    results, notes = report.Report(args), {}
    marks = [results.marks(run, notes) for run in results.runs_of("en-de", "sinusoidal")]
    assert marks == ["", "†ʳ‡ᵏ", "ʳ‡", "ᵗ"]
    off_budget = "† 1601 updates against a budget of 1600, checkpoint-1300 to checkpoint-1601 averaged"
    resumed = "ʳ resumed from a checkpoint after an interruption (the checkpoint; updates of the attempt that finished)"
    assert notes == {
        off_budget: ["`sinusoidal` seed 2"],
        resumed: [
            "`sinusoidal` seed 2 (checkpoint-1600; 1 update)",
            "`sinusoidal` seed 3 (checkpoint-700; 900 updates)",
        ],
        f"‡ trained on {gpu.line()}": ["`sinusoidal` seed 2", "`sinusoidal` seed 3"],
        "ᵏ eager attention on a GPU, where most GPU runs used SDPA": ["`sinusoidal` seed 2"],
        "ᵗ 2 threads, where most runs used 1": ["`sinusoidal` seed 4"],
    }
    assert results.kernels() == "eager (3 runs), SDPA (3 runs), not recorded (2 runs)"


def test_a_recipe_that_starts_naming_a_default_keeps_its_finished_runs(tmp_path):
    """A field set to train.py's own default changes no run (the compare recipe's `schedule: fixed`); any other
    change of the recipe makes a finished run one of another protocol."""
    args = cli.parse_args(["--results_dir", str(tmp_path)])
    run = runs.Run(args.recipe, "en-de", "sinusoidal", 1)
    run.folder(tmp_path).mkdir(parents=True)
    settings = runs.run_settings(run, args)
    assert settings["recipe"]["schedule"] == "fixed"
    recorded = {**settings, "recipe": {k: v for k, v in settings["recipe"].items() if k != "schedule"}}
    (run.folder(tmp_path) / "settings.json").write_text(json.dumps(recorded))
    assert runs.done(run, args)
    recorded["recipe"]["warmup_steps"] = 150
    (run.folder(tmp_path) / "settings.json").write_text(json.dumps(recorded))
    assert not runs.done(run, args)


def test_runs_recorded_before_the_recipe_named_fp32_are_finished_and_a_bf16_run_is_not(tmp_path):
    """The comparison trains in fp32, as every recorded run did (train.py did not apply the bf16 it recorded
    until 2026-11-27): a run whose recorded recipe names no precision is finished, one trained in bf16 is not."""
    args = cli.parse_args(["--results_dir", str(tmp_path)])
    run = runs.Run(args.recipe, "en-de", "sinusoidal", 1)
    run.folder(tmp_path).mkdir(parents=True)
    settings = runs.run_settings(run, args)
    assert settings["recipe"]["precision"] == "fp32"
    for precision, finished in ((None, True), ("fp32", True), ("bf16", False), ("auto", False)):
        recipe = {k: v for k, v in settings["recipe"].items() if k != "precision"}
        recipe.update({"precision": precision} if precision else {})
        (run.folder(tmp_path) / "settings.json").write_text(json.dumps({**settings, "recipe": recipe}))
        assert runs.done(run, args) is finished, precision


def test_a_run_saved_under_a_renamed_fields_old_name_is_still_finished(tmp_path):
    """The no-gating rows now name `position_attention_gating`; their runs recorded `posnet_gating`, the field's
    old name, and are still recognised as finished with the same settings (and not with another value)."""
    args = cli.parse_args(["--results_dir", str(tmp_path)])
    run = runs.Run(args.recipe, "en-de", "rposnet-no-gating", 1)
    run.folder(tmp_path).mkdir(parents=True)
    settings = runs.run_settings(run, args)
    arguments = settings["train_arguments"]
    overrides = arguments.index("--config_overrides") + 1
    assert json.loads(arguments[overrides])["position_attention_gating"] is False
    for gating, finished in ((False, True), (True, False)):
        old = json.loads(arguments[overrides].replace("position_attention_gating", "posnet_gating"))
        old["posnet_gating"] = gating
        recorded = [*arguments[:overrides], json.dumps(old), *arguments[overrides + 1 :]]
        (run.folder(tmp_path) / "settings.json").write_text(
            json.dumps({**settings, "train_arguments": recorded})
        )
        assert runs.done(run, args) is finished


# ------------------------------------------------------------------------------------------------------------
# What the report refuses before it writes anything


def finished_run(root, args, system="sinusoidal", seed=1) -> runs.Run:
    """A finished run of the report's settings whose every file holds what the report reads."""
    run = runs.Run(args.recipe, "en-de", system, seed)
    folder = run.folder(root)
    folder.mkdir(parents=True)
    scores = {
        "bleu": 30.0,
        "chrf++": 55.0,
        "parameters": 7577600,
        "steps": 1600,
        "test_pairs": 3,
        "hardware": MACHINE.as_dict(),
        "precision": "bf16",
    }
    (folder / "scores.json").write_text(json.dumps(scores))
    rows = [{**scored(k, 30.0 / k, 1.0), "inputs": 3} for k in (1, 2)]
    buckets = [{"bucket": "1-10", **scored(1, 30.0, 1.0), "inputs": 3}]
    (folder / "length_generalisation.json").write_text(json.dumps({"joined": rows, "buckets": buckets}))
    probe = {kind: {"equivariance_gap": 0.5, "bleu_vs_original": 20.0} for kind in ("shuffle", "local_swap")}
    (folder / "word_order_probe.json").write_text(json.dumps({"sentences": 3, **probe}))
    write_hypotheses(run, root, ["Ein Satz.", "Zwei Sätze.", "Drei."])
    (folder / "settings.json").write_text(json.dumps(runs.run_settings(run, args)))
    return run


@pytest.fixture
def untouched(tmp_path):
    """(flags naming a report and a README in tmp_path, a check that neither was written)."""
    page, readme_path = tmp_path / "docs" / "results.md", tmp_path / "README.md"
    readme_path.write_text((REPO / "README.md").read_text())
    before = readme_path.read_text()

    def check():
        assert not page.exists() and readme_path.read_text() == before

    return ["--report", str(page), "--readme", str(readme_path)], check


@pytest.mark.parametrize(
    "folder, words",
    [
        ("typo", "typo does not exist: there is nothing to report"),
        ("empty", "holds no finished run of recipe multi30k-en-de-compare"),
        ("other_protocol", "none of the 1 finished runs under"),
    ],
)
def test_report_only_refuses_a_results_dir_without_its_runs(tmp_path, untouched, folder, words):
    """Before: `--report_only --results_dir <typo>` rewrote every table and the README's results to "not run"."""
    flags, check = untouched
    root = tmp_path / folder
    if folder != "typo":
        root.mkdir()
    if folder == "other_protocol":
        run = finished_run(root, cli.parse_args(["--results_dir", str(root)]))
        settings = json.loads((run.folder(root) / "settings.json").read_text())
        settings["length_k"] = [1, 2, 3]
        (run.folder(root) / "settings.json").write_text(json.dumps(settings))
    with pytest.raises(ValueError, match="nothing to report") as refused:
        cli.main(["--report_only", "--results_dir", str(root), *flags])
    assert words in str(refused.value) and str(root) in str(refused.value)
    check()


def test_the_study_command_with_a_mistyped_results_dir_exits_2_with_one_line(tmp_path, untouched):
    flags, check = untouched
    typo = tmp_path / "resluts"
    command = [sys.executable, "-m", "study", "--report_only", "--results_dir", str(typo)]
    completed = subprocess.run([*command, *flags], capture_output=True, text=True, timeout=300, cwd=REPO)
    assert completed.returncode == 2
    assert f"python -m study: error: --results_dir {typo} does not exist" in completed.stderr
    assert "Traceback" not in completed.stderr
    check()


def corrupt_gzip(path):
    path.write_bytes(path.read_bytes()[:-12])


@pytest.mark.parametrize(
    "name, damage, words",
    [
        ("scores.json", lambda path: path.write_text('{"bleu": 30.0,'), "scores.json: not JSON"),
        ("scores.json", lambda path: path.write_text("[30.0]"), "the file is [30.0], must be an object"),
        ("scores.json", {"bleu": "30.0"}, "scores.json: 'bleu' is \"30.0\", must be a number"),
        ("scores.json", {"chrf++": None}, "'chrf++' is null, must be a number"),
        ("scores.json", {"hardware": {"device": "cpu"}}, "scores.json: hardware 'name' is missing"),
        ("scores.json", {"test_pairs": 1000}, "3 translations, but scores.json has 1000 test pairs"),
        ("length_generalisation.json", {"buckets": None}, "'buckets' is null, must be a list"),
        (
            "length_generalisation.json",
            {"joined": [{"k": "1"}]},
            "joined[0] 'k' is \"1\", must be a whole number",
        ),
        (
            "word_order_probe.json",
            {"local_swap": {"equivariance_gap": 0.1}},
            "local_swap 'bleu_vs_original' is missing",
        ),
        (
            "settings.json",
            {"recipe": "multi30k-en-de-compare"},
            "'recipe' is \"multi30k-en-de-compare\", must be an object",
        ),
        ("test.hyp.de.gz", corrupt_gzip, "test.hyp.de.gz: unreadable"),
        ("test.hyp.de.gz", lambda path: path.unlink(), "test.hyp.de.gz: missing"),
    ],
)
def test_a_damaged_results_file_is_named_before_anything_is_written(tmp_path, untouched, name, damage, words):
    """Before: a corrupt scores.json gave no file name, or a TypeError minutes into the report. Every results file is
    checked up front; the error names the file and what is wrong."""
    flags, check = untouched
    root = tmp_path / "results"
    args = cli.parse_args(["--results_dir", str(root)])
    run = finished_run(root, args)
    path = run.folder(root) / name
    if callable(damage):
        damage(path)
    else:
        path.write_text(json.dumps({**json.loads(path.read_text()), **damage}))
    for mode in (["--report_only"], ["--systems", "sinusoidal", "--seeds", "1"]):  # before any training too
        with pytest.raises(ValueError, match="problems? in the results under") as refused:
            cli.main([*mode, "--results_dir", str(root), *flags])
        assert words in str(refused.value) and str(path.parent) in str(refused.value)
    check()


def test_sound_results_pass_and_a_readme_without_its_markers_is_refused_first(tmp_path, untouched):
    """The README is written only when --readme names it, and one the report could not update is refused before
    any work."""
    flags, check = untouched
    root = tmp_path / "results"
    finished_run(root, cli.parse_args(["--results_dir", str(root)]))
    assert check_results(root, cli.COMPARISON_RECIPE) == 1
    assert cli.parse_args([]).readme is None
    bare = tmp_path / "bare.md"
    bare.write_text("# a README without the module table\n")
    with pytest.raises(ValueError, match=f"--readme {bare} lacks the lines"):
        cli.main(["--report_only", "--results_dir", str(root), "--report", flags[1], "--readme", str(bare)])
    check()


def test_a_run_says_the_precision_it_trained_in_and_the_one_it_decoded_in():
    """train.py did not apply bf16 to the training step until 2026-11-27: a run recorded before it wrote
    `training_autocast` trained in fp32 whatever its `precision` says; a run recorded since says what it did."""
    assert precisions({"precision": "bf16"}) == "trained in fp32, decoded in bf16"
    recorded = {"precision": "bf16", "training_autocast": "bf16"}
    assert precisions(recorded) == "trained in bf16, decoded in bf16"
    recorded = {"precision": "fp32", "training_autocast": "no"}
    assert precisions(recorded) == "trained in fp32, decoded in fp32"


@pytest.mark.usefixtures("multi30k_dir")  # reads the shipped data
def test_a_decode_time_row_measures_the_trained_rows_model_its_own_way(tmp_path, monkeypatch):
    """A decode-time row (`tables.Decoding`) trains nothing: before its trained row has finished it is not started,
    after that it decodes that row's model with its own generation settings and records them; the trained row's
    results stay as they were. (In this process: the study's workers would not see a row added here.)"""
    folders = ["--models_dir", str(tmp_path / "models"), "--results_dir", str(tmp_path / "results")]
    flags = [*TINY_COMPARISON, "--train_args", TINY_RUN, *folders, "--report", str(tmp_path / "results.md")]
    greedy = tables.Decoding("sinusoidal", generate={"num_beams": 1, "length_penalty": 1.0})
    system = tables.System("sinusoidal+greedy", tables.SYSTEMS["sinusoidal"].overrides)
    monkeypatch.setitem(tables.DECODING, system.name, greedy)
    monkeypatch.setitem(tables.SYSTEMS, system.name, system)
    args = cli.parse_args([*flags, "--systems", "sinusoidal"])
    args.run_precision = "fp32"
    decode_run = runs.Run("multi30k-en-de-tiny", "en-de", system.name, 1)
    assert "not started: sinusoidal seed 1 en-de is not trained yet" in runs.execute(decode_run, args)
    cli.main([*flags, "--systems", "sinusoidal"])
    assert "(decoding only)" in runs.execute(decode_run, args)
    model_folder = tmp_path / "models" / "multi30k-en-de-tiny" / "en-de" / "sinusoidal" / "seed1"
    (model_folder / "config.json").rename(model_folder / "config.json.away")
    assert "recorded as finished but its model folder" in runs.execute(decode_run, args)
    (model_folder / "config.json.away").rename(model_folder / "config.json")
    root = tmp_path / "results" / "multi30k-en-de-tiny" / "en-de"
    trained = json.loads((root / "sinusoidal" / "seed1" / "scores.json").read_text())
    decoded = json.loads((root / system.name / "seed1" / "scores.json").read_text())
    assert "decoding" not in trained and decoded["decoding"]["generate"] == greedy.generate
    assert decoded["decoded_with"] == {"config": {}, "generate": greedy.generate}
    assert decoded["steps"] == trained["steps"] == 2  # the trained row's model, not a training of its own
    settings = json.loads((root / system.name / "seed1" / "settings.json").read_text())
    assert settings["decoding"]["trained_as"] == "sinusoidal" and runs.done(decode_run, args)
    recorded = json.loads((root / "sinusoidal" / "seed1" / "settings.json").read_text())
    assert settings["train_arguments"] == recorded["train_arguments"]
    assert not (tmp_path / "models" / "multi30k-en-de-tiny" / "en-de" / system.name).exists()
    measured = tables.Decoding("sinusoidal", generate=tables.LENGTH_CONTROL)
    monkeypatch.setitem(tables.DECODING, system.name, measured)
    model, tokenizer = load_translation_model(model_folder)
    settings = runs.generate_settings(decode_run, tokenizer)
    ratio = settings["min_length_ratio"]
    assert isinstance(ratio, float) and 0.3 < ratio < 1.2  # German over English, 5% quantile
    assert settings["sentence_end_token_ids"] == sentence_end_token_ids(tokenizer) != []
    (written,) = translate(model, tokenizer, ["A man sleeps. A dog runs."], **settings)
    assert isinstance(written, str)  # the settings are ones generate accepts
    windowed = tables.Decoding("sinusoidal", config=tables.CROSS_WINDOW)
    monkeypatch.setitem(tables.DECODING, system.name, windowed)
    config = runs.decoding_config(decode_run, model_folder)
    assert config["cross_attention_window"] == 24 and 0.8 < config["cross_attention_window_ratio"] < 1.5
    assert runs.decoding_config(runs.Run("multi30k-en-de-tiny", "en-de", "sinusoidal", 1), model_folder) == {}
    (written,) = translate(*load_translation_model(model_folder, **config), ["A man sleeps. A dog runs."])
    assert isinstance(written, str)  # the model loads and decodes with the window
    both = tables.Decoding("sinusoidal", generate=tables.LENGTH_CONTROL, config=tables.CROSS_WINDOW)
    monkeypatch.setitem(tables.DECODING, system.name, both)
    shutil.rmtree(root / system.name)
    runs.execute(decode_run, args)
    decoded = json.loads((root / system.name / "seed1" / "scores.json").read_text())
    assert decoded["decoding"]["config"]["cross_attention_window_ratio"] == tables.TRAINING_RATIO
    assert decoded["decoded_with"] == {
        "config": config,
        "generate": settings,
    }  # the values measured, recorded


def test_no_report_trains_the_planned_runs_and_writes_no_report(tmp_path, monkeypatch, untouched, capsys):
    """Rows run in several commands (lanes, chunks) need the report once, not after every command: it takes
    minutes."""
    flags, check = untouched
    trained = []
    monkeypatch.setattr(cli, "train_all", lambda runs, args: trained.extend(runs))
    folders = ["--results_dir", str(tmp_path / "results"), "--report", flags[1]]
    cli.main(["--systems", "none", "--seeds", "1", "--no_report", *folders])
    assert [(run.system, run.seed) for run in trained] == [("none", 1)]
    check()
    with pytest.raises(SystemExit) as refused:
        cli.parse_args(["--no_report", "--report_only"])
    assert refused.value.code == 2
    assert (
        "--no_report writes no report: it cannot go with --report_only or --readme" in capsys.readouterr().err
    )


def test_a_failed_run_says_its_error_line_and_where_the_log_is(tmp_path, monkeypatch):
    """A run that train.py refuses (here: no data root) logs the refusal's line with the run, not only the log's
    path (the study goes on with the other runs)."""
    monkeypatch.delenv("HF_POSENC_DATA", raising=False)
    folders = ["--models_dir", str(tmp_path / "models"), "--results_dir", str(tmp_path / "results")]
    args = cli.parse_args([*TINY_COMPARISON, "--train_args", TINY_RUN, *folders])
    args.run_precision = "fp32"
    said = runs.execute(runs.Run("multi30k-en-de-tiny", "en-de", "sinusoidal", 1), args)
    log = tmp_path / "models" / "multi30k-en-de-tiny" / "en-de" / "sinusoidal" / "seed1.train.log"
    assert said == (
        "sinusoidal seed 1 en-de: FAILED (exit 2): run.py: error: recipe multi30k-en-de-tiny reads "
        f"data_dir=multi30k under the data root, and no data root is set: {data_root_hint(None).split(': ', 1)[1]} "
        f"(see {log})"
    ), said


class NoWorkers:
    """Stands in for the study's process pool: takes the runs and starts none."""

    def __init__(self, **kwargs):
        pass

    def __enter__(self):
        return self

    def __exit__(self, *exception):
        return False

    def submit(self, *call):
        return None


def test_an_interrupted_comparison_says_how_it_goes_on(tmp_path, monkeypatch, run_tool):
    def interrupted(futures):
        raise KeyboardInterrupt

    monkeypatch.setattr(runs, "ProcessPoolExecutor", NoWorkers)
    monkeypatch.setattr(runs, "as_completed", interrupted)
    folders = ["--models_dir", str(tmp_path / "models"), "--results_dir", str(tmp_path / "results")]
    code, message = run_tool(cli.main, [*TINY_COMPARISON, "--train_args", TINY_RUN, *folders, "--no_report"])
    assert code == 130 and message == (
        "tool.py: interrupted: the runs that finished are recorded; the same command continues the others, each "
        "from its last complete checkpoint"
    ), message
