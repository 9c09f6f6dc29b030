"""Export: the run folder, written whole or not at all, and the Hub upload (`run_folder.py`); the model card
from its template (`model_card.py`, `model_card_template.md`); and the CTranslate2 conversion with its decoding
(`ctranslate2.py`, the `hf-posenc-export` command). A new export target is a file here with a `cli`."""
