"""Decoding speed and BLEU of `generate` against the fast loop (float32, int8) and the CTranslate2 exports (float32,
int8), on the CPU, or `generate` against the fast loop on a GPU (`--device cuda`).

Translates the test set (Multi30k test_2016_flickr En->De by default, 1000 sentences) with the model's saved
generation config (beam 4, length penalty 0.6, source length + 50) at 1 thread and at all cores: `generate`
(torch fp32, `evaluation.translate` with `fast_decoding=False`), the fast loop (fast_decoding.py, the same
with `fast_decoding=True`), the fast loop with int8 linear layers (`quantize_int8`,
pipeline/evaluation/quantization.py) and CTranslate2 (`CTranslate2Model.translate`) with float32 and int8 weights;
`--systems` picks some of them (`generate` always runs, it is the baseline; a model CTranslate2 cannot express
needs `--systems fast torch-int8`). Threads are pinned for both (torch.set_num_threads; CTranslate2's
translator threads, each decoding whole batches). Reports sentences/s, the speed-up over `generate` at the same thread
count in wall time and in the process's CPU time (which leaves out the time other jobs hold the cores: at one
thread the two agree on a quiet machine), BLEU (sacreBLEU 13a) and how many lines equal `generate`'s, as a
markdown table that replaces the measured section of docs/export.md (--doc; `--doc ''` only prints it), and as a
bar chart, docs/decoding_engines.png (--plot; with `--doc ''` only where --plot names a file).
With `--device cuda` the model decodes on that GPU (threads: the host's), `generate` and the fast loop only
(int8 linear layers and the exports here are CPU builds), after one untimed batch of each.

    python -m benchmarks.ctranslate2_decode outputs/run
    python -m benchmarks.ctranslate2_decode outputs/run --threads 1 --systems fast torch-int8 --doc ''
    python -m benchmarks.ctranslate2_decode outputs/run --device cuda --threads 1 --doc ''
"""

import argparse
import datetime
import os
import tempfile
import time
from pathlib import Path

import torch

from hf_posenc.pipeline.data.files import read_parallel
from hf_posenc.pipeline.evaluation.decoding import load_translation_model, translate
from hf_posenc.pipeline.evaluation.quantization import quantize_int8
from hf_posenc.pipeline.evaluation.scoring import score_translations
from hf_posenc.pipeline.export.ctranslate2 import CTranslate2Model, export_ctranslate2
from hf_posenc.pipeline.training.hardware import add_cpu_memory_flag, describe_hardware, keep_freed_memory

from .plots import write_engines_plot
from .systems import MULTI30K

DATA = MULTI30K
DOC = Path(__file__).resolve().parents[1] / "docs" / "export.md"
PLOT = DOC.with_name("decoding_engines.png")
BEGIN, END = "<!-- ctranslate2-benchmark:begin -->", "<!-- ctranslate2-benchmark:end -->"
QUANTIZATIONS = ("float32", "int8")
# The systems besides `generate` (the baseline, always run), by their --systems name.
SYSTEMS = {
    "fast": "fast loop (torch fp32)",
    "torch-int8": "fast loop (torch int8)",
    **{f"ctranslate2-{name}": f"CTranslate2 {name}" for name in QUANTIZATIONS},
}
BASELINE = "HF generate (torch fp32)"


def timed(function):
    """(result, wall seconds, process CPU seconds) of `function()`."""
    started, started_cpu = time.perf_counter(), time.process_time()
    result = function()
    return result, time.perf_counter() - started, time.process_time() - started_cpu


def torch_runs(model, tokenizer, sources, batch_size: int, systems: list[str]) -> dict:
    """The torch systems to run, by row name: `generate`, then the fast loop in float32 and with int8 layers."""
    int8_model = quantize_int8(model) if "torch-int8" in systems else None  # a copy: `model` stays float32
    runs = {
        BASELINE: lambda: translate(model, tokenizer, sources, batch_size=batch_size, fast_decoding=False)
    }
    if "fast" in systems:
        runs[SYSTEMS["fast"]] = lambda: translate(model, tokenizer, sources, batch_size=batch_size)
    if int8_model is not None:
        runs[SYSTEMS["torch-int8"]] = lambda: translate(int8_model, tokenizer, sources, batch_size=batch_size)
    return runs


def measure(
    model_dir: Path, sources, references, threads: list[int], batch_size: int, systems, device
) -> list[dict]:
    """One row per (system, thread count): sentences/s, speed-up over `generate` (wall and CPU time), BLEU,
    identical lines."""
    model, tokenizer = load_translation_model(model_dir)
    model = model.float().eval().to(device)
    exports = [name for name in QUANTIZATIONS if f"ctranslate2-{name}" in systems]
    if model.device.type != "cpu":
        # the device's start-up work (kernels, library handles) outside the timings
        for fast in (False, True):
            translate(model, tokenizer, sources[:batch_size], batch_size=batch_size, fast_decoding=fast)
    rows = []
    with tempfile.TemporaryDirectory() as scratch:
        folders = {name: Path(scratch) / name for name in exports}
        for name, folder in folders.items():
            export_ctranslate2(model_dir, folder, quantization=name)
        for count in threads:
            torch.set_num_threads(count)
            runs = torch_runs(model, tokenizer, sources, batch_size, systems)
            for name, folder in folders.items():
                export = CTranslate2Model.load(folder, threads=count)
                runs[f"CTranslate2 {name}"] = lambda export=export: export.translate(
                    sources, batch_size=batch_size
                )
            baseline = None
            for system, run in runs.items():
                outputs, seconds, cpu_seconds = timed(run)
                baseline = baseline or (outputs, seconds, cpu_seconds)
                rows.append(
                    {
                        "system": system,
                        "threads": count,
                        "sentences_per_second": len(sources) / seconds,
                        "speed_up": baseline[1] / seconds,
                        "cpu_speed_up": baseline[2] / cpu_seconds,
                        "bleu": score_translations(outputs, references)["bleu"],
                        "identical": sum(a == b for a, b in zip(outputs, baseline[0], strict=True)),
                    }
                )
    return rows


