"""A training run, stage by stage: `train_scripts/train.py` is `main` below.

`prepare_data` (read and validate the text, joint BPE or the given model's tokenizer, tokenise) -> `build_model`
(config from what was set, or the `--model_name_or_path` model converted as `pretrained.py` says; precision and
attention backend chosen by measuring this machine, the longest pair tried through the model)
-> `train` (`Seq2SeqTrainer`, token-budget batches, time and update budgets, checkpoints; a resumed run must
have the settings it started with) -> `trained_model` (checkpoint averaging) -> `evaluate` (decoding the test
set with the model's saved generation config, sacreBLEU BLEU and chrF++, a check for degenerate output) ->
`export` (the Hub folder: weights, config + model code, tokenizer, generation config, model card, scores.json,
translations; see `export.py` for how no run is ever lost, and for the upload).

Every setting is checked before any data is read (`arguments.py`); every folder before any work.
`--architecture stock_marian` trains `transformers.MarianMTModel` with the Trainer's own sentence batches on
the same data, budget and evaluation (the baseline of `make train-stock`).
"""

import dataclasses
import json
import logging
import sys
import time
from dataclasses import dataclass
from pathlib import Path

import torch
import transformers
from transformers import DataCollatorForSeq2Seq, MarianMTModel, Seq2SeqTrainingArguments
from transformers.trainer_callback import ProgressCallback

from ...configuration_marian_posenc import MarianPosEncConfig
from ...generation_length import measure_min_length_ratio, sentence_boundary_settings, sentence_end_token_ids
from ...modeling_marian_posenc import (
    MAX_NEW_TOKENS_OVER_SOURCE,
    PAPER_1_DECODING,
    MarianPosEncForConditionalGeneration,
)
from ..cli import run_cli
from ..data.batching import TokenBudgetBatchSampler, describe_padding, padding_report
from ..data.corpus import (
    CorpusSettings,
    CorpusSummary,
    column,
    list_lengths,
    prepare_training_corpus,
    training_source,
)
from ..data.files import ParallelText, read_parallel, read_split
from ..evaluation.decoding import translate
from ..evaluation.scoring import degenerate_output, encoder_token_cosine, score_translations
from ..export.run_folder import check_output_folders, export, set_aside_checkpoints, updates_text
from .arguments import Arguments, model_config, model_fields, parse_args
from .averaging import average_into, list_checkpoints, select_checkpoints
from .fit import check_disk_space, check_longest_pair, check_training_memory, full_disk
from .hardware import (
    busy_share,
    check_compiler,
    choose_attention_backend,
    choose_precision,
    describe_hardware,
    keep_freed_memory,
    matmul_peak_flops,
    model_flops_per_target_token,
    threads_for_free_cores,
)
from .pretrained import check_tokenizer, load_pretrained
from .progress import TrainingProgressCallback, UpdateBudgetCheck
from .resume import check_resume_settings, how_to_resume, resume_checkpoint
from .schedule import BudgetSchedule, SchedulePlan
from .trainer import (
    StopOnInterrupt,
    TimeBudgetCallback,
    TranslationTrainer,
    leave_process_group,
    tokenize_parallel,
    translation_metrics,
)

logger = logging.getLogger("train")


@dataclass
class PreparedData:
    tokenizer: object
    train: object  # datasets.Dataset with input_ids, labels, length, memory-mapped from the corpus cache
    valid: object | None
    test: ParallelText
    train_text: CorpusSummary  # the training data's name and number of examples (the text stays on disk)
    # JSON: training pairs read, kept, skipped by reason (empty, too_long, length_ratio), examples, token counts,
    # longest source and target, cache use (corpus.prepare_training_corpus)
    data_report: dict


def load_split(args: Arguments, split: str, limit=None) -> ParallelText:
    """The validation or test set, whole and unfiltered (empty lines are an error unless --empty_lines skip);
    the training data go through `corpus.prepare_training_corpus`."""
    data = args.data
    source, target = getattr(data, f"{split}_source"), getattr(data, f"{split}_target")
    if (source is None) != (target is None):
        raise ValueError(f"--{split}_source and --{split}_target go together (got {source!r}, {target!r})")
    read = {"empty_lines": data.empty_lines or "error", "limit": limit}
    if source is not None:
        return read_parallel(Path(source), Path(target), **read)
    return read_split(
        Path(data.data_dir),
        getattr(data, f"{split}_split"),
        data.source_lang,
        data.target_lang,
        **read,
    )


