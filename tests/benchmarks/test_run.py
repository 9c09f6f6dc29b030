"""Smoke test of the benchmark command (benchmarks/run.py) on a tiny config: no timing is asserted."""

import json
import subprocess
import sys

import pytest
import torch

from benchmarks import run
from benchmarks.harness import MODEL_SIZES, build_model, count_parameters, generation_run, real_length_batch
from benchmarks.plots import throughput_panels
from benchmarks.run import fit_randomized_positions, int8_models, parse_args, peak_flops, select_systems
from hf_posenc.pipeline.data.files import ParallelText
from hf_posenc.pipeline.evaluation.quantization import is_int8
from hf_posenc.pipeline.training import arguments
from tests.helpers import REPO

ERRORS_OFF_FP32 = "int8 decoding is measured on the CPU in float32 only (--precision fp32)"
TINY_COMMAND = [sys.executable, "-m", "benchmarks.run", *"--config tiny --threads 1 --precision fp32".split()]


def test_benchmark_command_writes_tables_and_plots_for_every_system(tmp_path):
    """Protects `make bench`: the one command runs end to end and reports every system against stock Marian."""
    notes = "hand-written analysis that a rerun must keep"
    (tmp_path / "benchmarks-tiny.md").write_text(
        "old tables\n<!-- Everything below this line is kept when benchmarks/run.py rewrites this file. -->\n"
        + notes
    )
    command = [*TINY_COMMAND]
    command += [
        "--systems",
        "shaw",
        "rposnet_precomputed",
        "learned-shape",  # trains past the longest length: the tables must hold it plus the shift
        "--lengths",
        "8",
        "16",
        "--tokens_per_batch",
        "32",
    ]
    command += ["--forward_times", "2", "--repeats", "1", "--generation_batch_sizes", "1", "2"]
    command += ["--source_length", "5", "--new_tokens", "3", "--decode_prefixes", "3", "6"]
    command += ["--decode_rounds", "2"]
    command += ["--output_dir", str(tmp_path)]
    subprocess.run(command, check=True, cwd=REPO, timeout=120)

    markdown = (tmp_path / "benchmarks-tiny.md").read_text()  # each size keeps its own page
    for section in ("Training step", "Memory ratio", "Forward benchmark", "Generation", "Per-token decoding"):
        assert section in markdown
    for system in ("marian", "shaw", "rposnet_precomputed", "learned-shape"):
        assert f"| {system} |" in markdown
    assert (
        "- shaw train ≥ 0.85: **" in markdown and "per-token decode growth 3→6" in markdown
    )  # targets judged
    assert "Model FLOPs utilisation" in markdown and "measured: dense fp32 matmul on this machine" in markdown
    assert "old tables" not in markdown and markdown.endswith(notes)
    assert "python -m benchmarks.run --config tiny" in markdown

    results = json.loads((tmp_path / "benchmarks-tiny.json").read_text())
    assert set(results["parameters"]) == {"marian", "shaw", "rposnet_precomputed", "learned-shape"}
    assert "rposnet_precomputed@8" not in results["training"]["tokens_per_second"]  # inference only
    assert 0 < results["training"]["mfu"]["shaw@16"] < 1
    measured = results["generation"]["tokens_per_second"]
    assert {"marian@b2k4", "rposnet_precomputed@b2k4", "rposnet_precomputed+fast@b2k4"} <= measured.keys()
    assert "marian+fast@b2k4" not in measured  # stock Marian has no fast loop
    assert results["generation"]["identical"] == {  # the fast loop returns generate's tokens for every system
        f"{system}@b{b}k{k}": True
        for system in ("shaw", "rposnet_precomputed", "learned-shape")
        for b in (1, 2)
        for k in (1, 4)
    }
    assert "### The fast decoding loop" in markdown and "(tokens differ)" not in markdown
    plots = ("benchmarks-tiny_throughput.png", "benchmarks-tiny_generation.png", "benchmarks-tiny_decode.png")
    for plot in plots:
        png = (tmp_path / plot).read_bytes()
        assert (
            png.startswith(b"\x89PNG") and b"systems: marian, shaw, rposnet_precomputed, learned-shape" in png
        )


