"""Bad input to the tools (average_checkpoints.py, evaluate_translation.py, the word-order probe, the length
harness) ends in one line naming the bad value, file or folder and what is allowed, exit code 2, before any work
where the input alone shows it is wrong: never a deep traceback, never garbage with exit 0, never a finished run
or a checkpoint overwritten (issues #45, #47). Each case: the input, the exit code or error type, and the words
the message must contain."""

import json
import math
import sys

import pytest
import torch
from conftest import tiny_model

from hf_posenc.analysis import length_generalisation, word_order_probe
from hf_posenc.pipeline.cli import run_cli
from hf_posenc.pipeline.data.tokenization import train_joint_bpe
from hf_posenc.pipeline.evaluation import command
from hf_posenc.pipeline.evaluation.command import evaluate_main
from hf_posenc.pipeline.evaluation.decoding import translate
from hf_posenc.pipeline.training.averaging import average_main, write_whole

SOURCES = ["a dog runs", "a man sits", "two dogs run on the grass", "a woman reads", "children play"]
REFERENCES = ["ein hund läuft", "ein mann sitzt", "zwei hunde laufen", "eine frau liest", "kinder spielen"]


def run_tool(main, argv, monkeypatch, capsys) -> tuple[int, str]:
    """The tool as its command line runs it (`run_cli`): the exit code and the last line it wrote to stderr."""
    capsys.readouterr()  # what the test's setup printed
    monkeypatch.setattr(sys, "argv", ["tool.py", *map(str, argv)])
    with pytest.raises(SystemExit) as exit_info:
        run_cli(main)
    written = capsys.readouterr().err
    assert "Traceback" not in written, written
    return exit_info.value.code, written.strip().splitlines()[-1]


def assert_refused(code, message, words):
    """Exit code 2 and one line, as argparse ends on a bad flag, holding every word."""
    assert code == 2 and message.startswith("tool.py: error: "), message
    for word in words:
        assert word in message, message


def command_line(flags: str, paths: dict, model, *fixed) -> list:
    """The model folder, `fixed`, then `flags` with their {name} paths filled in; `--model X` among the flags
    names another model folder."""
    words = flags.format(**paths).split()
    if "--model" in words:
        at = words.index("--model")
        model = words[at + 1]
        del words[at : at + 2]
    return [model, *fixed, *words]


def snapshot(folder) -> dict:
    """Every file under `folder` with its bytes: a refused run must leave them all as they were."""
    return {str(path.relative_to(folder)): path.read_bytes() for path in folder.rglob("*") if path.is_file()}


@pytest.fixture(scope="module")
def tokenizer():
    return train_joint_bpe((SOURCES + REFERENCES) * 3, vocab_size=60)


@pytest.fixture(scope="module")
def model_dir(tmp_path_factory, tokenizer):
    folder = tmp_path_factory.mktemp("model")
    tiny_model(max_position_embeddings=256).save_pretrained(folder)
    tokenizer.save_pretrained(folder)
    return folder


@pytest.fixture(scope="module")
def texts(tmp_path_factory):
    folder = tmp_path_factory.mktemp("texts")
    for name, lines in {
        "test.en": SOURCES,
        "test.de": REFERENCES,
        "short.hyp": REFERENCES[:3],
        "blank.txt": ["", "   "],
        "one_word.txt": ["dogs", "children"],
    }.items():
        (folder / name).write_text("\n".join(lines) + "\n")
    return folder


# ---- average_checkpoints.py (issue #45)


def save_checkpoints(checkpoints, tokenizer, steps=(1, 2, 3)):
    for seed, step in enumerate(steps):
        folder = checkpoints / f"checkpoint-{step}"
        tiny_model(seed=seed).save_pretrained(folder)
        tokenizer.save_pretrained(folder)
        history = [{"step": s, "eval_loss": 2.0 + s / 10} for s in steps if s <= step]
        (folder / "trainer_state.json").write_text(json.dumps({"log_history": history}))


def finished_run(folder):
    """A run folder as train.py leaves it: weights, scores, card and translations."""
    tiny_model(seed=9).save_pretrained(folder)
    for name, text in (("scores.json", '{"bleu": 35.1}'), ("README.md", "# card"), ("test.hyp.de", "x\n")):
        (folder / name).write_text(text)


