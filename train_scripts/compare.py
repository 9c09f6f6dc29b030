"""Train every system of the comparison tables under one protocol, measure each run, and write the report.

    python train_scripts/compare.py                                  # the CPU protocol, every table, En-De
    python train_scripts/compare.py --tables main --seeds 1 2 3 --pairs en-de en-fr
    python train_scripts/compare.py --stop_after_minutes 120          # one chunk; run it again to continue
    python train_scripts/compare.py --report_only                     # rebuild docs/results.md
    python train_scripts/compare.py --seeds 2 3 --jobs 9 --precision bf16  # one GPU, nine runs at a time

The systems and tables come from the registries (`hf_posenc.pipeline.systems`): every module's main system,
and the ablation rows the module classes declare. Each run is `train_scripts/train.py` in its own process
with the recipe's update budget, checkpoint averaging and decoding, the seed, and one precision for all runs
(decided once, here, by the same measurement train.py makes). After training, the word-order probe (paper 1
Eq. 9/13) and the length-generalisation harness (`hf_posenc.analysis.length_generalisation`) measure the
model, and the run's small results (scores.json, test translations, probe, length results, settings) go to
`results/<recipe>/<pair>/<system>/seed<N>/`, which git tracks: the report is built from there alone, so
finished runs survive a fresh checkout. Model folders stay in `outputs/compare/` (not tracked). A run whose
results exist with the same settings (recipe contents included) is not repeated; a run cut off after
writing checkpoints continues from its last complete one.

The report (`docs/results.md`): per table, BLEU/chrF++ per seed, mean ± sd, the gap to the sinusoidal
baseline with paired bootstrap resampling per seed (** p < 0.05, * p < 0.10, paper 1's marks) and a verdict
that also needs the gap to exceed the seed noise; length generalisation per system (joined test sentences,
length buckets) with a plot; the papers' claims, one row each, with the measured evidence and a verdict; the
word-order probe; the n-gram sweep (paper 1 Fig. 4) of the best system; pictures of what the models learned
about positions. Text below the notes marker of an existing report is kept.
"""

import argparse
import gzip
import json
import logging
import shutil
import statistics
import subprocess
import sys
import time
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path

import torch
import transformers
from transformers import AutoModelForSeq2SeqLM

from hf_posenc import MarianPosEncConfig  # importing hf_posenc registers the Auto classes
from hf_posenc.analysis.length_generalisation import (
    DEFAULT_K,
    cannot_cell,
    comparison_table,
    length_generalisation_for_model_dir,
    mean_over_seeds,
    plot_length_generalisation,
    sentence_ends,
)
from hf_posenc.analysis.position_plots import plot_learned_positions
from hf_posenc.analysis.word_order_probe import word_order_probe
from hf_posenc.pipeline.arguments import load_recipe, model_config, recipe_names
from hf_posenc.pipeline.arguments import parse_args as parse_train_args
from hf_posenc.pipeline.cli import run_cli
from hf_posenc.pipeline.data import DATA_ROOT, read_lines, read_split
from hf_posenc.pipeline.evaluation import (
    degenerate_output,
    load_translation_model,
    ngram_sweep,
    paired_bootstrap,
    plot_ngram_sweep,
)
from hf_posenc.pipeline.hardware import Hardware, choose_precision, describe_hardware
from hf_posenc.pipeline.systems import BASELINE, TABLE_TITLES, System, comparison_tables, paper_deviations

logger = logging.getLogger("compare")
REPO = Path(__file__).resolve().parents[1]
DATA = DATA_ROOT / "multi30k"
NOTES_MARKER = "<!-- Everything below this line is kept when train_scripts/compare.py rewrites this file. -->"
SUMMARY_START = "<!-- results summary: written by train_scripts/compare.py from results/ -->"
SUMMARY_END = "<!-- end of results summary -->"
MODULE_TABLE_HEADER = "| name | kind | paper / equation | docs | status | BLEU | length generalisation |"
DEFAULT_RECIPE = "multi30k-en-de-compare"

TABLES = comparison_tables()
SYSTEMS: dict[str, System] = {system.name: system for systems in TABLES.values() for system in systems}


@dataclass(frozen=True)
class Run:
    recipe: str
    pair: str
    system: str
    seed: int

    @property
    def source_lang(self) -> str:
        return self.pair.split("-")[0]

    @property
    def target_lang(self) -> str:
        return self.pair.split("-")[1]

    def folder(self, root: Path) -> Path:
        return Path(root) / self.recipe / self.pair / self.system / f"seed{self.seed}"

    def label(self) -> str:
        return f"{self.system} seed {self.seed} {self.pair}"


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--recipe", default=DEFAULT_RECIPE, help=f"one of: {', '.join(recipe_names())}")
    parser.add_argument("--pairs", nargs="+", default=["en-de"], help="language pairs, e.g. en-de en-fr")
    parser.add_argument("--tables", nargs="+", choices=list(TABLES), default=list(TABLES))
    parser.add_argument(
        "--systems", nargs="+", default=None, help="only these systems (default: the tables')"
    )
    parser.add_argument("--seeds", nargs="+", type=int, default=[1, 2, 3], help="seeds of the main table")
    parser.add_argument(
        "--ablation_seeds", type=int, default=2, help="how many of --seeds the other tables use"
    )
    parser.add_argument("--max_steps", type=int, default=None, help="update budget (default: the recipe's)")
    parser.add_argument("--precision", choices=["auto", "bf16", "fp32"], default="auto",
                        help="one precision for every run; auto: measured once, here")  # fmt: skip
    parser.add_argument("--train_args", default="", help="further train.py arguments for every run")
    parser.add_argument("--jobs", type=int, default=2, help="runs at the same time")
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
        "--readme",
        default=None,
        help="README whose module table and summary get the first pair's results (default: the repository's "
        f"README.md for --recipe {DEFAULT_RECIPE}, none for other recipes)",
    )
    parser.add_argument("--probe_sentences", type=int, default=100, help="test sentences the probe permutes")
    parser.add_argument("--length_k", nargs="+", type=int, default=list(DEFAULT_K), help="sentences joined")
    parser.add_argument("--bootstrap_samples", type=int, default=1000)
    parser.add_argument(
        "--test_limit", type=int, default=None, help="only the first N test pairs (smoke runs)"
    )
    return parser


