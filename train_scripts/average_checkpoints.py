"""Average Trainer checkpoints into a normal model folder.

    python train_scripts/average_checkpoints.py RUN-checkpoints --last 5 --output_dir outputs/avg
    python train_scripts/average_checkpoints.py RUN-checkpoints --best 5 --output_dir outputs/avg

`--last N`: the last N checkpoints (paper 1). `--best N`: the checkpoint with the lowest validation
perplexity and the N-1 after it (paper 2). The folder gets the averaged weights plus the config, model
code, generation config and tokenizer of the newest checkpoint, and nothing else.

The output folder must be new (or empty) unless `--overwrite_output_dir` is given; then it is replaced whole.
It is written beside its final place and renamed into it, so it never holds a mixture of old and new files.
It may not be one of the checkpoints, lie inside the checkpoints folder or hold it. Checkpoints of different
configs or tokenizers are refused. All of this is checked before a tensor is read.
"""

import argparse

from transformers import AutoModelForSeq2SeqLM, AutoTokenizer

import hf_posenc  # noqa: F401  (registers the Auto classes)
from hf_posenc.pipeline.averaging import (
    average_into,
    check_one_model,
    check_output_dir,
    select_checkpoints,
    tokenizer_fingerprint,
    write_whole,
)
from hf_posenc.pipeline.cli import run_cli
from hf_posenc.pipeline.evaluation import check_number


def average_into_folder(checkpoints_dir, output_dir, last=None, best=None, overwrite=False):
    chosen = select_checkpoints(checkpoints_dir, last=last, best=best)
    output = check_output_dir(output_dir, checkpoints_dir, chosen, overwrite=overwrite)
    if not tokenizer_fingerprint(chosen[-1]):
        raise FileNotFoundError(
            f"{chosen[-1]} holds no tokenizer (tokenizer.json): the averaged folder takes the newest "
            "checkpoint's tokenizer"
        )
    check_one_model(chosen)
    model = AutoModelForSeq2SeqLM.from_pretrained(chosen[-1])
    average_into(model, chosen)
    with write_whole(output) as folder:
        model.save_pretrained(folder)
        AutoTokenizer.from_pretrained(chosen[-1]).save_pretrained(folder)
    return chosen


def main(argv=None):
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("checkpoints_dir", help="the folder of checkpoint-<step> folders (RUN-checkpoints)")
    group = parser.add_mutually_exclusive_group(required=True)
    group.add_argument("--last", type=int, help="average the last N checkpoints")
    group.add_argument("--best", type=int, help="the best-perplexity checkpoint and the N-1 after it")
    parser.add_argument("--output_dir", required=True, help="a new folder for the averaged model")
    parser.add_argument(
        "--overwrite_output_dir",
        action="store_true",
        help="replace an --output_dir that already holds files (the whole folder: nothing old stays)",
    )
    args = parser.parse_args(argv)
    flag = "--last" if args.last is not None else "--best"
    try:
        check_number(flag, args.last if args.last is not None else args.best, minimum=1, integer=True)
    except ValueError as error:
        parser.error(str(error))
    chosen = average_into_folder(
        args.checkpoints_dir,
        args.output_dir,
        last=args.last,
        best=args.best,
        overwrite=args.overwrite_output_dir,
    )
    print(f"averaged {', '.join(p.name for p in chosen)} -> {args.output_dir}")


if __name__ == "__main__":
    run_cli(main)
