"""The CTranslate2 export under faults (pipeline/export/ctranslate2.py): a folder that is already an export is
refused naming it and the model folder it came from; a model folder whose config.json or generation config is
damaged is refused naming the file, before anything is written."""

import json
import shutil

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


@pytest.mark.parametrize(
    "damage, words",
    [
        (("config.json", "{broken"), ["config.json is not a JSON object of model settings"]),
        (
            ("generation_config.json", {"max_new_tokens_over_source": "50"}),
            ["max_new_tokens_over_source='50' must be a whole number", "generation_config.json"],
        ),
    ],
    ids=["config-not-json", "budget-as-text"],
)
def test_a_damaged_model_folder_is_refused_naming_the_file(damage, words, model_dir, tmp_path, run_tool):
    """Before: an OSError traceback for a config.json that is not JSON; a budget given as text was exported, and
    the export failed only when it decoded."""
    from hf_posenc.pipeline.export import ctranslate2

    folder = tmp_path / "model"
    shutil.copytree(model_dir, folder)
    name, content = damage
    if isinstance(content, dict):
        content = json.dumps({**json.loads((folder / name).read_text()), **content})
    (folder / name).write_text(content)
    code, message = run_tool(ctranslate2.main, [folder, tmp_path / "ct2"])
    assert_refused(code, message, words)
    assert not (tmp_path / "ct2").exists()
