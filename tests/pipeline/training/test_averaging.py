"""Checkpoint averaging (pipeline/training/averaging.py, average_checkpoints.py): the last and best rules, a
loadable averaged folder, and bad input refused in one line before any file is touched; a finished run is
replaced whole or not at all."""

import json
import sys

import pytest
import torch
from safetensors.torch import load_file

from hf_posenc.pipeline.cli import run_cli
from hf_posenc.pipeline.data.tokenization import train_joint_bpe
from hf_posenc.pipeline.training.averaging import (
    average_main,  # noqa: E402
    average_state_dicts,
    select_checkpoints,
    write_whole,
)
from tests.helpers import assert_refused, snapshot


def save_checkpoint(tiny_model, folder, step, **overrides):
    tiny_model(**overrides).save_pretrained(folder / f"checkpoint-{step}")


def test_averaging_refuses_checkpoints_of_different_models_and_zero_checkpoints(tmp_path, tiny_model):
    save_checkpoint(tiny_model, tmp_path / "a", 1, position_encoding="sinusoidal")
    save_checkpoint(tiny_model, tmp_path / "a", 2, position_encoding="alibi")  # the same tensor names
    with pytest.raises(ValueError, match="checkpoint-2 is another model than .*checkpoint-1: config fields"):
        average_state_dicts(select_checkpoints(tmp_path / "a", last=2))
    save_checkpoint(tiny_model, tmp_path / "b", 1, vocab_size=60)
    save_checkpoint(tiny_model, tmp_path / "b", 2, vocab_size=70)
    with pytest.raises(ValueError, match="vocab_size"):
        average_state_dicts(select_checkpoints(tmp_path / "b", last=2))
    with pytest.raises(ValueError, match="at least 1, got 0"):
        select_checkpoints(tmp_path / "a", last=0)


def test_a_checkpoint_saved_before_a_config_field_existed_has_its_default(tmp_path, tiny_model):
    """A run's first checkpoints may predate a config field that its later ones save: the field's default is
    what those ran with, so they average; a value other than the default is another model."""
    for step in (1, 2):
        save_checkpoint(tiny_model, tmp_path / "a", step)
    older = tmp_path / "a" / "checkpoint-1" / "config.json"
    config = json.loads(older.read_text())
    assert config.pop("cross_attention_window_ratio") == 1.0
    older.write_text(json.dumps(config))
    assert average_state_dicts(select_checkpoints(tmp_path / "a", last=2))
    newer = tmp_path / "a" / "checkpoint-2" / "config.json"
    newer.write_text(json.dumps({**json.loads(newer.read_text()), "cross_attention_window_ratio": 1.5}))
    with pytest.raises(ValueError, match=r"cross_attention_window_ratio=1\.0 vs 1\.5"):
        average_state_dicts(select_checkpoints(tmp_path / "a", last=2))


@pytest.mark.parametrize("damaged", ["config.json", "trainer_state.json", "tokenizer_config.json"])
def test_a_damaged_json_file_of_a_checkpoint_is_named(damaged, tmp_path, tiny_model):
    """Before: json's own message ("Expecting value: line 1 column 1"), naming no file."""
    for step in (1, 2):
        save_scored_checkpoint(tiny_model, tmp_path, 0, step, {1: 1.0, 2: 0.5})
        train_joint_bpe(["a dog runs"], vocab_size=40).save_pretrained(tmp_path / f"checkpoint-{step}")
    (tmp_path / "checkpoint-2" / damaged).write_text("{broken")
    with pytest.raises(
        ValueError, match=rf"checkpoint-2/{damaged} is not readable JSON .*the checkpoint is damaged"
    ):
        average_state_dicts(select_checkpoints(tmp_path, best=2))


def test_a_file_given_as_the_checkpoints_folder_is_named_as_a_file(tmp_path):
    (tmp_path / "run-checkpoints").write_text("")
    with pytest.raises(
        NotADirectoryError, match=r"run-checkpoints is a file; give the folder of checkpoint-<step>"
    ):
        select_checkpoints(tmp_path / "run-checkpoints", last=1)


