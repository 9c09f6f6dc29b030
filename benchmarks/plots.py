"""The plots of `make bench` (benchmarks/run.py): throughput per length as a ratio to stock Marian for the phases
measured (training, paper 1's forward benchmark) and, with --compile, compiled over eager; generation speed by
system and decoding loop, and the per-token decoding time against the prefix length. And the decoding engines of one
trained model (benchmarks/ctranslate2_decode.py)."""

import textwrap

import matplotlib

from .harness import COMPILED, FAST, INT8, STOCK_MARIAN
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


def throughput_panels(results: dict, args) -> list[tuple[dict, list[int], str, str]]:
    """(ratio by `<system>@<length>`, lengths, title, y label) of each phase measured: training and forward over
    stock Marian's at each length, and with --compile each system's compiled training over its own eager one."""
    phases = (
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
    panels = []
    for key, measured, lengths, title in phases:
        if key in results:
            eager = {k: v for k, v in measured.items() if COMPILED not in k}
            ratios = {k: v / eager[f"{STOCK_MARIAN}@{k.rsplit('@', 1)[1]}"] for k, v in eager.items()}
            panels.append((ratios, lengths, title, "throughput / stock Marian"))
    training = results.get("training", {}).get("tokens_per_second", {})
    if args.compile and training:
        ratios = {
            k.replace(COMPILED, ""): v / training[k.replace(COMPILED, "")]
            for k, v in training.items()
            if COMPILED in k
        }
        panels.append((ratios, args.lengths, "torch.compile (training)", "compiled / eager throughput"))
    return panels


def write_throughput_plot(panels: list, systems: list[System], path, metadata: dict) -> None:
    """One panel per ratio (`throughput_panels`): each system's against the length."""
    figure, axes = plt.subplots(1, len(panels), figsize=(6 * len(panels), 5), squeeze=False)
    for axis, (ratios, lengths, title, ylabel) in zip(axes[0], panels, strict=True):
        for index, system in enumerate(systems):
            # inference-only systems have no training numbers
            points = [(n, ratios[f"{system.name}@{n}"]) for n in lengths if f"{system.name}@{n}" in ratios]
            if points:
                axis.plot(
                    *zip(*points, strict=True), marker="o", label=system.name, **line_style(index, system)
                )
        axis.set(xlabel="source = target length", ylabel=ylabel, title=title)
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
    """One panel per generation setting: each system's tokens/s over stock Marian's `generate`, through `generate`,
    through the fast decoding loop and, where measured, through the fast loop with int8 linear layers."""
    settings = [f"b{b}k{k}" for b in args.generation_batch_sizes for k in args.beams]
    names = [system.name for system in systems]
    figure, axes = plt.subplots(len(settings), 1, figsize=(max(8, 0.45 * len(names)), 3 * len(settings)))
    for axis, setting in zip(getattr(axes, "flat", [axes]), settings, strict=True):
        baseline = measured[f"{STOCK_MARIAN}@{setting}"]
        loops = [("", "generate"), (FAST, "fast decoding loop")]
        if any(INT8 in key for key in measured):
            loops.append((INT8, "fast loop, int8 linear layers"))
        width = 0.8 / len(loops)
        for offset, (suffix, label) in enumerate(loops):
            heights = [measured.get(f"{name}{suffix}@{setting}", 0) / baseline for name in names]
            axis.bar([i + width * offset for i in range(len(names))], heights, width=width, label=label)
        axis.set_xticks(
            [i + 0.4 - width / 2 for i in range(len(names))], names, rotation=60, ha="right", fontsize=7
        )
        axis.set(
            ylabel="tokens/s / Marian generate", title=setting.replace("b", "batch ").replace("k", ", beams ")
        )
        axis.axhline(1.0, color="black", linewidth=0.8)
        axis.grid(alpha=0.3, axis="y")
    figure.axes[0].legend(fontsize=8)
    figure.tight_layout()
    figure.savefig(path, dpi=110, metadata=metadata)
    plt.close(figure)


def write_engines_plot(rows: list[dict], path, title: str) -> None:
    """One panel per thread count: each decoding engine's sentences/s (benchmarks/ctranslate2_decode.py rows),
    labelled with its speed over `generate` and its BLEU."""
    threads = sorted({row["threads"] for row in rows})
    figure, axes = plt.subplots(1, len(threads), figsize=(8 * len(threads), 4), squeeze=False)
    for axis, count in zip(axes[0], threads, strict=True):
        chosen = [row for row in rows if row["threads"] == count]
        names = [row["system"] for row in chosen][::-1]  # generate on top
        speeds = [row["sentences_per_second"] for row in chosen][::-1]
        axis.barh(names, speeds, color="tab:blue")
        for y, row in enumerate(chosen[::-1]):
            label = f" {row['speed_up']:.2f}x, BLEU {row['bleu']:.2f}"
            axis.text(row["sentences_per_second"], y, label, va="center", fontsize=8)
        axis.set(xlabel="sentences/s", title=f"{count} thread{'s' if count > 1 else ''}")
        axis.set_xlim(0, 1.45 * max(speeds))
        axis.grid(alpha=0.3, axis="x")
    figure.suptitle(textwrap.fill(title, 110 * len(threads)), fontsize=8)
    figure.tight_layout()
    figure.savefig(path, dpi=110)
    plt.close(figure)
