"""Train every selected positional module under one recipe, budget and seed, score it, and write the results.

    python train_scripts/compare.py                                     # CPU: tiny recipe, every table
    python train_scripts/compare.py --tables main --seeds 1 2 --pairs en-de en-fr
    python train_scripts/compare.py --recipe multi30k-en-de-small --max_steps 6000 --jobs 1 --threads 16
    python train_scripts/compare.py --report_only                      # rebuild docs/results.md

Each run is `train_scripts/train.py` in its own process (same recipe, `--max_steps`, seed and evaluation for
every system: beam 4, length penalty 0.6, sacreBLEU on test_2016_flickr; checkpoint averaging as the recipe
says) and lands in `<output_dir>/<recipe>/<pair>/<system>/seed<N>/`. A run whose `scores.json` exists with
the same settings is not repeated, and a run cut off after writing checkpoints continues from its last one,
so the command can be split into chunks (`--stop_after_minutes`) and resumed.

Then the report: per table, BLEU/chrF++ per seed, mean and standard deviation, the gap to the sinusoidal
baseline with paired bootstrap resampling (same seed; ** p < 0.05, * p < 0.10 as paper 1), "tie" where the
gap is within the seed noise; the n-gram sweep (paper 1 Fig. 4) of the best system against the baseline;
the word-order probe (paper 1 Eq. 9/13) of every trained model; heat maps of what the models learned about
positions (`hf_posenc.analysis.position_plots`). Written to `docs/results.md` and `docs/results_*.png`.
"""

import argparse
import json
import logging
import platform
import statistics
import subprocess
import sys
import time
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path

import torch
import transformers
from transformers import AutoModelForSeq2SeqLM, AutoTokenizer

import hf_posenc  # noqa: F401  (registers the Auto classes)
from hf_posenc.analysis.position_plots import plot_learned_positions
from hf_posenc.analysis.word_order_probe import word_order_probe
from hf_posenc.pipeline.data import read_lines, read_split
from hf_posenc.pipeline.evaluation import ngram_sweep, paired_bootstrap, plot_ngram_sweep
from hf_posenc.pipeline.systems import BASELINE, TABLE_TITLES, System, comparison_tables

logger = logging.getLogger("compare")
REPO = Path(__file__).resolve().parents[1]
NOTES_MARKER = "<!-- Everything below this line is kept when train_scripts/compare.py rewrites this file. -->"


TABLES = comparison_tables()
SYSTEMS: dict[str, System] = {system.name: system for systems in TABLES.values() for system in systems}


@dataclass(frozen=True)
class Run:
    recipe: str
    pair: str
    system: str
    seed: int
    max_steps: int

    @property
    def source_lang(self) -> str:
        return self.pair.split("-")[0]

    @property
    def target_lang(self) -> str:
        return self.pair.split("-")[1]

    def folder(self, root: Path) -> Path:
        return root / self.recipe / self.pair / self.system / f"seed{self.seed}"

    def arguments(self, root: Path, threads: int, extra: list[str]) -> list[str]:
        system = SYSTEMS[self.system]
        training = [
            argument for name, value in system.training.items() for argument in (f"--{name}", str(value))
        ]
        return [
            "--recipe", self.recipe, "--source_lang", self.source_lang, "--target_lang", self.target_lang,
            "--max_steps", str(self.max_steps), "--minutes", "0", "--seed", str(self.seed),
            "--threads", str(threads), "--output_dir", str(self.folder(root)), "--examples", "0",
            "--fail_on_degenerate", "false", "--config_overrides", json.dumps(system.overrides), *training, *extra,
        ]  # fmt: skip


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--recipe", default="multi30k-en-de-tiny", help="a train_scripts/recipes name")
    parser.add_argument("--pairs", nargs="+", default=["en-de"], help="language pairs, e.g. en-de en-fr")
    parser.add_argument("--tables", nargs="+", choices=list(TABLES), default=list(TABLES))
    parser.add_argument(
        "--systems", nargs="+", default=None, help="only these systems (default: the tables')"
    )
    parser.add_argument("--seeds", nargs="+", type=int, default=[1, 2], help="seeds of the main table")
    parser.add_argument(
        "--ablation_seeds", type=int, default=1, help="how many of --seeds the other tables use"
    )
    parser.add_argument(
        "--max_steps", type=int, default=300, help="the update budget, the same for every run"
    )
    parser.add_argument("--train_args", default="", help="further train.py arguments for every run")
    parser.add_argument("--jobs", type=int, default=2, help="runs at the same time")
    parser.add_argument("--threads", type=int, default=1, help="torch threads per run")
    parser.add_argument(
        "--stop_after_minutes", type=float, default=0, help="start no run after this (0: none)"
    )
    parser.add_argument("--output_dir", default=str(REPO / "outputs" / "compare"))
    parser.add_argument("--results", default=str(REPO / "docs" / "results.md"), help="the report to write")
    parser.add_argument("--report_only", action="store_true", help="skip training, rebuild the report")
    parser.add_argument("--probe_sentences", type=int, default=100, help="test sentences the probe permutes")
    parser.add_argument("--bootstrap_samples", type=int, default=1000)
    return parser


