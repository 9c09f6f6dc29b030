"""The `hf-posenc-evaluate` command (train_scripts/evaluate_translation.py): score a saved model, or a
CTranslate2 export of one, on a test set."""

import argparse
import json
from pathlib import Path

import torch

from ...generation_length import NEEDS_SENTENCE_ENDS, sentence_boundary_settings
from ..cli import check_number
from ..data.files import read_lines, read_parallel
from ..export.ctranslate2 import is_ctranslate2_folder, translate_ctranslate2
from ..training.hardware import (
    PrecisionChoice,
    add_cpu_memory_flag,
    choose_precision,
    describe_hardware,
    keep_freed_memory,
)
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

A model decoded by torch on the CPU keeps freed memory in the process (--cpu_memory reuse, as train.py: no page
faults on the vocabulary-sized tensors of every step; 1.2x transformers' generate and up to 1.2x the fast loop,
docs/decoding.md).

--int8 decodes with every linear layer of the model made int8 (weights per output channel, inputs per row at each
call; torch on the CPU, every module; docs/decoding.md, "int8 decoding in torch"). Measured (1,000 sentences, beam
4, one thread, a CPU with AVX512-VNNI): 0.04-0.14 BLEU below float32, 1.4-2.0x the float32 speed (2.7-3.7x
transformers' generate in the same process); where torch's int8 product is slower than float32
(AVX2 without VNNI: 51-93x as long), --int8 is refused with both measured times. The rest of the model stays
float32, so --precision bf16 is refused with it, and a CTranslate2 export (which has its own int8) refuses it.

A CTranslate2 folder written by train_scripts/export_ctranslate2.py (it holds model.bin) is scored the same way:
decoded with CTranslate2 on the CPU (`--threads` threads) with the generation config saved in it, in the weight
type it was exported in (--precision must stay auto; docs/export.md).

--min_length_ratio, --word_reward, --match_source_sentence_count, --no_repeat_ngram_size and --window_sentences
override the saved decode-time length control (docs/length.md, "Length control at decode time"); a CTranslate2
export refuses the word reward, the sentence count and windows by name.

Every flag, file and folder is checked before decoding: counts (--batch_size, --num_beams, --threads,
--bootstrap_samples) must be at least 1, --length_penalty a finite number; the model folder, the text files
and the folder of --output must exist, and the baseline must have as many lines as the references. A batch
whose decoding steps' scores alone (--batch_size x --num_beams x the vocabulary x 8 bytes) exceed the memory
available is refused before it is decoded (docs/training.md, Decoding).
"""


# Flags of the decode-time length control (generation_length.py's keys): unset, the saved value applies.
LENGTH_CONTROL_FLAGS = (
    "min_length_ratio",
    "word_reward",
    "match_source_sentence_count",
    "no_repeat_ngram_size",
    "window_sentences",
)


def add_length_control_flags(parser) -> None:
    group = parser.add_argument_group(
        "length control at decode time (docs/length.md); without a flag, the model's generation config"
    )
    group.add_argument(
        "--min_length_ratio", type=float, default=None, help="R >= 0: no </s> before ceil(R x source tokens)"
    )
    group.add_argument(
        "--word_reward",
        type=float,
        default=None,
        help="added to every non-</s> log-probability (< 0 shortens)",
    )
    group.add_argument(
        "--match_source_sentence_count",
        choices=["true", "false"],
        default=None,
        help="true: no </s> before the translation holds as many sentence ends as its source (the tokenizer's "
        "sentence-end tokens where the model saved none)",
    )
    group.add_argument(
        "--no_repeat_ngram_size", type=int, default=None, help="the loop guard: no n-gram twice (0: off)"
    )
    group.add_argument(
        "--window_sentences",
        type=int,
        default=None,
        help="N >= 1: translate each source in windows of N sentences, joined (1: sentence by sentence)",
    )


def length_control_flags(args) -> dict:
    """The length-control flags given, as `generate` takes them."""
    given = {flag: getattr(args, flag) for flag in LENGTH_CONTROL_FLAGS if getattr(args, flag) is not None}
    if "match_source_sentence_count" in given:
        given["match_source_sentence_count"] = given["match_source_sentence_count"] == "true"
    return given


def check_length_control_flags(args) -> None:
    if args.min_length_ratio is not None:
        check_number(
            "--min_length_ratio", args.min_length_ratio, minimum=0, hint="a multiple of the source length"
        )
    if args.word_reward is not None:
        check_number("--word_reward", args.word_reward)
    if args.no_repeat_ngram_size is not None:
        check_number("--no_repeat_ngram_size", args.no_repeat_ngram_size, minimum=0, integer=True)
    if args.window_sentences is not None:
        check_number("--window_sentences", args.window_sentences, minimum=1, integer=True)


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
        check_length_control_flags(args)
    except ValueError as error:
        parser.error(str(error))
    if args.int8 and args.precision == "bf16":
        parser.error(
            "--int8 with --precision bf16: int8 layers compute in float32 around them; allowed with --int8: "
            "--precision auto or fp32"
        )
    if args.ngram_sweep and not args.baseline_hypotheses:
        parser.error("--ngram_sweep compares two systems: give --baseline_hypotheses")
    decoding_flags = ("num_beams", "length_penalty", *LENGTH_CONTROL_FLAGS)
    given = [f"--{flag}" for flag in decoding_flags if getattr(args, flag) is not None]
    given += ["--int8"] if args.int8 else []
    if args.hypotheses and given:
        parser.error(
            f"{', '.join(given)} set decoding, but --hypotheses scores translations without decoding"
        )


def evaluate_parser() -> argparse.ArgumentParser:
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
    parser.add_argument(
        "--int8",
        action="store_true",
        help="decode with int8 linear layers (torch, CPU, float32 elsewhere; docs/decoding.md)",
    )
    add_cpu_memory_flag(parser)
    add_length_control_flags(parser)
    parser.add_argument("--output", default=None, help="JSON path (default <model>/evaluation.json)")
    return parser


def check_paths(parser, args) -> tuple[Path, bool, Path]:
    """The model folder, whether it is a CTranslate2 export, and the JSON file to write; refuse a missing
    folder, a precision an export cannot decode in, and an output path that cannot be written."""
    model_dir = Path(args.model)
    if not model_dir.is_dir():
        raise FileNotFoundError(f"model folder {model_dir} does not exist")
    exported = is_ctranslate2_folder(model_dir)  # a CTranslate2 export: decoded by CTranslate2
    if exported and args.int8:
        parser.error(
            f"--int8: {model_dir} is a CTranslate2 export, which decodes in the weight type it was exported in "
            "(export with --quantization int8 for CTranslate2's int8)"
        )
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
    return model_dir, exported, output


def read_baseline(args, references: list[str]) -> list[str] | None:
    if not args.baseline_hypotheses:
        return None
    baseline = read_lines(args.baseline_hypotheses)
    check_aligned(baseline, references, f"--baseline_hypotheses {args.baseline_hypotheses}")
    return baseline


def decode_with_ctranslate2(args, model_dir: Path, sources: list[str]) -> tuple[list[str], dict]:
    """The export's translations on the CPU, and how they were decoded."""
    decoding = {"engine": "ctranslate2", "hardware": describe_hardware("cpu").as_dict()}
    hypotheses = translate_ctranslate2(
        model_dir,
        sources,
        beam_size=args.num_beams,
        length_penalty=args.length_penalty,
        length_control=length_control_flags(args),
        batch_size=args.batch_size,
        threads=args.threads,
    )
    return hypotheses, decoding


def sentence_ends_for_the_count(overrides: dict, model, tokenizer) -> dict:
    """`--match_source_sentence_count true` or `--window_sentences` on a model that saved no sentence-end ids
    (neither its generation config nor its config, trained without --length_control or --sentence_positions): the
    tokenizer's sentence ends and continuation tokens, as train.py derives them (`sentence_boundary_settings`);
    else nothing. An error where the tokenizer has no sentence-end token."""
    saved = getattr(model.generation_config, "sentence_end_token_ids", None)
    saved = saved or getattr(model.config, "sentence_end_token_ids", None)
    flags = [
        f"--{flag} {str(overrides[flag]).lower()}" for flag in NEEDS_SENTENCE_ENDS if overrides.get(flag)
    ]
    if not flags or saved:
        return {}
    settings = sentence_boundary_settings(tokenizer)
    if not settings["sentence_end_token_ids"]:
        raise ValueError(
            f"{', '.join(flags)}: the tokenizer has no token that ends a sentence (., !, ? or one ending in them) "
            "to cut at"
        )
    return settings


def decoding_precision(args, model) -> PrecisionChoice:
    """--precision for this model: float32 with --int8 (its layers compute in float32 around them; no probe),
    else `choose_precision`'s."""
    if args.int8:
        return PrecisionChoice(args.precision, "fp32", "int8 linear layers compute in float32 around them")
    beams = args.num_beams or model.generation_config.num_beams or 1
    return choose_precision(
        args.precision,
        model.device,
        model.config.d_model,
        model.config.decoder_ffn_dim,
        args.batch_size * beams,
    )


def decode_with_model(args, model_dir: Path, sources: list[str]) -> tuple[list[str], dict]:
    """The model's translations in the chosen precision (float32 around int8 layers with --int8), and how they were
    decoded."""
    model, tokenizer = load_translation_model(model_dir, int8=args.int8)
    overrides = {
        k: v
        for k, v in (("num_beams", args.num_beams), ("length_penalty", args.length_penalty))
        if v is not None
    }
    overrides.update(length_control_flags(args))
    overrides.update(sentence_ends_for_the_count(overrides, model, tokenizer))
    precision = decoding_precision(args, model)
    # int8 lets an example's beams share its cross-attention keys (not token-identical; docs/decoding.md)
    shared = bool(getattr(model.generation_config, "shared_cross_attention", False))
    shared_words = ", the beams sharing the cross-attention keys" if shared else ""
    print(f"decoding in {precision.line()}" + (", int8 linear layers" if args.int8 else "") + shared_words)
    decoding = {"precision": precision.as_dict(), "hardware": describe_hardware(model.device).as_dict()}
    decoding["int8"], decoding["shared_cross_attention"] = args.int8, shared
    decoding["cpu_memory_reused"] = args.cpu_memory == "reuse" and keep_freed_memory(model.device)
    hypotheses = translate(
        model,
        tokenizer,
        sources,
        batch_size=args.batch_size,
        bf16=precision.precision == "bf16",
        **overrides,
    )
    return hypotheses, decoding


def hypotheses_to_score(args, model_dir: Path, exported: bool, test) -> tuple[list[str], dict]:
    """The translations to score (read from --hypotheses, or decoded and written to `<model>/evaluation.hyp`),
    and how they were decoded ({} when read)."""
    if args.hypotheses:
        hypotheses = read_lines(args.hypotheses)
        check_aligned(hypotheses, test.target, f"--hypotheses {args.hypotheses}")
        return hypotheses, {}
    decode = decode_with_ctranslate2 if exported else decode_with_model
    hypotheses, decoding = decode(args, model_dir, test.source)
    (model_dir / "evaluation.hyp").write_text("\n".join(hypotheses) + "\n")
    return hypotheses, decoding


def score_report(args, model_dir: Path, test, hypotheses: list[str], baseline, decoding: dict) -> dict:
    """Scores, the paired bootstrap against the baseline and the n-gram sweep (its plot written beside the
    model), with how the hypotheses were decoded."""
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
    return report


def print_report(report: dict, output: Path) -> None:
    scores = report["scores"]
    print(f"BLEU    {scores['bleu']:6.2f}  {scores['bleu_signature']}")
    print(f"chrF++  {scores['chrf++']:6.2f}  {scores['chrf++_signature']}")
    for metric, result in report.get("paired_bootstrap", {}).items():
        print(
            f"{metric}: baseline {result['baseline']} vs system {result['system']}{result['significance']} "
            f"(p = {result['p_value']}, 95% CI ±{result['system_95ci']})"
        )
    print(f"wrote {output}")


def evaluate_main(argv=None):
    parser = evaluate_parser()
    args = parser.parse_args(argv)
    check_flags(parser, args)
    if args.threads is not None:
        torch.set_num_threads(args.threads)
    model_dir, exported, output = check_paths(parser, args)
    test = read_parallel(args.source, args.reference)
    baseline = read_baseline(args, test.target)
    hypotheses, decoding = hypotheses_to_score(args, model_dir, exported, test)
    report = score_report(args, model_dir, test, hypotheses, baseline, decoding)
    output.write_text(json.dumps(report, indent=2) + "\n")
    print_report(report, output)
    return report
