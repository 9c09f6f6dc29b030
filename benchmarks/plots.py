"""The plots of `make bench` (benchmarks/run.py): throughput per length as a ratio to stock Marian for the phases
measured (training, paper 1's forward benchmark), generation speed by system and decoding loop, and the per-token
decoding time against the prefix length."""

import matplotlib

from .harness import FAST, STOCK_MARIAN
from .systems import System

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402  (after selecting the file-only backend)


def line_style(index: int, system: System) -> dict:
    """The baseline bold black; the others cycle colours, then line styles (about 20 systems share a plot)."""
    if system.name == STOCK_MARIAN:
        return dict(color="black", linewidth=2.5)
    return dict(linewidth=1, linestyle=("-", "--", ":")[(index - 1) // 10 % 3])


def write_plots(results: dict, systems: list[System], args) -> list[str]:
    """The throughput panels of the phases measured (training, forward) and the decoding-time plot."""
    paths = []
    metadata = {"Description": "systems: " + ", ".join(system.name for system in systems)}  # PNG text chunk
    panels = throughput_panels(results, args)
    if panels:
        paths.append(args.output_dir / f"{args.stem}_throughput.png")
        write_throughput_plot(panels, systems, paths[-1], metadata)
    if "generation" in results:
        paths.append(args.output_dir / f"{args.stem}_generation.png")
        write_generation_plot(results["generation"]["tokens_per_second"], systems, args, paths[-1], metadata)
    if "decode_ms" in results:
        paths.append(args.output_dir / f"{args.stem}_decode.png")
        write_decode_plot(results["decode_ms"], systems, args.decode_prefixes, paths[-1], metadata)
    return [path.name for path in paths]


def throughput_panels(results: dict, args) -> list[tuple[dict, list[int], str]]:
    """(throughput by `<system>@<length>`, lengths, title) of each phase measured: training, forward."""
    return [
        (measured, lengths, title)
        for key, measured, lengths, title in (
            (
                "training",
                results.get("training", {}).get("tokens_per_second"),
                args.lengths,
                "training step (fwd+bwd+AdamW)",
            ),
            (
                "forward_seconds",
                {k: 1 / v for k, v in results.get("forward_seconds", {}).items()},
                args.forward_lengths,
                f"forward ×{args.forward_times} (paper 1)",
            ),
        )
        if key in results
    ]


def write_throughput_plot(panels: list, systems: list[System], path, metadata: dict) -> None:
    """One panel per phase: each system's throughput over the baseline's against the length."""
    figure, axes = plt.subplots(1, len(panels), figsize=(6 * len(panels), 5), squeeze=False)
    for axis, (measured, lengths, title) in zip(axes[0], panels, strict=True):
        for index, system in enumerate(systems):
            points = [
                (n, measured[f"{system.name}@{n}"] / measured[f"{STOCK_MARIAN}@{n}"])
                for n in lengths
                if f"{system.name}@{n}" in measured  # inference-only systems have no training numbers
            ]
            if points:
                axis.plot(
                    *zip(*points, strict=True), marker="o", label=system.name, **line_style(index, system)
                )
        axis.set(xlabel="source = target length", ylabel="throughput / stock Marian", title=title)
        axis.set_xscale("log", base=2)
        axis.minorticks_off()
        axis.set_xticks(lengths, [str(n) for n in lengths])
        axis.grid(alpha=0.3)
    axes[0][-1].legend(fontsize=7, ncol=2)
    figure.tight_layout()
    figure.savefig(path, dpi=110, metadata=metadata)
    plt.close(figure)


def write_decode_plot(
    decode_ms: dict, systems: list[System], prefixes: list[int], path, metadata: dict
) -> None:
    """Each system's milliseconds per greedy decoding step against the prefix length."""
    figure, axis = plt.subplots(figsize=(7, 5))
    for index, system in enumerate(systems):
        milliseconds = [decode_ms[f"{system.name}@{p}"] for p in prefixes]
        axis.plot(prefixes, milliseconds, marker="o", label=system.name, **line_style(index, system))
    axis.set(xlabel="prefix length (tokens in the cache)", ylabel="ms per greedy decoding step (batch 1)")
    axis.set(title="per-token decoding time vs prefix")
    axis.grid(alpha=0.3)
    axis.legend(fontsize=7, ncol=2)
    figure.tight_layout()
    figure.savefig(path, dpi=110, metadata=metadata)
    plt.close(figure)


def write_generation_plot(measured: dict, systems: list[System], args, path, metadata: dict) -> None:
    """One panel per generation setting: each system's tokens/s over stock Marian's `generate`, through `generate`
    and through the fast decoding loop."""
    settings = [f"b{b}k{k}" for b in args.generation_batch_sizes for k in args.beams]
    names = [system.name for system in systems]
    figure, axes = plt.subplots(len(settings), 1, figsize=(max(8, 0.45 * len(names)), 3 * len(settings)))
    for axis, setting in zip(getattr(axes, "flat", [axes]), settings, strict=True):
        baseline = measured[f"{STOCK_MARIAN}@{setting}"]
        for offset, (suffix, label) in enumerate((("", "generate"), (FAST, "fast decoding loop"))):
            heights = [measured.get(f"{name}{suffix}@{setting}", 0) / baseline for name in names]
            axis.bar([i + 0.4 * offset for i in range(len(names))], heights, width=0.4, label=label)
        axis.set_xticks([i + 0.2 for i in range(len(names))], names, rotation=60, ha="right", fontsize=7)
        axis.set(
            ylabel="tokens/s / Marian generate", title=setting.replace("b", "batch ").replace("k", ", beams ")
        )
        axis.axhline(1.0, color="black", linewidth=0.8)
        axis.grid(alpha=0.3, axis="y")
    figure.axes[0].legend(fontsize=8)
    figure.tight_layout()
    figure.savefig(path, dpi=110, metadata=metadata)
    plt.close(figure)
