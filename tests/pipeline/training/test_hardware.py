"""Precision and attention-backend choice by measurement, the MFU peak and FLOP count
(hf_posenc/pipeline/training/hardware.py).

The choosers take their timers as arguments, so both kinds of CPU are simulated here: one emulating bf16
(~500x slower per FLOP than fp32, as on AVX2-only CPUs) and one with bf16 units. A few tests time the real
thing on this machine, for bounds only: which precision wins here is not asserted.
"""

import json
import os
import platform
import subprocess
import sys
import time
from dataclasses import replace

import pytest
import torch

from hf_posenc.pipeline.training import hardware
from hf_posenc.pipeline.training.hardware import (
    BF16_MIN_SPEEDUP,
    SCOUT_FLOPS,
    available_memory,
    busy_share,
    check_compiler,
    check_memory,
    choose_attention_backend,
    choose_precision,
    describe_hardware,
    keep_freed_memory,
    matmul_peak_flops,
    model_flops_per_target_token,
    threads_for_free_cores,
)

D_MODEL, FFN_DIM = 256, 1024


class SimulatedMatmuls:
    """A matmul timer for a CPU doing `fp32_gflops` in fp32 and `bf16_gflops` in bf16; records its calls."""

    def __init__(self, fp32_gflops: float, bf16_gflops: float):
        self.gflops = {None: fp32_gflops, torch.bfloat16: bf16_gflops}
        self.calls = []

    def __call__(self, dtype, rows, inner, outer):
        self.calls.append((dtype, rows, inner, outer))
        return 2 * rows * inner * outer / (self.gflops[dtype] * 1e9)

    def simulated_seconds(self) -> float:
        """The time the recorded matmuls would have taken on this CPU."""
        return sum(
            2 * rows * inner * outer / (self.gflops[dtype] * 1e9) for dtype, rows, inner, outer in self.calls
        )


def refuse_to_measure(*args):
    raise AssertionError("nothing should be measured here")


def test_emulated_bf16_is_abandoned_after_one_small_scout_matmul():
    """An AVX2-only CPU (bf16 0.3 vs fp32 143 GFLOP/s): fp32 is chosen, and no full-size bf16 matmul runs, so
    the probe costs milliseconds there too."""
    timer = SimulatedMatmuls(fp32_gflops=143, bf16_gflops=0.3)
    choice = choose_precision("auto", "cpu", D_MODEL, FFN_DIM, timer=timer)
    assert choice.precision == "fp32" and "emulates bf16" in choice.reason
    bf16_calls = [call for call in timer.calls if call[0] is torch.bfloat16]
    assert len(bf16_calls) == 1
    _, rows, inner, outer = bf16_calls[0]
    assert 2 * rows * inner * outer <= SCOUT_FLOPS
    assert (
        "bf16_ms" not in choice.figures
        and choice.figures["scout_bf16_ms"] > 100 * choice.figures["scout_fp32_ms"]
    )
    assert timer.simulated_seconds() < 0.1


def test_bf16_is_chosen_where_it_is_measurably_faster():
    """A CPU with bf16 units (bf16 ~4x fp32): bf16, with the measured speed-up in the figures."""
    choice = choose_precision("auto", "cpu", D_MODEL, FFN_DIM, timer=SimulatedMatmuls(150, 600))
    assert choice.precision == "bf16"
    assert choice.figures["bf16_speedup"] == pytest.approx(4.0)
    assert choice.figures["fp32_ms"] == pytest.approx(4 * choice.figures["bf16_ms"])


def test_a_burst_of_other_work_during_one_timing_does_not_decide_the_choice():
    """Timings alternate in rounds and keep their fastest: a 10x slower first full-size bf16 matmul (another job
    took the cores) still leaves bf16 chosen on a bf16 CPU."""
    timer = SimulatedMatmuls(150, 600)
    full_size_bf16_calls = []

    def bursty(dtype, rows, inner, outer):
        seconds = timer(dtype, rows, inner, outer)
        if dtype is torch.bfloat16 and rows == 512:
            full_size_bf16_calls.append(seconds)
            return seconds * (10 if len(full_size_bf16_calls) == 1 else 1)
        return seconds

    choice = choose_precision("auto", "cpu", D_MODEL, FFN_DIM, timer=bursty)
    assert len(full_size_bf16_calls) > 2 and choice.precision == "bf16"


