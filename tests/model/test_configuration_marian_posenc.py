"""The config (configuration_marian_posenc.py) validates itself when it is built: unknown module names, impossible
shapes, bad values and special-token ids fail with an error naming the value and the allowed ones; renamed fields
still load under their old names; the config round-trips through JSON and AutoConfig."""

import json

import pytest
from transformers import AutoConfig

from hf_posenc import (
    MarianPosEncConfig,
)
from tests.helpers import VOCAB


def test_unknown_module_names_are_rejected_with_the_allowed_values():
    with pytest.raises(
        ValueError, match=r"encoder_position_encoding='sinusodal'.*allowed values: .*sinusoidal"
    ):
        MarianPosEncConfig(encoder_position_encoding="sinusodal")
    with pytest.raises(ValueError, match=r"position_encoding='rotary'.*learned"):
        MarianPosEncConfig(position_encoding="rotary")
    with pytest.raises(ValueError, match=r"cross_attention='conv'.*attention"):
        MarianPosEncConfig(cross_attention="conv")


def test_impossible_shapes_fail_at_config_time():
    with pytest.raises(ValueError, match=r"d_model=30 must be divisible by encoder_attention_heads=4"):
        MarianPosEncConfig(d_model=30, encoder_attention_heads=4)
    with pytest.raises(ValueError, match=r"max_position_embeddings=0"):
        MarianPosEncConfig(max_position_embeddings=0)


def test_renamed_fields_still_load_under_their_old_names_with_a_warning(tmp_path, caplog, tiny_config):
    """T5 bias's buckets were `relative_attention_*` (the relative-attention mixer's prefix) and aPosNet/rPosNet's
    gating was `posnet_gating` (PosNet's prefix): saved configs and old code keep working, and save anew."""
    old = tiny_config(encoder_position_encoding="t5_bias", encoder_self_attention="aposnet").to_dict()
    for new_name, old_name, value in (
        ("t5_bias_num_buckets", "relative_attention_num_buckets", 16),
        ("position_attention_gating", "posnet_gating", False),
    ):
        old.pop(new_name)
        old[old_name] = value
    (tmp_path / "config.json").write_text(json.dumps(old))
    with caplog.at_level("WARNING"):
        config = AutoConfig.from_pretrained(tmp_path)
    assert config.t5_bias_num_buckets == 16 and config.position_attention_gating is False
    assert "'posnet_gating' is deprecated: it is now 'position_attention_gating'" in caplog.text
    assert not hasattr(config, "posnet_gating") and "posnet_gating" not in config.to_dict()
    assert tiny_config(relative_attention_max_distance=12).t5_bias_max_distance == 12
    with pytest.raises(ValueError, match="'posnet_gating' is the old name of 'position_attention_gating'"):
        MarianPosEncConfig.from_dict({**old, "position_attention_gating": True})


def test_config_round_trips_through_json_and_auto_config(tmp_path, tiny_config):
    config = tiny_config(encoder_position_encoding="learned", decoder_position_encoding="none")
    config.save_pretrained(tmp_path)
    stored = json.loads((tmp_path / "config.json").read_text())
    assert stored["model_type"] == "marian_posenc" and "position_encoding" not in stored
    loaded = AutoConfig.from_pretrained(tmp_path)
    assert isinstance(loaded, MarianPosEncConfig)
    assert (loaded.encoder_position_encoding, loaded.decoder_position_encoding) == ("learned", "none")


BAD_CONFIGS = {
    "pad id = vocab size": (dict(pad_token_id=VOCAB), ["pad_token_id=60 is outside the vocabulary", "0..59"]),
    "start id beyond the vocabulary": (
        dict(decoder_start_token_id=100),
        ["decoder_start_token_id=100 is outside the vocabulary", "vocab_size=60"],
    ),
    "eos id = vocab size": (dict(eos_token_id=VOCAB), ["eos_token_id=60 is outside the vocabulary"]),
    "forced eos in a list": (
        dict(forced_eos_token_id=[1, 70]),
        ["forced_eos_token_id=[1, 70] is outside the vocabulary"],
    ),
    "negative bos": (dict(bos_token_id=-1), ["bos_token_id=-1 is outside the vocabulary", "0..59"]),
    "unshared embeddings": (
        dict(share_encoder_decoder_embeddings=False),
        ["share_encoder_decoder_embeddings=False is not supported", "allowed: True"],
    ),
}