def swap_two_tokens(checkpoint):
    """The same vocabulary size, another tokenizer: two tokens trade their ids."""
    path = checkpoint / "tokenizer.json"
    tokenizer = json.loads(path.read_text())
    vocab = tokenizer["model"]["vocab"]
    first, second = sorted(vocab, key=vocab.get)[10:12]
    vocab[first], vocab[second] = vocab[second], vocab[first]
    path.write_text(json.dumps(tokenizer))


def no_change(tmp):
    pass


# id: (what is done to the checkpoints folder {c} in {t} first, the command line, words of the message)
AVERAGE_FAULTS = {
    "output-is-an-input": (
        no_change,
        "{c} --last 2 --output_dir {c}/checkpoint-3",
        ["--output_dir {c}/checkpoint-3 is {c}/checkpoint-3, one of the checkpoints being averaged"],
    ),
    "output-is-an-input-even-with-overwrite": (
        no_change,
        "{c} --last 2 --output_dir {c}/checkpoint-2 --overwrite_output_dir",
        ["checkpoint-2, one of the checkpoints being averaged", "outside {c}"],
    ),
    "output-inside-the-checkpoints": (
        no_change,
        "{c} --last 2 --output_dir {c}/avg",
        ["--output_dir {c}/avg is inside the checkpoints folder {c}"],
    ),
    "output-is-the-checkpoints-folder": (
        no_change,
        "{c} --last 2 --output_dir {c} --overwrite_output_dir",
        ["inside the checkpoints folder {c}"],
    ),
    "output-holds-the-checkpoints": (
        no_change,
        "{c} --last 2 --output_dir {t} --overwrite_output_dir",
        ["--output_dir {t} holds the checkpoints folder {c}"],
    ),
    "output-is-a-finished-run": (
        lambda tmp: finished_run(tmp / "run"),
        "{c} --last 2 --output_dir {t}/run",
        ["--output_dir {t}/run already holds a model or run", "scores.json", "--overwrite_output_dir"],
    ),
    "output-is-a-file": (
        lambda tmp: (tmp / "avg.txt").write_text("x"),
        "{c} --last 2 --output_dir {t}/avg.txt",
        ["--output_dir {t}/avg.txt is a file"],
    ),
    "same-vocabulary-size-other-tokenizer": (
        lambda tmp: swap_two_tokens(tmp / "ckpts" / "checkpoint-3"),
        "{c} --last 2 --output_dir {t}/avg",
        ["{c}/checkpoint-3 has another tokenizer than {c}/checkpoint-2", "tokenizer.json (sha256"],
    ),
    "checkpoints-without-tokenizer": (
        lambda tmp: [path.unlink() for path in (tmp / "ckpts").glob("*/tokenizer*.json")],
        "{c} --last 2 --output_dir {t}/avg",
        ["checkpoint-3 holds no tokenizer (tokenizer.json)"],
    ),
    "last-0": (no_change, "{c} --last 0 --output_dir {t}/avg", ["--last=0 must be at least 1"]),
    "best-negative": (no_change, "{c} --best -2 --output_dir {t}/avg", ["--best=-2 must be at least 1"]),
    "more-than-there-are": (
        no_change,
        "{c} --last 5 --output_dir {t}/avg",
        ["asked to average 5 checkpoints, {c} has 3"],
    ),
    "missing-checkpoints-folder": (
        no_change,
        "{t}/nothing --last 2 --output_dir {t}/avg",
        ["checkpoint folder {t}/nothing does not exist"],
    ),
    "best-without-trainer-state": (
        lambda tmp: (tmp / "ckpts" / "checkpoint-3" / "trainer_state.json").unlink(),
        "{c} --best 2 --output_dir {t}/avg",
        ["{c}/checkpoint-3/trainer_state.json is missing"],
    ),
}


@pytest.mark.parametrize("prepare, argv, words", list(AVERAGE_FAULTS.values()), ids=list(AVERAGE_FAULTS))
def test_average_checkpoints_refuses_without_touching_a_file(
    prepare, argv, words, tokenizer, tmp_path, monkeypatch, capsys
):
    save_checkpoints(tmp_path / "ckpts", tokenizer)
    prepare(tmp_path)
    before = snapshot(tmp_path)
    paths = {"c": tmp_path / "ckpts", "t": tmp_path}
    code, message = run_tool(average_main, argv.format(**paths).split(), monkeypatch, capsys)
    assert_refused(code, message, [word.format(**paths) for word in words])
    assert snapshot(tmp_path) == before  # no checkpoint, run or folder changed or added


