"""hf_posenc.analysis.position_plots draws what each kind of module learned about positions, and nothing for
modules that learned nothing (fixed tables, rotations, fixed mixers)."""

import math

import pytest
import torch

from hf_posenc.analysis.position_plots import plot_learned_positions, position_panels

LAYERS, HEADS = 2, 4  # tests.helpers.TINY_FIELDS


@pytest.mark.parametrize(
    "overrides, expected_panels, kind",
    [
        (dict(position_encoding="learned"), 2, "map"),  # one similarity map per stack
        (dict(position_encoding="shaw"), 2 * LAYERS, "map"),  # w^K similarity per layer and stack
        (dict(position_encoding="t5_bias"), 2, "curves"),  # bias vs distance, shared by the layers of a stack
        (dict(position_encoding="adaptive_t5"), 2, "curves"),  # first layer only by default
        (dict(position_encoding="posnet_embed"), 1, "map"),  # one module shared by both stacks
        (dict(position_encoding="posnet_attn"), 1, "map"),  # one kernel table for the whole model
        (
            dict(position_encoding="posnet_attn", posnet_attn_share_layers=False),
            2 * LAYERS,
            "map",
        ),  # per layer
        # energies per layer and head, plus the learned input tables rPosNet comes with (paper 2 §5.2)
        (
            dict(encoder_self_attention="rposnet", decoder_self_attention="rposnet"),
            2 * LAYERS * HEADS + 2,
            "map",
        ),
    ],
    ids=[
        "learned",
        "shaw",
        "t5_bias",
        "adaptive_t5",
        "posnet_embed",
        "posnet_attn",
        "posnet_attn-per-layer",
        "rposnet",
    ],
)
def test_each_module_kind_gets_its_panels(overrides, expected_panels, kind, tmp_path, tiny_model):
    panels = position_panels(tiny_model(**overrides), positions=12)
    assert len(panels) == expected_panels and {panel.kind for panel in panels} == {kind}
    assert plot_learned_positions(tiny_model(**overrides), tmp_path / "p.png", positions=12)
    assert (tmp_path / "p.png").stat().st_size > 0


@pytest.mark.parametrize(
    "overrides",
    [
        dict(position_encoding="sinusoidal"),
        dict(position_encoding="rope"),
        dict(encoder_self_attention="fourier", decoder_self_attention="gaussian"),
    ],
)
def test_modules_that_learn_nothing_about_positions_draw_nothing(overrides, tmp_path, tiny_model):
    assert not plot_learned_positions(tiny_model(**overrides), tmp_path / "p.png")
    assert not (tmp_path / "p.png").exists()


def test_energies_are_drawn_without_changing_the_model_and_decoder_future_is_blank(tiny_model):
    model = tiny_model(encoder_self_attention="aposnet", decoder_self_attention="aposnet")
    before = {name: p.clone() for name, p in model.named_parameters()}
    panels = {panel.title: panel.data for panel in position_panels(model, positions=10)}
    assert not model.config.position_attention_precomputed
    assert all(torch.equal(before[name], p) for name, p in model.named_parameters())
    decoder_panel = panels["dec L0 self head 0"]
    assert math.isnan(decoder_panel[0, 1]) and not math.isnan(decoder_panel[1, 0])
    assert not panels["enc L0 self head 0"].isnan().any()
