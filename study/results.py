"""The recorded results of finished runs: checked before anything reads them (`check_results`), and read for the
report (`Results`): the runs made with the report's settings, their scores, translations and the statistics that
compare two systems.
"""

import hashlib
import json
import logging
import math
import os
import statistics
from collections import Counter
from functools import cached_property
from pathlib import Path

import numpy as np
import sacrebleu

from hf_posenc.configuration_marian_posenc import MarianPosEncConfig
from hf_posenc.pipeline.data.cache import default_cache_dir
from hf_posenc.pipeline.data.files import read_lines
from hf_posenc.pipeline.evaluation.scoring import degenerate_output, paired_bootstrap
from hf_posenc.pipeline.training.arguments import load_recipe
from hf_posenc.pipeline.training.hardware import Hardware

from .bootstrap import bootstrap_gaps, percentile_interval, sentence_statistics
from .claims import CONFIDENCE, Interval, verdict
from .runs import SETTINGS, Run, data_settings, done
from .tables import SYSTEMS

logger = logging.getLogger(__name__)

# What a value must be, and how to tell.
KINDS = {
    "a number": lambda value: (
        isinstance(value, int | float) and not isinstance(value, bool) and math.isfinite(value)
    ),
    "a whole number": lambda value: isinstance(value, int) and not isinstance(value, bool),
    "text": lambda value: isinstance(value, str),
    "a list": lambda value: isinstance(value, list),
    "an object": lambda value: isinstance(value, dict),
}
KINDS["a number or null"] = lambda value: value is None or KINDS["a number"](value)
KINDS["an object or null"] = lambda value: value is None or isinstance(value, dict)

# The fields of each results file the report reads, and what each must be.
SCORES_FIELDS = {
    "bleu": "a number",
    "chrf++": "a number",
    "parameters": "a whole number",
    "steps": "a whole number",
    "hardware": "an object",
    "precision": "text",
}
HARDWARE_FIELDS = {"device": "text", "name": "text", "capability": "text", "threads": "a whole number"}
SETTINGS_FIELDS = {"train_arguments": "a list", "recipe": "an object", "length_k": "a list"}
PROBE_FIELDS = {"equivariance_gap": "a number", "bleu_vs_original": "a number"}
PROBE_KINDS = ("shuffle", "local_swap")
KERNEL_NAMES = {
    "eager": "eager",
    "sdpa": "SDPA",
}  # scores.json's attention_backend -> how the report names it
LENGTH_SERIES = {"joined": "k", "buckets": "bucket"}  # series -> the field that labels its rows
LENGTH_ROW_FIELDS = {
    "inputs": "a whole number",
    "bleu": "a number or null",
    "length_ratio": "a number or null",
    "cannot": "an object or null",
}


def finished_runs(root: Path, recipe: str) -> list[Path]:
    """The folders of the runs of `recipe` under `root` that finished (they hold settings.json)."""
    return sorted(settings.parent for settings in Path(root).joinpath(recipe).glob(f"*/*/seed*/{SETTINGS}"))


def check_results(root: Path, recipe: str) -> int:
    """Check every finished run of `recipe` under `root` before anything is read or written; raise a ValueError
    naming each bad file and what is wrong with it. Returns the number of finished runs."""
    folders = finished_runs(root, recipe)
    problems = [problem for folder in folders for problem in run_problems(folder)]
    if problems:
        raise ValueError(
            f"{len(problems)} problem{'s' * (len(problems) > 1)} in the results under {root}:\n  "
            + "\n  ".join(problems)
        )
    return len(folders)


