"""The console commands and the ways of giving a run its settings: a recipe by name or by path, and a JSON or
YAML file of flags in place of the command line (HF's `args.json` convention)."""

import errno
import json
import os
import subprocess
from importlib import import_module
from importlib.metadata import distribution

import pytest

from hf_posenc.pipeline.data.files import data_root
from hf_posenc.pipeline.training import arguments
from tests.helpers import REPO


def console_commands() -> dict[str, str]:
    """The installed package's commands (pyproject.toml's [project.scripts])."""
    return {
        point.name: point.value
        for point in distribution("hf_posenc").entry_points
        if point.group == "console_scripts"
    }


@pytest.mark.parametrize("command", sorted(console_commands()))
def test_every_console_command_names_a_function_that_exists(command):
    module, function = console_commands()[command].split(":")
    assert callable(getattr(import_module(module), function))


def test_the_train_command_is_installed_and_refuses_bad_input_in_one_line(tmp_path):
    """`make install` installs the commands into the venv; they run from any folder."""
    command = REPO / ".venv" / "bin" / "hf-posenc-train"
    if not command.exists():
        pytest.skip(f"{command} is not installed (the package is not installed in .venv)")
    result = subprocess.run([str(command), "--recipe", "nope"], capture_output=True, text=True, cwd=tmp_path)
    assert result.returncode == 2
    assert result.stderr.strip().splitlines()[-1].startswith("hf-posenc-train: error: unknown recipe 'nope'")


def test_a_recipe_file_extends_a_named_recipe_and_its_data_paths_are_under_the_data_root(tmp_path):
    recipe = tmp_path / "mine.yaml"
    recipe.write_text(
        "extends: multi30k-en-de-tiny\nd_model: 64\ntest_source: wmt14/newstest2014.en-de.en.gz\n"
    )
    args = arguments.parse_args(["--recipe", str(recipe), "--test_target", "my/test.de"])
    assert args.model.d_model == 64 and args.data.vocab_size == 6000  # from the recipe, then the tiny one
    assert args.data.test_source == str(data_root() / "wmt14" / "newstest2014.en-de.en.gz")
    assert args.data.test_target == "my/test.de"  # a command-line path stays relative to the current folder
    assert args.training.output_dir == "outputs/mine-sinusoidal"


def test_a_missing_recipe_file_is_named(capsys):
    with pytest.raises(SystemExit):
        arguments.parse_args(["--recipe", "no/such.yaml"])
    assert "recipe file no/such.yaml does not exist" in capsys.readouterr().err


@pytest.mark.parametrize("suffix", [".json", ".yaml"])
def test_a_file_of_flags_is_the_command_line(tmp_path, suffix):
    settings = {
        "recipe": "multi30k-en-de-tiny",
        "d_model": 64,
        "fail_on_degenerate": False,
        "concat_probability": 0.5,
        "concat_group_sizes": [2, 3],
        "config_overrides": {"shape_max_shift": 4},
        "output_dir": str(tmp_path / "run"),
    }
    path = tmp_path / f"args{suffix}"
    path.write_text(json.dumps(settings))
    from_file = arguments.parse_args([str(path)])
    from_flags = arguments.parse_args(
        [
            "--recipe",
            "multi30k-en-de-tiny",
            "--d_model",
            "64",
            "--fail_on_degenerate",
            "false",
            "--concat_probability",
            "0.5",
            "--concat_group_sizes",
            "2",
            "3",
            "--config_overrides",
            '{"shape_max_shift": 4}',
            "--output_dir",
            str(tmp_path / "run"),
        ]
    )
    assert from_file == from_flags


def test_a_file_of_flags_that_is_not_a_mapping_is_refused(tmp_path, capsys):
    path = tmp_path / "args.json"
    path.write_text("[1, 2]")
    with pytest.raises(ValueError, match="must hold a mapping of flags, got a list"):
        arguments.parse_args([str(path)])


def test_without_a_data_root_a_recipe_names_its_path_the_flag_and_the_variable(monkeypatch, capsys):
    monkeypatch.delenv("HF_POSENC_DATA")
    with pytest.raises(SystemExit):
        arguments.parse_args(["--recipe", "multi30k-en-de-tiny"])
    error = capsys.readouterr().err
    assert "data_dir=multi30k" in error and "--data_root DIR" in error and "HF_POSENC_DATA=DIR" in error


def test_the_data_root_flag_wins_over_the_variable_and_command_line_paths_need_none(tmp_path, monkeypatch):
    args = arguments.parse_args(["--recipe", "multi30k-en-de-tiny", "--data_root", str(tmp_path)])
    assert args.data.data_dir == str(tmp_path / "multi30k")
    monkeypatch.delenv("HF_POSENC_DATA")
    args = arguments.parse_args(["--recipe", "multi30k-en-de-tiny", "--data_dir", "mine"])
    assert args.data.data_dir == "mine"


@pytest.mark.parametrize(
    "said, line", [("", "tool: interrupted"), ("at step 3", "tool: interrupted: at step 3")]
)
def test_an_interrupt_ends_any_tool_in_one_line_with_exit_code_130(said, line, capsys):
    from hf_posenc.pipeline.cli import run_cli

    def interrupted():
        raise KeyboardInterrupt(said) if said else KeyboardInterrupt

    with pytest.raises(SystemExit) as exit_info:
        run_cli(interrupted, "tool")
    assert exit_info.value.code == 130 and capsys.readouterr().err == line + "\n"


FULL_DISKS = {
    "os": OSError(errno.ENOSPC, os.strerror(errno.ENOSPC)),
    "quota": OSError(errno.EDQUOT, os.strerror(errno.EDQUOT)),
    "safetensors": RuntimeError("Error while serializing: I/O error: No space left on device (os error 28)"),
}


@pytest.mark.parametrize("error", FULL_DISKS.values(), ids=FULL_DISKS)
def test_a_full_disk_ends_any_tool_in_one_line_and_other_errors_keep_their_stack(error, capsys):
    """Before: `hf-posenc-average` onto a full disk ended in safetensors' stack, `hf-posenc-export` in OSError's."""
    from hf_posenc.pipeline.cli import run_cli

    def failing():
        raise error

    with pytest.raises(SystemExit) as exit_info:
        run_cli(failing, "tool")
    assert exit_info.value.code == 2
    assert capsys.readouterr().err == f"tool: error: a disk is full ({error}): free space and run it again\n"

    def buggy():
        raise RuntimeError("a bug")

    with pytest.raises(RuntimeError, match="a bug"):
        run_cli(buggy, "tool")
