"""Configuration of Marian models with pluggable positional modules.

Every choice is a typed field that lands in `config.json`: one string per choice (which position encoding
per stack, which token mixer per attention site) plus the typed hyperparameters of each module. The
hyperparameters are declared by the module classes themselves (`hyperparameters`, with the paper's
defaults): this file collects them from the registry, so a new module brings its own fields. The config
validates itself at construction, so an impossible model fails here with a message naming the bad value
rather than deep inside torch.
"""

import dataclasses
import difflib
import math
import sys

from huggingface_hub.dataclasses import strict
from huggingface_hub.errors import StrictDataclassFieldValidationError
from transformers import GenerationConfig, MarianConfig, PreTrainedConfig, PreTrainedModel
from transformers.activations import ACT2FN
from transformers.utils import logging

from .attention_windows import check_attention_windows
from .base import ATTENTION_SITES, CROSS_ATTENTION, STACKS, Hyperparameter
from .position_randomization import RANDOMIZED_INFERENCE
from .registry import POSITION_ENCODINGS, TOKEN_MIXERS
from .sentence_positions import check_sentence_config

logger = logging.get_logger(__name__)
CONTENT_ATTENTION, ROPE, SHAW = "attention", "rope", "shaw"  # the modules the length options depend on
SPECIAL_TOKEN_FIELDS = (
    "pad_token_id",
    "bos_token_id",
    "eos_token_id",
    "forced_eos_token_id",
    "decoder_start_token_id",
)


def module_hyperparameters() -> dict[str, Hyperparameter]:
    """Every hyperparameter declared by a registered module, by name; a name declared twice must be the same
    declaration (modules of one family share it through a base class or a shared constant)."""
    declared: dict[str, Hyperparameter] = {}
    for module in (*POSITION_ENCODINGS.values(), *TOKEN_MIXERS.values()):
        for name, hyperparameter in module.hyperparameters.items():
            if declared.setdefault(name, hyperparameter) is not hyperparameter:
                raise TypeError(f"hyperparameter {name!r} is declared differently by {module.__name__}")
    return declared


# Keys a config may carry besides its fields: written by save_pretrained and the Hub, or handled by
# PreTrainedConfig itself (generation parameters found in old config.json files are dropped there).
ACCEPTED_EXTRA_KEYS = {
    "auto_map",
    "model_type",
    "name_or_path",
    "transformers_version",
    "torch_dtype",
    "output_attentions",
    "attn_implementation",
    "experts_implementation",
    "_commit_hash",
    "num_labels",
    *GenerationConfig._get_default_generation_params(),
}


# Hyperparameters renamed so that each prefix names one module family; configs saved under the old name still
# load (a deprecation warning says so), and save under the new one.
RENAMED_FIELDS = {
    "relative_attention_num_buckets": "t5_bias_num_buckets",  # T5 bias, not the relative-attention mixer
    "relative_attention_max_distance": "t5_bias_max_distance",
    "posnet_gating": "position_attention_gating",  # aPosNet/rPosNet (paper 2), not PosNet (paper 1)
}


def rename_deprecated(settings: dict) -> dict:
    """`settings` with every renamed field under its new name (warned); both names at once is an error."""
    renamed = dict(settings)
    for old, new in RENAMED_FIELDS.items():
        if old in renamed:
            if new in renamed:
                raise ValueError(f"{old!r} is the old name of {new!r}: give only {new!r}.")
            logger.warning("config field %r is deprecated: it is now %r.", old, new)
            renamed[new] = renamed.pop(old)
    return renamed


def closest_field(name: str, fields) -> str:
    """' (did you mean 'x'?)' for the field closest to `name`, or ''."""
    hint = difflib.get_close_matches(name, fields, n=1)
    return f" (did you mean {hint[0]!r}?)" if hint else ""


