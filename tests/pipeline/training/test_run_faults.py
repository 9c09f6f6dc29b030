"""Training runs under faults (pipeline/training/run.py): settings that would fail only after the data stage are
refused with the other settings, before any data are read; batches too large for the machine's memory before the
first update, and a device that runs out of memory during training in one line."""

import re
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
import torch

from hf_posenc.pipeline.training import fit, hardware, run
from hf_posenc.pipeline.training.trainer import TranslationTrainer
from tests.helpers import REPO, assert_refused


def test_an_unknown_torch_compile_backend_is_refused_before_the_data(
    tmp_path, run_tool, monkeypatch, tiny_run_flags
):
    def no_data(*args, **kwargs):
        raise AssertionError("the data stage ran")

    monkeypatch.setattr(run, "prepare_data", no_data)
    flags = [*tiny_run_flags(), "--output_dir", tmp_path / "run", "--torch_compile_backend", "inductr"]
    code, message = run_tool(run.main, flags)
    assert_refused(
        code, message, ["--torch_compile_backend='inductr' is not a torch.compile backend", "inductor"]
    )


def no_training(*args, **kwargs):
    raise AssertionError("the training started")


def test_batches_whose_scores_cannot_fit_in_memory_are_refused_before_the_first_update(
    tmp_path, run_tool, monkeypatch, tiny_run_flags
):
    """Before: the process grew until the kernel killed it, without a message (the default recipe with
    `--max_tokens 100000000`: one batch of every pair, 97 GiB of logits). The machine here has 64 KiB."""
    monkeypatch.setattr(hardware, "available_memory", lambda device: 2**16)
    monkeypatch.setattr(hardware, "heap_free_bytes", lambda: 0)
    monkeypatch.setattr(TranslationTrainer, "train", no_training)
    flags = [*tiny_run_flags(), "--output_dir", tmp_path / "run", "--max_steps", "2", "--average_last", "0"]
    code, message = run_tool(run.main, flags)
    assert_refused(code, message, ["x 400 tokens needs at least", "more than the 0.1 MiB available (cpu)"])
    positions = int(re.search(r"training on batches of (\d+) target positions x 400 tokens", message)[1])
    assert f"needs at least {positions * 400 * 8 / 2**20:.1f} MiB" in message and 0 < positions <= 4096
    assert message.endswith(": lower --max_tokens"), message
    stock = [
        "--architecture",
        "stock_marian",
        "--per_device_train_batch_size",
        "16",
        "--learning_rate",
        "7e-4",
    ]
    code, message = run_tool(run.main, [*flags, *stock, "--overwrite_output_dir", "true"])
    assert_refused(code, message, ["training on batches of", "lower --per_device_train_batch_size"])


def test_a_training_that_runs_out_of_the_devices_memory_ends_in_one_line(
    tmp_path, run_tool, monkeypatch, tiny_run_flags
):
    """A GPU's memory is not checked before training: torch's error comes from inside an update."""

    def out_of_memory(*args, **kwargs):
        raise torch.OutOfMemoryError("CUDA out of memory. Tried to allocate 20.00 GiB")

    monkeypatch.setattr(TranslationTrainer, "train", out_of_memory)
    flags = [*tiny_run_flags(), "--output_dir", tmp_path / "run", "--max_steps", "2", "--average_last", "0"]
    code, message = run_tool(run.main, flags)
    assert_refused(
        code,
        message,
        [
            "training ran out of cpu memory: lower --max_tokens",
            "it saves no checkpoints (--save_strategy no)",
        ],
    )


def test_ctrl_c_during_training_ends_in_one_line_naming_the_checkpoint_that_resumes_it(
    tmp_path, tiny_run_flags
):
    """A real SIGINT to train.py after its first checkpoint: the update under way finishes and is saved, then exit
    code 130 and one line, where the Trainer's KeyboardInterrupt printed its stack (or, landing in a checkpoint's
    rotation, an OSError's)."""
    output = tmp_path / "run"
    saves = [
        "--save_strategy",
        "steps",
        "--save_steps",
        "2",
        "--average_last",
        "0",
        "--save_total_limit",
        "2",
    ]
    budget = ["--max_steps", "100000", "--minutes", "0"]
    command = [sys.executable, str(REPO / "train_scripts" / "train.py"), *tiny_run_flags(), *saves, *budget]
    process = subprocess.Popen(
        [*map(str, command), "--output_dir", str(output)], stderr=subprocess.PIPE, text=True
    )
    deadline = time.monotonic() + 300
    checkpoints = Path(f"{output}-checkpoints")
    while not any(checkpoints.glob("checkpoint-*/trainer_state.json")) and process.poll() is None:
        assert time.monotonic() < deadline, "no checkpoint within 300 s"
        time.sleep(0.05)
    process.send_signal(signal.SIGINT)
    written = process.communicate(timeout=120)[1]
    assert process.returncode == 130 and "Traceback" not in written, written[-3000:]
    last = written.strip().splitlines()[-1]
    stopped = re.fullmatch(
        rf"train.py: interrupted: training stopped at update (\d+); --resume_from_checkpoint last continues it from "
        rf"{re.escape(str(checkpoints))}/checkpoint-(\d+)",
        last,
    )
    assert stopped and stopped[1] == stopped[2], last  # the update under way finished, and was saved


