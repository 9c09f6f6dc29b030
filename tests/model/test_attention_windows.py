"""Attention windows (`attention_window`, `cross_attention_window`; hf_posenc/attention_windows.py): the attention
weights are zero exactly outside Eq. 1-3, a window wider than the input changes nothing, and the config refuses
bad values by name. Cache-exactness, beam search, save/load and remote code: the conformance suite's `windows`
variants."""

import pytest
import torch

from hf_posenc import MarianPosEncConfig, MarianPosEncForConditionalGeneration
from hf_posenc.attention_windows import measure_token_ratio

W, C, RATIO = 2, 1, 1.5


def weights(model, source, mask, target):
    with torch.no_grad():
        output = model(
            input_ids=source, attention_mask=mask, decoder_input_ids=target, output_attentions=True
        )
    return output.encoder_attentions[0], output.decoder_attentions[0], output.cross_attentions[0]


@pytest.mark.parametrize(
    "positions", ["plain", "randomized in training", "randomized spread", "restarting at sentence ends"]
)
def test_attention_weights_are_zero_exactly_outside_the_windows(
    tiny_config, source_batch, target_batch, positions
):
    """The windows follow the tokens' order, whatever positions the encoding reads (drawn in training, spread
    at inference, restarting at each sentence)."""
    source, mask = source_batch()  # rows of 11, 9 and 7 real tokens, right-padded
    target = target_batch()
    randomized = {} if positions == "plain" else {"randomized_positions_max": 64}
    if positions == "randomized spread":  # a target longer than its source goes past L - 1: a larger table
        randomized |= {"randomized_positions_inference": "spread", "max_position_embeddings": 256}
    if positions == "restarting at sentence ends":  # two tokens of the first source end sentences
        randomized = {"sentence_end_token_ids": sorted({int(source[0, 3]), int(source[0, 6])})}
    config = tiny_config(
        dropout=0.0,
        attention_window=W,
        cross_attention_window=C,
        cross_attention_window_ratio=RATIO,
        attn_implementation="eager",
        **randomized,
    )
    model = MarianPosEncForConditionalGeneration(config).train(positions == "randomized in training")
    encoder, decoder, cross = weights(model, source, mask, target)
    i = torch.arange(source.shape[1])
    real = mask.bool()[:, None, None, :]  # (B, 1, 1, S)
    queries = mask.bool()[:, None, :, None]  # padded queries attend somewhere too; their outputs are unused
    expected = ((i[:, None] - i[None]).abs() <= W)[None, None] & real & queries
    assert torch.equal((encoder > 0) & queries, expected.expand_as(encoder))

    t = torch.arange(target.shape[1])
    distance = t[:, None] - t[None]
    assert torch.equal(
        decoder > 0, ((distance >= 0) & ((distance <= W) | (t[None] == 0)))[None, None].expand_as(decoder)
    )

    lengths = mask.sum(-1)  # (B,)
    centres = torch.minimum(t[None] / RATIO, (lengths - 1)[:, None].float())  # (B, q)
    expected = ((i[None, None] - centres[:, :, None]).abs() <= C)[:, None] & real  # (B, 1, q, S)
    assert torch.equal(cross > 0, expected.expand_as(cross))
    assert (cross > 0).any(-1).all()  # past the source's end every target token still reads its last tokens


@pytest.mark.parametrize("attention", ["eager", "sdpa"])
def test_windows_wider_than_the_input_change_nothing(tiny_config, source_batch, target_batch, attention):
    source, mask = source_batch()
    target = target_batch()
    torch.manual_seed(0)
    plain = MarianPosEncForConditionalGeneration(tiny_config(attn_implementation=attention)).eval()
    wide = tiny_config(attention_window=20, cross_attention_window=20, attn_implementation=attention)
    windowed = MarianPosEncForConditionalGeneration(wide).eval()
    windowed.load_state_dict(plain.state_dict())
    narrow = MarianPosEncForConditionalGeneration(
        tiny_config(attention_window=1, attn_implementation=attention)
    )
    narrow.eval().load_state_dict(plain.state_dict())
    with torch.no_grad():
        expected = plain(input_ids=source, attention_mask=mask, decoder_input_ids=target).logits
        got = windowed(input_ids=source, attention_mask=mask, decoder_input_ids=target).logits
        narrowed = narrow(input_ids=source, attention_mask=mask, decoder_input_ids=target).logits
    torch.testing.assert_close(got, expected)
    assert not torch.allclose(narrowed, expected)  # a window that masks keys does change the output


@pytest.mark.parametrize(
    "overrides, named",
    [
        ({"attention_window": 0}, "attention_window=0"),
        ({"cross_attention_window": -2}, "cross_attention_window=-2"),
        (
            {"cross_attention_window": 3, "cross_attention_window_ratio": 0.0},
            "cross_attention_window_ratio=0.0",
        ),
        ({"cross_attention_window_ratio": 1.2}, "cross_attention_window_ratio=1.2 would do nothing"),
        ({"attention_window": 4, "decoder_self_attention": "gaussian"}, "decoder_self_attention='gaussian'"),
        ({"cross_attention_window": 4, "cross_attention": "aposnet"}, "cross_attention='aposnet'"),
    ],
)
def test_bad_window_settings_are_refused_by_name(overrides, named):
    with pytest.raises(ValueError, match=named.replace("(", r"\(").replace("=", "=")):
        MarianPosEncConfig(**overrides)


def test_the_windows_are_saved_with_the_model_and_set_at_load(tmp_path, tiny_config):
    MarianPosEncForConditionalGeneration(tiny_config()).save_pretrained(tmp_path)
    loaded = MarianPosEncForConditionalGeneration.from_pretrained(
        tmp_path, attention_window=48, cross_attention_window=24, cross_attention_window_ratio=1.04
    )
    assert (loaded.config.attention_window, loaded.config.cross_attention_window) == (48, 24)
    loaded.save_pretrained(tmp_path / "again")
    again = MarianPosEncConfig.from_pretrained(tmp_path / "again")
    assert (again.attention_window, again.cross_attention_window_ratio) == (48, 1.04)


def test_the_token_ratio_is_total_target_over_total_source_tokens():
    assert measure_token_ratio([10, 20, 30], [12, 18, 39]) == 1.15
    with pytest.raises(ValueError, match="positive total"):
        measure_token_ratio([], [])
