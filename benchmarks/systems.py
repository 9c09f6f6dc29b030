"""The systems the benchmarks and the conformance suite run, all generated from the registries; the comparison
(`study.tables`) builds its main table from `main_systems` too.

A system is a name and the config fields that build it. Every registered module has a main system: a
position encoding in both stacks, or a token mixer at each self-attention site it allows (cross-attention
stays content attention, as in paper 2's models; the config then pairs each stack with the input embedding
the mixer recommends). A module class adds more through its own metadata (`DescribedModule.variants`: option
sets with their own conformance and benchmark run). No module is named here, so a new registry entry appears
everywhere by itself.
"""

from dataclasses import dataclass, field
from pathlib import Path

from hf_posenc.base import ATTENTION_SITES, CROSS_ATTENTION, TokenMixer
from hf_posenc.pipeline.data.files import data_root
from hf_posenc.registry import POSITION_ENCODINGS, TOKEN_MIXERS

# The Multi30k the benchmarks read: under $HF_POSENC_DATA, else the shared data beside this checkout.
MULTI30K = (data_root() or Path(__file__).resolve().parents[2] / "shared" / "data") / "multi30k"


@dataclass(frozen=True)
class System:
    """A named model: config fields over the defaults, and (for training options) train.py fields."""

    name: str
    overrides: dict = field(default_factory=dict, hash=False)
    training: dict = field(default_factory=dict, hash=False)
    precomputed: bool = False  # folded with precompute_position_attention() (benchmarks, inference only)


def registered_modules() -> dict[str, type]:
    return {**POSITION_ENCODINGS, **TOKEN_MIXERS}


def module_overrides(name: str) -> dict:
    """Config fields of a module's main system."""
    if name in POSITION_ENCODINGS:
        return {"encoder_position_encoding": name, "decoder_position_encoding": name}
    return {site: name for site in TOKEN_MIXERS[name].allowed_sites if site != CROSS_ATTENTION}


def main_systems() -> list[System]:
    """Every position encoding, and every mixer but content attention (the mixer of every position encoding's
    system)."""
    names = [*POSITION_ENCODINGS, *(name for name in TOKEN_MIXERS if name != "attention")]
    return [System(name, module_overrides(name)) for name in names]


def variant_systems() -> list[System]:
    """Every module's `variants`, named `<module>-<variant>`."""
    return [
        System(f"{name}-{variant}", {**module_overrides(name), **overrides})
        for name, module in registered_modules().items()
        for variant, overrides in module.variants.items()
    ]


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
