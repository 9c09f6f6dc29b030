"""What this machine is, and which precision and attention kernels are fast on it, decided by measurement.

bf16 autocast is not a safe default on the CPU. A CPU with bf16 units (AVX512-BF16, AMX) runs a bf16 matmul
several times faster than fp32; one without them (AVX2 only) emulates bf16, about 500 times slower per FLOP
(a 2048² matmul at 0.3 vs 143 GFLOP/s), so a bf16 training step there is about 25 times slower than fp32. The
CPU's flags hint at which kind a machine is, but only a timing says what torch's kernels actually do, so:

* `choose_precision` times matmuls of the model's own feed-forward shapes in fp32, then bf16 on a small
  *scout* matmul first: an emulated bf16 is then abandoned after milliseconds, and the full-size bf16 matmul
  runs only where bf16 is not far slower. bf16 wins when it is at least `BF16_MIN_SPEEDUP` times faster,
  fastest of alternating fp32/bf16 rounds (a burst of other work on a shared machine hits one round, not
  the choice). The probes run on one thread: the ratio of two kernels' speeds decides, not their absolute
  speed, and a single thread is the measurement another busy process on the machine disturbs least.
  On CUDA the rule is fixed: bf16 where the GPU supports it, else fp32;
* `choose_attention_backend` times forward + backward of transformers' SDPA and our eager attention at the
  model's head shapes under that precision, and keeps the faster;
* `keep_freed_memory` keeps the memory of freed tensors in the process for the next update or decoding step
  (below), and `check_memory` refuses a batch whose vocabulary-sized tensors alone exceed the memory available;
* `matmul_peak_flops` measures the dense matmul FLOP/s of the chosen precision (the denominator of MFU), and
  `model_flops_per_target_token` counts the model's forward + backward FLOPs (the numerator).

Every measurement is bounded in time, and the timers are arguments so that tests can play both kinds of
machine.
"""

import ctypes
import os
import platform
import time
from collections.abc import Callable
from contextlib import contextmanager, nullcontext
from dataclasses import asdict, dataclass, field, fields
from functools import partial
from pathlib import Path
from types import SimpleNamespace

import torch
from torch.utils.flop_counter import FlopCounterMode, sdpa_flop_count
from transformers.modeling_utils import ALL_ATTENTION_FUNCTIONS

from ...mixer_attention import eager_attention

PRECISIONS = ("auto", "bf16", "fp16", "fp32")
ATTENTION_BACKENDS = ("auto", "eager", "sdpa")
# bf16 must beat fp32 by this factor to be chosen: below it, the probe's noise on a shared machine could flip
# the choice, and fp32 is the more accurate of two equally fast precisions.
BF16_MIN_SPEEDUP = 1.1
# A bf16 scout matmul this many times slower than fp32 at the same shape is emulated (native bf16 kernels are
# at worst ~2x slower than fp32 on matmuls this small, emulated ones hundreds of times).
SCOUT_SLOWDOWN_LIMIT = 4.0
SCOUT_FLOPS = 8e6  # ~25 ms when bf16 is emulated (0.3 GFLOP/s)
PROBE_FLOPS = 3e8  # per full-size matmul: ~6 ms in fp32 on one AVX2 core
MIN_PROBE_ROWS, MIN_SCOUT_ROWS = 64, 8  # fewer rows than this time kernel overheads more than matmuls
TIMING_BUDGET_SECONDS = 0.05  # per timing: a warm-up, one timed call, and as many more as fit
TIMING_REPEATS = 3
# Candidates are timed in alternating rounds, each keeping its fastest, so that a burst of other work on a
# shared machine does not decide the choice; rounds stop after PROBE_ROUNDS or once PROBE_BUDGET_SECONDS pass.
PROBE_ROUNDS = 5
PROBE_BUDGET_SECONDS = 0.5
PEAK_BUDGET_SECONDS = 0.5
PEAK_FIRST_SIZE, PEAK_LARGEST_SIZE = 256, 8192
M_TRIM_THRESHOLD, M_MMAP_MAX = -1, -4  # glibc's mallopt parameters (malloc.h)
BUSY_SAMPLE_SECONDS = 0.5