def parse_args(argv=None) -> argparse.Namespace:
    parser = build_parser()
    args = parser.parse_args(argv)
    unknown = sorted(set(args.systems or []) - set(SYSTEMS))
    if unknown:
        parser.error(f"unknown systems {unknown}; available: {', '.join(SYSTEMS)}")
    if args.recipe not in recipe_names():
        parser.error(f"unknown recipe {args.recipe!r}; available: {', '.join(recipe_names())}")
    for flag in ("jobs", "threads", "bootstrap_samples", "probe_sentences", "ablation_seeds", "test_limit"):
        if getattr(args, flag) is not None and getattr(args, flag) < 1:
            parser.error(f"--{flag}={getattr(args, flag)} must be at least 1")
    if args.max_steps is not None and args.max_steps < 1:
        parser.error(f"--max_steps={args.max_steps} must be at least 1")
    if args.readme is None and args.recipe == DEFAULT_RECIPE:
        args.readme = str(REPO / "README.md")
    return args


def planned_runs(args) -> list[Run]:
    """Seed by seed (all systems of the first seed first), so that a cut-off command leaves whole seeds."""
    runs = []
    for seed_index, seed in enumerate(args.seeds):
        for pair in args.pairs:
            for table in args.tables:
                if table != "main" and seed_index >= args.ablation_seeds:
                    continue
                for system in TABLES[table]:
                    run = Run(args.recipe, pair, system.name, seed)
                    if (args.systems is None or system.name in args.systems) and run not in runs:
                        runs.append(run)
    return runs


def resolved_precision(args) -> str:
    """The precision every run trains and decodes in: `--precision`, or for auto the faster on this machine
    at the recipe's model shapes (measured once, so that a loaded machine cannot split the runs)."""
    recipe = load_recipe(args.recipe)
    device = "cuda" if torch.cuda.is_available() else "cpu"
    choice = choose_precision(args.precision, device, recipe.get("d_model", 512), recipe.get("ffn_dim", 2048))
    logger.info("every run: %s", choice.line())
    return choice.precision


def train_arguments(run: Run, args) -> list[str]:
    """train.py's arguments for a run that decide its results (output folder, threads and precision are added
    by `execute`: a run's precision is recorded in its scores, and runs of earlier machines are kept)."""
    system = SYSTEMS[run.system]
    training = [
        argument
        for name, value in system.training.items()
        for argument in (f"--{name}", *map(str, value if isinstance(value, list | tuple) else [value]))
    ]
    budget = ["--max_steps", str(args.max_steps)] if args.max_steps else []
    budget += ["--test_limit", str(args.test_limit)] if args.test_limit else []
    return [
        "--recipe", run.recipe, "--source_lang", run.source_lang, "--target_lang", run.target_lang,
        "--seed", str(run.seed), *budget, "--examples", "0",
        "--fail_on_degenerate", "false", "--config_overrides", json.dumps(system.overrides), *training,
        *args.train_args.split(),
    ]  # fmt: skip


def run_settings(run: Run, args) -> dict:
    return {"train_arguments": train_arguments(run, args), "recipe": load_recipe(run.recipe),
            "length_k": args.length_k, "probe_sentences": args.probe_sentences}  # fmt: skip


def done(run: Run, args) -> bool:
    settings = run.folder(args.results_dir) / "settings.json"
    return settings.is_file() and json.loads(settings.read_text()) == run_settings(run, args)


def test_set(pair: str, limit: int | None = None):
    return read_split(DATA, "test_2016_flickr", *pair.split("-"), limit=limit)


def execute(run: Run, args) -> str:
    """Train, measure and record one run unless its results exist; resumes from its last checkpoint."""
    if done(run, args):
        return f"{run.label()}: done before"
    models, results = run.folder(args.models_dir), run.folder(args.results_dir)
    checkpoints = Path(f"{models}-checkpoints")
    resume = (
        ["--resume_from_checkpoint", "last"]
        if any(checkpoints.glob("checkpoint-*/trainer_state.json"))
        else []
    )
    restart = [] if resume else ["--overwrite_output_dir"]  # a run without a complete checkpoint starts again
    models.parent.mkdir(parents=True, exist_ok=True)
    started = time.monotonic()
    command = [sys.executable, str(REPO / "train_scripts" / "train.py"), *train_arguments(run, args),
               "--threads", str(args.threads), "--precision", args.run_precision, "--output_dir", str(models),
               *resume, *restart]  # fmt: skip
    with open(f"{models}.train.log", "w") as log:
        process = subprocess.run(command, stdout=log, stderr=log)
    if process.returncode != 0:
        return f"{run.label()}: FAILED (exit {process.returncode}), see {models}.train.log"
    measure(run, models, results, args)
    shutil.rmtree(checkpoints)  # the averaged model is in the model folder; checkpoints are 5 x model + Adam
    minutes = (time.monotonic() - started) / 60
    bleu = json.loads((results / "scores.json").read_text())["bleu"]
    return f"{run.label()}: BLEU {bleu:.2f} in {minutes:.1f} min"


