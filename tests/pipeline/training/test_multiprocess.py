"""Training in several processes: train.py under `accelerate launch` with 2 CPU processes, exactly as
docs/training.md tells a user to run it (one group, only the first process writes the run, the loss matches one
process over the same global batch, a resumed launch continues exactly); 2 ranks of the trainer probe under
torchrun and accelerate, resuming after a real kill, and the shipped accelerate configs."""

import json
import os
import platform
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from hf_posenc.pipeline.training import arguments
from tests.helpers import REPO

CPU_DDP = REPO / "train_scripts" / "accelerate" / "cpu_ddp_2proc.yaml"
LAUNCH = [sys.executable, "-m", "accelerate.commands.launch", "--config_file", str(CPU_DDP)]
SINGLE = [sys.executable]
# dropout 0: the processes draw their own dropout masks, one process draws them in another order
TINY = [
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


@pytest.fixture
def train(tiny_run_flags):
    """`train(launcher, output, *flags)`: train.py on a tiny run of the shipped data, started by `launcher`."""

    def run(launcher: list[str], output, *flags: str) -> subprocess.CompletedProcess:
        env = {**os.environ, "OMP_NUM_THREADS": "1"}
        script = str(REPO / "train_scripts" / "train.py")
        command = [*launcher, script, *tiny_run_flags(), *TINY, "--output_dir", str(output), *flags]
        completed = subprocess.run(command, capture_output=True, text=True, timeout=600, env=env, cwd=REPO)
        assert completed.returncode == 0, completed.stderr[-4000:]
        return completed

    return run


def losses(output) -> dict[int, float]:
    """The logged training loss of every update, from the run's last checkpoint."""
    checkpoints = (output.parent / f"{output.name}-checkpoints").glob("checkpoint-*")
    last = max(checkpoints, key=lambda path: int(path.name.split("-")[1]))
    state = json.loads((last / "trainer_state.json").read_text())
    return {entry["step"]: entry["loss"] for entry in state["log_history"] if "loss" in entry}


def test_two_cpu_processes_train_and_only_the_first_writes_the_run(tmp_path, train):
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
    tmp_path, train
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


PROBE = Path(__file__).with_name("trainer_probe.py")


LAUNCHERS = {
    "single": [sys.executable],
    "torchrun": [sys.executable, "-m", "torch.distributed.run", "--nproc_per_node", "2"],
    "accelerate": [
        sys.executable,
        "-m",
        "accelerate.commands.launch",
        "--config_file",
        str(REPO / "train_scripts" / "accelerate" / "cpu_ddp_2proc.yaml"),
        "--num_cpu_threads_per_process",
        "1",
    ],
}


def run_probe(out, *args, launcher="single", timeout=600):
    env = {**os.environ, "OMP_NUM_THREADS": "1"}
    command = [*LAUNCHERS[launcher], str(PROBE)]
    completed = subprocess.run(
        [*command, str(out), *args], capture_output=True, text=True, timeout=timeout, env=env
    )
    assert completed.returncode == 0, completed.stderr[-3000:]


@pytest.mark.parametrize("launcher", ["torchrun", "accelerate"])
@pytest.mark.usefixtures("multi30k_dir")  # reads the shipped data
def test_two_process_ddp_ranks_end_identical_and_see_different_batches(tmp_path, launcher):
    run_probe(tmp_path, "--max_steps", "4", launcher=launcher)
    rank0, rank1 = (json.loads((tmp_path / f"rank{r}.json").read_text()) for r in (0, 1))
    assert rank0["world_size"] == rank1["world_size"] == 2
    assert rank0["checksum"] == rank1["checksum"]  # gradients were all-reduced
    assert not {digest for _, digest in rank0["seen"]} & {digest for _, digest in rank1["seen"]}
    assert len(rank0["seen"]) == len(rank1["seen"]) == 4


# Two ranks whose clocks started a second apart: the first is past a one-minute budget, the second not.
BUDGET_RANK = """
import json, sys, time
from types import SimpleNamespace
import torch.distributed as dist
from hf_posenc.pipeline.training.trainer import TimeBudgetCallback
dist.init_process_group("gloo")
rank = dist.get_rank()
budget = TimeBudgetCallback(minutes=1.0)
budget.on_train_begin(None, SimpleNamespace(stateful_callbacks={}), None)
budget.start -= 60.5 - rank
control = SimpleNamespace(should_training_stop=False, should_save=False)
budget.on_step_end(SimpleNamespace(save_strategy="steps", device="cpu"), None, control)
with open(f"{sys.argv[1]}/rank{rank}.json", "w") as out:
    json.dump([control.should_training_stop, budget.spent_seconds], out)
dist.destroy_process_group()
"""


def test_every_rank_stops_after_the_same_update_on_the_first_ranks_clock(tmp_path):
    """Each process starts its own clock; a rank that stopped an update before the others would leave them
    waiting in the next gradient exchange (a hang), and ranks that planned their learning rates from different
    clocks would train apart. Every rank reads the first one's (`shared_clock`)."""
    script = tmp_path / "budget_rank.py"
    script.write_text(BUDGET_RANK)
    env = {**os.environ, "OMP_NUM_THREADS": "1"}
    command = [*LAUNCHERS["torchrun"], str(script), str(tmp_path)]
    completed = subprocess.run(command, capture_output=True, text=True, timeout=300, env=env, cwd=REPO)
    assert completed.returncode == 0, completed.stderr[-3000:]
    ranks = [json.loads((tmp_path / f"rank{rank}.json").read_text()) for rank in (0, 1)]
    assert ranks[0][0] and ranks[1][0]  # both stop
    assert ranks[0][1] == ranks[1][1] == pytest.approx(60.5, abs=5)


@pytest.mark.usefixtures("multi30k_dir")  # reads the shipped data
def test_resume_after_a_real_kill_continues_at_the_saved_step_with_the_same_data_order(tmp_path):
    reference, interrupted = tmp_path / "reference", tmp_path / "interrupted"
    run_probe(reference, "--max_steps", "12")
    env = {**os.environ, "OMP_NUM_THREADS": "1"}
    process = subprocess.Popen(
        [sys.executable, str(PROBE), str(interrupted), "--max_steps", "12", "--save_steps", "4"],
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
        env=env,
    )
    checkpoint = interrupted / "checkpoints" / "checkpoint-4" / "trainer_state.json"
    deadline = time.monotonic() + 300
    while not checkpoint.is_file() and process.poll() is None and time.monotonic() < deadline:
        time.sleep(0.05)
    process.send_signal(signal.SIGKILL)
    process.wait()
    assert checkpoint.is_file() and not (interrupted / "rank0.json").exists()  # killed mid-run, after a save
    # a save the kill cut off (the kill may also land in one: the newest complete checkpoint is resumed)
    (interrupted / "checkpoints" / "checkpoint-11").mkdir()

    run_probe(interrupted, "--max_steps", "12", "--save_steps", "4", "--resume")
    resumed = json.loads((interrupted / "rank0-resumed.json").read_text())
    full = json.loads((reference / "rank0.json").read_text())
    first_step = resumed["seen"][0][0]
    assert first_step >= 4 and resumed["global_step"] == 12
    assert resumed["seen"] == [entry for entry in full["seen"] if entry[0] >= first_step]
    assert resumed["checksum"] == pytest.approx(full["checksum"], rel=1e-5)


@pytest.mark.parametrize(
    "path", sorted((REPO / "train_scripts" / "accelerate").glob("*.yaml")), ids=lambda p: p.stem
)
def test_shipped_accelerate_configs_load_and_name_real_layer_classes(path):
    """accelerate parses every shipped config; FSDP wraps layer classes that exist in the model file and sets
    the options accelerate's launcher requires together (cpu_ram_efficient_loading needs sync_module_states)."""
    from accelerate.commands.config.config_args import load_config_from_file

    import hf_posenc.modeling_marian_posenc as modeling

    config = load_config_from_file(str(path))
    assert config.num_processes >= 1 and config.distributed_type.value in {
        "MULTI_CPU",
        "MULTI_GPU",
        "FSDP",
        "DEEPSPEED",
    }
    if config.distributed_type.value == "FSDP":
        fsdp = config.fsdp_config
        for name in fsdp["fsdp_transformer_layer_cls_to_wrap"].split(","):
            assert hasattr(modeling, name), name
        assert not fsdp.get("fsdp_cpu_ram_efficient_loading") or fsdp.get("fsdp_sync_module_states")
