"""Pictures of what a trained model learned about positions, one PNG per model.

    from hf_posenc.analysis.position_plots import plot_learned_positions
    plot_learned_positions(model, "docs/positions.png", title="rposnet, en-de")

What is drawn depends on the model's modules; every panel covers the first `positions` positions:

* position-only mixers (aPosNet, rPosNet, LinearNet, gLinearNet, LightConv; paper 2): the energies of every
  layer and head as query × key heat maps, read from the pre-computed tables of paper 2 §4 for aPosNet and
  rPosNet (the model is folded on a copy) and from the normalised mixing weights for the others (future
  keys of the causal decoder left blank);
* bias schemes (T5, Adaptive-T5, ALiBi): each head's additive score bias as a function of the distance
  j − i, one panel per stack and biased layer;
* Shaw: the cosine similarity of the learned relative key embeddings w^K per layer (distance × distance);
* learned absolute tables and positional kernels (learned, PosNet-Embed, PosNet-Attn; paper 1): the cosine
  similarity of the representations of every pair of positions (kernels flattened).

Modules with nothing learned about positions (none, sinusoidal, RoPE, FourierNet, GaussianNet) and the
recurrent encodings (their positions are RNN states over the tokens, not a table) add no panel.
"""

import copy
import math

import torch
import torch.nn.functional as F

from ..base import PositionContext, TokenMixer
from ..mixer_base import PositionMixer
from ..mixer_gated import PositionAttention
from ..posenc_absolute import LearnedPositionEncoding
from ..posenc_posnet import PosNetAttention, PosNetEmbedding
from ..posenc_relative import (
    AdaptiveT5PositionEncoding,
    AlibiPositionEncoding,
    ShawRelativePositionEncoding,
    T5BiasPositionEncoding,
)

BIAS_ENCODINGS = (T5BiasPositionEncoding, AdaptiveT5PositionEncoding, AlibiPositionEncoding)
MIXER_PARAMETERS_WITHOUT_POSITIONS = ("v_proj.", "out_proj.", "gating.")


def cosine_similarity_matrix(rows: torch.Tensor) -> torch.Tensor:
    """(N, F) -> (N, N) cosine similarities."""
    rows = F.normalize(rows.float().flatten(1), dim=-1)
    return rows @ rows.T


def learns_positions(mixer: TokenMixer) -> bool:
    """A mixer with trainable position parameters (its value, output and gate projections do not count)."""
    return any(
        not name.startswith(MIXER_PARAMETERS_WITHOUT_POSITIONS) for name, _ in mixer.named_parameters()
    )


@torch.no_grad()
def position_panels(model, positions: int = 48) -> list[tuple[str, str, torch.Tensor]]:
    """(title, kind, data) per panel; kind "map" is a 2-D heat map, "curves" is (H, distances) biases."""
    model = copy.deepcopy(model).float().eval()
    if any(isinstance(module, PositionAttention) for module in model.modules()):
        model.precompute_position_attention()
    span = torch.arange(positions)[None]  # (1, P)
    context = PositionContext(None, span, span)
    panels = []
    for stack_name, stack_module in (("encoder", model.get_encoder()), ("decoder", model.get_decoder())):
        stack = stack_module.position_encoding
        encoding_context = PositionContext(stack, span, span)
        if isinstance(stack, BIAS_ENCODINGS):
            for layer_idx in range(len(stack_module.layers)):
                bias = stack.score_bias(layer_idx, encoding_context)
                if bias is not None:
                    row = bias[0, :, positions // 2, :]  # (H, P): query in the middle, keys on both sides
                    panels.append((f"{stack_name} layer {layer_idx}: bias vs j - i", "curves", row))
        elif isinstance(stack, ShawRelativePositionEncoding):
            for layer_idx, table in enumerate(stack.key_tables):
                panels.append(
                    (
                        f"{stack_name} layer {layer_idx}: w^K similarity",
                        "map",
                        cosine_similarity_matrix(table),
                    )
                )
        elif isinstance(stack, LearnedPositionEncoding):
            panels.append(
                (
                    f"{stack_name}: learned positions",
                    "map",
                    cosine_similarity_matrix(stack.weight[:positions]),
                )
            )
        elif isinstance(stack, PosNetEmbedding) and (
            stack_name == "encoder" or not model.config.posnet_shared
        ):
            kernels = next(p for name, p in stack.named_parameters() if name.endswith("kernels"))
            panels.append(
                (f"{stack_name}: PosNet-Embed kernels", "map", cosine_similarity_matrix(kernels[:positions]))
            )
        elif isinstance(stack, PosNetAttention):
            for name, kernels in stack.named_parameters():
                panels.append(
                    (
                        f"{stack_name} {name}: kernel similarity",
                        "map",
                        cosine_similarity_matrix(kernels[:positions]),
                    )
                )
    for name, mixer in model.named_modules():
        if isinstance(mixer, PositionMixer) and learns_positions(mixer):
            weights = (
                mixer.energies_for(context)
                if isinstance(mixer, PositionAttention)
                else mixer.mixing_weights(None, context, torch.float32)
            )
            if mixer.is_causal:  # blank the future keys the decoder never reads
                future = torch.ones(positions, positions, dtype=torch.bool).triu(1)
                weights = weights.masked_fill(future, float("nan"))
            for head, heat in enumerate(weights[0]):
                panels.append((f"{short_site_name(name)} head {head}", "map", heat))
    return panels


def short_site_name(module_name: str) -> str:
    """'model.encoder.layers.0.self_attn' -> 'enc 0 self'."""
    parts = module_name.split(".")
    stack = "enc" if "encoder" in parts[:2] or parts[1:2] == ["encoder"] else "dec"
    site = {"self_attn": "self", "encoder_attn": "cross"}.get(parts[-1], parts[-1])
    return f"{stack} L{parts[-2]} {site}"


def plot_learned_positions(model, path, title: str = "", positions: int = 48) -> bool:
    """Write the model's position panels as one PNG; False (and no file) when it learned nothing to draw."""
    panels = position_panels(model, positions)
    if not panels:
        return False
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    columns = min(len(panels), 8)
    rows = math.ceil(len(panels) / columns)
    figure, axes = plt.subplots(rows, columns, figsize=(2.3 * columns, 2.3 * rows + 0.4), squeeze=False)
    for axis in axes.flat[len(panels) :]:
        axis.axis("off")
    for axis, (panel_title, kind, data) in zip(
        axes.flat, panels, strict=False
    ):  # the grid may have spare axes
        data = data.float().cpu()
        if kind == "curves":
            distances = torch.arange(data.shape[-1]) - positions // 2
            for head_curve in data:
                axis.plot(distances, head_curve, linewidth=0.9)
            axis.set_xlabel("j - i", fontsize=7)
        else:
            axis.imshow(data, cmap="viridis", aspect="auto")
            axis.set_xticks([])
            axis.set_yticks([])
        axis.set_title(panel_title, fontsize=7)
        axis.tick_params(labelsize=6)
    figure.suptitle(title, fontsize=9)
    figure.tight_layout()
    figure.savefig(path, dpi=90)
    plt.close(figure)
    return True
