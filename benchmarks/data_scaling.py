"""Time and memory of the training data at scale: train.py's data stage on a big corpus, cold and from the cache.

    python -m benchmarks.make_corpus /tmp/corpus-1m --pairs 1000000
    python -m benchmarks.data_scaling /tmp/corpus-1m [--runs 2] [--max_steps 3] [--json out.json]

Runs `train.py --recipe multi30k-en-de-small --train_source OUT/train.en.gz --train_target OUT/train.de.gz
--max_steps 3` (test set cut to 20 sentences, no checkpoints) `--runs` times in a subprocess each, on a fresh
corpus cache the first time (so the first run reads, learns the BPE, tokenises and caches; the later ones open
the cache, as a resumed run does), and prints a markdown table per run:

* wall time of the whole run, and of `prepare_data`;
* peak memory: the largest resident set of the process tree, sampled every 0.1 s (the training process and the
  tokenising workers it starts, summed), and the training process's own peak (`ru_maxrss`);
* time to the first update, from the process's start (interpreter, imports, data, model, the precision and
  attention probes, the first batch);
* the data-loading share of training: time spent fetching and collating batches (the Trainer's
  `get_batch_samples`) over the time from the first batch fetched to the last update's end; and the same after
  the first update (the first fetch also sorts the epoch's lengths, once an epoch).

Shared machines make every time noisy: run it alone where numbers matter, and report the machine line.
"""

import argparse
import json
import os
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path

import psutil

RECIPE = "multi30k-en-de-small"
SAMPLE_SECONDS = 0.1
TEST_SENTENCES = "20"  # decoding is not what is measured


def child(timings_path: Path, flags: list[str]) -> None:
    """Inside the measured process: train.py's `main` with clocks on its stages."""
    started = time.monotonic()
    from transformers import TrainerCallback

    from hf_posenc.pipeline.training import run
    from hf_posenc.pipeline.training.trainer import TranslationTrainer

    timings = {"import_seconds": time.monotonic() - started, "fetches": [], "step_ends": []}
    prepare_data = run.prepare_data

    def timed_prepare(args):
        begin = time.monotonic()
        data = prepare_data(args)
        timings["prepare_seconds"] = time.monotonic() - begin
        timings["prepared_at"] = time.monotonic() - started
        timings["data"] = data.data_report
        return data

    get_batch_samples = TranslationTrainer.get_batch_samples

    def timed_fetch(self, *args, **kwargs):
        begin = time.monotonic()
        timings.setdefault("first_fetch_at", begin - started)
        result = get_batch_samples(self, *args, **kwargs)
        timings["fetches"].append(time.monotonic() - begin)
        return result

    class StepClock(TrainerCallback):
        def on_step_end(self, args, state, control, **kwargs):
            timings["step_ends"].append(time.monotonic() - started)

    init = TranslationTrainer.__init__

    def init_with_clock(self, *args, **kwargs):
        init(self, *args, **kwargs)
        self.add_callback(StepClock())

    run.prepare_data = timed_prepare
    TranslationTrainer.get_batch_samples = timed_fetch
    TranslationTrainer.__init__ = init_with_clock
    try:
        run.main(flags)
    finally:
        timings["total_seconds"] = time.monotonic() - started
        timings_path.write_text(json.dumps(timings, indent=2))


def measure(flags: list[str], workdir: Path, name: str) -> dict:
    """One run in a subprocess under /usr/bin/time, its process tree's memory sampled meanwhile."""
    timings_path, rusage_path = workdir / f"{name}.timings.json", workdir / f"{name}.time.txt"
    command = [
        "/usr/bin/time",
        "-f",
        "%e %M",
        "-o",
        str(rusage_path),
        sys.executable,
        "-m",
        "benchmarks.data_scaling",
        "--child",
        str(timings_path),
        "--",
        *flags,
    ]
    log_path = workdir / f"{name}.log"
    code, peak = run_sampling_memory(command, log_path)
    if code:
        raise RuntimeError(f"run {name} failed (exit {code}); see {log_path}")
    wall, max_rss_kb = rusage_path.read_text().split()[-2:]
    timings = json.loads(timings_path.read_text())
    return {
        "run": name,
        "cache": timings["data"]["cache"],
        "pairs": timings["data"]["pairs_read"],
        "examples": timings["data"]["examples"],
        "wall_seconds": float(wall),
        "prepare_seconds": round(timings["prepare_seconds"], 1),
        "peak_tree_rss_gb": round(peak / 1e9, 2),
        "peak_process_rss_gb": round(int(max_rss_kb) * 1024 / 1e9, 2),
        **loading_figures(timings),
    }