def test_the_training_phase_alone_with_torch_compile(tmp_path):
    """`--phases training --compile` (how base and big are measured): only the training tables, each system also
    trained compiled, with its first step, its speed over eager and when compiling pays."""
    command = [sys.executable, "-m", "benchmarks.run", "--config", "tiny", "--threads", "1"]
    command += [
        "--precision",
        "fp32",
        "--systems",
        "sinusoidal",
        "--lengths",
        "8",
        "--tokens_per_batch",
        "32",
    ]
    command += ["--repeats", "1", "--phases", "training", "--compile", "--output_dir", str(tmp_path)]
    subprocess.run(command, check=True, cwd=REPO, timeout=600)
    markdown = (tmp_path / "benchmarks-tiny.md").read_text()
    assert "Training step" in markdown and "## torch.compile (training step)" in markdown
    assert "Forward benchmark" not in markdown and "Per-token decoding" not in markdown
    results = json.loads((tmp_path / "benchmarks-tiny.json").read_text())
    assert set(results["phase_seconds"]) == {"training"}
    speed, first = results["training"]["tokens_per_second"], results["training"]["first_step_seconds"]
    assert {"marian@8", "sinusoidal@8", "marian+compile@8", "sinusoidal+compile@8"} == speed.keys()
    assert first.keys() == {"marian+compile@8", "sinusoidal+compile@8"} and min(first.values()) > 0
    assert results["training"]["mfu"]["sinusoidal+compile@8"] > 0  # its eager twin's FLOPs
    assert (tmp_path / "benchmarks-tiny_throughput.png").is_file()
    assert not (tmp_path / "benchmarks-tiny_decode.png").exists()


def test_systems_train_in_groups_that_fit_in_memory_each_led_by_the_baseline(monkeypatch):
    """At base size two dozen systems with their optimizers do not fit in 24 GiB at once: the training phase
    interleaves them in groups sized from the memory available, each group with the baseline."""
    from benchmarks import run

    args = parse_args(["--config", "base", "--precision", "fp32", "--attention_backend", "eager"])
    systems = select_systems(["shaw", "t5_bias", "alibi", "rope", "rposnet_precomputed"])
    fields = run.model_fields(args, systems)
    largest = max(count_parameters(fields, system.overrides) for system in systems)
    pages = 3 * 2 * run.TRAINING_BYTES_PER_PARAMETER * largest / run.MEMORY_SHARE / 4096  # room for 3 systems
    monkeypatch.setattr(run.os, "sysconf", lambda name: 4096 if name == "SC_PAGE_SIZE" else int(pages) + 1)
    groups = [[system.name for system in group] for group in run.training_groups(systems, fields, args)]
    assert groups == [["marian", "shaw", "t5_bias"], ["marian", "alibi", "rope"]]  # inference-only left out


def test_a_given_peak_replaces_the_measured_one_in_mfu(monkeypatch):
    """--peak_tflops (a GPU's datasheet peak) is used as given, without measuring."""
    from benchmarks import run

    monkeypatch.setattr(run, "matmul_peak_flops", lambda *args: pytest.fail("the peak was given"))
    peak = peak_flops(parse_args(["--peak_tflops", "989"]))
    assert peak["flops"] == 989e12 and "given" in peak["source"]


@pytest.mark.parametrize("system", select_systems(None), ids=lambda system: system.name)
def test_every_benchmarked_system_builds_on_the_meta_device(system):
    """`make bench` counts every system's parameters on the meta device first (folded systems included)."""
    fields = dict(MODEL_SIZES["small"], max_position_embeddings=512)
    assert count_parameters(fields, system.overrides, system.precomputed) > 0


@pytest.mark.parametrize("size", ["base", "big"])
def test_base_and_big_sizes_are_the_wmt_recipes_models(size):
    """`make bench SIZE=base|big` measures the model its WMT recipe trains (width, depth, heads, FFN)."""
    recipe = arguments.load_recipe(f"wmt14-en-de-{size}")
    fields = MODEL_SIZES[size]
    assert fields["d_model"] == recipe["d_model"]
    assert fields["encoder_layers"] == fields["decoder_layers"] == recipe["layers"]
    assert fields["encoder_attention_heads"] == fields["decoder_attention_heads"] == recipe["heads"]
    assert fields["encoder_ffn_dim"] == fields["decoder_ffn_dim"] == recipe["ffn_dim"]
    assert parse_args(["--config", size]).config == size


def test_real_lengths_end_each_example_at_its_reference_length():
    """`--generation_lengths real`: sources at the pairs' lengths, and every output (greedy and beam 4, `generate`
    and the fast loop alike) ends at its reference's length."""
    pairs = ParallelText(["a b c", "a b c d e f g", "a"], ["x y", "x y z w v", "x y z w"], "pairs")
    model = build_model(MODEL_SIZES["tiny"], {}, "cpu").eval()
    source, lengths = real_length_batch(pairs, 3, model.config, torch.Generator().manual_seed(0))
    assert source.tolist()[2] == [source[2, 0].item(), 1, 0, 0, 0, 0, 0, 0] and lengths.tolist() == [3, 6, 5]
    for beams in (1, 4):
        outputs = [
            generation_run(model, source, 0, beams, "cpu", None, fast, lengths)() for fast in (False, True)
        ]
        assert torch.equal(*outputs)
        ends = [row.tolist().index(model.config.eos_token_id, 1) for row in outputs[0]]
        assert ends == lengths.tolist()  # </s> at generated token L (the start token is index 0)


