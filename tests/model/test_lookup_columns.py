"""`lookup_columns`: a small table read at many repeated indices, with a backward that sums by `index_add_`."""

import pytest
import torch

from hf_posenc import MarianPosEncForConditionalGeneration
from hf_posenc.base import lookup_columns
from tests.helpers import RecordedOps


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
def test_training_reads_small_tables_through_the_lookup(overrides, tiny_config):
    """A training step of each module that reads a kernel, FIRE's pieces or a bias per distance at every
    (query, key) pair sums their gradients with `index_add_` (the lookup's `index_select`), never with advanced
    indexing's accumulating `index_put_`; without gradients the tables are read with `index_select` alone."""
    torch.manual_seed(0)
    model = MarianPosEncForConditionalGeneration(tiny_config(**overrides)).train()
    batch = {"input_ids": torch.randint(2, 60, (2, 9)), "labels": torch.randint(2, 60, (2, 7))}
    loss = model(**batch).loss
    with RecordedOps() as backward:
        loss.backward()
    assert torch.ops.aten.index_add.default in backward.ops
    assert torch.ops.aten._index_put_impl_.default not in backward.ops
    with torch.no_grad(), RecordedOps() as forward:
        model(**batch)
    assert torch.ops.aten.index_select.default in forward.ops
    assert torch.ops.aten.index_add.default not in forward.ops
