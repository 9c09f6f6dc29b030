"""Pictures of what a trained model learned about positions, one PNG per model.

    from hf_posenc.analysis.position_plots import plot_learned_positions
    plot_learned_positions(model, "docs/positions.png", title="rposnet, en-de")

Every module draws its own panels (`DescribedModule.position_panels`), covering the first `positions`
positions: position-only mixers their weights or energies per layer and head (paper 2), bias schemes their
bias against the distance j - i, Shaw the similarity of its relative key embeddings, learned tables and
positional kernels the similarity of every pair of positions (paper 1). Modules with nothing learned about
positions (none, sinusoidal, RoPE, FourierNet, GaussianNet, the recurrent encodings) add no panel.
"""

import copy
import math

import torch

from ..base import DescribedModule, PositionPanel


@torch.no_grad()
def position_panels(model, positions: int = 48) -> list[PositionPanel]:
    """The panels of every module of the model, encoder first, in module order."""
    model = copy.deepcopy(model).float().eval()
    return [
        panel
        for module in model.modules()
        if isinstance(module, DescribedModule)
        for panel in module.position_panels(positions)
    ]


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
    for axis, panel in zip(axes.flat, panels, strict=False):  # the grid may have spare axes
        data = panel.data.float().cpu()
        if panel.kind == "curves":
            distances = torch.arange(data.shape[-1]) - positions // 2
            for head_curve in data:
                axis.plot(distances, head_curve, linewidth=0.9)
            axis.set_xlabel("j - i", fontsize=7)
        else:
            axis.imshow(data, cmap="viridis", aspect="auto")
            axis.set_xticks([])
            axis.set_yticks([])
        axis.set_title(panel.title, fontsize=7)
        axis.tick_params(labelsize=6)
    figure.suptitle(title, fontsize=9)
    figure.tight_layout()
    figure.savefig(path, dpi=90)
    plt.close(figure)
    return True
