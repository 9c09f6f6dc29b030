"""PosNet-Embed and PosNet-Attn (paper 1): the equations against slow direct implementations, the weight
concatenation identity (Eq. 10–11 = Eq. 14–17), the two fixed reference traps, and encoder/decoder sharing."""

import pytest
import torch

from hf_posenc import MarianPosEncForConditionalGeneration
from hf_posenc.base import PositionContext, positions_from_padding_mask
from hf_posenc.posenc_posnet import (
    KernelRangeProduct,
    ReluKernelResidual,
    first_of_consecutive,
    kernel_product_of_values,
    position_kernel_product,
)
from tests.helpers import PAD


def test_weight_concatenation_equals_positional_kernels():
    """The paper's central identity: concatenating a_ij v_j in word order and projecting with Φ ∈ R^{Ld×d}
    (Eq. 10–11) equals Σ_j a_ij (v_j φ_j) = a_i (V ⊗ Φ) (Eq. 14–15, 17), and our kernel product computes V ⊗ Φ."""
    generator = torch.Generator().manual_seed(0)
    length, dim = 7, 5
    query, key, value = torch.randn(3, length, dim, generator=generator, dtype=torch.float64)
    projection = torch.randn(length * dim, dim, generator=generator, dtype=torch.float64)  # Φ of Eq. 11
    scores = torch.softmax(query @ key.T / dim**0.5, dim=-1)  # (L, L): a_i in row i

    concatenated = torch.stack(
        [torch.cat([scores[i, j] * value[j] for j in range(length)]) for i in range(length)]
    )  # (L, L·d): a_i ⊕ V of Eq. 10
    literal = concatenated @ projection  # Eq. 11

    kernels = projection.view(length, dim, dim)  # φ_j: the j-th (d × d) block of Φ
    summed = torch.stack(
        [sum(scores[i, j] * (value[j] @ kernels[j]) for j in range(length)) for i in range(length)]
    )
    transformed = position_kernel_product(value[None, :, None], kernels[:, None], torch.arange(length)[None])
    torch.testing.assert_close(summed, literal)  # Eq. 14-15
    torch.testing.assert_close(scores @ transformed[0, :, 0], literal)  # Eq. 17


def test_weight_concatenation_is_not_permutation_invariant():
    """Eq. 12–13: unlike the weighted sum (Eq. 9), permuting keys and values changes a_i (V ⊗ Φ)."""
    generator = torch.Generator().manual_seed(1)
    length, dim = 6, 4
    scores = torch.softmax(torch.randn(length, generator=generator), dim=0)
    value = torch.randn(length, dim, generator=generator)
    kernels = torch.randn(length, 1, dim, dim, generator=generator)
    permutation = torch.tensor([2, 0, 1, 5, 3, 4])
    positions = torch.arange(length)[None]

    def kernel_attention(scores, value):
        return scores @ position_kernel_product(value[None, :, None], kernels, positions)[0, :, 0]

    torch.testing.assert_close(scores[permutation] @ value[permutation], scores @ value)  # Eq. 9
    assert not torch.allclose(
        kernel_attention(scores[permutation], value[permutation]), kernel_attention(scores, value)
    )


def direct_posnet_embed(network, inputs, positions):
    """Eq. 24 token by token: x_t + σ((x_t W1) φ_{p_t}) W2 (dropout off)."""
    output = torch.empty_like(inputs)
    for row in range(inputs.shape[0]):
        for column in range(inputs.shape[1]):
            token = inputs[row, column]
            kernel = network.kernels[positions[row, column], 0]
            output[row, column] = token + torch.relu(token @ network.down @ kernel) @ network.up
    return output


