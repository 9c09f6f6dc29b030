"""RPEHead / MPRHead (Chen et al. 2019): equations, layouts, per-head projections, RNN state and init."""

import math

import pytest
import torch
from conftest import source_batch, target_batch, tiny_config, tiny_model
from safetensors.torch import load_file, save_file
from transformers.cache_utils import DynamicCache

from hf_posenc import MarianPosEncConfig, MarianPosEncForConditionalGeneration, PosEncCache
from hf_posenc.base import PositionContext
from hf_posenc.posenc_recurrent import MPRHeadPositionEncoding, RPEHeadPositionEncoding

LAYOUTS = {"rpe_head": RPEHeadPositionEncoding, "mpr_head": MPRHeadPositionEncoding}


def at(positions: torch.Tensor) -> PositionContext:
    """The context an encoding's `embed` reads its tokens' positions from."""
    return PositionContext(None, positions, positions)


def paper_sinusoid(length: int, dim: int) -> torch.Tensor:
    """Eq. 1 as printed (interleaved sin/cos), then de-interleaved into Marian's [sin half : cos half]."""
    pe = torch.zeros(length, dim, dtype=torch.float64)
    for j in range(length):
        for i in range(dim // 2):
            pe[j, 2 * i] = math.sin(j / 10000 ** (2 * i / dim))
            pe[j, 2 * i + 1] = math.cos(j / 10000 ** (2 * i / dim))
    return torch.cat([pe[:, 0::2], pe[:, 1::2]], dim=-1)


def tanh_rnn(x: torch.Tensor, w_ih, w_hh, b_ih, b_hh) -> torch.Tensor:
    """f_RNN of Eq. 6 for the "rnn" cell, one step at a time: h_j = tanh(W x_j + b + U h_{j-1} + c)."""
    hidden = torch.zeros(w_hh.shape[0], dtype=torch.float64)
    outputs = []
    for token in x:
        hidden = torch.tanh(w_ih @ token + b_ih + w_hh @ hidden + b_hh)
        outputs.append(hidden)
    return torch.stack(outputs)


def reference_stack_input(encoding, tokens: torch.Tensor) -> torch.Tensor:
    """Eq. 6-11 for one unpadded sequence (L, D) of scaled embeddings, "rnn" cell, in float64."""
    weights = {name: value.detach().double() for name, value in encoding.named_parameters()}
    x = tokens.double()
    d_p = encoding.word_dim
    words = x[:, :d_p] + paper_sinusoid(len(x), d_p)  # P
    cell = [weights[f"rnn.{k}_l0"] for k in ("weight_ih", "weight_hh", "bias_ih", "bias_hh")]
    states = tanh_rnn(x[:, d_p:], *cell)
    if encoding.bidirectional:
        cell = [weights[f"rnn.{k}_l0_reverse"] for k in ("weight_ih", "weight_hh", "bias_ih", "bias_hh")]
        states = torch.cat([states, tanh_rnn(x[:, d_p:].flip(0), *cell).flip(0)], dim=-1)
    rpes = torch.tanh(
        states @ weights["rpe_projection.weight"].T + weights["rpe_projection.bias"]
    )  # R, Eq. 6
    if isinstance(encoding, RPEHeadPositionEncoding):
        return torch.cat([words, rpes], dim=-1)  # T, Eq. 7
    heads = encoding.num_heads
    pieces = []
    for head in range(heads):  # pr_j = {p^1 : r^1, ..., p^H : r^H}, Eq. 9-10
        pieces.append(words[:, head * d_p // heads : (head + 1) * d_p // heads])
        pieces.append(rpes[:, head * encoding.rpe_dim // heads : (head + 1) * encoding.rpe_dim // heads])
    return torch.cat(pieces, dim=-1)


@pytest.mark.parametrize("layout", LAYOUTS)
def test_encoder_input_matches_the_equations_with_right_and_left_padding(layout):
    """Eq. 6-11 (bidirectional RNN), and padding on either side never reaches a real token's state."""
    model = tiny_model(position_encoding=layout, rpe_cell="rnn")
    encoding = model.model.encoder.position_encoding
    src, mask = source_batch()
    embeds = model.model.encoder.embed_tokens(src) * model.model.encoder.embed_scale
    left_mask = torch.stack([row.roll(int((row == 0).sum())) for row in mask])
    left_embeds = torch.stack([e.roll(int((row == 0).sum()), 0) for e, row in zip(embeds, mask, strict=True)])
    with torch.no_grad():
        for padded_mask, padded_embeds in ((mask, embeds), (left_mask, left_embeds)):
            positions = (padded_mask.cumsum(-1) - 1).clamp(min=0)
            stack_input = encoding.embed(padded_embeds, at(positions), padded_mask, None)
            for row in range(len(src)):
                real = padded_mask[row].bool()
                expected = reference_stack_input(encoding, padded_embeds[row, real])
                torch.testing.assert_close(stack_input[row, real].double(), expected, atol=1e-5, rtol=1e-5)


@pytest.mark.parametrize("layout", LAYOUTS)
def test_decoder_input_matches_the_equations_in_full_and_step_by_step(layout):
    """Forward RNN in the decoder (Eq. 6); one token at a time through PosEncCache gives the same states."""
    model = tiny_model(position_encoding=layout, rpe_cell="rnn")
    encoding = model.model.decoder.position_encoding
    embeds = torch.randn(2, 6, 32)
    positions = torch.arange(6)[None].expand(2, -1)
    cache = PosEncCache(DynamicCache(), DynamicCache())
    with torch.no_grad():
        full = encoding.embed(embeds, at(positions), None, None)
        steps = torch.cat(
            [
                encoding.embed(embeds[:, j : j + 1], at(positions[:, j : j + 1]), None, cache)
                for j in range(6)
            ],
            1,
        )
    for row in range(2):
        torch.testing.assert_close(
            full[row].double(), reference_stack_input(encoding, embeds[row]), atol=1e-5, rtol=1e-5
        )
    torch.testing.assert_close(steps, full, atol=1e-6, rtol=1e-6)
    assert cache.extra_state[encoding.cache_key].shape == (2, 1, encoding.rpe_dim)


def test_lstm_state_in_the_cache_keeps_hidden_and_cell_and_follows_beam_reordering():
    """LSTM (h, c) both live in the cache; reordering the cache is reordering the sequences' states."""
    model = tiny_model(position_encoding="mpr_head", rpe_cell="lstm")
    encoding = model.model.decoder.position_encoding
    embeds = torch.randn(3, 5, 32)
    positions = torch.arange(5)[None].expand(3, -1)
    order = torch.tensor([2, 0, 0])
    cache = PosEncCache(DynamicCache(), DynamicCache())
    with torch.no_grad():
        full = encoding.embed(embeds[order], at(positions), None, None)
        encoding.embed(embeds[:, :3], at(positions[:, :3]), None, cache)
        assert cache.extra_state[encoding.cache_key].shape == (3, 2, encoding.rpe_dim)
        cache.reorder_cache(order)
        rest = encoding.embed(embeds[order, 3:], at(positions[:, 3:]), None, cache)
    torch.testing.assert_close(rest, full[:, 3:], atol=1e-6, rtol=1e-6)


def test_decoding_from_a_cache_without_rnn_state_is_refused():
    """A cache filled by something else cannot silently restart the RNN from zero mid-sentence."""
    encoding = tiny_model(position_encoding="rpe_head").model.decoder.position_encoding
    with pytest.raises(ValueError, match="no RNN state"):
        encoding.embed(
            torch.randn(1, 1, 32), at(torch.tensor([[3]])), None, PosEncCache(DynamicCache(), DynamicCache())
        )


@pytest.mark.parametrize("layout", LAYOUTS)
def test_per_head_projection_reads_only_each_heads_own_slice_in_the_first_layer(layout):
    """rpe_head_projection="per_head": layer-0 Q/K/V of head h depend only on input features of head h."""
    src, mask = source_batch(batch=1)
    for projection, first_layer_is_blocked in (("per_head", True), ("full", False)):
        model = tiny_model(position_encoding=layout, rpe_head_projection=projection)
        for stack in (model.model.encoder, model.model.decoder):
            for layer_idx, layer in enumerate(stack.layers):
                attention, head_dim = layer.self_attn, layer.self_attn.head_dim
                hidden = torch.randn(1, 4, 32)
                changed = hidden.clone()
                changed[..., :head_dim] += 1.0  # only head 0's slice
                for projection_layer in (attention.q_proj, attention.k_proj, attention.v_proj):
                    delta = attention.project(
                        projection_layer, changed, stack.position_encoding
                    ) - attention.project(projection_layer, hidden, stack.position_encoding)
                    other_heads_moved = bool(delta[..., head_dim:].abs().max() > 0)
                    assert other_heads_moved != (first_layer_is_blocked and layer_idx == 0)
                    assert delta[..., :head_dim].abs().max() > 0


def test_the_two_layouts_differ_only_by_a_feature_permutation_under_full_projections():
    """With "full" projections, MPRHead = RPEHead with permuted input features; "per_head" breaks that."""
    src, mask = source_batch()
    positions = (mask.cumsum(-1) - 1).clamp(min=0)
    heads, d_p, d_r, head_dim = 4, 16, 16, 8
    feature = torch.arange(16)
    # feature f of T = [P : R] sits at position permutation[f] of M = [p^1 : r^1 : ... : p^4 : r^4]
    word_slot = feature // (d_p // heads) * head_dim + feature % (d_p // heads)
    rpe_slot = feature // (d_r // heads) * head_dim + d_p // heads + feature % (d_r // heads)
    permutation = torch.cat([word_slot, rpe_slot])
    for projection, same in (("full", True), ("per_head", False)):
        queries = []
        for layout in LAYOUTS:
            model = tiny_model(position_encoding=layout, rpe_dim=d_r, rpe_head_projection=projection)
            encoder = model.model.encoder
            q_proj = encoder.layers[0].self_attn.q_proj
            if layout == "mpr_head":
                with torch.no_grad():
                    q_proj.weight[:, permutation] = q_proj.weight.clone()
            with torch.no_grad():
                stack_input = encoder.position_encoding.embed(
                    encoder.embed_tokens(src) * encoder.embed_scale, at(positions), mask, None
                )
                queries.append(
                    encoder.layers[0].self_attn.project(q_proj, stack_input, encoder.position_encoding)
                )
        assert torch.allclose(queries[0], queries[1], atol=1e-5) == same


def test_rnn_weights_missing_from_a_checkpoint_are_initialised_finite(tmp_path):
    """from_pretrained runs no PyTorch init: reset_parameters must initialise the RNN (else NaN/garbage)."""
    model = tiny_model(position_encoding="rpe_head", rpe_cell="gru")
    model.save_pretrained(tmp_path)
    state = load_file(tmp_path / "model.safetensors")
    dropped = [key for key in state if ".rnn." in key]
    assert dropped
    save_file(
        {k: v for k, v in state.items() if k not in dropped}, tmp_path / "model.safetensors", {"format": "pt"}
    )
    loaded = MarianPosEncForConditionalGeneration.from_pretrained(tmp_path).eval()
    for stack in (loaded.model.encoder, loaded.model.decoder):
        rnn = stack.position_encoding.rnn
        for weight in rnn.parameters():
            assert torch.isfinite(weight).all() and 0 < weight.abs().max() <= rnn.hidden_size**-0.5
    src, mask = source_batch()
    with torch.no_grad():
        logits = loaded(input_ids=src, attention_mask=mask, decoder_input_ids=target_batch()).logits
    assert torch.isfinite(logits).all()


@pytest.mark.parametrize(
    ("layout", "d_model", "heads", "expected"),
    [("rpe_head", 512, 8, 320), ("mpr_head", 512, 8, 256), ("rpe_head", 32, 4, 16), ("mpr_head", 32, 4, 16)],
)
def test_default_rpe_dim_is_the_papers_best_scaled_to_d_model(layout, d_model, heads, expected):
    """rpe_dim=None: d_r 320 (RPEHead) / 256 (MPRHead) at d_model 512 (Sec. 4.2), whole heads when smaller."""
    config = tiny_config(d_model=d_model, encoder_attention_heads=heads, decoder_attention_heads=heads)
    for stack in ("encoder", "decoder"):
        assert LAYOUTS[layout].resolve_rpe_dim(config, stack) == expected


@pytest.mark.parametrize(
    ("overrides", "message"),
    [
        ({"rpe_cell": "sru"}, r"rpe_cell='sru'.*rnn, gru, lstm"),
        ({"rpe_head_projection": "diagonal"}, r"rpe_head_projection='diagonal'.*full, per_head"),
        ({"rpe_dim": 32}, r"rpe_dim=32 must lie strictly between 0 and d_model=32"),
        ({"rpe_dim": 12}, r"rpe_dim=12 must be a multiple of 8"),
        ({"rpe_dim": 6, "position_encoding": "mpr_head"}, r"rpe_dim=6 must be a multiple of 4"),
        (
            {
                "rpe_dim": 7,
                "encoder_position_encoding": "sinusoidal",
                "decoder_position_encoding": "rpe_head",
            },
            r"decoder: rpe_dim=7 must be a multiple of 8",
        ),
        ({"rpe_dim": 7, "rpe_head_projection": "full"}, r"encoder: rpe_dim=7 must be even"),
    ],
)
def test_impossible_recurrent_settings_fail_when_the_config_is_built(overrides, message):
    """Errors name the bad value and the allowed ones, before any model is built."""
    with pytest.raises(ValueError, match=message):
        if "decoder_position_encoding" not in overrides:
            overrides = {"position_encoding": "rpe_head", **overrides}
        tiny_config(**overrides)


def test_parameter_overhead_over_sinusoidal_in_the_base_model_is_below_the_papers_two_percent():
    """Sec. 4.4: "less than 2%" extra parameters with the plain RNN of Eq. 6 (d512, 6+6, 8 heads, FFN 2048,
    shared 32k vocabulary); GRU/LSTM cells cost 3x/4x the RNN's weights (docs/recurrent.md)."""
    base = dict(vocab_size=32000, d_model=512, encoder_layers=6, decoder_layers=6, encoder_ffn_dim=2048)

    def parameters(**overrides):
        with torch.device("meta"):
            model = MarianPosEncForConditionalGeneration(MarianPosEncConfig(**base, **overrides))
        return sum(p.numel() for p in model.parameters())

    sinusoidal = parameters(position_encoding="sinusoidal")
    for layout in LAYOUTS:
        assert 0 < parameters(position_encoding=layout, rpe_cell="rnn") / sinusoidal - 1 < 0.02
