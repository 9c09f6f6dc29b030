"""The model's guards (model_checks.py): bad inputs and bad checkpoints get a clear error naming the bad value (and
the allowed ones), and defects transformers' common model tests found stay fixed. Each table row: what is given,
the error expected, and words its message must contain."""

import argparse
import json
import logging
import subprocess
import sys

import pytest
import torch
from safetensors.torch import load_file, save_file
from transformers import AutoConfig

from hf_posenc import MarianPosEncConfig, MarianPosEncForConditionalGeneration, MarianPosEncModel
from hf_posenc.model_checks import check_token_ids, could_be_hub_id
from tests.helpers import VOCAB

START = torch.zeros(3, 1, dtype=torch.long)


@pytest.fixture(scope="module")
def source(source_batch):
    return source_batch()[0]


@pytest.fixture(scope="module")
def mask(source_batch):
    return source_batch()[1]


@pytest.fixture(scope="module")
def labels(target_batch):
    return target_batch()[:, 1:]


BAD_FORWARD_INPUTS = {
    "decoder ids outside the vocabulary": (
        lambda source, mask, labels: dict(input_ids=source, decoder_input_ids=torch.full((3, 2), VOCAB + 5)),
        ValueError,
        ["decoder_input_ids hold token id 65", "outside the vocabulary 0..59"],
    ),
    "negative decoder ids": (
        lambda source, mask, labels: dict(input_ids=source, decoder_input_ids=torch.full((3, 2), -3)),
        ValueError,
        ["decoder_input_ids hold token id -3", "0..59"],
    ),
    "float decoder ids": (
        lambda source, mask, labels: dict(input_ids=source, decoder_input_ids=torch.zeros(3, 2)),
        TypeError,
        ["decoder_input_ids must hold integer token ids", "torch.float32"],
    ),
    "float input ids": (
        lambda source, mask, labels: dict(input_ids=source.float(), decoder_input_ids=START),
        TypeError,
        ["input_ids must hold integer token ids", "torch.float32"],
    ),
    "1-D decoder ids": (
        lambda source, mask, labels: dict(
            input_ids=source[:1], decoder_input_ids=torch.zeros(4, dtype=torch.long)
        ),
        ValueError,
        ["decoder_input_ids of shape (4,) must be 2-D, (batch, length)", "ids[None]"],
    ),
    "1-D input ids": (
        lambda source, mask, labels: dict(input_ids=source[0], decoder_input_ids=START[:1]),
        ValueError,
        ["input_ids of shape (11,) must be 2-D, (batch, length)", "ids[None]"],
    ),
    "3-D decoder ids": (
        lambda source, mask, labels: dict(
            input_ids=source, decoder_input_ids=torch.zeros(3, 2, 2, dtype=torch.long)
        ),
        ValueError,
        ["decoder_input_ids of shape (3, 2, 2) must be 2-D"],
    ),
    "3-D input ids": (
        lambda source, mask, labels: dict(input_ids=source[None], decoder_input_ids=START),
        ValueError,
        ["input_ids of shape (1, 3, 11) must be 2-D"],
    ),
    "1-D labels": (
        lambda source, mask, labels: dict(input_ids=source[:1], labels=labels[0]),
        ValueError,
        ["labels of shape (8,) must be 2-D"],
    ),
    "float labels": (
        lambda source, mask, labels: dict(input_ids=source, labels=labels.float()),
        TypeError,
        ["labels must hold integer token ids", "torch.float32"],
    ),
    "num_items_in_batch 0 with label tokens": (
        lambda source, mask, labels: dict(
            input_ids=source, attention_mask=mask, labels=labels, num_items_in_batch=0
        ),
        ValueError,
        ["num_items_in_batch=0 must be positive", "this part alone holds 24"],
    ),
    "num_items_in_batch tensor(0)": (
        lambda source, mask, labels: dict(
            input_ids=source, attention_mask=mask, labels=labels, num_items_in_batch=torch.tensor(0)
        ),
        ValueError,
        ["num_items_in_batch=0 must be positive"],
    ),
}


@pytest.mark.parametrize("inputs, error, words", BAD_FORWARD_INPUTS.values(), ids=BAD_FORWARD_INPUTS.keys())
def test_bad_forward_inputs_are_named(inputs, error, words, tiny_model, source, mask, labels):
    """Before: ids outside the vocabulary passed unchecked with the default use_cache=True (IndexError inside
    the embedding), 1-D ids failed with a position-table error, float ids inside torch, and
    num_items_in_batch=0 gave an infinite loss."""
    model = tiny_model()
    with pytest.raises(error) as raised:
        model(**inputs(source, mask, labels))
    for word in words:
        assert word in str(raised.value), str(raised.value)


