"""A training run's stages (pipeline/training/run.py) on real data: a tiny run writes a Hub-ready folder, the stock
Marian baseline runs through the same pipeline, degenerate output and missing data are named, torch.compile
and precision, the data preparation (train short, concatenation) and the rposnet length ratio; the full default
recipe is marked slow."""

import json
import subprocess
import sys
import textwrap

import datasets
import pytest
import torch
import transformers
from safetensors.torch import load_file

from hf_posenc import MarianPosEncForConditionalGeneration
from hf_posenc.pipeline.training import arguments, run

TINY = [
    "--train_limit",
    "3000",
    "--test_limit",
    "40",
    "--max_steps",
    "30",
    "--d_model",
    "32",
    "--layers",
    "1",
    "--heads",
    "4",
    "--ffn_dim",
    "64",
    "--vocab_size",
    "1200",
    "--max_tokens",
    "1500",
    "--threads",
    "2",
    "--examples",
    "2",
    "--fail_on_degenerate",
    "false",
]

LOAD_WITHOUT_PACKAGE = textwrap.dedent(
    """
    import json, sys
    sys.modules["hf_posenc"] = None
    from transformers import AutoModelForSeq2SeqLM, AutoTokenizer
    folder = sys.argv[1]
    model = AutoModelForSeq2SeqLM.from_pretrained(folder, trust_remote_code=True).eval()
    tokenizer = AutoTokenizer.from_pretrained(folder, trust_remote_code=True)
    batch = tokenizer(["A man is riding a bike.", "Two dogs play in the snow."], return_tensors="pt", padding=True)
    out = model.generate(**batch)
    print(json.dumps({"module": type(model).__module__, "translations": tokenizer.batch_decode(out, skip_special_tokens=True)}))
    """
)


def test_tiny_training_run_writes_a_hub_ready_folder_that_loads_without_the_package(
    multi30k_dir, tmp_path, capsys, hub
):
    output, dry_run = tmp_path / "run", tmp_path / "upload"
    scores = run.main(
        [
            *TINY,
            "--data_dir",
            str(multi30k_dir),
            "--position_encoding",
            "learned",
            "--output_dir",
            str(output),
            "--hub_dry_run",
            str(dry_run),
            "--push_to_hub",
            "--hub_model_id",
            "someone/tiny-learned",
        ]
    )
    # --push_to_hub creates the repo and uploads exactly the dry-run folder (weights, code, tokenizer, card)
    assert [name for name, _ in hub.calls] == ["create_repo", "upload_folder"]
    assert hub.calls[0][1] == {"repo_id": "someone/tiny-learned", "private": None, "exist_ok": True}
    assert hub.calls[1][1]["files"] == sorted(p.name for p in dry_run.iterdir())
    printed = capsys.readouterr().out
    assert "BLEU" in printed and "nrefs:1|case:mixed|eff:no|tok:13a" in printed and "chrF++" in printed
    assert scores["steps"] == 30 and scores["test_pairs"] == 40
    for name in (
        "model.safetensors",
        "config.json",
        "generation_config.json",
        "tokenizer.json",
        "README.md",
        "scores.json",
        "modeling_marian_posenc.py",
        "posenc_absolute.py",
        "test.hyp.de",
    ):
        assert (output / name).is_file(), name
    config = json.loads((output / "config.json").read_text())
    assert config["auto_map"]["AutoModelForSeq2SeqLM"].startswith("modeling_marian_posenc.")
    assert config["encoder_position_encoding"] == "learned"
    card = (output / "README.md").read_text()
    assert card.startswith("---\n") and "model-index:" in card and f"value: {scores['bleu']}" in card
    assert "library_name: transformers" in card and "position-encoding-learned" in card
    assert "Departs from the papers' settings: nowhere." in card
    # the training data as read and filtered (corpus.py), in scores.json and the card
    data = scores["data"]
    assert data["pairs_read"] == data["pairs_kept"] + sum(data["skipped"].values())
    assert f"{data['pairs_read']:,} pairs read, {data['pairs_kept']:,} kept; skipped" in card
    assert (
        "Gehring et al. 2017" in card
        and "trust_remote_code=True" in card
        and scores["bleu_signature"] in card
        and 'from_pretrained("someone/tiny-learned"' in card
    )
    assert sorted(p.name for p in dry_run.iterdir()) == sorted(p.name for p in output.iterdir())
    assert len((output / "test.hyp.de").read_text().splitlines()) == 40

    completed = subprocess.run(
        [sys.executable, "-c", LOAD_WITHOUT_PACKAGE, str(dry_run)],
        capture_output=True,
        text=True,
        timeout=300,
        cwd=tmp_path,
    )
    assert completed.returncode == 0, completed.stderr[-3000:]
    loaded = json.loads(completed.stdout.strip().splitlines()[-1])
    assert loaded["module"].startswith("transformers_modules")
    assert len(loaded["translations"]) == 2


