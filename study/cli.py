"""Train every system of the comparison tables under one protocol, measure each run, and write the report.

    python -m study                                  # the CPU protocol, every table, En-De
    python -m study --tables main --seeds 1 2 3 --pairs en-de en-fr
    python -m study --stop_after_minutes 120          # one chunk; run it again to continue
    python -m study --report_only --readme README.md  # rebuild the report and the README's
    python -m study --tables main --no_report         # runs only; --report_only later writes the report
    python -m study --seeds 2 3 --jobs 9              # one GPU, nine runs at a time

Each run is train.py with the recipe's update budget, checkpoint averaging and decoding, the seed, the system's
config fields and one precision for all runs (decided once, here, by the same measurement train.py makes); then
the word-order probe and the length-generalisation harness measure the model. Runs execute `--jobs` at a time,
each in a process of its own. A run's small results (scores.json, test translations, probe, length results,
settings) go to `results/<recipe>/<pair>/<system>/seed<N>/`, which git tracks: the report is built from there
alone, so finished runs survive a fresh checkout. Model folders stay in `outputs/compare/` (not tracked). A run
whose results exist with the same settings (recipe contents included) is not repeated; a run cut off after
writing checkpoints continues from its last complete one. The README's results are rewritten only with
`--readme`.
"""

import argparse
import logging
import sys
from pathlib import Path

import torch
import transformers

from hf_posenc.pipeline.cli import run_cli
from hf_posenc.pipeline.training.arguments import recipe_names
from hf_posenc.pipeline.training.hardware import describe_hardware

from .readme import readme_lines, write_readme
from .report import Report
from .results import check_results, finished_runs
from .runs import LOG_FORMAT, Run, done, planned_runs, resolved_precision, train_all
from .tables import SYSTEMS, TABLES

logger = logging.getLogger(__name__)
REPO = Path(__file__).resolve().parents[1]
COMPARISON_RECIPE = "multi30k-en-de-compare"


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="python -m study", description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--recipe", default=COMPARISON_RECIPE, help=f"one of: {', '.join(recipe_names())}")
    parser.add_argument("--pairs", nargs="+", default=["en-de"], help="language pairs, e.g. en-de en-fr")
    parser.add_argument("--tables", nargs="+", choices=list(TABLES), default=list(TABLES))
    parser.add_argument("--systems", nargs="+", help="only these systems (default: the tables')")
    parser.add_argument("--seeds", nargs="+", type=int, default=[1, 2, 3], help="seeds of the main table")
    parser.add_argument(
        "--ablation_seeds", type=int, default=2, help="how many of --seeds the other tables use"
    )
    parser.add_argument("--max_steps", type=int, help="update budget (default: the recipe's)")
    parser.add_argument(
        "--precision",
        choices=["auto", "bf16", "fp32"],
        help="one precision for every run (default: the recipe's; the comparison recipes train in fp32); "
        "auto: measured once, here",
    )
    parser.add_argument("--train_args", default="", help="further train.py arguments for every run")
    parser.add_argument("--jobs", type=int, default=2, help="runs at the same time, each in its own process")
    parser.add_argument("--threads", type=int, default=1, help="torch threads per run")
    parser.add_argument(
        "--stop_after_minutes", type=float, default=0, help="start no run after this (0: none)"
    )
    parser.add_argument(
        "--models_dir", default=str(REPO / "outputs" / "compare"), help="trained models (large)"
    )
    parser.add_argument(
        "--results_dir", default=str(REPO / "results"), help="each run's small results (tracked)"
    )
    parser.add_argument("--report", default=str(REPO / "docs" / "results.md"), help="the report to write")
    parser.add_argument("--report_only", action="store_true", help="skip training, rebuild the report")
    parser.add_argument(
        "--no_report",
        action="store_true",
        help="train and measure the planned runs, write no report (it takes minutes; rebuild it with --report_only "
        "once the runs of several commands are in)",
    )
    parser.add_argument(
        "--readme",
        help="also write the results into this README (the repository's: README.md): its module table gets the "
        "first pair's BLEU and length cells, its summary a line per pair (default: no README is written)",
    )
    parser.add_argument("--probe_sentences", type=int, default=100, help="test sentences the probe permutes")
    parser.add_argument(
        "--length_k",
        nargs="+",
        type=int,
        help="joined test sentences the length harness measures, for every run instead of its table row's (smoke "
        "runs)",
    )
    parser.add_argument("--bootstrap_samples", type=int, default=1000)
    parser.add_argument("--test_limit", type=int, help="only the first N test pairs (smoke runs)")
    return parser