# (autocast dtype or None, rows, inner, outer) -> seconds of one (rows x inner) @ (inner x outer) matmul.
MatmulTimer = Callable[[torch.dtype | None, int, int, int], float]
# backend ("eager" or "sdpa") -> seconds of one attention forward + backward.
AttentionTimer = Callable[[str], float]


def read_cpu_info() -> dict[str, str]:
    """The first processor's "key: value" lines of /proc/cpuinfo ({} where there is none)."""
    path = Path("/proc/cpuinfo")
    if not path.exists():
        return {}
    info = {}
    for line in path.read_text().splitlines():
        if not line.strip():
            break  # the end of the first processor's block
        key, _, value = line.partition(":")
        info[key.strip()] = value.strip()
    return info


@dataclass
class Hardware:
    device: str  # "cpu" or "cuda"
    name: str  # CPU model or GPU name
    capability: str  # torch's CPU capability ("AVX2", "AVX512") or the CUDA compute capability ("9.0")
    threads: int  # torch's intra-op threads
    torch_version: str
    bf16_flags: tuple[str, ...] = ()  # the CPU's bf16 flags (avx512_bf16, amx_bf16): a hint, not a decision

    def line(self) -> str:
        """One line for logs and reports."""
        if self.device == "cuda":
            kind = f"compute capability {self.capability}"
        else:
            units = f" ({', '.join(self.bf16_flags)})" if self.bf16_flags else ", no bf16 flags"
            kind = f"CPU capability {self.capability}{units}"
        threads = f"{self.threads} thread" + ("s" if self.threads != 1 else "")
        return f"{self.name}, {kind}, {threads}, torch {self.torch_version}"

    def as_dict(self) -> dict:
        return asdict(self)

    @classmethod
    def from_record(cls, record: dict) -> "Hardware":
        """The machine of a run's recorded `as_dict()` (extra keys such as its `line` ignored)."""
        known = {f.name for f in fields(cls)}
        values = {key: value for key, value in record.items() if key in known}
        return cls(**{**values, "bf16_flags": tuple(values.get("bf16_flags", ()))})


def describe_hardware(device="cpu") -> Hardware:
    """The machine that `device` ("cpu", "cuda", "cuda:1" or a torch.device) computes on."""
    device = torch.device(device)
    if device.type == "cuda":
        major, minor = torch.cuda.get_device_capability(device)
        name, capability, flags = torch.cuda.get_device_name(device), f"{major}.{minor}", ()
    else:
        cpu_info = read_cpu_info()
        name = cpu_info.get("model name") or platform.processor() or platform.machine()
        capability = torch.backends.cpu.get_cpu_capability()
        flags = tuple(flag for flag in cpu_info.get("flags", "").split() if "bf16" in flag)
    return Hardware(device.type, name, capability, torch.get_num_threads(), torch.__version__, flags)


def check_choice(name: str, value: str, allowed: tuple[str, ...]) -> None:
    if value not in allowed:
        raise ValueError(f"{name}={value!r} is not known; allowed values: {', '.join(allowed)}")


def check_compiler(compile: bool, backend: str | None, device) -> None:
    """Under `--torch_compile`, a backend torch.compile does not know, and on the CPU inductor without the C++
    compiler it builds its kernels with, would fail at the first update, after the data stage. Refuse them
    before any work instead."""
    if not compile:
        return
    from torch._dynamo import list_backends

    known = list_backends(exclude_tags=())
    if backend is not None and backend not in known:
        raise ValueError(
            f"--torch_compile_backend={backend!r} is not a torch.compile backend here; allowed: {', '.join(known)}"
        )
    if backend != "inductor" or torch.device(device).type != "cpu":
        return
    from torch._inductor import config, cpp_builder, exc

    try:
        cpp_builder.cpp_compiler_search(tuple(config.cpp.cxx))
    except exc.InvalidCxxCompiler:
        looked = ", ".join(c for c in config.cpp.cxx if c)
        raise ValueError(
            f"--torch_compile true on the CPU needs a C++ compiler (inductor builds its kernels with it) and none "
            f"was found (looked for: {looked}; set $CXX to one): install g++, or pass --torch_compile false"
        ) from None