def check_auto_map(auto_map) -> None:
    """Each `auto_map` entry of a config.json that points into the model's own files (this one, or
    modeling_marian_posenc.py) must name a class they define: transformers would fail later, loading with
    trust_remote_code=True, on an AttributeError of a generated module name, without naming the entry. Entries
    of other files or of other repositories ("repo--module.Class") are left to transformers. The config's own
    entry (`AutoConfig`) is read by transformers before this code runs, so a bad one cannot be caught here."""
    from .modeling_marian_posenc import MarianPosEncModel  # here: the model's file imports this one

    modules = [sys.modules[__name__], sys.modules[MarianPosEncModel.__module__]]
    classes = {
        module.__name__.rsplit(".", 1)[-1]: sorted(
            name
            for name, value in vars(module).items()
            if isinstance(value, type)
            and value.__module__ == module.__name__
            and issubclass(value, (PreTrainedConfig, PreTrainedModel))
        )
        for module in modules
    }
    for key, references in (auto_map or {}).items():
        for reference in references if isinstance(references, (list, tuple)) else [references]:
            module, _, name = str(reference).rpartition(".")
            if module in classes and name not in classes[module]:
                raise ValueError(
                    f"config.json's auto_map[{key!r}] = {reference!r} names a class that {module}.py does not "
                    f"define (it defines {', '.join(classes[module])}): correct the entry, or save the model again "
                    "with save_pretrained, which writes it."
                )


def check_choice(field: str, value, allowed) -> None:
    if value not in allowed:
        raise ValueError(f"{field}={value!r} is not known; allowed values: {', '.join(sorted(allowed))}.")


ModuleHyperparameters = dataclasses.make_dataclass(
    "ModuleHyperparameters",
    [(name, h.type, dataclasses.field(default=h.default)) for name, h in module_hyperparameters().items()],
    kw_only=True,
)