def test_the_decoder_alone_without_encoder_states_is_a_clear_error(tiny_model):
    """Before: AttributeError ('NoneType' object has no attribute 'shape') deep in the decoder."""
    decoder = tiny_model().get_decoder()
    with pytest.raises(ValueError, match="the decoder needs encoder_hidden_states, the encoder's output"):
        decoder(input_ids=START)


def test_token_id_checks_read_values_back_only_on_the_cpu(monkeypatch):
    """The value checks would sync an accelerator at every training and decoding step; off the CPU
    only the host-side metadata (dtype, shape) is checked. A meta tensor stands in for an accelerator's."""
    with pytest.raises(ValueError, match="outside the vocabulary"):
        check_token_ids(torch.full((2, 3), VOCAB + 1), VOCAB, "input_ids")
    on_device = torch.full((2, 3), VOCAB + 1, device="meta")

    def no_read(*args, **kwargs):
        raise AssertionError("token ids read back from a device")

    monkeypatch.setattr(torch, "aminmax", no_read)
    monkeypatch.setattr(torch.Tensor, "__int__", no_read)
    check_token_ids(on_device, VOCAB, "input_ids")
    with pytest.raises(TypeError, match="must hold integer token ids"):
        check_token_ids(on_device.float(), VOCAB, "input_ids")
    with pytest.raises(ValueError, match=r"of shape \(6,\) must be 2-D"):
        check_token_ids(on_device.flatten(), VOCAB, "input_ids")


FIELDS_SET_LATER = {
    "unknown position encoding": (
        "encoder_position_encoding",
        "rotary",
        ["encoder_position_encoding='rotary' is not known", "allowed values", "sinusoidal"],
    ),
    "pad id beyond the vocabulary": ("pad_token_id", 99, ["pad_token_id=99 is outside the vocabulary"]),
    "indivisible heads": ("d_model", 30, ["d_model=30 must be divisible by encoder_attention_heads=4"]),
    "mixer at a site it cannot serve": (
        "decoder_self_attention",
        "fourier",
        ["decoder_self_attention='fourier' cannot be used there"],
    ),
}


@pytest.mark.parametrize("field, value, words", FIELDS_SET_LATER.values(), ids=FIELDS_SET_LATER.keys())
@pytest.mark.parametrize("model_class", [MarianPosEncModel, MarianPosEncForConditionalGeneration])
def test_config_fields_set_after_construction_are_checked_when_the_model_is_built(
    model_class, field, value, words, tiny_config
):
    """Before: the config validated itself only at construction; a field set later reached torch."""
    config = tiny_config()
    setattr(config, field, value)
    with pytest.raises(ValueError) as raised:
        model_class(config)
    for word in words:
        assert word in str(raised.value), str(raised.value)


def test_from_pretrained_on_a_missing_folder_names_the_path(tmp_path):
    """Before: huggingface_hub's 'Repo id must be in the form ...' about a path that was never a repo id."""
    missing = tmp_path / "no-such-run"
    for given in (missing, str(missing), f"./{missing.name}/model"):
        with pytest.raises(FileNotFoundError, match=f"no model folder at .*{missing.name}"):
            MarianPosEncForConditionalGeneration.from_pretrained(given)


def test_hub_ids_are_not_taken_for_missing_folders():
    assert could_be_hub_id("Helsinki-NLP/opus-mt-en-de") and could_be_hub_id("t5-small")
    assert not any(map(could_be_hub_id, ["/runs/model", "./model", "~/model", "runs/en-de/model"]))


def edit_config(folder, **fields):
    path = folder / "config.json"
    path.write_text(json.dumps({**json.loads(path.read_text()), **fields}))