def save_scored_checkpoint(tiny_model, folder, seed, step, eval_losses):
    model = tiny_model(seed=seed)
    model.save_pretrained(folder / f"checkpoint-{step}")
    history = [{"step": s, "eval_loss": loss} for s, loss in eval_losses.items()]
    (folder / f"checkpoint-{step}" / "trainer_state.json").write_text(json.dumps({"log_history": history}))
    return model


def test_checkpoint_averaging_last_and_best_rules(tmp_path, tiny_model):
    losses = {10: 3.0, 20: 2.0, 30: 2.5, 40: 2.6}
    models = {
        step: save_scored_checkpoint(tiny_model, tmp_path, seed, step, losses)
        for seed, step in enumerate(losses)
    }
    assert [p.name for p in select_checkpoints(tmp_path, last=2)] == ["checkpoint-30", "checkpoint-40"]
    assert [p.name for p in select_checkpoints(tmp_path, best=2)] == ["checkpoint-20", "checkpoint-30"]
    assert [p.name for p in select_checkpoints(tmp_path, best=3)] == [
        "checkpoint-20",
        "checkpoint-30",
        "checkpoint-40",
    ]
    average = average_state_dicts(select_checkpoints(tmp_path, last=2))
    name = "model.encoder.layers.0.fc1.weight"
    expected = (models[30].state_dict()[name] + models[40].state_dict()[name]) / 2
    torch.testing.assert_close(average[name], expected)
    with pytest.raises(ValueError, match="asked to average 5 checkpoints"):
        select_checkpoints(tmp_path, last=5)


def test_average_checkpoints_script_writes_a_loadable_folder(tmp_path, multi30k_dir, tiny_model):
    from transformers import AutoModelForSeq2SeqLM

    tokenizer = train_joint_bpe(["a b c", "d e f"], vocab_size=40)
    losses = {1: 2.0, 2: 1.0}
    models, checkpoints = {}, tmp_path / "checkpoints"
    for seed, step in enumerate(losses):
        models[step] = save_scored_checkpoint(tiny_model, checkpoints, seed, step, losses)
        tokenizer.save_pretrained(checkpoints / f"checkpoint-{step}")
    average_main([str(checkpoints), "--last", "2", "--output_dir", str(tmp_path / "avg")])
    loaded = AutoModelForSeq2SeqLM.from_pretrained(tmp_path / "avg")
    name = "model.decoder.layers.1.fc2.weight"
    torch.testing.assert_close(
        loaded.state_dict()[name], (models[1].state_dict()[name] + models[2].state_dict()[name]) / 2
    )
    assert loaded.lm_head.weight.data_ptr() == loaded.model.shared.weight.data_ptr()  # still tied
    assert "model.shared.weight" in load_file(tmp_path / "avg" / "model.safetensors")


def save_checkpoints(tiny_model, checkpoints, tokenizer, steps=(1, 2, 3)):
    for seed, step in enumerate(steps):
        folder = checkpoints / f"checkpoint-{step}"
        tiny_model(seed=seed).save_pretrained(folder)
        tokenizer.save_pretrained(folder)
        history = [{"step": s, "eval_loss": 2.0 + s / 10} for s in steps if s <= step]
        (folder / "trainer_state.json").write_text(json.dumps({"log_history": history}))


def finished_run(tiny_model, folder):
    """A run folder as train.py leaves it: weights, scores, card and translations."""
    tiny_model(seed=9).save_pretrained(folder)
    for name, text in (("scores.json", '{"bleu": 35.1}'), ("README.md", "# card"), ("test.hyp.de", "x\n")):
        (folder / name).write_text(text)


