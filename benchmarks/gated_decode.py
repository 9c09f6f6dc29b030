"""Decoding throughput of pre-computed rPosNet vs content attention (paper 2 §7.1, Table 4), CPU.

Both models use the same config (`MODEL_SIZES["small"]` of benchmarks.harness unless --base; vocabulary
8000); rPosNet replaces encoder and decoder self-attention, folded with `precompute_position_attention()`.
Every run generates exactly --new_tokens tokens (min = max), so tokens/s compare like with like; ratios are
taken in one process, median of interleaved repeats. benchmarks/run.py measures the same for every registered
module against stock MarianMTModel.

    python -m benchmarks.gated_decode --threads 1
"""

import argparse

import torch

from .harness import (
    MODEL_SIZES,
    build_model,
    generation_run,
    interleaved_median_seconds,
)

MIXERS = dict(encoder_self_attention="rposnet", decoder_self_attention="rposnet")


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--threads", type=int, default=1)
    parser.add_argument("--base", action="store_true", help="paper base size (d512, 6+6) instead of small")
    parser.add_argument("--batch_sizes", nargs="+", type=int, default=[1, 32])
    parser.add_argument("--beams", nargs="+", type=int, default=[1, 4])
    parser.add_argument("--source_length", type=int, default=24)
    parser.add_argument("--new_tokens", type=int, default=24)
    parser.add_argument("--repeats", type=int, default=3)
    args = parser.parse_args()
    torch.set_num_threads(args.threads)
    size = "base" if args.base else "small"
    fields = dict(MODEL_SIZES[size], vocab_size=8000, max_position_embeddings=256)
    models = {
        "attention": build_model(fields, {}, "cpu").eval(),
        "rposnet (pre-computed)": build_model(fields, MIXERS, "cpu", precomputed=True).eval(),
    }
    print(f"<!-- {args.threads} threads, {size}, median of {args.repeats} interleaved repeats -->")
    print("| batch | beams | attention tok/s | rPosNet tok/s | ratio |")
    print("| --- | --- | --- | --- | --- |")
    generator = torch.Generator().manual_seed(0)
    for batch_size in args.batch_sizes:
        source = torch.randint(2, fields["vocab_size"], (batch_size, args.source_length), generator=generator)
        for beams in args.beams:
            work = {
                name: generation_run(model, source, args.new_tokens, beams, "cpu", None)
                for name, model in models.items()
            }
            seconds = interleaved_median_seconds(work, args.repeats, "cpu")
            speeds = [batch_size * args.new_tokens / value for value in seconds.values()]
            print(
                f"| {batch_size} | {beams} | {speeds[0]:.0f} | {speeds[1]:.0f} | {speeds[1] / speeds[0]:.2f} |"
            )


if __name__ == "__main__":
    main()
