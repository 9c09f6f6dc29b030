"""The evaluate command (pipeline/evaluation/command.py, evaluate_translation.py): it decodes, scores and compares,
and bad input ends in one line naming the bad value, file or folder, exit code 2, before any decoding."""

import json

import pytest

from hf_posenc.pipeline.data.files import read_lines  # noqa: E402
from hf_posenc.pipeline.data.tokenization import train_joint_bpe
from hf_posenc.pipeline.evaluation import command
from hf_posenc.pipeline.evaluation.command import evaluate_main
from tests.helpers import assert_refused, command_line

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
def broken_models(tmp_path_factory, model_dir, tiny_model):
    """A model folder without weights ({w}) and one without a tokenizer ({k})."""
    import shutil

    folder = tmp_path_factory.mktemp("broken")
    shutil.copytree(model_dir, folder / "no_weights")
    (folder / "no_weights" / "model.safetensors").unlink()
    tiny_model().save_pretrained(folder / "no_tokenizer")
    return {"w": folder / "no_weights", "k": folder / "no_tokenizer"}


@pytest.mark.parametrize("flags, words", list(EVALUATE_FAULTS.values()), ids=list(EVALUATE_FAULTS))
def test_evaluate_translation_refuses_before_decoding(
    flags, words, model_dir, texts, broken_models, tmp_path, monkeypatch, run_tool
):
    def no_work(*args, **kwargs):
        raise AssertionError("the tool started its work before refusing the input")

    monkeypatch.setattr(command, "translate", no_work)
    if "--model" not in flags:  # a missing or broken model folder is found out by looking at it
        monkeypatch.setattr(command, "load_translation_model", no_work)
    paths = {"t": texts, **broken_models}
    test_set = ["--source", texts / "test.en", "--reference", texts / "test.de"]
    argv = command_line(flags, paths, model_dir, *test_set)
    code, message = run_tool(evaluate_main, argv)
    assert_refused(code, message, [word.format(**paths) for word in words])
    assert not (model_dir / "evaluation.json").exists()


def test_evaluate_translation_refuses_beams_that_cannot_fit_in_memory(
    model_dir, texts, monkeypatch, run_tool
):
    """The memory check is the decoding loop's (`translate`): the command ends on it in one line, before a batch is
    decoded (before: the kernel killed the process once the machine's memory was gone)."""
    from hf_posenc import MarianPosEncForConditionalGeneration

    monkeypatch.setattr(
        MarianPosEncForConditionalGeneration, "generate", lambda *a, **k: pytest.fail("decoded")
    )
    test_set = ["--source", texts / "test.en", "--reference", texts / "test.de"]
    code, message = run_tool(
        evaluate_main, [model_dir, *test_set, "--num_beams", str(10**12), "--precision", "fp32"]
    )
    assert_refused(
        code, message, [f"decoding 5 sentences x {10**12} beams at once", "lower batch_size or num_beams"]
    )
    assert not (model_dir / "evaluation.json").exists()


def test_evaluate_translation_script_decodes_scores_and_compares(multi30k_dir, tmp_path, tiny_model):

    folder = tmp_path / "model"
    model = tiny_model(max_position_embeddings=256)  # test sentences + 50 new tokens fit the table
    model.save_pretrained(folder)
    train_joint_bpe(["ein hund läuft", "a dog runs"], vocab_size=60).save_pretrained(folder)
    source = multi30k_dir / "test_2016_flickr.en.gz"
    reference = multi30k_dir / "test_2016_flickr.de.gz"
    # scoring alone: the first 100 pairs (the n-gram sweep's 46 metrics take a minute on all 1,000)
    for name, path in (("few.en", source), ("few.de", reference)):
        (tmp_path / name).write_text("\n".join(read_lines(path)[:100]) + "\n")
    lines = read_lines(tmp_path / "few.de")
    (tmp_path / "baseline.hyp").write_text("\n".join(" ".join(line.split()[::-1]) for line in lines) + "\n")
    (tmp_path / "good.hyp").write_text("\n".join(lines) + "\n")
    report = evaluate_main(
        [
            str(folder),
            "--source",
            str(tmp_path / "few.en"),
            "--reference",
            str(tmp_path / "few.de"),
            "--hypotheses",
            str(tmp_path / "good.hyp"),
            "--baseline_hypotheses",
            str(tmp_path / "baseline.hyp"),
            "--ngram_sweep",
            "--bootstrap_samples",
            "100",
        ]
    )
    assert report["scores"]["bleu"] == 100.0 and report["paired_bootstrap"]["bleu"]["significance"] == "**"
    assert (folder / "ngram_sweep.png").is_file() and json.loads((folder / "evaluation.json").read_text())
    decoded = evaluate_main(
        [
            str(folder),
            "--source",
            str(source),
            "--reference",
            str(reference),
            "--num_beams",
            "1",
            "--output",
            str(tmp_path / "decoded.json"),
        ]
    )
    assert len((folder / "evaluation.hyp").read_text().splitlines()) == 1000
    assert "nrefs:1|case:mixed|eff:no|tok:13a" in decoded["scores"]["bleu_signature"]
    assert (
        decoded["precision"]["requested"] == "auto" and decoded["hardware"]["device"] == "cpu"
    )  # how it decoded


@pytest.mark.parametrize("flag, reused", [([], True), (["--cpu_memory", "release"], False)])
def test_decoding_keeps_freed_memory_unless_released(flag, reused, model_dir, texts, tmp_path, monkeypatch):
    """--cpu_memory reuse (default) keeps freed memory in the process while decoding on the CPU, as train.py
    does (no page faults at every step: docs/decoding.md); release leaves the C library's default. The report
    says which."""
    devices = []
    monkeypatch.setattr(command, "keep_freed_memory", lambda device: devices.append(str(device)) or True)
    test_set = ["--source", str(texts / "test.en"), "--reference", str(texts / "test.de")]
    argv = [str(model_dir), *test_set, "--num_beams", "1", "--output", str(tmp_path / "e.json"), *flag]
    report = evaluate_main(argv)
    assert report["cpu_memory_reused"] is reused and devices == (["cpu"] if reused else [])