def test_bf16_that_is_barely_faster_does_not_replace_fp32():
    """Below BF16_MIN_SPEEDUP the more accurate fp32 stays: probe noise must not flip the choice."""
    choice = choose_precision("auto", "cpu", D_MODEL, FFN_DIM, timer=SimulatedMatmuls(150, 150 * 1.05))
    assert choice.precision == "fp32" and f"needs {BF16_MIN_SPEEDUP}x" in choice.reason


@pytest.mark.parametrize("requested", ["bf16", "fp16", "fp32"])
@pytest.mark.parametrize("device", ["cpu", "cuda"])
def test_an_explicit_precision_is_honoured_and_recorded_without_probing(requested, device):
    choice = choose_precision(requested, device, D_MODEL, FFN_DIM, timer=refuse_to_measure)
    assert (choice.requested, choice.precision, choice.reason) == (
        requested,
        requested,
        "requested explicitly",
    )
    assert json.loads(json.dumps(choice.as_dict()))["precision"] == requested


@pytest.mark.parametrize("supported, expected", [(True, "bf16"), (False, "fp32")])
def test_auto_on_cuda_follows_the_gpus_bf16_support(monkeypatch, supported, expected):
    monkeypatch.setattr(torch.cuda, "is_bf16_supported", lambda *args, **kwargs: supported)
    choice = choose_precision("auto", "cuda", D_MODEL, FFN_DIM, timer=refuse_to_measure)
    assert choice.precision == expected and "CUDA" in choice.reason


def test_unknown_choices_name_the_allowed_values():
    with pytest.raises(ValueError, match="'bfloat16'.*auto, bf16, fp16, fp32"):
        choose_precision("bfloat16", "cpu", D_MODEL, FFN_DIM)
    with pytest.raises(ValueError, match="'flash'.*auto, eager, sdpa"):
        choose_attention_backend("flash", "fp32", "cpu", 4, 64)


def test_precision_probe_on_this_machine_is_bounded():
    """The real probe at the default recipe's shapes and at paper 1's base shapes: well under a second."""
    for d_model, ffn_dim in ((256, 1024), (512, 2048)):
        started = time.perf_counter()
        choice = choose_precision("auto", "cpu", d_model, ffn_dim)
        wall = time.perf_counter() - started
        assert wall < 1.0, (wall, choice)
        assert choice.precision in ("bf16", "fp32") and choice.figures["fp32_ms"] > 0
        assert choice.figures["probe_seconds"] <= wall


@pytest.mark.parametrize("faster", ["eager", "sdpa"])
def test_attention_backend_auto_picks_the_faster(faster):
    seconds = {"eager": 2e-3, "sdpa": 2e-3}
    seconds[faster] = 1e-3
    choice = choose_attention_backend("auto", "bf16", "cpu", 4, 64, timer=seconds.__getitem__)
    assert choice.backend == faster and "2.00x" in choice.reason
    assert choice.figures[f"{faster}_ms"] == pytest.approx(1.0)


def test_attention_backend_explicit_is_honoured_without_probing():
    choice = choose_attention_backend("eager", "bf16", "cpu", 4, 64, timer=refuse_to_measure)
    assert (choice.backend, choice.reason) == ("eager", "requested explicitly")


@pytest.mark.parametrize("precision", ["fp32", "bf16"])
def test_attention_probe_times_both_real_backends_quickly(precision):
    started = time.perf_counter()
    choice = choose_attention_backend("auto", precision, "cpu", heads=4, head_dim=64)
    assert time.perf_counter() - started < 1.0
    assert (
        choice.backend in ("eager", "sdpa")
        and choice.figures["eager_ms"] > 0
        and choice.figures["sdpa_ms"] > 0
    )


def test_matmul_peak_is_positive_and_bounded():
    started = time.perf_counter()
    peak = matmul_peak_flops("fp32", "cpu", budget_seconds=0.3)
    assert time.perf_counter() - started < 1.0
    assert 1e8 < peak < 1e14  # FLOP/s: a plausible CPU, not a unit slip


