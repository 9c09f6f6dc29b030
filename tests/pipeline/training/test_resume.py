"""No lost runs (pipeline/training/resume.py): a finished run is not overwritten without asking, resuming skips a
half-written or damaged checkpoint, makes no update past the budget, counts the time already spent and must
repeat the settings it continues."""

import json
import shutil
from types import SimpleNamespace

import pytest
import transformers.trainer
from torch.nn.modules.module import _IncompatibleKeys

from hf_posenc import MarianPosEncForConditionalGeneration
from hf_posenc.pipeline.training import arguments, resume, run
from hf_posenc.pipeline.training.trainer import TimeBudgetCallback, TranslationTrainer


def tiny_job_flags(tiny_run_flags, tmp_path):
    return [
        *tiny_run_flags(),
        "--minutes",
        "0",
        "--output_dir",
        str(tmp_path / "run"),
    ]


def test_a_finished_run_is_not_overwritten_without_asking(tmp_path, tiny_run_flags):
    flags = tiny_job_flags(tiny_run_flags, tmp_path)
    first = run.main([*flags, "--max_steps", "2"])
    with pytest.raises(ValueError, match="already hold a run; resume it with --resume_from_checkpoint last"):
        run.main([*flags, "--max_steps", "3"])
    assert json.loads((tmp_path / "run" / "scores.json").read_text())["steps"] == first["steps"] == 2
    assert run.main([*flags, "--max_steps", "3", "--overwrite_output_dir"])["steps"] == 3
    assert not (tmp_path / "run.partial").exists()  # the folder is written beside and renamed into place


def test_resuming_last_skips_a_half_written_checkpoint(tmp_path, caplog, tiny_run_flags):
    flags = tiny_job_flags(tiny_run_flags, tmp_path)
    run.main([*flags, "--max_steps", "2", "--save_strategy", "steps", "--save_steps", "1"])
    checkpoints = tmp_path / "run-checkpoints"
    (checkpoints / "checkpoint-2" / "trainer_state.json").unlink()  # cut off while being written
    args = arguments.parse_args([*flags, "--max_steps", "4", "--resume_from_checkpoint", "last"])
    assert resume.resume_checkpoint(args) == str(checkpoints / "checkpoint-1")
    assert "checkpoint-2 is incomplete (no trainer_state.json): trying the one before" in caplog.text
    # what a run stopped before its end says (Ctrl-C, a device out of memory)
    stopped = arguments.parse_args([*flags, "--save_strategy", "steps", "--save_steps", "1"]).training
    assert resume.how_to_resume(checkpoints, stopped) == (
        f"--resume_from_checkpoint last continues it from {checkpoints / 'checkpoint-1'}"
    )
    assert resume.how_to_resume(tmp_path / "none", stopped) == (
        f"no checkpoint is complete yet (one every {stopped.save_steps} updates): start it again with --overwrite_output_dir"
    )
    saving_none = arguments.parse_args([*flags, "--save_strategy", "no", "--average_last", "0"]).training
    assert resume.how_to_resume(checkpoints, saving_none) == (
        "it saves no checkpoints (--save_strategy no): start it again with --overwrite_output_dir"
    )
    scores = run.main([*flags, "--max_steps", "4", "--resume_from_checkpoint", "last"])
    # the record says which updates this attempt made, not "4 updates in <this attempt's minutes>"
    assert (scores["steps"], scores["updates_this_attempt"], scores["resumed_from"]) == (4, 3, "checkpoint-1")
    assert "4 updates (3 of them in this attempt's" in (tmp_path / "run" / "README.md").read_text()


def test_resuming_a_run_cut_off_after_its_last_checkpoint_makes_no_further_update(tmp_path, tiny_run_flags):
    """The Trainer's loop checks the budget only after an update: resuming at the budget must not call it."""
    flags = tiny_job_flags(tiny_run_flags, tmp_path)
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
        should_training_stop = should_save = False

    control = Control()
    budget.start -= 11  # eleven more seconds of training pass
    budget.on_step_end(SimpleNamespace(save_strategy="no", device="cpu"), State(), control)
    assert control.should_training_stop and not control.should_save


@pytest.mark.parametrize(
    "strategy, saved", [("steps", True), ("epoch", False), ("best", False), ("no", False)]
)
def test_the_budget_ends_a_run_with_a_checkpoint_where_it_saves_every_n_updates(strategy, saved):
    """As the Trainer saves where `max_steps` ends a run: the checkpoints averaged end where training did, not up
    to a checkpoint interval (4% of the planned run) before (a 16-minute run averaged 8,820-10,584 of 11,111)."""
    budget = TimeBudgetCallback(minutes=1.0)
    budget.on_train_begin(None, SimpleNamespace(stateful_callbacks={}), None)
    control = SimpleNamespace(should_training_stop=False, should_save=False)
    budget.on_step_end(SimpleNamespace(save_strategy=strategy, device="cpu"), None, control)
    assert not control.should_training_stop and not control.should_save  # within the budget
    budget.start -= 61
    budget.on_step_end(SimpleNamespace(save_strategy=strategy, device="cpu"), None, control)
    assert control.should_training_stop and control.should_save is saved


def test_a_checkpoint_with_truncated_weights_is_named_and_skipped(tmp_path, caplog, tiny_run_flags):
    flags = tiny_job_flags(tiny_run_flags, tmp_path)
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


