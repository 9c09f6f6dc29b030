"""Train and evaluate a translation model on local parallel text, and write a Hub-ready folder.

    python train_scripts/train.py --position_encoding learned --minutes 16 --output_dir outputs/my-model

Steps: read and validate the splits -> joint BPE -> model -> `Seq2SeqTrainer` (token-budget batches, bf16
autocast, inverse-sqrt schedule, label smoothing) for a wall-clock or step budget -> beam-4 decoding of the
test split -> sacreBLEU BLEU and chrF++ -> folder with safetensors weights, config + model code
(`auto_map`), tokenizer, generation config, model card, scores.json and the test translations.

`--architecture stock_marian` trains `transformers.MarianMTModel` the standard way (plain
`Seq2SeqTrainer`, fixed sentences per batch, fp32) on the same data, budget and evaluation: the baseline
the default recipe is compared against in the README.
"""

import argparse
import json
import logging
import time
from pathlib import Path

import torch
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
from hf_posenc.data import read_split
from hf_posenc.model_card import write_model_card
from hf_posenc.tokenization import train_joint_bpe
from hf_posenc.training import (
    TimeBudgetCallback,
    TokenBudgetSeq2SeqTrainer,
    score_translations,
    tokenize_parallel,
    translate,
)

logger = logging.getLogger("train")
REPO = Path(__file__).resolve().parents[1]


def parse_args(argv=None):
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    data = parser.add_argument_group("data")
    data.add_argument("--data_dir", default=str(REPO.parent / "shared" / "data" / "multi30k"))
    data.add_argument("--source_lang", default="en")
    data.add_argument("--target_lang", default="de")
    data.add_argument("--train_split", default="train")
    data.add_argument("--test_split", default="test_2016_flickr")
    data.add_argument("--train_limit", type=int, default=None, help="use only the first N training pairs")
    data.add_argument("--test_limit", type=int, default=None, help="evaluate only the first N test pairs")
    data.add_argument("--vocab_size", type=int, default=8000)

    model = parser.add_argument_group("model")
    model.add_argument("--architecture", choices=["marian_posenc", "stock_marian"], default="marian_posenc")
    model.add_argument(
        "--position_encoding",
        choices=sorted(POSITION_ENCODINGS),
        default=None,
        help="both stacks (shorthand); default sinusoidal",
    )
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
    train.add_argument("--minutes", type=float, default=16.0, help="wall-clock training budget")
    train.add_argument("--max_steps", type=int, default=1_000_000, help="step budget (whichever ends first)")
    train.add_argument("--max_tokens", type=int, default=6000, help="padded tokens per batch (marian_posenc)")
    train.add_argument("--batch_size", type=int, default=64, help="sentences per batch (stock_marian)")
    train.add_argument("--learning_rate", type=float, default=2e-3)
    train.add_argument("--warmup_steps", type=int, default=300)
    train.add_argument("--label_smoothing", type=float, default=0.1)
    train.add_argument(
        "--precision",
        choices=["bf16", "fp32"],
        default=None,
        help="default: bf16 autocast for marian_posenc, fp32 for stock_marian",
    )
    train.add_argument("--threads", type=int, default=None, help="torch CPU threads (default: all cores)")
    train.add_argument("--seed", type=int, default=1)
    parser.add_argument("--output_dir", default=None, help="default outputs/multi30k-<src>-<tgt>-<module>")
    parser.add_argument("--examples", type=int, default=5, help="example translations to print")
    return parser.parse_args(argv)


