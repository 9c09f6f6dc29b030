"""The comparison's runs: one system, language pair and seed under one recipe, planned seed by seed, trained by
train.py, measured, and recorded under `<results>/<recipe>/<pair>/<system>/seed<N>/`.

Runs execute in worker processes, `--jobs` at a time, one run at a time in each: the worker starts train.py in a
process of its own (its log beside the model folder), then loads the trained model and measures it (the
word-order probe, paper 1 Eq. 9/13, and the length-generalisation harness). No two runs share an interpreter,
so nothing process-wide (transformers' loading patches, torch's thread count) is shared between them.
"""

import gzip
import json
import logging
import multiprocessing
import shutil
import subprocess
import sys
import time
from concurrent.futures import ProcessPoolExecutor, as_completed
from dataclasses import MISSING, dataclass, fields
from pathlib import Path

import torch
from transformers import AutoTokenizer

from hf_posenc.analysis.length_generalisation import (
    DEFAULT_BUCKET_EDGES,
    check_group_sizes,
    join_consecutive,
    measure_length_generalisation,
    text_fingerprint,
)
from hf_posenc.analysis.word_order_probe import word_order_probe
from hf_posenc.attention_windows import measure_token_ratio
from hf_posenc.configuration_marian_posenc import RENAMED_FIELDS
from hf_posenc.generation_length import (
    NEEDS_SENTENCE_ENDS,
    measure_min_length_ratio,
    sentence_end_token_ids,
)
from hf_posenc.pipeline.data.files import read_split
from hf_posenc.pipeline.evaluation.decoding import load_translation_model, translate
from hf_posenc.pipeline.evaluation.scoring import score_translations
from hf_posenc.pipeline.training.arguments import ARGUMENT_CLASSES, load_recipe
from hf_posenc.pipeline.training.arguments import parse_args as parse_train_args
from hf_posenc.pipeline.training.hardware import choose_precision, keep_freed_memory

from .tables import DECODING, SYSTEMS, TABLES, TRAINING_RATIO, length_k, training_flags

logger = logging.getLogger(__name__)
LOG_FORMAT = "%(asctime)s %(name)s: %(message)s"
TRAIN_COMMAND = ("-m", "hf_posenc.pipeline.training.run")  # train.py, run from the installed package
SETTINGS = "settings.json"  # written last: a run folder that holds it is finished
# What a run wrote for the inputs of k joined test sentences (the length harness keeps only their scores).
JOINED_TRANSLATIONS = "length.hyp.k{k}.{lang}.gz"


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
    """The precision every run trains and decodes in: `--precision`, else the recipe's; for auto the faster on
    this machine at the recipe's model shapes (measured once, so that a loaded machine cannot split the runs)."""
    recipe = load_recipe(args.recipe)
    device = "cuda" if torch.cuda.is_available() else "cpu"
    requested = args.precision or recipe.get("precision", "auto")
    choice = choose_precision(requested, device, recipe.get("d_model", 512), recipe.get("ffn_dim", 2048))
    logger.info("every run: %s", choice.line())
    return choice.precision


def train_arguments(run: Run, args) -> list[str]:
    """train.py's arguments for a run that decide its results (output folder, threads and precision are added
    by `execute`: a run's precision is recorded in its scores, and runs of earlier machines are kept)."""
    system = SYSTEMS[run.system]
    budget = ["--max_steps", str(args.max_steps)] if args.max_steps else []
    budget += ["--test_limit", str(args.test_limit)] if args.test_limit else []
    pair = ["--source_lang", run.source_lang, "--target_lang", run.target_lang]
    quiet = ["--examples", "0", "--fail_on_degenerate", "false"]  # the report judges degenerate output
    model = ["--config_overrides", json.dumps(system.overrides), *training_flags(system)]
    return [
        "--recipe",
        run.recipe,
        *pair,
        "--seed",
        str(run.seed),
        *budget,
        *quiet,
        *model,
        *args.train_args.split(),
    ]


def trained_run(run: Run) -> Run:
    """The run whose trained model `run` measures: itself, or for a decode-time row the run of the row it decodes."""
    decoding = DECODING.get(run.system)
    return run if decoding is None else Run(run.recipe, run.pair, decoding.trained_as, run.seed)