def test_peak_measurement_stops_early_when_matmuls_are_slow(monkeypatch):
    """An emulated bf16 (~0.1 s for the first 256² matmul) must not be timed at 2048² (~60 s)."""
    sizes = []

    def slow_best_seconds(run, device, budget_seconds):
        sizes.append(run.args[0].shape[0])
        return 2 * sizes[-1] ** 3 / 0.3e9

    monkeypatch.setattr(hardware, "best_seconds", slow_best_seconds)
    assert matmul_peak_flops("bf16", "cpu", budget_seconds=0.5) == pytest.approx(0.3e9)
    assert sizes == [256]


def test_model_flops_are_counted_and_sdpa_counts_as_eager_attention(tiny_model):
    """FlopCounterMode alone counts 0 FLOPs for SDPA's CPU kernel; with our formulas SDPA and eager attention
    count the same model FLOPs (so MFU compares systems on different backends fairly)."""
    counts = {}
    for backend in ("eager", "sdpa"):
        model = tiny_model(attn_implementation=backend).train()
        counts[backend] = model_flops_per_target_token(model, 12, 10, 3, "cpu", None)
        assert all(p.grad is None for p in model.parameters())  # gradients cleared
    assert counts["sdpa"] > 0 and counts["sdpa"] == pytest.approx(counts["eager"])


def test_hardware_description_is_one_line_and_json():
    machine = describe_hardware("cpu")
    line = machine.line()
    assert "\n" not in line and f"CPU capability {torch.backends.cpu.get_cpu_capability()}" in line
    assert f", {torch.get_num_threads()} thread" in line and f"torch {torch.__version__}" in line
    assert json.loads(json.dumps(machine.as_dict()))["device"] == "cpu"
    assert ", 1 thread, " in replace(machine, threads=1).line()
    assert ", 2 threads, " in replace(machine, threads=2).line()


def test_gpu_description_names_the_gpu_and_its_compute_capability(monkeypatch):
    monkeypatch.setattr(torch.cuda, "get_device_name", lambda device=None: "NVIDIA H100 80GB HBM3")
    monkeypatch.setattr(torch.cuda, "get_device_capability", lambda device=None: (9, 0))
    line = describe_hardware("cuda").line()
    assert line.startswith("NVIDIA H100 80GB HBM3, compute capability 9.0,")


def test_torch_compile_on_the_cpu_without_a_compiler_is_refused_before_any_work():
    """Inductor builds CPU kernels with the C++ compiler of `torch._inductor.config.cpp.cxx` ($CXX or g++) at the
    first update: without one, the run is refused up front with the names it looked for."""
    from torch._inductor import config

    with config.patch({"cpp.cxx": (None, "no-such-compiler++")}):
        with pytest.raises(ValueError, match=r"no-such-compiler\+\+.*--torch_compile false"):
            check_compiler(True, "inductor", "cpu")
        check_compiler(False, "inductor", "cpu")  # not compiling
        check_compiler(True, "inductor", "cuda")  # the GPU's kernels are Triton's
    with config.patch({"cpp.cxx": (None, sys.executable)}):  # any program that answers --version
        check_compiler(True, "inductor", "cpu")
    assert config.cpp.cxx[-1] != sys.executable  # restored for the tests that compile


# Page faults of a fresh 256 MiB tensor after a 320 MiB one was freed, in a process of its own (the setting is for
# the rest of a process's life): with the C library's default, the second tensor is mapped anew and faults in all
# of its 65,536 pages; with the freed memory kept, it is served from the pages of the first. (The first is the
# larger because torch asks for aligned memory: a block the size of its own freed one may not fit in it.) The heap's
# free memory afterwards holds the freed tensors only where they were kept.
FAULTS = """
import json, resource, sys, torch
from hf_posenc.pipeline.training.hardware import heap_free_bytes, keep_freed_memory
applied = sys.argv[1] == "reuse" and keep_freed_memory("cpu")
def faults_of_a_fresh_tensor(mib):
    before = resource.getrusage(resource.RUSAGE_SELF).ru_minflt
    torch.ones(mib * 2**18)  # fp32, freed at once
    return resource.getrusage(resource.RUSAGE_SELF).ru_minflt - before
faults_of_a_fresh_tensor(320)
faults = faults_of_a_fresh_tensor(256)
print(json.dumps({"applied": applied, "faults": faults, "heap_free": heap_free_bytes()}))
"""


def faults_of_a_second_tensor(cpu_memory: str) -> dict:
    command = [sys.executable, "-c", FAULTS, cpu_memory]
    return json.loads(subprocess.run(command, capture_output=True, text=True, check=True, timeout=120).stdout)


