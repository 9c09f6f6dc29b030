"""The comparison's tables: the main table, every registered module's main system (generated from the
registries, so a new registry entry appears in it by itself), and the ablation tables, whose rows test what the
papers say about particular modules and training options.

A row's name is where its results live (`results/<recipe>/<pair>/<row>/seed<N>/`) and its config fields are part
of the settings a finished run is recognised by, so renaming a row or changing its fields retrains it.
"""

import json
import math
from dataclasses import dataclass, field

from benchmarks.systems import System, main_systems, module_overrides
from hf_posenc.analysis.length_generalisation import DEFAULT_K
from hf_posenc.configuration_marian_posenc import MarianPosEncConfig
from hf_posenc.pipeline.training.arguments import model_config
from hf_posenc.pipeline.training.arguments import parse_args as parse_train_args

# The system every row is compared with (Δ BLEU, paired bootstrap, verdicts): Marian's own sinusoids.
REFERENCE_SYSTEM = "sinusoidal"

# The tables, in report order.
TABLE_TITLES = {
    "main": "Every module (paper 1 Table 1, paper 2 Table 2, paper 3 Table 1)",
    "gating": "Gating on and off (paper 2 Table 6)",
    "placement": "rPosNet placement (paper 2 Table 5; ES encoder self-, DS decoder self-, C cross-attention)",
    "recurrent": "Recurrent positional embeddings, encoder/decoder ablation (paper 3)",
    "lightconv_chain": "From LightConv to rPosNet (paper 2 Appendix E, Table 7)",
    "posnet_dim": "PosNet-Embed kernel dimension d_p (paper 1 Fig. 3)",
    "rpe_dim": "RPE dimension d_r (paper 3 Fig. 2)",
    "length": "Length generalisation: extrapolating encodings and training options",
    "extrapolation": "Extrapolation past the training length: length-relevant encodings trained on 2-4 joined "
    "sentences",
    "length_options": "Translating past the training length: each length option on the best extrapolation rows",
}

# Training on 2-4 joined pairs (Varis & Bojar 2021) reaches training examples of about 4 test sentences (at most
# max_length tokens); k = 8 and 16 are twice and four times that. A 512-position table holds the k = 16 inputs
# (at most 283 source tokens on test_2016_flickr, plus the 50 new tokens decoding allows).
CONCAT4 = {"concat_probability": 0.5, "concat_group_sizes": [2, 3, 4]}
EXTRAPOLATION_K = (1, 2, 4, 8, 16)
EXTRAPOLATION_POSITIONS = {"max_position_embeddings": 512}


@dataclass(frozen=True)
class Decoding:
    """A decode-time row: the trained models of row `trained_as`, decoded with `generate` settings (generation
    config fields, e.g. length control) and loaded with `config` fields changed (e.g. `rope_scaling`)."""

    trained_as: str
    generate: dict = field(default_factory=dict, hash=False)
    config: dict = field(default_factory=dict, hash=False)


@dataclass(frozen=True)
class Row:
    """An ablation row: config fields over the main system of `module` (None: over the config's defaults), and
    train.py's data fields for a training option."""

    module: str | None = None
    overrides: dict = field(default_factory=dict, hash=False)
    training: dict = field(default_factory=dict, hash=False)
    length_k: tuple[int, ...] = DEFAULT_K  # the joined test sentences the length harness measures
    decoding: Decoding | None = None  # a decode-time row: no training of its own

    def system(self, name: str) -> System:
        base = module_overrides(self.module) if self.module else {}
        return System(name, {**base, **self.overrides}, self.training)


