"""Gated position-based attention (paper 2) and the position-only mixers, against direct implementations."""

import json
import math

import pytest
import torch
from torch.utils._python_dispatch import TorchDispatchMode
from torch.utils._pytree import tree_leaves

from hf_posenc.base import (
    CROSS_ATTENTION,
    DECODER_SELF_ATTENTION,
    ENCODER_SELF_ATTENTION,
    PositionContext,
)
from hf_posenc.mixer_fourier import FourierNet
from hf_posenc.mixer_gated import APosNetAttention, RPosNetAttention
from hf_posenc.mixer_gaussian import GaussianNet
from hf_posenc.mixer_lightconv import LightConv
from hf_posenc.posenc_absolute import marian_sinusoid_table

ALL_SITES_RPOSNET = dict(
    encoder_self_attention="rposnet",
    decoder_self_attention="rposnet",
    cross_attention="rposnet",
    rposnet_max_relative_position=3,
    rposnet_length_ratio=1.4,
    position_encoding="learned",
)
ALL_SITES_APOSNET = dict(
    encoder_self_attention="aposnet", decoder_self_attention="aposnet", cross_attention="aposnet"
)


def context(query_positions, key_positions):
    return PositionContext(None, torch.as_tensor(query_positions)[None], torch.as_tensor(key_positions)[None])


def test_rposnet_energies_follow_eq_9_and_10_with_the_length_ratio(tiny_config):
    """Eq. 9-10 evaluated pair by pair equals the vectorised energies, γ applied in cross-attention."""
    torch.manual_seed(0)
    mixer = RPosNetAttention(tiny_config(**ALL_SITES_RPOSNET), CROSS_ATTENTION, 0)
    queries, keys = list(range(5)), list(range(9))
    energies = mixer.energies_for(context(queries, keys))[0]  # (H, q, k)
    K, H, Dh = 3, mixer.num_heads, mixer.head_dim
    for n in queries:
        q = mixer.q_proj(mixer.position_vectors[n]).view(H, Dh)
        for m in keys:
            d = mixer.relative_embeddings[max(-K, min(K, math.floor(1.4 * n) - m)) + K].view(H, Dh)
            torch.testing.assert_close(energies[:, n, m], (q * d).sum(-1) / math.sqrt(Dh))


def test_aposnet_energies_follow_eq_8_on_sinusoids(tiny_config):
    """Eq. 8: (W^Q ñ)(W^K m̃)ᵀ/√D_h with ñ, m̃ the sinusoids of the query and key positions."""
    torch.manual_seed(0)
    mixer = APosNetAttention(tiny_config(**ALL_SITES_APOSNET), ENCODER_SELF_ATTENTION, 0)
    table = marian_sinusoid_table(20, 32)
    positions = [0, 3, 7, 19]
    energies = mixer.energies_for(context(positions, positions))[0]
    H, Dh = mixer.num_heads, mixer.head_dim
    q = mixer.q_proj(table[positions]).view(-1, H, Dh).transpose(0, 1)
    k = mixer.k_proj(table[positions]).view(-1, H, Dh).transpose(0, 1)
    torch.testing.assert_close(energies, q @ k.transpose(1, 2) / math.sqrt(Dh))


@pytest.mark.parametrize("overrides", [ALL_SITES_RPOSNET, ALL_SITES_APOSNET], ids=["rposnet", "aposnet"])
def test_precomputed_energies_give_identical_outputs_and_reload_folded(
    overrides, tmp_path, source_batch, target_batch, tiny_model
):
    """Folding keeps forward and generate outputs, drops W^Q/W^K/position tables, and survives save/load."""
    from transformers import AutoModelForSeq2SeqLM

    model = tiny_model(**overrides)
    src, mask = source_batch()
    tgt = target_batch()
    kwargs = dict(attention_mask=mask, num_beams=4, max_new_tokens=8, output_scores=True)
    with torch.no_grad():
        before = model(input_ids=src, attention_mask=mask, decoder_input_ids=tgt).logits
    generated_before = model.generate(src, return_dict_in_generate=True, **kwargs)
    parameters_before = model.num_parameters()

    model.precompute_position_attention()
    assert model.config.position_attention_precomputed
    names = [name for name, _ in model.named_parameters()]
    assert not any(".q_proj." in n or ".k_proj." in n or "position_vectors" in n for n in names)
    assert model.num_parameters() != parameters_before
    with torch.no_grad():
        after = model(input_ids=src, attention_mask=mask, decoder_input_ids=tgt).logits
    torch.testing.assert_close(after, before, atol=1e-5, rtol=0)
    generated_after = model.generate(src, return_dict_in_generate=True, **kwargs)
    assert generated_after.sequences.tolist() == generated_before.sequences.tolist()
    for step_after, step_before in zip(generated_after.scores, generated_before.scores, strict=True):
        finite = torch.isfinite(step_before)
        torch.testing.assert_close(step_after[finite], step_before[finite], atol=1e-5, rtol=0)

    model.save_pretrained(tmp_path)
    loaded = AutoModelForSeq2SeqLM.from_pretrained(tmp_path).eval()
    assert loaded.config.position_attention_precomputed
    with torch.no_grad():
        reloaded = loaded(input_ids=src, attention_mask=mask, decoder_input_ids=tgt).logits
    torch.testing.assert_close(reloaded, after, atol=0, rtol=0)