def planned_runs(args) -> list[Run]:
    """Seed by seed (all systems of the first seed first), so that a cut-off command leaves whole seeds."""
    unknown = sorted(set(args.systems or []) - set(SYSTEMS))
    if unknown:
        raise SystemExit(f"unknown systems {unknown}; available: {', '.join(SYSTEMS)}")
    if not (REPO / "train_scripts" / "recipes" / f"{args.recipe}.yaml").is_file():
        raise SystemExit(f"unknown recipe {args.recipe!r}; see train_scripts/recipes/")
    runs = []
    for seed_index, seed in enumerate(args.seeds):
        for pair in args.pairs:
            for table in args.tables:
                if table != "main" and seed_index >= args.ablation_seeds:
                    continue
                for system in (s.name for s in TABLES[table]):
                    run = Run(args.recipe, pair, system, seed, args.max_steps)
                    if (args.systems is None or system in args.systems) and run not in runs:
                        runs.append(run)
    return runs


def execute(run: Run, args) -> str:
    """Train and score one run unless its results exist; resumes from its last checkpoint if it has one."""
    root = Path(args.output_dir)
    folder = run.folder(root)
    arguments = run.arguments(root, args.threads, args.train_args.split())
    settings = folder / "compare_run.json"
    if (
        (folder / "scores.json").is_file()
        and settings.is_file()
        and json.loads(settings.read_text()) == arguments
    ):
        return f"{run.system} seed {run.seed} {run.pair}: done before"
    checkpoints = folder.with_name(folder.name + "-checkpoints")
    resume = ["--resume_from_checkpoint", "last"] if any(checkpoints.glob("checkpoint-*")) else []
    folder.mkdir(parents=True, exist_ok=True)
    started = time.monotonic()
    with open(folder / "train.log", "w") as log:
        process = subprocess.run(
            [sys.executable, str(REPO / "train_scripts" / "train.py"), *arguments, *resume],
            stdout=log,
            stderr=log,
        )
    if process.returncode != 0:
        return f"{run.system} seed {run.seed} {run.pair}: FAILED (exit {process.returncode}), see {folder}/train.log"
    settings.write_text(json.dumps(arguments) + "\n")
    bleu = json.loads((folder / "scores.json").read_text())["bleu"]
    return f"{run.system} seed {run.seed} {run.pair}: BLEU {bleu:.2f} in {(time.monotonic() - started) / 60:.1f} min"


def train_all(runs: list[Run], args) -> None:
    deadline = time.monotonic() + args.stop_after_minutes * 60 if args.stop_after_minutes else None

    def guarded(run: Run) -> str:
        if deadline is not None and time.monotonic() > deadline:
            return f"{run.system} seed {run.seed} {run.pair}: not started (--stop_after_minutes)"
        return execute(run, args)

    with ThreadPoolExecutor(max_workers=args.jobs) as pool:
        for message in pool.map(guarded, runs):
            logger.info(message)