def build_model(args, tokenizer):
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
    config = MarianPosEncConfig(**dims, **choices, **json.loads(args.config_overrides))
    return MarianPosEncForConditionalGeneration(config)


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
    output_dir = Path(
        args.output_dir or f"outputs/multi30k-{args.source_lang}-{args.target_lang}-{module_name}"
    )

    train_text = read_split(
        args.data_dir, args.train_split, args.source_lang, args.target_lang, limit=args.train_limit
    )
    test_text = read_split(
        args.data_dir, args.test_split, args.source_lang, args.target_lang, limit=args.test_limit
    )
    logger.info(
        "data: %d training pairs from %s, %d test pairs", len(train_text), train_text.name, len(test_text)
    )

    tokenizer = train_joint_bpe(train_text.source + train_text.target, vocab_size=args.vocab_size)
    train_dataset = tokenize_parallel(tokenizer, train_text.source, train_text.target, args.max_length)
    model = build_model(args, tokenizer)
    parameters = sum(p.numel() for p in model.parameters())
    logger.info(
        "model: %s, %.2fM parameters, precision %s", type(model).__name__, parameters / 1e6, precision
    )

    training_args = Seq2SeqTrainingArguments(
        output_dir=str(output_dir.with_name(output_dir.name + "-checkpoints")),
        max_steps=args.max_steps,
        learning_rate=args.learning_rate,
        lr_scheduler_type="inverse_sqrt",
        warmup_steps=args.warmup_steps,
        adam_beta2=0.98,
        weight_decay=0.0,
        label_smoothing_factor=args.label_smoothing,
        per_device_train_batch_size=args.batch_size,
        bf16=precision == "bf16",
        use_cpu=not torch.cuda.is_available(),
        save_strategy="no",
        logging_steps=50,
        report_to="none",
        seed=args.seed,
        dataloader_num_workers=0,
    )
    collator = DataCollatorForSeq2Seq(tokenizer, model=model, label_pad_token_id=-100)
    trainer_kwargs = dict(
        model=model,
        args=training_args,
        train_dataset=train_dataset,
        data_collator=collator,
        processing_class=tokenizer,
        callbacks=[TimeBudgetCallback(args.minutes)],
    )
    if args.architecture == "stock_marian":
        trainer = Seq2SeqTrainer(**trainer_kwargs)
    else:
        trainer = TokenBudgetSeq2SeqTrainer(**trainer_kwargs, max_tokens=args.max_tokens)
    train_started = time.monotonic()
    train_result = trainer.train()
    train_minutes = (time.monotonic() - train_started) / 60
    steps = train_result.global_step

    decode_started = time.monotonic()
    hypotheses = translate(
        model,
        tokenizer,
        test_text.source,
        bf16=precision == "bf16",
        num_beams=4,
        length_penalty=0.6,
        max_new_tokens=args.max_length + 50,
        bad_words_ids=[[tokenizer.pad_token_id]],
    )
    decode_seconds = time.monotonic() - decode_started
    scores = score_translations(hypotheses, test_text.target)
    scores.update(
        steps=steps,
        train_minutes=round(train_minutes, 2),
        decode_seconds=round(decode_seconds, 1),
        total_minutes=round((time.monotonic() - started) / 60, 2),
        parameters=parameters,
        architecture=args.architecture,
        precision=precision,
        threads=torch.get_num_threads(),
        test_split=args.test_split,
        test_pairs=len(test_text),
    )

    model.save_pretrained(output_dir)
    tokenizer.save_pretrained(output_dir)
    (output_dir / "scores.json").write_text(json.dumps(scores, indent=2) + "\n")
    (output_dir / f"{args.test_split}.hyp.{args.target_lang}").write_text("\n".join(hypotheses) + "\n")
    write_model_card(
        output_dir,
        model.config,
        scores,
        source_lang=args.source_lang,
        target_lang=args.target_lang,
        parameters=f"{parameters / 1e6:.2f}M",
        training=(
            f"{steps} steps in {train_minutes:.1f} min on {torch.get_num_threads()} CPU threads, {precision}, "
            f"lr {args.learning_rate} inverse-sqrt (warm-up {args.warmup_steps}), label smoothing {args.label_smoothing}, "
            + (
                f"{args.max_tokens} tokens per batch"
                if args.architecture == "marian_posenc"
                else f"{args.batch_size} sentences per batch"
            )
        ),
    )

    print(f"\nBLEU    {scores['bleu']:6.2f}  {scores['bleu_signature']}")
    print(f"chrF++  {scores['chrf++']:6.2f}  {scores['chrf++_signature']}")
    print(
        f"{steps} steps, training {train_minutes:.1f} min, decoding {decode_seconds:.0f} s, total {scores['total_minutes']:.1f} min"
    )
    for source, hypothesis, reference in list(
        zip(test_text.source, hypotheses, test_text.target, strict=True)
    )[: args.examples]:
        print(f"\n  src: {source}\n  hyp: {hypothesis}\n  ref: {reference}")
    print(f"\nwrote {output_dir}")
    return scores


if __name__ == "__main__":
    main()