def averaged_weight(checkpoints, steps, name="model.decoder.layers.1.fc2.weight"):
    from safetensors.torch import load_file

    tensors = [load_file(checkpoints / f"checkpoint-{step}" / "model.safetensors")[name] for step in steps]
    return name, sum(tensors) / len(tensors)


def test_overwriting_a_finished_run_replaces_the_whole_folder(tokenizer, tmp_path, monkeypatch, capsys):
    """With --overwrite_output_dir the old scores, card and translations go with the old weights: the folder
    holds the average and the newest checkpoint's config and tokenizer, and nothing is left beside it."""
    from transformers import AutoModelForSeq2SeqLM

    save_checkpoints(tmp_path / "ckpts", tokenizer)
    finished_run(tmp_path / "run")
    argv = [tmp_path / "ckpts", "--last", "2", "--output_dir", tmp_path / "run", "--overwrite_output_dir"]
    monkeypatch.setattr(sys, "argv", ["average_checkpoints.py", *map(str, argv)])
    run_cli(average_main)
    written = {path.name for path in (tmp_path / "run").iterdir()}
    assert not written & {"scores.json", "README.md", "test.hyp.de"}
    assert {"model.safetensors", "config.json", "tokenizer.json"} <= written
    name, expected = averaged_weight(tmp_path / "ckpts", (2, 3))
    torch.testing.assert_close(
        AutoModelForSeq2SeqLM.from_pretrained(tmp_path / "run").state_dict()[name], expected
    )
    assert sorted(path.name for path in tmp_path.iterdir()) == ["ckpts", "run"]  # no partial or old copy left


def test_a_failed_write_leaves_the_old_folder_as_it_was(tmp_path):
    """The averaged folder is written beside its place and renamed in only when complete."""
    finished_run(tmp_path / "run")
    before = snapshot(tmp_path / "run")
    with pytest.raises(RuntimeError, match="disk full"), write_whole(tmp_path / "run") as folder:
        (folder / "model.safetensors").write_bytes(b"half")
        raise RuntimeError("disk full")
    assert snapshot(tmp_path / "run") == before
    assert [path.name for path in tmp_path.iterdir()] == ["run"]


# ---- evaluate_translation.py (issues #45, #47)

# id: (flags besides the model folder, source and reference; words of the message)
EVALUATE_FAULTS = {
    "length-penalty-nan": (
        "--length_penalty nan",
        ["--length_penalty=nan must be a finite number", "allowed: any finite number"],
    ),
    "length-penalty-inf": ("--length_penalty inf", ["--length_penalty=inf must be a finite number"]),
    "length-penalty-minus-inf": ("--length_penalty=-inf", ["--length_penalty=-inf must be a finite number"]),
    "batch-size-0": ("--batch_size 0", ["--batch_size=0 must be at least 1"]),
    "batch-size-negative": ("--batch_size -8", ["--batch_size=-8 must be at least 1"]),
    "num-beams-0": ("--num_beams 0", ["--num_beams=0 must be at least 1"]),
    "threads-0": ("--threads 0", ["--threads=0 must be at least 1"]),
    "threads-negative": ("--threads -1", ["--threads=-1 must be at least 1"]),
    "bootstrap-samples-0": ("--bootstrap_samples 0", ["--bootstrap_samples=0 must be at least 1"]),
    "ngram-sweep-without-baseline": ("--ngram_sweep", ["--ngram_sweep compares two systems"]),
    "decoding-flags-with-hypotheses": (
        "--hypotheses {t}/test.de --num_beams 2",
        ["--num_beams set decoding, but --hypotheses scores translations without decoding"],
    ),
    "baseline-of-other-length": (
        "--baseline_hypotheses {t}/short.hyp",
        ["--baseline_hypotheses {t}/short.hyp has 3 lines but the references have 5"],
    ),
    "hypotheses-of-other-length": (
        "--hypotheses {t}/short.hyp",
        ["--hypotheses {t}/short.hyp has 3 lines but the references have 5"],
    ),
    "missing-source": ("--source {t}/missing.en", ["{t}/missing.en does not exist"]),
    "output-folder-missing": (
        "--output {t}/nowhere/evaluation.json",
        ["--output {t}/nowhere/evaluation.json: its folder {t}/nowhere does not exist"],
    ),
    "output-is-a-folder": ("--output {t}", ["--output {t} is a folder"]),
    "missing-model-folder": ("--model {t}/no_model", ["model folder {t}/no_model does not exist"]),
    "model-without-weights": ("--model {w}", ["{w} has no weights", "model.safetensors"]),
    "model-without-tokenizer": ("--model {k}", ["{k} has no tokenizer"]),
}


