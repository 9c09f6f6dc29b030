"""The wheel works anywhere: built once from this checkout and installed into fresh virtual environments (no
system site packages), one per install (the base install, `[export]`, `[train]`), every console command runs
from a folder outside the checkout with the data root from `HF_POSENC_DATA`; a command whose extra the install
lacks refuses in one line that names the extra (`pip install 'hf_posenc[<extra>]'`), without a traceback.

Each install is a fresh environment holding exactly its extra, so that a command importing a module of another
extra (a plot library in training, CTranslate2 in evaluation) fails here as it would for a user. The wheel's
dependencies are downloaded once into a wheelhouse and each environment installs from it alone, with torch
pinned to the build this suite runs on (the CPU wheel on the machine: the range of pyproject.toml would let pip
take a CUDA build from PyPI). The three installs run side by side in the background while the first
environment's commands run; every command runs in a clean environment (no PYTHONPATH, an empty Hugging Face
cache, offline) and may write bytecode (the installs skip compiling, which would compile all of torch).
"""

import json
import os
import shutil
import subprocess
import sys
import tomllib
import zipfile
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import pytest
import torch
from safetensors.torch import load_file

from tests.helpers import REPO

PACKAGE = "hf_posenc"
# What a source distribution of the package holds: the wheel is built from a copy of these, so that nothing
# else in the checkout (an old build/ folder, tests, the study) can reach the wheel.
SOURCE_PATHS = ("pyproject.toml", "README.md", "LICENSE", PACKAGE)
EXTRAS = ("base", "export", "train")
COMMANDS = ("hf-posenc-train", "hf-posenc-evaluate", "hf-posenc-average", "hf-posenc-export")
# The extra each command needs (pyproject.toml's extras; hf_posenc/pipeline/cli.py).
NEEDS = {
    "hf-posenc-train": "train",
    "hf-posenc-evaluate": "train",
    "hf-posenc-average": "base",
    "hf-posenc-export": "export",
}
COMMAND_SECONDS = 600  # the longest command: the training run's start, a few updates and its evaluation
TINY_TRAINING = [
    "--recipe", "multi30k-en-de-tiny", "--max_steps", "4", "--minutes", "0", "--train_limit", "200",
    "--test_limit", "4", "--d_model", "32", "--layers", "1", "--heads", "2", "--ffn_dim", "32",
    "--vocab_size", "200", "--precision", "fp32", "--attention_backend", "eager", "--threads", "1",
    "--examples", "0", "--fail_on_degenerate", "false",
]  # fmt: skip

# Writes, with the installed package only, a tiny model with a word-level tokenizer into each folder given
# (seeds 0, 1, ...), and prints where the package was imported from.
WRITE_MODELS = """
import sys
import torch
import hf_posenc
from tokenizers import Tokenizer, models, pre_tokenizers, processors
from transformers import PreTrainedTokenizerFast
from hf_posenc import MarianPosEncConfig, MarianPosEncForConditionalGeneration

words = "a dog man woman runs sits on the grass ein hund mann frau läuft sitzt auf dem gras".split()
vocab = {"<pad>": 0, "</s>": 1, "<unk>": 2, **{word: 3 + index for index, word in enumerate(words)}}
backend = Tokenizer(models.WordLevel(vocab, unk_token="<unk>"))
backend.pre_tokenizer = pre_tokenizers.WhitespaceSplit()
backend.post_processor = processors.TemplateProcessing(single="$A </s>", special_tokens=[("</s>", 1)])
tokenizer = PreTrainedTokenizerFast(tokenizer_object=backend, pad_token="<pad>", eos_token="</s>", unk_token="<unk>")
config = MarianPosEncConfig(
    vocab_size=len(vocab), d_model=16, encoder_layers=1, decoder_layers=1, encoder_attention_heads=2,
    decoder_attention_heads=2, encoder_ffn_dim=16, decoder_ffn_dim=16, max_position_embeddings=64,
    pad_token_id=0, decoder_start_token_id=0, eos_token_id=1, forced_eos_token_id=1,
)
for seed, folder in enumerate(sys.argv[1:]):
    torch.manual_seed(seed)
    MarianPosEncForConditionalGeneration(config).save_pretrained(folder)
    tokenizer.save_pretrained(folder)
print(hf_posenc.__file__)
"""