# ----------------------------------------------------------------------------------------------------------
# Report


def finished(run: Run, root: Path) -> bool:
    return (run.folder(root) / "scores.json").is_file()


def mean_sd(values: list[float]) -> str:
    if len(values) < 2:
        return f"{values[0]:.2f}"
    return f"{statistics.mean(values):.2f} ± {statistics.stdev(values):.2f}"


def load_model(folder: Path):
    return AutoModelForSeq2SeqLM.from_pretrained(folder), AutoTokenizer.from_pretrained(folder)


def probe(run: Run, root: Path, sentences: list[str]) -> dict:
    """Word-order probe of a trained model (cached next to it)."""
    path = run.folder(root) / "word_order_probe.json"
    if path.is_file() and json.loads(path.read_text())["sentences"] == len(sentences):
        return json.loads(path.read_text())
    model, tokenizer = load_model(run.folder(root))
    results = word_order_probe(
        model, tokenizer, sentences, num_permutations=2, num_beams=1, max_new_tokens=64
    )
    report = {"sentences": len(sentences), **{result.kind: vars(result) for result in results}}
    path.write_text(json.dumps(report, indent=2) + "\n")
    return report


class Report:
    """docs/results.md for one recipe: a section per language pair, a table per selected table."""

    def __init__(self, args):
        self.args = args
        self.root = Path(args.output_dir)
        self.docs = Path(args.results).parent
        self.docs.mkdir(parents=True, exist_ok=True)
        self.lines: list[str] = []
        self.bootstraps: dict[Run, dict] = {}

    def seeds_of(self, pair: str, system: str) -> list[Run]:
        runs = [Run(self.args.recipe, pair, system, seed, self.args.max_steps) for seed in self.args.seeds]
        return [run for run in runs if finished(run, self.root)]

    def hypotheses(self, run: Run) -> list[str]:
        return read_lines(run.folder(self.root) / f"test.hyp.{run.target_lang}")

    def scores(self, run: Run) -> dict:
        return json.loads((run.folder(self.root) / "scores.json").read_text())

    def bootstrap(self, run: Run, baseline: list[str], references: list[str]) -> dict:
        """Paired bootstrap of `run` against the baseline of its seed, once per run (systems recur in tables)."""
        if run not in self.bootstraps:
            self.bootstraps[run] = paired_bootstrap(
                baseline, self.hypotheses(run), references, self.args.bootstrap_samples
            )
        return self.bootstraps[run]

    def write(self) -> Path:
        args = self.args
        self.lines += [
            f"# Results: every positional module on Multi30k, recipe `{args.recipe}`",
            "",
            f"Written by `python train_scripts/compare.py {' '.join(sys.argv[1:])}` on {time.strftime('%Y-%m-%d')}.",
            f"Hardware: {hardware(args)}. Every run: recipe `{args.recipe}`, {args.max_steps} updates, the same "
            "data, tokenizer settings, seed list and evaluation (beam 4, length penalty 0.6, sacreBLEU on "
            "detokenised `test_2016_flickr`, 1,000 sentences). Significance: paired bootstrap resampling "
            f"({args.bootstrap_samples} samples) of each seed against the sinusoidal baseline of the same seed, "
            "** p < 0.05, * p < 0.10 (paper 1's marks). Δ BLEU compares with the baseline's runs of the same seeds. "
            "A gap is a **tie** unless every seed's bootstrap is significant (p < 0.10) and it exceeds two "
            "standard deviations over seeds (of the system, or of the baseline for single-seed rows); where "
            "neither has two seeds, no seed noise is measured and the verdict is **one seed** (no call).",
            "",
        ]
        for pair in args.pairs:
            self.pair_section(pair)
        path = Path(args.results)
        kept = path.read_text().partition(NOTES_MARKER)[2] if path.is_file() else ""
        path.write_text("\n".join(self.lines) + f"\n{NOTES_MARKER}{kept or chr(10)}")
        return path

    def pair_section(self, pair: str) -> None:
        test = read_split(REPO.parent / "shared" / "data" / "multi30k", "test_2016_flickr", *pair.split("-"))
        evaluated = {
            self.scores(run)["test_pairs"] for system in SYSTEMS for run in self.seeds_of(pair, system)
        }
        if len(evaluated) > 1:
            raise ValueError(
                f"{pair}: runs were evaluated on different numbers of test pairs {sorted(evaluated)}"
            )
        if evaluated:  # runs made with --test_limit are scored against the same first test pairs
            test.source, test.target = test.source[: min(evaluated)], test.target[: min(evaluated)]
        self.lines += [f"## {pair}", ""]
        for table in self.args.tables:
            title, systems = TABLE_TITLES[table], [s.name for s in TABLES[table]]
            self.table(pair, title, systems, test.target)
        self.probe_table(pair, test.source[: self.args.probe_sentences])
        self.sweep(pair, test.target)
        self.pictures(pair)

    def table(self, pair: str, title: str, systems: list[str], references: list[str]) -> None:
        baseline = {run.seed: self.hypotheses(run) for run in self.seeds_of(pair, BASELINE)}
        self.lines += [f"### {title}", "", "| system | parameters | BLEU per seed | BLEU | Δ BLEU | chrF++ | "
                       "bootstrap vs sinusoidal (BLEU p per seed) | verdict |", "| --- | --- | --- | --- | --- | --- | --- | --- |"]  # fmt: skip
        base_bleu = {run.seed: self.scores(run)["bleu"] for run in self.seeds_of(pair, BASELINE)}
        for system in systems:
            runs = self.seeds_of(pair, system)
            if not runs:
                self.lines.append(f"| {system} | | not run | | | | | |")
                continue
            bleu = [self.scores(run)["bleu"] for run in runs]
            chrf = [self.scores(run)["chrf++"] for run in runs]
            tests = [
                self.bootstrap(run, baseline[run.seed], references)
                for run in runs
                if system != BASELINE and run.seed in baseline
            ]
            same_seeds = [base_bleu[run.seed] for run in runs if run.seed in base_bleu]
            delta = (  # against the baseline's runs with the same seeds
                statistics.mean(bleu) - statistics.mean(same_seeds)
                if same_seeds and system != BASELINE
                else None
            )
            self.lines.append(
                f"| {system} | {self.scores(runs[0])['parameters'] / 1e6:.2f}M | "
                f"{' / '.join(f'{b:.2f}' for b in bleu)} | {mean_sd(bleu)} | "
                f"{'' if delta is None else f'{delta:+.2f}'} | {mean_sd(chrf)} | "
                f"{bootstrap_cell(tests)} | "
                f"{verdict(delta, bleu, list(base_bleu.values()), tests)} |"
            )
        self.lines.append("")

    def probe_table(self, pair: str, sentences: list[str]) -> None:
        self.lines += [
            "### Word-order probe of the trained models (paper 1 Eq. 9 vs 13)",
            "",
            f"First {len(sentences)} test sources, 2 permutations each, greedy decoding, first seed's model. Gap = "
            "‖Enc(PX) − P·Enc(X)‖/‖Enc(X)‖ (0: the encoder cannot see word order); BLEU vs original = sacreBLEU "
            "of the permuted sources' translations against the original translations (100: order ignored).",
            "",
            "| system | BLEU | gap (shuffle) | gap (local swap) | BLEU vs original (shuffle) | BLEU vs original (local swap) |",
            "| --- | --- | --- | --- | --- | --- |",
        ]  # fmt: skip
        for system in (s.name for s in TABLES["main"]):
            runs = self.seeds_of(pair, system)
            if not runs:
                continue
            result = probe(runs[0], self.root, sentences)
            shuffle, swap = result["shuffle"], result["local_swap"]
            self.lines.append(
                f"| {system} | {self.scores(runs[0])['bleu']:.2f} | {shuffle['equivariance_gap']:.3f} | "
                f"{swap['equivariance_gap']:.3f} | {shuffle['bleu_vs_original']:.1f} | {swap['bleu_vs_original']:.1f} |"
            )
        self.lines.append("")

    def sweep(self, pair: str, references: list[str]) -> None:
        candidates = {
            system: statistics.mean(self.scores(run)["bleu"] for run in runs)
            for system in (s.name for s in TABLES["main"])
            if system != BASELINE and (runs := self.seeds_of(pair, system))
        }
        baseline_runs = self.seeds_of(pair, BASELINE)
        if not candidates or not baseline_runs:
            return
        best = max(candidates, key=candidates.get)
        best_run = next(run for run in self.seeds_of(pair, best) if run.seed == baseline_runs[0].seed)
        gaps = ngram_sweep(self.hypotheses(best_run), self.hypotheses(baseline_runs[0]), references)
        name = f"results_{pair}_ngram_sweep.png"
        plot_ngram_sweep(gaps, self.docs / name, title=f"{best} − sinusoidal, {pair}, seed {best_run.seed}")
        self.lines += [
            "### n-gram sweep (paper 1 Fig. 4)",
            "",
            f"Best system by mean BLEU: `{best}`. Score gap to the sinusoidal baseline as the n-gram order grows "
            f"(seed {best_run.seed}): BLEU n = 1..8: {', '.join(f'{g:+.2f}' for _, g in gaps['bleu'])}.",
            "",
            f"![n-gram sweep]({name})",
            "",
        ]

    def pictures(self, pair: str) -> None:
        self.lines += ["### What the models learned about positions", ""]
        for system in (s.name for s in TABLES["main"]):
            runs = self.seeds_of(pair, system)
            if not runs:
                continue
            model, _ = load_model(runs[0].folder(self.root))
            name = f"results_{pair}_{system}_positions.png"
            if plot_learned_positions(
                model, self.docs / name, title=f"{system}, {pair}, seed {runs[0].seed}"
            ):
                self.lines += [f"`{system}`:", "", f"![{system}]({name})", ""]