@pytest.mark.parametrize("padding", ["right", "left"])
def test_posnet_embed_matches_equation_24_with_positions_from_each_sequence_start(
    padding, source_batch, tiny_model
):
    """PosNet-Embed equals a direct implementation of Eq. 24 with kernels indexed by the position counted from
    the start of each sequence, for right- and left-padded batches (the batched fast path plus its fix-up)."""
    network = tiny_model(position_encoding="posnet_embed").model.encoder.position_encoding.network
    _, mask = source_batch()
    if padding == "left":
        mask = mask.flip(-1)
    inputs = torch.randn(*mask.shape, network.down.shape[0])
    positions = positions_from_padding_mask(mask, mask.shape[1], "cpu")
    with torch.no_grad():
        torch.testing.assert_close(
            network(inputs, PositionContext(None, positions, positions)),
            direct_posnet_embed(network, inputs, positions),
        )


@pytest.mark.parametrize("positions", [[3, 4, 5, 6], [0, 1, 1, 2], [5, 2, 7, 0]])
def test_kernel_product_of_consecutive_positions_equals_the_gather_with_its_gradients(positions):
    """The fast path of the kernel product (a range of the table, for consecutive positions) is taken exactly
    when the positions are consecutive, and its output and gradients (inputs and the whole table) equal the
    product with gathered kernels."""
    generator = torch.Generator().manual_seed(0)
    inputs = torch.randn(2, 4, 1, 3, generator=generator, requires_grad=True)
    kernels = torch.randn(8, 1, 3, 3, generator=generator, requires_grad=True)
    positions = torch.tensor(positions)[None]
    consecutive = positions[0].tolist() == list(range(int(positions[0, 0]), int(positions[0, 0]) + 4))
    assert (first_of_consecutive(positions[0]) is not None) == consecutive
    upstream = torch.randn(2, 4, 1, 3, generator=generator)
    output = position_kernel_product(inputs, kernels, positions)
    grads = torch.autograd.grad(output, (inputs, kernels), upstream)
    expected = (inputs.unsqueeze(-2) @ kernels[positions[0]].unsqueeze(0)).squeeze(-2)
    expected_grads = torch.autograd.grad(expected, (inputs, kernels), upstream)
    torch.testing.assert_close(output, expected)
    for grad, expected_grad in zip(grads, expected_grads, strict=True):
        torch.testing.assert_close(grad, expected_grad)


@pytest.mark.parametrize("first", [0, 2, 4])
def test_kernel_range_product_gradients_match_finite_differences(first):
    """KernelRangeProduct's own backward (the kernels' gradient written into a table-sized tensor, zero outside
    the range) against float64 finite differences, for ranges at the start, middle and end of the table."""
    generator = torch.Generator().manual_seed(1)
    rows = torch.randn(4, 2, 3, 5, generator=generator, dtype=torch.float64, requires_grad=True)
    kernels = torch.randn(8, 2, 5, 5, generator=generator, dtype=torch.float64, requires_grad=True)
    assert torch.autograd.gradcheck(lambda r, k: KernelRangeProduct.apply(r, k, first), (rows, kernels))


def test_kernel_range_product_under_bf16_autocast_matches_the_plain_product():
    """Under autocast the product computes in bfloat16 like the plain matmul did, and the gradients come back in
    the inputs' and the table's float32 dtypes, equal to the plain product's."""
    generator = torch.Generator().manual_seed(2)
    rows = torch.randn(4, 1, 3, 8, generator=generator, requires_grad=True)
    kernels = torch.randn(6, 1, 8, 8, generator=generator, requires_grad=True)
    upstream = torch.randn(4, 1, 3, 8, generator=generator)
    with torch.autocast("cpu", dtype=torch.bfloat16):
        output = KernelRangeProduct.apply(rows, kernels, 1)
        expected = torch.matmul(rows, kernels[1:5])
    assert output.dtype == expected.dtype == torch.bfloat16
    torch.testing.assert_close(output, expected, atol=0, rtol=0)
    grads = torch.autograd.grad(output, (rows, kernels), upstream)
    expected_grads = torch.autograd.grad(expected, (rows, kernels), upstream)
    for grad, expected_grad in zip(grads, expected_grads, strict=True):
        assert grad.dtype == torch.float32
        torch.testing.assert_close(grad, expected_grad, atol=1e-2, rtol=1e-2)


