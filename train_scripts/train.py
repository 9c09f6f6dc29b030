"""Train and evaluate a translation model, and write a Hub-ready folder.

    python train_scripts/train.py                                   # multi30k-en-de-small, sinusoidal
    python train_scripts/train.py --recipe wmt14-en-de-base --position_encoding learned
    python train_scripts/train.py --recipe multi30k-en-de-tiny --encoder_self_attention attention --minutes 2

A recipe (`train_scripts/recipes/<name>.yaml`) sets defaults for any flag below; flags on the command line
win. Steps: read and validate the data (local text files or a `datasets` translation set) -> joint BPE ->
model -> `Seq2SeqTrainer` (token-budget batches, inverse-sqrt schedule, label smoothing; checkpoints and
validation perplexity when asked) for a step and/or wall-clock budget -> optional checkpoint averaging ->
beam-4 decoding of the test set -> sacreBLEU BLEU and chrF++ -> folder with safetensors weights, config +
model code (`auto_map`), tokenizer, generation config, model card, scores.json and the translations ->
optional push to the Hub (or a dry run writing exactly the uploaded folder).

`--architecture stock_marian` trains `transformers.MarianMTModel` the standard way (plain
`Seq2SeqTrainer`, a fixed number of sentences per batch, fp32) on the same data, budget and evaluation.
"""

import argparse
import importlib.util
import json
import logging
import shutil
import time
from pathlib import Path

import torch
import yaml
from transformers import (
    DataCollatorForSeq2Seq,
    MarianConfig,
    MarianMTModel,
    Seq2SeqTrainer,
    Seq2SeqTrainingArguments,
)

from hf_posenc import (
    POSITION_ENCODINGS,
    TOKEN_MIXERS,
    MarianPosEncConfig,
    MarianPosEncForConditionalGeneration,
)
from hf_posenc.pipeline.averaging import average_state_dicts, select_checkpoints
from hf_posenc.pipeline.batching import TokenBudgetBatchSampler
from hf_posenc.pipeline.data import ParallelText, read_hf_translation, read_parallel, read_split
from hf_posenc.pipeline.evaluation import score_translations, translate
from hf_posenc.pipeline.model_card import MULTI30K_NOTE, write_model_card
from hf_posenc.pipeline.tokenization import train_joint_bpe
from hf_posenc.pipeline.training import TimeBudgetCallback, TokenBudgetSeq2SeqTrainer, tokenize_parallel

logger = logging.getLogger("train")
REPO = Path(__file__).resolve().parents[1]
RECIPES = REPO / "train_scripts" / "recipes"
LOCAL_METRIC = REPO / "train_scripts" / "metrics" / "translation_scores"
DEFAULT_RECIPE = "multi30k-en-de-small"


