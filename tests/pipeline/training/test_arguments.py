"""Bad input gets a clear error naming the bad value, file or flag — before any data is read where the value
alone shows it is wrong — never a deep traceback, a silent wrong result or the loss of a finished run.
Each case: what is given, the error expected, and words its message must contain."""

import gzip
import json
import shutil

import pytest
import torch
from conftest import DATA_DIR, source_batch, tiny_model, tiny_run_flags

from hf_posenc import MarianPosEncConfig
from hf_posenc.pipeline.data.files import read_lines
from hf_posenc.pipeline.evaluation.decoding import load_translation_model
from hf_posenc.pipeline.evaluation.scoring import paired_bootstrap
from hf_posenc.pipeline.training import arguments, resume, run
from hf_posenc.pipeline.training.averaging import average_state_dicts, select_checkpoints
from hf_posenc.pipeline.training.trainer import TimeBudgetCallback

# train.py flags whose value alone is wrong: refused by the parser (exit 2) with these words.
BAD_FLAGS = [
    (["--config_overrides", '{"posnet_dimm": 3}'], ["posnet_dimm", "did you mean 'posnet_dim'"]),
    (["--config_overrides", "{posnet_dim: 3}"], ["--config_overrides is not valid JSON"]),
    (["--config_overrides", "[1, 2]"], ["--config_overrides must be a JSON object"]),
    (["--layers", "0"], ["--layers=0 must be at least 1"]),
    (["--ffn_dim", "0"], ["--ffn_dim=0 must be at least 1"]),
    (["--d_model", "-8"], ["--d_model=-8 must be at least 1"]),
    (["--vocab_size", "0"], ["--vocab_size=0 must be at least 1"]),
    (["--heads", "3"], ["d_model=256 must be divisible by encoder_attention_heads=3"]),
    (["--train_limit", "-5"], ["--train_limit=-5 must be at least 1"]),
    (["--train_limit", "0"], ["--train_limit=0 must be at least 1"]),
    (["--test_limit", "0"], ["--test_limit=0 must be at least 1"]),
    (["--minutes", "-1"], ["--minutes=-1.0 must be a finite number, at least 0"]),
    (["--minutes", "nan"], ["--minutes=nan must be a finite number"]),
    (["--minutes", "inf"], ["--minutes=inf must be a finite number"]),
    (["--save_strategy", "steps", "--save_steps", "0"], ["--save_steps=0.0 must be at least 1"]),
    (["--length_penalty", "nan"], ["--length_penalty=nan must be a finite number"]),
    (["--learning_rate", "-0.001"], ["--learning_rate=-0.001 must be a finite number, at least 0"]),
    (["--learning_rate", "0"], ["--learning_rate=0 trains nothing"]),
    (["--dropout", "1.5"], ["--dropout=1.5 must be a finite number, at least 0 and at most 1"]),
    (["--config_overrides", '{"posnet_dim": "wide"}'], ["invalid model settings", "posnet_dim"]),
    (["--max_tokens", "20"], ["--max_tokens=20 cannot hold a sentence of --max_length=128 tokens"]),
    (["--hub_private_repo", "true"], ["--hub_private_repo given without --push_to_hub"]),
    (
        ["--push_to_hub", "--hub_model_id", "a/b", "--hub_strategy", "checkpoint"],
        ["--hub_strategy=checkpoint is not supported", "allowed: end"],
    ),
    (["--push_to_hub", "--hub_model_id", "a/b", "--hub_always_push"], ["--hub_always_push is not supported"]),
    (["--max_steps", "0"], ["--max_steps=0 must be positive"]),
    (["--max_steps", "-3"], ["--max_steps=-3 must be positive"]),
    (["--save_strategy", "steps", "--save_steps", "-1"], ["--save_steps=-1"]),
    (["--eval_strategy", "steps", "--eval_steps", "-1"], ["--eval_steps=-1"]),
    (["--gradient_accumulation_steps", "0"], ["--gradient_accumulation_steps=0 must be at least 1"]),
    (["--bf16"], ["--precision"]),
    (["--position_encoding", "rotary"], ["'rotary' is not known", "allowed values"]),
    (
        ["--encoder_self_attention", "fourier", "--decoder_self_attention", "fourier"],
        ["cannot be used there"],
    ),
    (["--save_strategy", "no", "--average_last", "5"], ["checkpoint averaging needs checkpoints"]),
    (
        ["--minutes", "0", "--max_steps", "120", "--average_last", "5"],
        ["writes 2 checkpoints, fewer than the 5"],
    ),
    (
        ["--concat_probability", "1.5"],
        ["--concat_probability=1.5 must be a finite number, at least 0 and at most 1"],
    ),
    (
        ["--concat_probability", "0.5", "--concat_group_sizes", "2", "1"],
        ["--concat_group_sizes=[2, 1]", "whole numbers >= 2"],
    ),
    (["--concat_group_sizes", "3"], ["--concat_group_sizes needs --concat_probability"]),
    (["--recipe", "wmt15"], ["unknown recipe 'wmt15'; available:"]),
]


