"""Fixtures of the evaluation tests: a tiny model with the tools' BPE tokenizer."""

import pytest


@pytest.fixture(scope="module")
def model_and_tokenizer(tiny_model, bpe_tokenizer):
    return tiny_model(max_position_embeddings=64), bpe_tokenizer