@pytest.mark.parametrize("per_head", [False, True])
def test_posnet_attn_value_transform_matches_equation_23(per_head, tiny_model):
    """transform_values computes σ(v_j φ_j) + v_j per head with the layer's kernel at each value position."""
    model = tiny_model(position_encoding="posnet_attn", posnet_attn_per_head=per_head)
    encoding = model.model.decoder.position_encoding
    value = torch.randn(2, 4, 5, 8)  # (B, H, k_new, d_k)
    positions = torch.tensor([[3, 4, 5, 6, 7], [0, 1, 2, 2, 2]])
    with torch.no_grad():
        actual = encoding.transform_values(1, value, positions)
    kernels = encoding.layer_kernels(1)  # the one table every layer reads by default
    expected = torch.empty_like(value)
    for b in range(2):
        for h in range(4):
            for j in range(5):
                kernel = kernels[positions[b, j], h if per_head else 0]
                expected[b, h, j] = torch.relu(value[b, h, j] @ kernel) + value[b, h, j]
    torch.testing.assert_close(actual, expected)


LEAN_POSITIONS = {
    "consecutive": torch.tensor([[2, 3, 4, 5]]),
    "padded": torch.tensor([[0, 1, 2, 3], [0, 1, 1, 1]]),  # row 1's clamped padding takes the fix-up path
}


@pytest.mark.parametrize("groups", [1, 2])
@pytest.mark.parametrize("layout", list(LEAN_POSITIONS))
def test_lean_relu_transform_passes_gradcheck(groups, layout):
    """ReluKernelResidual's hand-written backward (recompute v ⊗ Φ, 1-byte mask) gives the exact gradients of
    v + ReLU(v ⊗ Φ) for both inputs (float64 finite differences), shared or per-head kernels, padded or not."""
    generator = torch.Generator().manual_seed(2)
    value = torch.randn(2, 2, 4, 3, generator=generator, dtype=torch.float64, requires_grad=True)
    kernels = torch.randn(6, groups, 3, 3, generator=generator, dtype=torch.float64, requires_grad=True)
    positions = LEAN_POSITIONS[layout]
    assert torch.autograd.gradcheck(
        lambda v, k: ReluKernelResidual.apply(v, k, positions, 0.0, True), (value, kernels)
    )


def test_lean_relu_transform_equals_plain_autograd():
    """Output and gradients of ReluKernelResidual equal autograd through v + ReLU(v ⊗ Φ) (float32)."""
    generator = torch.Generator().manual_seed(3)
    value = torch.randn(3, 4, 5, 8, generator=generator, requires_grad=True)
    kernels = torch.randn(9, 1, 8, 8, generator=generator, requires_grad=True)
    positions = torch.tensor([[0, 1, 2, 3, 4], [0, 1, 2, 2, 2], [0, 1, 2, 3, 3]])
    upstream = torch.randn(3, 4, 5, 8, generator=generator)
    lean = ReluKernelResidual.apply(value, kernels, positions, 0.0, True)
    lean_grads = torch.autograd.grad(lean, (value, kernels), upstream)
    plain = value + torch.relu(kernel_product_of_values(value, kernels, positions))
    plain_grads = torch.autograd.grad(plain, (value, kernels), upstream)
    torch.testing.assert_close(lean, plain)
    for lean_grad, plain_grad in zip(lean_grads, plain_grads, strict=True):
        torch.testing.assert_close(lean_grad, plain_grad)


