"""Paper 2's ablation variants: relative attention (Table 6, Fig. 2) and the LightConv → rPosNet chain (Appendix E,
Table 7), against direct computations of their equations."""

import math

import pytest
import torch

from hf_posenc.base import (
    DECODER_SELF_ATTENTION,
    ENCODER_SELF_ATTENTION,
    PositionContext,
    positions_from_padding_mask,
)
from hf_posenc.mixer_lightconv import LightConv
from hf_posenc.mixer_relative import RelativeAttention
from study.tables import comparison_tables
from tests.helpers import decode_with_cache

D, H, DH = 32, 4, 8  # tests.helpers.TINY_FIELDS
gelu = torch.nn.functional.gelu
SITES = [ENCODER_SELF_ATTENTION, DECODER_SELF_ATTENTION]


def site_inputs(site, length=9, cut=6):
    """Two rows of random hidden states (2, L, D), the mask transformers hands the site and the positions the
    model computes, (2|1, L). Encoder: the second row padded after `cut` tokens, a boolean SDPA mask (2, 1, L, L),
    positions counted from the padding. Decoder: no mask (causality implied), positions 0..L-1."""
    hidden = torch.randn(2, length, D)
    if site == DECODER_SELF_ATTENTION:
        return hidden, None, torch.arange(length)[None]
    padding = torch.ones(2, length, dtype=torch.long)
    padding[1, cut:] = 0
    mask = padding.bool()[:, None, None, :].expand(2, 1, length, length)
    return hidden, mask, positions_from_padding_mask(padding, length, hidden.device)


def self_context(positions):
    return PositionContext(None, positions, positions)


def allowed(mask, n, m, row):
    """Whether query n may read key m in `row`: the boolean mask, or causality where there is none."""
    return m <= n if mask is None else bool(mask[row, 0, n, m])


def position(positions, row, index):
    return int(positions[row if positions.shape[0] > 1 else 0, index])


def heads(x):
    return x.view(x.shape[0], -1, H, DH).transpose(1, 2)  # (B, H, L, Dh)


def merge_heads(x):
    return x.transpose(1, 2).reshape(x.shape[0], -1, D)  # (B, L, D)


# Relative attention (paper 2 §7.2, Table 6)


@pytest.mark.parametrize("gated", [True, False], ids=["gated", "ungated"])
@pytest.mark.parametrize("site", SITES)
def test_relative_attention_follows_its_equation_pair_by_pair(site, gated, tiny_config):
    """scores = q_n · a^K[clip(m − n, K)]ᵀ/√D_h, masked (padding, causality), softmax over the keys, values from
    the tokens (LayerNorm(GELU(W^V x)) when gated), gate GELU(W^G y) when gated, then W^O; offsets up to ±8 reach
    beyond K = 2, so clipping is exercised."""
    torch.manual_seed(0)
    config = tiny_config(relative_attention_max_relative_position=2, relative_attention_gating=gated)
    mixer = RelativeAttention(config, site, 0).eval()
    hidden, mask, positions = site_inputs(site)
    out, weights = mixer(hidden, attention_mask=mask, context=self_context(positions), output_attentions=True)

    query = heads(mixer.q_proj(hidden))
    values = mixer.v_proj(hidden)
    if gated:
        values = mixer.gating.value_norm(gelu(values))
    values = heads(values)
    table = mixer.relative_keys.view(5, H, DH)
    expected = torch.zeros(2, H, 9, 9)
    for row in range(2):
        for n in range(9):
            scores = torch.full((H, 9), -math.inf)
            for m in range(9):
                if allowed(mask, n, m, row):
                    offset = max(-2, min(2, position(positions, row, m) - position(positions, row, n)))
                    scores[:, m] = (query[row, :, n] * table[offset + 2]).sum(-1) / math.sqrt(DH)
            expected[row, :, n] = torch.softmax(scores, dim=-1)
    torch.testing.assert_close(weights, expected)
    context = merge_heads(expected @ values)
    if gated:
        context = context * gelu(mixer.gating.gate_proj(hidden))
    torch.testing.assert_close(out, mixer.out_proj(context))