def test_kept_freed_memory_serves_the_next_large_tensor_without_page_faults():
    released, reused = faults_of_a_second_tensor("release"), faults_of_a_second_tensor("reuse")
    assert not released["applied"] and released["faults"] > 60_000
    if platform.libc_ver()[0] == "glibc":
        assert reused["applied"] and reused["faults"] < 1_000
        # what `check_memory` adds to the kernel's figure: the freed tensors, only where they were kept
        assert reused["heap_free"] >= 320 * 2**20 > 64 * 2**20 > released["heap_free"]
    else:  # another C library is left as it is
        assert not reused["applied"] and reused["faults"] > 60_000
    assert not keep_freed_memory("cuda")  # the GPU's memory is torch's caching allocator's


def test_a_busy_machine_gets_one_thread_per_free_core():
    assert threads_for_free_cores(2, 0.0) == 2 and threads_for_free_cores(2, 0.2) == 2
    assert threads_for_free_cores(2, 0.5) == 1 and threads_for_free_cores(2, 1.0) == 1  # at least one
    assert threads_for_free_cores(8, 0.25) == 6
    assert threads_for_free_cores(2, None) == 2  # nothing measured: all cores


def test_the_busy_share_sees_other_processes_spinning(tmp_path):
    """One busy-looping process per core this process may run on takes (nearly) all their time while the test
    waits."""
    spinners = [subprocess.Popen([sys.executable, "-c", "while True: pass"]) for _ in os.sched_getaffinity(0)]
    try:
        time.sleep(0.5)  # started and spinning
        share = busy_share(1.0)
    finally:
        for spinner in spinners:
            spinner.kill()
    assert share is not None and share > 0.7
    stat = tmp_path / "stat"
    cores = "".join(f"cpu{core} 10 0 10 80 0 0 0 0 0 0\n" for core in os.sched_getaffinity(0))
    stat.write_text("cpu  20 0 20 160 0 0 0 0 0 0\n" + cores)  # a file that does not move: nothing measured
    assert busy_share(0.0, stat) is None and busy_share(0.0, tmp_path / "absent") is None


def test_available_memory_is_the_kernels_figure_within_the_cgroup_limit(tmp_path):
    meminfo, cgroup = tmp_path / "meminfo", tmp_path / "cgroup"
    meminfo.write_text("MemTotal:       4096 kB\nMemAvailable:   2048 kB\n")
    cgroup.mkdir()
    assert available_memory("cpu", meminfo, cgroup) == 2048 * 1024  # no cgroup files
    (cgroup / "memory.max").write_text("1000000\n")
    (cgroup / "memory.current").write_text("400000\n")
    assert available_memory("cpu", meminfo, cgroup) == 600_000  # the cgroup leaves less
    (cgroup / "memory.max").write_text("max\n")
    assert available_memory("cpu", meminfo, cgroup) == 2048 * 1024  # no cgroup limit
    assert available_memory("cpu", tmp_path / "absent", cgroup) is None
    assert available_memory("meta") is None
    assert available_memory("cpu") > 0  # this machine's own figures


def test_a_need_above_the_available_memory_and_the_heaps_free_memory_is_refused_with_both_figures(
    monkeypatch,
):
    def unread():
        raise AssertionError("the heap's free memory was read though the kernel's figure sufficed")

    monkeypatch.setattr(hardware, "available_memory", lambda device: 3 * 2**30)
    monkeypatch.setattr(hardware, "heap_free_bytes", unread)
    check_memory(3 * 2**30, "cpu", "decoding X", "lower Y")  # fits exactly, without the heap
    monkeypatch.setattr(hardware, "heap_free_bytes", lambda: 2**30)
    check_memory(4 * 2**30, "cpu", "decoding X", "lower Y")  # fits with the freed memory the heap holds
    with pytest.raises(
        ValueError,
        match=r"^decoding X needs at least 4.50 GiB, more than the 4.00 GiB available \(cpu\): lower Y$",
    ):
        check_memory(int(4.5 * 2**30), "cpu", "decoding X", "lower Y")
    monkeypatch.setattr(hardware, "available_memory", lambda device: None)
    check_memory(2**60, "cpu", "decoding X", "lower Y")  # not known: nothing refused
