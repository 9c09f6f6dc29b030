import pytest

from benchmarks.ctranslate2_decode import SYSTEMS, check_systems


def test_every_system_runs_on_the_cpu_and_the_fast_loop_alone_on_a_gpu():
    assert check_systems(None, "cpu") == list(SYSTEMS)
    assert check_systems(["fast", "torch-int8"], "cpu") == ["fast", "torch-int8"]
    assert check_systems(None, "cuda") == check_systems(["fast"], "cuda:1") == ["fast"]


def test_cpu_only_systems_are_refused_on_a_gpu_by_name():
    with pytest.raises(
        SystemExit, match="--systems ctranslate2-int8 torch-int8: CPU only; allowed with --device cuda: fast"
    ):
        check_systems(["fast", "torch-int8", "ctranslate2-int8"], "cuda")