# The values of --cpu_memory (train.py, hf-posenc-evaluate, the decoding benchmark), the default first: "reuse" keeps
# freed memory in the process (`keep_freed_memory`), "release" leaves the C library's default.
CPU_MEMORY = ("reuse", "release")


def add_cpu_memory_flag(parser) -> None:
    """`--cpu_memory` of a command that decodes (argparse; train.py's is a field of `RunArguments`)."""
    parser.add_argument(
        "--cpu_memory",
        choices=CPU_MEMORY,
        default=CPU_MEMORY[0],
        help="reuse: on the CPU under glibc, keep freed tensors' memory in the process for the next decoding step "
        "(no page faults on every vocabulary-sized tensor; docs/decoding.md, Freed memory); "
        "release: the C library's default",
    )


def keep_freed_memory(device) -> bool:
    """On the CPU under glibc, serve every tensor from the heap and keep freed memory there for the next update
    or decoding step.

    glibc maps each block over 32 MiB with mmap and unmaps it when it is freed: the logits of a batch
    (tokens x vocabulary, in fp32 for the loss) and its large activations. The next update then faults every
    page of them in again and the kernel zeroes each one: at base size (40k vocabulary, 4,096-token batches,
    2 threads of an AMD EPYC) 1.1M page faults and 2.2 s of system time per update. Kept in the heap (mmap off,
    trimming off: `mallopt(3)`), the next update reuses freed pages (0.2M faults per update there); the cost is
    a higher peak resident size (up to 1.8x at base on token-budget batches), held until the process ends
    (docs/training.md has the figures). Decoding is hit the same way, at every step: a beam's logits, their
    log-probabilities and their sums (rows x vocabulary, float32) come and go (on the default model, 384
    sentences at beam 4: 480-690k page faults and 0.7-1.1 s of system time with glibc's handling, none kept;
    docs/decoding.md), so train.py, hf-posenc-evaluate and the study's decoding apply it too. Returns whether
    it was applied: the CPU and glibc only (other C libraries and the GPU's memory are left as they are)."""
    if torch.device(device).type != "cpu" or platform.libc_ver()[0] != "glibc":
        return False
    libc = ctypes.CDLL(None)  # the C library this process already uses
    return bool(libc.mallopt(M_MMAP_MAX, 0)) and bool(libc.mallopt(M_TRIM_THRESHOLD, -1))  # -1: never trim


# The fewest bytes a vocabulary-sized score takes per position of a training batch or per row of a decoding step:
# the logits and their log-probabilities, float32 and alive together (the loss's and the beam search's
# log-softmax read the logits and write a tensor of their size).
SCORE_BYTES = 8
GIB = 2**30


MALLINFO2_FIELDS = "arena ordblks smblks hblks hblkhd usmblks fsmblks uordblks fordblks keepcost".split()


class MallocInfo(ctypes.Structure):
    """glibc's `struct mallinfo2` (malloc.h, glibc 2.33 on): `fordblks` is the free memory held in the heap."""

    _fields_ = [(name, ctypes.c_size_t) for name in MALLINFO2_FIELDS]


def heap_free_bytes() -> int:
    """The freed memory this process's heap holds for reuse (`keep_freed_memory` keeps it there; the kernel
    counts it as used): glibc's `mallinfo2`, 0 under another C library or an older glibc."""
    if platform.libc_ver()[0] != "glibc":
        return 0
    libc = ctypes.CDLL(None)
    if not hasattr(libc, "mallinfo2"):
        return 0
    libc.mallinfo2.restype = MallocInfo
    return libc.mallinfo2().fordblks