def run_quietly(command: list[str], **kwargs) -> subprocess.CompletedProcess:
    """Run a setup step; its output is shown only when it fails."""
    completed = subprocess.run(command, capture_output=True, text=True, **kwargs)
    assert completed.returncode == 0, (
        f"{' '.join(command)}\n{completed.stdout[-3000:]}\n{completed.stderr[-3000:]}"
    )
    return completed


@pytest.fixture(scope="module")
def wheel(tmp_path_factory) -> Path:
    """The wheel of this checkout's package, built (offline, with this environment's setuptools) from a copy of
    its source paths."""
    source = tmp_path_factory.mktemp("source")
    for name in SOURCE_PATHS:
        if (REPO / name).is_dir():
            shutil.copytree(REPO / name, source / name, ignore=shutil.ignore_patterns("__pycache__", "*.pyc"))
        else:
            shutil.copy2(REPO / name, source / name)
    dist = tmp_path_factory.mktemp("dist")
    build = [
        sys.executable,
        "-m",
        "pip",
        "wheel",
        "--no-deps",
        "--no-build-isolation",
        "--wheel-dir",
        str(dist),
    ]
    run_quietly([*build, str(source)])  # a path: a bare name would be looked up on the index
    (built,) = dist.glob(f"{PACKAGE}-*.whl")
    return built


@pytest.fixture(scope="module")
def environments(wheel, tmp_path_factory):
    """extra -> the Future of a fresh virtual environment with the wheel installed with that extra (its folder).
    The dependencies of every extra are downloaded once; the environments are installed side by side."""
    work = tmp_path_factory.mktemp("installs")
    constraints = work / "constraints.txt"
    constraints.write_text(f"torch=={torch.__version__}\n")  # the build this suite runs on
    wheelhouse = work / "wheelhouse"
    pip = [sys.executable, "-m", "pip"]
    every_extra = f"{PACKAGE}[{','.join(EXTRAS[1:])}] @ {wheel.as_uri()}"
    run_quietly([*pip, "download", "--dest", str(wheelhouse), "--constraint", str(constraints), every_extra])

    def install(extra: str) -> Path:
        folder = work / extra
        run_quietly([sys.executable, "-m", "venv", "--without-pip", str(folder)])
        requirement = str(wheel) if extra == "base" else f"{PACKAGE}[{extra}] @ {wheel.as_uri()}"
        offline = ["--no-index", "--find-links", str(wheelhouse), "--constraint", str(constraints)]
        python = ["--python", str(folder / "bin" / "python")]
        run_quietly([*pip, *python, "install", "--no-compile", *offline, requirement])
        return folder

    with ThreadPoolExecutor(max_workers=len(EXTRAS)) as pool:
        yield {extra: pool.submit(install, extra) for extra in EXTRAS}


@pytest.fixture(scope="module")
def data_root(tmp_path_factory) -> Path:
    """A data root with a tiny Multi30k-shaped folder (`multi30k/{train,val,test_2016_flickr}.{en,de}`) of
    word-for-word English-German pairs: what the tiny recipe reads under the data root, on any machine."""
    subjects = {"a dog": "ein hund", "a man": "ein mann", "a woman": "eine frau", "a cat": "eine katze"}
    verbs = {"runs": "läuft", "sits": "sitzt", "sleeps": "schläft", "waits": "wartet", "plays": "spielt"}
    places = {
        "on the grass": "auf dem gras",
        "in the house": "im haus",
        "near the water": "am wasser",
        "in the street": "auf der straße",
        "under a tree": "unter einem baum",
    }
    pairs = [
        (f"{subject} {verb} {place} .", f"{subjects[subject]} {verbs[verb]} {places[place]} .")
        for subject in subjects
        for verb in verbs
        for place in places
    ]  # 100 pairs
    folder = tmp_path_factory.mktemp("data")
    splits = {"train": pairs * 2, "val": pairs[::10], "test_2016_flickr": pairs[3::10]}
    for split, rows in splits.items():
        for side, lang in enumerate(("en", "de")):
            path = folder / "multi30k" / f"{split}.{lang}"
            path.parent.mkdir(exist_ok=True)
            path.write_text("".join(row[side] + "\n" for row in rows), encoding="utf-8")
    return folder


