"""A tiny real training run that records what each process saw; used by the DDP, resume and loss tests.

    python tests/pipeline/training/trainer_probe.py OUT --max_steps 6 [--update_freq 2] [--save_steps 2] [--resume]
    torchrun --nproc_per_node 2 tests/pipeline/training/trainer_probe.py OUT --max_steps 4

Writes OUT/rank<r>.json: the fingerprint of every batch the process trained on (by global step), the
logged losses, and a checksum of the final parameters.
"""

import argparse
import hashlib
import json
import os
from pathlib import Path

import torch
from transformers import DataCollatorForSeq2Seq, Seq2SeqTrainingArguments

from hf_posenc import MarianPosEncConfig, MarianPosEncForConditionalGeneration  # noqa: E402
from hf_posenc.pipeline.data.files import data_root, read_split  # noqa: E402
from hf_posenc.pipeline.data.tokenization import train_joint_bpe  # noqa: E402
from hf_posenc.pipeline.training.resume import last_complete_checkpoint  # noqa: E402
from hf_posenc.pipeline.training.trainer import TranslationTrainer, leave_process_group, tokenize_parallel  # noqa: E402


class RecordingTrainer(TranslationTrainer):
    """Remembers a fingerprint of every micro-batch it trains on."""

    def __init__(self, *args, **kwargs):
        super().__init__(*args, **kwargs)
        self.seen = []

    def training_step(self, model, inputs, num_items_in_batch=None):
        digest = hashlib.sha1(inputs["input_ids"].cpu().numpy().tobytes()).hexdigest()[:12]
        self.seen.append([self.state.global_step, digest])
        return super().training_step(model, inputs, num_items_in_batch)


def build_trainer(
    output_dir,
    max_steps,
    update_freq=1,
    label_smoothing=0.0,
    save_steps=0,
    learning_rate=1e-3,
    dropout=0.0,
    pairs=400,
    length_buckets=None,
):
    text = read_split(data_root() / "multi30k", "val", "en", "de", limit=pairs)
    tokenizer = train_joint_bpe(text.source + text.target, vocab_size=500)
    dataset = tokenize_parallel(tokenizer, text.source, text.target, max_length=128)
    torch.manual_seed(0)
    config = MarianPosEncConfig(
        vocab_size=len(tokenizer),
        d_model=32,
        encoder_layers=1,
        decoder_layers=1,
        encoder_attention_heads=4,
        decoder_attention_heads=4,
        encoder_ffn_dim=64,
        decoder_ffn_dim=64,
        max_position_embeddings=160,
        dropout=dropout,
    )
    model = MarianPosEncForConditionalGeneration(config)
    args = Seq2SeqTrainingArguments(
        output_dir=str(output_dir),
        max_steps=max_steps,
        learning_rate=learning_rate,
        warmup_steps=0,
        gradient_accumulation_steps=update_freq,
        label_smoothing_factor=label_smoothing,
        logging_steps=1,
        save_strategy="steps" if save_steps else "no",
        save_steps=save_steps or 500,
        report_to=[],
        use_cpu=True,
        seed=5,
        ddp_backend="gloo" if "WORLD_SIZE" in os.environ else None,
        disable_tqdm=True,
    )
    collator = DataCollatorForSeq2Seq(tokenizer, model=model, label_pad_token_id=-100)
    return RecordingTrainer(
        model=model,
        args=args,
        train_dataset=dataset,
        data_collator=collator,
        max_tokens=600,
        length_buckets=length_buckets,
    )


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("out")
    parser.add_argument("--max_steps", type=int, default=4)
    parser.add_argument("--update_freq", type=int, default=1)
    parser.add_argument("--save_steps", type=int, default=0)
    parser.add_argument("--resume", action="store_true")
    args = parser.parse_args()
    torch.set_num_threads(1)
    trainer = build_trainer(
        Path(args.out) / "checkpoints", args.max_steps, args.update_freq, save_steps=args.save_steps
    )
    # as train.py's --resume_from_checkpoint last: the newest complete checkpoint (a kill may cut off a save)
    resume = last_complete_checkpoint(Path(args.out) / "checkpoints") if args.resume else None
    trainer.train(resume_from_checkpoint=resume)
    checksum = sum(float(p.detach().double().sum()) for p in trainer.model.parameters())
    rank = int(os.environ.get("RANK", 0))
    record = {
        "seen": trainer.seen,
        "losses": [entry["loss"] for entry in trainer.state.log_history if "loss" in entry],
        "checksum": checksum,
        "world_size": trainer.args.world_size,
        "global_step": trainer.state.global_step,
    }
    name = f"rank{rank}-resumed.json" if args.resume else f"rank{rank}.json"
    (Path(args.out) / name).write_text(json.dumps(record))
    leave_process_group()


if __name__ == "__main__":
    main()