def prepare_data(args: Arguments) -> PreparedData:
    """The training examples from the corpus cache (read, BPE-learned, tokenised and filtered on the first run
    on this data: `corpus.py`), the validation set tokenised and the test set read, both unfiltered."""
    data = args.data
    settings = CorpusSettings.from_arguments(data, seed=args.training.seed)
    settings = dataclasses.replace(settings, tokenizer_name_or_path=tokenizer_source(args))
    corpus = prepare_training_corpus(training_source(data), settings)
    test = load_split(args, "test", limit=data.test_limit)
    logger.info(
        "data: %d training examples from %s, %d test pairs from %s",
        len(corpus.examples),
        corpus.summary.name,
        len(test),
        test.name,
    )
    valid = None
    if args.training.eval_strategy != "no":
        valid_text = load_split(args, "valid")
        valid = tokenize_parallel(corpus.tokenizer, valid_text.source, valid_text.target)
    return PreparedData(corpus.tokenizer, corpus.examples, valid, test, corpus.summary, corpus.report)


def tokenizer_source(args: Arguments) -> str | None:
    """--tokenizer_name_or_path, else the tokenizer of --model_name_or_path's model, else None (a BPE is
    learned on the training data)."""
    return args.data.tokenizer_name_or_path or args.model.model_name_or_path


def source_target_length_ratio(dataset) -> float:
    """gamma of paper 2 Eq. 10: total source tokens / total target tokens of the training data (counted from
    the Arrow offsets: no token list is read)."""
    source_tokens = int(list_lengths(dataset, "input_ids").sum())
    target_tokens = int(list_lengths(dataset, "labels").sum())
    return round(source_tokens / target_tokens, 4)


def tokenizer_sentence_ends(args: Arguments, tokenizer) -> list[int] | None:
    """With --sentence_positions, the tokenizer's sentence-end tokens; an error where it has none."""
    if not args.model.sentence_positions:
        return None
    if not (ids := sentence_end_token_ids(tokenizer)):
        raise ValueError(
            "--sentence_positions: the tokenizer has no token that ends a sentence (., !, ? or one ending in them)"
        )
    return ids


def data_config(
    args: Arguments, vocab_size: int, pad: int, eos: int, train, sentence_end_ids: list[int] | None = None
) -> MarianPosEncConfig:
    """`model_config` with what the training data decide: gamma of rPosNet cross-attention (paper 2 Eq. 10,
    the source/target length ratio) unless set, and the tokenizer's sentence ends (`tokenizer_sentence_ends`)."""
    config = model_config(args, vocab_size, pad, eos, sentence_end_ids)
    if config.cross_attention == "rposnet" and "rposnet_length_ratio" not in json.loads(
        args.model.config_overrides
    ):
        config.rposnet_length_ratio = source_target_length_ratio(train)
        logger.info(
            "rPosNet cross-attention: gamma = %.4f (source/target length ratio)", config.rposnet_length_ratio
        )
    return config


def pretrained_model(args: Arguments, data: PreparedData):
    """--model_name_or_path's model with the command line's model settings (`pretrained.load_pretrained`); gamma
    of rPosNet cross-attention from the training data where this run brings that mixer in and leaves it unset."""
    check_tokenizer(data.tokenizer, args.pretrained, tokenizer_source(args))
    fields = model_fields(args, tokenizer_sentence_ends(args, data.tokenizer))
    if fields.get("cross_attention") == "rposnet" and "rposnet_length_ratio" not in fields:
        fields["rposnet_length_ratio"] = source_target_length_ratio(data.train)
    return load_pretrained(args.model.model_name_or_path, fields, args.model.architecture)