@pytest.mark.parametrize(
    "saved, edited, words",
    [
        (
            {"position_encoding": "sinusoidal"},
            {"encoder_position_encoding": "learned", "decoder_position_encoding": "learned"},
            [
                "encoder_position_encoding='learned': model.encoder.position_encoding.weight",
                "decoder_position_encoding='learned': model.decoder.position_encoding.weight",
            ],
        ),
        (
            {"position_encoding": "learned"},
            {"encoder_position_encoding": "rpe_head"},
            ["encoder_position_encoding='rpe_head': model.encoder.position_encoding."],
        ),
        (
            {},
            {"decoder_self_attention": "rposnet"},
            ["decoder_self_attention='rposnet': model.decoder.layers.0.self_attn."],
        ),
    ],
    ids=["sinusoidal-to-learned", "learned-to-rpe_head", "attention-to-rposnet"],
)
def test_a_checkpoint_without_the_positional_parameters_of_its_config_is_refused(
    tmp_path, saved, edited, words, tiny_model
):
    """Before: a config.json edited to another position encoding loaded with random tables (a MISSING report)."""
    tiny_model(**saved).save_pretrained(tmp_path)
    edit_config(tmp_path, **edited)
    with pytest.raises(ValueError) as raised:
        MarianPosEncForConditionalGeneration.from_pretrained(tmp_path)
    message = str(raised.value)
    for word in [str(tmp_path), "lacks parameters of the model's positional modules", *words]:
        assert word in message, message


def test_folded_models_and_checkpoints_without_any_weights_still_load(tmp_path, tiny_model, source, mask):
    """The positional check leaves alone what must keep loading: a folded model (its tables are parameters of
    the checkpoint), and a checkpoint holding none of the model's parameters (transformers' report, as in its
    own `test_model_weights_reload_no_missing_tied_weights`)."""
    model = tiny_model(encoder_self_attention="rposnet", decoder_self_attention="rposnet")
    model.precompute_position_attention()
    model.save_pretrained(tmp_path / "folded")
    loaded = MarianPosEncForConditionalGeneration.from_pretrained(tmp_path / "folded").eval()
    with torch.no_grad():
        expected = model(input_ids=source, attention_mask=mask, decoder_input_ids=START).logits
        torch.testing.assert_close(
            loaded(input_ids=source, attention_mask=mask, decoder_input_ids=START).logits, expected
        )
    tiny_model(position_encoding="learned").save_pretrained(tmp_path / "empty")
    save_file(
        {"unrelated": torch.zeros(1)}, tmp_path / "empty" / "model.safetensors", metadata={"format": "pt"}
    )
    _, info = MarianPosEncForConditionalGeneration.from_pretrained(
        tmp_path / "empty", output_loading_info=True
    )
    assert "model.encoder.position_encoding.weight" in info["missing_keys"]


@pytest.mark.parametrize("model_class", [MarianPosEncModel, MarianPosEncForConditionalGeneration])
def test_a_checkpoint_without_the_embeddings_reports_them_missing_and_initialises_them(
    model_class, tmp_path, tiny_config, source, mask
):
    """Before: encoder and decoder shared the embedding module and `_tied_weights_keys` tied it too, so loading
    marked the missing table as loaded: no report, embeddings and LM head left on the meta device, and the
    first forward crashed."""
    model = model_class(tiny_config())
    model.save_pretrained(tmp_path)
    weights = load_file(tmp_path / "model.safetensors")
    kept = {name: tensor for name, tensor in weights.items() if not name.endswith("shared.weight")}
    assert len(kept) == len(weights) - 1
    save_file(kept, tmp_path / "model.safetensors", metadata={"format": "pt"})
    loaded, info = model_class.from_pretrained(tmp_path, output_loading_info=True)
    assert any(key.endswith("shared.weight") for key in info["missing_keys"]), info["missing_keys"]
    assert all(parameter.device.type != "meta" for parameter in loaded.parameters())
    base = loaded.model if model_class is MarianPosEncForConditionalGeneration else loaded
    assert base.encoder.embed_tokens.weight is base.shared.weight is base.decoder.embed_tokens.weight
    output = loaded.eval()(input_ids=source, attention_mask=mask, decoder_input_ids=START)
    assert torch.isfinite(output[0]).all()


@pytest.mark.parametrize("new_size", [VOCAB + 7, VOCAB - 10])
def test_resize_token_embeddings_resizes_the_final_logits_bias(new_size, tiny_model, source):
    """Before: the bias kept the old vocabulary size and the next forward failed on the logits' shape."""
    model = tiny_model()
    bias = torch.randn(1, VOCAB)
    model.final_logits_bias.copy_(bias)
    model.resize_token_embeddings(new_size)
    kept = min(VOCAB, new_size)
    torch.testing.assert_close(model.final_logits_bias[:, :kept], bias[:, :kept])
    assert model.final_logits_bias.shape == (1, new_size) and not model.final_logits_bias[:, kept:].any()
    assert model.config.vocab_size == model.config.decoder_vocab_size == new_size
    logits = model(input_ids=source.clamp(max=new_size - 1), decoder_input_ids=START).logits
    assert logits.shape == (3, 1, new_size)