def test_gating_equals_the_beta_weighted_sum_of_eq_5_to_7():
    """Without LayerNorm, [Σ α·GELU(v)] ⊙ g ≈ Σ α β ⊙ v, β_nm = g_n ⊙ σ(1.702 v_m), and β ratios ignore n."""
    torch.manual_seed(0)
    alpha = torch.softmax(torch.randn(4, 6), dim=-1)  # (N, M)
    values = torch.randn(6, 8)  # (M, D)
    gates = torch.nn.functional.gelu(torch.randn(4, 8))  # (N, D)
    gated = (alpha @ torch.nn.functional.gelu(values)) * gates  # Eq. 4 without LayerNorm
    beta = gates[:, None, :] * torch.sigmoid(1.702 * values)[None]  # Eq. 6, (N, M, D)
    weighted = (alpha[:, :, None] * beta * values[None]).sum(1)  # Eq. 5
    # The sigmoid approximation of GELU is within ~0.021·|v| of it, which bounds the difference.
    bound = 0.021 * (alpha @ values.abs()) * gates.abs()
    assert ((gated - weighted).abs() <= bound + 1e-6).all()
    assert (gated - weighted).abs().max() > 0  # the approximation is not exact: the bound is doing work
    ratios = beta[:, 0] / beta[:, 1]  # Eq. 7: the same for every query n
    torch.testing.assert_close(ratios, ratios[:1].expand_as(ratios))


def test_attention_gating_adds_eq_4_to_content_attention(tiny_model):
    """`attention_gating` gives content self-attention W^G (D² + D) and a LayerNorm (2D), and applies Eq. 4."""
    plain = tiny_model()
    gated = tiny_model(attention_gating=True)
    sites = plain.config.encoder_layers + plain.config.decoder_layers
    assert gated.num_parameters() - plain.num_parameters() == sites * (32 * 32 + 32 + 2 * 32)
    attention = gated.model.encoder.layers[0].self_attn
    hidden = torch.randn(1, 5, 32)
    ctx = context(range(5), range(5))
    out, _ = attention(hidden, context=ctx)
    gelu = torch.nn.functional.gelu
    heads = lambda x: x.view(1, 5, 4, 8).transpose(1, 2)  # noqa: E731
    q, k = heads(attention.q_proj(hidden)), heads(attention.k_proj(hidden))
    v = heads(attention.gating.value_norm(gelu(attention.v_proj(hidden))))
    mixed = (torch.softmax(q @ k.transpose(2, 3) / math.sqrt(8), -1) @ v).transpose(1, 2).reshape(1, 5, 32)
    expected = attention.out_proj(mixed * gelu(attention.gating.gate_proj(hidden)))
    torch.testing.assert_close(out, expected)


def test_fourier_mixing_is_the_real_part_of_the_dft_over_each_sequence(tiny_config):
    """Eq. 11: weights are Re(DFT) over the unpadded length M of each row, unitary (1/√M) as the reference's."""
    mixer = FourierNet(tiny_config(encoder_self_attention="fourier"), ENCODER_SELF_ATTENTION, 0)
    positions = torch.tensor([[0, 1, 2, 3, 4, 5], [0, 1, 2, 3, 3, 3]])  # second row padded after 4 tokens
    mask = torch.tensor([[1] * 6, [1, 1, 1, 1, 0, 0]], dtype=torch.bool)[:, None, None, :].expand(2, 1, 6, 6)
    weights = mixer.mixing_weights(mask, PositionContext(None, positions, positions), torch.float32)
    for row, length in ((0, 6), (1, 4)):
        dft = torch.fft.fft(torch.eye(length), dim=0, norm="ortho").real.float()  # Re(exp(-2πi nm/M)) / √M
        torch.testing.assert_close(weights[row, 0, :length, :length], dft, atol=1e-6, rtol=0)
    assert (weights[1, 0, :, 4:] == 0).all()


