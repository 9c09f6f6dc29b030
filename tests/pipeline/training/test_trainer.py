"""The training pipeline around Seq2SeqTrainer: recipes, data adapters, loss correctness, checkpoint
averaging, evaluation and significance, multi-process training and resuming after a real kill."""

import json
import os
import random
import signal
import subprocess
import sys
import time
import warnings
from pathlib import Path

import datasets
import pytest
import torch
from conftest import REPO, tiny_model
from safetensors.torch import load_file
from trainer_probe import build_trainer  # noqa: E402

from hf_posenc.pipeline.data.files import parallel_from_translation_dataset, read_lines  # noqa: E402
from hf_posenc.pipeline.evaluation.command import evaluate_main
from hf_posenc.pipeline.evaluation.scoring import ngram_sweep, paired_bootstrap, plot_ngram_sweep  # noqa: E402
from hf_posenc.pipeline.training import arguments, run
from hf_posenc.pipeline.training.averaging import average_main, average_state_dicts, select_checkpoints  # noqa: E402

PROBE = REPO / "tests" / "trainer_probe.py"


@pytest.mark.parametrize("recipe", arguments.recipe_names())
def test_every_recipe_parses_into_valid_arguments(recipe):
    args = arguments.parse_args(["--recipe", recipe])
    assert args.run.recipe == recipe and args.data.max_tokens > 0 and args.training.learning_rate > 0


def test_wmt_recipes_follow_paper_one():
    args = arguments.parse_args(["--recipe", "wmt14-en-de-base"])
    training = args.training
    assert (training.learning_rate, training.warmup_steps, training.label_smoothing_factor) == (
        7e-4,
        4000,
        0.1,
    )
    assert (training.adam_beta1, training.adam_beta2, training.adam_epsilon) == (0.9, 0.98, 1e-9)
    assert (args.data.max_tokens, training.gradient_accumulation_steps, training.max_steps) == (
        4096,
        8,
        150000,
    )
    assert args.run.average_last == 5 and training.lr_scheduler_type == "inverse_sqrt"
    assert Path(args.data.test_source).is_file()  # newstest2014 is shipped


def test_command_line_overrides_the_recipe():
    args = arguments.parse_args(
        [
            "--recipe",
            "multi30k-en-de-tiny",
            "--d_model",
            "64",
            "--position_encoding",
            "learned",
            "--learning_rate",
            "0.01",
        ]
    )
    assert args.model.d_model == 64 and args.model.layers == 2 and args.model.position_encoding == "learned"
    assert args.training.learning_rate == 0.01 and args.training.warmup_steps == 100  # the recipe's


def test_unknown_recipe_or_module_lists_the_valid_ones(capsys):
    with pytest.raises(SystemExit):
        arguments.parse_args(["--recipe", "wmt15"])
    assert "unknown recipe 'wmt15'; available: iwslt14-de-en-small" in capsys.readouterr().err
    with pytest.raises(SystemExit):
        arguments.parse_args(["--position_encoding", "rotary"])
    assert (
        "encoder_position_encoding='rotary' is not known; allowed values: adaptive_t5"
        in capsys.readouterr().err
    )


def test_recipe_with_an_unknown_key_is_rejected(tmp_path, monkeypatch, capsys):
    (tmp_path / "bad.yaml").write_text("d_model: 64\nlearnig_rate: 0.1\n")
    monkeypatch.setattr(arguments, "RECIPES", tmp_path)
    with pytest.raises(SystemExit):
        arguments.parse_args(["--recipe", "bad"])
    assert "unknown keys ['learnig_rate']" in capsys.readouterr().err


def test_rposnet_cross_attention_gets_the_training_data_length_ratio():
    """Paper 2 Eq. 10: gamma in cross-attention = source/target length ratio, computed by the training script."""
    dataset = datasets.Dataset.from_dict(
        {"input_ids": [[1, 2, 3], [4, 5, 6, 7, 8]], "labels": [[1, 2], [3, 4]]}
    )
    assert run.source_target_length_ratio(dataset) == 2.0
    args = arguments.parse_args(
        ["--recipe", "multi30k-en-de-tiny", "--cross_attention", "rposnet", "--d_model", "32"]
    )
    assert run.data_config(args, 40, 0, 1, train=dataset).rposnet_length_ratio == 2.0
    args.model.config_overrides = json.dumps({"rposnet_length_ratio": 1.3})  # an explicit choice wins
    assert run.data_config(args, 40, 0, 1, train=dataset).rposnet_length_ratio == 1.3