def swap_two_tokens(checkpoint):
    """The same vocabulary size, another tokenizer: two tokens trade their ids."""
    path = checkpoint / "tokenizer.json"
    tokenizer_json = json.loads(path.read_text())
    vocab = tokenizer_json["model"]["vocab"]
    first, second = sorted(vocab, key=vocab.get)[10:12]
    vocab[first], vocab[second] = vocab[second], vocab[first]
    path.write_text(json.dumps(tokenizer_json))


def no_change(tmp, tiny_model):
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
        lambda tmp, tiny_model: finished_run(tiny_model, tmp / "run"),
        "{c} --last 2 --output_dir {t}/run",
        ["--output_dir {t}/run already holds a model or run", "scores.json", "--overwrite_output_dir"],
    ),
    "output-is-a-file": (
        lambda tmp, tiny_model: (tmp / "avg.txt").write_text("x"),
        "{c} --last 2 --output_dir {t}/avg.txt",
        ["--output_dir {t}/avg.txt is a file"],
    ),
    "same-vocabulary-size-other-tokenizer": (
        lambda tmp, tiny_model: swap_two_tokens(tmp / "ckpts" / "checkpoint-3"),
        "{c} --last 2 --output_dir {t}/avg",
        ["{c}/checkpoint-3 has another tokenizer than {c}/checkpoint-2", "tokenizer.json (sha256"],
    ),
    "checkpoints-without-tokenizer": (
        lambda tmp, tiny_model: [path.unlink() for path in (tmp / "ckpts").glob("*/tokenizer*.json")],
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
        lambda tmp, tiny_model: (tmp / "ckpts" / "checkpoint-3" / "trainer_state.json").unlink(),
        "{c} --best 2 --output_dir {t}/avg",
        ["{c}/checkpoint-3/trainer_state.json is missing"],
    ),
}


@pytest.mark.parametrize("prepare, argv, words", list(AVERAGE_FAULTS.values()), ids=list(AVERAGE_FAULTS))
def test_average_checkpoints_refuses_without_touching_a_file(
    prepare, argv, words, bpe_tokenizer, tmp_path, run_tool, tiny_model
):
    save_checkpoints(tiny_model, tmp_path / "ckpts", bpe_tokenizer)
    prepare(tmp_path, tiny_model)
    before = snapshot(tmp_path)
    paths = {"c": tmp_path / "ckpts", "t": tmp_path}
    code, message = run_tool(average_main, argv.format(**paths).split())
    assert_refused(code, message, [word.format(**paths) for word in words])
    assert snapshot(tmp_path) == before  # no checkpoint, run or folder changed or added


def averaged_weight(checkpoints, steps, name="model.decoder.layers.1.fc2.weight"):
    from safetensors.torch import load_file

    tensors = [load_file(checkpoints / f"checkpoint-{step}" / "model.safetensors")[name] for step in steps]
    return name, sum(tensors) / len(tensors)


def test_overwriting_a_finished_run_replaces_the_whole_folder(
    bpe_tokenizer, tmp_path, monkeypatch, capsys, tiny_model
):
    """With --overwrite_output_dir the old scores, card and translations go with the old weights: the folder
    holds the average and the newest checkpoint's config and tokenizer, and nothing is left beside it."""
    from transformers import AutoModelForSeq2SeqLM

    save_checkpoints(tiny_model, tmp_path / "ckpts", bpe_tokenizer)
    finished_run(tiny_model, tmp_path / "run")
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


def test_a_failed_write_leaves_the_old_folder_as_it_was(tmp_path, tiny_model):
    """The averaged folder is written beside its place and renamed in only when complete."""
    finished_run(tiny_model, tmp_path / "run")
    before = snapshot(tmp_path / "run")
    with pytest.raises(RuntimeError, match="disk full"), write_whole(tmp_path / "run") as folder:
        (folder / "model.safetensors").write_bytes(b"half")
        raise RuntimeError("disk full")
    assert snapshot(tmp_path / "run") == before
    assert [path.name for path in tmp_path.iterdir()] == ["run"]
