"""Rotary positions inside self-attention: `"rope"`, Su et al. (RoFormer, 2021), Eq. 13-16: queries and keys
rotated by their position, so q·k depends on the distance only. Optionally the frequencies are rescaled for inputs
longer than those trained on (`rope_scaling`: linear, dynamic NTK, YaRN or dynamic YaRN, computed by
transformers' `ROPE_INIT_FUNCTIONS`; docs/length.md). No absolute-length limit; cross-attention gets no rotation.
"""

import torch
from transformers import initialization as init
from transformers.modeling_rope_utils import ROPE_INIT_FUNCTIONS

from .base import DECODER, Hyperparameter, PositionEncoding, is_number
from .posenc_relative import stack_heads_layers


def rope_inverse_frequencies(head_dim: int, theta: float) -> torch.Tensor:
    """theta_i = theta^(-2i/d_h), i = 0..d_h/2 - 1 (RoFormer Eq. 15): (d_h/2,)."""
    return theta ** (-torch.arange(0, head_dim, 2, dtype=torch.float64) / head_dim).float()


# `rope_scaling`'s types (transformers' ROPE_INIT_FUNCTIONS) with their (required, optional) keys besides
# `rope_type`. The base is `rope_theta`, a config field; transformers' `original_max_position_embeddings` is the
# length trained on, which our `max_position_embeddings` (the size of position tables) is not.
ROPE_SCALING_KEYS = {
    "linear": ({"factor"}, set()),
    "dynamic": ({"factor", "original_max_position_embeddings"}, set()),
    "yarn": (
        {"factor", "original_max_position_embeddings"},
        {"attention_factor", "beta_fast", "beta_slow", "mscale", "mscale_all_dim", "truncate", "dynamic"},
    ),
}


def check_rope_scaling(scaling) -> None:
    """Raise a ValueError naming the bad entry of a `rope_scaling` dictionary and the allowed ones."""
    rope_type = scaling.get("rope_type")
    if rope_type not in ROPE_SCALING_KEYS:
        raise ValueError(
            f"rope_scaling['rope_type']={rope_type!r} is not known; allowed values: "
            f"{', '.join(ROPE_SCALING_KEYS)} (transformers' ROPE_INIT_FUNCTIONS)."
        )
    required, optional = ROPE_SCALING_KEYS[rope_type]
    given = set(scaling) - {"rope_type"}
    if missing := required - given:
        raise ValueError(f"rope_scaling of type {rope_type!r} needs {', '.join(sorted(missing))}.")
    if unknown := given - required - optional:
        raise ValueError(
            f"rope_scaling of type {rope_type!r} takes no {', '.join(sorted(unknown))}; its keys: "
            f"{', '.join(sorted(required | optional))} (the base is the config field rope_theta)."
        )
    if not is_number(scaling["factor"]) or scaling["factor"] < 1:
        raise ValueError(f"rope_scaling['factor']={scaling['factor']!r} must be a number >= 1.")
    trained = scaling.get("original_max_position_embeddings", 1)
    if not isinstance(trained, int) or isinstance(trained, bool) or trained < 1:
        raise ValueError(
            f"rope_scaling['original_max_position_embeddings']={trained!r} must be an integer >= 1."
        )
    for key in ("attention_factor", "beta_fast", "beta_slow", "mscale", "mscale_all_dim"):
        if scaling.get(key) is not None and (not is_number(scaling[key]) or scaling[key] <= 0):
            raise ValueError(f"rope_scaling[{key!r}]={scaling[key]!r} must be a positive number.")
    beta_fast, beta_slow = scaling.get("beta_fast") or 32, scaling.get("beta_slow") or 1  # the defaults
    if beta_fast <= beta_slow:
        raise ValueError(
            f"rope_scaling beta_fast={beta_fast} must be larger than beta_slow={beta_slow} (defaults 32 and 1)."
        )
    for key in ("truncate", "dynamic"):
        if not isinstance(scaling.get(key, True), bool):
            raise ValueError(f"rope_scaling[{key!r}]={scaling[key]!r} must be True or False.")


def effective_rope_scaling(scaling: dict | None) -> dict | None:
    """`scaling`, or None where it changes nothing: linear, or YaRN without an attention factor, by factor 1
    (their frequencies are then RoFormer's, kept bit for bit instead of transformers' float32 recomputation)."""
    if scaling is None or scaling["rope_type"] == "dynamic" or scaling["factor"] != 1:
        return scaling
    return None if scaling.get("attention_factor") in (None, 1) else scaling


