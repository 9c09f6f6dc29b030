"""Configuration of Marian models with pluggable positional modules.

Every choice is a typed field that lands in `config.json`: one string per choice (which position encoding
per stack, which token mixer per attention site) plus the typed hyperparameters of each module. The config
validates itself at construction, so an impossible model fails here with a message naming the bad value
rather than deep inside torch.
"""

from huggingface_hub.dataclasses import strict
from transformers import MarianConfig

from .base import ATTENTION_SITES
from .registry import POSITION_ENCODINGS, TOKEN_MIXERS

# Input position encoding of a stack whose self-attention mixer has no `recommended_position_encoding`.
DEFAULT_POSITION_ENCODING = "sinusoidal"


def check_choice(field: str, value, allowed) -> None:
    if value not in allowed:
        raise ValueError(f"{field}={value!r} is not known; allowed values: {', '.join(sorted(allowed))}.")


@strict
class MarianPosEncConfig(MarianConfig):
    r"""Marian's configuration plus the positional module choices.

    position_encoding (`str`, constructor shorthand): sets both `encoder_position_encoding` and
        `decoder_position_encoding`.
    encoder_position_encoding / decoder_position_encoding (`str`, defaults to the stack's recommended one): a
        name from `hf_posenc.POSITION_ENCODINGS`. Unset, each stack gets the input embedding paper 2 §5.2
        pairs with the mixer at its self-attention site (the mixer class's `recommended_position_encoding`:
        `"learned"` for `"rposnet"`, else `"sinusoidal"`); an explicit value always wins (also the
        `position_encoding` shorthand), and config.json stores the resolved value.
    encoder_self_attention / decoder_self_attention / cross_attention (`str`, defaults to `"attention"`): a
        name from `hf_posenc.TOKEN_MIXERS`.

    The defaults of the remaining Marian fields are those of a small translation model (d_model 512, 6+6
    layers, 8 heads, scaled embeddings, tied embeddings), not of MarianConfig's opus-mt-big defaults.
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

    # Hyperparameters of the positional families, one block per posenc_<family>.py, paper defaults.
    # posnet (posenc_posnet.py)
    posnet_dim: int = 128  # d_p of PosNet-Embed (paper 1: 128 base, 256 big)
    posnet_activation: str = "relu"  # σ of Eq. 23/24, a name from transformers' ACT2FN
    posnet_dropout: float = 0.0  # on PosNet's output before the residual (reference default 0)
    posnet_shared: bool = True  # encoder and decoder share one PosNet-Embed module (reference)
    posnet_attn_per_head: bool = False  # PosNet-Attn: a kernel per head instead of one per layer
    # PosNet-Attn: one kernel table for all layers of a stack (and, with posnet_shared, for both stacks) instead
    # of one per layer; paper 1 Table 1's count implies one table; False keeps earlier checkpoints loadable.
    posnet_attn_share_layers: bool = False

    # recurrent (posenc_recurrent.py)
    # f_RNN over x^r (Chen et al. 2019 Eq. 6): "rnn" (tanh, the paper's; < 2% extra parameters), "gru", "lstm".
    rpe_cell: str = "rnn"
    # d_r, the embedding features given to the RNN; None = the paper's best value for the layout (320 for
    # "rpe_head", 256 for "mpr_head" at d_model 512), scaled to d_model (see RecurrentPositionEncoding).
    rpe_dim: int | None = None
    # "per_head": the first self-attention layer's Q/K/V read only each head's own input slice; "full": Eq. 4.
    rpe_head_projection: str = "per_head"

    # gated (mixer_gated.py): paper 2 (Gated position-based attention), Eq. 4 and 8-10
    attention_gating: bool = False  # Eq. 4 gating on content attention ("attention"), Table 6 ablation
    posnet_gating: bool = True  # Eq. 4 gating in "aposnet"/"rposnet" (False: Table 6 "without gating")
    rposnet_max_relative_position: int = 16  # K of Eq. 10 (16 base, 8 big)
    rposnet_length_ratio: float = 1.0  # γ of Eq. 10 in cross-attention: mean source/target length ratio
    position_attention_precomputed: bool = False  # set by model.precompute_position_attention()

    # mixers (mixer_position_only.py): paper 2 §2.2 and Appendix A, Eq. 11-14
    lightconv_kernel_radius: int = 16  # K: LightConv kernels have 2K+1 taps
    lightconv_weight_dropout: float = 0.1  # DropConnect on the softmax-normalised kernel (Wu et al. 2019)

    # relative (posenc_relative.py)
    max_relative_position: int = 16  # shaw: clipping distance k (Shaw et al. 2018: 16 base, 8 big)
    relative_attention_num_buckets: int = 32  # t5_bias: buckets per stack (T5)
    relative_attention_max_distance: int = 128  # t5_bias: distance where the last bucket starts (T5)
    adaptive_t5_hidden_sizes: list[int] | tuple[int, ...] = (32, 4)  # adaptive_t5: MLP widths l1, l2
    adaptive_t5_max_length: int = 1024  # adaptive_t5: L in alpha_h = ReLU(a_h) / L
    adaptive_t5_every_layer: bool = False  # adaptive_t5: bias in every layer instead of the first only
    rope_theta: float = 10000.0  # rope: base of the rotation frequencies (RoFormer)

    def __post_init__(self, **kwargs):
        shorthand = kwargs.pop("position_encoding", None)
        if shorthand is not None:
            self.encoder_position_encoding = shorthand
            self.decoder_position_encoding = shorthand
        for stack in ("encoder", "decoder"):
            if getattr(self, f"{stack}_position_encoding") is None:
                mixer = TOKEN_MIXERS.get(getattr(self, f"{stack}_self_attention"))
                encoding = getattr(mixer, "recommended_position_encoding", DEFAULT_POSITION_ENCODING)
                setattr(self, f"{stack}_position_encoding", encoding)
        self.check_choices()
        super().__post_init__(**kwargs)

    def check_choices(self) -> None:
        """Raise a ValueError naming the bad value and the allowed ones (runs before any model is built)."""
        for stack in ("encoder", "decoder"):
            heads = getattr(self, f"{stack}_attention_heads")
            if heads <= 0 or self.d_model % heads:
                raise ValueError(
                    f"d_model={self.d_model} must be divisible by {stack}_attention_heads={heads}."
                )
        if self.max_position_embeddings <= 0:
            raise ValueError(f"max_position_embeddings={self.max_position_embeddings} must be positive.")
        for stack in ("encoder", "decoder"):
            encoding = getattr(self, f"{stack}_position_encoding")
            check_choice(f"{stack}_position_encoding", encoding, POSITION_ENCODINGS)
            POSITION_ENCODINGS[encoding].check_config(self, stack)
        for site in ATTENTION_SITES:
            mixer = getattr(self, site)
            check_choice(site, mixer, TOKEN_MIXERS)
            if site not in TOKEN_MIXERS[mixer].allowed_sites:
                raise ValueError(
                    f"{site}={mixer!r} cannot be used there; {mixer!r} works at: "
                    f"{', '.join(TOKEN_MIXERS[mixer].allowed_sites)}."
                )
            TOKEN_MIXERS[mixer].check_config(self, site)
