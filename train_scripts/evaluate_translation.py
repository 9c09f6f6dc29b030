"""Translate a test set with a saved model and score it (`--help`; also the `hf-posenc-evaluate` command)."""

from hf_posenc.pipeline.tools import evaluate_cli

if __name__ == "__main__":
    evaluate_cli()