def measure(run: Run, models: Path, results: Path, args) -> None:
    """The probe and the length harness on the trained model; then the run's small results into `results`,
    settings.json last (it marks the run finished)."""
    test = test_set(run.pair, args.test_limit)
    bf16 = args.run_precision == "bf16"
    model, tokenizer = load_translation_model(models)
    probes = word_order_probe(model, tokenizer, test.source[: args.probe_sentences], num_permutations=2,
                              num_beams=1, max_new_tokens=64, bf16=bf16)  # fmt: skip
    length = length_generalisation_for_model_dir(models, test.source, test.target, args.length_k, bf16=bf16)
    results.mkdir(parents=True, exist_ok=True)
    (results / "word_order_probe.json").write_text(
        json.dumps({"sentences": args.probe_sentences, **{p.kind: vars(p) for p in probes}}, indent=2) + "\n"
    )
    (results / "length_generalisation.json").write_text(json.dumps(length, indent=2) + "\n")
    shutil.copy(models / "scores.json", results / "scores.json")
    hypotheses = (models / f"test.hyp.{run.target_lang}").read_bytes()
    (results / f"test.hyp.{run.target_lang}.gz").write_bytes(gzip.compress(hypotheses, mtime=0))
    (results / "settings.json").write_text(json.dumps(run_settings(run, args), indent=2) + "\n")


def train_all(runs: list[Run], args) -> None:
    deadline = time.monotonic() + args.stop_after_minutes * 60 if args.stop_after_minutes else None

    def guarded(run: Run) -> str:
        if deadline is not None and time.monotonic() > deadline:
            return f"{run.label()}: not started (--stop_after_minutes)"
        return execute(run, args)

    with ThreadPoolExecutor(max_workers=args.jobs) as pool:
        for message in pool.map(guarded, runs):
            logger.info(message)


# ----------------------------------------------------------------------------------------------------------
# Report

# The papers' claims: (paper, claim, system, reference system, expected relation of system to reference).
# Relations: "<" worse, ">" better, "≈" equal, "≥" better or equal, "≤" worse or equal. Paper 2 states its gaps
# in BLEU, BLEURT and COMET; these rows test the BLEU side (UNTESTABLE_CLAIMS says why not the others).
CLAIMS = [
    ("1", "no PE ≪ SAPE", "none", BASELINE, "<"),
    ("1", "LAPE < SAPE", "learned", BASELINE, "<"),
    ("1", "RPE ≈ SAPE", "shaw", BASELINE, "≈"),
    ("1", "Adaptive-T5 ≈ SAPE", "adaptive_t5", BASELINE, "≈"),
    ("1", "PosNet-Attn well below SAPE", "posnet_attn", BASELINE, "<"),
    ("1", "PosNet-Embed ≥ SAPE", "posnet_embed", BASELINE, "≥"),
    # Fig. 3 (d_model 512): d_p 128 best, 96 detrimental; here d_model 256, the same d_p values
    ("1", "d_p sweep: 96 detrimental (128 > 96)", "posnet_embed", "posnet_embed-dp96", ">"),
    ("1", "d_p sweep: 128 best (≥ 64)", "posnet_embed", "posnet_embed-dp64", "≥"),
    ("1", "d_p sweep: 128 best (≥ 256)", "posnet_embed", "posnet_embed-dp256", "≥"),
    ("2", "rPosNet ≈ content attention", "rposnet", BASELINE, "≈"),
    ("2", "rPosNet ≈ Shaw RPE", "rposnet", "shaw", "≈"),
    ("2", "aPosNet < content attention", "aposnet", BASELINE, "<"),
    ("2", "rPosNet > aPosNet", "rposnet", "aposnet", ">"),
    ("2", "rPosNet > gLinearNet", "rposnet", "glinear", ">"),
    ("2", "rPosNet > LightConv", "rposnet", "lightconv", ">"),
    ("2", "hard-coded FourierNet < hard-coded GaussianNet", "fourier", "gaussian", "<"),
    ("2", "hard-coded GaussianNet ≈ learned LinearNet in BLEU", "gaussian", "linear", "≈"),
    ("2", "gating helps aPosNet", "aposnet", "aposnet-no-gating", ">"),
    ("2", "gating helps rPosNet", "rposnet", "rposnet-no-gating", ">"),
    ("2", "gating helps relative attention", "relative_attention", "relative_attention-no-gating", ">"),
    ("2", "gating does not help content attention", "attention+gating", BASELINE, "≈"),
    ("2", "rPosNet in cross-attention alone is weak", "rposnet@C", BASELINE, "<"),
    # Table 5: rPosNet in encoder self-attention helps in every combination; in decoder self-attention only
    # with it in the encoder too; both self-attentions the best placement
    ("2", "placement: encoder self-attention helps (alone)", "rposnet@ES", BASELINE, ">"),
    ("2", "placement: encoder self-attention helps (with DS)", "rposnet", "rposnet@DS", ">"),
    ("2", "placement: encoder self-attention helps (with C)", "rposnet@ES+C", "rposnet@C", ">"),
    ("2", "placement: encoder self-attention helps (with DS+C)", "rposnet@ES+DS+C", "rposnet@DS+C", ">"),
    ("2", "placement: decoder self-attention alone does not help", "rposnet@DS", BASELINE, "≤"),
    ("2", "placement: decoder self-attention helps with it in the encoder", "rposnet", "rposnet@ES", ">"),
    ("2", "chain: GLU helps light convolution", "lightconv", "lightconv-no-glu", ">"),
    ("2", "chain: GeLU gating ≥ GLU", "lightconv+gelu-gating", "lightconv", "≥"),
    (
        "2",
        "chain: global context helps",
        "lightconv+gelu-gating+global-context",
        "lightconv+gelu-gating",
        ">",
    ),
    (
        "2",
        "chain: rPosNet ≥ gated LightConv with global context",
        "rposnet",
        "lightconv+gelu-gating+global-context",
        "≥",
    ),
    ("3", "RPEHead ≥ Transformer", "rpe_head", BASELINE, "≥"),
    ("3", "MPRHead ≥ Transformer", "mpr_head", BASELINE, "≥"),
    ("3", "RPEs in encoder and decoder ≥ encoder only", "rpe_head", "rpe_head@encoder", "≥"),
    ("3", "RPEs in encoder and decoder ≥ decoder only", "rpe_head", "rpe_head@decoder", "≥"),
    ("3", "MPRHead in encoder and decoder ≥ encoder only", "mpr_head", "mpr_head@encoder", "≥"),
    ("3", "MPRHead in encoder and decoder ≥ decoder only", "mpr_head", "mpr_head@decoder", "≥"),
    ("3", "MPRHead > RPEHead", "mpr_head", "rpe_head", ">"),
    # Fig. 2 (d_model 512): BLEU rises with d_r up to 320 (RPEHead) and 256 (MPRHead), then falls; here d_model
    # 256, so the same shares are 160 and 128
    ("3", "d_r sweep: RPEHead rises with d_r (128 > 64)", "rpe_head", "rpe_head-dr64", ">"),
    ("3", "d_r sweep: MPRHead rises with d_r up to d_model/2 (128 > 64)", "mpr_head", "mpr_head-dr64", ">"),
    ("3", "d_r sweep: MPRHead falls past d_model/2 (128 ≥ 192)", "mpr_head", "mpr_head-dr192", "≥"),
    ("3", "no PE in the decoder: slightly lower", "nope-decoder", BASELINE, "≤"),
    (
        "3",
        "PE matters more in the encoder: removing it there too costs far more",
        "none",
        "nope-decoder",
        "<",
    ),
]