def test_lean_relu_transform_dropout_is_inverted_dropout_of_the_relu():
    """With dropout p, every update entry is 0 or ReLU(v ⊗ Φ)/(1 − p), about a fraction p of the positive ones
    is dropped, and the gradient is that of v + mask · (v ⊗ Φ)/(1 − p) with the same mask."""
    generator = torch.Generator().manual_seed(4)
    value = torch.randn(4, 2, 16, 8, generator=generator, requires_grad=True)
    kernels = torch.randn(16, 1, 8, 8, generator=generator, requires_grad=True)
    positions, p = torch.arange(16)[None], 0.25
    torch.manual_seed(0)
    output = ReluKernelResidual.apply(value, kernels, positions, p, True)
    pre_activation = kernel_product_of_values(value, kernels, positions)
    kept = (output - value).abs() > 0
    torch.testing.assert_close((output - value)[kept], (pre_activation / (1 - p))[kept])
    assert bool((pre_activation[kept] > 0).all())
    dropped_fraction = 1 - kept.sum() / (pre_activation > 0).sum()
    assert 0.15 < float(dropped_fraction) < 0.35
    upstream = torch.randn(output.shape, generator=generator)
    expected = value + kept * pre_activation / (1 - p)
    for actual_grad, expected_grad in zip(
        torch.autograd.grad(output, (value, kernels), upstream),
        torch.autograd.grad(expected, (value, kernels), upstream),
        strict=True,
    ):
        torch.testing.assert_close(actual_grad, expected_grad)


@pytest.mark.parametrize(("activation", "lean"), [("relu", True), ("gelu", False)])
def test_posnet_attn_saves_only_the_values_and_a_byte_mask_with_relu(activation, lean, tiny_model):
    """Activation memory (paper 1 Table 3): with ReLU, transform_values keeps for backward only the values
    (the value projection's output), a bool mask and the kernel table; other activations use plain autograd,
    which also keeps float intermediates."""
    model = tiny_model(position_encoding="posnet_attn", posnet_activation=activation).train()
    encoding = model.model.encoder.position_encoding
    projected = torch.randn(2, 5, 32, requires_grad=True)
    value = projected.view(2, 5, 4, 8).transpose(1, 2)  # (B, H, k, d_k), a view like the attention's
    saved = []
    with torch.autograd.graph.saved_tensors_hooks(lambda t: saved.append(t) or t, lambda t: t):
        encoding.transform_values(0, value, torch.arange(5)[None])
    parameter_storages = {p.untyped_storage().data_ptr() for p in model.parameters()}
    floats = {
        t.untyped_storage().data_ptr()
        for t in saved
        if t.is_floating_point() and t.untyped_storage().data_ptr() not in parameter_storages
    }
    if lean:
        assert floats == {projected.untyped_storage().data_ptr()}
        assert {t.dtype for t in saved if not t.is_floating_point()} == {torch.bool, torch.int64}
    else:
        assert len(floats) > 1


def test_posnet_attn_default_is_one_table_for_the_whole_model(tmp_path, tiny_model):
    """By default (posnet_attn_share_layers, posnet_shared: paper 1 Table 1's model) every self-attention layer of
    both stacks reads one kernel table (saved once, tied again after loading); per-layer tables add 3 more."""
    model = tiny_model(position_encoding="posnet_attn")
    encoder, decoder = model.model.encoder.position_encoding, model.model.decoder.position_encoding
    table = encoder.layer_kernels(0)
    assert all(e.layer_kernels(i) is table for e in (encoder, decoder) for i in range(2))
    kernel_keys = [key for key in model.state_dict() if ".kernels." in key]
    assert kernel_keys == ["model.encoder.position_encoding.kernels.0"]
    per_layer = tiny_model(position_encoding="posnet_attn", posnet_attn_share_layers=False)
    extra = sum(p.numel() for p in per_layer.parameters()) - sum(p.numel() for p in model.parameters())
    assert extra == 3 * table.numel()  # 4 self-attention layers, one table left
    model.save_pretrained(tmp_path)
    loaded = MarianPosEncForConditionalGeneration.from_pretrained(tmp_path)
    loaded_table = loaded.model.encoder.position_encoding.layer_kernels(0)
    assert loaded.model.decoder.position_encoding.layer_kernels(1) is loaded_table
    torch.testing.assert_close(loaded_table, table, atol=0, rtol=0)


