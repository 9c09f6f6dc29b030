"""The `hf-posenc-evaluate` command (train_scripts/evaluate_translation.py): score a saved model, or a
CTranslate2 export of one, on a test set."""

import argparse
import json
from pathlib import Path

import torch

from ..cli import check_number
from ..data.files import read_lines, read_parallel
from ..export.ctranslate2 import is_ctranslate2_folder, translate_ctranslate2
from ..training.hardware import choose_precision, describe_hardware
from .decoding import load_translation_model, translate
from .scoring import check_aligned, ngram_sweep, paired_bootstrap, plot_ngram_sweep, score_translations

EVALUATE_HELP = """Translate a test set with a saved model and score it; optionally compare against a baseline system.

    hf-posenc-evaluate outputs/run --source test.en.gz --reference test.de.gz
    hf-posenc-evaluate outputs/run --source ... --reference ... \\
        --baseline_hypotheses outputs/baseline/test.hyp.de --ngram_sweep

Decodes with the model's saved generation config (beam 4, length penalty 0.6, source length + 50) unless
--num_beams / --length_penalty are given, in `--precision` (auto: bf16 autocast where a probe measures it
faster than fp32 on this machine, or on a GPU that supports it); `--hypotheses FILE` scores existing
translations instead.
Writes `<model>/evaluation.json` (BLEU, chrF++, signatures; paired bootstrap resampling against the
baseline with paper-1 significance marks; the n-gram sweep of paper 1 Fig. 4) and, with --ngram_sweep,
`<model>/ngram_sweep.png`.

A CTranslate2 folder written by train_scripts/export_ctranslate2.py (it holds model.bin) is scored the same way:
decoded with CTranslate2 on the CPU (`--threads` threads) with the generation config saved in it, in the weight
type it was exported in (--precision must stay auto; docs/export.md).

Every flag, file and folder is checked before decoding: counts (--batch_size, --num_beams, --threads,
--bootstrap_samples) must be at least 1, --length_penalty a finite number; the model folder, the text files
and the folder of --output must exist, and the baseline must have as many lines as the references.
"""


def check_flags(parser, args) -> None:
    """Refuse, through the parser (exit 2), a flag whose value alone is wrong or that cannot apply."""
    counts = ("bootstrap_samples", "num_beams", "batch_size", "threads")
    try:
        for flag in counts:
            if getattr(args, flag) is not None:
                check_number(f"--{flag}", getattr(args, flag), minimum=1, integer=True)
        if args.length_penalty is not None:
            check_number(
                "--length_penalty",
                args.length_penalty,
                hint="allowed: any finite number (> 0 favours longer translations, < 0 shorter); "
                "without the flag, the model's saved value",
            )
    except ValueError as error:
        parser.error(str(error))
    if args.ngram_sweep and not args.baseline_hypotheses:
        parser.error("--ngram_sweep compares two systems: give --baseline_hypotheses")
    given = [f"--{flag}" for flag in ("num_beams", "length_penalty") if getattr(args, flag) is not None]
    if args.hypotheses and given:
        parser.error(
            f"{', '.join(given)} set decoding, but --hypotheses scores translations without decoding"
        )


