"""Training runs under faults (pipeline/training/run.py): settings that would fail only after the data stage are
refused with the other settings, before any data are read; batches too large for the machine's memory before the
first update, and a device that runs out of memory during training in one line."""

import re
import signal
import subprocess
import sys
import time
from pathlib import Path

import torch

from hf_posenc.pipeline.training import hardware, run
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
    monkeypatch.setattr(TranslationTrainer, "train", no_training)
    flags = [*tiny_run_flags(), "--output_dir", tmp_path / "run", "--max_steps", "2", "--average_last", "0"]
    code, message = run_tool(run.main, flags)
    assert_refused(code, message, ["x 400 tokens needs at least", "more than the 0.0 GiB available (cpu)"])
    positions = int(re.search(r"training on batches of (\d+) target positions x 400 tokens", message)[1])
    assert f"needs at least {positions * 400 * 8 / 2**30:.1f} GiB" in message and 0 < positions <= 4096
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
    """A real SIGINT to train.py after its first checkpoint: exit code 130 and one line, where the Trainer's
    KeyboardInterrupt printed its stack."""
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
    assert re.fullmatch(
        rf"train.py: interrupted: training stopped at update \d+; --resume_from_checkpoint last continues it from "
        rf"{re.escape(str(checkpoints))}/checkpoint-\d+",
        last,
    ), last