def available_memory(device, meminfo: Path = Path("/proc/meminfo"), cgroup: Path = Path("/sys/fs/cgroup")):
    """Bytes the machine can still give this process on `device` before it swaps or the process is killed, or
    None where that is not known: on the CPU the kernel's MemAvailable, lowered to what the process's cgroup (v2)
    leaves below its limit (the freed memory the process's own heap holds comes on top: `check_memory`); on a
    CUDA device the free memory torch reports."""
    device = torch.device(device)
    if device.type == "cuda":
        return torch.cuda.mem_get_info(device)[0]
    if device.type != "cpu" or not meminfo.is_file():
        return None
    fields = dict(line.split(":", 1) for line in meminfo.read_text().splitlines() if ":" in line)
    if "MemAvailable" not in fields:
        return None
    available = int(fields["MemAvailable"].split()[0]) * 1024  # reported in kB
    limit, used = cgroup / "memory.max", cgroup / "memory.current"
    if limit.is_file() and used.is_file() and limit.read_text().strip() != "max":
        available = min(available, int(limit.read_text()) - int(used.read_text()))
    return available


def size_text(size: int) -> str:
    """A size in bytes as people read it: GiB from one GiB up, MiB below."""
    return f"{size / GIB:.2f} GiB" if size >= GIB else f"{size / 2**20:.1f} MiB"


def check_memory(needed: int, device, what: str, fix: str) -> None:
    """Refuse work whose smallest need, `needed` bytes for `what`, is more than `device` has available: on the
    CPU the kernel would kill the process without a message once its memory is gone, on a GPU torch would fail
    deep inside. `fix` names the settings to lower. Nothing is refused where the available memory is unknown.
    On the CPU the freed memory the process's heap holds counts too (`heap_free_bytes`, read only when the rest
    does not suffice: glibc walks its free lists for it, 30 ms in a heap of 50,000 free blocks)."""
    available = available_memory(device)
    if available is None or needed <= available:
        return
    available += heap_free_bytes() if torch.device(device).type == "cpu" else 0
    if needed > available:
        raise ValueError(
            f"{what} needs at least {size_text(needed)}, more than the {size_text(available)} available "
            f"({torch.device(device).type}): {fix}"
        )


def busy_share(seconds: float = BUSY_SAMPLE_SECONDS, stat: Path = Path("/proc/stat")) -> float | None:
    """The share of the CPU time that other work takes on the cores this process may run on: the non-idle share
    of their time in /proc/stat over `seconds` while this process waits. None where there is no /proc/stat."""
    if not stat.is_file():
        return None
    cores = {f"cpu{core}" for core in os.sched_getaffinity(0)}

    def sample() -> tuple[int, int]:
        total = idle = 0
        for line in stat.read_text().splitlines():
            name, *fields = line.split()
            if name in cores:  # cpuN user nice system idle iowait irq softirq steal ...
                ticks = [int(t) for t in fields]
                total, idle = total + sum(ticks), idle + ticks[3] + ticks[4]
        return total, idle

    total, idle = sample()
    time.sleep(seconds)
    total_after, idle_after = sample()
    if total_after <= total:  # no tick counted: nothing measured
        return None
    return 1 - (idle_after - idle) / (total_after - total)


def threads_for_free_cores(cores: int, busy: float | None) -> int:
    """One thread per core the other work leaves free (`busy`: its share of the CPU time), at least one. On 2
    cores with two other single-thread trainings running, the small recipe's bf16 update took 342-380 ms with 2
    threads (7 s at worst: the threads waited on each other while the scheduler ran the other work) and
    179-198 ms with 1."""
    if busy is None:
        return cores
    return max(1, min(cores, round(cores * (1 - busy))))


def autocast_dtype(precision: str, device) -> torch.dtype | None:
    """The autocast dtype of a training/decoding precision; None for fp32.

    fp16 autocasts on CUDA only: the Trainer does not autocast fp16 on the CPU (NOTES-transformers-v5), so
    there the computation stays fp32 and is timed as such.
    """
    check_choice("precision", precision, PRECISIONS[1:])
    if precision == "bf16":
        return torch.bfloat16
    if precision == "fp16" and torch.device(device).type == "cuda":
        return torch.float16
    return None