def decode_time_settings(args: Arguments, data: PreparedData) -> dict:
    """The generation-config settings of --length_control (r measured on the training examples as tokenized, the
    source's sentence count) and --window_sentences, with the tokenizer's sentence ends and continuation tokens
    (`sentence_boundary_settings`, docs/length.md)."""
    model = args.model
    if not (model.length_control or model.window_sentences):
        return {}
    flags = " and ".join(
        flag
        for flag, on in (
            ("--length_control", model.length_control),
            ("--window_sentences", model.window_sentences),
        )
        if on
    )
    settings = sentence_boundary_settings(data.tokenizer)
    if not settings["sentence_end_token_ids"]:
        raise ValueError(
            f"{flags}: the tokenizer has no token that ends a sentence (., !, ? or one ending in them)"
        )
    if model.window_sentences:
        settings["window_sentences"] = model.window_sentences
    if model.length_control:
        ratio = measure_min_length_ratio(
            list_lengths(data.train, "input_ids"), list_lengths(data.train, "labels")
        )
        logger.info(
            "length control: min_length_ratio = %.3f (5%% quantile of the training pairs' target/source)",
            ratio,
        )
        settings.update(min_length_ratio=ratio, match_source_sentence_count=True)
    return settings


def build_model(args: Arguments, data: PreparedData):
    """The model, with the precision and attention backend this machine runs fastest (or as asked)."""
    tokenizer = data.tokenizer
    torch.manual_seed(args.training.seed)
    pad, eos = tokenizer.pad_token_id, tokenizer.eos_token_id
    if args.model.model_name_or_path:
        model = pretrained_model(args, data)
        config = model.config
        if args.model.architecture == "marian_posenc":
            check_longest_pair(model, data)
    else:
        model, config = new_model(args, data, pad, eos)
    generation = {"num_beams": args.model.num_beams, "length_penalty": args.model.length_penalty}
    model.generation_config.update(
        **{k: v for k, v in generation.items() if v is not None}, **decode_time_settings(args, data)
    )
    device = args.training.device.type
    tokens = min(args.data.max_tokens or 512, 512)
    precision = choose_precision(
        args.run.precision, device, config.d_model, config.encoder_ffn_dim, tokens=tokens
    )
    heads = config.encoder_attention_heads
    backend = choose_attention_backend(
        args.model.attention_backend,
        precision.precision,
        device,
        heads,
        config.d_model // heads,
        tokens=tokens,
    )
    model.set_attn_implementation(backend.backend)
    logger.info(
        "model: %s%s, %.2fM parameters; precision %s (%s); attention %s (%s)",
        type(model).__name__,
        f" from {args.model.model_name_or_path}" if args.model.model_name_or_path else "",
        model.num_parameters() / 1e6,
        precision.precision,
        precision.reason,
        backend.backend,
        backend.reason,
    )
    return model, precision, backend


def new_model(args: Arguments, data: PreparedData, pad: int, eos: int):
    """A model from scratch, with the config the settings give (`data_config`), and that config."""
    ends = tokenizer_sentence_ends(args, data.tokenizer)
    config = data_config(args, len(data.tokenizer), pad, eos, data.train, ends)
    if args.model.architecture == "stock_marian":
        model = MarianMTModel(config.to_marian_config())
        # our models' decoding; Marian has no source + 50 rule, so it may write the longest accepted sentence + 50
        model.generation_config.update(
            **PAPER_1_DECODING,
            bad_words_ids=[[pad]],
            max_new_tokens=args.data.max_length + MAX_NEW_TOKENS_OVER_SOURCE,
        )
    else:
        model = MarianPosEncForConditionalGeneration(config)
        check_longest_pair(model, data)
    return model, config


@dataclass
class TrainingReport:
    steps: int  # the run's updates, earlier attempts included
    minutes: float  # of this attempt, as the rest
    target_tokens: int
    tokens_per_second: float
    budget: dict
    resumed_from: str | None = None  # the checkpoint this attempt continued
    updates_this_attempt: int = 0
    schedule_plan: dict | None = None  # the learning-rate plan for the time budget, where one was made
    # what the Trainer's Accelerator autocast the training step to: "bf16", "fp16" or "no"
    autocast: str = "no"
    memory_reused: bool = False  # --cpu_memory reuse applied (a glibc CPU)
    batch_padding: dict | None = None  # the first epoch's token-budget batches padded (`batch_padding`)
    # under --torch_compile: {"seconds": spent compiling (inside the budget), "compilations": their number}
    compilation: dict | None = None