@pytest.fixture(scope="module")
def elsewhere(tmp_path_factory) -> Path:
    """The folder the commands run from: outside the checkout."""
    folder = tmp_path_factory.mktemp("elsewhere")
    assert not folder.resolve().is_relative_to(REPO)
    return folder


def command_env(venv: Path, data_root: Path, elsewhere: Path) -> dict[str, str]:
    """The environment of a command: the venv's bin first, nothing of this checkout's environment on the path,
    the data root, empty caches (the corpus cache included) and no network, one thread."""
    left_out = (
        "PYTHONPATH",
        "PYTHONHOME",
        "VIRTUAL_ENV",
        "PYTHONDONTWRITEBYTECODE",
        "HF_POSENC_DATA",
        "HF_POSENC_CACHE",
    )
    env = {key: value for key, value in os.environ.items() if key not in left_out}
    env["PATH"] = f"{venv / 'bin'}{os.pathsep}{env.get('PATH', '')}"
    env["HF_POSENC_DATA"] = str(data_root)
    env["HF_HOME"], env["XDG_CACHE_HOME"] = str(elsewhere / ".hf-home"), str(elsewhere / ".cache")
    env.update(HF_HUB_OFFLINE="1", OMP_NUM_THREADS="1", TOKENIZERS_PARALLELISM="false")
    return env


@pytest.fixture(scope="module")
def run_in(environments, data_root, elsewhere):
    """`run_in(extra, jobs)`: run each job (a command name or "python", then its arguments) in the environment of
    `extra`, from `elsewhere`, two at a time; their CompletedProcess in order."""

    def run(extra: str, jobs: list[list[str]]) -> list[subprocess.CompletedProcess]:
        venv = environments[extra].result()
        env = command_env(venv, data_root, elsewhere)

        def one(job: list[str]) -> subprocess.CompletedProcess:
            command = [str(venv / "bin" / job[0]), *map(str, job[1:])]
            return subprocess.run(
                command, capture_output=True, text=True, cwd=elsewhere, env=env, timeout=COMMAND_SECONDS
            )

        with ThreadPoolExecutor(max_workers=2) as pool:
            return list(pool.map(one, jobs))

    return run


def succeeded(completed: subprocess.CompletedProcess) -> str:
    assert completed.returncode == 0, (
        f"{completed.args}\n{completed.stdout[-3000:]}\n{completed.stderr[-5000:]}"
    )
    return completed.stdout


def refused_naming(completed: subprocess.CompletedProcess, extra: str) -> None:
    """The command stopped with exit code 2 and one line naming the extra to install, and no traceback."""
    name = Path(completed.args[0]).name
    assert completed.returncode == 2, (
        f"{completed.args}\n{completed.stdout[-2000:]}\n{completed.stderr[-5000:]}"
    )
    assert "Traceback" not in completed.stderr, completed.stderr
    last = completed.stderr.strip().splitlines()[-1]
    assert last.startswith(f"{name}: error: ") and f"pip install '{PACKAGE}[{extra}]'" in last, last


def check_help(completed: subprocess.CompletedProcess, extra: str) -> None:
    """`--help` of a command in an install with `extra`: its usage, or the refusal naming the extra it needs."""
    command = Path(completed.args[0]).name
    if NEEDS[command] in ("base", extra):
        assert succeeded(completed).startswith(f"usage: {command}"), completed.stdout[:500]
    elif command == "hf-posenc-export":  # its module needs no extra until it exports: the help names it
        assert f"pip install '{PACKAGE}[export]'" in succeeded(completed), completed.stdout
    else:
        refused_naming(completed, NEEDS[command])


def write_models(run_in, extra: str, *folders: Path) -> None:
    (completed,) = run_in(extra, [["python", "-c", WRITE_MODELS, *folders]])
    imported_from = Path(succeeded(completed).strip().splitlines()[-1])
    assert not imported_from.resolve().is_relative_to(REPO), (
        f"hf_posenc imported from the checkout: {imported_from}"
    )