def recipe_names() -> list[str]:
    return sorted(path.stem for path in RECIPES.glob("*.yaml"))


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--recipe", default=DEFAULT_RECIPE, help=f"one of: {', '.join(recipe_names())}")

    data = parser.add_argument_group("data (explicit files > hf_dataset > data_dir splits)")
    data.add_argument("--data_dir", default=str(REPO.parent / "shared" / "data" / "multi30k"))
    data.add_argument("--source_lang", default="en")
    data.add_argument("--target_lang", default="de")
    data.add_argument("--train_split", default="train")
    data.add_argument("--valid_split", default="val")
    data.add_argument("--test_split", default="test_2016_flickr")
    for split in ("train", "valid", "test"):
        data.add_argument(f"--{split}_source", default=None, help=f"{split} source file (plain or .gz)")
        data.add_argument(f"--{split}_target", default=None, help=f"{split} target file (plain or .gz)")
    data.add_argument("--hf_dataset", default=None, help="training data from `datasets` (e.g. wmt14)")
    data.add_argument("--hf_config", default=None, help="its configuration (e.g. de-en)")
    data.add_argument("--empty_lines", choices=["error", "skip"], default="error")
    data.add_argument("--train_limit", type=int, default=None, help="use only the first N training pairs")
    data.add_argument("--test_limit", type=int, default=None, help="evaluate only the first N test pairs")
    data.add_argument("--vocab_size", type=int, default=8000)

    model = parser.add_argument_group("model")
    model.add_argument("--architecture", choices=["marian_posenc", "stock_marian"], default="marian_posenc")
    model.add_argument("--position_encoding", choices=sorted(POSITION_ENCODINGS), default=None,
                       help="both stacks (shorthand); default sinusoidal")  # fmt: skip
    model.add_argument("--encoder_position_encoding", choices=sorted(POSITION_ENCODINGS), default=None)
    model.add_argument("--decoder_position_encoding", choices=sorted(POSITION_ENCODINGS), default=None)
    for site in ("encoder_self_attention", "decoder_self_attention", "cross_attention"):
        model.add_argument(f"--{site}", choices=sorted(TOKEN_MIXERS), default="attention")
    model.add_argument("--config_overrides", default="{}", help="JSON of further MarianPosEncConfig fields")
    model.add_argument("--d_model", type=int, default=256)
    model.add_argument("--layers", type=int, default=3, help="encoder and decoder layers each")
    model.add_argument("--heads", type=int, default=4)
    model.add_argument("--ffn_dim", type=int, default=1024)
    model.add_argument("--dropout", type=float, default=0.1)
    model.add_argument("--max_length", type=int, default=128, help="longest tokenised sentence accepted")

    train = parser.add_argument_group("training")
    train.add_argument("--minutes", type=float, default=16.0, help="wall-clock training budget (0: none)")
    train.add_argument(
        "--max_steps", type=int, default=1_000_000, help="update budget (whichever ends first)"
    )
    train.add_argument("--max_tokens", type=int, default=6000, help="padded tokens per batch (marian_posenc)")
    train.add_argument("--update_freq", type=int, default=1, help="batches accumulated per update")
    train.add_argument("--batch_size", type=int, default=64, help="sentences per batch (stock_marian)")
    train.add_argument("--learning_rate", type=float, default=2e-3)
    train.add_argument("--warmup_steps", type=int, default=300)
    train.add_argument("--label_smoothing", type=float, default=0.1)
    train.add_argument("--precision", choices=["bf16", "fp16", "fp32"], default=None,
                       help="default: bf16 autocast for marian_posenc, fp32 for stock_marian")  # fmt: skip
    train.add_argument("--save_steps", type=int, default=0, help="checkpoint every N updates (0: none)")
    train.add_argument("--eval_steps", type=int, default=0, help="validation perplexity every N updates")
    train.add_argument(
        "--eval_bleu", action="store_true", help="also decode the validation set (greedy) and score it"
    )
    train.add_argument("--average_last", type=int, default=0, help="average the last N checkpoints")
    train.add_argument(
        "--average_best", type=int, default=0, help="average the best-perplexity one + followers"
    )
    train.add_argument("--resume_from_checkpoint", default=None, help="a checkpoint folder, or 'last'")
    train.add_argument("--attention_backend", choices=["auto", "eager", "sdpa"], default="auto",
                       help="auto: eager for bf16 on CPU (measured ~20%% faster: SDPA's CPU backward is slow), "
                       "else sdpa; stock_marian keeps transformers' default")  # fmt: skip
    train.add_argument("--threads", type=int, default=None, help="torch CPU threads (default: all cores)")
    train.add_argument("--seed", type=int, default=1)
    train.add_argument("--report_to", default="auto", help="'auto': tensorboard/trackio when installed")

    output = parser.add_argument_group("output")
    output.add_argument("--output_dir", default=None, help="default outputs/<recipe>-<module>")
    output.add_argument("--examples", type=int, default=5, help="example translations to print")
    output.add_argument("--push_to_hub", action="store_true")
    output.add_argument("--hub_model_id", default=None)
    output.add_argument("--hub_dry_run", default=None, help="write the folder that would be uploaded here")
    parser.add_argument("--description", default="", help=argparse.SUPPRESS)
    return parser


def parse_args(argv=None) -> argparse.Namespace:
    """Command line over recipe over built-in defaults; unknown recipes and recipe keys are errors."""
    parser = build_parser()
    recipe_name = parser.parse_known_args(argv)[0].recipe
    path = RECIPES / f"{recipe_name}.yaml"
    if not path.is_file():
        parser.error(f"unknown recipe {recipe_name!r}; available: {', '.join(recipe_names())}")
    recipe = yaml.safe_load(path.read_text()) or {}
    known = {action.dest for action in parser._actions}
    unknown = sorted(set(recipe) - known)
    if unknown:
        parser.error(f"recipe {recipe_name} has unknown keys {unknown}; allowed: {', '.join(sorted(known))}")
    parser.set_defaults(**recipe)
    args = parser.parse_args(argv)
    if args.push_to_hub and not args.hub_model_id:
        parser.error("--push_to_hub needs --hub_model_id")
    if args.average_last and args.average_best:
        parser.error("choose one of --average_last and --average_best")
    if (args.average_last or args.average_best) and not args.save_steps:
        parser.error("checkpoint averaging needs checkpoints: set --save_steps")
    if args.eval_bleu and not args.eval_steps:
        parser.error("--eval_bleu scores the validation set at --eval_steps: set it")
    if args.average_best and args.eval_steps != args.save_steps:
        parser.error(
            "--average_best needs the validation perplexity at every checkpoint: --eval_steps = --save_steps"
        )
    return args