def test_resuming_with_another_learning_rate_or_module_is_refused_naming_both(tmp_path, tiny_run_flags):
    """The restored scheduler would ignore a new learning rate while the card recorded it; another module would
    fail deep inside the optimizer. A resumed run must repeat the settings it continues."""
    flags = [
        *tiny_job_flags(tiny_run_flags, tmp_path),
        "--max_steps",
        "2",
        "--save_strategy",
        "steps",
        "--save_steps",
        "1",
    ]
    run.main(flags)
    resume = [*flags, "--max_steps", "3", "--resume_from_checkpoint", "last"]
    with pytest.raises(ValueError, match=r"learning_rate=0\.001 \(the run resumed: 0\.002\)"):
        run.main([*resume, "--learning_rate", "0.001"])
    with pytest.raises(
        ValueError, match=r"encoder_position_encoding='learned' \(the run resumed: 'sinusoidal'\)"
    ):
        run.main([*resume, "--position_encoding", "learned"])
    assert run.main(resume)["steps"] == 3


def test_resuming_another_runs_checkpoint_checks_its_settings_even_without_its_record(
    tmp_path, tiny_run_flags
):
    """Resuming another run's checkpoint (into a new folder) compares with that run's record; with the record
    gone, with what the checkpoint holds: its scheduler's learning rate and its config.json."""
    flags = [*tiny_run_flags(), "--minutes", "0", "--save_strategy", "steps", "--save_steps", "1"]
    run.main([*flags, "--output_dir", str(tmp_path / "first"), "--max_steps", "2"])
    checkpoint = tmp_path / "first-checkpoints" / "checkpoint-2"
    again = [*flags, "--output_dir", str(tmp_path / "second"), "--max_steps", "3"]
    again += ["--resume_from_checkpoint", str(checkpoint)]
    for record in ("kept", "gone"):
        if record == "gone":
            (checkpoint.parent / resume.SETTINGS_FILE).unlink()
        with pytest.raises(ValueError, match=r"learning_rate=0\.001 \(the run resumed: 0\.002\)"):
            run.main([*again, "--learning_rate", "0.001"])
        with pytest.raises(
            ValueError, match=r"encoder_position_encoding='learned' \(the run resumed: 'sinusoidal'\)"
        ):
            run.main([*again, "--position_encoding", "learned"])
    assert run.main(again)["steps"] == 3
    assert (tmp_path / "second-checkpoints" / resume.SETTINGS_FILE).is_file()  # the new run's own record


def test_resuming_warns_of_neither_the_tied_embeddings_nor_a_deprecated_config_key(
    tmp_path, tiny_run_flags, monkeypatch, recwarn
):
    """A checkpoint saves the shared embedding once (its tied copies `lm_head` and the stacks' `embed_tokens` are
    filled from it), and the Trainer reads its config.json with the base config class, whose `rope_scaling`
    setter warns of deprecation: neither is a fault to report on every resume. A key really missing is still
    reported."""
    flags = [*tiny_job_flags(tiny_run_flags, tmp_path), "--save_strategy", "steps", "--save_steps", "1"]
    run.main([*flags, "--max_steps", "1"])
    warned = []
    monkeypatch.setattr(
        transformers.trainer.logger, "warning", lambda message, *args, **kwargs: warned.append(message)
    )
    assert run.main([*flags, "--max_steps", "2", "--resume_from_checkpoint", "last"])["steps"] == 2
    assert not [message for message in warned if "missing keys" in message]
    assert not [warning for warning in recwarn if "rope_scaling" in str(warning.message)]

    trainer = object.__new__(TranslationTrainer)  # the hook reads only the model
    trainer.model = MarianPosEncForConditionalGeneration.from_pretrained(tmp_path / "run")
    trainer._issue_warnings_after_load(_IncompatibleKeys(["lm_head.weight", "model.shared.weight"], []))
    assert [message for message in warned if "missing keys" in message] == [
        "There were missing keys in the checkpoint model loaded: ['model.shared.weight']."
    ]


def test_a_config_field_added_after_the_run_was_recorded_counts_as_its_default(tmp_path, tiny_run_flags):
    """A run recorded before the config gained a field ran with that field's default: resuming it with the
    default continues; with another value it is refused, naming the default as the value of the run resumed."""
    flags = [
        *tiny_job_flags(tiny_run_flags, tmp_path),
        "--save_strategy",
        "steps",
        "--save_steps",
        "1",
    ]
    run.main([*flags, "--max_steps", "1"])
    record = tmp_path / "run-checkpoints" / resume.SETTINGS_FILE
    settings = json.loads(record.read_text())
    for name, default in (("cross_attention_window", None), ("cross_attention_window_ratio", 1.0)):
        assert settings["model"].pop(name) == default  # the record of a run older than these fields
    record.write_text(json.dumps(settings))
    again = [*flags, "--max_steps", "2", "--resume_from_checkpoint", "last"]
    window = '{"cross_attention_window": 8, "cross_attention_window_ratio": 1.5}'
    with pytest.raises(
        ValueError,
        match=r"cross_attention_window=8 \(the run resumed: None\); "
        r"cross_attention_window_ratio=1\.5 \(the run resumed: 1\.0\)",
    ):
        run.main([*again, "--config_overrides", window])
    assert run.main(again)["steps"] == 2
