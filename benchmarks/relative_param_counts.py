"""Parameter counts of the relative position encodings in paper 1's Transformer base (Table 1).

    python -m benchmarks.relative_param_counts

d_model 512, 6+6 layers, 8 heads, FFN 2048, one 40,000-token vocabulary shared by source, target and the
output layer (paper 1, Sec. 5.1). Counts come from the real model classes; prints a markdown table.
"""

import argparse

from .harness import MODEL_SIZES, meta_model

PAPER_BASE = {field: value for field, value in MODEL_SIZES["base"].items() if field != "vocab_size"}
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
        model = meta_model(dict(PAPER_BASE, vocab_size=args.vocab_size), {"position_encoding": name})
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
