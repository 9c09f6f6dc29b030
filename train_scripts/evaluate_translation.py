"""Translate a test set with a saved model and score it (`--help`; also the `hf-posenc-evaluate` command)."""

from hf_posenc.pipeline.cli import evaluate

if __name__ == "__main__":
    evaluate()
