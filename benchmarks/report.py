"""The page `make bench` writes (benchmarks/run.py measures): ratios against stock Marian per phase measured,
the MFU and torch.compile tables, and the speed and memory targets judged on the numbers."""

import json
import math

import torch

from .harness import COMPILED, FAST, INT8, STOCK_MARIAN
from .systems import System

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
DECODE_GROWTH_LIMIT = 1.1
# The model FLOPs utilisation targets for sinusoidal's training step, by (device type, size): the share
# of the measured (CPU) or given (GPU) matmul peak of the best precision.
MFU_TARGETS = {("cpu", "base"): 0.50, ("cuda", "base"): 0.35, ("cuda", "big"): 0.40}
GPU_MODULE_SPEED = 0.8  # at base on a GPU, every module's training tokens/s over sinusoidal's


def describe(system: System) -> str:
    if system.overrides is None:
        return "stock `transformers.MarianMTModel`"
    return ", ".join(f"{key}={value}" for key, value in system.overrides.items()) + (
        " (folded, inference only)" if system.precomputed else ""
    )


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
        table, higher = results["generation"]["tokens_per_second"], True
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


def targets_section(results: dict, systems: list[System], args) -> list[str]:
    names = {system.name for system in systems}
    lines = [
        "## Targets",
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
        ratios = {
            name: geometric_mean(train[f"{name}@{n}"] / train[f"sinusoidal@{n}"] for n in args.lengths)
            for name in sorted(names - {STOCK_MARIAN, "sinusoidal"})
            if all(f"{name}@{n}" in train for n in args.lengths)
        }
        slow = [f"{name} {ratio:.2f}×" for name, ratio in ratios.items() if ratio < GPU_MODULE_SPEED]
        if ratios:  # judged only when another module was trained
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
    """Write `<output_dir>/<stem>.md`: the sections of the phases measured, then the targets; the notes below
    `NOTES_MARKER` in an existing page are kept."""
    names = [system.name for system in systems]
    trained = [system.name for system in systems if not system.precomputed]
    lines = header_section(results, systems, fields, args, command)
    if "training" in results:
        lines += training_section(results, trained, args)
        if args.compile:
            lines += compile_section(results, trained, args)
    if "forward_seconds" in results:
        lines += forward_section(results, names, args)
    if "generation" in results:
        lines += generation_section(results, names, args)
    if "decode_ms" in results:
        lines += decoding_section(results, names, args)
    if plots:
        lines += [f"Plots: {', '.join(f'[{plot}]({plot})' for plot in plots)}.", ""]
    lines += [*targets_section(results, systems, args), "", NOTES_MARKER]
    path = args.output_dir / f"{args.stem}.md"
    kept = ""
    if path.exists() and NOTES_MARKER in path.read_text():
        kept = path.read_text().split(NOTES_MARKER, 1)[1]
    path.write_text("\n".join(lines) + (kept or "\n"))


def header_section(results: dict, systems: list[System], fields: dict, args, command: str) -> list[str]:
    """The title, the command and the machine, how the numbers were measured, and the systems' parameters."""
    return [
        f"# Benchmarks ({args.config}): positional modules vs stock MarianMTModel",
        "",
        f"Generated by `benchmarks/run.py` on {results['date']}:",
        "",
        f"    {command}",
        "",
        f"Machine: {results['machine']}. Device `{args.device}`, {args.precision_choice.line()}, "
        f"{args.attention_choice.line()}, seed {args.seed}, median of {args.repeats} interleaved "
        "repeats after one warm-up each. All numbers are ratios vs stock `transformers.MarianMTModel` "
        "measured in the same process (absolute times depend on the machine and its load, so they are not "
        "comparable across runs).",
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


def forward_section(results: dict, names: list[str], args) -> list[str]:
    return [
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


def generation_section(results: dict, names: list[str], args) -> list[str]:
    settings = [f"b{b}k{k}" for b in args.generation_batch_sizes for k in args.beams]
    measured = results["generation"]["tokens_per_second"]
    lengths = (
        f"source length {args.source_length}, exactly {args.new_tokens} new tokens per sequence"
        if args.generation_lengths == "fixed"
        else "the source and reference lengths of the first test pairs, each output ending at its reference's"
    )
    return [
        f"## Generation (tokens/s; {lengths})",
        "",
        "Speed ratio of `generate` (higher is faster); `b` = batch size, `k` = beams (1 = greedy):",
        "",
        table(
            ["system", *[f"b{b} k{k}" for b in args.generation_batch_sizes for k in args.beams]],
            [ratio_row(n, measured, settings) for n in names],
        ),
        "",
        "Stock Marian absolute: "
        + ", ".join(
            f"b{b} k{k}: {measured[f'{STOCK_MARIAN}@b{b}k{k}']:,.0f} tok/s"
            for b in args.generation_batch_sizes
            for k in args.beams
        ),
        "",
        *fast_loop_section(results["generation"], names, settings, args.generation_lengths),
    ]


# What the fast loop's ratios hold, by --generation_lengths.
FAST_LOOP_LENGTHS = {
    "fixed": "every sequence runs to the fixed length, so no example finishes early and the loop's dropping of "
    "finished examples never acts: these ratios are its per-step saving alone ([decoding.md](decoding.md) "
    "measures real translations).",
    "real": "each example ends at its reference's length (random tokens, real lengths), so examples finish "
    "apart as in translation and the loop drops them as they do.",
}


def fast_loop_section(generation: dict, names: list[str], settings: list[str], lengths: str) -> list[str]:
    """Each hf_posenc system's fast decoding loop over its own `generate`, and whether the tokens were the same."""
    measured, identical = generation["tokens_per_second"], generation["identical"]
    rows = [
        f"| {name} | "
        + " | ".join(
            f"{measured[f'{name}{FAST}@{s}'] / measured[f'{name}@{s}']:.2f}"
            + ("" if identical[f"{name}@{s}"] else " (tokens differ)")
            for s in settings
        )
        + " |"
        for name in names
        if f"{name}@{settings[0]}" in identical
    ]
    return [
        "### The fast decoding loop (`generate(..., fast_decoding=True)`) over `generate`",
        "",
        f"The same model, source and settings; {FAST_LOOP_LENGTHS[lengths]}",
        "",
        table(["system", *[s.replace("k", " k") for s in settings]], rows),
        "",
        *int8_section(generation, names, settings),
    ]


def int8_section(generation: dict, names: list[str], settings: list[str]) -> list[str]:
    """Each hf_posenc system's fast loop with int8 linear layers (`quantize_int8`) over its own float32
    `generate`, or why it was not measured."""
    measured = generation["tokens_per_second"]
    heading = "### The fast loop with int8 linear layers over `generate` (float32)"
    if generation.get("int8_missing"):
        return [heading, "", f"Not measured: {generation['int8_missing']}", ""]
    rows = [
        f"| {name} | "
        + " | ".join(f"{measured[f'{name}{INT8}@{s}'] / measured[f'{name}@{s}']:.2f}" for s in settings)
        + " |"
        for name in names
        if f"{name}{INT8}@{settings[0]}" in measured
    ]
    return [
        heading,
        "",
        "The same models with every linear layer int8 (`quantize_int8`, docs/decoding.md), decoded by the fast loop "
        "with an example's beams sharing its cross-attention keys (`shared_cross_attention`, which int8 turns on); "
        "their tokens are not `generate`'s, and untrained weights say nothing of the BLEU cost.",
        "",
        table(["system", *[s.replace("k", " k") for s in settings]], rows),
        "",
    ]


def decoding_section(results: dict, names: list[str], args) -> list[str]:
    return [
        "## Per-token decoding time vs prefix length (greedy, batch 1)",
        "",
        f"Milliseconds of one step whose cache holds the prefix (median of {args.decode_rounds} rounds, every "
        "system and prefix once per round in a shuffled order), "
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


def training_section(results: dict, trained: list[str], args) -> list[str]:
    train, memory = results["training"]["tokens_per_second"], results["training"]["memory_bytes"]

    def length_table(measure: dict) -> str:
        """Each trained system's ratio to the baseline at every length."""
        return table(
            ["system", *[f"L={n}" for n in args.lengths]],
            [ratio_row(n, measure, args.lengths) for n in trained],
        )

    return [
        f"## Training step (target tokens/s of fwd+bwd+AdamW; {args.tokens_per_batch} target tokens per "
        "batch)",
        "",
        "Speed ratio (higher is faster):",
        "",
        length_table(train),
        "",
        "Memory ratio (lower is smaller; CPU: bytes autograd saves for backward + parameters + gradients; "
        "CUDA: the system's parameters and optimizer state + the allocator's peak over one step above what was "
        "allocated before it):",
        "",
        length_table(memory),
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