@pytest.mark.parametrize("flags, words", BAD_FLAGS, ids=[" ".join(f) for f, _ in BAD_FLAGS])
def test_bad_train_flags_are_refused_by_the_parser_naming_the_flag(flags, words, capsys):
    with pytest.raises(SystemExit) as exit_info:
        arguments.parse_args(["--recipe", "multi30k-en-de-small", *flags])
    assert exit_info.value.code == 2
    message = capsys.readouterr().err
    for word in words:
        assert word in message, message


@pytest.mark.parametrize(
    "recipe, words",
    [
        ("d_model: [1\n", ["is not valid YAML"]),
        ("- 128\n- 256\n", ["must be a mapping of settings, got a list"]),
        ("d_model: 64\nlearnig_rate: 0.1\n", ["unknown keys ['learnig_rate']"]),
        ("extends: bad\n", ["extends itself"]),
    ],
    ids=["invalid-yaml", "a-list", "unknown-key", "extends-itself"],
)
def test_bad_recipes_name_the_recipe_file(recipe, words, tmp_path, monkeypatch, capsys):
    (tmp_path / "bad.yaml").write_text(recipe)
    monkeypatch.setattr(arguments, "RECIPES", tmp_path)
    with pytest.raises(SystemExit):
        arguments.parse_args(["--recipe", "bad"])
    message = capsys.readouterr().err
    for word in words:
        assert word in message, message


@pytest.mark.parametrize(
    "fields, words",
    [
        (
            {"posnet_dimm": 3},
            ["unknown MarianPosEncConfig fields: 'posnet_dimm' (did you mean 'posnet_dim'?)"],
        ),
        ({"encoder_layers": 0}, ["encoder_layers=0 must be a positive integer"]),
        ({"decoder_ffn_dim": 0}, ["decoder_ffn_dim=0 must be a positive integer"]),
        ({"d_model": -4}, ["d_model=-4 must be a positive integer"]),
        ({"vocab_size": -1}, ["vocab_size=-1 must be a positive integer"]),
        ({"dropout": 1.5}, ["dropout=1.5 must be in [0, 1)"]),
        ({"posnet_dim": 0}, ["posnet_dim=0 must be >= 1"]),
        ({"rpe_cell": "transformer"}, ["rpe_cell='transformer' is not known; allowed values: rnn"]),
        ({"shape_max_shift": -1}, ["shape_max_shift=-1 must be >= 0"]),
    ],
    ids=lambda value: next(iter(value)) if isinstance(value, dict) else "",
)
def test_bad_config_values_fail_when_the_config_is_built(fields, words):
    with pytest.raises(ValueError) as error:
        MarianPosEncConfig(**fields)
    for word in words:
        assert word in str(error.value)


def test_data_files_with_bad_bytes_or_damaged_gzip_name_the_file(tmp_path):
    (tmp_path / "bad.txt").write_bytes(b"fine\n\xff not utf-8\n")
    with pytest.raises(ValueError, match=r"bad\.txt, line 2: byte b'\\xff' at column 1 is not UTF-8"):
        read_lines(tmp_path / "bad.txt")
    (tmp_path / "cut.gz").write_bytes(gzip.compress(b"a line\n" * 1000)[:40])
    with pytest.raises(ValueError, match=r"cut\.gz is not a readable gzip file"):
        read_lines(tmp_path / "cut.gz")


