"""Speed, memory and decoding cost of every registered positional module vs stock MarianMTModel, one process.

    python -m benchmarks.run --config small --threads 1 --repeats 3          # CPU, every system
    python -m benchmarks.run --device cuda --config base                      # GPU: adds length 1024
    python -m benchmarks.run --systems marian shaw rposnet_precomputed --lengths 32 128

Systems (same dims, fields and seed): "marian" (stock `transformers.MarianMTModel`, the baseline), every
position encoding of `hf_posenc.POSITION_ENCODINGS` (both stacks), every token mixer of
`hf_posenc.TOKEN_MIXERS` placed at *all* the self-attention sites it allows (one variant per mixer; cross-
attention stays content attention, as in paper 2's models) and, for mixers that can fold their position-only
energies, `<mixer>_precomputed` (inference only). Measured, with systems interleaved and the median of
--repeats: training-step target tokens/s (fwd+bwd+AdamW) and memory per length, paper 1's forward benchmark
(one fixed batch forwarded 10×), greedy and beam-4 generation tokens/s (exactly --new_tokens per sequence),
per-token decoding time vs prefix length, parameter counts, and the model FLOPs utilisation (MFU) of the
training step: FLOPs counted by torch's FlopCounterMode per second, over the dense matmul peak of the
measured precision *measured on this machine* with the same threads (--peak_tflops gives a datasheet peak
instead, e.g. on a GPU). With --compile, every system is also trained under `torch.compile`: its first step
(compilation included), its steady speed over eager and the updates after which compiling pays. --phases picks
what to measure (base and big on a CPU: training only, or it takes hours). Writes <output>/benchmarks.md
(ratios vs stock Marian, machine, versions, date, command, targets), benchmarks_*.png and benchmarks.json for
--config small, benchmarks-<config>.* for the other sizes (tiny, base, big), so that each size keeps its page.
"""

import argparse
import datetime
import json
import math
import os
import platform
import shlex
import statistics
import sys
import time
from pathlib import Path

import torch
import transformers

from benchmarks.harness import (
    COMPILED,
    MODEL_SIZES,
    STOCK_MARIAN,
    benchmark_training_steps,
    build_system,
    count_parameters,
    decode_step_seconds,
    forward_repeated,
    generation_run,
    interleaved_median_seconds,
    synthetic_batch,
)
from benchmarks.plots import write_plots
from hf_posenc.pipeline.hardware import choose_attention_backend, choose_precision, matmul_peak_flops
from hf_posenc.pipeline.systems import System, benchmark_systems

NOTES_MARKER = "<!-- Everything below this line is kept when benchmarks/run.py rewrites this file. -->"
# The CPU targets: (system, metric, threshold, higher is better). Metrics are defined in `metric`.
TARGETS = [
    ("sinusoidal", "train", 0.98, True),
    ("sinusoidal", "decode", 0.98, True),
    ("posnet_embed", "train", 0.95, True),
    ("posnet_attn", "train", 0.85, True),
    ("shaw", "train", 0.85, True),
    ("shaw", "memory", 1.05, False),
    ("t5_bias", "train", 0.9, True),
    ("adaptive_t5", "train", 0.9, True),
    ("alibi", "train", 0.9, True),
    ("rpe_head", "train", 0.7, True),
    ("mpr_head", "train", 0.7, True),
    ("rposnet_precomputed", "decode", 1.10, True),
]
# Every system's per-token decoding time growth from the first to the last prefix, over the baseline's growth.
DECODE_GROWTH_LIMIT = 1.2
# The model FLOPs utilisation targets for sinusoidal's training step, by (device type, size): the share
# of the measured (CPU) or given (GPU) matmul peak of the best precision.
MFU_TARGETS = {("cpu", "base"): 0.50, ("cuda", "base"): 0.35, ("cuda", "big"): 0.40}
GPU_MODULE_SPEED = 0.8  # at base on a GPU, every module's training tokens/s over sinusoidal's
MEMORY_SHARE = 0.6  # of the memory available when training starts, for one group of interleaved systems
TRAINING_BYTES_PER_PARAMETER = 16  # fp32 weights and gradients, AdamW's two moments
PHASES = ("training", "forward", "generation", "decode")  # training first: its MFU peak is measured warm