def trainer_arguments(args: Arguments, precision) -> Seq2SeqTrainingArguments:
    """The Trainer's arguments for this run, its budget logged."""
    # checkpoints go beside the run folder; `export` uploads the finished folder, not the Trainer
    # --eval_bleu scores generated validation translations: the Trainer must generate when it evaluates
    # bf16/fp16 are given here, not set afterwards: __post_init__ turns them into the `mixed_precision` that the
    # Trainer's Accelerator autocasts with (and it accepts bf16 on a CPU only with use_cpu)
    training = dataclasses.replace(
        args.training,
        output_dir=str(args.checkpoints_dir),
        push_to_hub=False,
        hub_token=None,  # kept out of the training_args.bin of every checkpoint; the upload reads args.training
        predict_with_generate=args.training.predict_with_generate or args.run.eval_bleu,
        bf16=precision.precision == "bf16",
        fp16=precision.precision == "fp16",
        use_cpu=args.training.use_cpu or args.training.device.type == "cpu",
    )
    budget = [f"{args.run.minutes} minutes"] if args.run.minutes else []
    budget.append(
        f"{training.max_steps} updates" if training.max_steps > 0 else f"{training.num_train_epochs} epochs"
    )
    logger.info("training budget: %s, whichever ends first", " or ".join(budget))
    return training


def batch_padding(args: Arguments, data: PreparedData, seed: int) -> dict:
    """The first epoch's token-budget batches, logged and returned for scores.json: their number and padded
    positions (`batching.padding_report`), with --length_buckets the positions the buckets add and the distinct
    batch shapes."""
    sampler = TokenBudgetBatchSampler(data.train["length"], args.data.max_tokens, seed=seed)
    buckets = args.length_buckets
    report = padding_report(
        sampler, list_lengths(data.train, "input_ids"), list_lengths(data.train, "labels"), buckets
    )
    logger.info(
        "token-budget batching: %d batches per epoch, %.1f%% padding%s",
        len(sampler),
        100 * sampler.padding_ratio(),
        f"; {describe_padding(report, buckets)}" if buckets else "",
    )
    return {"length_buckets": buckets, "batches": len(sampler), **report}


def token_budget_batches(args: Arguments) -> bool:
    """Whether the run trains on token-budget batches: `--max_tokens` given, for a MarianPosEnc model (the stock
    baseline trains on the Trainer's own batches of per_device_train_batch_size sentences)."""
    return args.data.max_tokens is not None and args.model.architecture == "marian_posenc"


def build_trainer(args: Arguments, model, data: PreparedData, training, precision):
    """(the Trainer with token-budget batches and the budget's callbacks, the learning-rate plan or None, the
    budget check or None)."""
    max_tokens = args.data.max_tokens if token_budget_batches(args) else None
    time_budget = TimeBudgetCallback(args.run.minutes) if args.run.minutes else None
    plan = SchedulePlan(max(1, round(training.warmup_steps))) if args.planned_schedule else None
    if plan is not None:
        logger.info(
            "learning rate: planned for the %g-minute budget once the speed is measured", args.run.minutes
        )
    trainer = TranslationTrainer(
        model=model,
        args=training,
        train_dataset=data.train if max_tokens else data.train.remove_columns(["length"]),
        eval_dataset=data.valid,
        data_collator=DataCollatorForSeq2Seq(data.tokenizer, model=model, label_pad_token_id=-100),
        processing_class=data.tokenizer,
        callbacks=[time_budget] if time_budget else [],
        compute_metrics=translation_metrics(data.tokenizer) if args.run.eval_bleu else None,
        max_tokens=max_tokens,
        length_buckets=args.length_buckets,
        lr_plan=plan,
    )
    if plan is not None:  # after the time budget's callback, whose clock it reads
        schedule = BudgetSchedule(
            plan,
            args.run.minutes,
            lambda: time_budget.spent_seconds,
            compile_seconds=trainer.compile_clock,
        )
        trainer.add_callback(schedule)
    trainer.remove_callback(ProgressCallback)
    trainer.add_callback(TrainingProgressCallback(lambda: trainer.target_tokens, args.run.minutes or None))
    check = None
    if args.run.minutes:
        # a run that must not end degenerate stops when its budget is too short to learn, instead of spending it
        # (one process: processes that measured apart could disagree, and one would wait for the other)
        stop = args.run.fail_on_degenerate and training.world_size == 1
        check = UpdateBudgetCheck(
            args.run.minutes,
            precision.precision,
            describe_hardware(training.device),
            stop=stop,
            compile_seconds=trainer.compile_clock,
        )
        trainer.add_callback(check)
    return trainer, plan, check


