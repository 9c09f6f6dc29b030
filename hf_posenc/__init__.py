"""hf_posenc: pluggable positional modules for Marian-style translation models in HF Transformers.

`import hf_posenc` registers the config and models with the Auto classes, so that
`AutoModelForSeq2SeqLM.from_pretrained(folder)` loads any model this project saved.
"""

from transformers import AutoConfig, AutoModel, AutoModelForSeq2SeqLM

from .base import PosEncCache, PositionContext, PositionEncoding, TokenMixer
from .configuration_marian_posenc import MarianPosEncConfig
from .modeling_marian_posenc import (
    MarianPosEncForConditionalGeneration,
    MarianPosEncModel,
    MarianPosEncPreTrainedModel,
)
from .registry import POSITION_ENCODINGS, TOKEN_MIXERS

AutoConfig.register(MarianPosEncConfig.model_type, MarianPosEncConfig, exist_ok=True)
AutoModel.register(MarianPosEncConfig, MarianPosEncModel, exist_ok=True)
AutoModelForSeq2SeqLM.register(MarianPosEncConfig, MarianPosEncForConditionalGeneration, exist_ok=True)

# save_pretrained writes the model code and `auto_map`, so saved folders load with trust_remote_code=True.
MarianPosEncConfig.register_for_auto_class()
MarianPosEncModel.register_for_auto_class("AutoModel")
MarianPosEncForConditionalGeneration.register_for_auto_class("AutoModelForSeq2SeqLM")

__all__ = [
    "POSITION_ENCODINGS",
    "TOKEN_MIXERS",
    "MarianPosEncConfig",
    "MarianPosEncForConditionalGeneration",
    "MarianPosEncModel",
    "MarianPosEncPreTrainedModel",
    "PosEncCache",
    "PositionContext",
    "PositionEncoding",
    "TokenMixer",
]
