"""Parameter counts of the paper-1 base model (d 512, 6+6 layers, 8 heads, FFN 2048, shared vocabulary) with the
real model classes, compared with paper 1 Table 1 (En-De column, millions).

    python -m benchmarks.posnet_parameter_counts --vocab_size 40000 --max_positions 1024

Models are built on the meta device, so nothing is allocated. Also prints the vocabulary size implied by the
paper's SAPE count and the L_max that reproduces the paper's PosNet counts with that vocabulary.
"""

import argparse

from .harness import MODEL_SIZES, count_parameters

# Row label -> (config overrides, paper Table 1 count in millions). PosNet-Attn is listed with one kernel table
# for all layers of both stacks (the default, the model paper 1 counts) and with a table per layer.
ROWS = {
    "none": ({"position_encoding": "none"}, 63.08),
    "sinusoidal": ({"position_encoding": "sinusoidal"}, 63.08),
    "learned": ({"position_encoding": "learned"}, 64.13),
    "posnet_embed": ({"position_encoding": "posnet_embed"}, 66.49),
    "posnet_attn (one shared table)": ({"position_encoding": "posnet_attn"}, 64.11),
    "posnet_attn (per layer)": (
        {"position_encoding": "posnet_attn", "posnet_attn_share_layers": False},
        64.11,
    ),
}
BASE = MODEL_SIZES["base"]


def count(**fields) -> int:
    return count_parameters(dict(BASE, **fields), {})


def main():
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--vocab_size", type=int, default=40000)
    parser.add_argument("--max_positions", type=int, default=1024)
    args = parser.parse_args()

    print(f"vocab_size={args.vocab_size}, max_position_embeddings={args.max_positions}\n")
    print("| position encoding | ours (M) | paper Table 1 (M) |\n| --- | --- | --- |")
    for label, (overrides, paper) in ROWS.items():
        ours = count(**overrides, vocab_size=args.vocab_size, max_position_embeddings=args.max_positions)
        print(f"| {label} | {ours / 1e6:.2f} | {paper:.2f} |")

    # One more vocabulary entry adds d_model parameters (tied embeddings and LM head).
    without_vocab = count(position_encoding="sinusoidal", vocab_size=2) - 2 * BASE["d_model"]
    implied_vocab = round((ROWS["sinusoidal"][1] * 1e6 - without_vocab) / BASE["d_model"])
    print(f"\nvocabulary implied by the paper's SAPE count: {implied_vocab} (±10 from rounding to 0.01M)")
    for label in ("posnet_embed", "posnet_attn (per layer)", "posnet_attn (one shared table)"):
        overrides, paper = ROWS[label]
        fixed = count(**overrides, vocab_size=implied_vocab, max_position_embeddings=1)
        per_position = count(**overrides, vocab_size=implied_vocab, max_position_embeddings=2) - fixed
        implied = (paper * 1e6 - fixed) / per_position + 1
        # ±0.005M rounding of both Table 1 counts (this row and SAPE, which fixed the vocabulary)
        spread = 0.01e6 / per_position
        print(
            f"{label}: {per_position} parameters per position; L_max implied by the paper's count: "
            f"{implied:.1f} (±{spread:.1f})"
        )


if __name__ == "__main__":
    main()
