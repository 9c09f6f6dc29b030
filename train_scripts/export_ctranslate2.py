"""Export a MarianPosEnc model folder to CTranslate2, with its tokenizer and generation config (`--help`)."""

from hf_posenc.pipeline.cli import run_cli
from hf_posenc.pipeline.ctranslate2 import main

if __name__ == "__main__":
    run_cli(main)