def test_stock_marian_baseline_runs_through_the_same_pipeline(multi30k_dir, tmp_path):
    scores = run.main(
        [
            *TINY,
            "--data_dir",
            str(multi30k_dir),
            "--architecture",
            "stock_marian",
            "--precision",
            "fp32",
            "--max_steps",
            "5",
            "--output_dir",
            str(tmp_path / "stock"),
        ]
    )
    assert scores["architecture"] == "stock_marian" and scores["precision"] == "fp32" and scores["steps"] == 5
    assert scores["transformers_version"] == transformers.__version__


def test_degenerate_output_fails_the_default_job_but_is_written_and_marked(multi30k_dir, tmp_path, capsys):
    """A run whose translations are garbage must not look like a success: exit code 3, the warning in the output,
    scores.json and the model card; the folder is still written so that the run can be inspected."""
    flags = [arg for arg in TINY if arg not in ("--fail_on_degenerate", "false")]
    with pytest.raises(SystemExit) as exit_info:
        run.main(
            [
                *flags,
                "--max_steps",
                "3",
                "--data_dir",
                str(multi30k_dir),
                "--output_dir",
                str(tmp_path / "bad"),
            ]
        )
    assert exit_info.value.code == 3
    assert "DEGENERATE OUTPUT" in capsys.readouterr().err
    scores = json.loads((tmp_path / "bad" / "scores.json").read_text())
    assert scores["degenerate"] and any(
        "below 1" in reason or "empty" in reason for reason in scores["degenerate"]
    )
    assert "Warning: degenerate output" in (tmp_path / "bad" / "README.md").read_text()


def test_missing_data_folder_is_reported_with_the_file_it_looked_for(tmp_path):
    # its own folder: the default one under outputs/ may hold a run of `make train`
    output = ["--output_dir", str(tmp_path / "run")]
    with pytest.raises(FileNotFoundError, match=r"no file train\.en\[\.gz\] in"):
        run.main(["--data_dir", str(tmp_path), "--max_steps", "1", *output])


@pytest.mark.slow
def test_default_recipe_reaches_the_measured_quality(multi30k_dir, tmp_path):
    """`make train`'s recipe for its full 16 minutes: measured 30.2 BLEU on one loaded thread (README)."""
    scores = run.main(["--data_dir", str(multi30k_dir), "--output_dir", str(tmp_path / "default")])
    assert scores["total_minutes"] <= 20 and scores["bleu"] > 25, scores


def test_torch_compile_trains_what_eager_trains_and_saves_the_plain_model(tmp_path, tiny_run_flags):
    """`--torch_compile true` (a Trainer field, off by default: docs/training.md says where it was measured):
    the compiled step computes the eager step's losses (same seed, fp32, no dropout, whose random numbers
    inductor draws differently) over token batches of changing shape, padded to the compiled run's default length
    buckets, with its compilations timed in scores.json, and the folder and checkpoints hold the plain model's
    weights."""

    flags = [*tiny_run_flags(), "--dropout", "0", "--max_steps", "4", "--logging_steps", "1"]
    flags += ["--save_strategy", "steps", "--save_steps", "2", "--average_last", "0"]
    flags += ["--minutes", "0", "--schedule", "fixed"]
    eager = run.main([*flags, "--output_dir", str(tmp_path / "eager")])
    compiled = run.main([*flags, "--torch_compile", "true", "--output_dir", str(tmp_path / "compiled")])
    assert compiled["torch_compile"] is True and eager["torch_compile"] is False
    assert compiled["batch_padding"]["length_buckets"] == list(arguments.COMPILE_LENGTH_BUCKETS)
    assert eager["batch_padding"]["length_buckets"] is None and eager["compilation"] is None
    assert compiled["compilation"]["compilations"] >= 1 and compiled["compilation"]["seconds"] > 0

    def losses(name):
        state = tmp_path / f"{name}-checkpoints" / "checkpoint-4" / "trainer_state.json"
        return [entry["loss"] for entry in json.loads(state.read_text())["log_history"] if "loss" in entry]

    assert len(losses("eager")) == 4
    assert losses("compiled") == pytest.approx(losses("eager"), rel=1e-3)
    weights = {name: load_file(tmp_path / name / "model.safetensors") for name in ("eager", "compiled")}
    assert weights["compiled"].keys() == weights["eager"].keys()
    checkpoint = load_file(tmp_path / "compiled-checkpoints" / "checkpoint-4" / "model.safetensors")
    assert checkpoint.keys() == weights["eager"].keys()