class RopeParameters:
    """What transformers' `ROPE_INIT_FUNCTIONS` read from a model config, for one stack's heads: the
    `rope_scaling` entries and `rope_theta` as `rope_parameters`, the head size, and the training length as
    `max_position_embeddings` (the length past which dynamic NTK raises its base)."""

    def __init__(self, scaling: dict, theta: float, head_dim: int):
        self.rope_parameters = {key: value for key, value in scaling.items() if key != "dynamic"}
        self.rope_parameters["rope_theta"] = theta
        self.head_dim = self.hidden_size = head_dim
        self.num_attention_heads = 1
        self.max_position_embeddings = scaling.get("original_max_position_embeddings")

    def standardize_rope_params(self) -> None:
        """Nothing to fill in (transformers' configs add their defaults here): the parameters are checked."""


class RotaryPositionEncoding(PositionEncoding):
    """RoPE (Su et al. 2021, Eq. 13-16): q_m -> R_m q_m and k_n -> R_n k_n, so q.k depends on n - m only.

    Each pair of features (x_i, x_{i + d_h/2}) is rotated by the angle pos * theta_i: the "rotate half"
    pairing of GPT-NeoX/Llama rather than RoFormer's adjacent pairs, an equivalent permutation of the
    features. theta = `rope_theta` (10000). Applied to self-attention queries and keys only; keys are
    rotated before they enter the cache, so each decoding step rotates its own query and key.

    `rope_scaling` replaces theta_i by the frequencies transformers computes (`ROPE_INIT_FUNCTIONS`), and
    multiplies the rotated queries and keys by its attention factor (YaRN's, as transformers' rotary layers
    multiply cos and sin): linear (position interpolation, Chen et al. 2023: theta_i / f, so position p turns as
    p / f did), YaRN (Peng et al. 2024), dynamic NTK and dynamic YaRN (`"dynamic": True`: YaRN at the factor
    min(f, n / N)). Dynamic frequencies depend on the length n: in the encoder each source's own, in the decoder
    p + 1 for the token at position p (what transformers' dynamic rotary layer computes while decoding with a
    cache, so a cached decode equals the full forward); for n up to `original_max_position_embeddings` N they are
    RoFormer's.
    """

    title = "RoPE"
    reference = "Su et al. 2021 Eq. 13-16"
    citations = ("Su et al. 2021. RoFormer: Enhanced Transformer with Rotary Position Embedding.",)
    hyperparameters = {
        "rope_theta": Hyperparameter(float, 10000.0, "base of the rotation frequencies (RoFormer)")
    }
    # `rope_scaling` with a training length short enough for the conformance suite's inputs to pass it.
    variants = {
        "dynamic-scaling": {
            "rope_scaling": {"rope_type": "dynamic", "factor": 2.0, "original_max_position_embeddings": 4}
        },
        "yarn-scaling": {
            "rope_scaling": {"rope_type": "yarn", "factor": 4.0, "original_max_position_embeddings": 4}
        },
        "dynamic-yarn-scaling": {
            "rope_scaling": {
                "rope_type": "yarn",
                "factor": 4.0,
                "original_max_position_embeddings": 4,
                "dynamic": True,
            }
        },
    }

    def __init__(self, config, stack):
        super().__init__(config, stack)
        heads, _ = stack_heads_layers(config, stack)
        self.head_dim = config.d_model // heads
        self.scaling = effective_rope_scaling(config.rope_scaling)
        inverse_frequencies, self.attention_factor = self.frequencies()
        self.register_buffer("inverse_frequencies", inverse_frequencies, persistent=False)  # (Dh/2,)
        self.yarn_by_length = {}  # dynamic YaRN's frequencies and attention factor per (length, device)

    @classmethod
    def check_config(cls, config, stack):
        heads, _ = stack_heads_layers(config, stack)
        if (config.d_model // heads) % 2:
            raise ValueError(
                f"rope needs an even head dimension; d_model={config.d_model} / {stack}_attention_heads={heads} "
                f"= {config.d_model // heads}."
            )
        if config.rope_theta <= 0:
            raise ValueError(f"rope_theta={config.rope_theta} must be positive.")
        if config.rope_scaling is not None:
            check_rope_scaling(config.rope_scaling)

    def reset_parameters(self):
        init.copy_(self.inverse_frequencies, self.frequencies()[0])
        self.yarn_by_length.clear()

    @property
    def dynamic(self) -> bool:
        """Whether the frequencies follow the sequence length: dynamic NTK, or YaRN with `dynamic`."""
        return self.scaling is not None and (
            self.scaling["rope_type"] == "dynamic" or self.scaling.get("dynamic", False)
        )

    def frequencies(self) -> tuple[torch.Tensor, float]:
        """theta_i (Dh/2,) and the factor on rotated queries and keys: RoFormer's without scaling and for the
        dynamic scalings (rescaled per length in `rotate`), else transformers' for `rope_scaling`."""
        table = rope_inverse_frequencies(self.head_dim, self.config.rope_theta)
        if self.scaling is None or self.dynamic:
            return table, 1.0
        compute = ROPE_INIT_FUNCTIONS[self.scaling["rope_type"]]
        inverse, factor = compute(RopeParameters(self.scaling, self.config.rope_theta, self.head_dim), None)
        return inverse, float(factor)

    def dynamic_frequencies(self, lengths: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor | float]:
        """theta_i for sequences of `lengths` (B|1, L|1), through transformers' functions, and the factor on rotated
        queries and keys: (B|1, L|1, Dh/2) and (B|1, L|1, 1) or 1. RoFormer's, bit for bit, and 1 where n <= N,
        the training length. Past N, dynamic NTK raises the base by (f n / N - f + 1)^(d/(d-2)); dynamic YaRN
        takes YaRN's frequencies and attention factor at the factor s = min(f, n / N) (Peng et al. 2024, §3.3
        "Dynamic Scaling", s = max(1, n / N), here at most `factor`)."""
        trained = self.scaling["original_max_position_embeddings"]
        lengths = lengths[..., None]  # (B|1, L|1, 1)
        if self.scaling["rope_type"] == "dynamic":
            parameters = RopeParameters(self.scaling, self.config.rope_theta, self.head_dim)
            scaled, _ = ROPE_INIT_FUNCTIONS["dynamic"](parameters, lengths.device, seq_len=lengths)
            return torch.where(lengths <= trained, self.inverse_frequencies, scaled), 1.0
        distinct, where = torch.unique(lengths, return_inverse=True)
        inverse, factor = zip(*(self.yarn_at(int(length)) for length in distinct.tolist()), strict=True)
        factor = torch.tensor(factor, device=lengths.device)
        return torch.stack(inverse)[where[..., 0]], factor[where]  # (B|1, L|1, Dh/2), (B|1, L|1, 1)

    def yarn_at(self, length: int) -> tuple[torch.Tensor, float]:
        """Dynamic YaRN's theta_i (Dh/2,) and attention factor for a sequence of `length` tokens (kept per length:
        a decoder asks for one new length a step)."""
        device = self.inverse_frequencies.device
        if (length, device) not in self.yarn_by_length:
            trained = self.scaling["original_max_position_embeddings"]
            if length <= trained:
                self.yarn_by_length[length, device] = self.inverse_frequencies, 1.0
            else:
                scaling = {**self.scaling, "factor": min(self.scaling["factor"], length / trained)}
                parameters = RopeParameters(scaling, self.config.rope_theta, self.head_dim)
                inverse, factor = ROPE_INIT_FUNCTIONS["yarn"](parameters, device)
                self.yarn_by_length[length, device] = inverse.to(device), float(factor)
        return self.yarn_by_length[length, device]

    def rotate(self, states: torch.Tensor, positions: torch.Tensor, lengths=None) -> torch.Tensor:
        """(B, H, L, Dh) rotated by positions (B|1, L); `lengths` (B|1, L|1) set the dynamic frequencies."""
        if lengths is None:
            inverse, factor = self.inverse_frequencies, self.attention_factor
        else:
            inverse, factor = self.dynamic_frequencies(lengths)
            inverse, factor = inverse[:, None], factor[:, None] if torch.is_tensor(factor) else factor
        angles = positions[:, None, :, None].float() * inverse  # (B|1, 1, L, Dh/2)
        cos, sin = angles.cos(), angles.sin()
        first, second = states.float().chunk(2, dim=-1)  # (B, H, L, Dh/2) each
        rotated = torch.cat((first * cos - second * sin, second * cos + first * sin), dim=-1)
        if torch.is_tensor(factor) or factor != 1.0:  # YaRN: logits times its square
            rotated = rotated * factor
        return rotated.to(states.dtype)  # (B, H, L, Dh)

    def rotate_queries_keys(self, layer_idx, query, key, context):
        key_positions = context.key_positions[:, -key.shape[2] :]  # the new keys only
        if not self.dynamic:
            return self.rotate(query, context.query_positions), self.rotate(key, key_positions)
        if self.stack == DECODER:  # n = p + 1 for each token: fixed once the token is cached
            query_lengths, key_lengths = context.query_positions + 1, key_positions + 1  # (B|1, q), (B|1, k)
        else:  # each source's own length
            query_lengths = key_lengths = context.key_positions.amax(dim=-1, keepdim=True) + 1  # (B|1, 1)
        return (
            self.rotate(query, context.query_positions, query_lengths),
            self.rotate(key, key_positions, key_lengths),
        )