@pytest.fixture(scope="module")
def broken_models(tmp_path_factory, model_dir):
    """A model folder without weights ({w}) and one without a tokenizer ({k})."""
    import shutil

    folder = tmp_path_factory.mktemp("broken")
    shutil.copytree(model_dir, folder / "no_weights")
    (folder / "no_weights" / "model.safetensors").unlink()
    tiny_model().save_pretrained(folder / "no_tokenizer")
    return {"w": folder / "no_weights", "k": folder / "no_tokenizer"}


@pytest.mark.parametrize("flags, words", list(EVALUATE_FAULTS.values()), ids=list(EVALUATE_FAULTS))
def test_evaluate_translation_refuses_before_decoding(
    flags, words, model_dir, texts, broken_models, tmp_path, monkeypatch, capsys
):
    def no_work(*args, **kwargs):
        raise AssertionError("the tool started its work before refusing the input")

    monkeypatch.setattr(command, "translate", no_work)
    if "--model" not in flags:  # a missing or broken model folder is found out by looking at it
        monkeypatch.setattr(command, "load_translation_model", no_work)
    paths = {"t": texts, **broken_models}
    test_set = ["--source", texts / "test.en", "--reference", texts / "test.de"]
    argv = command_line(flags, paths, model_dir, *test_set)
    code, message = run_tool(evaluate_main, argv, monkeypatch, capsys)
    assert_refused(code, message, [word.format(**paths) for word in words])
    assert not (model_dir / "evaluation.json").exists()


# ---- translate, the one decoding loop (issue #47)

# id: (decoding settings given to translate, or saved in the model's generation config; words of the error)
TRANSLATE_FAULTS = {
    "nan-length-penalty-given": (
        {"length_penalty": math.nan},
        {},
        ["length_penalty=nan must be a finite number", "given to translate"],
    ),
    "nan-length-penalty-saved": (
        {},
        {"length_penalty": math.nan},
        ["length_penalty=nan must be a finite number", "in the model's generation_config.json"],
    ),
    "infinite-length-penalty": (
        {"length_penalty": math.inf},
        {},
        ["length_penalty=inf must be a finite number"],
    ),
    "no-new-tokens": ({"max_new_tokens": 0}, {}, ["max_new_tokens=0 must be at least 1"]),
    "batch-size-0": ({"batch_size": 0}, {}, ["batch_size=0 must be at least 1"]),
    "fractional-batch-size": ({"batch_size": 2.5}, {}, ["batch_size=2.5 must be a whole number at least 1"]),
}


@pytest.mark.parametrize("given, saved, words", list(TRANSLATE_FAULTS.values()), ids=list(TRANSLATE_FAULTS))
def test_translate_refuses_settings_that_decode_garbage(given, saved, words, tokenizer, monkeypatch):
    """A NaN length penalty ranks every beam alike: the output collapses and nothing fails. Refused."""
    model = tiny_model()
    model.generation_config.update(**saved)
    monkeypatch.setattr(model, "generate", lambda *args, **kwargs: pytest.fail("decoded"))
    with pytest.raises(ValueError) as error:
        translate(model, tokenizer, SOURCES, **given)
    for word in words:
        assert word in str(error.value)


# ---- the word-order probe (issues #45, #47)