def registered_systems() -> list[System]:
    return [System(STOCK_MARIAN, None), *benchmark_systems()]


def describe(system: System) -> str:
    if system.overrides is None:
        return "stock `transformers.MarianMTModel`"
    return ", ".join(f"{key}={value}" for key, value in system.overrides.items()) + (
        " (folded, inference only)" if system.precomputed else ""
    )


def parse_args(argv):
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument(
        "--systems", nargs="+", help=f"subset (the baseline {STOCK_MARIAN!r} is always added)"
    )
    parser.add_argument("--config", choices=sorted(MODEL_SIZES), default="small")
    parser.add_argument(
        "--lengths", nargs="+", type=int, help="training lengths (default 32 128 512, +1024 on GPU)"
    )
    parser.add_argument("--forward_lengths", nargs="+", type=int, help="default: the training lengths")
    parser.add_argument("--tokens_per_batch", type=int, default=4096, help="target tokens per training batch")
    parser.add_argument(
        "--forward_times", type=int, default=10, help="forwards per measurement (paper 1: 10)"
    )
    parser.add_argument("--generation_batch_sizes", nargs="+", type=int, default=[1, 32])
    parser.add_argument("--beams", nargs="+", type=int, default=[1, 4])
    parser.add_argument("--source_length", type=int, default=24)
    parser.add_argument(
        "--new_tokens", type=int, default=24, help="tokens generated per sequence (min = max)"
    )
    parser.add_argument("--decode_prefixes", nargs="+", type=int, default=[10, 25, 50, 100, 200, 400])
    parser.add_argument("--repeats", type=int, default=5)
    parser.add_argument("--threads", type=int, default=1)
    parser.add_argument("--device", default="cpu")
    parser.add_argument(
        "--precision",
        choices=["auto", "bf16", "fp32"],
        default="auto",
        help="auto: bf16 where measured faster on this machine (CUDA: where supported)",
    )
    parser.add_argument(
        "--attention_backend",
        choices=["auto", "eager", "sdpa"],
        default="auto",
        help="every system's attention kernel; auto: the faster, measured",
    )
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument(
        "--peak_tflops",
        type=float,
        help="the device's peak dense TFLOP/s in the measured precision (e.g. 989 for H100 SXM bf16), the "
        "denominator of the training step's model FLOPs utilisation; default: a dense matmul of that precision "
        "measured on this machine",
    )
    parser.add_argument(
        "--max_positions", type=int, help="max_position_embeddings (default: the longest length measured)"
    )
    parser.add_argument(
        "--phases",
        nargs="+",
        choices=list(PHASES),
        default=list(PHASES),
        help="what to measure (default all; at base or big size on a CPU, training alone takes most of an hour)",
    )
    parser.add_argument(
        "--compile",
        action="store_true",
        help="also train every system under torch.compile: the first step (compilation included), the steady "
        "speed against eager, and the updates after which compiling has paid for itself",
    )
    parser.add_argument(
        "--output_dir",
        type=Path,
        default=Path("docs"),
        help="writes benchmarks.md/.json/_*.png for --config small, benchmarks-<config>.* for the other sizes",
    )
    args = parser.parse_args(argv)
    size = MODEL_SIZES[args.config]
    args.precision_choice = choose_precision(
        args.precision, args.device, size["d_model"], size["encoder_ffn_dim"]
    )
    args.attention_choice = choose_attention_backend(
        args.attention_backend,
        args.precision_choice.precision,
        args.device,
        size["encoder_attention_heads"],
        size["d_model"] // size["encoder_attention_heads"],
    )
    args.bf16 = args.precision_choice.precision == "bf16"
    if args.lengths is None:
        args.lengths = [32, 128, 512] + ([1024] if torch.device(args.device).type == "cuda" else [])
    args.forward_lengths = args.forward_lengths or args.lengths
    args.stem = "benchmarks" if args.config == "small" else f"benchmarks-{args.config}"
    return args