def test_fourier_is_rejected_in_the_decoder_with_a_clear_message(tiny_config):
    """FourierNet cannot be causal (paper 2 §5.2): validation names the site and the allowed ones."""
    with pytest.raises(ValueError, match="decoder_self_attention='fourier'.*encoder_self_attention"):
        tiny_config(decoder_self_attention="fourier")


def test_gaussian_weights_are_unnormalised_normal_densities_around_per_head_offsets(tiny_config):
    """Eq. 12: W_nm = exp(-(m - n - o_h)²/2)/√(2π), o_h cycling over heads as in the reference code (-1, 0, 1
    encoder; -1, 0 decoder)."""
    for site, offsets in ((ENCODER_SELF_ATTENTION, (-1, 0, 1)), (DECODER_SELF_ATTENTION, (-1, 0))):
        mixer = GaussianNet(tiny_config(), site, 0)
        weights = mixer.mixing_weights(None, context(range(7), range(7)), torch.float32)[0]
        for h in range(4):
            for n in range(7):
                for m in range(7):
                    expected = math.exp(-0.5 * (m - n - offsets[h % len(offsets)]) ** 2) / math.sqrt(
                        2 * math.pi
                    )
                    if site == DECODER_SELF_ATTENTION and m > n:
                        expected = 0.0
                    assert weights[h, n, m].item() == pytest.approx(expected, abs=1e-6)


@pytest.mark.parametrize("site", [ENCODER_SELF_ATTENTION, DECODER_SELF_ATTENTION])
def test_lightconv_equals_a_depthwise_convolution(site, tiny_config):
    """Eq. 14: a softmax-normalised kernel shared per head, centred (encoder) or causal (decoder) zero padding."""
    torch.manual_seed(0)
    mixer = LightConv(tiny_config(lightconv_kernel_radius=2), site, 0).eval()
    hidden = torch.randn(2, 9, 32)
    out, _ = mixer(hidden, context=context(range(9), range(9)))
    values = torch.nn.functional.glu(mixer.v_proj(hidden), dim=-1).transpose(1, 2)  # (B, D, L)
    kernel = torch.softmax(mixer.kernel, -1).repeat_interleave(8, dim=0)[:, None]  # (D, 1, 5) per head
    left, right = (4, 0) if site == DECODER_SELF_ATTENTION else (2, 2)
    convolved = torch.nn.functional.conv1d(torch.nn.functional.pad(values, (left, right)), kernel, groups=32)
    torch.testing.assert_close(out, mixer.out_proj(convolved.transpose(1, 2)), atol=1e-5, rtol=1e-5)


def test_rposnet_layers_of_a_stack_share_one_position_table_that_survives_save_and_load(tmp_path, tiny_model):
    """Paper 2 §4.1: ñ is shared across layers; one table per stack (decoder self + cross share the decoder's),
    stored once in the checkpoint and tied again after loading."""
    from transformers import AutoModelForSeq2SeqLM

    def tables(model):
        return sorted(name for name, _ in model.named_parameters() if "position_vectors" in name)

    def read_tables(model):
        encoder, decoder = model.model.encoder.layers, model.model.decoder.layers
        return [
            [layer.self_attn.query_position_vectors() for layer in encoder],
            [m.query_position_vectors() for layer in decoder for m in (layer.self_attn, layer.encoder_attn)],
        ]

    model = tiny_model(**ALL_SITES_RPOSNET)
    assert tables(model) == [
        "model.decoder.layers.0.self_attn.position_vectors",
        "model.encoder.layers.0.self_attn.position_vectors",
    ]
    for stack in read_tables(model):
        assert all(table is stack[0] for table in stack)
    assert read_tables(model)[0][0] is not read_tables(model)[1][0]

    model.save_pretrained(tmp_path)
    loaded = AutoModelForSeq2SeqLM.from_pretrained(tmp_path).eval()
    assert tables(loaded) == tables(model)
    for stack, original in zip(read_tables(loaded), read_tables(model), strict=True):
        assert all(table is stack[0] for table in stack)
        assert torch.equal(stack[0], original[0])


