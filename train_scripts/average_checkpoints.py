"""Average Trainer checkpoints into a normal model folder.

    python train_scripts/average_checkpoints.py RUN-checkpoints --last 5 --output_dir outputs/avg
    python train_scripts/average_checkpoints.py RUN-checkpoints --best 5 --output_dir outputs/avg

`--last N`: the last N checkpoints (paper 1). `--best N`: the checkpoint with the lowest validation
perplexity and the N-1 after it (paper 2). The folder gets the averaged weights plus the config, model
code, generation config and tokenizer of the newest checkpoint.
"""

import argparse

from transformers import AutoModelForSeq2SeqLM, AutoTokenizer

import hf_posenc  # noqa: F401  (registers the Auto classes)
from hf_posenc.pipeline.averaging import average_into, select_checkpoints
from hf_posenc.pipeline.cli import run_cli


def average_into_folder(checkpoints_dir, output_dir, last=None, best=None):
    chosen = select_checkpoints(checkpoints_dir, last=last, best=best)
    model = AutoModelForSeq2SeqLM.from_pretrained(chosen[-1])
    average_into(model, chosen)
    model.save_pretrained(output_dir)
    AutoTokenizer.from_pretrained(chosen[-1]).save_pretrained(output_dir)
    return chosen


def main(argv=None):
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("checkpoints_dir")
    group = parser.add_mutually_exclusive_group(required=True)
    group.add_argument("--last", type=int)
    group.add_argument("--best", type=int)
    parser.add_argument("--output_dir", required=True)
    args = parser.parse_args(argv)
    chosen = average_into_folder(args.checkpoints_dir, args.output_dir, last=args.last, best=args.best)
    print(f"averaged {', '.join(p.name for p in chosen)} -> {args.output_dir}")


if __name__ == "__main__":
    run_cli(main)
