"""Export a MarianPosEnc model folder to CTranslate2, with its tokenizer and generation config (`--help`)."""

from hf_posenc.pipeline.cli import export

if __name__ == "__main__":
    export()