def bootstrap_cell(tests: list[dict]) -> str:
    """'p=0.012**, p=0.300' for the seeds' BLEU bootstrap tests."""
    return ", ".join(f"p={test['bleu']['p_value']:.3f}{test['bleu']['significance']}" for test in tests)


def verdict(delta, bleu, base_bleu, tests) -> str:
    """better/worse only when every seed's bootstrap is significant (p < 0.10) and the gap exceeds two seed
    standard deviations (of the system or of the baseline, whichever is larger and measured); else a tie.
    With one seed of both, no seed noise is measured and the bootstrap alone cannot call a gap: "one seed"."""
    if delta is None:
        return "baseline"
    seed_sds = [statistics.stdev(values) for values in (bleu, base_bleu) if len(values) >= 2]
    if not seed_sds:
        return "one seed"
    if abs(delta) <= 2 * max(seed_sds):
        return "tie"
    if tests and all(t["bleu"]["significance"] for t in tests):
        return "better" if delta > 0 else "worse"
    return "tie"


def hardware(args) -> str:
    device = torch.cuda.get_device_name() if torch.cuda.is_available() else f"CPU ({platform.machine()})"
    return (
        f"{device}, {args.jobs} run(s) at a time with {args.threads} torch thread(s) each, "
        f"torch {torch.__version__}, transformers {transformers.__version__}"
    )


def main(argv=None):
    args = build_parser().parse_args(argv)
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(name)s: %(message)s")
    runs = planned_runs(args)
    if not args.report_only:
        logger.info(
            "%d runs planned, %d done before",
            len(runs),
            sum(finished(r, Path(args.output_dir)) for r in runs),
        )
        train_all(runs, args)
    logger.info("wrote %s", Report(args).write())


if __name__ == "__main__":
    main()