def free_space(monkeypatch, free: int) -> None:
    """Every disk has `free` bytes free."""
    real = shutil.disk_usage
    monkeypatch.setattr(fit.shutil, "disk_usage", lambda path: real(path)._replace(free=free))


def test_checkpoints_that_cannot_fit_on_their_disk_are_refused_before_the_first_update(
    tmp_path, run_tool, monkeypatch, tiny_run_flags
):
    """Before: the run trained until a save ran out of space and ended in OSError's or torch's stack (a 3 MiB
    tmpfs: `[Errno 28] No space left on device` copying the model code into checkpoint-8)."""
    monkeypatch.setattr(TranslationTrainer, "train", no_training)
    free_space(monkeypatch, 1000)
    saves = [
        "--save_strategy",
        "steps",
        "--save_steps",
        "2",
        "--save_total_limit",
        "3",
        "--average_last",
        "0",
    ]
    flags = [*tiny_run_flags(), "--output_dir", tmp_path / "run", *saves, "--max_steps", "100"]
    code, message = run_tool(run.main, flags)
    sizes = re.search(
        r"needs at least ([\d.]+) MiB on the disk of .* \(4 checkpoints of ([\d.]+) MiB held", message
    )
    assert sizes and float(sizes[1]) > 4 * float(sizes[2]) > 1, message  # and the run folder's weights
    assert message.endswith(
        "and 0.0 MiB are free: free space, keep fewer checkpoints (--save_total_limit), or write "
        "elsewhere (--output_dir)"
    ), message
    code, message = run_tool(run.main, [*flags[:-1], "4"])  # 4 updates save 2 checkpoints
    assert "(2 checkpoints of" in message
    code, message = run_tool(run.main, [*flags, "--save_strategy", "no"])
    assert "(0 checkpoints of" in message  # the run folder's weights alone


def test_a_resumed_run_counts_the_space_of_the_checkpoints_it_rotates_out(
    tmp_path, monkeypatch, tiny_run_flags
):
    from hf_posenc.pipeline.training import arguments

    flags = [*map(str, tiny_run_flags()), "--output_dir", str(tmp_path / "run"), "--save_total_limit", "1"]
    flags += ["--save_strategy", "steps", "--save_steps", "2", "--average_last", "0", "--max_steps", "100"]
    args = arguments.parse_args(flags)
    model = torch.nn.Linear(1000, 10)
    model.num_parameters = lambda: 10_010
    need = (
        2 * fit.CHECKPOINT_BYTES * 10_010 + fit.WEIGHT_BYTES * 10_010
    )  # 2 checkpoints held at once, the weights
    saved = args.checkpoints_dir / "checkpoint-2"
    saved.mkdir(parents=True)
    (saved / "optimizer.pt").write_bytes(bytes(fit.CHECKPOINT_BYTES * 10_010))
    free_space(monkeypatch, need - 1)
    with pytest.raises(ValueError, match=r"the run needs at least .* \(2 checkpoints of"):
        fit.check_disk_space(args, model)  # an overwritten run's checkpoints stay until it ends
    resumed = arguments.parse_args([*flags, "--resume_from_checkpoint", "last"])
    fit.check_disk_space(resumed, model)  # the new checkpoint replaces the old one


def test_a_save_that_fills_the_disk_ends_in_one_line_and_other_failures_keep_their_stack(
    tmp_path, run_tool, monkeypatch, tiny_run_flags
):
    """torch.save on a full disk raises a RuntimeError that says nothing of the disk: the free space decides."""

    def save_fails(*args, **kwargs):
        raise RuntimeError("[enforce fail at inline_container.cc:672] . unexpected pos 576 vs 534")

    monkeypatch.setattr(TranslationTrainer, "train", save_fails)
    flags = [*tiny_run_flags(), "--output_dir", tmp_path / "run", "--max_steps", "2", "--average_last", "0"]
    monkeypatch.setattr(run, "check_disk_space", lambda *args: None)  # it passed the check, then filled up
    free_space(monkeypatch, 1000)
    code, message = run_tool(run.main, flags)
    assert_refused(
        code, message, ["the disk of", "is full (0.0 MiB free, a checkpoint takes", "(--save_total_limit)"]
    )
    monkeypatch.undo()
    monkeypatch.setattr(TranslationTrainer, "train", save_fails)
    with pytest.raises(
        RuntimeError, match="unexpected pos"
    ):  # enough space: not the disk, the error as it is
        run.main([*map(str, flags), "--overwrite_output_dir", "true"])
