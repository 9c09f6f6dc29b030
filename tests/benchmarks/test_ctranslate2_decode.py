import pytest

from benchmarks.ctranslate2_decode import SYSTEMS, check_systems
from benchmarks.plots import write_engines_plot


def test_every_system_runs_on_the_cpu_and_the_fast_loop_alone_on_a_gpu():
    assert check_systems(None, "cpu") == list(SYSTEMS)
    assert check_systems(["fast", "torch-int8"], "cpu") == ["fast", "torch-int8"]
    assert check_systems(None, "cuda") == check_systems(["fast"], "cuda:1") == ["fast"]


def test_cpu_only_systems_are_refused_on_a_gpu_by_name():
    with pytest.raises(
        SystemExit, match="--systems ctranslate2-int8 torch-int8: CPU only; allowed with --device cuda: fast"
    ):
        check_systems(["fast", "torch-int8", "ctranslate2-int8"], "cuda")


def test_the_engines_plot_draws_every_thread_count(tmp_path):
    rows = [
        {
            "system": name,
            "threads": threads,
            "sentences_per_second": speed,
            "speed_up": speed / 40,
            "bleu": 36.9,
        }
        for threads in (1, 2)
        for name, speed in (("HF generate (torch fp32)", 40.0), ("fast loop (torch fp32)", 80.0))
    ]
    write_engines_plot(rows, tmp_path / "engines.png", "model, 2 sentences, beam 4; machine; date")
    assert (tmp_path / "engines.png").read_bytes().startswith(b"\x89PNG")