# Claims this comparison cannot test, and why: (paper, claim, reason).
UNTESTABLE_CLAIMS = [
    (
        "1",
        "the gains hold for Transformer big (Table 2)",
        "needs big models trained on WMT14 (4.5M/36M pairs): the WMT14 training sets cannot be loaded offline "
        "(shared/data holds the dev and test sets only), and this protocol trains a 7.6M-parameter model on "
        "Multi30k's 29k pairs",
    ),
    (
        "2",
        "rPosNet on par with the Transformer at every data size (160k to 36M pairs) and on En-Zh",
        "one data condition here (Multi30k, 29k pairs); the IWSLT14, WMT14 and WMT18 training sets are not "
        "available offline",
    ),
    (
        "2",
        "the BLEURT and COMET side of every claim (gating +3.5 COMET for aPosNet/rPosNet, +2 for the "
        "Transformer; GaussianNet < LinearNet)",
        "both metrics are neural models that would have to be downloaded, and nothing is downloaded at run "
        "time: the rows above test the BLEU side",
    ),
    (
        "3",
        "MPRHead big > Transformer big; MPRHead base ≈ Transformer big",
        "needs big models trained on WMT14, as paper 1's Table 2",
    ),
    ("3", "the gains carry over to NIST Zh-En", "the LDC/NIST corpora are licensed and not available here"),
]


def row_config(system: System, recipe: str) -> MarianPosEncConfig:
    """The config train.py builds for the system under `recipe`."""
    arguments = parse_train_args(["--recipe", recipe, "--config_overrides", json.dumps(system.overrides)])
    return model_config(arguments, vocab_size=arguments.data.vocab_size, pad=0, eos=1)


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
    system's length results (`Report.length_results`) but the degenerate ones, best first."""
    kept = []
    for system, results in measured.items():
        if system not in degenerate and (over_seeds := kept_over_seeds(results, 4)) is not None:
            shares, ratio = over_seeds
            kept.append((statistics.mean(shares), kept_cell(shares), ratio, system))
    return sorted(kept, reverse=True)


def mean_sd(values: list[float]) -> str:
    if len(values) < 2:
        return f"{values[0]:.2f}"
    return f"{statistics.mean(values):.2f} ± {statistics.stdev(values):.2f}"


def bootstrap_cell(tests: list[dict]) -> str:
    """'p=0.012**, p=0.300' for the seeds' BLEU bootstrap tests."""
    return ", ".join(f"p={test['bleu']['p_value']:.3f}{test['bleu']['significance']}" for test in tests)


PROVISIONAL = " (provisional)"  # one seed on one side: the seed noise is the other side's alone


def verdict(delta, bleu, base_bleu, tests) -> str:
    """better/worse only when every seed's bootstrap is significant (p < 0.10) and the gap exceeds two seed
    standard deviations (of the system or of the reference, whichever is larger and measured); else a tie.
    With one seed of both, no seed noise is measured and the bootstrap alone cannot call a gap: "one seed".
    With one seed on one side only, the noise is the other side's alone: the call is marked PROVISIONAL."""
    if delta is None:
        return "baseline"
    seed_sds = [statistics.stdev(values) for values in (bleu, base_bleu) if len(values) >= 2]
    if not seed_sds:
        return "one seed"
    if abs(delta) <= 2 * max(seed_sds):
        call = "tie"
    elif tests and all(t["bleu"]["significance"] for t in tests):
        call = "better" if delta > 0 else "worse"
    else:
        call = "tie"
    return call + PROVISIONAL if min(len(bleu), len(base_bleu)) < 2 else call


def claim_verdict(expected: str, measured: str) -> str:
    """reproduced / not reproduced / tie within noise, from the expected relation and the measured verdict
    (provisional where the measured verdict is)."""
    if measured == "one seed":
        return "one seed (no call)"
    call = measured.removesuffix(PROVISIONAL)
    holds = {"<": {"worse"}, ">": {"better"}, "≈": {"tie"}, "≥": {"better", "tie"}, "≤": {"worse", "tie"}}[
        expected
    ]
    result = "reproduced" if call in holds else "tie within noise" if call == "tie" else "not reproduced"
    return result + measured.removeprefix(call)