def run_sampling_memory(command: list[str], log_path: Path) -> tuple[int, int]:
    """Run `command` with its output in `log_path`; its exit code and the peak resident memory (bytes) of its
    process tree, sampled every `SAMPLE_SECONDS`."""
    log = log_path.open("w")
    process = subprocess.Popen(command, stdout=log, stderr=subprocess.STDOUT)
    peak = [0]

    def sample():
        root = psutil.Process(process.pid)
        while process.poll() is None:
            try:
                tree = [root, *root.children(recursive=True)]
                peak[0] = max(peak[0], sum(p.memory_info().rss for p in tree if p.is_running()))
            except psutil.Error:  # a worker ended between listing and reading
                pass
            time.sleep(SAMPLE_SECONDS)

    sampler = threading.Thread(target=sample, daemon=True)
    sampler.start()
    code = process.wait()
    sampler.join()
    log.close()
    return code, peak[0]


def loading_figures(timings: dict) -> dict:
    """The updates and the time spent fetching batches, from the child's timings (seconds since its start);
    training time counts from the first fetch."""
    steps, fetches = timings["step_ends"], timings["fetches"]
    training = steps[-1] - timings["first_fetch_at"]
    first_step = steps[0] - timings["first_fetch_at"]
    return {
        "first_update_seconds": round(steps[0], 1),
        "updates": len(steps),
        "data_loading_share": round(sum(fetches) / training, 4),
        # after the first update: the first fetch also draws the epoch's order (a sort of every length, once an
        # epoch) and starts the loader's prefetch
        "later_data_loading_share": round(sum(fetches[1:]) / (training - first_step), 4)
        if len(steps) > 1
        else None,
        "first_fetch_seconds": round(fetches[0], 3),
        "later_fetch_seconds": round(sum(fetches[1:]) / max(1, len(fetches) - 1), 4),
        "training_seconds": round(training, 1),
    }


def table(results: list[dict]) -> str:
    lines = [
        "| run | pairs | cache (tokenizer/pairs/examples) | wall | prepare_data | peak RSS tree / process | first update "
        "| data loading: all / after the first update |",
        "| --- | --- | --- | --- | --- | --- | --- | --- |",
    ]
    for r in results:
        cache = "/".join(r["cache"][stage] for stage in ("tokenizer", "pairs", "examples"))
        lines.append(
            f"| {r['run']} | {r['pairs']:,} | {cache} | {r['wall_seconds']:.0f} s | {r['prepare_seconds']:.0f} s | "
            f"{r['peak_tree_rss_gb']:.2f} / {r['peak_process_rss_gb']:.2f} GB | {r['first_update_seconds']:.0f} s | "
            f"{100 * r['data_loading_share']:.1f}% / {100 * (r['later_data_loading_share'] or 0):.1f}% of "
            f"{r['training_seconds']:.0f} s ({r['updates']} updates; first fetch {r['first_fetch_seconds']:.2f} s, "
            f"then {1000 * r['later_fetch_seconds']:.0f} ms) |"
        )
    return "\n".join(lines)


def main(argv=None) -> None:
    argv = list(sys.argv[1:] if argv is None else argv)
    if argv[:1] == ["--child"]:
        return child(Path(argv[1]), argv[3:])
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument(
        "corpus", type=Path, help="a folder with train.en.gz and train.de.gz (make_corpus.py)"
    )
    parser.add_argument("--runs", type=int, default=2, help="the first on a fresh cache, the others reuse it")
    parser.add_argument("--max_steps", type=int, default=3)
    parser.add_argument("--cache", type=Path, help="corpus cache folder (default: a fresh temporary one)")
    parser.add_argument("--json", type=Path, help="also write the results here")
    parser.add_argument("flags", nargs="*", help="more train.py flags (after --)")
    args = parser.parse_args(argv)
    from hf_posenc.pipeline.training.hardware import describe_hardware

    with tempfile.TemporaryDirectory(prefix="data-scaling-") as folder:
        workdir = Path(folder)
        cache = args.cache or workdir / "cache"
        if cache.exists() and any(cache.iterdir()):
            parser.error(f"--cache {cache} is not empty: the first run must build the cache")
        results = []
        for index in range(args.runs):
            flags = [
                "--recipe",
                RECIPE,
                "--train_source",
                str(args.corpus / "train.en.gz"),
                "--train_target",
                str(args.corpus / "train.de.gz"),
                "--max_steps",
                str(args.max_steps),
                "--test_limit",
                TEST_SENTENCES,
                "--save_strategy",
                "no",
                "--average_last",
                "0",
                "--fail_on_degenerate",
                "false",
                "--examples",
                "0",
                "--data_cache_dir",
                str(cache),
                "--output_dir",
                str(workdir / f"run-{index}"),
                *args.flags,
            ]
            result = measure(flags, workdir, "cold" if index == 0 else f"cached-{index}")
            print(json.dumps(result), flush=True)
            results.append(result)
    print(f"\n{describe_hardware('cpu').line()}; load average {os.getloadavg()[0]:.1f} at the end\n")
    print(table(results))
    if args.json:
        args.json.write_text(json.dumps(results, indent=2) + "\n")


if __name__ == "__main__":
    main()
