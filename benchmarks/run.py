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
import functools
import json
import os
import platform
import shlex
import statistics
import sys
import time
from dataclasses import replace
from pathlib import Path

import torch
import transformers

from hf_posenc.pipeline.data.files import read_split
from hf_posenc.pipeline.evaluation.quantization import check_int8_speed, quantize_int8
from hf_posenc.pipeline.training.hardware import (
    choose_attention_backend,
    choose_precision,
    keep_freed_memory,
    matmul_peak_flops,
)

from .harness import (
    FAST,
    INT8,
    MODEL_SIZES,
    STOCK_MARIAN,
    benchmark_training_steps,
    build_system,
    count_parameters,
    decode_step_seconds,
    forward_repeated,
    generation_run,
    interleaved_median_seconds,
    real_length_batch,
    synthetic_batch,
)
from .plots import write_plots
from .report import geometric_mean, write_markdown
from .systems import MULTI30K, System, benchmark_systems

MEMORY_SHARE = 0.6  # of the memory available when training starts, for one group of interleaved systems
TRAINING_BYTES_PER_PARAMETER = 16  # fp32 weights and gradients, AdamW's two moments
PHASES = ("training", "forward", "generation", "decode")  # training first: its MFU peak is measured warm


def registered_systems() -> list[System]:
    return [System(STOCK_MARIAN, None), *benchmark_systems()]


def parse_args(argv):
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    add_workload_flags(parser)
    add_machine_flags(parser)
    add_phase_and_output_flags(parser)
    args = parser.parse_args(argv)
    resolve_settings(args)
    return args


def add_workload_flags(parser) -> None:
    """The systems, the model size, and the lengths, batches and repeats each phase measures."""
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
    parser.add_argument(
        "--generation_lengths",
        choices=["fixed", "real"],
        default="fixed",
        help="fixed: sources of --source_length tokens, exactly --new_tokens per output; real: the source and "
        "reference lengths (words + </s>) of the first test pairs of Multi30k, each output ending at its "
        "reference's length, so that examples finish apart as in translation",
    )
    parser.add_argument("--source_length", type=int, default=24)
    parser.add_argument(
        "--new_tokens", type=int, default=24, help="tokens generated per sequence (min = max)"
    )
    parser.add_argument("--decode_prefixes", nargs="+", type=int, default=[10, 25, 50, 100, 200, 400])
    parser.add_argument(
        "--decode_rounds",
        type=int,
        default=100,
        help="single steps timed per system and prefix (decode phase)",
    )
    parser.add_argument("--repeats", type=int, default=5)


def add_machine_flags(parser) -> None:
    """Where and how the systems run: threads, device, precision, attention kernel, seed, the MFU peak, the
    position table."""
    parser.add_argument("--threads", type=int, default=1, help="CPU threads (torch.set_num_threads)")
    parser.add_argument(
        "--device",
        default="cpu",
        help="torch device every system is built and measured on (cpu, cuda, cuda:1, ...); on CUDA the timings "
        "synchronise the device, memory is its peak allocation, and length 1024 joins the default lengths",
    )
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


def add_phase_and_output_flags(parser) -> None:
    """The phases measured (and whether compiled training joins them), and the folder the page goes to."""
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


def resolve_settings(args) -> None:
    """The settings derived from the flags: the precision and attention kernel chosen (measured where auto),
    the default lengths for the device, and the stem of the files written."""
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
    decoder_longest = max(args.new_tokens, max(args.decode_prefixes)) + 1  # + the start token
    # SHAPE shifts training positions by up to shape_max_shift
    shift = max((system.overrides or {}).get("shape_max_shift", 0) for system in systems)
    longest = max(max(args.lengths) + shift, *args.forward_lengths, args.source_length, decoder_longest)
    # The longest position any measurement reaches, unless given: modules with position tables (learned, PosNet,
    # LinearNet, folded aPosNet/rPosNet) grow with it, and no system should pay for positions it never sees.
    fields = dict(MODEL_SIZES[args.config], max_position_embeddings=args.max_positions or longest)
    fields["attn_implementation"] = args.attention_choice.backend  # every system's, stock Marian's too
    return fields


def fit_randomized_positions(systems: list[System], longest: int) -> list[System]:
    """Systems with randomized positions draw a whole sequence's positions below L = randomized_positions_max,
    so L must be at least the longest length measured: a variant's L (sized for the conformance suite's short
    inputs) is raised to `longest`, the longest position any measurement reaches, as a model trained at these
    lengths would set it."""
    fitted = []
    for system in systems:
        draws = (system.overrides or {}).get("randomized_positions_max", 0)
        if 0 < draws < longest:
            system = replace(system, overrides={**system.overrides, "randomized_positions_max": longest})
        fitted.append(system)
    return fitted


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