@pytest.mark.usefixtures("multi30k_dir")  # reads the shipped data
def test_the_generation_phase_with_real_lengths(tmp_path):
    command = [*TINY_COMMAND, *"--systems rpe_head --phases generation --generation_lengths real".split()]
    command += ["--repeats", "1", "--generation_batch_sizes", "4", "--output_dir", str(tmp_path)]
    subprocess.run(command, check=True, cwd=REPO, timeout=300)
    markdown = (tmp_path / "benchmarks-tiny.md").read_text()
    assert "each output ending at its reference's" in markdown and "examples finish apart" in markdown
    results = json.loads((tmp_path / "benchmarks-tiny.json").read_text())
    assert results["generation"]["identical"] == {"rpe_head@b4k1": True, "rpe_head@b4k4": True}
    assert "### The fast loop with int8 linear layers over `generate`" in markdown
    if results["generation"]["int8_missing"] is None:  # measured where torch's int8 product is the faster one
        assert {"rpe_head+int8@b4k1", "rpe_head+int8@b4k4"} <= results["generation"][
            "tokens_per_second"
        ].keys()
    else:
        assert "int8 decoding is slower than float32 on this CPU" in results["generation"]["int8_missing"]


def test_int8_decoding_is_measured_on_the_cpu_in_float32_where_its_product_is_faster(monkeypatch):
    models = {"marian": build_model(MODEL_SIZES["tiny"], None, "cpu").eval()}
    models["rope"] = build_model(MODEL_SIZES["tiny"], {"position_encoding": "rope"}, "cpu").eval()
    args = parse_args(["--config", "tiny", "--precision", "fp32"])
    assert int8_models(models, args, torch.bfloat16) == ({}, ERRORS_OFF_FP32)
    monkeypatch.setattr(run, "check_int8_speed", lambda: None)
    quantized, missing = int8_models(models, args, None)
    assert missing is None and list(quantized) == ["rope"] and is_int8(quantized["rope"])
    assert not is_int8(models["rope"])  # a copy: the float32 system stays as it was

    def slower():
        raise ValueError("int8 decoding is slower than float32 on this CPU (...)")

    monkeypatch.setattr(run, "check_int8_speed", slower)
    assert int8_models(models, args, None) == ({}, "int8 decoding is slower than float32 on this CPU (...)")


def test_randomized_positions_draw_below_the_longest_length_measured(tmp_path):
    """A variant's L (64, sized for the conformance suite) is raised to the longest position measured, so that
    `make bench` trains such systems at lengths past it instead of failing there (it did, at 128)."""
    systems = fit_randomized_positions(select_systems(["learned-randomized", "sinusoidal"]), 1025)
    assert [s.overrides and s.overrides.get("randomized_positions_max") for s in systems] == [
        None,
        1025,
        None,
    ]
    command = [*TINY_COMMAND, *"--systems learned-randomized --phases training --lengths 80".split()]
    command += ["--tokens_per_batch", "160", "--repeats", "1", "--output_dir", str(tmp_path)]
    subprocess.run(command, check=True, cwd=REPO, timeout=120)
    results = json.loads((tmp_path / "benchmarks-tiny.json").read_text())
    assert results["training"]["tokens_per_second"]["learned-randomized@80"] > 0


def test_the_throughput_plot_has_a_compiled_over_eager_panel_with_compile():
    """Training and forward as ratios to stock Marian at each length; with --compile a third panel, each system's
    compiled training over its own eager training (eager over eager, compiled over compiled never)."""
    training = {"marian@8": 100.0, "rope@8": 50.0, "marian+compile@8": 150.0, "rope+compile@8": 40.0}
    results = {
        "training": {"tokens_per_second": training},
        "forward_seconds": {"marian@8": 2.0, "rope@8": 4.0},
    }
    args = parse_args(["--config", "tiny", "--lengths", "8", "--compile", "--precision", "fp32"])
    panels = throughput_panels(results, args)
    assert [panel[0] for panel in panels] == [
        {"marian@8": 1.0, "rope@8": 0.5},
        {"marian@8": 1.0, "rope@8": 0.5},
        {"marian@8": 1.5, "rope@8": 0.8},
    ]
    assert panels[2][2:] == ("torch.compile (training)", "compiled / eager throughput")
    args.compile = False
    assert len(throughput_panels(results, args)) == 2