def test_hub_translation_schema_adapter_on_a_local_dataset():
    dataset = datasets.Dataset.from_dict(
        {"translation": [{"de": "Ein Hund.", "en": "A dog."}, {"de": "Zwei Katzen.", "en": "Two cats."}]}
    )
    text = parallel_from_translation_dataset(dataset, "en", "de", name="wmt14/de-en:train")
    assert text.source == ["A dog.", "Two cats."] and text.target == ["Ein Hund.", "Zwei Katzen."]
    with pytest.raises(ValueError, match=r"languages \['de', 'en'\]; 'fr' is not among them"):
        parallel_from_translation_dataset(dataset, "en", "fr", name="wmt14/de-en:train")


def test_logged_loss_is_the_true_token_level_loss_with_accumulation_and_no_smoothing(tmp_path):
    """Marian's mean loss gets multiplied by the accumulation steps under the v5 Trainer; ours must not."""
    trainer = build_trainer(tmp_path, max_steps=1, update_freq=3, learning_rate=0.0)
    model = trainer.model
    loader = iter(trainer.get_train_dataloader())
    batches = [next(loader) for _ in range(3)]
    total, tokens = 0.0, 0
    model.eval()
    with torch.no_grad():
        for batch in batches:
            logits = model(**{k: v for k, v in batch.items() if k != "labels"}).logits
            total += torch.nn.functional.cross_entropy(
                logits.flatten(0, 1), batch["labels"].flatten(), ignore_index=-100, reduction="sum"
            ).item()
            tokens += int((batch["labels"] != -100).sum())
    trainer.train()
    logged = trainer.state.log_history[0]["loss"]
    assert logged == pytest.approx(total / tokens, rel=1e-4)


def test_token_budget_loader_on_a_cpu_pins_nothing_and_warns_nothing(tmp_path):
    trainer = build_trainer(tmp_path, max_steps=1)
    trainer.args.dataloader_pin_memory = True  # the Trainer's default unless use_cpu, as in train.py
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        batch = next(iter(trainer.get_train_dataloader()))
    assert batch["input_ids"].numel() <= 600


def save_checkpoint(folder, seed, step, eval_losses):
    model = tiny_model(seed=seed)
    model.save_pretrained(folder / f"checkpoint-{step}")
    history = [{"step": s, "eval_loss": loss} for s, loss in eval_losses.items()]
    (folder / f"checkpoint-{step}" / "trainer_state.json").write_text(json.dumps({"log_history": history}))
    return model


def test_checkpoint_averaging_last_and_best_rules(tmp_path):
    losses = {10: 3.0, 20: 2.0, 30: 2.5, 40: 2.6}
    models = {step: save_checkpoint(tmp_path, seed, step, losses) for seed, step in enumerate(losses)}
    assert [p.name for p in select_checkpoints(tmp_path, last=2)] == ["checkpoint-30", "checkpoint-40"]
    assert [p.name for p in select_checkpoints(tmp_path, best=2)] == ["checkpoint-20", "checkpoint-30"]
    assert [p.name for p in select_checkpoints(tmp_path, best=3)] == [
        "checkpoint-20",
        "checkpoint-30",
        "checkpoint-40",
    ]
    average = average_state_dicts(select_checkpoints(tmp_path, last=2))
    name = "model.encoder.layers.0.fc1.weight"
    expected = (models[30].state_dict()[name] + models[40].state_dict()[name]) / 2
    torch.testing.assert_close(average[name], expected)
    with pytest.raises(ValueError, match="asked to average 5 checkpoints"):
        select_checkpoints(tmp_path, last=5)


def test_average_checkpoints_script_writes_a_loadable_folder(tmp_path, multi30k_dir):
    from transformers import AutoModelForSeq2SeqLM

    from hf_posenc.pipeline.data.tokenization import train_joint_bpe

    tokenizer = train_joint_bpe(["a b c", "d e f"], vocab_size=40)
    losses = {1: 2.0, 2: 1.0}
    models, checkpoints = {}, tmp_path / "checkpoints"
    for seed, step in enumerate(losses):
        models[step] = save_checkpoint(checkpoints, seed, step, losses)
        tokenizer.save_pretrained(checkpoints / f"checkpoint-{step}")
    average_main([str(checkpoints), "--last", "2", "--output_dir", str(tmp_path / "avg")])
    loaded = AutoModelForSeq2SeqLM.from_pretrained(tmp_path / "avg")
    name = "model.decoder.layers.1.fc2.weight"
    torch.testing.assert_close(
        loaded.state_dict()[name], (models[1].state_dict()[name] + models[2].state_dict()[name]) / 2
    )
    assert loaded.lm_head.weight.data_ptr() == loaded.model.shared.weight.data_ptr()  # still tied
    assert "model.shared.weight" in load_file(tmp_path / "avg" / "model.safetensors")


