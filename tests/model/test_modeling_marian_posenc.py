"""The model (modeling_marian_posenc.py): Marian parity and conversion, save/load details, generation defaults,
attention outputs, the loss the Trainer relies on, and positions computed without reading back from the device."""

import json
import subprocess
import sys
from pathlib import Path

import pytest
import torch
from safetensors import safe_open
from transformers import AutoModelForSeq2SeqLM, MarianConfig, MarianMTModel

import hf_posenc
from hf_posenc import (
    POSITION_ENCODINGS,
    TOKEN_MIXERS,
    MarianPosEncForConditionalGeneration,
)
from hf_posenc.base import DECODER_SELF_ATTENTION
from hf_posenc.posenc_absolute import marian_sinusoid_table
from tests.helpers import PAD, TINY_FIELDS, VOCAB, record_host_reads_from


def stock_marian(seed=0):
    torch.manual_seed(seed)
    config = MarianConfig(**TINY_FIELDS, scale_embedding=True)
    return MarianMTModel(config).eval()


def test_sinusoidal_attention_model_reproduces_marian_logits_and_beam_search(source_batch, target_batch):
    stock = stock_marian()
    ours = MarianPosEncForConditionalGeneration.from_marian(stock).eval()
    src, mask = source_batch()
    tgt = target_batch()
    with torch.no_grad():
        expected = stock(input_ids=src, attention_mask=mask, decoder_input_ids=tgt).logits
        actual = ours(input_ids=src, attention_mask=mask, decoder_input_ids=tgt).logits
    assert (expected - actual).abs().max() <= 1e-5
    kwargs = dict(attention_mask=mask, num_beams=4, max_new_tokens=12, length_penalty=0.6)
    assert ours.generate(src, **kwargs).tolist() == stock.generate(src, **kwargs).tolist()


def test_the_stock_config_of_ours_builds_the_same_model_as_ours_with_sinusoids(
    source_batch, target_batch, tiny_config
):
    """`to_marian_config` is the stock baseline of train.py and the benchmarks: the same Marian fields, so a
    MarianMTModel built from it and converted gives our logits."""
    ours_config = tiny_config(attn_implementation="eager")
    stock_config = ours_config.to_marian_config()
    for name in (
        "scale_embedding",
        "activation_function",
        "pad_token_id",
        "eos_token_id",
        "decoder_start_token_id",
        "vocab_size",
        "d_model",
        "max_position_embeddings",
        "encoder_layers",
        "decoder_ffn_dim",
    ):
        assert getattr(stock_config, name) == getattr(ours_config, name), name
    torch.manual_seed(0)
    stock = MarianMTModel(stock_config).eval()
    ours = MarianPosEncForConditionalGeneration.from_marian(stock).eval()
    src, mask = source_batch()
    with torch.no_grad():
        expected = stock(input_ids=src, attention_mask=mask, decoder_input_ids=target_batch()).logits
        actual = ours(input_ids=src, attention_mask=mask, decoder_input_ids=target_batch()).logits
    assert (expected - actual).abs().max() <= 1e-5


def test_from_marian_folder_swaps_the_position_encoding_and_keeps_the_rest(tmp_path):
    stock = stock_marian(seed=3)
    stock.save_pretrained(tmp_path)
    ours = MarianPosEncForConditionalGeneration.from_marian(str(tmp_path), position_encoding="learned")
    assert ours.config.encoder_position_encoding == ours.config.decoder_position_encoding == "learned"
    stock_state = stock.state_dict()
    for name, tensor in ours.state_dict().items():
        if name in stock_state:
            torch.testing.assert_close(tensor, stock_state[name], rtol=0, atol=0)
        else:  # the new learned tables: initialised, not left empty
            assert "position_encoding" in name
            assert torch.isfinite(tensor).all() and tensor.std() > 0


def test_a_saved_folder_loads_as_automodel_with_remote_code_alone(tmp_path, tiny_model):
    """auto_map names the base model too: `AutoModel` with `trust_remote_code` works without hf_posenc. The folder
    holds the whole flat closure: every flat module of the package but `__init__.py` (the model's files import only
    each other, so one left out of the imports is one the saved model would lack)."""
    tiny_model().save_pretrained(tmp_path)
    package = Path(hf_posenc.__file__).parent
    flat = {path.name for path in package.glob("*.py")} - {"__init__.py"}
    assert {path.name for path in tmp_path.glob("*.py")} == flat
    assert json.loads((tmp_path / "config.json").read_text())["auto_map"]["AutoModel"] == (
        "modeling_marian_posenc.MarianPosEncModel"
    )
    script = (
        "import sys; sys.modules['hf_posenc'] = None\n"
        "from transformers import AutoModel\n"
        f"print(type(AutoModel.from_pretrained({str(tmp_path)!r}, trust_remote_code=True)).__name__)"
    )
    completed = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, timeout=300)
    assert completed.returncode == 0, completed.stderr[-2000:]
    assert completed.stdout.strip().splitlines()[-1] == "MarianPosEncModel"


def test_learned_tables_are_saved_unlike_stock_marian(tmp_path, tiny_model):
    model = tiny_model(position_encoding="learned")
    model.save_pretrained(tmp_path)
    with safe_open(tmp_path / "model.safetensors", "pt") as weights:
        keys = set(weights.keys())
        torch.testing.assert_close(
            weights.get_tensor("model.encoder.position_encoding.weight"),
            model.model.encoder.position_encoding.weight.detach(),
        )
    assert "model.decoder.position_encoding.weight" in keys