def repo_path(path: str) -> Path:
    """Recipe paths are relative to the repository root (where ../shared lives)."""
    path = Path(path)
    return path if path.is_absolute() else REPO / path


def load_split(args, split: str, limit=None) -> ParallelText:
    source, target = getattr(args, f"{split}_source"), getattr(args, f"{split}_target")
    if (source is None) != (target is None):
        raise ValueError(f"--{split}_source and --{split}_target go together (got {source!r}, {target!r})")
    if source is not None:
        return read_parallel(repo_path(source), repo_path(target), empty_lines=args.empty_lines, limit=limit)
    if split == "train" and args.hf_dataset:
        return read_hf_translation(args.hf_dataset, args.hf_config, "train", args.source_lang, args.target_lang,
                                   empty_lines=args.empty_lines, limit=limit)  # fmt: skip
    return read_split(repo_path(args.data_dir), getattr(args, f"{split}_split"), args.source_lang, args.target_lang,
                      empty_lines=args.empty_lines, limit=limit)  # fmt: skip


def attention_backend(args, precision: str) -> str | None:
    if args.attention_backend != "auto":
        return args.attention_backend
    if args.architecture == "stock_marian":
        return None
    return "eager" if precision == "bf16" and not torch.cuda.is_available() else "sdpa"


def build_model(args, tokenizer, backend: str | None, train_dataset=None):
    dims = dict(
        vocab_size=len(tokenizer),
        d_model=args.d_model,
        encoder_layers=args.layers,
        decoder_layers=args.layers,
        encoder_attention_heads=args.heads,
        decoder_attention_heads=args.heads,
        encoder_ffn_dim=args.ffn_dim,
        decoder_ffn_dim=args.ffn_dim,
        dropout=args.dropout,
        max_position_embeddings=max(args.max_length + 64, 256),
        scale_embedding=True,
        activation_function="relu",
        pad_token_id=tokenizer.pad_token_id,
        decoder_start_token_id=tokenizer.pad_token_id,
        eos_token_id=tokenizer.eos_token_id,
        forced_eos_token_id=tokenizer.eos_token_id,
    )
    if backend is not None:
        dims["attn_implementation"] = backend
    torch.manual_seed(args.seed)
    if args.architecture == "stock_marian":
        return MarianMTModel(MarianConfig(**dims))
    choices = {
        "encoder_position_encoding": args.encoder_position_encoding or args.position_encoding or "sinusoidal",
        "decoder_position_encoding": args.decoder_position_encoding or args.position_encoding or "sinusoidal",
        "encoder_self_attention": args.encoder_self_attention,
        "decoder_self_attention": args.decoder_self_attention,
        "cross_attention": args.cross_attention,
    }
    overrides = json.loads(args.config_overrides)
    if args.cross_attention == "rposnet" and "rposnet_length_ratio" not in overrides:
        if train_dataset is None:
            raise ValueError(
                "rPosNet in cross-attention needs the training data (for gamma) or rposnet_length_ratio"
            )
        overrides["rposnet_length_ratio"] = source_target_length_ratio(train_dataset)
        logger.info(
            "rPosNet cross-attention: gamma = %.4f (source/target length ratio)",
            overrides["rposnet_length_ratio"],
        )
    config = MarianPosEncConfig(**dims, **choices, **overrides)
    return MarianPosEncForConditionalGeneration(config)


def source_target_length_ratio(dataset) -> float:
    """gamma of paper 2 Eq. 10: total source tokens / total target tokens of the training data."""
    source_tokens = sum(len(ids) for ids in dataset["input_ids"])
    target_tokens = sum(len(ids) for ids in dataset["labels"])
    return round(source_tokens / target_tokens, 4)


def translation_metrics(tokenizer):
    """`compute_metrics` for the Trainer: BLEU and chrF++ through the local `evaluate` metric module."""
    import evaluate
    import numpy as np

    metric = evaluate.load(str(LOCAL_METRIC))

    def compute_metrics(prediction):
        predictions = np.where(prediction.predictions >= 0, prediction.predictions, tokenizer.pad_token_id)
        labels = np.where(prediction.label_ids >= 0, prediction.label_ids, tokenizer.pad_token_id)
        scores = metric.compute(
            predictions=tokenizer.batch_decode(predictions, skip_special_tokens=True),
            references=tokenizer.batch_decode(labels, skip_special_tokens=True),
        )
        return {"bleu": scores["bleu"], "chrf++": scores["chrf++"]}

    return compute_metrics