def test_paired_bootstrap_marks_a_clearly_better_system(multi30k_dir):
    from hf_posenc.pipeline.data.files import read_split

    test = read_split(multi30k_dir, "test_2016_flickr", "en", "de", limit=200)
    good = test.target
    bad = [" ".join(line.split()[::-1]) for line in test.target]  # word order destroyed
    report = paired_bootstrap(bad, good, test.target, samples=200)
    assert report["bleu"]["system"] == 100.0 and report["bleu"]["significance"] == "**"
    assert report["bleu"]["p_value"] < 0.05 and "bs:200" in report["bleu"]["signature"]
    # two systems of the same expected quality: each damages a random half of the lines
    generator = random.Random(0)
    first, second = (
        [g if generator.random() < 0.5 else b for g, b in zip(good, bad, strict=True)] for _ in range(2)
    )
    tie = paired_bootstrap(first, second, test.target, samples=1000)
    assert tie["bleu"]["significance"] == "" and tie["bleu"]["p_value"] > 0.10


def test_ngram_sweep_grows_with_order_for_word_order_damage(multi30k_dir, tmp_path):
    from hf_posenc.pipeline.data.files import read_split

    test = read_split(multi30k_dir, "test_2016_flickr", "en", "de", limit=100)
    shuffled = [" ".join(line.split()[::-1]) for line in test.target]
    sweep = ngram_sweep(test.target, shuffled, test.target)
    assert [n for n, _ in sweep["chrf_char"]] == list(range(1, 31))
    assert sweep["bleu"][0][1] == pytest.approx(0, abs=1e-6)  # unigrams ignore order
    assert sweep["bleu"][3][1] > sweep["bleu"][1][1] > 0  # the gap grows with the n-gram order
    plot_ngram_sweep(sweep, tmp_path / "sweep.png")
    assert (tmp_path / "sweep.png").read_bytes()[:4] == b"\x89PNG"


def test_evaluate_translation_script_decodes_scores_and_compares(multi30k_dir, tmp_path):
    from hf_posenc.pipeline.data.tokenization import train_joint_bpe

    folder = tmp_path / "model"
    model = tiny_model(max_position_embeddings=256)  # test sentences + 50 new tokens fit the table
    model.save_pretrained(folder)
    train_joint_bpe(["ein hund läuft", "a dog runs"], vocab_size=60).save_pretrained(folder)
    source = multi30k_dir / "test_2016_flickr.en.gz"
    reference = multi30k_dir / "test_2016_flickr.de.gz"
    lines = read_lines(reference)
    (tmp_path / "baseline.hyp").write_text("\n".join(" ".join(line.split()[::-1]) for line in lines) + "\n")
    (tmp_path / "good.hyp").write_text("\n".join(lines) + "\n")
    report = evaluate_main(
        [
            str(folder),
            "--source",
            str(source),
            "--reference",
            str(reference),
            "--hypotheses",
            str(tmp_path / "good.hyp"),
            "--baseline_hypotheses",
            str(tmp_path / "baseline.hyp"),
            "--ngram_sweep",
            "--bootstrap_samples",
            "100",
        ]
    )
    assert report["scores"]["bleu"] == 100.0 and report["paired_bootstrap"]["bleu"]["significance"] == "**"
    assert (folder / "ngram_sweep.png").is_file() and json.loads((folder / "evaluation.json").read_text())
    decoded = evaluate_main(
        [
            str(folder),
            "--source",
            str(source),
            "--reference",
            str(reference),
            "--num_beams",
            "1",
            "--output",
            str(tmp_path / "decoded.json"),
        ]
    )
    assert len((folder / "evaluation.hyp").read_text().splitlines()) == 1000
    assert "nrefs:1|case:mixed|eff:no|tok:13a" in decoded["scores"]["bleu_signature"]
    assert (
        decoded["precision"]["requested"] == "auto" and decoded["hardware"]["device"] == "cpu"
    )  # how it decoded


LAUNCHERS = {
    "single": [sys.executable],
    "torchrun": [sys.executable, "-m", "torch.distributed.run", "--nproc_per_node", "2"],
    "accelerate": [
        sys.executable,
        "-m",
        "accelerate.commands.launch",
        "--config_file",
        str(REPO / "train_scripts" / "accelerate" / "cpu_ddp_2proc.yaml"),
        "--num_cpu_threads_per_process",
        "1",
    ],
}


def run_probe(out, *args, launcher="single", timeout=600):
    env = {**os.environ, "OMP_NUM_THREADS": "1"}
    command = [*LAUNCHERS[launcher], str(PROBE)]
    completed = subprocess.run(
        [*command, str(out), *args], capture_output=True, text=True, timeout=timeout, env=env
    )
    assert completed.returncode == 0, completed.stderr[-3000:]