def run_problems(folder: Path) -> list[str]:
    """What is wrong with the files of one finished run, each as '<file>: <what>'."""
    problems, records = [], {}
    checks = {
        SETTINGS: lambda record: field_problems(record, SETTINGS_FIELDS),
        "scores.json": scores_problems,
        "length_generalisation.json": length_problems,
        "word_order_probe.json": probe_problems,
    }
    for name, check in checks.items():
        path = folder / name
        try:
            records[name] = json.loads(path.read_text())
        except FileNotFoundError:
            problems.append(f"{path}: missing (every finished run has it)")
            continue
        except (ValueError, UnicodeDecodeError) as error:
            problems.append(f"{path}: not JSON ({error})")
            continue
        problems += [f"{path}: {problem}" for problem in check(records[name])]
    target_lang = folder.parents[1].name.rpartition("-")[2]
    hypotheses = folder / f"test.hyp.{target_lang}.gz"
    if not hypotheses.is_file():
        return [*problems, f"{hypotheses}: missing (every finished run has its test translations)"]
    try:
        count = len(read_lines(hypotheses))
    except (OSError, EOFError, ValueError) as error:
        return [*problems, f"{hypotheses}: unreadable ({error})"]
    scores = records.get("scores.json")
    expected = scores.get("test_pairs") if isinstance(scores, dict) else None
    if isinstance(expected, int) and count != expected:
        problems.append(f"{hypotheses}: {count} translations, but scores.json has {expected} test pairs")
    return problems


def field_problems(record, fields: dict[str, str], where: str = "") -> list[str]:
    """The fields of `record` (a JSON value) that are missing or not of their kind; `where` names the part."""
    if not isinstance(record, dict):
        return [f"{where.strip() or 'the file'} is {json.dumps(record)[:40]}, must be an object"]
    problems = []
    for name, kind in fields.items():
        if name not in record:
            problems.append(f"{where}{name!r} is missing")
        elif not KINDS[kind](record[name]):
            problems.append(f"{where}{name!r} is {json.dumps(record[name])[:40]}, must be {kind}")
    return problems


def scores_problems(scores) -> list[str]:
    problems = field_problems(scores, SCORES_FIELDS)
    return problems or field_problems(scores["hardware"], HARDWARE_FIELDS, "hardware ")


def probe_problems(probe) -> list[str]:
    problems = field_problems(probe, dict.fromkeys(PROBE_KINDS, "an object"))
    if not problems:
        for kind in PROBE_KINDS:
            problems += field_problems(probe[kind], PROBE_FIELDS, f"{kind} ")
    return problems


def length_problems(length) -> list[str]:
    problems = field_problems(length, dict.fromkeys(LENGTH_SERIES, "a list"))
    if problems:
        return problems
    for series, label in LENGTH_SERIES.items():
        fields = {label: "a whole number" if label == "k" else "text", **LENGTH_ROW_FIELDS}
        for index, row in enumerate(length[series]):
            problems += field_problems(row, fields, f"{series}[{index}] ")
    if not problems and not any(row["k"] == 1 for row in length["joined"]):
        problems.append(
            "'joined' has no row with k = 1 (the plain test set the other rows are measured against)"
        )
    return problems


def table_lines(header: list[str]) -> list[str]:
    """A markdown table's header and rule."""
    return ["| " + " | ".join(header) + " |", "|" + " --- |" * len(header)]


def mean_sd(values: list[float]) -> str:
    if len(values) < 2:
        return f"{values[0]:.2f}"
    return f"{statistics.mean(values):.2f} ± {statistics.stdev(values):.2f}"


def precisions(scores: dict) -> str:
    """'trained in fp32, decoded in bf16': a run's training autocast and its decoding precision. A run recorded
    without `training_autocast` trained in fp32 whatever its `precision` says: train.py did not apply bf16 or
    fp16 to the training step until 2026-11-27 (its decoding did use them)."""
    autocast = scores.get("training_autocast", "no")
    trained = "fp32" if autocast == "no" else autocast
    return f"trained in {trained}, decoded in {scores['precision']}"


def kept_paired_bootstrap(
    baseline: list[str], system: list[str], references: list[str], samples: int
) -> dict:
    """`paired_bootstrap`, kept on disk under the data cache folder (`paired-bootstrap/`): sacreBLEU seeds its
    resampling ($SACREBLEU_SEED, 12345 unset), so the same texts, samples, seed and versions of sacreBLEU and
    numpy give the same result, and a report rebuilt after a few new runs computes only theirs. An unseeded
    resampling is not kept; an unreadable entry is computed again; a cache that cannot be written is warned of."""
    seed = os.environ.get("SACREBLEU_SEED", "12345")
    if seed.lower() == "none":
        return paired_bootstrap(baseline, system, references, samples)
    key = json.dumps([baseline, system, references, samples, seed, sacrebleu.__version__, np.__version__])
    path = default_cache_dir() / "paired-bootstrap" / f"{hashlib.sha256(key.encode()).hexdigest()}.json"
    try:
        return json.loads(path.read_text())
    except (OSError, ValueError):
        pass
    result = paired_bootstrap(baseline, system, references, samples)
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        staged = path.with_suffix(f".{os.getpid()}.partial")
        staged.write_text(json.dumps(result))
        staged.replace(path)
    except OSError as error:
        logger.warning(
            "the paired bootstrap cannot be kept in %s (%s): it is computed again next time", path, error
        )
    return result