def test_shared_position_table_is_dropped_only_when_no_unfolded_layer_reads_it(
    source_batch, target_batch, tiny_model
):
    """Folding layer by layer keeps ñ while another rPosNet layer of the stack still computes its energies."""
    model = tiny_model(**ALL_SITES_RPOSNET)
    src, mask = source_batch()
    tgt = target_batch()
    with torch.no_grad():
        before = model(input_ids=src, attention_mask=mask, decoder_input_ids=tgt).logits
    encoder_layers = model.model.encoder.layers
    encoder_layers[0].self_attn.precompute_position_attention()
    assert hasattr(encoder_layers[0].self_attn, "position_vectors")  # layer 1 still needs it
    with torch.no_grad():
        half = model(input_ids=src, attention_mask=mask, decoder_input_ids=tgt).logits
    torch.testing.assert_close(half, before, atol=1e-5, rtol=0)
    encoder_layers[1].self_attn.precompute_position_attention()
    assert not hasattr(encoder_layers[0].self_attn, "position_vectors")
    assert hasattr(model.model.decoder.layers[0].self_attn, "position_vectors")  # the decoder's own table


def test_each_stack_defaults_to_the_input_embedding_paper_2_pairs_with_its_self_attention_mixer(tiny_config):
    """Paper 2 §5.2: rPosNet with learned absolute embeddings, every other mixer with sinusoids; per stack."""
    config = tiny_config(encoder_self_attention="rposnet", decoder_self_attention="aposnet")
    assert (config.encoder_position_encoding, config.decoder_position_encoding) == ("learned", "sinusoidal")
    config = tiny_config(decoder_self_attention="rposnet", cross_attention="rposnet")
    assert (config.encoder_position_encoding, config.decoder_position_encoding) == ("sinusoidal", "learned")
    config = tiny_config(cross_attention="rposnet")  # cross-attention does not decide a stack's input
    assert (config.encoder_position_encoding, config.decoder_position_encoding) == (
        "sinusoidal",
        "sinusoidal",
    )


def test_an_explicit_position_encoding_wins_over_the_recommended_one(tiny_config):
    """The user's choice (per stack or with the shorthand) is never replaced by the mixer's recommendation."""
    config = tiny_config(
        encoder_self_attention="rposnet", decoder_self_attention="rposnet", encoder_position_encoding="none"
    )
    assert (config.encoder_position_encoding, config.decoder_position_encoding) == ("none", "learned")
    config = tiny_config(encoder_self_attention="rposnet", position_encoding="sinusoidal")
    assert (config.encoder_position_encoding, config.decoder_position_encoding) == (
        "sinusoidal",
        "sinusoidal",
    )
    config = tiny_config(encoder_self_attention="gaussian", encoder_position_encoding="learned")
    assert config.encoder_position_encoding == "learned"


@pytest.mark.parametrize(
    "overrides",
    [
        dict(encoder_self_attention="rposnet", decoder_self_attention="rposnet"),
        dict(
            encoder_self_attention="rposnet", decoder_self_attention="rposnet", position_encoding="sinusoidal"
        ),
        dict(decoder_self_attention="rposnet", encoder_position_encoding="learned"),
    ],
    ids=["recommended", "explicit-sinusoidal", "mixed"],
)
def test_resolved_position_encodings_round_trip_through_config_json(overrides, tmp_path, tiny_config):
    """config.json stores the resolved encodings, so a saved config reloads with exactly the same values
    (an explicit "sinusoidal" next to rPosNet must not come back as the recommended "learned")."""
    from hf_posenc import MarianPosEncConfig

    config = tiny_config(**overrides)
    config.save_pretrained(tmp_path)
    saved = json.loads((tmp_path / "config.json").read_text())
    assert saved["encoder_position_encoding"] == config.encoder_position_encoding
    assert saved["decoder_position_encoding"] == config.decoder_position_encoding
    reloaded = MarianPosEncConfig.from_pretrained(tmp_path)
    assert reloaded.to_dict() == config.to_dict()


