"""Analyses of a trained model, each a function and a command over a saved model folder: the word-order probe
(`word_order_probe.py`, paper 1 §3), the position plots (`position_plots.py`) and the length-generalisation
harness (`length_generalisation.py`: k joined test sentences, the sentence-by-sentence ceiling)."""