def train(args: Arguments, model, data: PreparedData, precision) -> tuple[TranslationTrainer, TrainingReport]:
    """`Seq2SeqTrainer` run with token-budget batches, the time budget, progress and a budget check."""
    resume = resume_checkpoint(args)
    padding = batch_padding(args, data, args.training.seed) if token_budget_batches(args) else None
    check_training_memory(args, model, data, padding)  # before anything is written or set aside
    check_disk_space(args, model)
    if args.training.process_index == 0:
        if args.run.overwrite_output_dir and resume is None:
            set_aside_checkpoints(args.checkpoints_dir)
        check_resume_settings(args, model, resume)
    training = trainer_arguments(args, precision)
    trainer, plan, check = build_trainer(args, model, data, training, precision)
    first_step = json.loads((Path(resume) / "trainer_state.json").read_text())["global_step"] if resume else 0
    memory_reused = args.run.cpu_memory == "reuse" and keep_freed_memory(training.device)
    if memory_reused:
        logger.info(
            "CPU memory: freed tensors stay in the process for the next update (--cpu_memory release: off)"
        )
    started = time.monotonic()
    if resume and 0 < training.max_steps <= first_step:  # the Trainer would make one update past the budget
        logger.info(
            "%s holds the whole budget of %d updates: loading it, no further update", resume, first_step
        )
        average_into(trainer.model, [Path(resume)])
        steps = first_step
    else:
        steps = run_updates(trainer, resume, args)
    seconds = time.monotonic() - started
    report = TrainingReport(
        steps,
        seconds / 60,
        trainer.target_tokens,
        trainer.target_tokens / seconds,
        check.estimate if check else None,
        resume and Path(resume).name,
        steps - first_step,
        plan.as_dict() if plan is not None else None,
        trainer.accelerator.mixed_precision if trainer.accelerator.native_amp else "no",
        memory_reused,
        padding,
        compilation_summary(trainer.compile_clock),
    )
    return trainer, report


def run_updates(trainer: TranslationTrainer, resume: str | None, args: Arguments) -> int:
    """The Trainer's updates (the step it ends at). Ctrl-C stops training after the update under way, with a
    checkpoint there (`StopOnInterrupt`; one process only), and ends in one line saying how the run goes on; so
    does a GPU running out of memory (the CPU's memory is checked before, `check_training_memory`) and a disk that
    filled up (`full_disk`)."""
    stop = StopOnInterrupt()
    if args.training.world_size == 1:
        trainer.add_callback(stop)
    try:
        steps = trainer.train(resume_from_checkpoint=resume).global_step
    except torch.OutOfMemoryError:
        raise ValueError(
            f"training ran out of {args.training.device} memory: lower --max_tokens (or the batch sizes); "
            + how_to_resume(args.checkpoints_dir, args.training)
        ) from None
    except KeyboardInterrupt:  # a second Ctrl-C, or one in a process of several
        steps, stop.interrupted = trainer.state.global_step, True
    except Exception:
        full = full_disk(args, trainer.model)
        if full is None:
            raise
        raise ValueError(f"{full}; " + how_to_resume(args.checkpoints_dir, args.training)) from None
    finally:
        stop.restore()
    if stop.interrupted:
        raise KeyboardInterrupt(
            f"training stopped at update {steps}; " + how_to_resume(args.checkpoints_dir, args.training)
        )
    return steps


def compilation_summary(clock) -> dict | None:
    """Under --torch_compile, the seconds spent compiling and the number of compilations, logged."""
    if clock is None:
        return None
    logger.info(
        "torch.compile: %d compilations took %.0f s of the training time", clock.compilations, clock.seconds
    )
    return {"seconds": round(clock.seconds, 1), "compilations": clock.compilations}


@dataclass
class Evaluation:
    hypotheses: list[str]
    scores: dict
    decode_seconds: float
    averaged: list[str]
    degenerate: list[str]