def run_settings(run: Run, args) -> dict:
    """What a finished run is recognised by: its train.py arguments, the recipe's contents, the settings of its
    measurements, and for a decode-time row those of the row it decodes and its decoding."""
    if (decoding := DECODING.get(run.system)) is not None:
        return {**run_settings(trained_run(run), args), "decoding": {**vars(decoding)}}
    return {
        "train_arguments": train_arguments(run, args),
        "recipe": load_recipe(run.recipe),
        "length_k": args.length_k or length_k(run.system),
        "probe_sentences": args.probe_sentences,
    }


def done(run: Run, args) -> bool:
    """The run finished with the settings it would run with now."""
    settings = run.folder(args.results_dir) / SETTINGS
    recorded = settings.is_file() and comparable(json.loads(settings.read_text()))
    return recorded == comparable(run_settings(run, args))


def comparable(settings: dict) -> dict:
    """A run's settings but for recipe fields set to train.py's default, and config fields under their current
    names: a recipe that starts naming a default (`schedule: fixed`) or the precision its runs trained in, or a
    study row that takes up a renamed field's new name (`position_attention_gating` for `posnet_gating`),
    changes no run and keeps its finished ones."""
    arguments = list(settings["train_arguments"])
    for index, argument in enumerate(arguments[:-1]):
        if argument == "--config_overrides":
            overrides = json.loads(arguments[index + 1])
            arguments[index + 1] = {
                RENAMED_FIELDS.get(name, name): value for name, value in overrides.items()
            }
    # every recorded run trained in fp32, the precision the comparison recipes now name: train.py did not apply
    # the bf16 it recorded until 2026-11-27, so a recipe recorded without a precision ran in fp32
    recipe = {"precision": "fp32", **settings["recipe"]}
    return {**settings, "train_arguments": arguments, "recipe": explicit_fields(recipe)}


def explicit_fields(recipe: dict) -> dict:
    """A recipe's fields but those set to the default of their train.py setting."""
    defaults = {
        f.name: f.default for cls in ARGUMENT_CLASSES for f in fields(cls) if f.default is not MISSING
    }
    return {name: value for name, value in recipe.items() if name not in defaults or value != defaults[name]}


def data_settings(recipe: str):
    """The data settings train.py runs `recipe` with (`DataArguments`: its data folder, test split, ...)."""
    return parse_train_args(["--recipe", recipe]).data


def test_set(recipe: str, pair: str, limit: int | None = None):
    """The test split train.py scores a run of `recipe` on."""
    data = data_settings(recipe)
    return read_split(Path(data.data_dir), data.test_split, *pair.split("-"), limit=limit)


def train_all(runs: list[Run], args) -> None:
    """Train and measure every run that is not done, `--jobs` at a time in worker processes."""
    pending = []
    for run in runs:
        if done(run, args):
            logger.info("%s: done before", run.label())
        else:
            pending.append(run)
    if not pending:
        return
    deadline = time.time() + args.stop_after_minutes * 60 if args.stop_after_minutes else None
    workers = ProcessPoolExecutor(
        max_workers=min(args.jobs, len(pending)),
        mp_context=multiprocessing.get_context("spawn"),  # a fresh interpreter, not a copy of this one
        initializer=start_worker,
        initargs=(args.threads,),
    )
    try:
        with workers:
            for finished in as_completed([workers.submit(execute, run, args, deadline) for run in pending]):
                logger.info(finished.result())
    except KeyboardInterrupt:  # Ctrl-C reaches the workers' train.py processes too
        raise KeyboardInterrupt(
            "the runs that finished are recorded; the same command continues the others, each from its last "
            "complete checkpoint"
        ) from None


def start_worker(threads: int) -> None:
    torch.set_num_threads(threads)
    logging.basicConfig(level=logging.INFO, format=LOG_FORMAT)


