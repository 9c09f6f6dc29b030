"""Training-step throughput and memory of positional modules relative to "sinusoidal", same process.

    python -m benchmarks.train_step --variants shaw t5_bias --lengths 32 128 512 --threads 2

Each variant is `name` (a position encoding for both stacks) or `site=mixer` (a token mixer at a site) or
`field=value,field=value` config overrides, or `marian` (stock transformers.MarianMTModel; benchmarks/run.py
compares everything against it). Prints a markdown table of ratios (see benchmarks.harness).

With --memory_breakdown it times nothing and prints, per variant and length, the deterministic CPU memory split
into activations (saved tensors whose storage is not a parameter), 2 x parameter bytes and the harness metric.
"""

import argparse
import json

import torch
import transformers

from hf_posenc import POSITION_ENCODINGS
from hf_posenc.pipeline.training.hardware import choose_precision, describe_hardware, keep_freed_memory

from .harness import (
    MODEL_SIZES,
    benchmark_training_steps,
    build_model,
    ratio_table,
    saved_activation_bytes,
    synthetic_batch,
    training_memory_bytes,
)

MIB = 2**20


def memory_breakdown_table(variants: dict, base: dict, lengths, tokens_per_batch: int, baseline: str) -> str:
    rows = [
        "| variant | L | activations excl. parameters | ratio | parameters x2 | harness metric | ratio |",
        "| --- | --- | --- | --- | --- | --- | --- |",
    ]
    for length in lengths:
        measured = {}
        for name, overrides in variants.items():
            model = build_model(base, overrides, "cpu")
            batch = synthetic_batch(model.config, max(1, tokens_per_batch // length), length, "cpu")
            activations = saved_activation_bytes(model, batch, exclude_parameters=True)
            parameters = 2 * sum(p.numel() * p.element_size() for p in model.parameters())
            measured[name] = (activations, parameters, training_memory_bytes(model, None, batch, "cpu", None))
        for name, (activations, parameters, metric) in measured.items():
            base_activations, _, base_metric = measured[baseline]
            rows.append(
                f"| {name} | {length} | {activations / MIB:.1f} MiB | {activations / base_activations:.2f}× | "
                f"{parameters / MIB:.1f} MiB | {metric / MIB:.1f} MiB | {metric / base_metric:.2f}× |"
            )
    return "\n".join(rows)


def parse_variant(text: str) -> tuple[str, dict | None]:
    if text == "marian":
        return text, None  # stock transformers.MarianMTModel
    if text in POSITION_ENCODINGS:
        return text, {"position_encoding": text}
    overrides = {}
    for item in text.split(","):
        if "=" not in item:
            raise SystemExit(
                f'variant {text!r}: expected "marian" (stock MarianMTModel), a position encoding name '
                f"({', '.join(POSITION_ENCODINGS)}) or field=value pairs"
            )
        field, value = item.split("=", 1)
        try:
            overrides[field] = json.loads(value)  # numbers, true/false, lists
        except json.JSONDecodeError:
            overrides[field] = value  # module names and other strings
    return text, overrides


def main():
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--variants", nargs="+", required=True)
    parser.add_argument("--baseline", default="sinusoidal")
    parser.add_argument("--config", choices=sorted(MODEL_SIZES), default="small")
    parser.add_argument("--lengths", nargs="+", type=int, default=[32, 128, 512])
    parser.add_argument("--tokens_per_batch", type=int, default=4096)
    parser.add_argument("--repeats", type=int, default=5)
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--device", default="cpu")
    parser.add_argument(
        "--precision",
        choices=["auto", "bf16", "fp32"],
        default="auto",
        help="auto: bf16 where measured faster on this machine",
    )
    parser.add_argument(
        "--max_positions", type=int, help="max_position_embeddings (default: 1024 or the longest length)"
    )
    parser.add_argument(
        "--memory_breakdown",
        action="store_true",
        help="time nothing; print activations vs parameter memory (CPU, fp32, deterministic)",
    )
    args = parser.parse_args()

    torch.set_num_threads(args.threads)
    memory_reused = keep_freed_memory(args.device)  # train.py's default --cpu_memory reuse
    size = MODEL_SIZES[args.config]
    precision = choose_precision(args.precision, args.device, size["d_model"], size["encoder_ffn_dim"])
    variants = dict(parse_variant(v) for v in [args.baseline, *args.variants])
    base = dict(
        size,
        max_position_embeddings=args.max_positions or max(1024, max(args.lengths)),
        dropout=0.1,
    )
    if args.memory_breakdown:
        print(
            f"<!-- config {args.config}, {args.tokens_per_batch} tokens/batch, fp32, torch {torch.__version__} -->"
        )
        print(memory_breakdown_table(variants, base, args.lengths, args.tokens_per_batch, args.baseline))
        return
    results = benchmark_training_steps(
        variants,
        base,
        lengths=args.lengths,
        tokens_per_batch=args.tokens_per_batch,
        repeats=args.repeats,
        device=args.device,
        autocast_dtype=torch.bfloat16 if precision.precision == "bf16" else None,
    )
    print(
        f"<!-- {describe_hardware(args.device).line()}, {precision.line()}, "
        f"transformers {transformers.__version__}, config {args.config}, {args.tokens_per_batch} tokens/batch, "
        f"L_max {base['max_position_embeddings']}{', freed CPU memory reused' if memory_reused else ''} -->"
    )
    print(ratio_table(results, args.baseline))


if __name__ == "__main__":
    main()