PROBE_FAULTS = {
    "permutations-0": ("--sentences a dog runs --permutations 0", ["--permutations=0 must be at least 1"]),
    "permutations-negative": (
        "--sentences a dog runs --permutations -2",
        ["--permutations=-2 must be at least 1"],
    ),
    "max-sentences-0": ("--sentences a dog runs --max_sentences 0", ["--max_sentences=0 must be at least 1"]),
    "batch-size-0": ("--sentences a dog runs --batch_size 0", ["--batch_size=0 must be at least 1"]),
    "num-beams-0": ("--sentences a dog runs --num_beams 0", ["--num_beams=0 must be at least 1"]),
    "max-new-tokens-0": (
        "--sentences a dog runs --max_new_tokens 0",
        ["--max_new_tokens=0 must be at least 1"],
    ),
    "missing-source": ("--source {t}/missing.en", ["{t}/missing.en does not exist"]),
    "blank-source": ("--source {t}/blank.txt", ["--source {t}/blank.txt holds no sentence"]),
    "missing-model-folder": (
        "--model {t}/no_model --sentences a dog",
        ["model folder {t}/no_model does not exist"],
    ),
}


@pytest.mark.parametrize("flags, words", list(PROBE_FAULTS.values()), ids=list(PROBE_FAULTS))
def test_word_order_probe_cli_refuses_before_loading(flags, words, model_dir, texts, monkeypatch, capsys):
    monkeypatch.setattr(word_order_probe, "translate", lambda *args, **kwargs: pytest.fail("decoded"))
    if "--model" not in flags:
        monkeypatch.setattr(word_order_probe, "load_translation_model", lambda *a, **k: pytest.fail("loaded"))
    argv = command_line(flags, {"t": texts}, model_dir)
    code, message = run_tool(word_order_probe.main, argv, monkeypatch, capsys)
    assert_refused(code, message, [word.format(t=texts) for word in words])


# id: (sentences, keyword arguments, words of the ValueError)
PROBE_API_FAULTS = {
    "no-sentences": ([], {}, ["got 0 source sentences, none of two or more words"]),
    "only-one-word-sentences": (
        ["dogs", "children"],
        {},
        ["got 2 source sentences, none of two or more words"],
    ),
    "no-permutations": (SOURCES, {"num_permutations": 0}, ["num_permutations=0 must be at least 1"]),
    "unknown-kind": (SOURCES, {"kinds": ["reverse"]}, ["'reverse' is not known", "shuffle, local_swap"]),
    "no-kind": (SOURCES, {"kinds": []}, ["kinds=[]: give one or more of shuffle, local_swap"]),
    "batch-size-0": (SOURCES, {"batch_size": 0}, ["batch_size=0 must be at least 1"]),
}


@pytest.mark.parametrize(
    "sentences, kwargs, words", list(PROBE_API_FAULTS.values()), ids=list(PROBE_API_FAULTS)
)
def test_word_order_probe_refuses_what_it_cannot_measure(sentences, kwargs, words, tokenizer, monkeypatch):
    monkeypatch.setattr(word_order_probe, "translate", lambda *args, **kwargs: pytest.fail("decoded"))
    with pytest.raises(ValueError) as error:
        word_order_probe.word_order_probe(tiny_model(), tokenizer, sentences, **kwargs)
    for word in words:
        assert word in str(error.value)


# ---- the length harness


LENGTH_FAULTS = {
    "batch-size-0": ("--batch_size 0", ["--batch_size=0 must be at least 1"]),
    "max-sentences-0": ("--max_sentences 0", ["--max_sentences=0 must be at least 1"]),
    "max-sentences-negative": ("--max_sentences -2", ["--max_sentences=-2 must be at least 1"]),
    "k-0": ("--k 0 2", ["--k=[0, 2]: expected one or more whole numbers >= 1"]),
    "buckets-not-increasing": ("--buckets 5 5", ["--buckets=[5, 5]: expected strictly increasing"]),
}


@pytest.mark.parametrize("flags, words", list(LENGTH_FAULTS.values()), ids=list(LENGTH_FAULTS))
def test_length_harness_cli_refuses_before_loading(flags, words, model_dir, texts, monkeypatch, capsys):
    monkeypatch.setattr(
        length_generalisation, "load_translation_model", lambda *a, **k: pytest.fail("loaded")
    )
    argv = [model_dir, "--source", texts / "test.en", "--reference", texts / "test.de", *flags.split()]
    code, message = run_tool(length_generalisation.main, argv, monkeypatch, capsys)
    assert_refused(code, message, words)