def table(
    rows: list[dict], model_dir, test_name: str, sentences: int, batch_size: int, device, reused
) -> str:
    """The markdown section: what was measured, on which machine, when, under what load, and the table."""
    load = ", ".join(f"{value:.2f}" for value in os.getloadavg())
    lines = [
        f"Measured {datetime.date.today().isoformat()} with `python -m benchmarks.ctranslate2_decode {model_dir}`:"
        f" {test_name}, {sentences} sentences, beam 4 (the saved generation config), batches of {batch_size}"
        " sentences sorted by length.",
        "",
        f"Machine: {machine(device)}; freed CPU memory {'kept for reuse' if reused else 'released'}"
        f" (--cpu_memory). Load average at the end: {load} (1, 5, 15 min; above"
        f" {os.cpu_count()} the machine was shared with other jobs). The ratios compare runs made one after"
        " another in one process; 'in CPU time' divides the process's CPU seconds instead of wall seconds.",
        "",
        "| system | threads | sentences/s | speed vs HF generate | in CPU time | BLEU | lines identical to HF generate |",
        "| --- | --- | --- | --- | --- | --- | --- |",
    ]
    for row in rows:
        lines.append(
            f"| {row['system']} | {row['threads']} | {row['sentences_per_second']:.1f} | "
            f"{row['speed_up']:.2f}x | {row['cpu_speed_up']:.2f}x | {row['bleu']:.2f} | "
            f"{row['identical']}/{sentences} |"
        )
    return "\n".join(lines)


def machine(device) -> str:
    """The machine line: the CPU, and the device that decoded when it is not the CPU."""
    line = describe_hardware("cpu").line()
    return line if torch.device(device).type == "cpu" else f"{describe_hardware(device).line()}; host {line}"


def check_systems(systems: list[str] | None, device: str) -> list[str]:
    """The systems to run: all by default on the CPU, the fast loop elsewhere; int8 linear layers and the
    CTranslate2 exports (loaded on the CPU) are refused off the CPU."""
    if torch.device(device).type == "cpu":
        return systems or list(SYSTEMS)
    cpu_only = sorted(set(systems or ()) - {"fast"})
    if cpu_only:
        raise SystemExit(f"--systems {' '.join(cpu_only)}: CPU only; allowed with --device {device}: fast")
    return ["fast"]


def write_section(doc: Path, section: str) -> None:
    """Replace the text between the benchmark markers of `doc` with `section`."""
    text = doc.read_text()
    if BEGIN not in text or END not in text:
        raise ValueError(f"{doc} has no {BEGIN} ... {END} section to write the table into")
    head, rest = text.split(BEGIN, 1)
    tail = rest.split(END, 1)[1]
    doc.write_text(f"{head}{BEGIN}\n{section}\n{END}{tail}")


def main():
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("model_dir", type=Path, help="a trained model folder (train.py's output)")
    parser.add_argument("--source", type=Path, default=DATA / "test_2016_flickr.en.gz")
    parser.add_argument("--reference", type=Path, default=DATA / "test_2016_flickr.de.gz")
    parser.add_argument("--limit", type=int, default=None, help="only the first N sentences")
    parser.add_argument("--batch_size", type=int, default=64)
    parser.add_argument(
        "--threads", type=int, nargs="+", default=[1, len(os.sched_getaffinity(0))], help="default: 1 and all"
    )
    parser.add_argument(
        "--systems",
        nargs="+",
        choices=list(SYSTEMS),
        help="besides generate (always run): default all on the CPU, fast elsewhere",
    )
    parser.add_argument("--device", default="cpu", help="torch device the model decodes on (cpu, cuda, ...)")
    add_cpu_memory_flag(parser)  # for every system
    parser.add_argument("--doc", default=str(DOC), help="markdown file whose measured section is replaced")
    parser.add_argument(
        "--plot",
        default=None,
        help=f"the engines' speeds as a PNG (default: {PLOT.relative_to(PLOT.parents[1])} when --doc writes a file)",
    )
    args = parser.parse_args()
    test = read_parallel(args.source, args.reference)
    sources, references = test.source[: args.limit], test.target[: args.limit]
    threads = sorted(set(args.threads))
    systems = check_systems(args.systems, args.device)
    reused = args.cpu_memory == "reuse" and keep_freed_memory(args.device)
    rows = measure(args.model_dir, sources, references, threads, args.batch_size, systems, args.device)
    section = table(rows, args.model_dir, test.name, len(sources), args.batch_size, args.device, reused)
    print(section)
    plot = args.plot if args.plot is not None else (str(PLOT) if args.doc else "")
    if plot:
        title = f"{args.model_dir.name}, {len(sources)} sentences, beam 4; {machine(args.device)}"
        write_engines_plot(rows, plot, f"{title}; {datetime.date.today()}")
        print(f"wrote {plot}")
    if args.doc:
        write_section(Path(args.doc), section)
        print(f"wrote the table into {args.doc}")


if __name__ == "__main__":
    main()