@pytest.mark.parametrize("precision, autocast", [("bf16", torch.bfloat16), ("fp32", None)])
def test_the_training_step_runs_in_the_chosen_precision(
    monkeypatch, tmp_path, precision, autocast, tiny_run_flags
):
    """The Trainer's Accelerator autocasts the model's forward with the `mixed_precision` that TrainingArguments
    computes from bf16/fp16 when it is built: the chosen precision reaches the training step (and scores.json
    says so), not only the record and the decoding."""
    seen = []
    forward = MarianPosEncForConditionalGeneration.forward

    def recording_forward(self, *args, **kwargs):
        if self.training:
            seen.append(torch.get_autocast_dtype("cpu") if torch.is_autocast_enabled("cpu") else None)
        return forward(self, *args, **kwargs)

    monkeypatch.setattr(MarianPosEncForConditionalGeneration, "forward", recording_forward)
    flags = [*tiny_run_flags(), "--precision", precision, "--max_steps", "2", "--minutes", "0"]
    record = run.main([*flags, "--output_dir", str(tmp_path / "run")])
    assert seen and set(seen) == {autocast}
    assert record["precision"] == precision and record["training_autocast"] == (
        precision if autocast else "no"
    )


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


# Two fixed-schedule updates, no averaging: enough to write a run folder whose settings a test reads.
TWO_UPDATES = ["--max_steps", "2", "--minutes", "0", "--schedule", "fixed", "--average_last", "0"]


def test_sentence_positions_take_the_tokenizers_sentence_ends_into_the_saved_config(tmp_path, tiny_run_flags):
    """`--sentence_positions`: the model's config gets the BPE's sentence-end tokens (docs/length.md), the run
    trains, and the saved folder loads with them; without the flag the config has none."""
    from transformers import AutoConfig, AutoTokenizer

    from hf_posenc.generation_length import sentence_end_token_ids

    flags = [*tiny_run_flags(), *TWO_UPDATES]
    run.main([*flags, "--sentence_positions", "true", "--output_dir", str(tmp_path / "sentences")])
    config = AutoConfig.from_pretrained(tmp_path / "sentences")
    ends = sentence_end_token_ids(AutoTokenizer.from_pretrained(tmp_path / "sentences"))
    assert ends and config.sentence_end_token_ids == ends
    args = arguments.parse_args([*flags, "--output_dir", str(tmp_path / "plain")])
    assert run.data_config(args, 400, 0, 1, train=None).sentence_end_token_ids == []


def test_length_control_and_windows_are_saved_in_the_generation_config(tmp_path, tiny_run_flags):
    """`--length_control`: the saved generation config turns length control on (docs/length.md) with r measured on
    the run's training examples; `--window_sentences 4` saves windows with the tokenizer's sentence ends; without
    them nothing is on."""
    from transformers import AutoTokenizer, GenerationConfig

    from hf_posenc.generation_length import continuation_token_ids

    flags = [*tiny_run_flags(), *TWO_UPDATES]
    run.main([*flags, "--length_control", "true", "--output_dir", str(tmp_path / "controlled")])
    saved = GenerationConfig.from_pretrained(tmp_path / "controlled")
    assert 0 < saved.min_length_ratio < 1.5 and saved.match_source_sentence_count is True
    assert saved.sentence_end_token_ids
    run.main([*flags, "--output_dir", str(tmp_path / "plain")])
    plain = GenerationConfig.from_pretrained(tmp_path / "plain")
    assert plain.min_length_ratio is None and plain.match_source_sentence_count is False
    assert plain.window_sentences is None
    run.main([*flags, "--window_sentences", "4", "--output_dir", str(tmp_path / "windows")])
    windows = GenerationConfig.from_pretrained(tmp_path / "windows")
    assert windows.window_sentences == 4 and windows.sentence_end_token_ids == saved.sentence_end_token_ids
    tokenizer = AutoTokenizer.from_pretrained(tmp_path / "windows")
    assert (
        windows.continuation_token_ids == continuation_token_ids(tokenizer) != []
    )  # Metaspace marks word starts
    assert windows.min_length_ratio is None  # windows alone: no length control