class Report:
    """docs/results.md for one recipe, built from the results folder: a section per language pair of `--pairs` or
    finished in the results folder, with every seed of `--seeds` or finished there (a chunk that trains some
    seeds or pairs reports all of them)."""

    def __init__(self, args):
        self.args = args
        self.root = Path(args.results_dir)
        self.docs = Path(args.report).parent
        self.docs.mkdir(parents=True, exist_ok=True)
        self.lines: list[str] = []
        self.bootstraps: dict[tuple[Run, Run], dict] = {}
        self.current: dict[Run, bool] = {}  # finished run -> made with this report's settings
        finished = list(self.root.joinpath(args.recipe).glob("*/*/seed*/settings.json"))
        self.seeds = sorted({*args.seeds, *(int(path.parent.name.removeprefix("seed")) for path in finished)})
        self.pairs = [*args.pairs, *sorted({path.parents[2].name for path in finished} - set(args.pairs))]
        recipe = load_recipe(args.recipe)
        # every reported run's update budget (its settings match this report's); None under a time budget
        self.budget = args.max_steps or (None if recipe.get("minutes") else recipe.get("max_steps"))

    def runs_of(self, pair: str, system: str) -> list[Run]:
        """The finished runs made with this report's settings; a run of another protocol (a changed recipe or
        training option) is left out with a warning, so that no table mixes protocols."""
        runs = [Run(self.args.recipe, pair, system, seed) for seed in self.seeds]
        for run in runs:
            if run not in self.current and (run.folder(self.root) / "settings.json").is_file():
                self.current[run] = done(run, self.args)
                if not self.current[run]:
                    logger.warning(
                        "%s: left out, made with settings other than this report's (see its settings.json)",
                        run.label(),
                    )
        return [run for run in runs if self.current.get(run)]

    def read(self, run: Run, name: str) -> dict:
        return json.loads((run.folder(self.root) / name).read_text())

    def hypotheses(self, run: Run) -> list[str]:
        return read_lines(run.folder(self.root) / f"test.hyp.{run.target_lang}.gz")

    def degenerate(self, run: Run) -> list[str]:
        """The symptoms of garbage output (`degenerate_output`), recomputed from the run's translations."""
        encoding = SYSTEMS[run.system].overrides.get(
            "encoder_position_encoding", MarianPosEncConfig().encoder_position_encoding
        )
        reasons = degenerate_output(self.hypotheses(run), self.read(run, "scores.json")["bleu"], encoding)
        return [reason for reason in reasons if not reason.startswith("likely cause")]

    def bootstrap(self, run: Run, reference: Run, references: list[str]) -> dict:
        """Paired bootstrap of `run` against `reference` (same seed), once per pair of runs."""
        if (run, reference) not in self.bootstraps:
            self.bootstraps[run, reference] = paired_bootstrap(
                self.hypotheses(reference), self.hypotheses(run), references, self.args.bootstrap_samples
            )
        return self.bootstraps[run, reference]

    def comparison(self, pair: str, system: str, reference: str, references: list[str]):
        """(runs, BLEU per seed, reference BLEU per seed, delta, bootstrap tests, verdict) of two systems."""
        runs, reference_runs = self.runs_of(pair, system), self.runs_of(pair, reference)
        bleu = [self.read(run, "scores.json")["bleu"] for run in runs]
        base = {run.seed: run for run in reference_runs}
        base_bleu = [self.read(run, "scores.json")["bleu"] for run in reference_runs]
        paired = [run for run in runs if run.seed in base]
        tests = (
            [self.bootstrap(run, base[run.seed], references) for run in paired] if system != reference else []
        )
        same_seeds = [self.read(base[run.seed], "scores.json")["bleu"] for run in paired]
        delta = None
        if paired and system != reference:
            delta = statistics.mean(
                self.read(run, "scores.json")["bleu"] for run in paired
            ) - statistics.mean(same_seeds)
        if system != reference and delta is None:
            return runs, bleu, base_bleu, delta, tests, f"no {reference} run of these seeds"
        return runs, bleu, base_bleu, delta, tests, verdict(delta, bleu, base_bleu, tests)

    def write(self) -> Path:
        args = self.args
        recipe = load_recipe(args.recipe)
        budget = self.budget or f"{recipe['minutes']} minutes of"
        self.lines += [
            f"# Results: every positional module on Multi30k, recipe `{args.recipe}`",
            "",
            f"Written by `python train_scripts/compare.py {' '.join(sys.argv[1:])}` on {time.strftime('%Y-%m-%d')}.",
            f"Every run: recipe `{args.recipe}` ({recipe.get('description', '')}), {budget} updates, "
            + (
                f"the average of the last {recipe['average_last']} checkpoints, "
                if recipe.get("average_last")
                else ""
            )
            + f"the same data, tokenizer settings and evaluation (beam 4, length penalty 0.6, source length + 50 "
            "new tokens; sacreBLEU on detokenised `test_2016_flickr`, 1,000 sentences). Machines: "
            f"{self.machines()}. Significance: paired bootstrap resampling ({args.bootstrap_samples} samples) of "
            "each seed against the reference system's run of the same seed, ** p < 0.05, * p < 0.10 (paper 1's "
            "marks). Δ BLEU compares with the reference's runs of the same seeds. A gap is **better**/**worse** "
            "only if every seed's bootstrap is significant (p < 0.10) and it exceeds two standard deviations over "
            "seeds (of the system or of the reference); otherwise it is a **tie**, measured equal within the "
            "noise. Where neither has two seeds no noise is measured: **one seed** (no call); where only one side "
            "has two, the noise is that side's alone and the call is **provisional**. The papers' main "
            "tables use Transformer base (d_model 512, 6+6 layers, FFN 2048); every module runs at the paper's "
            "settings but where the config column says otherwise.",
            "",
        ]
        for pair in self.pairs:
            self.pair_section(pair)
        path = Path(args.report)
        kept = path.read_text().partition(NOTES_MARKER)[2] if path.is_file() else ""
        path.write_text("\n".join(self.lines) + f"\n{NOTES_MARKER}{kept or chr(10)}")
        if args.readme:
            self.write_readme(Path(args.readme), args.pairs[0])
        return path

    def write_readme(self, readme: Path, pair: str) -> None:
        """The BLEU and length-generalisation cells of the README's module table (the `attention` row is the
        baseline's model) from the first pair's results, and between its markers a summary of every pair's."""
        lines = readme.read_text().split("\n")
        if MODULE_TABLE_HEADER not in lines or SUMMARY_START not in lines or SUMMARY_END not in lines:
            raise ValueError(f"{readme} lacks the module table header or the results summary markers")
        start = lines.index(MODULE_TABLE_HEADER) + 2
        end = next((i for i in range(start, len(lines)) if not lines[i].startswith("| `")), len(lines))
        for i in range(start, end):
            cells = lines[i].split(" | ")
            name = cells[0].removeprefix("| ").strip("`")
            system = BASELINE if name == "attention" else name
            if system in SYSTEMS:
                bleu, length = self.module_cells(pair, system)
                cells[-2:] = [bleu, f"{length} |"]
                lines[i] = " | ".join(cells)
        first, last = lines.index(SUMMARY_START), lines.index(SUMMARY_END)
        lines[first + 1 : last] = [line for each in self.pairs for line in self.summary(each, each == pair)]
        readme.write_text("\n".join(lines))

    def module_cells(self, pair: str, system: str) -> tuple[str, str]:
        """(BLEU mean ± sd over seeds, share of the k = 1 BLEU kept at k = 4 with the length ratio)."""
        runs = self.runs_of(pair, system)
        if not runs:
            return "not run yet", "not run yet"
        bleu = [self.read(run, "scores.json")["bleu"] for run in runs]
        degenerate = sum(bool(self.degenerate(run)) for run in runs)
        results, _ = self.length_runs(pair, system)
        fourth = joined_at(results[0], 4)
        if fourth is not None and fourth["cannot"] is not None:
            length = f"k = 4: {cannot_cell(fourth['cannot'])}"
        elif (kept := kept_over_seeds(results, 4)) is None:
            length = "not measured at k = 4"
        else:
            length = f"k = 4: {kept_cell(kept[0])} of k = 1 BLEU, length ratio {kept[1]:.2f}"
        seeds = f"{len(bleu)} seed{'s' * (len(bleu) > 1)}" + (
            f", {degenerate} degenerate" if degenerate else ""
        )
        return f"{mean_sd(bleu)} ({seeds})", length

    def summary(self, pair: str, in_module_table: bool = True) -> list[str]:
        """The README's summary line of a pair; `in_module_table`: the README's module table shows this pair."""
        measured = {s.name: self.runs_of(pair, s.name) for s in TABLES["main"]}
        measured = {name: runs for name, runs in measured.items() if runs}
        if not measured:
            return [f"Comparison (`{self.args.recipe}`, {pair}): no run finished yet."]
        mean = {
            name: statistics.mean(self.read(r, "scores.json")["bleu"] for r in runs)
            for name, runs in measured.items()
        }
        best = max(mean, key=mean.get)
        counts = [len(runs) for runs in measured.values()]
        seeds = ", ".join(
            f"{counts.count(n)} with {n} seed{'s' * (n > 1)}" for n in sorted(set(counts), reverse=True)
        )
        baseline = f"`{BASELINE}` {mean[BASELINE]:.2f}" if BASELINE in mean else f"`{BASELINE}` not run yet"
        length = ""
        kept = {system: (cell, ratio) for _, cell, ratio, system in kept_at_4(*self.length_results(pair))}
        if kept:
            longest = next(iter(kept))  # kept_at_4 sorts best first
            shown = [longest] if longest == BASELINE or BASELINE not in kept else [longest, BASELINE]
            cells = [f"`{s}` {kept[s][0]} (length ratio {kept[s][1]:.2f})" for s in shown]
            length = (
                f" Inputs of 4 test sentences joined (over seeds), 1-sentence BLEU kept: {', '.join(cells)}."
            )
        return [
            f"- Comparison of every module (`{self.args.recipe}`, {pair}, test_2016_flickr, written "
            f"{time.strftime('%Y-%m-%d')}; {self.machines([pair])}): {len(measured)} of {len(TABLES['main'])} "
            f"main-table systems measured ({seeds}). Mean BLEU: {baseline}, "
            f"best `{best}` {mean[best]:.2f}.{length} "
            + (
                "BLEU and length generalisation per module: the table under [Positional modules](#positional-modules); "
                "tables, verdicts and the papers' claims: "
                if in_module_table
                else "Tables, verdicts and the papers' claims: "
            )
            + "[docs/results.md](docs/results.md).",
        ]

    def machines(self, pairs: list[str] | None = None) -> str:
        """The machines that trained the runs of `pairs` (default: every reported pair), with their counts."""
        lines = {}
        for run in (r for pair in pairs or self.pairs for s in SYSTEMS for r in self.runs_of(pair, s)):
            scores = self.read(run, "scores.json")
            key = f"{Hardware.from_record(scores['hardware']).line()}, {scores['precision']}"
            lines[key] = lines.get(key, 0) + 1
        counted = (f"{line} ({count} run{'s' if count != 1 else ''})" for line, count in lines.items())
        return "; ".join(counted) or "no run yet"

    def pair_section(self, pair: str) -> None:
        test = test_set(pair, self.args.test_limit)
        self.lines += [f"## {pair}", ""]
        shown, unrun = self.shown_tables(pair)
        for table in shown:
            self.table(pair, table, test.target)
        if unrun:
            self.lines += [f"Not run for {pair}: {'; '.join(TABLE_TITLES[t] for t in unrun)}.", ""]
        self.length_section(pair)
        self.claims(pair, test.target)
        self.probe_table(pair)
        self.sweep(pair, test.target)
        self.pictures(pair)

    def shown_tables(self, pair: str) -> tuple[list[str], list[str]]:
        """The tables of `--tables` shown for a pair, and those named in one line instead: the main table always
        shows, an ablation table once one of its own rows (not a main-table system) has a run for the pair."""
        main = {system.name for system in TABLES["main"]}
        unrun = [
            table for table in self.args.tables if table != "main"
            and not any(self.runs_of(pair, s.name) for s in TABLES[table] if s.name not in main)
        ]  # fmt: skip
        return [table for table in self.args.tables if table not in unrun], unrun

    def table(self, pair: str, table: str, references: list[str]) -> None:
        self.lines += [f"### {TABLE_TITLES[table]}", "", "| system | config | parameters | BLEU per seed | BLEU | Δ BLEU | "
                       "chrF++ | bootstrap vs sinusoidal (BLEU p per seed) | verdict |",
                       "| --- | --- | --- | --- | --- | --- | --- | --- | --- |"]  # fmt: skip
        notes: dict[str, list[str]] = {}  # footnote -> the runs it is about
        for system in TABLES[table]:
            overrides = "; ".join(
                [
                    ", ".join(f"{k}={v}" for k, v in {**system.overrides, **system.training}.items())
                    or "defaults"
                ]
                + paper_deviations(row_config(system, self.args.recipe))
            )
            runs, bleu, _, delta, tests, call = self.comparison(pair, system.name, BASELINE, references)
            if not runs:
                self.lines.append(f"| {system.name} | {overrides} | | not run | | | | | |")
                continue
            degenerate = {run.seed: symptoms for run in runs if (symptoms := self.degenerate(run))}
            if degenerate:
                call = "degenerate: " + "; ".join(f"seed {seed}: {s[0]}" for seed, s in degenerate.items())
            chrf = [self.read(run, "scores.json")["chrf++"] for run in runs]
            parameters = self.read(runs[0], "scores.json")["parameters"] / 1e6
            per_seed = " / ".join(
                f"{b:.2f}{self.marks(run, notes)}" for run, b in zip(runs, bleu, strict=True)
            )
            self.lines.append(
                f"| {system.name} | {overrides} | {parameters:.2f}M | {per_seed} | "
                f"{mean_sd(bleu)} | {'' if delta is None else f'{delta:+.2f}'} | {mean_sd(chrf)} | "
                f"{bootstrap_cell(tests)} | {call} |"
            )
        self.lines.append("")
        for mark, runs in notes.items():
            self.lines += [f"{mark}: {', '.join(runs)}.", ""]

    def marks(self, run: Run, notes: dict[str, list[str]]) -> str:
        """† for a run whose updates differ from its budget, ‡ for one trained on a GPU; `notes` collects the
        footnotes that say which runs and how."""
        scores, marks = self.read(run, "scores.json"), ""
        if self.budget is not None and scores["steps"] != self.budget:
            marks += "†"
            averaged = scores.get("averaged_checkpoints") or ["the final weights"]
            off = f"† {scores['steps']} updates against a budget of {self.budget}, {averaged[0]} to {averaged[-1]} averaged"
            notes.setdefault(off, []).append(f"`{run.system}` seed {run.seed}")
        if scores["hardware"]["device"] != "cpu":
            marks += "‡"
            notes.setdefault(f"‡ trained on {Hardware.from_record(scores['hardware']).line()}", []).append(
                f"`{run.system}` seed {run.seed}"
            )
        return marks

    def length_runs(self, pair: str, system: str) -> tuple[list[dict], bool]:
        """(the length-generalisation results of the system's runs that are not degenerate, False), or (those
        of all its runs, True) where every run is degenerate."""
        runs = self.runs_of(pair, system)
        sound = [run for run in runs if not self.degenerate(run)]
        return [self.read(run, "length_generalisation.json") for run in sound or runs], not sound

    def length_results(self, pair: str) -> tuple[dict[str, list[dict]], set[str]]:
        """Every seed's length-generalisation results (`length_runs`) of every system that has a run, and the
        systems whose every run is degenerate."""
        results, degenerate = {}, set()
        for system in SYSTEMS:
            if self.runs_of(pair, system):
                results[system], garbage = self.length_runs(pair, system)
                if garbage:
                    degenerate.add(system)
        return results, degenerate

    def length_section(self, pair: str) -> None:
        measured, degenerate = self.length_results(pair)
        if not measured:
            return
        results = {
            f"{s} (degenerate runs)" if s in degenerate else s: mean_over_seeds(r)
            for s, r in measured.items()
        }
        name = f"results_{pair}_length.png"
        plot_length_generalisation(
            results, self.docs / name, title=f"length generalisation, {pair}, mean over seeds"
        )
        buckets = f"results_{pair}_length_buckets.png"
        plot_length_generalisation(
            results,
            self.docs / buckets,
            series="buckets",
            title=f"source-length buckets, {pair}, mean over seeds",
        )
        kept = kept_at_4(measured, degenerate)
        ends = [
            f"`{s}` {sentence_ends(row)}"
            for s, result in results.items()
            if (row := joined_at(result, 4)) and row.get("hyp_sentence_ends") is not None
        ]
        meeting = [
            f"`{s}` ({cell}, ratio {ratio:.2f})"
            for share, cell, ratio, s in kept
            if share >= 0.7 and ratio >= 0.9
        ]
        self.lines += [
            "### Length generalisation (joined test sentences, every seed)",
            "",
            "k consecutive test sentences joined into one input (sources with sources, references with references); "
            "BLEU and hypothesis/reference length ratio per k, each the mean over the system's seeds (the tables "
            'above give their number; a degenerate run is left out). "cannot": the input needs more positions '
            "than the model's table holds. Share of the k = 1 BLEU kept at k = 4 (mean ± standard deviation of "
            "the seeds' shares), best first: "
            + ", ".join(f"`{s}` {cell} (ratio {ratio:.2f})" for _, cell, ratio, s in kept[:8])
            + ". Target (≥ 70% kept and length ratio ≥ 0.9 at k = 4): "
            + (", ".join(meeting) if meeting else "met by no system")
            + "."
            + (
                f" Sentence ends per input at k = 4 (hypotheses / references): {', '.join(ends)}."
                if ends
                else ""
            ),
            "",
            comparison_table(results),
            "",
            f"![length generalisation]({name})",
            "",
            "The plain test set by source length in tokens (the harness's default buckets, `--buckets 10 20 30 40`):",
            "",
            comparison_table(results, series="buckets"),
            "",
            f"![length buckets]({buckets})",
            "",
        ]

    def claims(self, pair: str, references: list[str]) -> None:
        self.lines += ["### The papers' claims", "", "| paper | claim | system vs reference | Δ BLEU | measured | verdict |",
                       "| --- | --- | --- | --- | --- | --- |"]  # fmt: skip
        for paper, claim, system, reference, expected in CLAIMS:
            if system not in SYSTEMS or reference not in SYSTEMS:
                self.lines.append(
                    f"| {paper} | {claim} | `{system}` vs `{reference}` | | | not in the tables |"
                )
                continue
            runs, _, _, delta, _, measured = self.comparison(pair, system, reference, references)
            if not runs or delta is None:
                self.lines.append(f"| {paper} | {claim} | `{system}` vs `{reference}` | | not run | |")
                continue
            self.lines.append(f"| {paper} | {claim} | `{system}` vs `{reference}` | {delta:+.2f} | {measured} | "
                              f"{claim_verdict(expected, measured)} |")  # fmt: skip
        for paper, claim, reason in UNTESTABLE_CLAIMS:
            self.lines.append(f"| {paper} | {claim} | | | {reason} | not testable here |")
        self.lines.append("")

    def probe_table(self, pair: str) -> None:
        self.lines += [
            "### Word-order probe of the trained models (paper 1 Eq. 9 vs 13)",
            "",
            f"First {self.args.probe_sentences} test sources, 2 permutations each, greedy decoding; every cell "
            "the mean over the system's seeds. Gap = ‖Enc(PX) − P·Enc(X)‖/‖Enc(X)‖ (0: the encoder cannot see word "
            "order); BLEU vs original = sacreBLEU of the permuted sources' translations against the original "
            "translations (100: order ignored).",
            "",
            "| system | seeds | BLEU | gap (shuffle) | gap (local swap) | BLEU vs original (shuffle) | BLEU vs original (local swap) |",
            "| --- | --- | --- | --- | --- | --- | --- |",
        ]  # fmt: skip
        for system in TABLES["main"]:
            runs = self.runs_of(pair, system.name)
            if not runs:
                continue
            probes = [self.read(run, "word_order_probe.json") for run in runs]
            cells = [
                f"{statistics.mean(probe[kind][name] for probe in probes):.{digits}f}"
                for name, digits in (("equivariance_gap", 3), ("bleu_vs_original", 1))
                for kind in ("shuffle", "local_swap")
            ]
            bleu = statistics.mean(self.read(run, "scores.json")["bleu"] for run in runs)
            self.lines.append(f"| {system.name} | {len(runs)} | {bleu:.2f} | {' | '.join(cells)} |")
        self.lines.append("")

    def sweep(self, pair: str, references: list[str]) -> None:
        candidates = {
            system.name: statistics.mean(self.read(run, "scores.json")["bleu"] for run in runs)
            for system in TABLES["main"]
            if system.name != BASELINE and (runs := self.runs_of(pair, system.name))
        }
        baseline_runs = self.runs_of(pair, BASELINE)
        if not candidates or not baseline_runs:
            return
        best = max(candidates, key=candidates.get)
        best_run = next((run for run in self.runs_of(pair, best) if run.seed == baseline_runs[0].seed), None)
        if best_run is None:
            return
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
        """What each main-table model learned about positions (first seed), drawn from its model folder when it
        is on this machine; a picture drawn earlier is kept otherwise."""
        pictures = []
        for system in TABLES["main"]:
            runs = self.runs_of(pair, system.name)
            if not runs:
                continue
            name = f"results_{pair}_{system.name}_positions.png"
            model_dir = runs[0].folder(self.args.models_dir)
            if (model_dir / "config.json").is_file():
                model = AutoModelForSeq2SeqLM.from_pretrained(model_dir)
                title = f"{system.name}, {pair}, seed {runs[0].seed}"
                if not plot_learned_positions(model, self.docs / name, title=title):
                    (self.docs / name).unlink(missing_ok=True)
            if (self.docs / name).is_file():
                pictures += [f"`{system.name}`:", "", f"![{system.name}]({name})", ""]
        if pictures:
            self.lines += ["### What the models learned about positions", "", *pictures]


def main(argv=None):
    args = parse_args(argv)
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(name)s: %(message)s")
    torch.set_num_threads(args.threads)
    args.run_precision = resolved_precision(args)
    runs = planned_runs(args)
    if not args.report_only:
        logger.info("%d runs planned, %d done before; %s", len(runs), sum(done(r, args) for r in runs),
                    describe_hardware("cuda" if torch.cuda.is_available() else "cpu").line())  # fmt: skip
        train_all(runs, args)
    logger.info("wrote %s (transformers %s)", Report(args).write(), transformers.__version__)


if __name__ == "__main__":
    run_cli(main)
