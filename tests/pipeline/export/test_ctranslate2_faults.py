"""The CTranslate2 export under faults (pipeline/export/ctranslate2.py): a folder that is already an export is
refused naming it and the model folder it came from."""

import pytest

from tests.helpers import assert_refused

pytest.importorskip("ctranslate2")


def test_exporting_an_export_is_refused_naming_its_source(model_dir, tmp_path, run_tool):
    from hf_posenc.pipeline.export import ctranslate2

    ctranslate2.main([str(model_dir), str(tmp_path / "ct2")])
    code, message = run_tool(ctranslate2.main, [tmp_path / "ct2", tmp_path / "again"])
    assert_refused(
        code,
        message,
        [f"MODEL_DIR {tmp_path / 'ct2'} is already a CTranslate2 export", str(model_dir.resolve())],
    )
    assert not (tmp_path / "again").exists()