LENGTH_OPTION_BASES = ("fire", "kerple")
# RoPE scaled at inference by the ratio of the k = 16 inputs to the longest training examples (about 4).
ROPE_SCALINGS = {
    "linear4": {"rope_type": "linear", "factor": 4.0},
    "dynamic4": {"rope_type": "dynamic", "factor": 4.0, "original_max_position_embeddings": 128},
    "yarn4": {"rope_type": "yarn", "factor": 4.0, "original_max_position_embeddings": 128},
    # After the rule (docs/length.md): N = 64, about the 4-sentence inputs' 55 source tokens, so that the scaling
    # starts where the training examples end (dynamic NTK with N = 128 leaves the k = 8 inputs, 109 tokens, as
    # they were).
    "dynamic4-n64": {"rope_type": "dynamic", "factor": 4.0, "original_max_position_embeddings": 64},
    "yarn4-n64": {"rope_type": "yarn", "factor": 4.0, "original_max_position_embeddings": 64},
    # After the rule: YaRN's two parts apart. Its temperature alone (factor 1 keeps the frequencies; queries and keys
    # times the attention factor YaRN takes at factor 4, 0.1 ln 4 + 1) and its frequencies alone (attention factor 1).
    "yarn4-temperature": {
        "rope_type": "yarn",
        "factor": 1.0,
        "original_max_position_embeddings": 128,
        "attention_factor": 0.1 * math.log(4.0) + 1.0,
    },
    "yarn4-frequencies": {
        "rope_type": "yarn",
        "factor": 4.0,
        "original_max_position_embeddings": 128,
        "attention_factor": 1.0,
    },
    # After the rule: YaRN's frequencies at the factor the input's length sets, n / 64 up to 4 (dynamic YaRN), so
    # that inputs as long as the 4-sentence training examples keep the model's own rotations.
    "dynamic-yarn4-n64-frequencies": {
        "rope_type": "yarn",
        "factor": 4.0,
        "original_max_position_embeddings": 64,
        "attention_factor": 1.0,
        "dynamic": True,
    },
}
# Decode-time length control (docs/length.md), as train.py --length_control saves it: no end before r x the source
# length (r measured on the training pairs: `runs.generate_settings`) nor before the source's sentence count, with the
# loop guard they turn on.
TRAINING_RATIO = "measured on the training pairs"
LENGTH_CONTROL = {"min_length_ratio": TRAINING_RATIO, "match_source_sentence_count": True}
# Windowed decoding (docs/length.md): no input longer than the 4 joined sentences of the longest training examples.
WINDOWS = {"window_sentences": 4}
# After the rule: a cross-attention window at decode time (attention_windows.py), C = 24 source tokens on either
# side of where target token i points (i / r, r measured on the training pairs: `runs.decoding_config`), about
# two test sentences (12-13 tokens each) each way, fixed before its first run (docs/length.md).
CROSS_WINDOW = {"cross_attention_window": 24, "cross_attention_window_ratio": TRAINING_RATIO}
# After those rows: C = 12, the best of 12, 24 and 48 at k = 8 on the validation split (kerple+concat4 seed 2).
NARROW_CROSS_WINDOW = {**CROSS_WINDOW, "cross_attention_window": 12}
# After the rule: a model trained with randomized positions decoded at the training draw's expected positions
# (position_randomization.py Eq. 1) instead of 0..n-1, whose neighbour gaps of 1 training never showed.
SPREAD = {"randomized_positions_inference": "spread"}


def length_option_rows(base: str) -> dict[str, Row]:
    """The length options on `base`+concat4: one row each (name suffix -> row), the combination of the
    training-time option that addresses where a translation is (sentence-aware positions) with the decode-time one
    that addresses when it stops (length control), windowed decoding, which keeps every input within the training
    length, and (after the rule) a cross-attention window that keeps each target token on its part of the
    source, and the randomized-position models decoded at the expected positions of their training draw."""
    positions = {**EXTRAPOLATION_POSITIONS}
    sites = ["encoder_self_attention", "decoder_self_attention", "cross_attention"]
    sentences = {**positions, "sentence_cross_attention_bias": True}, {**CONCAT4, "sentence_positions": True}
    randomized = {**positions, "randomized_positions_max": 512}
    return {
        "+randomized": Row(base, randomized, CONCAT4, EXTRAPOLATION_K),
        "+log-length": Row(base, {**positions, "log_length_scaling": sites}, CONCAT4, EXTRAPOLATION_K),
        "+sentences": Row(base, *sentences, EXTRAPOLATION_K),
        "+length-control": Row(
            base, positions, CONCAT4, EXTRAPOLATION_K, Decoding(f"{base}+concat4", generate=LENGTH_CONTROL)
        ),
        "+sentences+length-control": Row(
            base, *sentences, EXTRAPOLATION_K, Decoding(f"{base}+concat4+sentences", generate=LENGTH_CONTROL)
        ),
        "+windows4": Row(
            base, positions, CONCAT4, EXTRAPOLATION_K, Decoding(f"{base}+concat4", generate=WINDOWS)
        ),
        "+cross-window": Row(
            base, positions, CONCAT4, EXTRAPOLATION_K, Decoding(f"{base}+concat4", config=CROSS_WINDOW)
        ),
        "+cross-window12": Row(
            base, positions, CONCAT4, EXTRAPOLATION_K, Decoding(f"{base}+concat4", config=NARROW_CROSS_WINDOW)
        ),
        "+randomized+spread": Row(
            base, randomized, CONCAT4, EXTRAPOLATION_K, Decoding(f"{base}+concat4+randomized", config=SPREAD)
        ),
    }