def test_output_flags_and_return_dict_follow_the_config(tiny_model, source, mask):
    """Before: `config.output_attentions`, `config.output_hidden_states` and `return_dict=False` were ignored."""
    model = tiny_model(attn_implementation="eager")  # transformers refuses output_attentions with SDPA
    model.config.output_attentions = model.config.output_hidden_states = True
    out = model(input_ids=source, attention_mask=mask, decoder_input_ids=START)
    assert len(out.encoder_attentions) == len(out.cross_attentions) == 2
    assert len(out.decoder_hidden_states) == len(out.encoder_hidden_states) == 3  # embeddings + 2 layers
    as_tuple = model(input_ids=source, attention_mask=mask, decoder_input_ids=START, return_dict=False)
    assert isinstance(as_tuple, tuple)
    torch.testing.assert_close(as_tuple[0], out.logits)
    model.config.return_dict = False
    assert isinstance(model.get_encoder()(input_ids=source), tuple)
    assert isinstance(model(input_ids=source, decoder_input_ids=START), tuple)


def test_a_saved_config_with_attributes_beyond_its_fields_loads(tmp_path, caplog, tiny_model):
    """Before: `save_pretrained` wrote attributes set on the config (transformers' tests set `layer_norm_eps`)
    and `from_pretrained` refused them. The constructor still refuses unknown names; a key close to a field's
    name in a loaded file is named in a warning."""
    model = tiny_model()
    model.config.layer_norm_eps = 1e-5
    model.save_pretrained(tmp_path)
    loaded = MarianPosEncForConditionalGeneration.from_pretrained(tmp_path)
    assert loaded.config.layer_norm_eps == 1e-5
    with pytest.raises(ValueError, match="unknown MarianPosEncConfig fields: 'layer_norm_eps'"):
        MarianPosEncConfig(layer_norm_eps=1e-5)
    edit_config(tmp_path, posnet_dimm=3)
    with caplog.at_level(logging.WARNING):
        config = AutoConfig.from_pretrained(tmp_path)
    assert config.posnet_dimm == 3 and "did you mean 'posnet_dim'" in caplog.text


def test_the_code_warning_compares_every_model_file_of_a_saved_folder(tmp_path, caplog, tiny_model):
    """Before: only modeling_marian_posenc.py was compared; a folder whose base.py differs loaded silently."""
    tiny_model().save_pretrained(tmp_path)
    with caplog.at_level(logging.WARNING):
        MarianPosEncForConditionalGeneration.from_pretrained(tmp_path)
    assert "differs" not in caplog.text
    with (tmp_path / "base.py").open("a") as copy:
        copy.write("\n# edited\n")
    with caplog.at_level(logging.WARNING):
        MarianPosEncForConditionalGeneration.from_pretrained(tmp_path)
    assert "carries model code that differs" in caplog.text and "(base.py)" in caplog.text


def test_valid_label_batches_keep_their_loss_with_num_items_in_batch(tiny_model, source, mask, labels):
    model = tiny_model()
    labels = labels.clone()
    labels[0, -2:] = -100
    tokens = int((labels != -100).sum())
    loss = model(input_ids=source, attention_mask=mask, labels=labels, num_items_in_batch=tokens).loss
    torch.testing.assert_close(loss, model(input_ids=source, attention_mask=mask, labels=labels).loss)


def test_bad_model_inputs_are_named(tiny_model, source, mask):
    model = tiny_model()
    start = torch.zeros(3, 1, dtype=torch.long)
    cases = [
        (dict(input_ids=torch.zeros(0, 5, dtype=torch.long), decoder_input_ids=start), "hold no token"),
        (dict(input_ids=torch.zeros(2, 0, dtype=torch.long), decoder_input_ids=start), "hold no token"),
        (
            dict(input_ids=torch.full((1, 3), 99), decoder_input_ids=start[:1]),
            "token id 99, outside the vocabulary 0..59",
        ),
        (
            dict(input_ids=torch.full((1, 3), -1), decoder_input_ids=start[:1]),
            "token id -1, outside the vocabulary",
        ),
        (
            dict(input_ids=source, attention_mask=mask[:, :5], decoder_input_ids=start),
            "attention_mask has shape (3, 5)",
        ),
        (dict(input_ids=source, labels=torch.full((3, 4), -100)), "labels are all -100"),
        (dict(input_ids=source, labels=torch.full((3, 4), 70)), "labels hold token id 70"),
    ]
    for inputs, words in cases:
        with pytest.raises(
            ValueError, match=words.replace("(", r"\(").replace(")", r"\)").replace(".", r"\.")
        ):
            model(**inputs)
    with pytest.raises(ValueError, match="num_beams=0 must be at least 1"):
        model.generate(source, attention_mask=mask, num_beams=0)