@pytest.mark.parametrize("site", SITES)
def test_relative_attention_weights_ignore_the_key_tokens_contents(site, tiny_config):
    """Token–position interactions only: changing one token changes the weights of its own query row and nothing
    else (no query–key dot product), while the outputs of the queries that read it change through its value."""
    torch.manual_seed(0)
    mixer = RelativeAttention(tiny_config(), site, 0).eval()
    hidden = torch.randn(1, 7, D)
    changed = hidden.clone()
    changed[0, 2] = torch.randn(D)
    context = self_context(torch.arange(7)[None])
    out, weights = mixer(hidden, context=context, output_attentions=True)
    changed_out, changed_weights = mixer(changed, context=context, output_attentions=True)
    others = [n for n in range(7) if n != 2]
    torch.testing.assert_close(changed_weights[:, :, others], weights[:, :, others], atol=0, rtol=0)
    assert not torch.allclose(changed_weights[:, :, 2], weights[:, :, 2])
    readers = [n for n in others if site == ENCODER_SELF_ATTENTION or n > 2]  # queries that read token 2
    assert (changed_out[0, readers] - out[0, readers]).abs().amax(-1).min() > 1e-4


@pytest.mark.parametrize("site", SITES)
def test_relative_attention_gives_the_same_output_for_every_mask_form(site, tiny_config):
    """transformers hands a mixer no mask (unpadded; causal implied in the decoder), a boolean mask (SDPA) or an
    additive float mask (eager): all three give the same output."""
    torch.manual_seed(0)
    mixer = RelativeAttention(tiny_config(relative_attention_max_relative_position=2), site, 0).eval()
    hidden = torch.randn(2, 6, D)
    context = self_context(torch.arange(6)[None])
    boolean = torch.ones(6, 6, dtype=torch.bool)
    if site == DECODER_SELF_ATTENTION:
        boolean = boolean.tril()
    boolean = boolean[None, None].expand(2, 1, 6, 6)
    additive = torch.zeros(2, 1, 6, 6).masked_fill(~boolean, torch.finfo(torch.float32).min)
    outputs = [mixer(hidden, attention_mask=mask, context=context)[0] for mask in (None, boolean, additive)]
    for output in outputs[1:]:
        torch.testing.assert_close(output, outputs[0])


def test_relative_attention_has_queries_and_relative_keys_but_no_key_projection_or_value_table(tiny_model):
    """Paper 2 Table 6's counts (63.6M vs the Transformer's 66.5M): content attention minus W^K, plus one
    (2K+1) × D table a^K per self-attention site and no a^V; gating adds W^G and the value LayerNorm (Eq. 4)."""
    fixed = dict(position_encoding="sinusoidal", relative_attention_max_relative_position=3)
    at_both = dict(encoder_self_attention="relative_attention", decoder_self_attention="relative_attention")
    content = tiny_model(**fixed).num_parameters()
    ungated = tiny_model(**fixed, **at_both, relative_attention_gating=False).num_parameters()
    gated = tiny_model(**fixed, **at_both).num_parameters()
    sites = 4  # 2 encoder + 2 decoder self-attention layers
    assert ungated - content == sites * (-(D * D + D) + 7 * D)
    assert gated - ungated == sites * (D * D + D + 2 * D)
    mixer = tiny_model(**at_both).model.encoder.layers[0].self_attn
    assert {name.split(".")[0] for name, _ in mixer.named_parameters()} == {
        "q_proj",
        "v_proj",
        "out_proj",
        "relative_keys",
        "gating",
    }


def test_relative_attention_defaults_and_sites(tiny_config):
    """Gated by default with K = 16 (paper 2 §5.2) and no input position embedding of its own (like Shaw); the
    ungated counterpart is a variant and a row of the gating table; cross-attention is refused by name."""
    config = tiny_config(
        encoder_self_attention="relative_attention", decoder_self_attention="relative_attention"
    )
    assert config.relative_attention_gating is True
    assert config.relative_attention_max_relative_position == 16
    assert (config.encoder_position_encoding, config.decoder_position_encoding) == ("none", "none")
    assert RelativeAttention.variants == {"no-gating": {"relative_attention_gating": False}}
    gating_rows = {system.name: system.overrides for system in comparison_tables()["gating"]}
    assert gating_rows["relative_attention-no-gating"]["relative_attention_gating"] is False
    assert "relative_attention_gating" not in gating_rows["relative_attention"]
    with pytest.raises(ValueError, match="cross_attention='relative_attention' cannot be used there"):
        tiny_config(cross_attention="relative_attention")