def test_posnet_attn_shared_layers_with_separate_stacks_gives_one_table_per_stack(tiny_model):
    """posnet_attn_share_layers without posnet_shared: the layers of a stack share its table, the stacks don't."""
    model = tiny_model(position_encoding="posnet_attn", posnet_shared=False)
    encoder, decoder = model.model.encoder.position_encoding, model.model.decoder.position_encoding
    assert encoder.layer_kernels(0) is encoder.layer_kernels(1)
    assert decoder.layer_kernels(0) is decoder.layer_kernels(1)
    assert decoder.layer_kernels(0) is not encoder.layer_kernels(0)


def test_posnet_attn_caches_transformed_values(source_batch, target_batch, tiny_model):
    """In incremental decoding the self-attention cache holds σ(v_j φ_j) + v_j, so a step transforms one value."""
    model = tiny_model(position_encoding="posnet_attn")
    decoder = model.model.decoder
    src, mask = source_batch()
    tgt = target_batch()[:, :3]
    with torch.no_grad():
        out = model(input_ids=src, attention_mask=mask, decoder_input_ids=tgt, use_cache=True)
        attention = decoder.layers[0].self_attn
        hidden = decoder.embed_tokens(tgt) * decoder.embed_scale  # PosNet-Attn leaves the embeddings alone
        raw = attention.v_proj(hidden).view(3, 3, attention.num_heads, -1).transpose(1, 2)  # (B, H, 3, d_k)
        expected = decoder.position_encoding.transform_values(0, raw, torch.arange(3)[None])
    cached = out.past_key_values.self_attention_cache.layers[0].values
    torch.testing.assert_close(cached, expected)
    assert not torch.allclose(cached, raw)


def test_decoder_gets_positional_kernels(source_batch, target_batch, tiny_model):
    """Reference trap (a) fixed: the decoder uses PosNet too. Changing the kernel of target position 2 changes the
    decoder's logits from position 2 on (encoder output held fixed) and leaves earlier positions alone."""
    model = tiny_model(position_encoding="posnet_embed")
    src, mask = source_batch()
    tgt = target_batch()
    with torch.no_grad():
        encoder_outputs = model.get_encoder()(input_ids=src, attention_mask=mask)
        before = model(encoder_outputs=encoder_outputs, attention_mask=mask, decoder_input_ids=tgt).logits
        model.model.decoder.position_encoding.network.kernels[2].mul_(5.0)
        after = model(encoder_outputs=encoder_outputs, attention_mask=mask, decoder_input_ids=tgt).logits
    torch.testing.assert_close(after[:, :2], before[:, :2])
    assert (after[:, 2:] - before[:, 2:]).abs().amax() > 1e-3


def test_left_padding_does_not_change_a_sources_encoding(source_batch, tiny_model):
    """Reference trap (b) fixed: kernels follow the position from the start of each sequence, so a left-padded
    source (the reference's layout) is encoded exactly like the same source alone."""
    model = tiny_model(position_encoding="posnet_embed")
    src, mask = source_batch()
    length = int(mask[2].sum())
    left_padded = torch.cat([torch.full((1, src.shape[1] - length), PAD), src[2:3, :length]], dim=1)
    left_mask = (left_padded != PAD).long()
    with torch.no_grad():
        alone = model.get_encoder()(input_ids=src[2:3, :length]).last_hidden_state
        padded = model.get_encoder()(input_ids=left_padded, attention_mask=left_mask).last_hidden_state
    torch.testing.assert_close(padded[:, -length:], alone, atol=1e-5, rtol=1e-4)


