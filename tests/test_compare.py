"""`make compare`: every system of the comparison tables is a valid training command, runs are planned seed by
seed and resumed, and a tiny real comparison writes the results page with scores, significance and probe."""

import json
import logging
import sys

import datasets
import pytest
from conftest import REPO

sys.path.insert(0, str(REPO / "train_scripts"))
import compare  # noqa: E402
import train  # noqa: E402

TINY_RUN = "--d_model 32 --layers 1 --heads 2 --ffn_dim 64 --vocab_size 300 --train_limit 600 --test_limit 12"


@pytest.mark.parametrize("system", sorted(compare.SYSTEMS))
def test_every_system_is_a_valid_training_command(system):
    args = train.parse_args(["--recipe", "multi30k-en-de-tiny", "--d_model", "32", *compare.SYSTEMS[system]])
    tokenizer = train.train_joint_bpe(["a b c d", "e f g h"], vocab_size=40)
    dataset = datasets.Dataset.from_dict(
        {"input_ids": [[4, 5, 6]], "labels": [[4, 5]]}
    )  # for rPosNet's gamma
    model = train.build_model(args, tokenizer, None, dataset)
    assert model.config.d_model == 32


def test_every_table_system_is_defined_and_tables_hold_the_baseline():
    for title, systems in compare.TABLES.values():
        assert compare.BASELINE in systems and set(systems) <= set(compare.SYSTEMS), title


def test_runs_are_planned_seed_by_seed_and_ablations_use_the_first_seed():
    args = compare.build_parser().parse_args(["--tables", "main", "gating", "--seeds", "1", "2"])
    runs = compare.planned_runs(args)
    seeds = [run.seed for run in runs]
    assert seeds == sorted(seeds)  # a cut-off command leaves whole seeds
    assert {run.system for run in runs if run.seed == 2} == set(compare.TABLES["main"][1])
    assert "rposnet-no-gating" in {run.system for run in runs if run.seed == 1}
    assert len(runs) == len(set(runs))  # systems in two tables are trained once


def test_unknown_system_lists_the_valid_ones():
    with pytest.raises(SystemExit, match="unknown systems \\['rotary'\\]; available: none, sinusoidal"):
        compare.planned_runs(compare.build_parser().parse_args(["--systems", "rotary"]))


def test_tiny_real_comparison_writes_scores_significance_and_probe_and_resumes(tmp_path, caplog):
    arguments = [
        "--systems", "sinusoidal", "none", "learned", "--tables", "main", "--seeds", "1", "--max_steps", "2",
        "--train_args", TINY_RUN, "--output_dir", str(tmp_path / "runs"), "--results", str(tmp_path / "docs" / "results.md"),
        "--probe_sentences", "4", "--bootstrap_samples", "50",
    ]  # fmt: skip
    compare.main(arguments)
    folder = tmp_path / "runs" / "multi30k-en-de-tiny" / "en-de" / "none" / "seed1"
    assert json.loads((folder / "scores.json").read_text())["steps"] == 2
    page = (tmp_path / "docs" / "results.md").read_text()
    main_table = page.split("### Word-order probe")[0]
    rows = {
        line.split(" | ")[0].strip("| "): line for line in main_table.splitlines() if line.startswith("| ")
    }
    assert "not run" in rows["shaw"] and "baseline" in rows["sinusoidal"]
    assert "p=" in rows["none"] and "not run" not in rows["none"]
    probe = json.loads((folder / "word_order_probe.json").read_text())
    assert (
        probe["shuffle"]["equivariance_gap"] < 1e-5
    )  # no positions anywhere: Eq. 9 holds in the trained model
    assert (tmp_path / "docs" / "results_en-de_learned_positions.png").is_file()
    assert (tmp_path / "docs" / "results_en-de_ngram_sweep.png").is_file()
    results = tmp_path / "docs" / "results.md"
    results.write_text(results.read_text() + "Reading of the numbers, by hand.\n")
    scores_written = (folder / "scores.json").stat().st_mtime
    caplog.clear()
    caplog.set_level(logging.INFO, logger="compare")
    compare.main(arguments)
    assert (folder / "scores.json").stat().st_mtime == scores_written
    assert "none seed 1 en-de: done before" in caplog.text
    assert results.read_text().endswith(compare.NOTES_MARKER + "\nReading of the numbers, by hand.\n")  # kept


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
