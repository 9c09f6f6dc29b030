"""Training: the settings of a run (`arguments.py`: flags, the shipped recipes in `recipes/`, every check that
needs only the settings), its stages prepare -> build -> train -> evaluate -> export (`run.py`, the
`hf-posenc-train` command), the Trainer with token-budget batches (`trainer.py`), the learning-rate plan for a
time budget (`schedule.py`), resuming (`resume.py`), progress and the budget check (`progress.py`), what the
machine can do (`hardware.py`: precision, attention kernel, threads, MFU) and checkpoint averaging
(`averaging.py`, the `hf-posenc-average` command)."""