def select_systems(names: list[str] | None) -> list[System]:
    systems = registered_systems()
    if names is None:
        return systems
    known = {system.name: system for system in systems}
    unknown = [name for name in names if name not in known]
    if unknown:
        raise SystemExit(f"unknown systems {unknown}; known: {', '.join(known)}")
    return [known[STOCK_MARIAN]] + [known[name] for name in dict.fromkeys(names) if name != STOCK_MARIAN]


def model_fields(args, systems: list[System]) -> dict:
    decoder_longest = max(args.new_tokens, decode_new_tokens(args)) + 1  # + the start token
    # SHAPE shifts training positions by up to shape_max_shift
    shift = max((system.overrides or {}).get("shape_max_shift", 0) for system in systems)
    longest = max(max(args.lengths) + shift, *args.forward_lengths, args.source_length, decoder_longest)
    # The longest position any measurement reaches, unless given: modules with position tables (learned, PosNet,
    # LinearNet, folded aPosNet/rPosNet) grow with it, and no system should pay for positions it never sees.
    fields = dict(MODEL_SIZES[args.config], max_position_embeddings=args.max_positions or longest)
    fields["attn_implementation"] = args.attention_choice.backend  # every system's, stock Marian's too
    return fields


def training_groups(systems: list[System], fields: dict, args) -> list[list[System]]:
    """The trained systems in groups that fit in memory at once, each led by the baseline (the first system).

    Interleaving keeps every model of a group alive with its optimizer: 16 bytes a parameter (fp32 weights and
    gradients, AdamW's two moments), doubled for activations and the allocator. At base size on a 24 GiB machine
    two dozen systems do not fit (the kernel killed that run), so a group takes at most MEMORY_SHARE of the
    memory available now."""
    trained = [system for system in systems if not system.precomputed]
    if torch.device(args.device).type == "cuda":
        available = torch.cuda.mem_get_info()[0]
    else:
        available = os.sysconf("SC_AVPHYS_PAGES") * os.sysconf("SC_PAGE_SIZE")
    largest = max(count_parameters(fields, system.overrides) for system in trained)
    size = max(2, int(MEMORY_SHARE * available // (2 * TRAINING_BYTES_PER_PARAMETER * largest)))
    baseline, others = trained[0], trained[1:]
    return [[baseline, *others[start : start + size - 1]] for start in range(0, len(others), size - 1)] or [
        [baseline]
    ]


def measure_training(systems, fields, args, dtype) -> dict:
    """Every trained system's step speed, memory and MFU. Systems are interleaved with the baseline group by
    group (`training_groups`); each group's speeds are scaled by the baseline's geometric mean over the groups
    over its speed in that group, so every ratio to the baseline is the one measured in its own group."""
    groups = training_groups(systems, fields, args)
    if len(groups) > 1:
        print(
            f"[bench] training in {len(groups)} groups of at most {max(map(len, groups))} systems (memory)",
            file=sys.stderr,
            flush=True,
        )
    measured = []
    for group in groups:
        measured.append(
            benchmark_training_steps(
                {system.name: system.overrides for system in group},
                fields,
                lengths=args.lengths,
                tokens_per_batch=args.tokens_per_batch,
                repeats=args.repeats,
                steps_per_repeat=1,
                device=args.device,
                autocast_dtype=dtype,
                count_flops=True,
                compile=args.compile,
            )
        )
    baseline = [
        {r.length: r.tokens_per_second for r in results if r.variant == STOCK_MARIAN} for results in measured
    ]
    mean = {n: geometric_mean(speeds[n] for speeds in baseline) for n in args.lengths}
    speed, results = {}, []
    for group_baseline, group_results in zip(baseline, measured, strict=True):
        for r in group_results:
            if f"{r.variant}@{r.length}" not in speed:  # the baseline: its first group's memory and FLOPs
                speed[f"{r.variant}@{r.length}"] = (
                    r.tokens_per_second * mean[r.length] / group_baseline[r.length]
                )
                results.append(r)
    peak = peak_flops(args)
    return {
        "groups": [[system.name for system in group] for group in groups],
        "tokens_per_second": speed,
        "memory_bytes": {f"{r.variant}@{r.length}": r.memory_bytes for r in results if r.memory_bytes},
        "first_step_seconds": {
            f"{r.variant}@{r.length}": r.first_step_seconds for r in results if r.first_step_seconds
        },
        "peak": peak,
        # model FLOPs utilisation: counted FLOPs per second over the peak
        "mfu": {
            f"{r.variant}@{r.length}": r.flops_per_token * speed[f"{r.variant}@{r.length}"] / peak["flops"]
            for r in results
        },
    }


def peak_flops(args) -> dict:
    """The MFU denominator: --peak_tflops when given, else the measured dense matmul FLOP/s of the benchmark's
    precision with its threads (measured after the systems' training steps, on a warm machine)."""
    precision = "bf16" if args.bf16 else "fp32"
    if args.peak_tflops is not None:
        return {"flops": args.peak_tflops * 1e12, "source": f"given (--peak_tflops {args.peak_tflops})"}
    flops = matmul_peak_flops(precision, args.device)
    source = f"measured: dense {precision} matmul on this machine, {torch.get_num_threads()} thread(s)"
    return {"flops": flops, "source": source}


def eval_models(systems, fields, args) -> dict:
    return {system.name: build_system(system, fields, args.device, args.seed).eval() for system in systems}


def measure_forward(systems, fields, args, dtype) -> dict:
    seconds = {}
    for length in args.forward_lengths:
        models = eval_models(systems, fields, args)
        batch = synthetic_batch(
            models[STOCK_MARIAN].config, max(1, args.tokens_per_batch // length), length, args.device
        )
        work = {
            name: forward_repeated(m, batch, args.forward_times, args.device, dtype)
            for name, m in models.items()
        }
        for name, value in interleaved_median_seconds(work, args.repeats, args.device).items():
            seconds[f"{name}@{length}"] = value
    return seconds


def measure_generation(models, args, dtype) -> dict:
    tokens_per_second = {}
    generator = torch.Generator().manual_seed(args.seed)
    for batch_size in args.generation_batch_sizes:
        source = torch.randint(
            2, models[STOCK_MARIAN].config.vocab_size, (batch_size, args.source_length), generator=generator
        )
        source = source.to(args.device)
        for beams in args.beams:
            work = {
                name: generation_run(m, source, args.new_tokens, beams, args.device, dtype)
                for name, m in models.items()
            }
            for name, value in interleaved_median_seconds(work, args.repeats, args.device).items():
                tokens_per_second[f"{name}@b{batch_size}k{beams}"] = batch_size * args.new_tokens / value
    return tokens_per_second


def window_half(prefix: int) -> int:
    """Steps on each side of a prefix whose times are pooled (±10%, at least 2)."""
    return max(2, prefix // 10)


def decode_new_tokens(args) -> int:
    """Tokens to generate so that the window around the longest prefix is complete."""
    longest = max(args.decode_prefixes)
    return longest + window_half(longest) + 1


def measure_decode_steps(models, args, dtype) -> dict:
    """Milliseconds per greedy step (batch 1) at each prefix: fastest repeat, median over a window of steps."""
    generator = torch.Generator().manual_seed(args.seed)
    source = torch.randint(
        2, models[STOCK_MARIAN].config.vocab_size, (1, args.source_length), generator=generator
    )
    source = source.to(args.device)
    new_tokens = decode_new_tokens(args)
    for model in models.values():  # warm-up
        decode_step_seconds(model, source, min(new_tokens, 16), args.device, dtype)
    runs = {name: [] for name in models}
    for _ in range(args.repeats):
        for name, model in models.items():
            runs[name].append(decode_step_seconds(model, source, new_tokens, args.device, dtype))
    per_prefix = {}
    for name, repeats in runs.items():
        # steps[i]: the step whose cache holds i + 1 tokens. Other jobs on the machine only ever add time, and
        # their bursts hit runs of consecutive steps, so each step keeps its fastest repeat.
        steps = [min(values) for values in zip(*repeats, strict=True)]
        for prefix in args.decode_prefixes:
            window = steps[max(0, prefix - 1 - window_half(prefix)) : prefix + window_half(prefix)]
            per_prefix[f"{name}@{prefix}"] = 1e3 * statistics.median(window)
    return per_prefix


def geometric_mean(values) -> float:
    values = list(values)
    return math.exp(sum(math.log(v) for v in values) / len(values))


def metric(results: dict, system: str, name: str, args) -> tuple[float, float] | None:
    """(geometric mean, worst) over lengths/settings of a ratio vs the baseline; None if not measured."""
    if ("training" if name in ("train", "memory") else "generation") not in results:
        return None
    if name == "train":
        table, keys, higher = results["training"]["tokens_per_second"], [f"@{n}" for n in args.lengths], True
    elif name == "memory":
        table, keys, higher = results["training"]["memory_bytes"], [f"@{n}" for n in args.lengths], False
    else:
        keys = [f"@b{b}k{k}" for b in args.generation_batch_sizes for k in args.beams]
        table, higher = results["generation"], True
    if any(system + key not in table for key in keys):
        return None
    ratios = [table[system + key] / table[STOCK_MARIAN + key] for key in keys]
    return geometric_mean(ratios), (min(ratios) if higher else max(ratios))


def decode_growth(results: dict, system: str, args) -> float:
    """Per-token time at the longest prefix over the shortest, relative to the same growth of the baseline."""
    steps, first, last = results["decode_ms"], min(args.decode_prefixes), max(args.decode_prefixes)
    growth = steps[f"{system}@{last}"] / steps[f"{system}@{first}"]
    return growth / (steps[f"{STOCK_MARIAN}@{last}"] / steps[f"{STOCK_MARIAN}@{first}"])


def ratio_row(name: str, table: dict, keys: list[str], invert: bool = False) -> str:
    cells = []
    for key in keys:
        if f"{name}@{key}" not in table:
            cells.append("n/a")
            continue
        ratio = table[f"{name}@{key}"] / table[f"{STOCK_MARIAN}@{key}"]
        cells.append(f"{1 / ratio if invert else ratio:.2f}")
    return f"| {name} | " + " | ".join(cells) + " |"


def table(title_cells: list[str], rows: list[str]) -> str:
    return "\n".join(["| " + " | ".join(title_cells) + " |", "|" + " --- |" * len(title_cells), *rows])


def mfu_section(results: dict, trained: list[str], args) -> list[str]:
    mfu, peak = results["training"]["mfu"], results["training"]["peak"]
    rows = [
        f"| {n} | " + " | ".join(f"{100 * mfu[f'{n}@{length}']:.1f}%" for length in args.lengths) + " |"
        for n in [*trained, *([f"{name}{COMPILED}" for name in trained] if args.compile else [])]
    ]
    return [
        f"Model FLOPs utilisation of the training step (absolute; peak {peak['flops'] / 1e12:.3g} TFLOP/s, "
        f"{peak['source']}; forward + backward FLOPs as counted by `torch.utils.flop_counter.FlopCounterMode`, "
        "SDPA counted as eager attention, optimizer not counted):",
        "",
        table(["system", *[f"L={n}" for n in args.lengths]], rows),
        "",
    ]


def machine_line(args) -> str:
    cpu = platform.processor() or platform.machine()
    cpuinfo = Path("/proc/cpuinfo")
    if cpuinfo.exists():
        names = [
            line.split(":", 1)[1].strip() for line in cpuinfo.read_text().splitlines() if "model name" in line
        ]
        cpu = names[0] if names else cpu
    if torch.device(args.device).type == "cuda":
        cpu += f"; GPU {torch.cuda.get_device_name()}"
    return (
        f"{cpu}, {torch.get_num_threads()} thread(s) of {os.cpu_count()} cores; Python "
        f"{platform.python_version()}, torch {torch.__version__}, transformers {transformers.__version__}"
    )


def targets_section(results: dict, systems: list[System], args) -> list[str]:
    names = {system.name for system in systems}
    lines = [
        "## Issue targets",
        "",
        "Ratios vs stock Marian; the judged number is the geometric mean over the training lengths (train,",
        "memory) or the generation settings (decode); the worst single length/setting is in parentheses.",
        "",
    ]
    for system, name, threshold, higher in TARGETS:
        if system not in names:
            continue
        value = metric(results, system, name, args)
        if value is None:
            continue
        mean, worst = value
        met = mean >= threshold if higher else mean <= threshold
        sign = "≥" if higher else "≤"
        lines.append(
            f"- {system} {name} {sign} {threshold}: **{'met' if met else 'missed'}**, {mean:.2f} "
            f"(worst {worst:.2f})"
        )
    lines += mfu_targets(results, names, args)
    first, last = min(args.decode_prefixes), max(args.decode_prefixes)
    growth = {
        s.name: decode_growth(results, s.name, args)
        for s in systems
        if s.name != STOCK_MARIAN and "decode_ms" in results
    }
    if growth:
        missed = [f"{name} {value:.2f}×" for name, value in growth.items() if value > DECODE_GROWTH_LIMIT]
        worst = max(growth, key=growth.get)
        lines.append(
            f"- every system's per-token decode growth {first}→{last} within {DECODE_GROWTH_LIMIT}× of the "
            f"baseline's: **{'missed' if missed else 'met'}**"
            + (f" by {', '.join(missed)}" if missed else f", worst {worst} {growth[worst]:.2f}×")
            + " (all values in the decoding table's last column)"
        )
    return lines


def mfu_targets(results: dict, names: set[str], args) -> list[str]:
    """Sinusoidal's training MFU against the target for this device and size (the best length counts: a
    position module cannot make short batches use the matmul units better), and on a GPU at base, every
    module's training speed over sinusoidal's (geometric mean over lengths)."""
    device = torch.device(args.device).type
    if "training" not in results or "sinusoidal" not in names:
        return []
    lines = []
    target = MFU_TARGETS.get((device, args.config))
    if target is not None:
        best = max(results["training"]["mfu"][f"sinusoidal@{n}"] for n in args.lengths)
        lines.append(
            f"- sinusoidal training MFU ≥ {100 * target:.0f}% at {args.config} on {device}: "
            f"**{'met' if best >= target else 'missed'}**, {100 * best:.1f}% at its best length"
        )
    if device == "cuda" and args.config == "base":
        train = results["training"]["tokens_per_second"]
        slow = []
        for name in sorted(names - {STOCK_MARIAN, "sinusoidal"}):
            if all(f"{name}@{n}" in train for n in args.lengths):
                ratio = geometric_mean(train[f"{name}@{n}"] / train[f"sinusoidal@{n}"] for n in args.lengths)
                if ratio < GPU_MODULE_SPEED:
                    slow.append(f"{name} {ratio:.2f}×")
        lines.append(
            f"- every module's training speed ≥ {GPU_MODULE_SPEED}× sinusoidal's at base on the GPU: "
            f"**{'missed' if slow else 'met'}**" + (f" by {', '.join(slow)}" if slow else "")
        )
    return lines


def compile_section(results: dict, trained: list[str], args) -> list[str]:
    """torch.compile against eager: the first step (compilation included), the steady speed, and the updates
    after which compiling has paid for itself (compile overhead over the time saved per update)."""
    train, first = results["training"]["tokens_per_second"], results["training"]["first_step_seconds"]
    rows = []
    for name in trained:
        cells = []
        for n in args.lengths:
            eager, compiled = train[f"{name}@{n}"], train[f"{name}{COMPILED}@{n}"]
            batch_tokens = max(1, args.tokens_per_batch // n) * n
            eager_step, compiled_step = batch_tokens / eager, batch_tokens / compiled
            overhead = first[f"{name}{COMPILED}@{n}"] - compiled_step
            saved = eager_step - compiled_step
            pays = f"{math.ceil(overhead / saved):,}" if saved > 0 else "never"
            cells.append(f"{first[f'{name}{COMPILED}@{n}']:.0f} s, {compiled / eager:.2f}×, {pays}")
        rows.append(f"| {name} | " + " | ".join(cells) + " |")
    return [
        "## torch.compile (training step)",
        "",
        "Per length: the first compiled step (compilation included), the steady speed compiled over eager, and",
        "the updates after which compiling has paid for itself (a WMT run takes 100k-300k updates):",
        "",
        table(["system", *[f"L={n}" for n in args.lengths]], rows),
        "",
    ]


def write_markdown(results: dict, systems: list[System], fields: dict, args, command: str, plots: list[str]):
    names = [system.name for system in systems]
    trained = [system.name for system in systems if not system.precomputed]
    lines = [
        f"# Benchmarks ({args.config}): positional modules vs stock MarianMTModel",
        "",
        f"Generated by `benchmarks/run.py` on {results['date']}:",
        "",
        f"    {command}",
        "",
        f"Machine: {results['machine']}. Device `{args.device}`, {args.precision_choice.line()}, "
        f"{args.attention_choice.line()}, seed {args.seed}, median of {args.repeats} interleaved "
        "repeats after one warm-up each. All numbers are ratios vs stock `transformers.MarianMTModel` "
        "measured in the same process (absolute times on a shared machine are not comparable across runs).",
        "",
        f"Model fields (every system): `{json.dumps(fields)}`. Wall time per phase (s): "
        f"{json.dumps(results['phase_seconds'])}.",
        "",
        "Each token mixer is placed at *all* self-attention sites it allows (one variant per mixer, cross-"
        "attention stays content attention as in paper 2's models); `*_precomputed` systems are the same "
        "mixers folded with `precompute_position_attention()` and are measured for inference only.",
        "",
        "## Systems and parameters",
        "",
        table(
            ["system", "what", "parameters", "ratio"],
            [
                f"| {s.name} | {describe(s)} | {results['parameters'][s.name]:,} | "
                f"{results['parameters'][s.name] / results['parameters'][STOCK_MARIAN]:.3f} |"
                for s in systems
            ],
        ),
        "",
    ]
    if "training" in results:
        lines += training_section(results, trained, args)
        if args.compile:
            lines += compile_section(results, trained, args)
    if "forward_seconds" in results:
        lines += [
            f"## Forward benchmark of paper 1 (Fig. 2): one fixed batch forwarded {args.forward_times}×, "
            "no gradients",
            "",
            "Speed ratio (higher is faster):",
            "",
            table(
                ["system", *[f"L={n}" for n in args.forward_lengths]],
                [ratio_row(n, results["forward_seconds"], args.forward_lengths, invert=True) for n in names],
            ),
            "",
        ]
    if "generation" in results:
        settings = [f"b{b}k{k}" for b in args.generation_batch_sizes for k in args.beams]
        lines += [
            f"## Generation (tokens/s; source length {args.source_length}, exactly {args.new_tokens} new "
            "tokens per sequence)",
            "",
            "Speed ratio (higher is faster); `b` = batch size, `k` = beams (1 = greedy):",
            "",
            table(
                ["system", *[f"b{b} k{k}" for b in args.generation_batch_sizes for k in args.beams]],
                [ratio_row(n, results["generation"], settings) for n in names],
            ),
            "",
            "Stock Marian absolute: "
            + ", ".join(
                f"b{b} k{k}: {results['generation'][f'{STOCK_MARIAN}@b{b}k{k}']:,.0f} tok/s"
                for b in args.generation_batch_sizes
                for k in args.beams
            ),
            "",
        ]
    if "decode_ms" in results:
        lines += [
            "## Per-token decoding time vs prefix length (greedy, batch 1, through `generate` with its cache)",
            "",
            "Milliseconds per step at each prefix (fastest of the repeats, median over a ±10% window of steps), "
            f"and the growth from prefix {min(args.decode_prefixes)} to {max(args.decode_prefixes)} relative to "
            "stock Marian's growth (≈1 means no prefix recomputation beyond what attention's cache read costs):",
            "",
            table(
                ["system", *[f"prefix {p}" for p in args.decode_prefixes], "growth vs Marian"],
                [
                    f"| {n} | "
                    + " | ".join(f"{results['decode_ms'][f'{n}@{p}']:.2f}" for p in args.decode_prefixes)
                    + f" | {decode_growth(results, n, args):.2f} |"
                    for n in names
                ],
            ),
            "",
        ]
    if plots:
        lines += [f"Plots: {', '.join(f'[{plot}]({plot})' for plot in plots)}.", ""]
    lines += [*targets_section(results, systems, args), "", NOTES_MARKER]
    path = args.output_dir / f"{args.stem}.md"
    kept = ""
    if path.exists() and NOTES_MARKER in path.read_text():
        kept = path.read_text().split(NOTES_MARKER, 1)[1]
    path.write_text("\n".join(lines) + (kept or "\n"))


def training_section(results: dict, trained: list[str], args) -> list[str]:
    train, memory = results["training"]["tokens_per_second"], results["training"]["memory_bytes"]
    return [
        f"## Training step (target tokens/s of fwd+bwd+AdamW; {args.tokens_per_batch} target tokens per "
        "batch)",
        "",
        "Speed ratio (higher is faster):",
        "",
        table(
            ["system", *[f"L={n}" for n in args.lengths]],
            [ratio_row(n, train, args.lengths) for n in trained],
        ),
        "",
        "Memory ratio (lower is smaller; CPU: bytes autograd saves for backward + parameters + gradients; "
        "CUDA: `max_memory_allocated` over one step):",
        "",
        table(
            ["system", *[f"L={n}" for n in args.lengths]],
            [ratio_row(n, memory, args.lengths) for n in trained],
        ),
        "",
        *(
            [
                f"Measured in {len(groups)} groups that fit in memory, each interleaved with the baseline; each "
                "group's speeds are scaled by the baseline's geometric mean over the groups over its own speed "
                "there, so every ratio is the one of its group: "
                + "; ".join(", ".join(g) for g in groups)
                + ".",
                "",
            ]
            if len(groups := results["training"]["groups"]) > 1
            else []
        ),
        "Stock Marian absolute: "
        + ", ".join(
            f"L={n}: {train[f'{STOCK_MARIAN}@{n}']:,.0f} tok/s, {memory[f'{STOCK_MARIAN}@{n}'] / 2**20:,.0f} MiB"
            for n in args.lengths
        ),
        "",
        *mfu_section(results, trained, args),
    ]


def main(argv=None):
    args = parse_args(argv)
    torch.set_num_threads(args.threads)
    systems = select_systems(args.systems)
    fields = model_fields(args, systems)
    dtype = torch.bfloat16 if args.bf16 else None
    args.output_dir.mkdir(parents=True, exist_ok=True)

    results = {
        "date": datetime.datetime.now(datetime.UTC).strftime("%Y-%m-%d %H:%M UTC"),
        "machine": machine_line(args),
        "parameters": {s.name: count_parameters(fields, s.overrides, s.precomputed) for s in systems},
        "phase_seconds": {},
    }

    def phase(name: str, measure, *inputs):
        start = time.perf_counter()
        print(f"[bench] {name} ({len(systems)} systems) ...", file=sys.stderr, flush=True)
        results[name] = measure(*inputs, args, dtype)
        results["phase_seconds"][name] = round(time.perf_counter() - start)
        print(f"[bench] {name} took {results['phase_seconds'][name]} s", file=sys.stderr, flush=True)

    if "training" in args.phases:
        phase("training", measure_training, systems, fields)
        peak, mfu = results["training"]["peak"], results["training"]["mfu"]
        print(
            f"[bench] peak {peak['flops'] / 1e12:.3g} TFLOP/s ({peak['source']}); {STOCK_MARIAN} MFU "
            + ", ".join(f"L={n}: {100 * mfu[f'{STOCK_MARIAN}@{n}']:.1f}%" for n in args.lengths),
            file=sys.stderr,
            flush=True,
        )
    if "forward" in args.phases:
        phase("forward_seconds", measure_forward, systems, fields)
    if {"generation", "decode"} & set(args.phases):
        models = eval_models(systems, fields, args)
        if "generation" in args.phases:
            phase("generation", measure_generation, models)
        if "decode" in args.phases:
            phase("decode_ms", measure_decode_steps, models)

    command = "python -m benchmarks.run " + shlex.join(sys.argv[1:] if argv is None else argv)
    (args.output_dir / f"{args.stem}.json").write_text(json.dumps({"command": command, **results}, indent=1))
    plots = write_plots(results, systems, args)
    write_markdown(results, systems, fields, args, command, plots)


if __name__ == "__main__":
    main()
