"""Decoding throughput of pre-computed rPosNet vs content attention (paper 2 §7.1, Table 4), CPU.

Both models use the same config ("small" of train_step.py unless --base); rPosNet replaces encoder and decoder
self-attention and is folded with `precompute_position_attention()`. Every run generates exactly
--new-tokens tokens (min = max), so tokens/s compare like with like; ratios are taken in one process.

    python benchmarks/gated_decode.py --threads 1
"""

import argparse
import time

import torch

from hf_posenc import MarianPosEncConfig, MarianPosEncForConditionalGeneration

SMALL = dict(
    d_model=256,
    encoder_layers=3,
    decoder_layers=3,
    encoder_attention_heads=4,
    decoder_attention_heads=4,
    encoder_ffn_dim=1024,
    decoder_ffn_dim=1024,
    vocab_size=8000,
    max_position_embeddings=256,
)
BASE = dict(SMALL, d_model=512, encoder_layers=6, decoder_layers=6, encoder_attention_heads=8)
BASE.update(decoder_attention_heads=8, encoder_ffn_dim=2048, decoder_ffn_dim=2048)


def build(fields: dict, rposnet: bool):
    mixers = dict(encoder_self_attention="rposnet", decoder_self_attention="rposnet") if rposnet else {}
    torch.manual_seed(0)
    model = MarianPosEncForConditionalGeneration(MarianPosEncConfig(**fields, **mixers)).eval()
    if rposnet:
        model.precompute_position_attention()
    return model


def tokens_per_second(model, batch_size: int, beams: int, source_length: int, new_tokens: int, repeats: int):
    generator = torch.Generator().manual_seed(0)
    source = torch.randint(2, model.config.vocab_size, (batch_size, source_length), generator=generator)
    kwargs = dict(num_beams=beams, do_sample=False, max_new_tokens=new_tokens, min_new_tokens=new_tokens)
    model.generate(source, **kwargs)  # warm-up
    best = float("inf")
    for _ in range(repeats):
        start = time.perf_counter()
        model.generate(source, **kwargs)
        best = min(best, time.perf_counter() - start)
    return batch_size * new_tokens / best


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--threads", type=int, default=1)
    parser.add_argument("--base", action="store_true", help="paper base size (d512, 6+6) instead of small")
    parser.add_argument("--batch-sizes", nargs="+", type=int, default=[1, 32])
    parser.add_argument("--beams", nargs="+", type=int, default=[1, 4])
    parser.add_argument("--source-length", type=int, default=24)
    parser.add_argument("--new-tokens", type=int, default=24)
    parser.add_argument("--repeats", type=int, default=3)
    args = parser.parse_args()
    torch.set_num_threads(args.threads)
    fields = BASE if args.base else SMALL
    models = {"attention": build(fields, False), "rposnet (pre-computed)": build(fields, True)}
    print(f"<!-- {args.threads} threads, {'base' if args.base else 'small'}, best of {args.repeats} -->")
    print("| batch | beams | attention tok/s | rPosNet tok/s | ratio |")
    print("| --- | --- | --- | --- | --- |")
    with torch.inference_mode():
        for batch_size in args.batch_sizes:
            for beams in args.beams:
                speeds = [
                    tokens_per_second(m, batch_size, beams, args.source_length, args.new_tokens, args.repeats)
                    for m in models.values()
                ]
                print(
                    f"| {batch_size} | {beams} | {speeds[0]:.0f} | {speeds[1]:.0f} | {speeds[1] / speeds[0]:.2f} |"
                )


if __name__ == "__main__":
    main()
