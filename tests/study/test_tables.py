"""The comparison's tables (study/tables.py): every system is a valid training command and model, rows name where
the model departs from the paper, every table holds its baseline, and the extrapolation, rpe_dim and LightConv
chain rows are the papers'."""

import pytest
import torch

from benchmarks.harness import MODEL_SIZES
from hf_posenc import POSITION_ENCODINGS, TOKEN_MIXERS, MarianPosEncConfig
from hf_posenc.mixer_lightconv import LightConv
from hf_posenc.pipeline.export.model_card import paper_deviations
from hf_posenc.pipeline.training import arguments
from study import claims, cli, runs, tables
from study.tables import comparison_tables


def test_the_d_r_sweep_rows_are_valid_models_of_the_cpu_comparison():
    """The comparison's rpe_dim table (paper 3 Fig. 2 at half width): every row builds at d_model 256 with 4
    heads of 64, and each layout's sweep brackets its default d_r there (the paper's best, scaled; that row is
    the main system)."""
    rows = comparison_tables()["rpe_dim"][1:]  # after the sinusoidal baseline
    small = dict(MODEL_SIZES["small"], max_position_embeddings=256)
    for layout in ("rpe_head", "mpr_head"):
        encoding = POSITION_ENCODINGS[layout]
        swept = []
        for system in rows:
            if system.name.startswith(layout):
                config = MarianPosEncConfig(**small, **system.overrides)
                assert config.encoder_position_encoding == config.decoder_position_encoding == layout
                swept.append(encoding.resolve_rpe_dim(config, "encoder"))
        default = encoding.resolve_rpe_dim(MarianPosEncConfig(**small), "encoder")
        assert len(swept) >= 3 and min(swept) < default < max(swept) and default in swept


def test_the_lightconv_chain_follows_table_7_and_every_row_builds(source_batch, target_batch, tiny_model):
    """Paper 2 Table 7 in order: Transformer, Shaw, Light Convolution (no GLU), LightConv, + GeLU gating,
    + global context, rPosNet (its main system, learned input embeddings); each row is a valid model."""
    rows = comparison_tables()["lightconv_chain"]
    assert [row.name for row in rows] == [
        "sinusoidal",
        "shaw",
        "lightconv-no-glu",
        "lightconv",
        "lightconv+gelu-gating",
        "lightconv+gelu-gating+global-context",
        "rposnet",
    ]
    expected = {  # (gating, global context) of the lightconv rows
        "lightconv-no-glu": ("none", False),
        "lightconv": ("glu", False),
        "lightconv+gelu-gating": ("gelu", False),
        "lightconv+gelu-gating+global-context": ("gelu", True),
    }
    for row in rows:
        model = tiny_model(**row.overrides)
        encoder_mixer = model.model.encoder.layers[0].self_attn
        if row.name in expected:
            assert type(encoder_mixer) is LightConv
            assert (model.config.lightconv_gating, model.config.lightconv_global_context) == expected[
                row.name
            ]
            assert model.config.encoder_position_encoding == "sinusoidal"  # paper 2 §5.2
        with torch.no_grad():
            logits = model(input_ids=source_batch()[0], decoder_input_ids=target_batch()).logits
        assert torch.isfinite(logits).all()
    rposnet = tiny_model(**rows[-1].overrides)
    assert type(rposnet.model.decoder.layers[0].self_attn) is TOKEN_MIXERS["rposnet"]
    assert rposnet.config.encoder_position_encoding == "learned"
    assert (
        type(tiny_model(**rows[1].overrides).model.encoder.layers[0].self_attn) is TOKEN_MIXERS["attention"]
    )