def test_relative_attention_draws_the_similarity_of_its_relative_keys(tiny_model):
    """What relative attention learned about positions is a^K: one (2K+1) × (2K+1) cosine-similarity map per
    layer and site, drawn without changing the model."""
    from hf_posenc.analysis.position_plots import position_panels

    model = tiny_model(
        encoder_self_attention="relative_attention",
        decoder_self_attention="relative_attention",
        relative_attention_max_relative_position=3,
    )
    panels = position_panels(model, positions=12)
    assert [panel.title for panel in panels] == [
        "enc L0 self: a^K similarity",
        "enc L1 self: a^K similarity",
        "dec L0 self: a^K similarity",
        "dec L1 self: a^K similarity",
    ]
    keys = model.model.encoder.layers[0].self_attn.relative_keys.detach()
    normalised = torch.nn.functional.normalize(keys, dim=-1)
    torch.testing.assert_close(panels[0].data, normalised @ normalised.T)


MIXERS_AT_BOTH_SITES = {
    "relative_attention": dict(
        encoder_self_attention="relative_attention",
        decoder_self_attention="relative_attention",
        relative_attention_max_relative_position=1,
    ),
    "lightconv-global": dict(
        encoder_self_attention="lightconv",
        decoder_self_attention="lightconv",
        lightconv_kernel_radius=1,
        lightconv_gating="gelu",
        lightconv_global_context=True,
    ),
}


@pytest.mark.parametrize("overrides", MIXERS_AT_BOTH_SITES.values(), ids=MIXERS_AT_BOTH_SITES.keys())
def test_clipped_windows_decode_exactly_with_the_cache_and_ignore_padding(
    overrides, source_batch, target_batch, tiny_model
):
    """With a window of one or three keys, the 9 target and up to 11 source tokens reach far beyond it (the
    conformance suite's K = 16 never does): incremental decoding equals the full forward, and padding a row
    does not change its logits."""
    model = tiny_model(**overrides)
    src, mask = source_batch()
    tgt = target_batch()
    with torch.no_grad():
        encoder_outputs = model.get_encoder()(input_ids=src, attention_mask=mask)
        full = model(encoder_outputs=encoder_outputs, attention_mask=mask, decoder_input_ids=tgt).logits
        torch.testing.assert_close(
            decode_with_cache(model, encoder_outputs, mask, tgt), full, atol=1e-5, rtol=1e-4
        )
        for row in range(1, src.shape[0]):
            length = int(mask[row].sum())
            alone = model(input_ids=src[row : row + 1, :length], decoder_input_ids=tgt[row : row + 1]).logits
            torch.testing.assert_close(full[row : row + 1], alone, atol=1e-5, rtol=1e-4)


# LightConv → rPosNet (paper 2 Appendix E, Table 7)


def convolve(values, kernel, site, radius):
    """Depthwise convolution of (B, L, D) values with a per-head kernel (H, 2K+1), zero padded: centred in the
    encoder, causal in the decoder (Eq. 14)."""
    per_channel = kernel.repeat_interleave(DH, dim=0)[:, None]  # (D, 1, 2K+1)
    left, right = (2 * radius, 0) if site == DECODER_SELF_ATTENTION else (radius, radius)
    padded = torch.nn.functional.pad(values.transpose(1, 2), (left, right))
    return torch.nn.functional.conv1d(padded, per_channel, groups=D).transpose(1, 2)  # (B, L, D)


@pytest.mark.parametrize("site", SITES)
def test_light_convolution_without_glu_convolves_the_plain_values(site, tiny_config):
    """Table 7 "Light Convolution": Eq. 14 with W^V x (D → D) in place of GLU(W^V x), and no gate."""
    torch.manual_seed(0)
    mixer = LightConv(tiny_config(lightconv_kernel_radius=2, lightconv_gating="none"), site, 0).eval()
    assert mixer.v_proj.out_features == D and mixer.gating is None
    hidden = torch.randn(2, 9, D)
    out, _ = mixer(hidden, context=self_context(torch.arange(9)[None]))
    expected = convolve(mixer.v_proj(hidden), torch.softmax(mixer.kernel, -1), site, 2)
    torch.testing.assert_close(out, mixer.out_proj(expected), atol=1e-5, rtol=1e-5)