class Results:
    """The finished runs of one recipe in the results folder, read for a report: every pair of `--pairs` or with a
    finished run there, every seed of `--seeds` or finished there (a chunk that trains some seeds or pairs
    reports all of them). A run made with other settings than the report's is left out."""

    def __init__(self, args):
        self.args = args
        self.root = Path(args.results_dir)
        self.bootstraps: dict[tuple[Run, Run], dict] = {}
        self.symptoms: dict[Run, list[str]] = {}  # `degenerate`, once per run
        self.sentence_statistics: dict[Run, np.ndarray] = {}
        self.intervals: dict[tuple[str, str, str], Interval | None] = {}
        self.groups: dict[tuple[Run, int], object] = {}  # `extrapolation.groups`, once per run and k
        self.current: dict[Run, bool] = {}  # finished run -> made with this report's settings
        finished = finished_runs(self.root, args.recipe)
        self.seeds = sorted({*args.seeds, *(int(folder.name.removeprefix("seed")) for folder in finished)})
        self.pairs = [*args.pairs, *sorted({folder.parents[1].name for folder in finished} - set(args.pairs))]
        recipe = load_recipe(args.recipe)
        # every reported run's update budget (its settings match this report's); None under a time budget
        self.budget = args.max_steps or (None if recipe.get("minutes") else recipe.get("max_steps"))
        self.test_split = data_settings(args.recipe).test_split

    def runs_of(self, pair: str, system: str) -> list[Run]:
        """The finished runs made with this report's settings; a run of another protocol (a changed recipe or
        training option) is left out with a warning, so that no table mixes protocols."""
        runs = [Run(self.args.recipe, pair, system, seed) for seed in self.seeds]
        for run in runs:
            if run not in self.current and (run.folder(self.root) / SETTINGS).is_file():
                self.current[run] = done(run, self.args)
                if not self.current[run]:
                    logger.warning(
                        "%s: left out, made with settings other than this report's (see its settings.json)",
                        run.label(),
                    )
        return [run for run in runs if self.current.get(run)]

    def read(self, run: Run, name: str) -> dict:
        return json.loads((run.folder(self.root) / name).read_text())

    def bleu(self, run: Run) -> float:
        return self.read(run, "scores.json")["bleu"]

    def hypotheses(self, run: Run) -> list[str]:
        return read_lines(run.folder(self.root) / f"test.hyp.{run.target_lang}.gz")

    def degenerate(self, run: Run) -> list[str]:
        """The symptoms of garbage output (`degenerate_output`), recomputed from the run's translations once."""
        if run not in self.symptoms:
            encoding = SYSTEMS[run.system].overrides.get(
                "encoder_position_encoding", MarianPosEncConfig().encoder_position_encoding
            )
            reasons = degenerate_output(self.hypotheses(run), self.bleu(run), encoding)
            self.symptoms[run] = [reason for reason in reasons if not reason.startswith("likely cause")]
        return self.symptoms[run]

    def bootstrap(self, run: Run, reference: Run, references: list[str]) -> dict:
        """Paired bootstrap of `run` against `reference` (same seed), once per pair of runs."""
        if (run, reference) not in self.bootstraps:
            self.bootstraps[run, reference] = kept_paired_bootstrap(
                self.hypotheses(reference), self.hypotheses(run), references, self.args.bootstrap_samples
            )
        return self.bootstraps[run, reference]

    def paired(self, pair: str, system: str, reference: str) -> tuple[list[Run], dict[int, Run]]:
        """The system's runs whose seed the reference has too, and the reference's runs by seed."""
        base = {run.seed: run for run in self.runs_of(pair, reference)}
        return [run for run in self.runs_of(pair, system) if run.seed in base], base

    def comparison(self, pair: str, system: str, reference: str, references: list[str]):
        """(runs, BLEU per seed, reference BLEU per seed, delta, bootstrap tests, verdict) of two systems: delta and
        bootstrap over the seeds both have."""
        runs, reference_runs = self.runs_of(pair, system), self.runs_of(pair, reference)
        bleu = [self.bleu(run) for run in runs]
        base_bleu = [self.bleu(run) for run in reference_runs]
        if system == reference:
            return runs, bleu, base_bleu, None, [], verdict(None, bleu, base_bleu, [])
        paired, base = self.paired(pair, system, reference)
        if not paired:
            return runs, bleu, base_bleu, None, [], f"no {reference} run of these seeds"
        tests = [self.bootstrap(run, base[run.seed], references) for run in paired]
        delta = statistics.mean(map(self.bleu, paired)) - statistics.mean(
            self.bleu(base[r.seed]) for r in paired
        )
        return runs, bleu, base_bleu, delta, tests, verdict(delta, bleu, base_bleu, tests)

    def statistics(self, run: Run, references: list[str]) -> np.ndarray:
        """The run's per-sentence BLEU statistics (`bootstrap.sentence_statistics`), once per run."""
        if run not in self.sentence_statistics:
            self.sentence_statistics[run] = sentence_statistics(self.hypotheses(run), references)
        return self.sentence_statistics[run]

    def interval(self, pair: str, system: str, reference: str, references: list[str]) -> Interval | None:
        """The seeds × sentences bootstrap interval (`bootstrap.py`, `CONFIDENCE`) of the gap system − reference
        over the seeds both have, once per pair of systems; None with fewer than two such seeds (one seed shows
        no seed noise)."""
        key = (pair, system, reference)
        if key not in self.intervals:
            paired, base = self.paired(pair, system, reference)
            self.intervals[key] = None
            if len(paired) >= 2:
                gaps = bootstrap_gaps(
                    [self.statistics(run, references) for run in paired],
                    [self.statistics(base[run.seed], references) for run in paired],
                    self.args.bootstrap_samples,
                )
                self.intervals[key] = Interval(*percentile_interval(gaps, CONFIDENCE), len(paired))
        return self.intervals[key]

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

    def scores(self, pairs: list[str] | None = None) -> list[dict]:
        """The scores.json of every run of `pairs` (default: every reported pair)."""
        runs = (r for pair in pairs or self.pairs for s in SYSTEMS for r in self.runs_of(pair, s))
        return [self.read(run, "scores.json") for run in runs]

    def machines(self, pairs: list[str] | None = None) -> str:
        """The machines that trained the runs of `pairs` (default: every reported pair), with their counts."""
        lines = Counter(
            f"{Hardware.from_record(scores['hardware']).line()}, {precisions(scores)}"
            for scores in self.scores(pairs)
        )
        counted = (f"{line} ({count} run{'s' * (count != 1)})" for line, count in lines.items())
        return "; ".join(counted) or "no run yet"

    def kernels(self) -> str:
        """The attention kernels of the report's runs, with their counts: 'eager (107 runs), SDPA (45 runs)'."""
        kernels = Counter(scores.get("attention_backend") or "not recorded" for scores in self.scores())
        counted = (f"{KERNEL_NAMES.get(k, k)} ({n} run{'s' * (n != 1)})" for k, n in kernels.most_common())
        return ", ".join(counted) or "no run yet"

    @cached_property
    def usual(self) -> tuple[int | None, dict[str, str]]:
        """The thread count most of the report's runs trained with, and per device type (cpu, cuda) the attention
        kernel most of its runs used (runs from before the kernel was recorded do not count): a run that differs
        is marked in the tables."""
        records = self.scores()
        threads = Counter(scores["hardware"]["threads"] for scores in records).most_common(1)
        kernels: dict[str, Counter] = {}
        for scores in records:
            if scores.get("attention_backend"):
                kernels.setdefault(scores["hardware"]["device"], Counter())[scores["attention_backend"]] += 1
        usual_kernels = {device: count.most_common(1)[0][0] for device, count in kernels.items()}
        return (threads[0][0] if threads else None), usual_kernels
