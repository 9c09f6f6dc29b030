"""`apply_dropout`, every module's dropout: on the CPU its mask comes from 16-bit slices of full-range 64-bit draws
of torch's generator; elsewhere it is torch's dropout."""

import pytest
import torch

from hf_posenc import MarianPosEncConfig, MarianPosEncForConditionalGeneration, base
from hf_posenc.base import DROPOUT_RESOLUTION, apply_dropout


def expected_packed_mask(shape, p: float) -> torch.Tensor:
    """The mask drawn from the generator as it stands: element i keeps bits 16i..16i+15 of the draws."""
    numel = torch.Size(shape).numel()
    words = torch.empty((numel + 3) // 4, dtype=torch.int64).random_(-(2**63), None)
    kept = round((1 - p) * DROPOUT_RESOLUTION)
    return words.view(torch.int16)[:numel].view(shape) < kept - DROPOUT_RESOLUTION // 2


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize("shape", [(3, 5, 7), (2, 4, 8)])
def test_the_cpu_mask_is_the_generator_s_packed_draws_and_kept_values_are_scaled(shape, dtype):
    hidden = torch.randn(shape).to(dtype) + 3  # no zero among the inputs
    torch.manual_seed(11)
    dropped = apply_dropout(hidden, 0.3, training=True)
    torch.manual_seed(11)
    mask = expected_packed_mask(shape, 0.3)
    assert dropped.dtype == dtype and dropped.shape == hidden.shape
    assert torch.equal(dropped != 0, mask)
    kept = round(0.7 * DROPOUT_RESOLUTION)
    assert torch.equal(dropped[mask], hidden[mask] * (DROPOUT_RESOLUTION / kept))


def test_the_kept_share_is_one_minus_p_and_the_expectation_is_kept():
    torch.manual_seed(0)
    ones = torch.ones(1_000_000)
    dropped = apply_dropout(ones, 0.1, training=True)
    share = (dropped != 0).double().mean().item()
    assert abs(share - 0.9) < 4 * (0.9 * 0.1 / ones.numel()) ** 0.5  # 4 standard deviations
    assert abs(dropped.double().mean().item() - 1) < 2e-3
    # the masks of a batch's rows and of successive calls differ: the generator moves on
    assert not torch.equal(dropped, apply_dropout(ones, 0.1, training=True))


def test_gradients_flow_through_kept_elements_only():
    hidden = torch.randn(4, 6, 8, requires_grad=True)
    dropped = apply_dropout(hidden, 0.5, training=True)
    dropped.sum().backward()
    mask = dropped != 0
    assert torch.equal(hidden.grad[~mask], torch.zeros_like(hidden.grad[~mask]))
    assert torch.allclose(hidden.grad[mask], torch.full_like(hidden.grad[mask], 2.0))


def test_evaluation_and_p_zero_return_the_input_itself():
    hidden = torch.randn(2, 3)
    assert apply_dropout(hidden, 0.1, training=False) is hidden
    assert apply_dropout(hidden, 0.0, training=True) is hidden


def test_torch_s_dropout_where_the_packed_draws_do_not_apply(monkeypatch):
    hidden = torch.randn(2, 3, 4)
    # p = 1 has no kept draw: torch's dropout zeroes everything
    assert torch.equal(apply_dropout(hidden, 1.0, training=True), torch.zeros_like(hidden))
    for setting in ("switch", "compiling", "device"):
        monkeypatch.undo()
        if setting == "switch":
            monkeypatch.setattr(base, "PACKED_CPU_DROPOUT", False)
        elif setting == "compiling":
            monkeypatch.setattr(torch.compiler, "is_compiling", lambda: True)
        torch.manual_seed(5)
        if setting == "device":  # a tensor off the CPU: meta stands in for an accelerator
            assert apply_dropout(hidden.to("meta"), 0.2, training=True).device.type == "meta"
            continue
        dropped = apply_dropout(hidden, 0.2, training=True)
        torch.manual_seed(5)
        assert torch.equal(dropped, torch.nn.functional.dropout(hidden, 0.2, training=True)), setting


def test_a_training_forward_draws_its_masks_the_packed_way(monkeypatch):
    """The model's dropouts go through `apply_dropout`: with the switch off, the same seed gives other masks."""
    config = MarianPosEncConfig(
        vocab_size=50, d_model=16, encoder_layers=1, decoder_layers=1, encoder_attention_heads=2,
        decoder_attention_heads=2, encoder_ffn_dim=32, decoder_ffn_dim=32, dropout=0.3, pad_token_id=0,
        eos_token_id=1, decoder_start_token_id=0, max_position_embeddings=64,
    )  # fmt: skip
    torch.manual_seed(0)
    model = MarianPosEncForConditionalGeneration(config).train()
    inputs = {"input_ids": torch.tensor([[5, 6, 7, 1]]), "labels": torch.tensor([[8, 9, 1]])}

    def loss():
        torch.manual_seed(3)
        return model(**inputs).loss

    packed = loss()
    assert torch.equal(packed, loss())  # reproducible from the seed
    monkeypatch.setattr(base, "PACKED_CPU_DROPOUT", False)
    assert not torch.equal(packed, loss())