def test_the_wheel_holds_the_package_its_data_and_its_commands_and_nothing_else(wheel):
    names = set(zipfile.ZipFile(wheel).namelist())
    dist_info = next(name.split("/")[0] for name in names if name.split("/")[0].endswith(".dist-info"))
    assert {name.split("/")[0] for name in names} == {PACKAGE, dist_info}
    checkout = {
        path.relative_to(REPO).as_posix()
        for path in (REPO / PACKAGE).rglob("*")
        if path.is_file() and "__pycache__" not in path.parts and path.suffix != ".pyc"
    }
    assert checkout - names == set(), "files of the package missing from the wheel"
    assert any(name.endswith(".yaml") for name in checkout) and any(name.endswith(".md") for name in checkout)
    entry_points = zipfile.ZipFile(wheel).read(f"{dist_info}/entry_points.txt").decode()
    scripts = tomllib.loads((REPO / "pyproject.toml").read_text())["project"]["scripts"]
    assert sorted(scripts) == sorted(COMMANDS)
    for command, target in scripts.items():
        assert f"{command} = {target}" in entry_points


def test_the_package_reads_nothing_from_the_checkout_around_it():
    """No module climbs out of the package (`Path(__file__).parents[...]`): installed, there is nothing there."""
    climbing = [
        f"{path.relative_to(REPO)}:{number}"
        for path in (REPO / PACKAGE).rglob("*.py")
        for number, line in enumerate(path.read_text(encoding="utf-8").splitlines(), start=1)
        if "parents[" in line or ".parent.parent" in line
    ]
    assert climbing == []


def test_the_base_install_averages_checkpoints_and_names_the_extra_of_every_other_command(run_in, elsewhere):
    checkpoints = elsewhere / "base-run-checkpoints"
    first, second = checkpoints / "checkpoint-2", checkpoints / "checkpoint-4"
    write_models(run_in, "base", first, second)
    averaged = elsewhere / "base-averaged"
    helps = [[command, "--help"] for command in COMMANDS]  # train's and evaluate's refuse as any call would
    calls = [
        ["hf-posenc-average", checkpoints, "--last", "2", "--output_dir", averaged],
        ["hf-posenc-export", first, elsewhere / "base-ct2"],  # its help runs here; exporting is refused
    ]
    *help_runs, average, export = run_in("base", helps + calls)
    for completed in help_runs:
        check_help(completed, "base")
    succeeded(average)
    weights = [load_file(folder / "model.safetensors") for folder in (first, second, averaged)]
    for name, tensor in weights[2].items():
        torch.testing.assert_close(tensor, (weights[0][name] + weights[1][name]) / 2, msg=name)
    refused_naming(export, "export")
    assert not (elsewhere / "base-ct2").exists()


def test_the_export_install_exports_to_ctranslate2(run_in, elsewhere):
    model, exported = elsewhere / "export-model", elsewhere / "export-ct2"
    write_models(run_in, "export", model)
    helps = [[command, "--help"] for command in COMMANDS]  # train's and evaluate's are refused
    *help_runs, export = run_in("export", [*helps, ["hf-posenc-export", model, exported]])
    for completed in help_runs:
        check_help(completed, "export")
    succeeded(export)
    assert (exported / "model.bin").stat().st_size > 0
    assert (exported / "tokenizer.json").is_file() and (exported / "generation_config.json").is_file()


def test_the_train_install_trains_on_the_data_root_and_evaluates_the_run(run_in, elsewhere, data_root):
    run = elsewhere / "train-run"
    helps = [[command, "--help"] for command in COMMANDS]
    training, *help_runs = run_in("train", [["hf-posenc-train", *TINY_TRAINING, "--output_dir", run], *helps])
    for completed in help_runs:
        check_help(completed, "train")
    succeeded(training)
    for name in ("model.safetensors", "config.json", "tokenizer.json", "README.md", "scores.json"):
        assert (run / name).is_file(), f"{name} is missing from the run folder {run}"
    assert json.loads((run / "scores.json").read_text())["steps"] == 4
    test = data_root / "multi30k" / "test_2016_flickr"
    evaluate = [
        "hf-posenc-evaluate",
        run,
        "--source",
        f"{test}.en",
        "--reference",
        f"{test}.de",
        "--num_beams",
        "1",
    ]
    evaluation, export = run_in("train", [evaluate, ["hf-posenc-export", run, elsewhere / "train-ct2"]])
    assert "BLEU" in succeeded(evaluation)
    assert (run / "evaluation.json").is_file()
    refused_naming(export, "export")