@pytest.mark.parametrize("site", SITES)
def test_gelu_gating_replaces_glu_with_eq_4(site, tiny_config):
    """Table 7 "+ GeLU Gating": [Σ_k softmax(W_h)_k · LayerNorm(GELU(W^V x))_{n+k−K}] ⊙ GELU(W^G y_n), then W^O."""
    torch.manual_seed(0)
    mixer = LightConv(tiny_config(lightconv_kernel_radius=2, lightconv_gating="gelu"), site, 0).eval()
    assert mixer.v_proj.out_features == D
    hidden = torch.randn(2, 9, D)
    out, _ = mixer(hidden, context=self_context(torch.arange(9)[None]))
    values = mixer.gating.value_norm(gelu(mixer.v_proj(hidden)))
    expected = convolve(values, torch.softmax(mixer.kernel, -1), site, 2) * gelu(
        mixer.gating.gate_proj(hidden)
    )
    torch.testing.assert_close(out, mixer.out_proj(expected), atol=1e-5, rtol=1e-5)


@pytest.mark.parametrize("site", SITES)
def test_global_context_spreads_the_outer_taps_over_the_whole_sequence(site, tiny_config):
    """Table 7 "+ Global Context": w_nm = exp W_h[clip(tap, 0, 2K)] / Σ_m' exp W_h[clip(tap', 0, 2K)] over the keys
    the row may read (padding, causality); far keys weigh what the outermost key of the window weighs."""
    torch.manual_seed(0)
    radius = 1
    config = tiny_config(lightconv_kernel_radius=radius, lightconv_global_context=True)
    mixer = LightConv(config, site, 0).eval()
    _, mask, positions = site_inputs(site)
    weights = mixer.mixing_weights(mask, self_context(positions), torch.float32)  # (2|1, H, 9, 9)
    last_tap = 2 * radius if site == DECODER_SELF_ATTENTION else radius
    for row in range(weights.shape[0]):
        for n in range(9):
            logits = torch.full((H, 9), -math.inf)
            for m in range(9):
                if allowed(mask, n, m, row):
                    offset = position(positions, row, m) - position(positions, row, n)
                    tap = max(0, min(2 * radius, offset + last_tap))
                    logits[:, m] = mixer.kernel[:, tap]
            torch.testing.assert_close(weights[row, :, n], torch.softmax(logits, dim=-1))
    unpadded = weights[0]  # (H, 9, 9)
    left_edge = last_tap  # keys at n − last_tap and before share tap 0
    for n in range(9):
        for m in range(n - left_edge):
            torch.testing.assert_close(unpadded[:, n, m], unpadded[:, n, n - left_edge], atol=0, rtol=0)
        for m in range(n + radius + 1, 9):
            expected = torch.zeros(H) if site == DECODER_SELF_ATTENTION else unpadded[:, n, n + radius]
            torch.testing.assert_close(unpadded[:, n, m], expected, atol=0, rtol=0)
    assert (unpadded[:, 8, : 8 - left_edge] > 0).all()  # global: the far keys are read, not cut off


def test_lightconv_defaults_keep_the_glu_model_with_a_local_window(tiny_config):
    """The new options default to the model Eq. 14 describes: GLU values (W^V: D → 2D), no Eq. 4 gate, no weight
    on keys outside the window; unknown gatings are refused with the allowed names."""
    config = tiny_config(encoder_self_attention="lightconv", decoder_self_attention="lightconv")
    assert (config.lightconv_gating, config.lightconv_global_context) == ("glu", False)
    mixer = LightConv(config, ENCODER_SELF_ATTENTION, 0)
    assert mixer.v_proj.out_features == 2 * D and mixer.gating is None
    positions = torch.arange(40)[None]
    weights = mixer.mixing_weights(None, self_context(positions), torch.float32)[0]  # (H, 40, 40)
    assert (weights[:, 20, 37:] == 0).all() and (weights[:, 20, :4] == 0).all()  # K = 16 around query 20
    with pytest.raises(
        ValueError, match="lightconv_gating='glu_gelu' is not known; allowed values: glu, none, gelu"
    ):
        tiny_config(lightconv_gating="glu_gelu")
