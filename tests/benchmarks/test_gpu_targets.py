"""The GPU targets of the benchmark page judge only what was measured."""

from types import SimpleNamespace

from benchmarks.report import mfu_targets

ARGS = SimpleNamespace(device="cuda", config="base", lengths=[512])


def training(speeds: dict) -> dict:
    return {"training": {"tokens_per_second": speeds, "mfu": {"sinusoidal@512": 0.05}}}


def test_the_module_speed_target_needs_a_module_besides_sinusoidal():
    """A run that trains sinusoidal alone (the compile check) judges its MFU, not "every module"."""
    lines = mfu_targets(training({"marian@512": 1.0, "sinusoidal@512": 1.0}), {"marian", "sinusoidal"}, ARGS)
    assert len(lines) == 1 and "MFU" in lines[0]


def test_a_slow_module_misses_the_module_speed_target():
    speeds = {"marian@512": 1.0, "sinusoidal@512": 1.0, "fire@512": 0.5, "alibi@512": 0.9}
    lines = mfu_targets(training(speeds), {"marian", "sinusoidal", "fire", "alibi"}, ARGS)
    assert lines[1].endswith("**missed** by fire 0.50×")