def test_bad_model_inputs_are_named():
    model = tiny_model()
    source, mask = source_batch()
    start = torch.zeros(3, 1, dtype=torch.long)
    cases = [
        (dict(input_ids=torch.zeros(0, 5, dtype=torch.long), decoder_input_ids=start), "hold no token"),
        (dict(input_ids=torch.zeros(2, 0, dtype=torch.long), decoder_input_ids=start), "hold no token"),
        (
            dict(input_ids=torch.full((1, 3), 99), decoder_input_ids=start[:1]),
            "token id 99, outside the vocabulary 0..59",
        ),
        (
            dict(input_ids=torch.full((1, 3), -1), decoder_input_ids=start[:1]),
            "token id -1, outside the vocabulary",
        ),
        (
            dict(input_ids=source, attention_mask=mask[:, :5], decoder_input_ids=start),
            "attention_mask has shape (3, 5)",
        ),
        (dict(input_ids=source, labels=torch.full((3, 4), -100)), "labels are all -100"),
        (dict(input_ids=source, labels=torch.full((3, 4), 70)), "labels hold token id 70"),
    ]
    for inputs, words in cases:
        with pytest.raises(
            ValueError, match=words.replace("(", r"\(").replace(")", r"\)").replace(".", r"\.")
        ):
            model(**inputs)
    with pytest.raises(ValueError, match="num_beams=0 must be at least 1"):
        model.generate(source, attention_mask=mask, num_beams=0)


def test_unreadable_weights_and_folders_without_tokenizer_name_the_folder(tmp_path):
    model = tiny_model()
    model.save_pretrained(tmp_path / "model")
    with pytest.raises(ValueError, match="has no tokenizer"):
        load_translation_model(tmp_path / "model")
    with pytest.raises(FileNotFoundError, match="does not exist"):
        load_translation_model(tmp_path / "nothing")
    weights = tmp_path / "model" / "model.safetensors"
    weights.write_bytes(weights.read_bytes()[:100])
    with pytest.raises(ValueError, match=r"the weights in .*model cannot be read \(truncated or damaged\?\)"):
        type(model).from_pretrained(tmp_path / "model")


def save_checkpoint(folder, step, **overrides):
    tiny_model(**overrides).save_pretrained(folder / f"checkpoint-{step}")


def test_averaging_refuses_checkpoints_of_different_models_and_zero_checkpoints(tmp_path):
    save_checkpoint(tmp_path / "a", 1, position_encoding="sinusoidal")
    save_checkpoint(tmp_path / "a", 2, position_encoding="alibi")  # the same tensor names
    with pytest.raises(ValueError, match="checkpoint-2 is another model than .*checkpoint-1: config fields"):
        average_state_dicts(select_checkpoints(tmp_path / "a", last=2))
    save_checkpoint(tmp_path / "b", 1, vocab_size=60)
    save_checkpoint(tmp_path / "b", 2, vocab_size=70)
    with pytest.raises(ValueError, match="vocab_size"):
        average_state_dicts(select_checkpoints(tmp_path / "b", last=2))
    with pytest.raises(ValueError, match="at least 1, got 0"):
        select_checkpoints(tmp_path / "a", last=0)


def test_zero_bootstrap_samples_are_an_error_not_sacrebleus_default():
    with pytest.raises(ValueError, match="bootstrap samples=0 must be at least 1"):
        paired_bootstrap(["a"], ["a"], ["a"], samples=0)


# ---- no lost runs


def tiny_job_flags(tmp_path):
    return [
        *tiny_run_flags(),
        "--minutes",
        "0",
        "--output_dir",
        str(tmp_path / "run"),
    ]


@pytest.mark.skipif(not DATA_DIR.is_dir(), reason="shared data folder absent")
def test_a_finished_run_is_not_overwritten_without_asking(tmp_path):
    flags = tiny_job_flags(tmp_path)
    first = run.main([*flags, "--max_steps", "2"])
    with pytest.raises(ValueError, match="already hold a run; resume it with --resume_from_checkpoint last"):
        run.main([*flags, "--max_steps", "3"])
    assert json.loads((tmp_path / "run" / "scores.json").read_text())["steps"] == first["steps"] == 2
    assert run.main([*flags, "--max_steps", "3", "--overwrite_output_dir"])["steps"] == 3
    assert not (tmp_path / "run.partial").exists()  # the folder is written beside and renamed into place


