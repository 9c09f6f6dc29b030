"""Average Trainer checkpoints into a normal model folder (`--help`; also the `hf-posenc-average` command)."""

from hf_posenc.pipeline.cli import run_cli
from hf_posenc.pipeline.tools import average_main

if __name__ == "__main__":
    run_cli(average_main)