# The rows of each ablation table after the reference system. None: the system of that name in the main table or an
# earlier ablation table (one run serves both tables).
ABLATION_ROWS: dict[str, dict[str, Row | None]] = {
    "gating": {
        "attention+gating": Row("attention", {"attention_gating": True}),
        "relative_attention": None,
        "relative_attention-no-gating": Row("relative_attention", {"relative_attention_gating": False}),
        "aposnet": None,
        "aposnet-no-gating": Row("aposnet", {"position_attention_gating": False}),
        "rposnet": None,
        "rposnet-no-gating": Row("rposnet", {"position_attention_gating": False}),
    },
    # Paper 2 Table 5: rPosNet at each combination of sites (the main system: both self-attentions)
    "placement": {
        "rposnet@ES": Row("rposnet", {"decoder_self_attention": "attention"}),
        "rposnet@DS": Row("rposnet", {"encoder_self_attention": "attention"}),
        "rposnet@C": Row(
            "rposnet",
            {
                "encoder_self_attention": "attention",
                "decoder_self_attention": "attention",
                "cross_attention": "rposnet",
            },
        ),
        "rposnet": None,
        "rposnet@ES+C": Row("rposnet", {"decoder_self_attention": "attention", "cross_attention": "rposnet"}),
        "rposnet@DS+C": Row("rposnet", {"encoder_self_attention": "attention", "cross_attention": "rposnet"}),
        "rposnet@ES+DS+C": Row("rposnet", {"cross_attention": "rposnet"}),
    },
    "recurrent": {
        "rpe_head@encoder": Row("rpe_head", {"decoder_position_encoding": "sinusoidal"}),
        "rpe_head@decoder": Row("rpe_head", {"encoder_position_encoding": "sinusoidal"}),
        "rpe_head": None,
        "mpr_head@encoder": Row("mpr_head", {"decoder_position_encoding": "sinusoidal"}),
        "mpr_head@decoder": Row("mpr_head", {"encoder_position_encoding": "sinusoidal"}),
        "mpr_head": None,
    },
    # Paper 2 Table 7 (Appendix E), in its order after the Transformer
    "lightconv_chain": {
        "shaw": None,
        "lightconv-no-glu": Row("lightconv", {"lightconv_gating": "none"}),
        "lightconv": None,
        "lightconv+gelu-gating": Row("lightconv", {"lightconv_gating": "gelu"}),
        "lightconv+gelu-gating+global-context": Row(
            "lightconv", {"lightconv_gating": "gelu", "lightconv_global_context": True}
        ),
        "rposnet": None,
    },
    # Paper 1 Fig. 3: d_p of PosNet-Embed (128, the paper's best, is the main system)
    "posnet_dim": {
        **{f"posnet_embed-dp{dim}": Row("posnet_embed", {"posnet_dim": dim}) for dim in (32, 64, 96)},
        "posnet_embed": None,
        "posnet_embed-dp256": Row("posnet_embed", {"posnet_dim": 256}),
    },
    # Paper 3 Fig. 2's d_r sweep mirrored at half width, for the comparison's d_model 256 with 4 heads of 64 (our
    # copy of the paper does not give the figure's grid). RPEHead's d_r fills whole heads: 64, 128 and 192 are all
    # of them (the paper's best, 320 of 512, halves to 160, not a whole head). MPRHead's d_r is a multiple of the
    # 4 heads: 64 to 192, the paper's 128 to 384 halved, so its best (256 of 512) sits in the middle. d_r 128 is
    # each layout's main system: the paper's best, scaled (RPEHead's 160 rounded down to whole heads).
    "rpe_dim": {
        "rpe_head-dr64": Row("rpe_head", {"rpe_dim": 64}),
        "rpe_head": None,
        "rpe_head-dr192": Row("rpe_head", {"rpe_dim": 192}),
        **{f"mpr_head-dr{rpe_dim}": Row("mpr_head", {"rpe_dim": rpe_dim}) for rpe_dim in (64, 96)},
        "mpr_head": None,
        **{f"mpr_head-dr{rpe_dim}": Row("mpr_head", {"rpe_dim": rpe_dim}) for rpe_dim in (160, 192)},
    },
    # Encodings without a position in the decoder (NoPE for the causal stack, Kazemnejad et al. 2023), and training
    # options: Kiyono et al. 2021's SHAPE with K = 100, enough to move Multi30k's training lengths over the joined
    # test inputs while a 256-position table holds L + K; Varis & Bojar 2021's concatenation, half the training
    # examples two joined pairs, or 2-4 pairs so that training lengths reach the k = 4 joined test inputs.
    "length": {
        "nope-decoder": Row("none", {"encoder_position_encoding": "sinusoidal"}),
        "sinusoidal+shape": Row(overrides={"shape_max_shift": 100}),
        "learned+shape": Row("learned", {"shape_max_shift": 100}),
        "sinusoidal+concat": Row(training={"concat_probability": 0.5}),
        "sinusoidal+concat4": Row(
            overrides=EXTRAPOLATION_POSITIONS, training=CONCAT4, length_k=EXTRAPOLATION_K
        ),
    },
    # The encodings designed to extrapolate (ALiBi, RoPE, FIRE, KERPLE, T5 buckets, Shaw's clipped distances, no
    # position in the decoder), then the papers' rPosNet and MPRHead and learned positions, each trained on joined
    # examples as sinusoidal+concat4 is and measured to k = 16 (runs are planned in this order).
    "extrapolation": {
        "sinusoidal+concat4": None,
        **{
            f"{name}+concat4": Row(name, EXTRAPOLATION_POSITIONS, CONCAT4, EXTRAPOLATION_K)
            for name in ("alibi", "rope", "fire", "kerple", "t5_bias", "shaw")
        },
        "nope-decoder+concat4": Row(
            "none",
            {"encoder_position_encoding": "sinusoidal", **EXTRAPOLATION_POSITIONS},
            CONCAT4,
            EXTRAPOLATION_K,
        ),
        **{
            f"{name}+concat4": Row(name, EXTRAPOLATION_POSITIONS, CONCAT4, EXTRAPOLATION_K)
            for name in ("rposnet", "mpr_head", "learned")
        },
    },
    # docs/length.md, "The rule": each length option alone on the two best extrapolation rows (RoPE scaling, which
    # needs rotary positions, on rope+concat4); decode-time options decode those rows' trained models.
    "length_options": {
        **{
            f"{base}+concat4{suffix}": row
            for base in LENGTH_OPTION_BASES
            for suffix, row in length_option_rows(base).items()
        },
        **{
            f"rope+concat4+{kind}": Row(
                "rope",
                EXTRAPOLATION_POSITIONS,
                CONCAT4,
                EXTRAPOLATION_K,
                Decoding("rope+concat4", config={"rope_scaling": scaling}),
            )
            for kind, scaling in ROPE_SCALINGS.items()
        },
        # After the rule: the best one-pass scalings at k = 8 with the length control that keeps a decoder writing.
        **{
            f"rope+concat4+{kind}+length-control": Row(
                "rope",
                EXTRAPOLATION_POSITIONS,
                CONCAT4,
                EXTRAPOLATION_K,
                Decoding(
                    "rope+concat4", generate=LENGTH_CONTROL, config={"rope_scaling": ROPE_SCALINGS[kind]}
                ),
            )
            for kind in ("yarn4", "yarn4-frequencies")
        },
        # After the rule: the cross-attention window on the RoPE base too (its two models are kept).
        "rope+concat4+cross-window": Row(
            "rope",
            EXTRAPOLATION_POSITIONS,
            CONCAT4,
            EXTRAPOLATION_K,
            Decoding("rope+concat4", config=CROSS_WINDOW),
        ),
        # windowed decoding on the reference of the rule's k = 1 non-inferiority (docs/length.md)
        "sinusoidal+concat4+windows4": Row(
            "sinusoidal",
            EXTRAPOLATION_POSITIONS,
            CONCAT4,
            EXTRAPOLATION_K,
            Decoding("sinusoidal+concat4", generate=WINDOWS),
        ),
    },
}


