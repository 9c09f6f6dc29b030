"""Evaluation: the one decoding loop and model loader (`decoding.py`, base install only), sacreBLEU scores with
signatures, paired bootstrap resampling, the n-gram sweep and the degenerate-output check (`scoring.py`), and the
`hf-posenc-evaluate` command (`command.py`). A new metric goes in `scoring.py`, beside `corpus_score`."""