def execute(run: Run, args, deadline: float | None = None) -> str:
    """Train, measure and record one run (in a worker process); resumes from its last complete checkpoint. No
    run starts after `deadline` (seconds since the epoch)."""
    if deadline is not None and time.time() > deadline:
        return f"{run.label()}: not started (--stop_after_minutes)"
    if run.system in DECODING:
        return execute_decoding(run, args)
    models, results = run.folder(args.models_dir), run.folder(args.results_dir)
    checkpoints = Path(f"{models}-checkpoints")
    if any(checkpoints.glob("checkpoint-*/trainer_state.json")):
        start = ["--resume_from_checkpoint", "last"]
    else:
        start = ["--overwrite_output_dir"]  # a run without a complete checkpoint starts again
    machine = ["--threads", str(args.threads), "--precision", args.run_precision, "--output_dir", str(models)]
    models.parent.mkdir(parents=True, exist_ok=True)
    started = time.monotonic()
    with open(f"{models}.train.log", "w") as log:
        command = [sys.executable, *TRAIN_COMMAND, *train_arguments(run, args), *machine, *start]
        process = subprocess.run(command, stdout=log, stderr=log)
    if process.returncode != 0:  # the log's last line: train.py's one-line error, or a traceback's end
        last = next(reversed(Path(f"{models}.train.log").read_text().strip().splitlines()), "")
        return f"{run.label()}: FAILED (exit {process.returncode}): {last} (see {models}.train.log)"
    measure(run, models, results, args)
    shutil.rmtree(checkpoints)  # the averaged model is in the model folder; checkpoints are 5 x model + Adam
    minutes = (time.monotonic() - started) / 60
    bleu = json.loads((results / "scores.json").read_text())["bleu"]
    return f"{run.label()}: BLEU {bleu:.2f} in {minutes:.1f} min"


def execute_decoding(run: Run, args) -> str:
    """Measure a decode-time row on the trained model of the row it decodes, once that model exists."""
    trained = trained_run(run)
    models = trained.folder(args.models_dir)
    if not done(trained, args):
        return f"{run.label()}: not started: {trained.label()} is not trained yet (run the command again after it)"
    if not (models / "config.json").is_file():
        return (
            f"{run.label()}: not started: {trained.label()} is recorded as finished but its model folder {models} "
            f"is gone (models are not tracked): train it again into --models_dir with its results written "
            f"elsewhere (--systems {trained.system} --seeds {trained.seed} --results_dir SCRATCH), then run this "
            f"command again"
        )
    started = time.monotonic()
    measure(run, models, run.folder(args.results_dir), args)
    bleu = json.loads((run.folder(args.results_dir) / "scores.json").read_text())["bleu"]
    return f"{run.label()}: BLEU {bleu:.2f} in {(time.monotonic() - started) / 60:.1f} min (decoding only)"


def training_lengths(run: Run, tokenizer) -> list[list[int]]:
    """The token lengths (with `</s>`) of the training pairs of a run's recipe and pair under `tokenizer`: the
    sources', then the targets'."""
    data = data_settings(run.recipe)
    pairs = read_split(Path(data.data_dir), data.train_split, run.source_lang, run.target_lang)
    return [[len(ids) for ids in tokenizer(texts)["input_ids"]] for texts in (pairs.source, pairs.target)]


def generate_settings(run: Run, tokenizer) -> dict:
    """A run's generation settings: none of its own for a trained row; a decode-time row's, with a
    `min_length_ratio` of `TRAINING_RATIO` measured on the training pairs of its recipe and pair with the model's
    tokenizer, as train.py --length_control measures it, and with `match_source_sentence_count` or
    `window_sentences` the tokenizer's sentence ends without continuation tokens: every sentence-end token ends a
    sentence, as when the rows were recorded (docs/length.md)."""
    decoding = DECODING.get(run.system)
    if decoding is None:
        return {}
    settings = dict(decoding.generate)
    if settings.get("min_length_ratio") == TRAINING_RATIO:
        settings["min_length_ratio"] = measure_min_length_ratio(*training_lengths(run, tokenizer))
    if any(settings.get(key) for key in NEEDS_SENTENCE_ENDS):
        settings["sentence_end_token_ids"] = sentence_end_token_ids(tokenizer)
    return settings


def decoding_config(run: Run, models: Path) -> dict:
    """The config fields a decode-time row loads its model with, a `cross_attention_window_ratio` of
    `TRAINING_RATIO` measured on the training pairs with the model's tokenizer (docs/length.md); none for a
    trained row."""
    decoding = DECODING.get(run.system)
    config = dict(decoding.config) if decoding else {}
    if config.get("cross_attention_window_ratio") == TRAINING_RATIO:
        tokenizer = AutoTokenizer.from_pretrained(models)
        config["cross_attention_window_ratio"] = measure_token_ratio(*training_lengths(run, tokenizer))
    return config


