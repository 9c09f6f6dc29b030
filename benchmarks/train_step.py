"""Training-step throughput and memory of positional modules relative to "sinusoidal", same process.

    python benchmarks/train_step.py --variants shaw t5_bias --lengths 32 128 512 --threads 2

Each variant is `name` (a position encoding for both stacks) or `site=mixer` (a token mixer at a site) or
`field=value,field=value` config overrides. Prints a markdown table of ratios (see hf_posenc.benchmarking).
"""

import argparse
import json
import platform

import torch
import transformers

from hf_posenc import POSITION_ENCODINGS
from hf_posenc.benchmarking import benchmark_training_steps, ratio_table

BASE_CONFIGS = {
    # paper base (d512, 6+6) is too slow for many variants on 2 CPU cores; "small" keeps the ratios meaningful
    "small": dict(
        d_model=256,
        encoder_layers=3,
        decoder_layers=3,
        encoder_attention_heads=4,
        decoder_attention_heads=4,
        encoder_ffn_dim=1024,
        decoder_ffn_dim=1024,
        vocab_size=8000,
    ),
    "base": dict(
        d_model=512,
        encoder_layers=6,
        decoder_layers=6,
        encoder_attention_heads=8,
        decoder_attention_heads=8,
        encoder_ffn_dim=2048,
        decoder_ffn_dim=2048,
        vocab_size=40000,
    ),
    "tiny": dict(
        d_model=32,
        encoder_layers=1,
        decoder_layers=1,
        encoder_attention_heads=4,
        decoder_attention_heads=4,
        encoder_ffn_dim=64,
        decoder_ffn_dim=64,
        vocab_size=100,
    ),
}


def parse_variant(text: str) -> tuple[str, dict]:
    if text in POSITION_ENCODINGS:
        return text, {"position_encoding": text}
    overrides = {}
    for item in text.split(","):
        if "=" not in item:
            raise SystemExit(
                f"variant {text!r}: expected a position encoding name "
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
    parser.add_argument("--config", choices=sorted(BASE_CONFIGS), default="small")
    parser.add_argument("--lengths", nargs="+", type=int, default=[32, 128, 512])
    parser.add_argument("--tokens_per_batch", type=int, default=4096)
    parser.add_argument("--repeats", type=int, default=5)
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--device", default="cpu")
    parser.add_argument("--bf16", action="store_true", help="bf16 autocast")
    args = parser.parse_args()

    torch.set_num_threads(args.threads)
    variants = dict(parse_variant(v) for v in [args.baseline, *args.variants])
    base = dict(BASE_CONFIGS[args.config], max_position_embeddings=max(1024, max(args.lengths)), dropout=0.1)
    results = benchmark_training_steps(
        variants,
        base,
        lengths=args.lengths,
        tokens_per_batch=args.tokens_per_batch,
        repeats=args.repeats,
        device=args.device,
        autocast_dtype=torch.bfloat16 if args.bf16 else None,
    )
    print(
        f"<!-- {platform.processor() or platform.machine()}, {args.threads} threads, torch {torch.__version__}, "
        f"transformers {transformers.__version__}, config {args.config}, {args.tokens_per_batch} tokens/batch -->"
    )
    print(ratio_table(results, args.baseline))


if __name__ == "__main__":
    main()
