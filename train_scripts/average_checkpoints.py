"""Average Trainer checkpoints into a normal model folder (`--help`; also the `hf-posenc-average` command)."""

from hf_posenc.pipeline.tools import average_cli

if __name__ == "__main__":
    average_cli()