def installed_loggers() -> list[str]:
    return [name for name in ("tensorboard", "trackio") if importlib.util.find_spec(name) is not None]


def average_into(model, checkpoints_dir, args) -> list[str]:
    """Load the average of the chosen checkpoints into `model` (tied weights re-tied)."""
    chosen = select_checkpoints(
        checkpoints_dir, last=args.average_last or None, best=args.average_best or None
    )
    missing, unexpected = model.load_state_dict(average_state_dicts(chosen), strict=False)
    if unexpected or set(missing) - set(model._tied_weights_keys or {}):
        raise ValueError(
            f"averaged checkpoints do not fit the model: missing {missing}, unexpected {unexpected}"
        )
    model.tie_weights()
    return [path.name for path in chosen]


def main(argv=None):
    args = parse_args(argv)
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(name)s: %(message)s")
    started = time.monotonic()
    if args.threads:
        torch.set_num_threads(args.threads)
    precision = args.precision or ("bf16" if args.architecture == "marian_posenc" else "fp32")
    module_name = args.position_encoding or args.encoder_position_encoding or "sinusoidal"
    if args.architecture == "stock_marian":
        module_name = "stock-marian"
    output_dir = Path(args.output_dir or f"outputs/{args.recipe}-{module_name}")
    checkpoints_dir = output_dir.with_name(output_dir.name + "-checkpoints")

    train_text = load_split(args, "train", limit=args.train_limit)
    test_text = load_split(args, "test", limit=args.test_limit)
    logger.info("data: %d training pairs from %s, %d test pairs from %s", len(train_text), train_text.name,
                len(test_text), test_text.name)  # fmt: skip

    tokenizer = train_joint_bpe(train_text.source + train_text.target, vocab_size=args.vocab_size)
    train_dataset = tokenize_parallel(tokenizer, train_text.source, train_text.target, args.max_length)
    valid_dataset = None
    if args.eval_steps:
        valid_text = load_split(args, "valid")
        valid_dataset = tokenize_parallel(tokenizer, valid_text.source, valid_text.target, args.max_length)
    model = build_model(args, tokenizer, attention_backend(args, precision), train_dataset)
    parameters = sum(p.numel() for p in model.parameters())
    logger.info(
        "model: %s, %.2fM parameters, precision %s, attention %s",
        type(model).__name__,
        parameters / 1e6,
        precision,
        model.config._attn_implementation,
    )
    if args.architecture == "marian_posenc":
        sampler = TokenBudgetBatchSampler(train_dataset["length"], args.max_tokens, seed=args.seed)
        logger.info("token-budget batching: %d batches per epoch, %.1f%% padding", len(sampler),
                    100 * sampler.padding_ratio())  # fmt: skip

    training_args = Seq2SeqTrainingArguments(
        output_dir=str(checkpoints_dir),
        max_steps=args.max_steps,
        learning_rate=args.learning_rate,
        lr_scheduler_type="inverse_sqrt",
        warmup_steps=args.warmup_steps,
        adam_beta2=0.98,
        adam_epsilon=1e-9,
        weight_decay=0.0,
        label_smoothing_factor=args.label_smoothing,
        per_device_train_batch_size=args.batch_size,
        per_device_eval_batch_size=64,
        gradient_accumulation_steps=args.update_freq,
        bf16=precision == "bf16",
        fp16=precision == "fp16",
        use_cpu=not torch.cuda.is_available(),
        save_strategy="steps" if args.save_steps else "no",
        save_steps=args.save_steps or 500,
        save_only_model=False,
        eval_strategy="steps" if args.eval_steps else "no",
        eval_steps=args.eval_steps or None,
        predict_with_generate=args.eval_bleu,
        generation_num_beams=1,
        generation_max_length=args.max_length + 50,
        logging_steps=50,
        report_to=installed_loggers() if args.report_to == "auto" else args.report_to,
        seed=args.seed,
        dataloader_num_workers=0,
    )
    collator = DataCollatorForSeq2Seq(tokenizer, model=model, label_pad_token_id=-100)
    trainer_kwargs = dict(
        model=model,
        args=training_args,
        train_dataset=train_dataset,
        eval_dataset=valid_dataset,
        data_collator=collator,
        processing_class=tokenizer,
        callbacks=[TimeBudgetCallback(args.minutes)] if args.minutes else [],
        compute_metrics=translation_metrics(tokenizer) if args.eval_bleu else None,
    )
    if args.architecture == "stock_marian":
        trainer = Seq2SeqTrainer(**trainer_kwargs)
    else:
        trainer = TokenBudgetSeq2SeqTrainer(**trainer_kwargs, max_tokens=args.max_tokens)
    resume = args.resume_from_checkpoint
    train_started = time.monotonic()
    train_result = trainer.train(resume_from_checkpoint=True if resume == "last" else resume)
    train_minutes = (time.monotonic() - train_started) / 60
    steps = train_result.global_step
    # Every process takes part in writing the trained weights: under FSDP (full state dict) and DeepSpeed the
    # Trainer gathers the sharded parameters here. Process 0 then reloads the whole model from that folder and
    # evaluates it, the same way on one process, under DDP and under sharding.
    trained_dir = checkpoints_dir / "trained"
    trainer.save_model(str(trained_dir))
    if not trainer.is_world_process_zero():
        return None  # one process evaluates and writes the folder
    model = type(model).from_pretrained(trained_dir).to(training_args.device)
    averaged = average_into(model, checkpoints_dir, args) if args.average_last or args.average_best else []

    decode_started = time.monotonic()
    hypotheses = translate(
        model, tokenizer, test_text.source, bf16=precision == "bf16",
        num_beams=4, length_penalty=0.6, max_new_tokens=args.max_length + 50, bad_words_ids=[[tokenizer.pad_token_id]],
    )  # fmt: skip
    decode_seconds = time.monotonic() - decode_started
    scores = score_translations(hypotheses, test_text.target)
    scores.update(
        recipe=args.recipe,
        steps=steps,
        train_minutes=round(train_minutes, 2),
        decode_seconds=round(decode_seconds, 1),
        total_minutes=round((time.monotonic() - started) / 60, 2),
        parameters=parameters,
        architecture=args.architecture,
        precision=precision,
        attention_backend=model.config._attn_implementation,
        threads=torch.get_num_threads(),
        averaged_checkpoints=averaged,
        test_set=test_text.name,
        test_pairs=len(test_text),
    )

    model.save_pretrained(output_dir)
    tokenizer.save_pretrained(output_dir)
    (output_dir / "scores.json").write_text(json.dumps(scores, indent=2) + "\n")
    (output_dir / f"test.hyp.{args.target_lang}").write_text("\n".join(hypotheses) + "\n")
    batching = (
        f"{args.max_tokens} tokens"
        if args.architecture == "marian_posenc"
        else f"{args.batch_size} sentences"
    )
    write_model_card(
        output_dir,
        model.config,
        scores,
        source_lang=args.source_lang,
        target_lang=args.target_lang,
        parameters=f"{parameters / 1e6:.2f}M",
        repo_or_folder=args.hub_model_id or str(output_dir),
        dataset=args.hf_dataset or repo_path(args.data_dir).name,
        test_split=Path(test_text.name.split(" / ")[0]).name,
        data_note=MULTI30K_NOTE
        if "multi30k" in args.recipe and not args.train_source
        else f"Training data: {train_text.name} ({len(train_text)} pairs). Test: {test_text.name}.",
        training=(
            f"recipe `{args.recipe}`: {steps} updates in {train_minutes:.1f} min, {precision}, {batching} per batch"
            f" x {args.update_freq}, lr {args.learning_rate} inverse-sqrt (warm-up {args.warmup_steps}), "
            f"label smoothing {args.label_smoothing}"
            + (f", average of {', '.join(averaged)}" if averaged else "")
        ),
    )
    if args.hub_dry_run:
        shutil.copytree(output_dir, args.hub_dry_run, dirs_exist_ok=True)
    if args.push_to_hub:
        from huggingface_hub import HfApi

        api = HfApi()
        api.create_repo(args.hub_model_id, exist_ok=True)
        api.upload_folder(
            repo_id=args.hub_model_id, folder_path=str(output_dir), commit_message="hf_posenc training run"
        )

    print(f"\nBLEU    {scores['bleu']:6.2f}  {scores['bleu_signature']}")
    print(f"chrF++  {scores['chrf++']:6.2f}  {scores['chrf++_signature']}")
    print(f"{steps} updates, training {train_minutes:.1f} min, decoding {decode_seconds:.0f} s, "
          f"total {scores['total_minutes']:.1f} min")  # fmt: skip
    for source, hypothesis, reference in list(
        zip(test_text.source, hypotheses, test_text.target, strict=True)
    )[: args.examples]:
        print(f"\n  src: {source}\n  hyp: {hypothesis}\n  ref: {reference}")
    print(f"\nwrote {output_dir}")
    return scores


if __name__ == "__main__":
    main()
