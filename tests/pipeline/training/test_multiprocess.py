"""train.py under `accelerate launch` with 2 CPU processes, exactly as docs/training.md tells a user to run it:
the processes form one group, only the first writes the model, the evaluation and the card, the loss matches
one process over the same global batch, and a resumed launch continues exactly."""

import json
import os
import platform
import subprocess
import sys

import pytest
from conftest import DATA_DIR, REPO, tiny_run_flags

from hf_posenc.pipeline.training import arguments

pytestmark = pytest.mark.skipif(not DATA_DIR.is_dir(), reason="shared data folder absent")

CPU_DDP = REPO / "train_scripts" / "accelerate" / "cpu_ddp_2proc.yaml"
LAUNCH = [sys.executable, "-m", "accelerate.commands.launch", "--config_file", str(CPU_DDP)]
SINGLE = [sys.executable]
# dropout 0: the processes draw their own dropout masks, one process draws them in another order
TINY = [
    *tiny_run_flags(),
    "--dropout",
    "0",
    "--minutes",
    "0",
    "--logging_steps",
    "1",
    "--save_strategy",
    "steps",
    "--save_steps",
    "2",
    "--max_tokens",
    "300",
]


def train(launcher: list[str], output, *flags: str) -> subprocess.CompletedProcess:
    env = {**os.environ, "OMP_NUM_THREADS": "1"}
    command = [
        *launcher,
        str(REPO / "train_scripts" / "train.py"),
        *TINY,
        "--output_dir",
        str(output),
        *flags,
    ]
    completed = subprocess.run(command, capture_output=True, text=True, timeout=600, env=env, cwd=REPO)
    assert completed.returncode == 0, completed.stderr[-4000:]
    return completed


def losses(output) -> dict[int, float]:
    """The logged training loss of every update, from the run's last checkpoint."""
    checkpoints = (output.parent / f"{output.name}-checkpoints").glob("checkpoint-*")
    last = max(checkpoints, key=lambda path: int(path.name.split("-")[1]))
    state = json.loads((last / "trainer_state.json").read_text())
    return {entry["step"]: entry["loss"] for entry in state["log_history"] if "loss" in entry}


def test_two_cpu_processes_train_and_only_the_first_writes_the_run(tmp_path):
    output = tmp_path / "run"
    completed = train(
        LAUNCH, output, "--max_steps", "4", "--cpu_memory", "reuse"
    )  # the default, in processes of its own
    scores = json.loads((output / "scores.json").read_text())
    assert (
        scores["steps"] == 4 and (output / "model.safetensors").is_file() and (output / "README.md").is_file()
    )
    assert scores["cpu_memory_reused"] is (platform.libc_ver()[0] == "glibc")
    assert completed.stdout.count("wrote ") == 1  # one summary: the first process evaluates and exports
    assert sorted(p.name for p in tmp_path.iterdir()) == [
        "run",
        "run-checkpoints",
    ]  # no partial or extra folders


@pytest.mark.parametrize(
    "variable, name", [("ACCELERATE_USE_FSDP", "FSDP"), ("ACCELERATE_USE_DEEPSPEED", "DeepSpeed")]
)
def test_a_sharded_launch_on_cpus_is_refused_not_run_as_ddp(monkeypatch, capsys, variable, name):
    """accelerate runs an FSDP or DeepSpeed config with use_cpu as plain DDP (its MULTI_CPU mode): the sharding the
    config promises would silently not happen, so train.py refuses it by name before any work."""
    monkeypatch.setenv("ACCELERATE_USE_CPU", "true")
    monkeypatch.setenv(variable, "true")
    with pytest.raises(SystemExit):
        arguments.parse_args(["--recipe", "multi30k-en-de-tiny", "--output_dir", "unused"])
    assert f"{name} was launched on CPUs" in capsys.readouterr().err


@pytest.mark.slow
def test_the_loss_matches_one_process_over_the_same_global_batch_and_a_resumed_launch_continues_exactly(
    tmp_path,
):
    """2 processes x 1 batch per update against 1 process x 2 accumulated batches: the same batches (accelerate
    gives process r batches r, r + 2, ...), so the logged losses agree to float rounding (stated: 1e-4
    relative). A launch resumed from update 2 ends where the uninterrupted launch ends."""
    two = tmp_path / "two"
    train(LAUNCH, two, "--max_steps", "4")
    one = tmp_path / "one"
    train(SINGLE, one, "--max_steps", "4", "--gradient_accumulation_steps", "2")
    two_losses, one_losses = losses(two), losses(one)
    assert two_losses.keys() == one_losses.keys() == {1, 2, 3, 4}
    for step, loss in two_losses.items():
        assert loss == pytest.approx(one_losses[step], rel=1e-4), step

    resumed = tmp_path / "resumed"
    train(LAUNCH, resumed, "--max_steps", "2")
    train(LAUNCH, resumed, "--max_steps", "4", "--resume_from_checkpoint", "last")
    assert losses(resumed)[4] == pytest.approx(two_losses[4], rel=1e-5)
    assert (
        json.loads((resumed / "scores.json").read_text())["bleu"]
        == json.loads((two / "scores.json").read_text())["bleu"]
    )
