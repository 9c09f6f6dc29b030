"""The training data's sources under faults (pipeline/data/files.py, corpus.py): empty training files, a local
`datasets` folder without the split asked for, and a Hub dataset that cannot be reached end in one error naming
the files, the splits there are or the dataset, through the command line as the console tool runs it."""

import json

from hf_posenc.pipeline.training import run
from tests.helpers import assert_refused


def offline(monkeypatch):
    """HF_HUB_OFFLINE=1 as `datasets` and `huggingface_hub` read it when imported: nothing reaches the Hub, which
    fails as it does without a network."""
    import datasets
    import huggingface_hub

    monkeypatch.setattr(datasets.config, "HF_HUB_OFFLINE", True)
    monkeypatch.setattr(huggingface_hub.constants, "HF_HUB_OFFLINE", True)


def flags(tmp_path, *extra):
    return ["--output_dir", tmp_path / "run", "--data_cache_dir", tmp_path / "cache", *extra]


def test_empty_training_files_are_named_both(tmp_path, run_tool, tiny_run_flags):
    source, target = tmp_path / "train.en", tmp_path / "train.de"
    source.write_text("")
    target.write_text("")
    code, message = run_tool(
        run.main, [*tiny_run_flags(), *flags(tmp_path, "--train_source", source, "--train_target", target)]
    )
    assert_refused(code, message, [f"the training data {source} / {target} hold no lines"])


def test_a_local_datasets_folder_without_the_split_names_its_splits_and_the_flag(
    tmp_path, run_tool, monkeypatch
):
    offline(monkeypatch)
    folder = tmp_path / "corpus"
    folder.mkdir()
    row = json.dumps({"translation": {"en": "a dog runs", "de": "ein hund läuft"}}) + "\n"
    for split in ("validation", "test"):
        (folder / f"{split}.jsonl").write_text(row * 20)
    code, message = run_tool(run.main, flags(tmp_path, "--hf_dataset", folder, "--vocab_size", "60"))
    assert_refused(code, message, [f"{folder} has no split 'train'", "validation, test", "--hf_train_split"])
    code, message = run_tool(
        run.main,
        flags(tmp_path, "--hf_dataset", folder, "--hf_train_split", "validation", "--vocab_size", "2"),
    )  # the split chosen is read: its BPE is learned, and the tiny vocabulary refused
    assert_refused(code, message, ["--vocab_size=2 is smaller than"])


def test_an_unreachable_hub_dataset_is_named_with_the_hub(tmp_path, run_tool, monkeypatch):
    offline(monkeypatch)
    code, message = run_tool(run.main, flags(tmp_path, "--hf_dataset", "someone/parallel-corpus"))
    assert_refused(
        code,
        message,
        ["--hf_dataset someone/parallel-corpus: the Hugging Face Hub could not be reached", "Offline"],
    )