def decoded_test_set(run: Run, models: Path, results: Path, test, bf16: bool, decoder) -> None:
    """A decode-time row's own test translations and scores: the trained row's scores.json with BLEU, chrF++ and
    their signatures from this row's decoding, and the decoding recorded: as the row names it (`decoding`) and
    with the values it measured (`decoded_with`: the config fields and generation settings it decoded with)."""
    model, tokenizer, decoded_with = decoder
    hypotheses = translate(model, tokenizer, test.source, bf16=bf16, **decoded_with["generate"])
    scores = json.loads((models / "scores.json").read_text())
    scores.update(score_translations(hypotheses, test.target), decoding=vars(DECODING[run.system]))
    scores["decoded_with"] = decoded_with
    (results / "scores.json").write_text(json.dumps(scores, indent=2) + "\n")
    text = "".join(f"{line}\n" for line in hypotheses).encode()
    (results / f"test.hyp.{run.target_lang}.gz").write_bytes(gzip.compress(text, mtime=0))


def measure(run: Run, models: Path, results: Path, args) -> None:
    """The probe and the length harness on the trained model; then the run's small results into `results`,
    settings.json last (it marks the run finished)."""
    test = test_set(run.recipe, run.pair, args.test_limit)
    bf16 = args.run_precision == "bf16"
    decoding = DECODING.get(run.system)
    config = decoding_config(run, models)
    model, tokenizer = load_translation_model(models, **config)
    if torch.cuda.is_available():
        model = model.cuda()
    keep_freed_memory(model.device)  # as train.py's default --cpu_memory reuse: no page faults at every step
    decoder = (model, tokenizer, {"config": config, "generate": generate_settings(run, tokenizer)})
    sources = test.source[: args.probe_sentences]
    probes = word_order_probe(
        model, tokenizer, sources, num_permutations=2, num_beams=1, max_new_tokens=64, bf16=bf16
    )
    length, joined = length_harness(decoder, test, run_settings(run, args)["length_k"], bf16)
    results.mkdir(parents=True, exist_ok=True)
    probe = {"sentences": args.probe_sentences, **{p.kind: vars(p) for p in probes}}
    (results / "word_order_probe.json").write_text(json.dumps(probe, indent=2) + "\n")
    (results / "length_generalisation.json").write_text(json.dumps(length, indent=2) + "\n")
    for k, hypotheses in joined.items():
        text = "".join(f"{line}\n" for line in hypotheses).encode()
        (results / JOINED_TRANSLATIONS.format(k=k, lang=run.target_lang)).write_bytes(
            gzip.compress(text, mtime=0)
        )
    if decoding is None:
        shutil.copy(models / "scores.json", results / "scores.json")
        hypotheses = (models / f"test.hyp.{run.target_lang}").read_bytes()
        (results / f"test.hyp.{run.target_lang}.gz").write_bytes(gzip.compress(hypotheses, mtime=0))
    else:
        decoded_test_set(run, models, results, test, bf16, decoder)
    (results / SETTINGS).write_text(json.dumps(run_settings(run, args), indent=2) + "\n")


def length_harness(decoder, test, k: list[int], bf16: bool) -> tuple[dict, dict[int, list[str]]]:
    """The length harness (`analysis.length_generalisation`, as its `length_generalisation_for_model_dir` runs
    it, with the same settings record) on the trained model, and what the model wrote for the inputs of every
    k > 1 joined sentences: the harness keeps only their scores, and the translations are what shows how a model
    fails there (one sentence written for four). A k whose inputs need more positions than the model holds has
    no translations. `decoder`: the model, its tokenizer and the row's decoding (a decode-time row's its own)."""
    model, tokenizer, decoded_with = decoder
    generate = decoded_with["generate"]
    inputs = {tuple(join_consecutive(test.source, test.target, size)[0]): size for size in k if size > 1}
    written: dict[int, list[str]] = {}

    def translator(sources: list[str]) -> list[str]:
        hypotheses = translate(model, tokenizer, sources, bf16=bf16, **generate)
        if (size := inputs.get(tuple(sources))) is not None:
            written[size] = hypotheses
        return hypotheses

    def count_tokens(sources: list[str]) -> list[int]:
        return [len(ids) for ids in tokenizer(sources)["input_ids"]]

    result = measure_length_generalisation(translator, count_tokens, test.source, test.target, k)
    result["max_position_embeddings"] = getattr(model.config, "max_position_embeddings", None)
    settings = {
        "text_sha256": text_fingerprint(test.source, test.target),
        "k": check_group_sizes(k),
        "bucket_edges": list(DEFAULT_BUCKET_EDGES),
        "bf16": bf16,
    }
    return {"settings": settings, **result}, written