@strict
class MarianPosEncConfig(MarianConfig, ModuleHyperparameters):
    r"""Marian's configuration plus the positional module choices and their hyperparameters.

    position_encoding (`str`, constructor shorthand): sets both `encoder_position_encoding` and
        `decoder_position_encoding`.
    encoder_position_encoding / decoder_position_encoding (`str`, defaults to the stack's recommended one): a
        name from `hf_posenc.POSITION_ENCODINGS`. Unset, each stack gets the input embedding its
        self-attention mixer recommends (`TokenMixer.recommended_position_encoding`: `"learned"` for
        `"rposnet"`, paper 2 §5.2, else `"sinusoidal"`); an explicit value always wins (also the
        `position_encoding` shorthand), and config.json stores the resolved value.
    encoder_self_attention / decoder_self_attention / cross_attention (`str`, defaults to `"attention"`): a
        name from `hf_posenc.TOKEN_MIXERS`.
    shape_max_shift (`int`, defaults to 0 = off): SHAPE (Kiyono et al. 2021). In training, every sequence's
        positions are shifted by a random offset k in [0, shape_max_shift], drawn per sequence and
        independently for encoder and decoder as in the paper's code; never at inference. Bounded position
        tables must then hold the longest training sequence plus shape_max_shift positions.
    randomized_positions_max (`int`, defaults to 0 = off): L of randomized positional encodings (Ruoss et al.
        2023). In training, a sequence of n tokens takes n sorted distinct positions drawn uniformly from
        0..L-1 instead of 0..n-1, independently per sequence and per stack. Bounded position tables must hold L
        positions; excludes `shape_max_shift` and the `shaw` encoding (docs/length.md).
    randomized_positions_inference (`str`, defaults to `"plain"`): the positions of a model trained with
        randomized positions at inference: `"plain"` 0..n-1, `"spread"` the expected positions of the training
        draw, p_i = floor((i + 1)(L + 1) / (n + 1)) - 1 (position_randomization.py Eq. 1); only with
        `randomized_positions_max`.
    log_length_scaling (`list[str]`, defaults to none): the attention sites (`encoder_self_attention`,
        `decoder_self_attention`, `cross_attention`) whose content-attention logits are multiplied by log n, n
        the number of keys the query may attend to (Chiang & Cholak 2022). Each named site must use the
        `attention` mixer.
    attention_window (`int`, defaults to None = off): W; every self-attention query reads only the keys within W
        positions of its own (encoder |i - j| <= W; decoder i - W <= j <= i, and the start token always), so that
        no attended span is longer than W + 1 tokens however long the input (attention_windows.py,
        docs/length.md). Needs the `attention` mixer at both self-attention sites.
    cross_attention_window (`int`, defaults to None = off): C; target token i reads only the source positions
        within C of min(i / r, n - 1), n the source's length; needs `cross_attention="attention"`.
    cross_attention_window_ratio (`float`, defaults to 1.0): r, target tokens per source token, where the
        cross-attention window's centre moves; only with `cross_attention_window`.
    rope_scaling (`dict`, defaults to None = off): RoPE frequencies rescaled for inputs longer than those
        trained on, computed by transformers' `ROPE_INIT_FUNCTIONS`: `{"rope_type": "linear", "factor": f}`,
        `{"rope_type": "dynamic", "factor": f, "original_max_position_embeddings": n}` or `{"rope_type":
        "yarn", "factor": f, "original_max_position_embeddings": n, ...}` (optional yarn keys: attention_factor,
        beta_fast, beta_slow, mscale, mscale_all_dim, truncate, and dynamic: True for YaRN at the factor
        min(f, length / n)). Only for the `rope` encoding; set it at inference, e.g.
        `from_pretrained(folder, rope_scaling={...})` (docs/length.md).
    sentence_end_token_ids (`list[int]`, defaults to empty = off): the tokens that end a sentence ('.', '!', '?'
        and their BPE forms: `generation_length.sentence_end_token_ids(tokenizer)`). Set, positions restart at 0
        after each sentence end in both stacks, and the sentence index 0, 1, 2, ... becomes a signal of its own
        (sentence_positions.py, docs/length.md). Not `</s>`, padding or the decoder start token. Needs content
        attention at both self-attention sites and an encoding that takes restarting positions (not `rpe_head`,
        `mpr_head`, `shaw`, `posnet_embed`, `posnet_attn`); excludes `randomized_positions_max`.
    sentence_embedding (`str`, defaults to `"learned"`): how the sentence index enters each stack's input:
        `"learned"` adds a learned row per sentence index (Ma et al. 2020's segment embedding), `"none"` adds
        nothing.
    max_sentences (`int`, defaults to 64): rows of the learned sentence table; an input with more sentences
        raises `PositionLimitError`.
    sentence_cross_attention_bias (`bool`, defaults to False): a learned per-head bias on the cross-attention
        scores by the clipped difference of the source token's and the target token's sentence indices (T5's
        relative bias over sentences; the soft form of G-Transformer's group attention); needs
        `sentence_end_token_ids` and `cross_attention="attention"`.
    sentence_cross_attention_max_distance (`int`, defaults to 3): C, differences clipped to [-C, C]; keep it
        below the largest number of sentences joined in a training example.
    Module hyperparameters: the fields each module class declares in `hyperparameters` (docs/architecture.md
        lists them with their defaults).

    The defaults of the remaining Marian fields are those of a Transformer base translation model (d_model
    512, 6+6 layers, 8 heads, scaled and tied embeddings), not MarianConfig's opus-mt-big defaults. Every float
    field must be finite; `activation_function` a name of transformers' `ACT2FN`; `init_std` >= 0; Marian's
    `encoder_layerdrop` / `decoder_layerdrop` 0 (the layers here do not implement LayerDrop).
    """

    model_type = "marian_posenc"

    vocab_size: int = 8000
    max_position_embeddings: int = 1024
    encoder_layers: int = 6
    encoder_ffn_dim: int = 2048
    encoder_attention_heads: int = 8
    decoder_layers: int = 6
    decoder_ffn_dim: int = 2048
    decoder_attention_heads: int = 8
    activation_function: str = "relu"
    d_model: int = 512
    scale_embedding: bool = True
    decoder_start_token_id: int = 0
    pad_token_id: int | None = 0
    eos_token_id: int | list[int] | None = 1
    forced_eos_token_id: int | list[int] | None = 1

    encoder_position_encoding: str | None = None  # None: resolved from encoder_self_attention at init
    decoder_position_encoding: str | None = None  # None: resolved from decoder_self_attention at init
    encoder_self_attention: str = "attention"
    decoder_self_attention: str = "attention"
    cross_attention: str = "attention"
    shape_max_shift: int = 0
    sentence_end_token_ids: list[int] = dataclasses.field(default_factory=list)
    sentence_embedding: str = "learned"
    max_sentences: int = 64
    sentence_cross_attention_bias: bool = False
    sentence_cross_attention_max_distance: int = 3
    randomized_positions_max: int = 0
    randomized_positions_inference: str = "plain"
    log_length_scaling: list[str] | tuple[str, ...] = ()
    attention_window: int | None = None
    cross_attention_window: int | None = None
    cross_attention_window_ratio: float = 1.0
    rope_scaling: dict | None = None  # shadows PreTrainedConfig's deprecated alias of `rope_parameters`

    def __post_init__(self, **kwargs):
        for old, new in RENAMED_FIELDS.items():  # a constructor given an old name: its field takes the value
            if old in kwargs:
                setattr(self, new, rename_deprecated({old: kwargs.pop(old)})[new])
        unknown = sorted(set(kwargs) - ACCEPTED_EXTRA_KEYS - {"position_encoding"})
        if unknown:
            fields = [f.name for f in dataclasses.fields(self)]
            raise ValueError(
                "unknown MarianPosEncConfig fields: "
                + ", ".join(f"{name!r}{closest_field(name, fields)}" for name in unknown)
                + "; fields are Marian's, the module choices and the module hyperparameters (docs/architecture.md)."
            )
        shorthand = kwargs.pop("position_encoding", None)
        if shorthand is not None:
            self.encoder_position_encoding = shorthand
            self.decoder_position_encoding = shorthand
        for stack in STACKS:
            if getattr(self, f"{stack}_position_encoding") is None:
                mixer = TOKEN_MIXERS.get(getattr(self, f"{stack}_self_attention"))
                if mixer is not None:
                    setattr(self, f"{stack}_position_encoding", mixer.recommended_position_encoding)
        self.check_choices()
        super().__post_init__(**kwargs)

    @classmethod
    def from_dict(cls, config_dict: dict, **kwargs):
        """`PreTrainedConfig.from_dict`, keeping the keys of a saved config that are not fields as attributes.

        The constructor refuses unknown names, so that typos in what a user passes fail early; a config.json
        may legitimately hold attributes set on a config after construction (transformers' own tests set
        `layer_norm_eps`, user code sets its own), and `save_pretrained` writes them: loading what was saved
        must not fail. A key close to a field's name is probably a typo in a hand-edited file: a warning names
        it. An `auto_map` entry naming a class the model's files do not define is refused (`check_auto_map`).
        """
        config_dict = rename_deprecated(config_dict)
        check_auto_map(config_dict.get("auto_map"))
        fields = {field.name for field in dataclasses.fields(cls)}
        extra = {
            key: value
            for key, value in config_dict.items()
            if key not in fields and key not in ACCEPTED_EXTRA_KEYS and key != "position_encoding"
        }
        try:
            loaded = super().from_dict({k: v for k, v in config_dict.items() if k not in extra}, **kwargs)
        except StrictDataclassFieldValidationError as error:  # a wrong type in a (hand-edited) config.json
            raise ValueError(
                f"a saved config (config.json) holds a value of the wrong type: {error.__cause__ or error}. Correct "
                "the entry, or save the model again with save_pretrained."
            ) from None
        config = loaded[0] if isinstance(loaded, tuple) else loaded  # (config, unused kwargs) on request
        for key, value in extra.items():
            setattr(config, key, value)
            if hint := closest_field(key, fields):
                logger.warning(
                    "config key %r is not a MarianPosEncConfig field%s; kept as an attribute.", key, hint
                )
        return loaded

    def to_diff_dict(self) -> dict:
        """`PreTrainedConfig.to_diff_dict` without `rope_scaling` when it is off: the Trainer reads a checkpoint's
        config.json with the base class to check its version, whose deprecated `rope_scaling` setter warns about
        any value, None included, on every resumed run."""
        saved = super().to_diff_dict()
        if saved.get("rope_scaling", False) is None:
            del saved["rope_scaling"]
        return saved

    def to_marian_config(self) -> MarianConfig:
        """The stock `MarianConfig` of the same sizes, token ids and Marian fields: what `MarianMTModel` computes
        with this config's sinusoids and content attention (the baseline the tools train and benchmark)."""
        fields = {
            key: value
            for key, value in self.to_dict().items()
            if key in MarianConfig.__dataclass_fields__ and key not in ("architectures", "dtype")
        }
        return MarianConfig(**fields, attn_implementation=self._attn_implementation)

    def check_choices(self) -> None:
        """Raise a ValueError naming the bad value and the allowed ones. Runs when the config is built and again
        when a model is built from it (fields may have been set in between)."""
        self.check_marian_fields()
        for name in (
            "vocab_size",
            "d_model",
            "max_position_embeddings",
            "encoder_layers",
            "decoder_layers",
            "encoder_ffn_dim",
            "decoder_ffn_dim",
        ):
            if getattr(self, name) <= 0:
                raise ValueError(f"{name}={getattr(self, name)} must be a positive integer.")
        for name in ("dropout", "attention_dropout", "activation_dropout"):
            if not 0.0 <= getattr(self, name) < 1.0:
                raise ValueError(f"{name}={getattr(self, name)} must be in [0, 1).")
        for stack in STACKS:
            heads = getattr(self, f"{stack}_attention_heads")
            if heads <= 0 or self.d_model % heads:
                raise ValueError(
                    f"d_model={self.d_model} must be divisible by {stack}_attention_heads={heads}."
                )
        for name in SPECIAL_TOKEN_FIELDS:
            ids = getattr(self, name, None)
            for token_id in ids if isinstance(ids, list) else [ids]:
                if token_id is not None and not 0 <= token_id < self.vocab_size:
                    raise ValueError(
                        f"{name}={ids} is outside the vocabulary: token ids are 0..{self.vocab_size - 1} "
                        f"(vocab_size={self.vocab_size})."
                    )
        if not self.share_encoder_decoder_embeddings:
            raise ValueError(
                "share_encoder_decoder_embeddings=False is not supported: MarianPosEnc models share one token "
                "embedding table between encoder, decoder and output layer (allowed: True)."
            )
        if self.shape_max_shift < 0:
            raise ValueError(f"shape_max_shift={self.shape_max_shift} must be >= 0 (0 turns SHAPE off).")
        for name, hyperparameter in module_hyperparameters().items():
            hyperparameter.check(name, getattr(self, name))
        for site in ATTENTION_SITES:
            mixer = getattr(self, site)
            check_choice(site, mixer, TOKEN_MIXERS)
            if site not in TOKEN_MIXERS[mixer].allowed_sites:
                raise ValueError(
                    f"{site}={mixer!r} cannot be used there; {mixer!r} works at: "
                    f"{', '.join(TOKEN_MIXERS[mixer].allowed_sites)}."
                )
            TOKEN_MIXERS[mixer].check_config(self, site)
        for stack in STACKS:
            encoding = getattr(self, f"{stack}_position_encoding")
            check_choice(f"{stack}_position_encoding", encoding, POSITION_ENCODINGS)
            POSITION_ENCODINGS[encoding].check_config(self, stack)
        self.check_length_options()
        check_sentence_config(self, POSITION_ENCODINGS, TOKEN_MIXERS)

    def check_marian_fields(self) -> None:
        """Marian's fields that this model would misread or ignore without an error: a non-finite float (NaN passes
        every range check: a NaN `init_std` fails deep in torch, a NaN `rope_theta` or module hyperparameter
        computes NaN), an unknown activation, and LayerDrop (not implemented here)."""
        for field in dataclasses.fields(self):
            value = getattr(self, field.name, None)
            if isinstance(value, float) and not math.isfinite(value):
                raise ValueError(f"{field.name}={value} must be a finite number.")
        if self.activation_function not in ACT2FN:
            raise ValueError(
                f"activation_function={self.activation_function!r} is not known; allowed values: "
                f"{', '.join(sorted(ACT2FN))}."
            )
        if self.init_std < 0:
            raise ValueError(
                f"init_std={self.init_std} must be >= 0 (the standard deviation of initial weights)."
            )
        for name in ("encoder_layerdrop", "decoder_layerdrop"):
            if getattr(self, name):
                raise ValueError(
                    f"{name}={getattr(self, name)} is not supported: MarianPosEnc layers do not implement LayerDrop "
                    "(allowed: 0.0)."
                )
        if self.eos_token_id == []:
            raise ValueError("eos_token_id=[] names no end-of-sequence token: give an id (or a list of ids).")

    def check_length_options(self) -> None:
        """Randomized positions, log-length scaling, attention windows and RoPE scaling (docs/length.md): values,
        and the modules each one needs. The RoPE scaling dictionary itself is checked by the `rope` encoding's
        `check_config`."""
        self.check_randomized_positions()
        check_attention_windows(self, TOKEN_MIXERS)
        for site in self.log_length_scaling:
            check_choice("log_length_scaling", site, ATTENTION_SITES)
            if getattr(self, site) != CONTENT_ATTENTION:
                raise ValueError(
                    f"log_length_scaling names {site!r}, but {site}={getattr(self, site)!r}: log-length scaling "
                    f"multiplies content-attention logits, so every site it names must use "
                    f"{site}={CONTENT_ATTENTION!r}."
                )
        if len(set(self.log_length_scaling)) != len(self.log_length_scaling):
            raise ValueError(f"log_length_scaling={list(self.log_length_scaling)} names a site twice.")
        encodings = {
            f"{stack}_position_encoding": getattr(self, f"{stack}_position_encoding") for stack in STACKS
        }
        numbers = {key: value for key, value in (self.rope_scaling or {}).items() if isinstance(value, float)}
        if bad := [key for key, value in numbers.items() if not math.isfinite(value)]:
            raise ValueError(f"rope_scaling={self.rope_scaling!r}: {', '.join(bad)} must be a finite number.")
        if self.rope_scaling is not None and ROPE not in encodings.values():
            raise ValueError(
                f"rope_scaling={self.rope_scaling!r} rescales the {ROPE!r} position encoding, which neither stack "
                f"uses ({', '.join(f'{field}={name!r}' for field, name in encodings.items())}); set rope_scaling "
                f"to None."
            )

    def check_randomized_positions(self) -> None:
        """L = `randomized_positions_max` >= 0; with L > 0: no SHAPE, no Shaw (its distances are token indices,
        not positions), and every bounded position table of a stack (its encoding, its self-attention mixer)
        holds L positions."""
        draws, inference = self.randomized_positions_max, self.randomized_positions_inference
        if draws < 0:
            raise ValueError(
                f"randomized_positions_max={draws} must be >= 0 (0 turns randomized positions off)."
            )
        if inference not in RANDOMIZED_INFERENCE:
            raise ValueError(
                f"randomized_positions_inference={inference!r} is not allowed: one of "
                f"{', '.join(map(repr, RANDOMIZED_INFERENCE))}."
            )
        if not draws:
            if inference != "plain":
                raise ValueError(
                    f"randomized_positions_inference={inference!r} would do nothing: it places the positions of a "
                    "model trained with randomized positions, which randomized_positions_max turns on."
                )
            return
        if self.shape_max_shift:
            raise ValueError(
                f"randomized_positions_max={draws} and shape_max_shift={self.shape_max_shift} cannot both be set: "
                "a SHAPE shift of randomized positions is another random draw; set one of them to 0."
            )
        if self.sentence_end_token_ids:
            raise ValueError(
                f"randomized_positions_max={draws} and sentence_end_token_ids={self.sentence_end_token_ids} cannot "
                "both be set: positions either restart at each sentence or are drawn at random; set "
                "randomized_positions_max=0 or sentence_end_token_ids=[]."
            )
        modules = [
            (f"{stack}_position_encoding", POSITION_ENCODINGS[getattr(self, f"{stack}_position_encoding")])
            for stack in STACKS
        ] + [(site, TOKEN_MIXERS[getattr(self, site)]) for site in ATTENTION_SITES if site != CROSS_ATTENTION]
        for choice, module in modules:
            name = getattr(self, choice)
            if name == SHAW:
                raise ValueError(
                    f"randomized_positions_max={draws} cannot be used with {choice}={name!r}: Shaw's attention "
                    "reads its distances from token indices, not positions, so it would ignore the draw."
                )
            sizes = [(field, getattr(self, field)) for field in module.position_table_fields]
            field, size = next(((f, n) for f, n in sizes if n is not None), (None, None))
            if size is not None and size < draws:
                raise ValueError(
                    f"randomized_positions_max={draws} draws training positions up to {draws - 1}, but "
                    f"{choice}={name!r} has a table of {field}={size} positions: set {field} >= {draws} or "
                    f"randomized_positions_max <= {size}."
                )
