"""The run folder and the Hub upload (pipeline/export/run_folder.py): the run's folders are checked before any
work, a run is replaced only once the new one is written, the loggers' files are uploaded, and the Hub upload
honours every Hub field (a private push is never published)."""

import json
from pathlib import Path
from types import SimpleNamespace

import pytest

from hf_posenc.pipeline.export.run_folder import (
    check_output_folders,
    copy_training_logs,
    push_to_hub,
    write_run_folder,
)
from hf_posenc.pipeline.training import arguments, run


def hub_fields(**fields):
    defaults = dict(hub_model_id="someone/model", hub_token=None, hub_private_repo=None, hub_revision=None)
    return SimpleNamespace(**{**defaults, **fields})


def a_run_folder(tmp_path) -> Path:
    folder = tmp_path / "upload"
    folder.mkdir()
    (folder / "model.safetensors").write_text("weights")
    return folder


def test_a_private_push_creates_a_private_repository_with_the_token(hub, tmp_path):
    push_to_hub(a_run_folder(tmp_path), hub_fields(hub_private_repo=True, hub_token="hf_secret"), "msg")
    assert hub.token == "hf_secret"
    assert [name for name, _ in hub.calls] == ["create_repo", "repo_info", "upload_folder"]
    assert hub.calls[0][1] == {"repo_id": "someone/model", "private": True, "exist_ok": True}
    assert hub.visibility == {"someone/model": True}
    assert hub.calls[2][1]["files"] == ["model.safetensors"]


def test_a_private_push_to_an_existing_public_repository_uploads_nothing(hub, tmp_path):
    hub.visibility["someone/model"] = False
    with pytest.raises(ValueError, match="exists and is public; nothing was uploaded"):
        push_to_hub(a_run_folder(tmp_path), hub_fields(hub_private_repo=True), "msg")
    assert "upload_folder" not in [name for name, _ in hub.calls]


def test_a_revision_is_a_branch_the_upload_goes_to(hub, tmp_path):
    push_to_hub(a_run_folder(tmp_path), hub_fields(hub_revision="seed-2"), "msg")
    assert [name for name, _ in hub.calls] == ["create_repo", "create_branch", "upload_folder"]
    assert hub.calls[1][1] == {"repo_id": "someone/model", "branch": "seed-2", "exist_ok": True}
    assert hub.calls[2][1]["revision"] == "seed-2"


def test_the_parsed_hub_flags_reach_the_upload(hub, tmp_path):
    args = arguments.parse_args(
        [
            "--recipe",
            "multi30k-en-de-tiny",
            "--output_dir",
            str(tmp_path / "run"),
            "--push_to_hub",
            "--hub_model_id",
            "someone/model",
            "--hub_private_repo",
            "true",
            "--hub_token",
            "hf_x",
            "--hub_revision",
            "main",
            "--hub_strategy",
            "end",
        ]
    )
    push_to_hub(a_run_folder(tmp_path), args.training, "msg")
    assert hub.token == "hf_x" and hub.visibility == {"someone/model": True}
    assert hub.calls[-1][1]["revision"] == "main"


def folders(tmp_path, resume=False, overwrite=False, dry_run=None):
    output = tmp_path / "run"
    check_output_folders(output, Path(f"{output}-checkpoints"), resume, overwrite, dry_run)


