"""The two registries: name -> class. Adding a module = one `posenc_<family>.py` file + its lines here.

`POSITION_ENCODINGS` are chosen per stack (`encoder_position_encoding`, `decoder_position_encoding`);
`TOKEN_MIXERS` per attention site (`encoder_self_attention`, `decoder_self_attention`, `cross_attention`).
The conformance suite (tests/model/test_conformance.py) runs over every name listed here.
"""

from .mixer_attention import ContentAttention
from .mixer_fourier import FourierNet
from .mixer_gated import APosNetAttention, RPosNetAttention
from .mixer_gaussian import GaussianNet
from .mixer_lightconv import LightConv
from .mixer_linear import GLinearNet, LinearNet
from .mixer_relative import RelativeAttention
from .posenc_absolute import LearnedPositionEncoding, NoPositionEncoding, SinusoidalPositionEncoding
from .posenc_fire import FirePositionEncoding
from .posenc_kerple import KerplePositionEncoding
from .posenc_posnet import PosNetAttention, PosNetEmbedding
from .posenc_recurrent import MPRHeadPositionEncoding, RPEHeadPositionEncoding
from .posenc_relative import (
    AdaptiveT5PositionEncoding,
    AlibiPositionEncoding,
    ShawRelativePositionEncoding,
    T5BiasPositionEncoding,
)
from .posenc_rotary import RotaryPositionEncoding

POSITION_ENCODINGS = {
    "none": NoPositionEncoding,
    "sinusoidal": SinusoidalPositionEncoding,
    "learned": LearnedPositionEncoding,
    "rpe_head": RPEHeadPositionEncoding,
    "mpr_head": MPRHeadPositionEncoding,
    "posnet_embed": PosNetEmbedding,
    "posnet_attn": PosNetAttention,
    "shaw": ShawRelativePositionEncoding,
    "t5_bias": T5BiasPositionEncoding,
    "adaptive_t5": AdaptiveT5PositionEncoding,
    "alibi": AlibiPositionEncoding,
    "rope": RotaryPositionEncoding,
    "fire": FirePositionEncoding,
    "kerple": KerplePositionEncoding,
}

TOKEN_MIXERS = {
    "attention": ContentAttention,
    "relative_attention": RelativeAttention,
    "aposnet": APosNetAttention,
    "rposnet": RPosNetAttention,
    "fourier": FourierNet,
    "gaussian": GaussianNet,
    "linear": LinearNet,
    "glinear": GLinearNet,
    "lightconv": LightConv,
}
