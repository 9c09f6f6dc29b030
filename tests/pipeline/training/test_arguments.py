"""train.py's flags (pipeline/training/arguments.py): a bad value is refused by the parser naming the flag, the
command line overrides the recipe, and the run folder is named after the recipe and module."""

import pytest

from hf_posenc.pipeline.training import arguments

# train.py flags whose value alone is wrong: refused by the parser (exit 2) with these words.
BAD_FLAGS = [
    (["--config_overrides", '{"posnet_dimm": 3}'], ["posnet_dimm", "did you mean 'posnet_dim'"]),
    (["--config_overrides", "{posnet_dim: 3}"], ["--config_overrides is not valid JSON"]),
    (["--config_overrides", "[1, 2]"], ["--config_overrides must be a JSON object"]),
    (["--layers", "0"], ["--layers=0 must be at least 1"]),
    (["--ffn_dim", "0"], ["--ffn_dim=0 must be at least 1"]),
    (["--d_model", "-8"], ["--d_model=-8 must be at least 1"]),
    (["--vocab_size", "0"], ["--vocab_size=0 must be at least 1"]),
    (["--heads", "3"], ["d_model=256 must be divisible by encoder_attention_heads=3"]),
    (["--train_limit", "-5"], ["--train_limit=-5 must be at least 1"]),
    (["--train_limit", "0"], ["--train_limit=0 must be at least 1"]),
    (["--test_limit", "0"], ["--test_limit=0 must be at least 1"]),
    (["--minutes", "-1"], ["--minutes=-1.0 must be a finite number, at least 0"]),
    (["--minutes", "nan"], ["--minutes=nan must be a finite number"]),
    (["--minutes", "inf"], ["--minutes=inf must be a finite number"]),
    (["--save_strategy", "steps", "--save_steps", "0"], ["--save_steps=0.0 must be at least 1"]),
    (["--length_penalty", "nan"], ["--length_penalty=nan must be a finite number"]),
    (["--learning_rate", "-0.001"], ["--learning_rate=-0.001 must be a finite number, at least 0"]),
    (["--learning_rate", "0"], ["--learning_rate=0 trains nothing"]),
    (["--dropout", "1.5"], ["--dropout=1.5 must be a finite number, at least 0 and at most 1"]),
    (["--config_overrides", '{"posnet_dim": "wide"}'], ["invalid model settings", "posnet_dim"]),
    (["--max_tokens", "20"], ["--max_tokens=20 cannot hold a sentence of --max_length=128 tokens"]),
    (["--hub_private_repo", "true"], ["--hub_private_repo given without --push_to_hub"]),
    (
        ["--push_to_hub", "--hub_model_id", "a/b", "--hub_strategy", "checkpoint"],
        ["--hub_strategy=checkpoint is not supported", "allowed: end"],
    ),
    (["--push_to_hub", "--hub_model_id", "a/b", "--hub_always_push"], ["--hub_always_push is not supported"]),
    (["--max_steps", "0"], ["--max_steps=0 must be positive"]),
    (["--max_steps", "-3"], ["--max_steps=-3 must be positive"]),
    (["--save_strategy", "steps", "--save_steps", "-1"], ["--save_steps=-1"]),
    (["--eval_strategy", "steps", "--eval_steps", "-1"], ["--eval_steps=-1"]),
    (["--gradient_accumulation_steps", "0"], ["--gradient_accumulation_steps=0 must be at least 1"]),
    (["--bf16"], ["--precision"]),
    (["--position_encoding", "rotary"], ["'rotary' is not known", "allowed values"]),
    (
        ["--encoder_self_attention", "fourier", "--decoder_self_attention", "fourier"],
        ["cannot be used there"],
    ),
    (["--save_strategy", "no", "--average_last", "5"], ["checkpoint averaging needs checkpoints"]),
    (
        ["--minutes", "0", "--max_steps", "120", "--average_last", "5"],
        ["writes 2 checkpoints, fewer than the 5"],
    ),
    (
        ["--concat_probability", "1.5"],
        ["--concat_probability=1.5 must be a finite number, at least 0 and at most 1"],
    ),
    (
        ["--concat_probability", "0.5", "--concat_group_sizes", "2", "1"],
        ["--concat_group_sizes=[2, 1]", "whole numbers >= 2"],
    ),
    (["--concat_group_sizes", "3"], ["--concat_group_sizes needs --concat_probability"]),
    (["--recipe", "wmt15"], ["unknown recipe 'wmt15'; available:"]),
    (["--warmup_steps", "nan"], ["--warmup_steps=nan must be a finite number, at least 0"]),
    (["--seed", "-1"], ["--seed=-1 must be at least 0"]),
    (["--valid_source", "val.en"], ["--valid_source and --valid_target go together"]),
    (["--test_target", "test.de"], ["--test_source and --test_target go together"]),
    (
        ["--architecture", "stock_marian", "--position_encoding", "rope"],
        [
            "--architecture stock_marian trains transformers' MarianMTModel, which has none of --position_encoding"
        ],
    ),
    (
        ["--architecture", "stock_marian", "--config_overrides", '{"shape_max_shift": 4}'],
        ["which has none of --config_overrides shape_max_shift"],
    ),
    (["--architecture", "stock_marian", "--sentence_positions"], ["which has none of --sentence_positions"]),
    (["--architecture", "stock_marian", "--length_control"], ["which has none of --length_control"]),
    (["--architecture", "stock_marian", "--window_sentences", "4"], ["which has none of --window_sentences"]),
    (["--window_sentences", "0"], ["--window_sentences=0 must be at least 1"]),
    (["--length_buckets", "16", "8"], ["--length_buckets=[16, 8]", "must increase, and 8 follows 16"]),
    (["--length_buckets", "0", "8"], ["--length_buckets=[0, 8]", "[0] are not positive whole numbers"]),
    (
        ["--architecture", "stock_marian", "--length_buckets", "16", "32"],
        ["--length_buckets 16 32 pads token-budget batches", "--architecture stock_marian"],
    ),
    (
        ["--sentence_positions", "--config_overrides", '{"sentence_end_token_ids": [5]}'],
        ["--sentence_positions takes the tokenizer's sentence-end tokens", "sentence_end_token_ids=[5] too"],
    ),
]


@pytest.mark.parametrize("flags, words", BAD_FLAGS, ids=[" ".join(f) for f, _ in BAD_FLAGS])
def test_bad_train_flags_are_refused_by_the_parser_naming_the_flag(flags, words, capsys):
    with pytest.raises(SystemExit) as exit_info:
        arguments.parse_args(["--recipe", "multi30k-en-de-small", *flags])
    assert exit_info.value.code == 2
    message = capsys.readouterr().err
    for word in words:
        assert word in message, message


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


def test_the_run_folder_is_named_after_the_recipe_and_module_unless_given():
    """The Trainer's own default output folder ("trainer_output") would name no run."""
    assert arguments.parse_args([]).training.output_dir.endswith("outputs/multi30k-en-de-small-sinusoidal")
    assert arguments.parse_args(["--position_encoding", "alibi"]).training.output_dir.endswith("-alibi")
    assert arguments.parse_args(["--output_dir", "mine"]).training.output_dir == "mine"
