"""The training pipeline: everything between text files and a Hub-ready model folder, in four parts that the
console commands (`hf-posenc-train`, `-evaluate`, `-average`, `-export`) put together. The model files never
import it.

    data/        reading parallel text, the joint BPE, the tokenised training cache, batches, augmentation
    training/    the settings and recipes, the stages of a run, the Trainer, the schedule, resuming, progress,
                 the machine, checkpoint averaging
    evaluation/  decoding (the one `translate`), scores and significance, the evaluate command
    export/      the run folder and the Hub upload, the model card, the CTranslate2 export
    cli.py       how every command ends on bad input, and the range check of numeric flags

A new data source goes in `data/`, a new metric in `evaluation/scoring.py`, a new export target in `export/`.
"""
