"""The `make train` path on real data: a tiny run in CI, the full default recipe marked slow."""

import json
import subprocess
import sys
import textwrap

import pytest
from conftest import REPO

sys.path.insert(0, str(REPO / "train_scripts"))
import train  # noqa: E402  (train_scripts/ is a folder of scripts, not a package)

TINY = [
    "--train_limit", "3000", "--test_limit", "40", "--max_steps", "30", "--d_model", "32", "--layers", "1",
    "--heads", "4", "--ffn_dim", "64", "--vocab_size", "1200", "--max_tokens", "1500", "--threads", "2",
    "--examples", "2",
]  # fmt: skip

LOAD_WITHOUT_PACKAGE = textwrap.dedent(
    """
    import json, sys
    sys.modules["hf_posenc"] = None
    from transformers import AutoModelForSeq2SeqLM, AutoTokenizer
    folder = sys.argv[1]
    model = AutoModelForSeq2SeqLM.from_pretrained(folder, trust_remote_code=True).eval()
    tokenizer = AutoTokenizer.from_pretrained(folder, trust_remote_code=True)
    batch = tokenizer(["A man is riding a bike.", "Two dogs play in the snow."], return_tensors="pt", padding=True)
    out = model.generate(**batch)
    print(json.dumps({"module": type(model).__module__, "translations": tokenizer.batch_decode(out, skip_special_tokens=True)}))
    """
)


def test_tiny_training_run_writes_a_hub_ready_folder_that_loads_without_the_package(multi30k_dir, tmp_path, capsys):
    output = tmp_path / "run"
    scores = train.main([*TINY, "--data_dir", str(multi30k_dir), "--position_encoding", "learned",
                         "--output_dir", str(output)])  # fmt: skip
    printed = capsys.readouterr().out
    assert "BLEU" in printed and "nrefs:1|case:mixed|eff:no|tok:13a" in printed and "chrF++" in printed
    assert scores["steps"] == 30 and scores["test_pairs"] == 40
    for name in ("model.safetensors", "config.json", "generation_config.json", "tokenizer.json", "README.md",
                 "scores.json", "modeling_marian_posenc.py", "posenc_absolute.py", "test_2016_flickr.hyp.de"):
        assert (output / name).is_file(), name
    config = json.loads((output / "config.json").read_text())
    assert config["auto_map"]["AutoModelForSeq2SeqLM"].startswith("modeling_marian_posenc.")
    assert config["encoder_position_encoding"] == "learned"
    card = (output / "README.md").read_text()
    assert card.startswith("---\n") and "model-index:" in card and f"value: {scores['bleu']}" in card
    assert len((output / "test_2016_flickr.hyp.de").read_text().splitlines()) == 40

    completed = subprocess.run([sys.executable, "-c", LOAD_WITHOUT_PACKAGE, str(output)], capture_output=True,
                               text=True, timeout=300, cwd=tmp_path)  # fmt: skip
    assert completed.returncode == 0, completed.stderr[-3000:]
    loaded = json.loads(completed.stdout.strip().splitlines()[-1])
    assert loaded["module"].startswith("transformers_modules")
    assert len(loaded["translations"]) == 2


def test_stock_marian_baseline_runs_through_the_same_pipeline(multi30k_dir, tmp_path):
    scores = train.main([*TINY, "--data_dir", str(multi30k_dir), "--architecture", "stock_marian",
                         "--max_steps", "5", "--output_dir", str(tmp_path / "stock")])  # fmt: skip
    assert scores["architecture"] == "stock_marian" and scores["precision"] == "fp32" and scores["steps"] == 5


def test_missing_data_folder_is_reported_with_the_file_it_looked_for(tmp_path):
    with pytest.raises(FileNotFoundError, match=r"no file train\.en\[\.gz\] in"):
        train.main(["--data_dir", str(tmp_path), "--max_steps", "1"])


@pytest.mark.slow
def test_default_recipe_learns_to_translate_in_a_few_minutes(multi30k_dir, tmp_path):
    """The default recipe (d256, 3+3, bf16, token batches) for 4 minutes: well above chance."""
    scores = train.main(["--data_dir", str(multi30k_dir), "--minutes", "4", "--test_limit", "300",
                         "--output_dir", str(tmp_path / "default")])  # fmt: skip
    assert scores["bleu"] > 10, scores