def int8_models(models, args, dtype) -> tuple[dict, str | None]:
    """hf_posenc's systems with int8 linear layers (`quantize_int8`), to decode through the fast loop, and why
    there are none: only on the CPU in float32, where torch's int8 product is faster than float32's."""
    if torch.device(args.device).type != "cpu" or dtype is not None:
        return {}, "int8 decoding is measured on the CPU in float32 only (--precision fp32)"
    try:
        check_int8_speed()
    except ValueError as slower:
        return {}, str(slower)
    return {name: quantize_int8(model) for name, model in models.items() if name != STOCK_MARIAN}, None


def measure_generation(models, args, dtype) -> dict:
    """Tokens/s of each system's `generate` (`<system>@b<B>k<K>`) and, for hf_posenc's systems, of the fast
    decoding loop (`<system>+fast@...`) and of the fast loop with int8 linear layers where they are measured
    (`<system>+int8@...`, `int8_models`), interleaved; `identical` says per system and setting whether the fast
    loop returned `generate`'s tokens (int8 computes other numbers and is not compared)."""
    tokens_per_second, identical = {}, {}
    quantized, int8_missing = int8_models(models, args, dtype)
    generator = torch.Generator().manual_seed(args.seed)
    config = models[STOCK_MARIAN].config
    pairs = (
        read_split(MULTI30K, "test_2016_flickr", "en", "de") if args.generation_lengths == "real" else None
    )
    for batch_size in args.generation_batch_sizes:
        if pairs is None:
            source = torch.randint(
                2, config.vocab_size, (batch_size, args.source_length), generator=generator
            )
            lengths, tokens = None, batch_size * args.new_tokens
        else:
            source, lengths = real_length_batch(pairs, batch_size, config, generator)
            tokens = int(lengths.sum())
        source = source.to(args.device)
        for beams in args.beams:
            setting = f"b{batch_size}k{beams}"
            work = {}
            for name, model in models.items():
                run = functools.partial(
                    generation_run, model, source, args.new_tokens, beams, args.device, dtype
                )
                work[name] = run(lengths=lengths)
                if name != STOCK_MARIAN:
                    work[name + FAST] = run(fast=True, lengths=lengths)
                    identical[f"{name}@{setting}"] = torch.equal(work[name](), work[name + FAST]())
                if name in quantized:  # float32 around the int8 layers (dtype is None)
                    work[name + INT8] = generation_run(
                        quantized[name], source, args.new_tokens, beams, args.device, dtype, True, lengths
                    )
            for name, value in interleaved_median_seconds(work, args.repeats, args.device).items():
                tokens_per_second[f"{name}@{setting}"] = tokens / value
    return {"tokens_per_second": tokens_per_second, "identical": identical, "int8_missing": int8_missing}


def measure_decode_steps(models, args, dtype) -> dict:
    """Milliseconds of one greedy step (batch 1) at each prefix: the median over `--decode_rounds` rounds of
    single steps, systems and prefixes in a shuffled order each round."""
    generator = torch.Generator().manual_seed(args.seed)
    source = torch.randint(
        2, models[STOCK_MARIAN].config.vocab_size, (1, args.source_length), generator=generator
    )
    steps = decode_step_seconds(
        models,
        source.to(args.device),
        args.decode_prefixes,
        args.decode_rounds,
        args.device,
        dtype,
        args.seed,
    )
    return {key: 1e3 * statistics.median(values) for key, values in steps.items()}


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
    # train.py's default --cpu_memory reuse: a benchmark times the update that training makes
    memory = "; freed CPU memory kept for reuse (train.py's --cpu_memory reuse)" if args.memory_reused else ""
    return (
        f"{cpu}, {torch.get_num_threads()} thread(s) of {os.cpu_count()} cores; Python "
        f"{platform.python_version()}, torch {torch.__version__}, transformers {transformers.__version__}{memory}"
    )


def main(argv=None):
    args = parse_args(argv)
    torch.set_num_threads(args.threads)
    args.memory_reused = keep_freed_memory(args.device)
    systems = select_systems(args.systems)
    fields = model_fields(args, systems)
    systems = fit_randomized_positions(systems, fields["max_position_embeddings"])
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