def autocast(device, dtype: torch.dtype | None):
    """`torch.autocast` to `dtype` on `device`'s type, or nothing for None."""
    if dtype is None:
        return nullcontext()
    return torch.autocast(device_type=torch.device(device).type, dtype=dtype)


def synchronize(device) -> None:
    if torch.device(device).type == "cuda":
        torch.cuda.synchronize()


@contextmanager
def one_thread():
    """torch on one intra-op thread for the duration (the probes), the caller's thread count restored after."""
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        yield
    finally:
        torch.set_num_threads(threads)


def best_seconds(
    run: Callable[[], object],
    device,
    repeats: int = TIMING_REPEATS,
    budget_seconds: float = TIMING_BUDGET_SECONDS,
) -> float:
    """The fastest of 1 to `repeats` timed calls of `run` after one untimed warm-up (first calls pay for
    kernel selection and allocation); timed calls stop once `budget_seconds`, warm-up included, are spent."""
    started = time.perf_counter()
    run()
    seconds = []
    while len(seconds) < repeats:
        synchronize(device)
        begin = time.perf_counter()
        run()
        synchronize(device)
        seconds.append(time.perf_counter() - begin)
        if time.perf_counter() - started > budget_seconds:
            break
    return min(seconds)


def fastest_in_rounds(timers: dict, first: dict, started: float) -> dict:
    """Seconds per candidate: the fastest of its `first` time and of further alternating rounds of `timers`
    (candidate -> timing callable), while the probe begun at `started` is within PROBE_BUDGET_SECONDS."""
    best = dict(first)
    for _ in range(PROBE_ROUNDS - 1):
        if time.perf_counter() - started > PROBE_BUDGET_SECONDS:
            break
        for name, timer in timers.items():
            best[name] = min(best[name], timer())
    return best


def time_linear(device, dtype: torch.dtype | None, rows: int, inner: int, outer: int) -> float:
    """Seconds of one `linear` (rows x inner) @ (inner x outer) as the model runs it: fp32 inputs and weight,
    under autocast to `dtype` (which casts both, as in training)."""
    generator = torch.Generator().manual_seed(0)
    inputs = torch.randn(rows, inner, generator=generator).to(device)  # (N, inner)
    weight = torch.randn(outer, inner, generator=generator).to(device)  # (outer, inner)

    def run():
        with autocast(device, dtype):
            torch.nn.functional.linear(inputs, weight)  # (N, outer)

    return best_seconds(run, device)