def evaluate_main(argv=None):
    parser = argparse.ArgumentParser(
        description=EVALUATE_HELP, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("model", help="a model folder written by train.py (or any MarianPosEnc folder)")
    parser.add_argument("--source", required=True)
    parser.add_argument("--reference", required=True)
    parser.add_argument("--hypotheses", default=None, help="score these translations instead of decoding")
    parser.add_argument(
        "--baseline_hypotheses", default=None, help="baseline system for the paired bootstrap"
    )
    parser.add_argument("--bootstrap_samples", type=int, default=1000)
    parser.add_argument("--ngram_sweep", action="store_true", help="paper 1 Fig. 4 (needs a baseline)")
    parser.add_argument("--num_beams", type=int, default=None, help="default: the model's generation config")
    parser.add_argument(
        "--length_penalty",
        type=float,
        default=None,
        help="any finite number (> 0 favours longer translations); default: the model's generation config",
    )
    parser.add_argument("--batch_size", type=int, default=64)
    parser.add_argument(
        "--precision",
        choices=["auto", "bf16", "fp32"],
        default="auto",
        help="decoding precision; auto: bf16 where measured faster than fp32 here",
    )
    parser.add_argument("--threads", type=int, default=None)
    parser.add_argument("--output", default=None, help="JSON path (default <model>/evaluation.json)")
    args = parser.parse_args(argv)
    check_flags(parser, args)
    if args.threads is not None:
        torch.set_num_threads(args.threads)

    model_dir = Path(args.model)
    if not model_dir.is_dir():
        raise FileNotFoundError(f"model folder {model_dir} does not exist")
    exported = is_ctranslate2_folder(model_dir)  # a CTranslate2 export: decoded by CTranslate2
    if exported and args.precision != "auto":
        parser.error(
            f"--precision {args.precision}: {model_dir} is a CTranslate2 export, which decodes in the weight type "
            "it was exported in (export again with --quantization to change it)"
        )
    output = Path(args.output or model_dir / "evaluation.json")
    if not output.parent.is_dir():
        raise FileNotFoundError(f"--output {output}: its folder {output.parent} does not exist")
    if output.is_dir():
        raise IsADirectoryError(f"--output {output} is a folder; give the path of the JSON file to write")
    test = read_parallel(args.source, args.reference)
    if args.baseline_hypotheses:
        baseline = read_lines(args.baseline_hypotheses)
        check_aligned(baseline, test.target, f"--baseline_hypotheses {args.baseline_hypotheses}")
    decoding = {}  # how the hypotheses were decoded, when this script decoded them
    if args.hypotheses:
        hypotheses = read_lines(args.hypotheses)
        check_aligned(hypotheses, test.target, f"--hypotheses {args.hypotheses}")
    elif exported:
        decoding = {"engine": "ctranslate2", "hardware": describe_hardware("cpu").as_dict()}
        hypotheses = translate_ctranslate2(
            model_dir,
            test.source,
            beam_size=args.num_beams,
            length_penalty=args.length_penalty,
            batch_size=args.batch_size,
            threads=args.threads,
        )
        (model_dir / "evaluation.hyp").write_text("\n".join(hypotheses) + "\n")
    else:
        model, tokenizer = load_translation_model(model_dir)
        overrides = {
            k: v
            for k, v in (("num_beams", args.num_beams), ("length_penalty", args.length_penalty))
            if v is not None
        }
        beams = args.num_beams or model.generation_config.num_beams or 1
        precision = choose_precision(
            args.precision,
            model.device,
            model.config.d_model,
            model.config.decoder_ffn_dim,
            args.batch_size * beams,
        )
        print(f"decoding in {precision.line()}")
        decoding = {"precision": precision.as_dict(), "hardware": describe_hardware(model.device).as_dict()}
        hypotheses = translate(
            model,
            tokenizer,
            test.source,
            batch_size=args.batch_size,
            bf16=precision.precision == "bf16",
            **overrides,
        )
        (model_dir / "evaluation.hyp").write_text("\n".join(hypotheses) + "\n")
    report = {"test_set": test.name, "scores": score_translations(hypotheses, test.target), **decoding}
    if args.baseline_hypotheses:
        report["paired_bootstrap"] = paired_bootstrap(
            baseline, hypotheses, test.target, args.bootstrap_samples
        )
        report["baseline"] = args.baseline_hypotheses
    if args.ngram_sweep:
        report["ngram_sweep"] = ngram_sweep(hypotheses, baseline, test.target)
        plot_ngram_sweep(
            report["ngram_sweep"], model_dir / "ngram_sweep.png", title=f"{model_dir.name} − baseline"
        )
    output.write_text(json.dumps(report, indent=2) + "\n")

    scores = report["scores"]
    print(f"BLEU    {scores['bleu']:6.2f}  {scores['bleu_signature']}")
    print(f"chrF++  {scores['chrf++']:6.2f}  {scores['chrf++_signature']}")
    for metric, result in report.get("paired_bootstrap", {}).items():
        print(
            f"{metric}: baseline {result['baseline']} vs system {result['system']}{result['significance']} "
            f"(p = {result['p_value']}, 95% CI ±{result['system_95ci']})"
        )
    print(f"wrote {output}")
    return report