@pytest.mark.parametrize("fields, words", BAD_CONFIGS.values(), ids=BAD_CONFIGS.keys())
def test_bad_special_token_ids_and_sharing_fail_when_the_config_is_built(fields, words, tiny_config):
    with pytest.raises(ValueError) as raised:
        tiny_config(**fields)
    for word in words:
        assert word in str(raised.value), str(raised.value)


@pytest.mark.parametrize(
    "fields, words",
    [
        (
            {"posnet_dimm": 3},
            ["unknown MarianPosEncConfig fields: 'posnet_dimm' (did you mean 'posnet_dim'?)"],
        ),
        ({"encoder_layers": 0}, ["encoder_layers=0 must be a positive integer"]),
        ({"decoder_ffn_dim": 0}, ["decoder_ffn_dim=0 must be a positive integer"]),
        ({"d_model": -4}, ["d_model=-4 must be a positive integer"]),
        ({"vocab_size": -1}, ["vocab_size=-1 must be a positive integer"]),
        ({"dropout": 1.5}, ["dropout=1.5 must be in [0, 1)"]),
        ({"posnet_dim": 0}, ["posnet_dim=0 must be >= 1"]),
        ({"rpe_cell": "transformer"}, ["rpe_cell='transformer' is not known; allowed values: rnn"]),
        ({"shape_max_shift": -1}, ["shape_max_shift=-1 must be >= 0"]),
        ({"init_std": float("nan")}, ["init_std=nan must be a finite number"]),
        ({"rope_theta": float("nan")}, ["rope_theta=nan must be a finite number"]),
        ({"posnet_dropout": float("nan")}, ["posnet_dropout=nan must be a finite number"]),
        ({"fire_init_threshold": float("inf")}, ["fire_init_threshold=inf must be a finite number"]),
        (
            {"position_encoding": "rope", "rope_scaling": {"rope_type": "linear", "factor": float("nan")}},
            ["rope_scaling=", "factor must be a finite number"],
        ),
        ({"activation_function": "rleu"}, ["activation_function='rleu' is not known", "relu"]),
        ({"init_std": -0.1}, ["init_std=-0.1 must be >= 0"]),
        ({"encoder_layerdrop": 0.2}, ["encoder_layerdrop=0.2 is not supported", "allowed: 0.0"]),
        ({"eos_token_id": []}, ["eos_token_id=[] names no end-of-sequence token"]),
    ],
    ids=lambda value: next(iter(value)) if isinstance(value, dict) else "",
)
def test_bad_config_values_fail_when_the_config_is_built(fields, words):
    with pytest.raises(ValueError) as error:
        MarianPosEncConfig(**fields)
    for word in words:
        assert word in str(error.value)


@pytest.mark.parametrize(
    "field, value, words",
    [
        ("d_model", "512", ["config.json", "Field 'd_model' expected int, got str"]),
        ("log_length_scaling", "cross_attention", ["config.json", "log_length_scaling"]),
    ],
)
def test_a_config_json_value_of_the_wrong_type_is_a_value_error_naming_the_file(
    tmp_path, tiny_config, field, value, words
):
    """A hand-edited config.json with a string for a number (or for a list) fails with a ValueError naming
    config.json and the field, which the command-line tools print as one line, instead of huggingface_hub's
    StrictDataclassFieldValidationError and its traceback."""
    tiny_config().save_pretrained(tmp_path)
    stored = json.loads((tmp_path / "config.json").read_text())
    (tmp_path / "config.json").write_text(json.dumps({**stored, field: value}))
    with pytest.raises(ValueError) as error:
        AutoConfig.from_pretrained(tmp_path)
    for word in words:
        assert word in str(error.value), str(error.value)