def test_pickled_weights_the_safe_loader_refuses_are_named_with_the_way_to_safetensors(tmp_path, tiny_model):
    """Before: a folder whose only weights are a pytorch_model.bin holding more than tensors (a training
    script's arguments here) ended in torch's UnpicklingError, whose one hint is the unsafe weights_only=False.
    The error names the file and says to convert it to safetensors, and only from a trusted source."""
    model = tiny_model()
    model.save_pretrained(tmp_path)
    (tmp_path / "model.safetensors").unlink()
    torch.save({**model.state_dict(), "args": argparse.Namespace(lr=1e-3)}, tmp_path / "pytorch_model.bin")
    with pytest.raises(ValueError) as raised:
        MarianPosEncForConditionalGeneration.from_pretrained(tmp_path)
    message = str(raised.value)
    for words in [
        str(tmp_path / "pytorch_model.bin"),
        "argparse.Namespace",
        "safetensors",
        "trust its source",
    ]:
        assert words in message, message
    torch.save(
        model.state_dict(), tmp_path / "pytorch_model.bin"
    )  # tensors only: torch's safe loader reads it
    MarianPosEncForConditionalGeneration.from_pretrained(tmp_path)


def test_an_auto_map_entry_naming_a_missing_class_is_refused_by_name(tmp_path, tiny_model):
    """Before: loading with trust_remote_code=True failed on "module 'transformers_modules.<hash>.modeling_...'
    has no attribute ..." without naming the entry (and loaded silently where hf_posenc is imported). The config
    refuses it, naming the key, the class and the classes the file defines: here and in a fresh process that
    loads the folder's own code."""
    tiny_model().save_pretrained(tmp_path)
    auto_map = json.loads((tmp_path / "config.json").read_text())["auto_map"]
    edit_config(tmp_path, auto_map={**auto_map, "AutoModelForSeq2SeqLM": "modeling_marian_posenc.MarianMT"})
    words = ["auto_map['AutoModelForSeq2SeqLM'] = 'modeling_marian_posenc.MarianMT'", "MarianPosEncModel"]
    with pytest.raises(ValueError) as raised:
        AutoConfig.from_pretrained(tmp_path)
    assert all(word in str(raised.value) for word in words), raised.value
    code = (
        "from transformers import AutoModelForSeq2SeqLM\n"
        f"AutoModelForSeq2SeqLM.from_pretrained({str(tmp_path)!r}, trust_remote_code=True)"
    )
    remote = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, cwd=tmp_path)
    assert "transformers_modules" in remote.stderr  # raised by the folder's own copy of the config code
    assert remote.returncode != 0 and all(word in remote.stderr for word in words), remote.stderr[-2000:]


def test_a_folder_without_generation_config_keeps_the_models_decoding_settings(tmp_path, caplog, tiny_model):
    """Before: transformers built the generation config from config.json: greedy and at most 20 tokens, every
    longer translation cut there without an error. The model's own settings (beam 4, length penalty 0.6, source
    length + 50) are kept, and a warning names the folder."""
    tiny_model().save_pretrained(tmp_path)
    (tmp_path / "generation_config.json").unlink()
    with caplog.at_level(logging.WARNING):
        loaded = MarianPosEncForConditionalGeneration.from_pretrained(tmp_path)
    settings = loaded.generation_config
    assert (settings.num_beams, settings.length_penalty, settings.max_new_tokens_over_source) == (4, 0.6, 50)
    assert f"{tmp_path} has no generation_config.json" in caplog.text


@pytest.mark.parametrize("content", ["{broken", "[1, 2]"])
def test_an_unreadable_generation_config_is_named(tmp_path, tiny_model, content):
    """Before: transformers fell back, with an info message only, to greedy decoding of at most 20 tokens."""
    tiny_model().save_pretrained(tmp_path)
    (tmp_path / "generation_config.json").write_text(content)
    with pytest.raises(ValueError, match=r"generation_config.json (cannot be read|holds a list)"):
        MarianPosEncForConditionalGeneration.from_pretrained(tmp_path)