def comparison_tables() -> dict[str, list[System]]:
    """Table name -> systems, in report order: the main table, then each ablation table with the reference system
    first."""
    main = main_systems()
    by_name = {system.name: system for system in main}
    tables = {"main": main}
    for table, rows in ABLATION_ROWS.items():
        systems = [by_name[name] if row is None else row.system(name) for name, row in rows.items()]
        by_name.update((system.name, system) for system in systems)
        tables[table] = [by_name[REFERENCE_SYSTEM], *systems]
    return tables


TABLES = comparison_tables()
SYSTEMS: dict[str, System] = {system.name: system for systems in TABLES.values() for system in systems}


# The decode-time rows: row name -> what they decode and how.
DECODING: dict[str, Decoding] = {
    name: row.decoding
    for table in ABLATION_ROWS.values()
    for name, row in table.items()
    if row and row.decoding
}


def length_k(system: str) -> list[int]:
    """The joined test sentences the length harness measures for a system's runs (its row's, else the harness's
    default)."""
    rows = (row for table in ABLATION_ROWS.values() for name, row in table.items() if name == system and row)
    return list(next(rows, Row()).length_k)


def training_flags(system: System) -> list[str]:
    """train.py's flags for a system's training options (`--sentence_positions true`, ...)."""
    return [
        argument
        for name, value in system.training.items()
        for argument in (f"--{name}", *map(str, value if isinstance(value, list | tuple) else [value]))
    ]


def row_config(system: System, recipe: str) -> MarianPosEncConfig:
    """The config train.py builds for the system under `recipe` (with the stand-in sentence-end id of train.py's
    settings check where the system has sentence-aware positions: the tokenizer's is not known here)."""
    overrides = ["--config_overrides", json.dumps(system.overrides)]
    arguments = parse_train_args(["--recipe", recipe, *overrides, *training_flags(system)])
    return model_config(arguments, vocab_size=arguments.data.vocab_size, pad=0, eos=1)