def test_folded_decoder_reads_causal_softmax_rows_that_follow_changes_of_the_energies(tiny_config):
    """The cached causal weight table equals the softmax over keys 0..n of the folded energies, also after
    the energies change in place by loading or by a training step, and gradient-carrying calls still reach the
    energies."""
    from hf_posenc.base import additive_mask

    torch.manual_seed(0)
    config = tiny_config(**ALL_SITES_RPOSNET, position_attention_precomputed=True)
    mixer = RPosNetAttention(config, DECODER_SELF_ATTENTION, 0)
    torch.nn.init.normal_(mixer.energies)

    def direct(ctx):
        energies = mixer.energies_for(ctx)
        return torch.softmax(additive_mask(None, energies, ctx, is_causal=True), dim=-1)

    for ctx in (context(range(7), range(7)), context([5], range(6)), context([40], range(41))):
        with torch.no_grad():
            assert mixer.reads_causal_weight_table(None)
            torch.testing.assert_close(mixer.mixing_weights(None, ctx, torch.float32), direct(ctx))
    mixer.load_state_dict({**mixer.state_dict(), "energies": 3.0 * mixer.energies.detach()})  # in place
    with torch.no_grad():
        torch.testing.assert_close(mixer.mixing_weights(None, ctx, torch.float32), direct(ctx))
    assert not mixer.reads_causal_weight_table(None)  # grad enabled: the differentiable path
    mixer.mixing_weights(None, ctx, torch.float32).sum().backward()
    assert mixer.energies.grad is not None
    torch.optim.SGD([mixer.energies], lr=10.0).step()  # in place, after a forward with gradients
    with torch.no_grad():
        torch.testing.assert_close(mixer.mixing_weights(None, ctx, torch.float32), direct(ctx))


def test_model_folded_and_decoded_under_inference_mode_matches_the_unfolded_model(tiny_model):
    """Folding and decoding inside torch.inference_mode (tensors without version counters) works and agrees."""
    torch.manual_seed(0)
    model = tiny_model(**ALL_SITES_RPOSNET)
    source = torch.tensor([[5, 6, 7, 8, 2]])
    with torch.inference_mode():
        unfolded = model.generate(input_ids=source, max_new_tokens=6, num_beams=1, do_sample=False)
        model.precompute_position_attention()
        folded = model.generate(input_ids=source, max_new_tokens=6, num_beams=1, do_sample=False)
    torch.testing.assert_close(folded, unfolded)


class ElementsWritten(TorchDispatchMode):
    """Counts the elements of the tensors that the operators run under it write (views write none)."""

    def __init__(self):
        super().__init__()
        self.count = 0

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        out = func(*args, **(kwargs or {}))
        if not func.is_view:
            self.count += sum(t.numel() for t in tree_leaves(out) if isinstance(t, torch.Tensor))
        return out


def test_unfolded_aposnet_decoding_keeps_position_keys_and_copies_none_of_them_per_step(
    source_batch, tiny_model
):
    """Without gradients, aPosNet's keys W^K m̃ of all positions are projected once and kept; a decoding step
    reads its energies off its query times the kept keys, so it writes O(H k) elements, not its prefix's keys
    (k D); the energies equal Eq. 8 computed with gradients on, for any key positions, also after W^K changes."""
    model = tiny_model(decoder_self_attention="aposnet")
    mixer = model.model.decoder.layers[0].self_attn
    projected_rows = []
    mixer.k_proj.register_forward_hook(lambda module, args, out: projected_rows.append(args[0].shape[-2]))
    src, mask = source_batch()
    with torch.no_grad():
        model.generate(input_ids=src, attention_mask=mask, max_new_tokens=8, min_new_tokens=8, num_beams=1)
    assert projected_rows == [mixer.max_positions]  # one projection of the whole table, not one per step

    keys = mixer.max_positions - 4
    step = context([keys - 1], range(keys))  # the last query against its prefix
    with torch.no_grad(), ElementsWritten() as written:
        mixer.energies_for(step)
    assert written.count < keys * mixer.embed_dim

    doubled = {"model.decoder.layers.0.self_attn.k_proj.weight": 2.0 * mixer.k_proj.weight.detach()}
    model.load_state_dict({**model.state_dict(), **doubled})  # W^K changes in place
    for ctx in (step, context([5], range(6)), context([2, 9], [0, 4, 9, 13])):
        with torch.no_grad():
            kept = mixer.energies_for(ctx)
        torch.testing.assert_close(kept, mixer.energies_for(ctx))  # gradients on: computed directly