@pytest.mark.parametrize("shared", [True, False])
def test_encoder_and_decoder_share_one_posnet_by_default_and_after_loading(shared, tmp_path, tiny_model):
    """posnet_shared=True: one network (saved once) serves both stacks, also after save/load; False: two."""
    model = tiny_model(position_encoding="posnet_embed", posnet_shared=shared)
    encoder_network = model.model.encoder.position_encoding.network
    assert (model.model.decoder.position_encoding.network is encoder_network) == shared
    kernel_keys = [key for key in model.state_dict() if key.endswith("network.kernels")]
    assert len(kernel_keys) == (1 if shared else 2)
    model.save_pretrained(tmp_path)
    loaded = MarianPosEncForConditionalGeneration.from_pretrained(tmp_path)
    loaded_network = loaded.model.encoder.position_encoding.network
    assert (loaded.model.decoder.position_encoding.network is loaded_network) == shared
    torch.testing.assert_close(loaded_network.kernels, encoder_network.kernels, atol=0, rtol=0)


def test_shared_posnet_counts_its_parameters_once(tiny_model):
    """Sharing halves PosNet's parameters: the shared model has exactly one network fewer."""
    count = {
        shared: sum(
            p.numel() for p in tiny_model(position_encoding="posnet_embed", posnet_shared=shared).parameters()
        )
        for shared in (True, False)
    }
    network = tiny_model(position_encoding="posnet_embed").model.encoder.position_encoding.network
    assert count[False] - count[True] == sum(p.numel() for p in network.parameters())


@pytest.mark.parametrize(
    ("overrides", "message"),
    [
        ({"posnet_activation": "swishy"}, "posnet_activation='swishy'.*relu"),
        ({"posnet_dim": 0}, "posnet_dim=0"),
        ({"posnet_dropout": 1.0}, "posnet_dropout=1.0"),
        (
            {
                "position_encoding": "posnet_attn",
                "posnet_attn_share_layers": True,
                "decoder_attention_heads": 2,
            },
            "decoder_attention_heads=2",
        ),
    ],
)
def test_bad_posnet_hyperparameters_fail_at_config_time(overrides, message, tiny_config):
    """Impossible PosNet settings raise a ValueError naming the value when the config is built."""
    with pytest.raises(ValueError, match=message):
        tiny_config(**{"position_encoding": "posnet_embed", **overrides})


@pytest.mark.parametrize(
    "mask",
    [
        [[1, 1, 1, 1]],
        [[1, 1, 1, 1], [1, 1, 0, 0]],
        [[0, 0, 1, 1], [1, 1, 1, 0]],
        [[1, 1, 0, 0], [1, 0, 0, 0]],
    ],
    ids=["unpadded", "right-padded", "left-and-right", "no-full-row"],
)
def test_consecutive_test_with_the_span_agrees_with_the_positions(mask):
    """Given the span the model passes (no read-back of the positions), the batch's shared positions are found
    consecutive exactly when they are, for every padding layout the model produces, and the kernel product
    with the span equals the one that reads the positions; decoding-step positions (a range from the cache
    length) take the range."""
    positions = positions_from_padding_mask(torch.tensor(mask), 4, "cpu")
    shared = positions.amax(0)
    span = (int(positions.min()), int(positions.max()))
    consecutive = shared.tolist() == list(range(int(shared[0]), int(shared[0]) + 4))
    assert first_of_consecutive(shared, span) == (int(shared[0]) if consecutive else None)
    assert first_of_consecutive(shared, span) == first_of_consecutive(shared)
    inputs, kernels = torch.randn(len(mask), 4, 1, 3), torch.randn(8, 1, 3, 3)
    torch.testing.assert_close(
        position_kernel_product(inputs, kernels, positions, span),
        position_kernel_product(inputs, kernels, positions),
        atol=0,
        rtol=0,
    )
    assert first_of_consecutive(torch.arange(5, 6), (5, 5)) == 5