def probe_rows(tokens: int, inner: int, outer: int, flops: float, minimum: int) -> int:
    """Rows of a (rows x inner) @ (inner x outer) matmul of at most `flops` FLOPs, at most `tokens` and at
    least `minimum` (whichever bound is hit first wins, in that order)."""
    return max(min(minimum, tokens), min(tokens, int(flops // (2 * inner * outer))))


@dataclass
class PrecisionChoice:
    requested: str
    precision: str  # "bf16", "fp16" or "fp32"
    reason: str
    figures: dict = field(default_factory=dict)  # the probe's measurements (empty when nothing was measured)

    def line(self) -> str:
        return f"precision {self.precision} (requested {self.requested}: {self.reason})"

    def as_dict(self) -> dict:
        return asdict(self)


def choose_precision(
    requested: str,
    device,
    d_model: int,
    ffn_dim: int,
    tokens: int = 512,
    timer: MatmulTimer | None = None,
) -> PrecisionChoice:
    """The training/decoding precision: `requested` unless it is "auto" (see the module docstring).

    The CPU probe times the feed-forward matmuls (tokens x d_model) @ (d_model x ffn_dim) and back, with
    `tokens` reduced so that one matmul stays under PROBE_FLOPS (but keeps MIN_PROBE_ROWS rows); the figures
    are milliseconds per matmul (mean of the two shapes), the scout's, the speed-up and the probe's wall time.
    `timer` replaces the real matmul timing (tests).
    """
    check_choice("precision", requested, PRECISIONS)
    device_type = torch.device(device).type
    if requested != "auto":
        return PrecisionChoice(requested, requested, "requested explicitly")
    if device_type == "cuda":
        if torch.cuda.is_bf16_supported():
            return PrecisionChoice(requested, "bf16", "CUDA device with bf16 support")
        return PrecisionChoice(requested, "fp32", "CUDA device without bf16 support")
    if device_type != "cpu":
        return PrecisionChoice(requested, "fp32", f"no precision probe for device type {device_type!r}")

    with one_thread():
        return measured_precision(
            requested, device, d_model, ffn_dim, tokens, timer or partial(time_linear, device)
        )


def measured_precision(requested, device, d_model, ffn_dim, tokens, timer: MatmulTimer) -> PrecisionChoice:
    """The CPU probe of `choose_precision`."""
    started = time.perf_counter()
    rows = probe_rows(tokens, d_model, ffn_dim, PROBE_FLOPS, MIN_PROBE_ROWS)
    shapes = ((rows, d_model, ffn_dim), (rows, ffn_dim, d_model))
    scout = (probe_rows(tokens, d_model, ffn_dim, SCOUT_FLOPS, MIN_SCOUT_ROWS), d_model, ffn_dim)
    fp32_first = {(None, shape): timer(None, *shape) for shape in shapes}
    fp32_seconds = sum(fp32_first.values()) / len(shapes)
    scout_fp32, scout_bf16 = timer(None, *scout), timer(torch.bfloat16, *scout)
    figures = {
        "shapes": [list(shape) for shape in shapes],
        "scout_shape": list(scout),
        "fp32_ms": 1e3 * fp32_seconds,
        "scout_fp32_ms": 1e3 * scout_fp32,
        "scout_bf16_ms": 1e3 * scout_bf16,
    }
    if scout_bf16 > SCOUT_SLOWDOWN_LIMIT * scout_fp32:
        figures["probe_seconds"] = time.perf_counter() - started
        reason = (
            f"bf16 is {scout_bf16 / scout_fp32:.0f}x slower than fp32 on a {'x'.join(map(str, scout))} "
            "matmul: this CPU emulates bf16 (no bf16 units), full-size bf16 not timed"
        )
        return PrecisionChoice(requested, "fp32", reason, figures)
    bf16_first = {(torch.bfloat16, shape): timer(torch.bfloat16, *shape) for shape in shapes}
    # Alternating rounds, per shape fp32 then bf16.
    candidates = {
        (dtype, shape): partial(timer, dtype, *shape) for shape in shapes for dtype in (None, torch.bfloat16)
    }
    best = fastest_in_rounds(candidates, {**fp32_first, **bf16_first}, started)
    fp32_seconds = sum(best[(None, shape)] for shape in shapes) / len(shapes)
    bf16_seconds = sum(best[(torch.bfloat16, shape)] for shape in shapes) / len(shapes)
    speedup = fp32_seconds / bf16_seconds
    figures.update(
        fp32_ms=1e3 * fp32_seconds,
        bf16_ms=1e3 * bf16_seconds,
        bf16_speedup=speedup,
        probe_seconds=time.perf_counter() - started,
    )
    matmul = f"{rows}x{d_model}x{ffn_dim} matmuls"
    if speedup >= BF16_MIN_SPEEDUP:
        return PrecisionChoice(
            requested, "bf16", f"bf16 {speedup:.1f}x faster than fp32 on {matmul}", figures
        )
    reason = f"bf16 only {speedup:.2f}x the speed of fp32 on {matmul} (needs {BF16_MIN_SPEEDUP}x)"
    return PrecisionChoice(requested, "fp32", reason, figures)


def padding_masks(batch: int, length: int, device) -> tuple[torch.Tensor, torch.Tensor]:
    """The boolean (SDPA) and additive float (eager) padding masks (B, 1, L, L) the model builds for a batch
    whose rows lack 0..3 trailing tokens (token-budget batches are length-sorted, so padding is short)."""
    lengths = length - torch.arange(batch) % min(4, length)  # (B,)
    keep = torch.arange(length)[None, :] < lengths[:, None]  # (B, L)
    boolean = keep[:, None, None, :].expand(batch, 1, length, length).to(device)  # (B, 1, L, L)
    additive = torch.zeros(boolean.shape, device=device).masked_fill(~boolean, torch.finfo(torch.float32).min)
    return boolean, additive


def time_attention(
    device, dtype: torch.dtype | None, batch: int, heads: int, length: int, head_dim: int, backend: str
) -> float:
    """Seconds of one attention forward + backward through `backend` as the model calls it: queries, keys and
    values in the autocast dtype (they come out of autocast projections), forward under autocast, padding
    masks in the form each backend receives."""
    generator = torch.Generator().manual_seed(0)
    shape = (batch, heads, length, head_dim)
    query, key, value = (
        torch.randn(shape, generator=generator).to(device, dtype or torch.float32).requires_grad_()
        for _ in range(3)
    )  # (B, H, L, Dh) each
    boolean, additive = padding_masks(batch, length, device)
    function = eager_attention if backend == "eager" else ALL_ATTENTION_FUNCTIONS["sdpa"]
    mask = additive if backend == "eager" else boolean
    module = SimpleNamespace(is_causal=False, training=True)  # what the attention functions read

    def run():
        with autocast(device, dtype):
            output, _ = function(module, query, key, value, mask, scaling=head_dim**-0.5)  # (B, L, H, Dh)
        output.float().sum().backward()

    return best_seconds(run, device)


@dataclass
class AttentionChoice:
    requested: str
    backend: str  # "eager" or "sdpa"
    reason: str
    figures: dict = field(default_factory=dict)

    def line(self) -> str:
        return f"attention {self.backend} (requested {self.requested}: {self.reason})"

    def as_dict(self) -> dict:
        return asdict(self)


def choose_attention_backend(
    requested: str,
    precision: str,
    device,
    heads: int,
    head_dim: int,
    length: int = 32,
    tokens: int = 512,
    timer: AttentionTimer | None = None,
) -> AttentionChoice:
    """The attention implementation: `requested` unless it is "auto", then the faster of eager and SDPA for
    forward + backward of `tokens // length` sequences of `length` tokens under `precision`'s autocast (SDPA,
    transformers' default, on a tie). Figures: milliseconds per forward + backward of each. `timer` replaces
    the real timing (tests)."""
    check_choice("attention_backend", requested, ATTENTION_BACKENDS)
    if requested != "auto":
        return AttentionChoice(requested, requested, "requested explicitly")
    shape = (max(1, tokens // length), heads, length, head_dim)  # (B, H, L, Dh)
    timer = timer or partial(time_attention, device, autocast_dtype(precision, device), *shape)
    started = time.perf_counter()
    with one_thread():
        first = {backend: timer(backend) for backend in ("eager", "sdpa")}
        seconds = fastest_in_rounds({backend: partial(timer, backend) for backend in first}, first, started)
    figures = {f"{backend}_ms": 1e3 * value for backend, value in seconds.items()}
    figures.update(shape=list(shape), probe_seconds=time.perf_counter() - started)
    backend = "eager" if seconds["eager"] < seconds["sdpa"] else "sdpa"
    other = "sdpa" if backend == "eager" else "eager"
    reason = f"{backend} {seconds[other] / seconds[backend]:.2f}x the speed of {other} for {precision} forward + backward"
    return AttentionChoice(requested, backend, reason, figures)


def compute_dtype(precision: str, device) -> torch.dtype:
    """The dtype the matmuls of a run in `precision` compute in (fp32 where there is no autocast)."""
    return autocast_dtype(precision, device) or torch.float32


def matmul_peak_flops(precision: str, device, budget_seconds: float = PEAK_BUDGET_SECONDS) -> float:
    """Measured dense matmul FLOP/s of `precision` with the current thread count: the best of square matmuls
    doubling from PEAK_FIRST_SIZE, stopping before a size whose predicted time would overrun `budget_seconds`
    (so an emulated bf16 stops after its first small matmul)."""
    dtype = compute_dtype(precision, device)
    started = time.perf_counter()
    best, size = 0.0, PEAK_FIRST_SIZE
    while size <= PEAK_LARGEST_SIZE:
        left = torch.randn(size, size, device=device, dtype=dtype)  # (n, n)
        right = torch.randn(size, size, device=device, dtype=dtype)  # (n, n)
        seconds = best_seconds(partial(torch.matmul, left, right), device, budget_seconds=budget_seconds / 4)
        best = max(best, 2 * size**3 / seconds)
        # The next size has 8x the FLOPs: a warm-up and one timed call of it must fit in what is left.
        if time.perf_counter() - started + 2 * 8 * seconds > budget_seconds:
            break
        size *= 2
    return best


def sdpa_forward_flops(query_shape, key_shape, value_shape, *args, out_shape=None, **kwargs) -> int:
    """Q K^T and P V."""
    return sdpa_flop_count(query_shape, key_shape, value_shape)


def sdpa_backward_model_flops(
    grad_out_shape, query_shape, key_shape, value_shape, *args, out_shape=None, **kwargs
) -> int:
    """The gradients of V, P, Q and K: twice the forward. The fused kernels also recompute Q K^T, which
    torch's own formula counts; model FLOPs do not, so eager and SDPA attention count alike."""
    return 2 * sdpa_flop_count(query_shape, key_shape, value_shape)


aten = torch.ops.aten
# torch's FlopCounterMode reports 0 FLOPs for SDPA's CPU kernel and counts the fused backward kernels' score
# recomputation (hardware, not model, FLOPs); these formulas make every SDPA kernel count the FLOPs of eager
# attention.
SDPA_MODEL_FLOPS = {
    aten._scaled_dot_product_flash_attention_for_cpu: sdpa_forward_flops,
    aten._scaled_dot_product_flash_attention_for_cpu_backward: sdpa_backward_model_flops,
    aten._scaled_dot_product_flash_attention_backward: sdpa_backward_model_flops,
    aten._scaled_dot_product_efficient_attention_backward: sdpa_backward_model_flops,
    aten._scaled_dot_product_cudnn_attention_backward: sdpa_backward_model_flops,
}


def training_flops(model, batch: dict, device, dtype: torch.dtype | None) -> int:
    """Model FLOPs of one forward + backward (the numerator of MFU), as torch's FlopCounterMode counts them
    (matmuls, convolutions, attention) with SDPA counted as eager attention (`SDPA_MODEL_FLOPS`); optimizer
    and elementwise ops are not counted. Gradients are cleared afterwards."""
    counter = FlopCounterMode(display=False, custom_mapping=SDPA_MODEL_FLOPS)
    with counter, autocast(device, dtype):
        model(**batch).loss.backward()
    model.zero_grad(set_to_none=True)
    return counter.get_total_flops()


def model_flops_per_target_token(
    model, source_length: int, target_length: int, batch_size: int, device, dtype: torch.dtype | None
) -> float:
    """Forward + backward FLOPs per target token of a batch of random `batch_size` x `source_length` sources
    and `batch_size` x `target_length` labels (ids above pad and eos), under autocast to `dtype`."""
    generator = torch.Generator().manual_seed(0)
    vocab = model.config.vocab_size
    batch = {
        "input_ids": torch.randint(2, vocab, (batch_size, source_length), generator=generator).to(device),
        "labels": torch.randint(2, vocab, (batch_size, target_length), generator=generator).to(device),
    }
    return training_flops(model, batch, device, dtype) / (batch_size * target_length)
