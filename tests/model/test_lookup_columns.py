"""`lookup_columns`: a small table read at many repeated indices, with a backward that sums by `index_add_`."""

import pytest
import torch

from hf_posenc import MarianPosEncForConditionalGeneration, base
from hf_posenc.base import lookup_columns


@pytest.mark.parametrize("shape", [(1, 40, 40), (3, 7, 11), (5,)])
def test_values_and_gradients_are_those_of_advanced_indexing(shape):
    torch.manual_seed(0)
    table = torch.randn(4, 9, requires_grad=True)
    index = torch.randint(0, 9, shape)  # every column read many times
    weight = torch.randn(4, *shape)
    expected = table[:, index]
    (expected_grad,) = torch.autograd.grad((expected * weight).sum(), table)
    looked_up = lookup_columns(table, index)
    (grad,) = torch.autograd.grad((looked_up * weight).sum(), table)
    assert torch.equal(looked_up, expected)
    torch.testing.assert_close(grad, expected_grad)
    assert torch.count_nonzero(grad) > 0


SMALL_TABLE_SYSTEMS = {
    "lightconv": {"encoder_self_attention": "lightconv", "decoder_self_attention": "lightconv"},
    "lightconv global context": {
        "encoder_self_attention": "lightconv", "lightconv_global_context": True, "lightconv_gating": "gelu"
    },
    "fire": {"encoder_position_encoding": "fire", "decoder_position_encoding": "fire"},
    "t5_bias": {"encoder_position_encoding": "t5_bias", "decoder_position_encoding": "t5_bias"},
    "kerple": {"encoder_position_encoding": "kerple", "decoder_position_encoding": "kerple"},
}  # fmt: skip


@pytest.mark.parametrize("overrides", SMALL_TABLE_SYSTEMS.values(), ids=SMALL_TABLE_SYSTEMS)
def test_training_reads_small_tables_through_the_lookup(overrides, tiny_config, monkeypatch):
    """A training step of each module that reads a kernel, FIRE's pieces or a bias per distance at every
    (query, key) pair goes through `ColumnLookup`; without gradients it is plain indexing."""
    backwards, lookup = [], base.ColumnLookup

    class CountingLookup(lookup):
        @staticmethod
        def backward(ctx, grad):
            backwards.append(grad.shape)
            return lookup.backward(ctx, grad)

    monkeypatch.setattr(base, "ColumnLookup", CountingLookup)
    torch.manual_seed(0)
    model = MarianPosEncForConditionalGeneration(tiny_config(**overrides)).train()
    batch = {"input_ids": torch.randint(2, 60, (2, 9)), "labels": torch.randint(2, 60, (2, 7))}
    model(**batch).loss.backward()
    assert backwards
    backwards.clear()
    with torch.no_grad():
        model(**batch)
    assert not backwards
