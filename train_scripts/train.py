"""Train and evaluate a translation model, and write a Hub-ready folder.

    python train_scripts/train.py                                   # recipe multi30k-en-de-small, sinusoidal
    python train_scripts/train.py --recipe wmt14-en-de-base --position_encoding learned
    python train_scripts/train.py --recipe multi30k-en-de-tiny --encoder_self_attention rposnet --minutes 2
    python train_scripts/train.py --recipe my-recipe.yaml           # a recipe file of your own
    python train_scripts/train.py args.json                         # every flag from a JSON or YAML file

`--help` lists every flag. The stages and the settings live in the library: `hf_posenc/pipeline/training/run.py`
(prepare -> build -> train -> evaluate -> export) and `hf_posenc/pipeline/training/arguments.py` (flags, recipes, checks).
"""

from hf_posenc.pipeline.cli import train

if __name__ == "__main__":
    train()
