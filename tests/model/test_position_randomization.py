"""SHAPE (Kiyono et al. 2021), the training option `shape_max_shift` of the position computation: a random shift
per training sequence and stack, none at inference or during a cached decode, the tables it needs, and no effect
on shift-invariant encodings."""

import pytest
import torch

from hf_posenc import POSITION_ENCODINGS, MarianPosEncForConditionalGeneration
from tests.helpers import PAD, VOCAB, decode_with_cache, record_positions


@pytest.mark.parametrize("name", ["sinusoidal", "learned", "posnet_embed"])
def test_shape_leaves_inference_unchanged(name, source_batch, target_batch, tiny_model):
    """SHAPE is a training-time shift: in eval mode a model built with shape_max_shift gives the logits of the
    same model without it."""
    src, mask = source_batch()
    logits = []
    for shift in (0, 8):
        model = tiny_model(position_encoding=name, shape_max_shift=shift)
        with torch.no_grad():
            logits.append(model(input_ids=src, attention_mask=mask, decoder_input_ids=target_batch()).logits)
    torch.testing.assert_close(logits[1], logits[0], atol=0, rtol=0)


def test_shape_shifts_each_training_sequence_by_one_offset_independently_per_stack(monkeypatch, tiny_model):
    """In training, every sequence's positions are its unshifted ones plus one offset k in [0, K] (both ends
    drawn), offsets differ between sequences, and encoder and decoder draw theirs independently (the paper's
    code shifts each stack's positions on its own). The spans handed along bound the shifted positions."""
    max_shift, batch, length = 3, 64, 6
    model = tiny_model(position_encoding="sinusoidal", shape_max_shift=max_shift).train()
    seen = record_positions(model, monkeypatch)
    src = torch.randint(2, VOCAB, (batch, length))
    mask = torch.ones_like(src)
    mask[1::2, 4:] = 0  # half the rows padded: their real tokens are shifted alike
    src[mask == 0] = PAD
    model(input_ids=src, attention_mask=mask, labels=torch.randint(2, VOCAB, (batch, 5)))

    offsets = {}
    for stack, unshifted in (
        ("encoder", (mask.cumsum(-1) - 1).clamp(min=0)),
        ("decoder", torch.arange(5).expand(batch, -1)),
    ):
        (context,) = seen[stack]
        positions = context.query_positions
        shift = positions[:, :1] - unshifted[:, :1]  # (B, 1)
        torch.testing.assert_close(positions, unshifted + shift, atol=0, rtol=0)
        assert set(shift.flatten().tolist()) == set(range(max_shift + 1))
        assert context.query_span[0] <= int(positions.min()) and int(positions.max()) <= context.query_span[1]
        assert context.key_span[0] <= int(context.key_positions.min())
        assert int(context.key_positions.max()) <= context.key_span[1]
        offsets[stack] = shift
    assert not torch.equal(offsets["encoder"], offsets["decoder"])


def test_shape_needs_a_learned_table_of_length_plus_max_shift(tiny_model):
    """With SHAPE, training positions reach length - 1 + K: a learned table shorter than that fails on every
    training batch with the error naming both sizes (not only when a large offset happens to be drawn), while
    the same input is fine at inference."""
    model = tiny_model(position_encoding="learned", shape_max_shift=8)  # max_position_embeddings = 64
    src = torch.randint(2, VOCAB, (2, 60))
    labels = torch.randint(2, VOCAB, (2, 5))
    with torch.no_grad():
        model(input_ids=src, labels=labels)
    model.train()
    with pytest.raises(ValueError, match=r"Sequence of 68 positions is longer than the 64 positions"):
        model(input_ids=src, labels=labels)
    with pytest.raises(ValueError, match=r"Sequence of 68 positions is longer than the 64 positions"):
        model(input_ids=src[:, :5], labels=torch.randint(2, VOCAB, (2, 60)))  # the decoder's table too


@pytest.mark.parametrize("name", ["t5_bias", "alibi", "kerple", "shaw", "rope"])
def test_shape_changes_nothing_for_shift_invariant_encodings(name, source_batch, target_batch, tiny_model):
    """Encodings that see only i - j are invariant to SHAPE's shifts: without dropout, a training forward with
    shape_max_shift gives the loss of one without it."""
    src, mask = source_batch()
    labels = target_batch()[:, 1:].clone()
    losses = []
    for shift in (0, 8):
        model = tiny_model(position_encoding=name, shape_max_shift=shift, dropout=0.0).train()
        losses.append(model(input_ids=src, attention_mask=mask, labels=labels).loss)
    torch.testing.assert_close(losses[1], losses[0], atol=1e-6, rtol=1e-5)


@pytest.mark.parametrize("name", list(POSITION_ENCODINGS))
def test_shape_training_step_is_finite_for_every_position_encoding(
    name, source_batch, target_batch, tiny_model
):
    """SHAPE breaks no registered encoding: a training step with shifted positions gives a finite loss and
    finite gradients."""
    model = tiny_model(position_encoding=name, shape_max_shift=8).train()
    src, mask = source_batch()
    loss = model(input_ids=src, attention_mask=mask, labels=target_batch()[:, 1:].clone()).loss
    loss.backward()
    assert torch.isfinite(loss)
    for parameter_name, parameter in model.named_parameters():
        assert parameter.grad is None or torch.isfinite(parameter.grad).all(), parameter_name


def test_shape_offsets_stay_fixed_across_the_steps_of_a_cached_decode(source_batch, target_batch, tiny_model):
    """A cached decode in training mode keeps each sequence's first decoder offsets for all its steps, so it
    equals the full training forward drawn from the same random state."""
    model = tiny_model(position_encoding="learned", shape_max_shift=8, dropout=0.0).train()
    src, mask = source_batch()
    tgt = target_batch()
    with torch.no_grad():
        torch.manual_seed(5)
        encoder_outputs = model.get_encoder()(input_ids=src, attention_mask=mask)
        full = model(encoder_outputs=encoder_outputs, attention_mask=mask, decoder_input_ids=tgt).logits
        torch.manual_seed(5)
        encoder_outputs = model.get_encoder()(input_ids=src, attention_mask=mask)
        incremental = decode_with_cache(model, encoder_outputs, mask, tgt)
    torch.testing.assert_close(incremental, full, atol=1e-5, rtol=1e-4)


def test_shape_max_shift_must_not_be_negative(tiny_config):
    with pytest.raises(ValueError, match=r"shape_max_shift=-1 must be >= 0"):
        tiny_config(shape_max_shift=-1)
    assert MarianPosEncForConditionalGeneration(tiny_config(shape_max_shift=0)).config.shape_max_shift == 0
