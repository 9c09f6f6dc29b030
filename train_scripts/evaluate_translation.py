"""Translate a test set with a saved model and score it (`--help`; also the `hf-posenc-evaluate` command)."""

from hf_posenc.pipeline.cli import run_cli
from hf_posenc.pipeline.tools import evaluate_main

if __name__ == "__main__":
    run_cli(evaluate_main)