@pytest.mark.parametrize(
    "make, options, words",
    [
        (lambda t: (t / "run").write_text("x"), {}, ["--output_dir", "run is a file, not a folder"]),
        (lambda t: (t / "run-checkpoints").write_text("x"), {}, ["checkpoint folder", "is a file"]),
        (lambda t: (t / "run").mkdir() or (t / "run" / "a").write_text("x"), {}, ["already hold a run"]),
        (
            lambda t: (t / "done").mkdir() or (t / "done" / "scores.json").write_text("{}"),
            {"dry_run": "done"},
            ["--hub_dry_run", "already exists and is not an empty folder"],
        ),
        (lambda t: None, {"dry_run": "run"}, ["--hub_dry_run", "is the run's own folder"]),
        (
            lambda t: [
                (t / p).mkdir() or (t / p / "a").write_text("x") for p in ("run", "run-checkpoints.replaced")
            ],
            {"overwrite": True},
            ["run-checkpoints.replaced holds the checkpoints of a run", "did not finish replacing"],
        ),
    ],
    ids=[
        "output-is-a-file",
        "checkpoints-is-a-file",
        "finished-run",
        "dry-run-into-a-run",
        "dry-run-is-the-run",
        "earlier-overwrite-left-checkpoints",
    ],
)
def test_folders_that_would_fail_late_or_destroy_a_run_are_refused_first(tmp_path, make, options, words):
    make(tmp_path)
    if "dry_run" in options:
        options = {**options, "dry_run": tmp_path / options["dry_run"]}
    with pytest.raises(ValueError) as error:
        folders(tmp_path, **options)
    for word in words:
        assert word in str(error.value)


def test_an_output_location_that_cannot_be_written_is_refused_naming_it(tmp_path):
    (tmp_path / "file").write_text("x")
    with pytest.raises(ValueError, match="--output_dir: cannot write in .*file"):
        check_output_folders(
            tmp_path / "file" / "run", tmp_path / "file" / "run-checkpoints", False, False, None
        )


def test_a_failed_write_leaves_the_old_run_and_no_partial_folder(tmp_path):
    old = tmp_path / "run"
    old.mkdir()
    (old / "scores.json").write_text('{"bleu": 30}')

    def disk_full(folder: Path):
        folder.mkdir()
        (folder / "model.safetensors").write_text("half")
        raise OSError(28, "No space left on device")

    with pytest.raises(ValueError, match="writing the run folder .*run.partial failed .*No space left"):
        write_run_folder(old, disk_full)
    assert json.loads((old / "scores.json").read_text()) == {"bleu": 30}
    assert not (tmp_path / "run.partial").exists()


def test_a_new_folder_replaces_the_old_one_whole(tmp_path):
    old = tmp_path / "run"
    old.mkdir()
    (old / "old-card.md").write_text("old")
    write_run_folder(old, lambda folder: folder.mkdir() or (folder / "scores.json").write_text("{}"))
    assert sorted(p.name for p in old.iterdir()) == ["scores.json"]
    assert sorted(p.name for p in tmp_path.iterdir()) == ["run"]


def tiny_flags(tiny_run_flags, tmp_path):
    return [
        *tiny_run_flags(train_limit=200),
        "--minutes",
        "0",
        "--max_steps",
        "2",
        "--save_strategy",
        "steps",
        "--save_steps",
        "1",
        "--output_dir",
        str(tmp_path / "run"),
    ]


def test_overwriting_a_run_with_one_that_fails_keeps_the_old_run(tmp_path, monkeypatch, tiny_run_flags):
    """--overwrite_output_dir removes the old run only once the new one is written; a new run that fails in
    training leaves the old folder in place and its checkpoints set aside, and says so when run again."""
    flags = tiny_flags(tiny_run_flags, tmp_path)
    first = run.main(flags)
    old_weights = (tmp_path / "run" / "model.safetensors").read_bytes()

    def broken_training(*args, **kwargs):
        raise RuntimeError("killed")

    monkeypatch.setattr(run.TranslationTrainer, "train", broken_training)
    with pytest.raises(RuntimeError, match="killed"):
        run.main([*flags, "--overwrite_output_dir"])
    assert (tmp_path / "run" / "model.safetensors").read_bytes() == old_weights
    assert json.loads((tmp_path / "run" / "scores.json").read_text())["bleu"] == first["bleu"]
    assert (tmp_path / "run-checkpoints.replaced" / "checkpoint-2").is_dir()
    monkeypatch.undo()
    with pytest.raises(ValueError, match="did not finish replacing"):
        run.main([*flags, "--overwrite_output_dir"])


