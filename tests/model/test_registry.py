"""Adding a module is its file and its registry entry: everything that lists modules reads the registry and
the module's own metadata. Proved on a copy of the package with a toy encoding added and nothing else
changed: its config field, main system (in the comparison's main table), variant, benchmark systems, conformance
variants, model-card entry, position panel and departures from the paper all appear."""

import json
import os
import shutil
import subprocess
import sys
import textwrap

from tests.helpers import REPO

TOY_FILE = textwrap.dedent(
    '''
    """A toy encoding for the registry test: x_j + scale * j / L_max, added to every feature."""

    import torch

    from .base import Hyperparameter, PositionEncoding, PositionPanel


    class ToyPositionEncoding(PositionEncoding):
        title = "Toy"
        reference = "tests/model/test_registry.py, Eq. 1"
        citations = ("Nobody 2026. A Toy Position Encoding. Nowhere.",)
        hyperparameters = {"toy_scale": Hyperparameter(float, 0.5, "how much of the position to add", minimum=0.0)}
        variants = {"big": {"toy_scale": 2.0}}

        def embed(self, inputs_embeds, context, padding_mask, cache):
            ramp = context.query_positions[..., None].to(inputs_embeds.dtype) / self.config.max_position_embeddings
            return inputs_embeds + self.config.toy_scale * ramp  # (B, L, D)

        def position_panels(self, positions):
            return [PositionPanel(f"{self.stack}: toy ramp", "curves", torch.arange(positions)[None].float())]

        @classmethod
        def paper_deviations(cls, config, place):
            return [f"scale {config.toy_scale} (paper: 0.5)"] if config.toy_scale != 0.5 else []
    '''
)

CHECK = textwrap.dedent(
    """
    import json, torch
    import hf_posenc
    from hf_posenc import MarianPosEncConfig, MarianPosEncForConditionalGeneration
    from hf_posenc.analysis.position_plots import position_panels
    from hf_posenc.pipeline.export.model_card import module_sources
    from benchmarks.systems import benchmark_systems, conformance_variants
    from hf_posenc.pipeline.export.model_card import paper_deviations
    from study.tables import comparison_tables

    config = MarianPosEncConfig(position_encoding="toy", toy_scale=0.25, vocab_size=20, d_model=16, encoder_layers=1,
                                decoder_layers=1, encoder_attention_heads=2, decoder_attention_heads=2,
                                encoder_ffn_dim=8, decoder_ffn_dim=8)
    try:
        MarianPosEncConfig(position_encoding="toy", toy_scale=-1.0)
        rejected = False
    except ValueError:
        rejected = True
    model = MarianPosEncForConditionalGeneration(config).eval()
    logits = model(input_ids=torch.tensor([[3, 4, 1]]), decoder_input_ids=torch.tensor([[0, 5]])).logits
    tables = comparison_tables()
    print(json.dumps({
        "config_field": config.toy_scale,
        "default": MarianPosEncConfig().toy_scale,
        "negative_rejected": rejected,
        "logits": list(logits.shape),
        "main": [s.name for s in tables["main"]],
        "benchmarks": [s.name for s in benchmark_systems()],
        "conformance": [name for name, _ in conformance_variants()],
        "card": module_sources({"encoder_position_encoding": "toy"}),
        "panels": [panel.title for panel in position_panels(model, positions=4)],
        "deviations": paper_deviations(config),
    }))
    """
)


def test_a_toy_module_added_by_its_file_and_registry_entry_appears_everywhere(tmp_path):
    package = tmp_path / "hf_posenc"
    shutil.copytree(REPO / "hf_posenc", package, ignore=shutil.ignore_patterns("__pycache__"))
    (package / "posenc_toy.py").write_text(TOY_FILE)
    registry = package / "registry.py"
    text = registry.read_text()
    text = text.replace(
        "\nPOSITION_ENCODINGS = {\n",
        "\nfrom .posenc_toy import ToyPositionEncoding\n\nPOSITION_ENCODINGS = {\n",
    )
    text = text.replace(
        "\nPOSITION_ENCODINGS = {\n", '\nPOSITION_ENCODINGS = {\n    "toy": ToyPositionEncoding,\n', 1
    )
    registry.write_text(text)
    completed = subprocess.run(
        [sys.executable, "-c", CHECK],
        capture_output=True,
        text=True,
        timeout=300,
        env={**os.environ, "PYTHONPATH": f"{tmp_path}{os.pathsep}{REPO}"},  # the copy first, then benchmarks/
        cwd=tmp_path,
    )
    assert completed.returncode == 0, completed.stderr[-3000:]
    seen = json.loads(completed.stdout.strip().splitlines()[-1])
    assert seen["config_field"] == 0.25 and seen["default"] == 0.5 and seen["negative_rejected"]
    assert seen["logits"] == [1, 2, 20]
    assert "toy" in seen["main"]
    assert {"toy", "toy-big"} <= set(seen["benchmarks"])
    assert {"pe-toy", "toy-big"} <= set(seen["conformance"])
    lines, citations = seen["card"]
    assert (
        "`toy` (Toy): tests/model/test_registry.py, Eq. 1" in lines and "A Toy Position Encoding" in citations
    )
    assert seen["panels"] == ["encoder: toy ramp", "decoder: toy ramp"]
    assert seen["deviations"] == ["encoder and decoder: scale 0.25 (paper: 0.5)"]
