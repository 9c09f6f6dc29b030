"""Parameter counts of the relative position encodings in paper 1's Transformer base (Table 1).

    python benchmarks/relative_param_counts.py

d_model 512, 6+6 layers, 8 heads, FFN 2048, one 40,000-token vocabulary shared by source, target and the
output layer (paper 1, Sec. 5.1). Counts come from the real model classes; prints a markdown table.
"""

import argparse

from hf_posenc import MarianPosEncConfig, MarianPosEncForConditionalGeneration

PAPER_BASE = dict(
    d_model=512,
    encoder_layers=6,
    decoder_layers=6,
    encoder_attention_heads=8,
    decoder_attention_heads=8,
    encoder_ffn_dim=2048,
    decoder_ffn_dim=2048,
)
# paper 1, Table 1 (millions)
PAPER_COUNTS = {"sinusoidal": 63.08, "shaw": 63.37, "adaptive_t5": 63.08}


def main():
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--vocab_size", type=int, default=40000)
    parser.add_argument(
        "--variants", nargs="+", default=["sinusoidal", "shaw", "t5_bias", "adaptive_t5", "alibi", "rope"]
    )
    args = parser.parse_args()
    rows = [
        "| position encoding | parameters | of which positional | paper 1 Table 1 |",
        "| --- | --- | --- | --- |",
    ]
    for name in args.variants:
        config = MarianPosEncConfig(vocab_size=args.vocab_size, position_encoding=name, **PAPER_BASE)
        model = MarianPosEncForConditionalGeneration(config)
        total = sum(p.numel() for p in model.parameters())
        positional = sum(
            p.numel()
            for stack in (model.model.encoder, model.model.decoder)
            for p in stack.position_encoding.parameters()
        )
        paper = f"{PAPER_COUNTS[name]:.2f}M" if name in PAPER_COUNTS else "-"
        rows.append(f"| {name} | {total / 1e6:.2f}M ({total:,}) | {positional:,} | {paper} |")
    print(f"<!-- vocabulary {args.vocab_size}, shared; {PAPER_BASE} -->")
    print("\n".join(rows))


if __name__ == "__main__":
    main()