@pytest.mark.parametrize("launcher", ["torchrun", "accelerate"])
def test_two_process_ddp_ranks_end_identical_and_see_different_batches(tmp_path, launcher):
    run_probe(tmp_path, "--max_steps", "4", launcher=launcher)
    rank0, rank1 = (json.loads((tmp_path / f"rank{r}.json").read_text()) for r in (0, 1))
    assert rank0["world_size"] == rank1["world_size"] == 2
    assert rank0["checksum"] == rank1["checksum"]  # gradients were all-reduced
    assert not {digest for _, digest in rank0["seen"]} & {digest for _, digest in rank1["seen"]}
    assert len(rank0["seen"]) == len(rank1["seen"]) == 4


def test_resume_after_a_real_kill_continues_at_the_saved_step_with_the_same_data_order(tmp_path):
    reference, interrupted = tmp_path / "reference", tmp_path / "interrupted"
    run_probe(reference, "--max_steps", "12")
    env = {**os.environ, "OMP_NUM_THREADS": "1"}
    process = subprocess.Popen(
        [sys.executable, str(PROBE), str(interrupted), "--max_steps", "12", "--save_steps", "4"],
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
        env=env,
    )
    checkpoint = interrupted / "checkpoints" / "checkpoint-4" / "trainer_state.json"
    deadline = time.monotonic() + 300
    while not checkpoint.is_file() and process.poll() is None and time.monotonic() < deadline:
        time.sleep(0.05)
    process.send_signal(signal.SIGKILL)
    process.wait()
    assert checkpoint.is_file() and not (interrupted / "rank0.json").exists()  # killed mid-run, after a save

    run_probe(interrupted, "--max_steps", "12", "--save_steps", "4", "--resume")
    resumed = json.loads((interrupted / "rank0-resumed.json").read_text())
    full = json.loads((reference / "rank0.json").read_text())
    first_step = resumed["seen"][0][0]
    assert first_step >= 4 and resumed["global_step"] == 12
    assert resumed["seen"] == [entry for entry in full["seen"] if entry[0] >= first_step]
    assert resumed["checksum"] == pytest.approx(full["checksum"], rel=1e-5)


@pytest.mark.parametrize(
    "path", sorted((REPO / "train_scripts" / "accelerate").glob("*.yaml")), ids=lambda p: p.stem
)
def test_shipped_accelerate_configs_load_and_name_real_layer_classes(path):
    """accelerate parses every shipped config; FSDP wraps layer classes that exist in the model file and sets
    the options accelerate's launcher requires together (cpu_ram_efficient_loading needs sync_module_states)."""
    from accelerate.commands.config.config_args import load_config_from_file

    import hf_posenc.modeling_marian_posenc as modeling

    config = load_config_from_file(str(path))
    assert config.num_processes >= 1 and config.distributed_type.value in {
        "MULTI_CPU",
        "MULTI_GPU",
        "FSDP",
        "DEEPSPEED",
    }
    if config.distributed_type.value == "FSDP":
        fsdp = config.fsdp_config
        for name in fsdp["fsdp_transformer_layer_cls_to_wrap"].split(","):
            assert hasattr(modeling, name), name
        assert not fsdp.get("fsdp_cpu_ram_efficient_loading") or fsdp.get("fsdp_sync_module_states")


def test_train_short_keeps_only_short_pairs_and_concatenation_joins_them_afterwards(multi30k_dir):
    """--max_train_length (train short, test long) filters the training pairs; concatenation augmentation joins
    the kept pairs, so joined examples may be longer than the filter, which is their point."""
    flags = [
        "--recipe",
        "multi30k-en-de-tiny",
        "--data_dir",
        str(multi30k_dir),
        "--train_limit",
        "400",
        "--test_limit",
        "3",
        "--vocab_size",
        "600",
        "--max_train_length",
        "14",
        "--output_dir",
        "unused",
    ]
    short = run.prepare_data(arguments.parse_args(flags))
    assert max(short.train["length"]) <= 14 and 0 < len(short.train) < 400
    assert len(short.test) == 3  # the test set is not filtered
    joined = run.prepare_data(arguments.parse_args([*flags, "--concat_probability", "1.0"]))
    assert len(joined.train) < len(short.train) and max(joined.train["length"]) > 14
    assert len(joined.train) == (len(short.train) + 1) // 2  # groups of two by default
    fours = run.prepare_data(
        arguments.parse_args([*flags, "--concat_probability", "1.0", "--concat_group_sizes", "4"])
    )
    assert len(fours.train) == (len(short.train) + 3) // 4


def test_the_run_folder_is_named_after_the_recipe_and_module_unless_given():
    """The Trainer's own default output folder ("trainer_output") would name no run."""
    assert arguments.parse_args([]).training.output_dir.endswith("outputs/multi30k-en-de-small-sinusoidal")
    assert arguments.parse_args(["--position_encoding", "alibi"]).training.output_dir.endswith("-alibi")
    assert arguments.parse_args(["--output_dir", "mine"]).training.output_dir == "mine"