@pytest.mark.parametrize("system", sorted(tables.SYSTEMS))
def test_every_system_is_a_valid_training_command(system):
    """train.py accepts each run's arguments and builds the system's model."""
    run = runs.Run(cli.COMPARISON_RECIPE, "en-de", system, 1)
    args = cli.parse_args([])
    args.run_precision = "fp32"
    train_args = arguments.parse_args([*runs.train_arguments(run, args), "--output_dir", "unused"])
    config = arguments.model_config(train_args, 100, 0, 1)
    for field, value in tables.SYSTEMS[system].overrides.items():
        assert getattr(config, field) == value
    for field, value in tables.SYSTEMS[system].training.items():  # training options: train.py's settings
        holder = next(part for part in (train_args.data, train_args.model) if hasattr(part, field))
        assert getattr(holder, field) == value


def test_rows_name_where_the_model_departs_from_the_paper():
    def deviations(name):
        return paper_deviations(tables.row_config(tables.SYSTEMS[name], "multi30k-en-de-compare"))

    assert deviations("mpr_head@decoder") == [
        "decoder: d_r = 128 (paper: 256 at d_model 512; scaled to d_model 256, rounded down to a multiple of 4)"
    ]
    assert deviations("rpe_head")[0].startswith("encoder and decoder: d_r = 128 (paper: 320 at d_model 512")
    assert deviations("mpr_head-dr64") == deviations("sinusoidal") == []


def test_every_table_holds_the_baseline_and_claims_name_known_systems():
    assert list(tables.TABLES) == list(tables.TABLE_TITLES)  # every table has a title, in report order
    for table, systems in tables.TABLES.items():
        assert tables.REFERENCE_SYSTEM in [s.name for s in systems], table
    for claim in claims.CLAIMS:
        assert claim.system in tables.SYSTEMS and claim.reference in tables.SYSTEMS, claim.claim
        assert claim.relation in claims.TESTS and claim.source, claim.claim


def test_extrapolation_rows_train_on_joined_pairs_and_measure_to_k16():
    """#48 part 2: every length-relevant encoding trained as sinusoidal+concat4 (2-4 joined pairs, a 512-position
    table) and measured at k = 1..16; other rows keep the harness's default k, and --length_k overrides both."""
    rows = [s for s in tables.TABLES["extrapolation"] if s.name != tables.REFERENCE_SYSTEM]
    names = {s.name.removesuffix("+concat4") for s in rows}
    assert names == {
        "sinusoidal",
        "learned",
        "alibi",
        "rope",
        "fire",
        "kerple",
        "t5_bias",
        "shaw",
        "rposnet",
    } | {
        "mpr_head",
        "nope-decoder",
    }
    for system in rows:
        assert system.training == tables.CONCAT4, system.name
        assert system.overrides["max_position_embeddings"] == 512, system.name
        assert tables.length_k(system.name) == [1, 2, 4, 8, 16]
    assert (
        tables.SYSTEMS["sinusoidal+concat4"] in tables.TABLES["length"]
    )  # one row, two tables, trained once
    assert tables.SYSTEMS["nope-decoder+concat4"].overrides["decoder_position_encoding"] == "none"
    assert tables.length_k("sinusoidal") == tables.length_k("nope-decoder") == [1, 2, 4, 8]
    args = cli.parse_args([])
    rope = runs.Run(args.recipe, "en-de", "rope+concat4", 1)
    assert runs.run_settings(rope, args)["length_k"] == [1, 2, 4, 8, 16]
    assert runs.run_settings(rope, cli.parse_args(["--length_k", "1", "2"]))["length_k"] == [1, 2]
    # every row's model takes a k = 16 input (at most 283 source tokens on the test set) and its decoding margin
    for system in rows:
        assert tables.row_config(system, args.recipe).max_position_embeddings >= 283 + 50, system.name


def test_every_row_has_the_config_train_py_builds_for_it():
    """The report reads every row's config (its paper deviations): a row with a training option that the config
    needs (sentence-aware positions: `--sentence_positions` gives the sentence-end ids) builds as train.py builds it."""
    for name, system in tables.SYSTEMS.items():
        config = tables.row_config(system, "multi30k-en-de-compare")
        assert bool(config.sentence_end_token_ids) == bool(system.training.get("sentence_positions")), name
