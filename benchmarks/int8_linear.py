"""One linear layer at decoder-step sizes, CPU, one thread: float32 `nn.Linear` against int8 —
torch.ao.quantization.quantize_dynamic (per tensor and per output channel) and the pipeline's `Int8Linear`
(pipeline/evaluation/quantization.py: `torch._int_mm` with per-channel weights and per-row inputs).

Rows are batch x beams of one decoding step (64 x 4 = 256 by default); the shapes are d_model -> d_model (attention
projections), d_model -> ffn and ffn -> d_model (feed-forward), d_model -> vocabulary (output projection) of the
study's d256 models. Every round times each layer once (`--calls` calls), one after another, on the thread's CPU
clock (time.thread_time: the time other jobs hold the core is not counted); a ratio is float32's time over the
layer's in the same round, and the table gives the median over rounds, with the largest relative error against
float32's output. The machine line and load average are printed with it.

    python -m benchmarks.int8_linear --rows 256 --rounds 21
"""

import argparse
import os
import statistics
import time
import warnings

import torch
from torch import nn

from hf_posenc.pipeline.evaluation.quantization import Int8Linear
from hf_posenc.pipeline.training.hardware import describe_hardware

SHAPES = ((256, 256), (256, 1024), (1024, 256), (256, 8000))  # (in, out)


def int8_layers(linear: nn.Linear) -> dict:
    """The layers compared with `linear`, by name."""
    from torch.ao.quantization import per_channel_dynamic_qconfig, quantize_dynamic

    with warnings.catch_warnings():  # torch announces quantize_dynamic deprecated
        warnings.simplefilter("ignore")
        per_tensor = quantize_dynamic(nn.Sequential(linear), {nn.Linear}, dtype=torch.qint8)[0]
        per_channel = quantize_dynamic(
            nn.Sequential(linear), {nn.Linear: per_channel_dynamic_qconfig}, dtype=torch.qint8
        )[0]
    return {
        "float32 nn.Linear": linear,
        "quantize_dynamic (per tensor)": per_tensor,
        "quantize_dynamic (per channel)": per_channel,
        "Int8Linear (torch._int_mm)": Int8Linear(linear),
    }


def cpu_seconds(layer, inputs, calls: int) -> float:
    """Thread CPU seconds per call of `layer(inputs)`."""
    started = time.thread_time()
    for _ in range(calls):
        layer(inputs)
    return (time.thread_time() - started) / calls


@torch.no_grad()
def measure(rows: int, rounds: int, calls: int) -> list[dict]:
    """One row per (shape, layer): median microseconds, median speed-up over float32, largest relative error."""
    results = []
    for inputs_size, outputs_size in SHAPES:
        torch.manual_seed(0)
        layers = int8_layers(nn.Linear(inputs_size, outputs_size))
        inputs = torch.randn(rows, inputs_size)  # (R, in)
        reference = layers["float32 nn.Linear"](inputs)  # (R, out)
        times = {name: [] for name in layers}
        for _ in range(rounds):
            for name, layer in layers.items():
                times[name].append(cpu_seconds(layer, inputs, calls))
        for name, layer in layers.items():
            error = (layer(inputs) - reference).abs().max() / reference.abs().max()
            ratios = [base / own for base, own in zip(times["float32 nn.Linear"], times[name], strict=True)]
            results.append(
                {
                    "shape": f"{rows}x{inputs_size} @ {inputs_size}x{outputs_size}",
                    "layer": name,
                    "microseconds": 1e6 * statistics.median(times[name]),
                    "speed_up": statistics.median(ratios),
                    "relative_error": error.item(),
                }
            )
    return results


def main():
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--rows", type=int, default=256, help="batch x beams of one decoding step")
    parser.add_argument("--rounds", type=int, default=21)
    parser.add_argument("--calls", type=int, default=10, help="calls of each layer per round")
    args = parser.parse_args()
    torch.set_num_threads(1)
    load = ", ".join(f"{value:.2f}" for value in os.getloadavg())
    print(f"Machine: {describe_hardware('cpu').line()}; load average before: {load}")
    print(
        "| shape | layer | µs per call (median) | speed-up over float32 (median of rounds) | max rel. error |"
    )
    print("| --- | --- | --- | --- | --- |")
    for row in measure(args.rows, args.rounds, args.calls):
        print(
            f"| {row['shape']} | {row['layer']} | {row['microseconds']:.0f} | {row['speed_up']:.2f}x | "
            f"{row['relative_error']:.4f} |"
        )
    load = ", ".join(f"{value:.2f}" for value in os.getloadavg())
    print(f"load average after: {load}")


if __name__ == "__main__":
    main()