def test_the_loggers_files_go_into_the_uploaded_folder(tmp_path, monkeypatch):
    monkeypatch.delenv("TENSORBOARD_LOGGING_DIR", raising=False)
    events = tmp_path / "run-checkpoints" / "runs" / "Nov27_host"
    events.mkdir(parents=True)
    (events / "events.out.tfevents.1").write_bytes(b"x")
    folder = tmp_path / "run.partial"
    folder.mkdir()
    copy_training_logs(tmp_path / "run-checkpoints", folder)
    assert (folder / "runs" / "Nov27_host" / "events.out.tfevents.1").read_bytes() == b"x"
    elsewhere = tmp_path / "tb"
    elsewhere.mkdir()
    (elsewhere / "events.out.tfevents.2").write_bytes(b"y")
    monkeypatch.setenv("TENSORBOARD_LOGGING_DIR", str(elsewhere))
    other = tmp_path / "other.partial"
    other.mkdir()
    copy_training_logs(tmp_path / "run-checkpoints", other)
    assert (other / "runs" / "events.out.tfevents.2").is_file()


def test_the_hub_token_reaches_the_upload_and_no_written_file(hub, tmp_path, tiny_run_flags):
    """The Trainer pickles its arguments into every checkpoint (training_args.bin): the token stays out of them,
    and out of the run folder, and still reaches the upload."""
    token = "hf_NotARealTokenButLongEnough1234"
    flags = [*tiny_run_flags(), "--minutes", "0", "--max_steps", "2", "--output_dir", str(tmp_path / "run")]
    flags += ["--save_strategy", "steps", "--save_steps", "1"]
    run.main([*flags, "--push_to_hub", "--hub_model_id", "someone/model", "--hub_token", token])
    assert hub.token == token and [name for name, _ in hub.calls][-1] == "upload_folder"
    written = [path for path in tmp_path.rglob("*") if path.is_file()]
    assert any(path.name == "training_args.bin" for path in written)
    assert [path for path in written if token.encode() in path.read_bytes()] == []


def test_an_upload_the_hub_refuses_names_the_safe_run_folder_and_the_command_to_upload_again(
    hub, tmp_path, monkeypatch
):
    import httpx2
    from huggingface_hub.errors import HfHubHTTPError

    def refused(*args, **kwargs):
        response = httpx2.Response(403, request=httpx2.Request("POST", "https://huggingface.co/api/models/x"))
        raise HfHubHTTPError("403 Forbidden: you have no write access to someone/model", response=response)

    monkeypatch.setattr(hub, "upload_folder", refused)
    folder = a_run_folder(tmp_path)
    with pytest.raises(ValueError) as refusal:
        push_to_hub(folder, hub_fields(hub_revision="seed-2", hub_private_repo=True), "msg")
    message = str(refusal.value)
    assert "\n" not in message and "the Hub refused the upload to someone/model (HTTP 403" in message
    assert f"the run folder {folder} is written and safe" in message
    assert message.endswith(f"hf upload someone/model {folder} . --revision seed-2 --private")
    assert (folder / "model.safetensors").read_text() == "weights"


@pytest.mark.parametrize("saved", [False, True])
def test_a_failed_write_advises_resuming_only_where_a_checkpoint_is_saved(tmp_path, saved):
    checkpoints = tmp_path / "run-checkpoints"
    checkpoints.mkdir()
    if saved:
        (checkpoints / "checkpoint-4").mkdir()
        (checkpoints / "checkpoint-4" / "trainer_state.json").write_text("{}")

    def disk_full(folder: Path):
        raise OSError(28, "No space left on device")

    with pytest.raises(ValueError) as failure:
        write_run_folder(tmp_path / "run", disk_full, checkpoints)
    message = str(failure.value)
    assert ("--resume_from_checkpoint last" in message) == saved
    assert (
        f"are in {checkpoints} (checkpoint-4 and earlier)" if saved else "No checkpoint was saved"
    ) in message