@pytest.mark.skipif(not DATA_DIR.is_dir(), reason="shared data folder absent")
def test_resuming_last_skips_a_half_written_checkpoint(tmp_path, caplog):
    flags = tiny_job_flags(tmp_path)
    run.main([*flags, "--max_steps", "2", "--save_strategy", "steps", "--save_steps", "1"])
    checkpoints = tmp_path / "run-checkpoints"
    (checkpoints / "checkpoint-2" / "trainer_state.json").unlink()  # cut off while being written
    args = arguments.parse_args([*flags, "--max_steps", "4", "--resume_from_checkpoint", "last"])
    assert resume.resume_checkpoint(args) == str(checkpoints / "checkpoint-1")
    assert "checkpoint-2 is incomplete (no trainer_state.json): trying the one before" in caplog.text
    scores = run.main([*flags, "--max_steps", "4", "--resume_from_checkpoint", "last"])
    # the record says which updates this attempt made, not "4 updates in <this attempt's minutes>"
    assert (scores["steps"], scores["updates_this_attempt"], scores["resumed_from"]) == (4, 3, "checkpoint-1")
    assert "4 updates (3 of them in this attempt's" in (tmp_path / "run" / "README.md").read_text()


@pytest.mark.skipif(not DATA_DIR.is_dir(), reason="shared data folder absent")
def test_resuming_a_run_cut_off_after_its_last_checkpoint_makes_no_further_update(tmp_path):
    """The Trainer's loop checks the budget only after an update: resuming at the budget must not call it."""
    flags = tiny_job_flags(tmp_path)
    first = run.main([*flags, "--max_steps", "2", "--save_strategy", "steps", "--save_steps", "1"])
    weights = (tmp_path / "run" / "model.safetensors").read_bytes()
    shutil.rmtree(tmp_path / "run")  # cut off while decoding: the checkpoints hold the whole budget
    again = run.main(
        [
            *flags,
            "--max_steps",
            "2",
            "--save_strategy",
            "steps",
            "--save_steps",
            "1",
            "--resume_from_checkpoint",
            "last",
        ]
    )
    assert (again["steps"], again["updates_this_attempt"], again["resumed_from"]) == (2, 0, "checkpoint-2")
    assert not (tmp_path / "run-checkpoints" / "checkpoint-3").exists()
    assert (tmp_path / "run" / "model.safetensors").read_bytes() == weights and again["bleu"] == first["bleu"]


def test_a_resumed_time_budget_counts_the_time_already_spent():
    """The time spent is saved with each checkpoint (TrainerState.stateful_callbacks) and read back on resume."""

    class State:
        stateful_callbacks = {
            "TimeBudgetCallback": {"args": {"minutes": 1.0}, "attributes": {"spent_seconds": 50.0}}
        }

    budget = TimeBudgetCallback(minutes=1.0)
    budget.on_train_begin(None, State(), None)
    assert budget.spent_seconds == 50.0 and budget.state()["attributes"]["spent_seconds"] == 50.0

    class Control:
        should_training_stop = False

    control = Control()
    budget.start -= 11  # eleven more seconds of training pass
    budget.on_step_end(None, State(), control)
    assert control.should_training_stop


@pytest.mark.skipif(not DATA_DIR.is_dir(), reason="shared data folder absent")
def test_a_checkpoint_with_truncated_weights_is_named_and_skipped(tmp_path, caplog):
    flags = tiny_job_flags(tmp_path)
    run.main([*flags, "--max_steps", "2", "--save_strategy", "steps", "--save_steps", "1"])
    weights = tmp_path / "run-checkpoints" / "checkpoint-2" / "model.safetensors"
    weights.write_bytes(weights.read_bytes()[:64])
    args = arguments.parse_args([*flags, "--max_steps", "4", "--resume_from_checkpoint", "last"])
    assert resume.resume_checkpoint(args).endswith("checkpoint-1")
    assert "checkpoint-2/model.safetensors cannot be read" in caplog.text
    explicit = arguments.parse_args(
        [*flags, "--max_steps", "4", "--resume_from_checkpoint", str(weights.parent)]
    )
    with pytest.raises(ValueError, match="checkpoint-2/model.safetensors cannot be read"):
        resume.resume_checkpoint(explicit)
