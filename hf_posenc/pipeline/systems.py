"""The systems that `compare`, the benchmarks and the conformance suite run, all generated from the registries.

A system is a name and the config fields that build it. Every registered module has a main system: a
position encoding in both stacks, or a token mixer at each self-attention site it allows (cross-attention
stays content attention, as in paper 2's models; the config then pairs each stack with the input embedding
the mixer recommends). A module class adds more through its own metadata (`DescribedModule`):
`variants` (option sets with their own conformance and benchmark run) and `comparison_rows` (rows of the
ablation tables). Only the training-option rows (SHAPE, concatenation) are written here; no module is named,
so a new registry entry appears everywhere by itself.
"""

from dataclasses import dataclass, field

from ..base import ATTENTION_SITES, CROSS_ATTENTION, DECODER, ENCODER, TokenMixer
from ..registry import POSITION_ENCODINGS, TOKEN_MIXERS

BASELINE = "sinusoidal"

# Titles of the comparison tables, in report order; modules add rows to them through `comparison_rows`.
TABLE_TITLES = {
    "main": "Every module (paper 1 Table 1, paper 2 Table 2, paper 3 Table 1)",
    "gating": "Gating on and off (paper 2 Table 6)",
    "placement": "rPosNet placement (paper 2 Table 5; ES encoder self-, DS decoder self-, C cross-attention)",
    "recurrent": "Recurrent positional embeddings, encoder/decoder ablation (paper 3)",
    "lightconv_chain": "From LightConv to rPosNet (paper 2 Appendix E, Table 7)",
    "posnet_dim": "PosNet-Embed kernel dimension d_p (paper 1 Fig. 3)",
    "rpe_dim": "RPE dimension d_r (paper 3 Fig. 2)",
    "length": "Length generalisation: extrapolating encodings and training options",
}


# Rows of training options rather than modules (Kiyono et al. 2021's SHAPE with K = 100, enough to move
# Multi30k's training lengths over the joined test inputs while a 256-position table holds L + K; Varis &
# Bojar 2021's concatenation, half the training examples two joined pairs, or 2-4 pairs so that training
# lengths reach the k = 4 joined test inputs), as (overrides, training fields).
TRAINING_OPTION_ROWS = {
    "length": {
        "sinusoidal+shape": ({"shape_max_shift": 100}, {}),
        "learned+shape": (
            {
                "encoder_position_encoding": "learned",
                "decoder_position_encoding": "learned",
                "shape_max_shift": 100,
            },
            {},
        ),
        "sinusoidal+concat": ({}, {"concat_probability": 0.5}),
        "sinusoidal+concat4": ({}, {"concat_probability": 0.5, "concat_group_sizes": [2, 3, 4]}),
    }
}


@dataclass(frozen=True)
class System:
    """A named model: config fields over the defaults, and (for training options) train.py fields."""

    name: str
    overrides: dict = field(default_factory=dict, hash=False)
    training: dict = field(default_factory=dict, hash=False)
    precomputed: bool = False  # folded with precompute_position_attention() (benchmarks, inference only)


def registered_modules() -> dict[str, type]:
    return {**POSITION_ENCODINGS, **TOKEN_MIXERS}


def paper_deviations(config) -> list[str]:
    """Where the modules `config` builds depart from their papers' settings by default, each as "<places>:
    <what>", from the module classes' own `paper_deviations` (comparison tables, model cards)."""
    places = {"encoder_position_encoding": ENCODER, "decoder_position_encoding": DECODER}
    places.update({site: site for site in ATTENTION_SITES})
    modules, where = registered_modules(), {}
    for field_name, place in places.items():
        for text in modules[getattr(config, field_name)].paper_deviations(config, place):
            where.setdefault(text, []).append(place.replace("_", " "))
    return [f"{' and '.join(at)}: {text}" for text, at in where.items()]


def module_overrides(name: str) -> dict:
    """Config fields of a module's main system."""
    if name in POSITION_ENCODINGS:
        return {"encoder_position_encoding": name, "decoder_position_encoding": name}
    return {site: name for site in TOKEN_MIXERS[name].allowed_sites if site != CROSS_ATTENTION}


def main_systems() -> list[System]:
    """Every position encoding and every mixer but content attention (the baseline's own mixer)."""
    names = [*POSITION_ENCODINGS, *(name for name in TOKEN_MIXERS if name != "attention")]
    return [System(name, module_overrides(name)) for name in names]


def variant_systems() -> list[System]:
    """Every module's `variants`, named `<module>-<variant>`."""
    return [
        System(f"{name}-{variant}", {**module_overrides(name), **overrides})
        for name, module in registered_modules().items()
        for variant, overrides in module.variants.items()
    ]


def comparison_tables() -> dict[str, list[System]]:
    """Table name -> systems: the main table, then every table a module adds rows to (baseline first).

    A row whose overrides are None is the main system of that name (one run serves both tables)."""
    main = main_systems()
    by_name = {system.name: system for system in main}
    tables = {"main": main}
    for name, module in registered_modules().items():
        for table, rows in module.comparison_rows.items():
            if table not in TABLE_TITLES:
                raise ValueError(
                    f"{module.__name__} adds rows to unknown table {table!r}; known: {', '.join(TABLE_TITLES)}"
                )
            systems = tables.setdefault(table, [by_name[BASELINE]])
            for row, overrides in rows.items():
                system = (
                    by_name[row]
                    if overrides is None
                    else System(row, {**module_overrides(name), **overrides})
                )
                systems.append(system)
    for table, rows in TRAINING_OPTION_ROWS.items():
        systems = tables.setdefault(table, [by_name[BASELINE]])
        systems += [System(row, overrides, training) for row, (overrides, training) in rows.items()]
    return {table: tables[table] for table in TABLE_TITLES if table in tables}


def benchmark_systems() -> list[System]:
    """Main systems, variants, and the folded form of every mixer that folds its energies (paper 2 §4)."""
    systems = main_systems() + variant_systems()
    for name, mixer in TOKEN_MIXERS.items():
        if mixer.precompute_position_attention is not TokenMixer.precompute_position_attention:
            systems.append(System(f"{name}_precomputed", module_overrides(name), precomputed=True))
    return systems


def conformance_variants() -> list[tuple[str, dict]]:
    """(id, config overrides) for the conformance suite: every position encoding in both stacks, every mixer
    at each site it allows, and every module's variants."""
    variants = [(f"pe-{name}", {"position_encoding": name}) for name in POSITION_ENCODINGS]
    for name, mixer in TOKEN_MIXERS.items():
        if name == "attention":
            continue  # the default at every site: covered by every position-encoding variant
        variants += [
            (f"{site}-{name}", {site: name}) for site in mixer.allowed_sites if site in ATTENTION_SITES
        ]
    return variants + [(system.name, system.overrides) for system in variant_systems()]
