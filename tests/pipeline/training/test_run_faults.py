"""Training runs under faults (pipeline/training/run.py): settings that would fail only after the data stage are
refused with the other settings, before any data are read."""

from hf_posenc.pipeline.training import run
from tests.helpers import assert_refused


def test_an_unknown_torch_compile_backend_is_refused_before_the_data(
    tmp_path, run_tool, monkeypatch, tiny_run_flags
):
    def no_data(*args, **kwargs):
        raise AssertionError("the data stage ran")

    monkeypatch.setattr(run, "prepare_data", no_data)
    flags = [*tiny_run_flags(), "--output_dir", tmp_path / "run", "--torch_compile_backend", "inductr"]
    code, message = run_tool(run.main, flags)
    assert_refused(
        code, message, ["--torch_compile_backend='inductr' is not a torch.compile backend", "inductor"]
    )