def test_sinusoid_table_is_rebuilt_when_loading(tmp_path, tiny_model):
    tiny_model().save_pretrained(tmp_path)
    loaded = AutoModelForSeq2SeqLM.from_pretrained(tmp_path)
    expected = marian_sinusoid_table(64, 32)
    torch.testing.assert_close(loaded.model.encoder.position_encoding.table, expected, rtol=0, atol=0)
    torch.testing.assert_close(loaded.model.decoder.position_encoding.table, expected, rtol=0, atol=0)


def test_generation_config_has_paper_defaults_and_sizes_length_from_source(
    tmp_path, source_batch, tiny_model
):
    model = tiny_model()
    model.save_pretrained(tmp_path)
    stored = json.loads((tmp_path / "generation_config.json").read_text())
    assert stored["num_beams"] == 4 and stored["length_penalty"] == 0.6
    assert stored["max_new_tokens_over_source"] == 50 and stored["bad_words_ids"] == [[PAD]]
    loaded = AutoModelForSeq2SeqLM.from_pretrained(tmp_path).eval()
    src, mask = source_batch(length=7)
    generated = loaded.generate(
        src, attention_mask=mask, num_beams=1, eos_token_id=-1, forced_eos_token_id=None
    )
    assert generated.shape[1] == 1 + 7 + 50  # start token + source length + 50
    assert (generated[:, 1:] != PAD).all()  # pad is banned


def test_output_attentions_returns_every_layer_and_site(source_batch, target_batch, tiny_model):
    model = tiny_model()
    src, mask = source_batch()
    tgt = target_batch()
    out = model(input_ids=src, attention_mask=mask, decoder_input_ids=tgt, output_attentions=True)
    assert len(out.encoder_attentions) == len(out.decoder_attentions) == len(out.cross_attentions) == 2
    assert out.encoder_attentions[0].shape == (3, 4, src.shape[1], src.shape[1])
    assert out.cross_attentions[0].shape == (3, 4, tgt.shape[1], src.shape[1])
    torch.testing.assert_close(out.decoder_attentions[1].sum(-1), torch.ones(3, 4, tgt.shape[1]))
    assert out.decoder_attentions[0][..., 0, 1:].abs().max() == 0  # causal


def test_loss_is_the_token_sum_divided_by_num_items_in_batch(source_batch, target_batch, tiny_model):
    model = tiny_model()
    src, mask = source_batch()
    labels = target_batch()[:, 1:].clone()
    labels[0, -2:] = -100
    mean_loss = model(input_ids=src, attention_mask=mask, labels=labels).loss
    tokens = int((labels != -100).sum())
    scaled = model(
        input_ids=src, attention_mask=mask, labels=labels, num_items_in_batch=torch.tensor(4 * tokens)
    ).loss
    torch.testing.assert_close(scaled, mean_loss / 4)


def test_encoder_positions_ignore_left_padding(tiny_model):
    """A token's position counts from its own sequence's start, whichever side the batch is padded on."""
    model = tiny_model(position_encoding="learned")
    src = torch.randint(2, VOCAB, (1, 6))
    left_padded = torch.cat([torch.full((1, 3), PAD), src], dim=1)
    left_mask = torch.cat([torch.zeros(1, 3, dtype=torch.long), torch.ones(1, 6, dtype=torch.long)], dim=1)
    with torch.no_grad():
        alone = model.get_encoder()(input_ids=src).last_hidden_state
        padded = model.get_encoder()(input_ids=left_padded, attention_mask=left_mask).last_hidden_state
    torch.testing.assert_close(padded[:, 3:], alone, atol=1e-5, rtol=1e-4)


NO_POSITION_READS = [{"position_encoding": name} for name in POSITION_ENCODINGS] + [
    {"decoder_self_attention": name}
    for name, mixer in TOKEN_MIXERS.items()
    if DECODER_SELF_ATTENTION in mixer.allowed_sites
]


@pytest.mark.parametrize("overrides", NO_POSITION_READS, ids=lambda overrides: "-".join(overrides.values()))
@pytest.mark.parametrize("precomputed", [False, True], ids=["computed", "folded"])
def test_decoding_steps_read_no_positions_back_from_the_device(
    overrides, precomputed, monkeypatch, source_batch, tiny_model
):
    """Positions reach the modules with host-side spans (the decoder knows them from the cache length), so a
    decoding step of any module never reads tensor values back into Python; on a GPU each read would be a
    device sync per step. The encoder runs before the check (it reads its padded positions' span once). The
    token-id checks read ids only on the CPU, where a read costs nothing (tests/model/test_model_checks.py checks
    that they read nothing on other devices), and are left out here."""
    model = tiny_model(**overrides)
    if precomputed:
        model.precompute_position_attention()
    src, mask = source_batch()
    with torch.no_grad():
        encoder_outputs = model.get_encoder()(input_ids=src, attention_mask=mask)
        reads = record_host_reads_from(Path(hf_posenc.__file__).parent, monkeypatch)
        tokens, cache = torch.zeros(src.shape[0], 1, dtype=torch.long), None
        for _ in range(4):
            out = model(
                encoder_outputs=encoder_outputs,
                attention_mask=mask,
                decoder_input_ids=tokens[:, -1:],
                past_key_values=cache,
                use_cache=True,
            )
            cache = out.past_key_values
            tokens = torch.cat([tokens, out.logits[:, -1].argmax(-1, keepdim=True)], dim=1)
    assert [read for read in reads if not read.endswith(" in check_token_ids")] == []
