"""Average Trainer checkpoints into a normal model folder (`--help`; also the `hf-posenc-average` command)."""

from hf_posenc.pipeline.cli import average

if __name__ == "__main__":
    average()