def trained_model(args: Arguments, trainer: TranslationTrainer):
    """The trained weights, reloaded from what every process saved (under FSDP/DeepSpeed the Trainer gathers
    the shards there), averaged over checkpoints if asked. Returns None on every process but the first."""
    trained_dir = args.checkpoints_dir / "trained"
    trainer.save_model(str(trained_dir))
    if not trainer.is_world_process_zero():
        return None, []
    model = type(trainer.model).from_pretrained(trained_dir).to(args.training.device)
    asked = args.run.average_last or args.run.average_best
    if not asked:
        return model, []
    available = len(list_checkpoints(args.checkpoints_dir)) if args.checkpoints_dir.is_dir() else 0
    if available < asked:  # a time budget can end before the checkpoints asked for exist
        logger.warning(
            "asked to average %d checkpoints, %d exist: %s",
            asked,
            available,
            f"averaging those {available}" if available else "evaluating the final weights",
        )
        if not available:
            return model, []
    wanted = min(asked, available)
    chosen = select_checkpoints(
        args.checkpoints_dir,
        last=wanted if args.run.average_last else None,
        best=wanted if args.run.average_best else None,
    )
    average_into(model, chosen)
    return model, [path.name for path in chosen]


def evaluate(
    args: Arguments, model, data: PreparedData, precision, report, averaged: list[str]
) -> Evaluation:
    """Decode the test set with the model's generation config and score it; flag degenerate output."""
    started = time.monotonic()
    hypotheses = translate(
        model,
        data.tokenizer,
        data.test.source,
        bf16=precision.precision == "bf16",
        progress_bar=not args.training.disable_tqdm,
    )
    seconds = time.monotonic() - started
    scores = score_translations(hypotheses, data.test.target)
    encoding = getattr(
        model.config, "encoder_position_encoding", MarianPosEncConfig().encoder_position_encoding
    )
    degenerate = degenerate_output(
        hypotheses,
        scores["bleu"],
        encoding,
        updates=report.steps,
        warmup_steps=args.training.warmup_steps,
        precision=precision.precision,
        device=args.training.device.type,
        encoder_cosine=encoder_token_cosine(model, data.tokenizer, data.test.source),
    )
    for reason in degenerate:
        logger.warning("DEGENERATE OUTPUT: %s", reason)
    return Evaluation(hypotheses, scores, seconds, averaged, degenerate)


def run_record(
    args: Arguments, model, data, precision, backend, report: TrainingReport, evaluation, started
) -> dict:
    """scores.json: the scores, the run's settings, the machine and what it achieved."""
    hardware = describe_hardware(args.training.device.type)
    dtype = torch.bfloat16 if precision.precision == "bf16" else None
    mean_length = max(1, round(float(column(data.train, "length").mean())))
    flops_per_token = model_flops_per_target_token(
        model, mean_length, mean_length, 8, args.training.device, dtype
    )
    peak = matmul_peak_flops(precision.precision, args.training.device.type)
    return {
        **evaluation.scores,
        "recipe": args.run.recipe,
        "steps": report.steps,
        "train_minutes": round(report.minutes, 2),
        "resumed_from": report.resumed_from,
        "updates_this_attempt": report.updates_this_attempt,
        "decode_seconds": round(evaluation.decode_seconds, 1),
        "total_minutes": round((time.monotonic() - started) / 60, 2),
        "parameters": model.num_parameters(),
        "architecture": args.model.architecture,
        "averaged_checkpoints": evaluation.averaged,
        "data": data.data_report,
        "test_set": data.test.name,
        "test_pairs": len(data.test),
        "degenerate": evaluation.degenerate,
        "hardware": {**hardware.as_dict(), "line": hardware.line()},
        "transformers_version": transformers.__version__,
        "precision": precision.precision,
        "training_autocast": report.autocast,
        "precision_probe": precision.as_dict(),
        "attention_backend": backend.backend,
        "attention_probe": backend.as_dict(),
        "torch_compile": args.training.torch_compile,
        "compilation": report.compilation,
        "cpu_memory_reused": report.memory_reused,
        "batch_padding": report.batch_padding,
        "training_target_tokens": report.target_tokens,
        "training_target_tokens_per_second": round(report.tokens_per_second, 1),
        "model_flops_per_target_token": flops_per_token,
        "matmul_peak_flops": peak,
        "mfu": round(flops_per_token * report.tokens_per_second / peak, 4),
        "budget_check": report.budget,
        "schedule_plan": report.schedule_plan,
    }