def parse_args(argv=None) -> argparse.Namespace:
    parser = build_parser()
    args = parser.parse_args(argv)
    args.command = list(sys.argv[1:] if argv is None else argv)  # the report says how it was written
    unknown = sorted(set(args.systems or []) - set(SYSTEMS))
    if unknown:
        parser.error(f"unknown systems {unknown}; available: {', '.join(SYSTEMS)}")
    if args.recipe not in recipe_names():
        parser.error(f"unknown recipe {args.recipe!r}; available: {', '.join(recipe_names())}")
    for flag in ("jobs", "threads", "bootstrap_samples", "probe_sentences", "ablation_seeds", "test_limit"):
        if getattr(args, flag) is not None and getattr(args, flag) < 1:
            parser.error(f"--{flag}={getattr(args, flag)} must be at least 1")
    if args.no_report and (args.report_only or args.readme):
        parser.error("--no_report writes no report: it cannot go with --report_only or --readme")
    if args.max_steps is not None and args.max_steps < 1:
        parser.error(f"--max_steps={args.max_steps} must be at least 1")
    return args


def check_reportable(args) -> None:
    """Refuse to rebuild a report from a results folder that holds none of its runs (a typo in --results_dir, or
    settings no finished run was made with), which would rewrite every table to "not run"."""
    root = Path(args.results_dir)
    if not root.is_dir():
        raise ValueError(f"--results_dir {root} does not exist: there is nothing to report")
    folders = finished_runs(root, args.recipe)
    if not folders:
        raise ValueError(
            f"--results_dir {root} holds no finished run of recipe {args.recipe} (no "
            f"{args.recipe}/<pair>/<system>/seed<N>/settings.json): there is nothing to report"
        )
    runs = [
        Run(args.recipe, f.parents[1].name, f.parent.name, int(f.name.removeprefix("seed"))) for f in folders
    ]
    if not any(run.system in SYSTEMS and done(run, args) for run in runs):
        raise ValueError(
            f"none of the {len(runs)} finished runs under {root / args.recipe} was made with these settings (their "
            "train.py arguments, the recipe, --length_k, --probe_sentences; see a run's settings.json): there is "
            "nothing to report"
        )


def main(argv=None):
    args = parse_args(argv)
    logging.basicConfig(level=logging.INFO, format=LOG_FORMAT)
    torch.set_num_threads(args.threads)
    readme = Path(args.readme) if args.readme else None
    if readme is not None:
        readme_lines(readme)  # a README the report could not update is refused before any work
    check_results(Path(args.results_dir), args.recipe)
    if args.report_only:
        check_reportable(args)
    else:
        args.run_precision = resolved_precision(args)
        runs = planned_runs(args)
        machine = describe_hardware("cuda" if torch.cuda.is_available() else "cpu").line()
        done_before = sum(done(run, args) for run in runs)
        logger.info("%d runs planned, %d done before; %s", len(runs), done_before, machine)
        train_all(runs, args)
        check_results(Path(args.results_dir), args.recipe)  # the runs just recorded too
    if args.no_report:
        return
    report = Report(args)
    logger.info("wrote %s (transformers %s)", report.write(), transformers.__version__)
    if readme is not None:
        write_readme(report, readme, args.pairs[0])
        logger.info("wrote the results into %s", readme)


def cli() -> None:
    """`make compare`: `python -m study` from the repository."""
    run_cli(main, "python -m study")