def print_summary(
    args: Arguments, data: PreparedData, evaluation: Evaluation, record: dict, output_dir: Path
) -> None:
    scores = evaluation.scores
    print(f"\nBLEU    {scores['bleu']:6.2f}  {scores['bleu_signature']}")
    print(f"chrF++  {scores['chrf++']:6.2f}  {scores['chrf++_signature']}")
    print(
        f"{updates_text(record)}, decoding {record['decode_seconds']:.0f} s, total {record['total_minutes']:.1f} min"
    )
    speed = record["model_flops_per_target_token"] * record["training_target_tokens_per_second"] / 1e9
    print(
        f"{record['hardware']['line']}; precision {record['precision']}, attention {record['attention_backend']}"
        f"{', torch.compile' if record['torch_compile'] else ''}"
        f"{', freed memory reused' if record['cpu_memory_reused'] else ''}; "
        f"{record['training_target_tokens_per_second']:.0f} target tokens/s = {speed:.1f} GFLOP/s, "
        f"MFU {100 * record['mfu']:.1f}% of the measured {record['matmul_peak_flops'] / 1e9:.0f} GFLOP/s peak"
    )
    examples = zip(data.test.source, evaluation.hypotheses, data.test.target, strict=True)
    for source, hypothesis, reference in list(examples)[: args.run.examples]:
        print(f"\n  src: {source}\n  hyp: {hypothesis}\n  ref: {reference}")
    print(f"\nwrote {output_dir}")


def set_threads(args: Arguments) -> None:
    """--threads, or for one process on the CPU one thread per core that the machine's other work leaves free."""
    if args.run.threads:
        torch.set_num_threads(args.run.threads)
        return
    if args.training.device.type != "cpu" or args.training.world_size > 1:
        return
    cores, busy = torch.get_num_threads(), busy_share()
    threads = threads_for_free_cores(cores, busy)
    if threads < cores:
        logger.info(
            "threads: %d of %d, as other work takes %.0f%% of this machine's CPU time (--threads N sets them)",
            threads,
            cores,
            100 * busy,
        )
    torch.set_num_threads(threads)


def main(argv=None) -> dict | None:
    args = parse_args(argv)
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(name)s: %(message)s")
    started = time.monotonic()
    set_threads(args)
    check_output_folders(
        Path(args.training.output_dir),
        args.checkpoints_dir,
        resume=bool(args.training.resume_from_checkpoint),
        overwrite=args.run.overwrite_output_dir,
        dry_run=args.run.hub_dry_run,
    )
    training = args.training
    check_compiler(training.torch_compile, training.torch_compile_backend, training.device)
    data = prepare_data(args)
    model, precision, backend = build_model(args, data)
    trainer, report = train(args, model, data, precision)
    if report.budget and report.budget.get("stopped_at") is not None:
        budget = report.budget
        raise SystemExit(
            f"stopped after {budget['stopped_at']} updates: at {budget['seconds_per_update']} s per update the "
            f"{budget['budget_minutes']:g}-minute budget allows about {budget['updates_allowed_by_budget']} updates, "
            f"fewer than the {budget['min_updates']} a translation model needs. Fixes: "
            + "; ".join(budget["fixes"])
            + " (--fail_on_degenerate false trains anyway)"
        )
    model, averaged = trained_model(args, trainer)
    leave_process_group()  # the processes need each other no more; the first one evaluates alone
    if model is None:
        return None  # one process evaluates and writes the folder
    evaluation = evaluate(args, model, data, precision, report, averaged)
    record = run_record(args, model, data, precision, backend, report, evaluation, started)
    output_dir = export(args, model, data, evaluation, record)
    print_summary(args, data, evaluation, record, output_dir)
    if evaluation.degenerate and args.run.fail_on_degenerate:
        print("\nDEGENERATE OUTPUT (exit 3): " + " ".join(evaluation.degenerate), file=sys.stderr)
        raise SystemExit(3)
    return record


if __name__ == "__main__":  # python -m hf_posenc.pipeline.training.run: how the study starts a run
    run_cli(main)
