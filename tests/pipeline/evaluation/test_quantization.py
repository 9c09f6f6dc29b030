"""int8 decoding in torch (pipeline/evaluation/quantization.py): every linear layer of a model is replaced by an int8
one computing the dequantized product, a trained model translates in int8 as in float32 (greedy and beam 4, through
`translate`, the fast loop and transformers' loop alike), every registered module decodes with it, the float32
model given is left as it was, and bad use is refused naming the bad value."""

import json
import shutil

import pytest
import torch
from torch import nn

from benchmarks.systems import conformance_variants
from hf_posenc.pipeline.evaluation import command, quantization
from hf_posenc.pipeline.evaluation.command import evaluate_main
from hf_posenc.pipeline.evaluation.decoding import load_translation_model, translate
from hf_posenc.pipeline.evaluation.quantization import Int8Linear, is_int8, quantize_int8, quantize_rows
from tests.helpers import EOS, PAD, SOURCES, VOCAB, assert_refused, command_line

VARIANTS = conformance_variants()
MEASURED_PRODUCT_SECONDS = (
    quantization.int8_product_seconds
)  # the probe itself (the fixture below replaces it)


@pytest.fixture(autouse=True)
def int8_faster(monkeypatch):
    """These tests check what int8 decoding computes, on any CPU: the speed check sees int8 products faster."""
    monkeypatch.setattr(quantization, "int8_product_seconds", lambda: (2.0e-3, 1.0e-3))


def test_int8_is_refused_where_it_is_slower_than_float32(tiny_model, monkeypatch):
    monkeypatch.setattr(quantization, "int8_product_seconds", lambda: (2.0e-3, 60.0e-3))
    message = r"slower than float32 on this CPU \(capability \w+\).* 60\.0 ms in int8 .* 2\.00 ms in float32, 30\.0x"
    with pytest.raises(ValueError, match=message + r".*Decode in float32"):
        quantize_int8(tiny_model().eval())


def test_the_speed_probe_times_both_products():
    float32, int8 = MEASURED_PRODUCT_SECONDS.__wrapped__()  # measured now, not the process's cached value
    assert 0 < float32 < 10 and 0 < int8 < 10


def linear_count(model) -> int:
    return sum(isinstance(module, nn.Linear) for module in model.modules())


def int8_count(model) -> int:
    return sum(isinstance(module, Int8Linear) for module in model.modules())


def test_the_layer_computes_the_dequantized_product():
    """y = (q_x s_x)(q_w s_w)ᵀ + b with weights per output channel and inputs per row: exact up to float32
    rounding, and within 2% of the float32 layer."""
    torch.manual_seed(0)
    linear = nn.Linear(48, 24)
    inputs = torch.randn(2, 5, 48) * torch.logspace(-2, 2, 5)[:, None]  # rows of very different ranges
    layer = Int8Linear(linear)
    quantized_inputs, input_scales = quantize_rows(inputs.reshape(-1, 48))
    quantized_weights, weight_scales = quantize_rows(linear.weight.detach())
    expected = (quantized_inputs * input_scales) @ (quantized_weights * weight_scales).T + linear.bias
    with torch.no_grad():
        outputs = layer(inputs)
        reference = linear(inputs)
    torch.testing.assert_close(outputs.reshape(-1, 24), expected.detach())
    torch.testing.assert_close(layer.weight, quantized_weights * weight_scales)
    row_error = (outputs - reference).abs().amax(-1) / reference.abs().amax(-1)  # (2, 5)
    assert row_error.max() < 0.02, row_error
    assert quantized_weights.abs().amax(-1).eq(127).all()  # every channel uses the full int8 range


def test_a_row_of_zeros_gives_the_bias():
    layer = Int8Linear(nn.Linear(8, 3))
    with torch.no_grad():
        torch.testing.assert_close(layer(torch.zeros(2, 8)), layer.bias.expand(2, 3))
        assert layer(torch.zeros(0, 8)).shape == (0, 3)


def test_every_linear_layer_is_replaced_and_the_float32_model_is_left_as_it_was(tiny_model):
    model = tiny_model()
    before = {name: tensor.clone() for name, tensor in model.state_dict().items()}
    linears = linear_count(model)
    quantized = quantize_int8(model)
    assert linears > 0 and int8_count(quantized) == linears and linear_count(quantized) == 0
    assert is_int8(quantized) and not is_int8(model)
    # int8 is not token-identical to float32 in any case: its fast loop lets the beams of an example share its cross-attention keys
    assert (
        quantized.generation_config.shared_cross_attention
        and not model.generation_config.shared_cross_attention
    )
    assert linear_count(model) == linears and all(p.requires_grad for p in model.parameters())
    after = model.state_dict()
    assert before.keys() == after.keys() and all(torch.equal(before[k], after[k]) for k in before)
    assert not any(p.requires_grad for p in quantized.parameters())
    # the embeddings stay float32 and the output projection is quantized from the shared table
    assert quantized.model.shared.weight.dtype == torch.float32
    assert isinstance(quantized.lm_head, Int8Linear)


def test_inplace_changes_the_model_itself(tiny_model):
    model = tiny_model()
    linears = linear_count(model)
    assert quantize_int8(model, inplace=True) is model
    assert int8_count(model) == linears and linear_count(model) == 0


@pytest.fixture(scope="module")
def copier(tiny_model):
    """A tiny RPEHead model (a recurrent position encoding: it reads its projection's weight, not only calls it)
    trained for 200 updates to copy its source, as tests/model/test_fast_decoding.py's (about 15 s on one loaded
    core)."""
    torch.manual_seed(0)
    model = tiny_model(position_encoding="rpe_head", dropout=0.0).train()
    optimizer = torch.optim.Adam(model.parameters(), lr=1e-2)
    generator = torch.Generator().manual_seed(0)
    for _ in range(200):
        ids = torch.nn.utils.rnn.pad_sequence(
            [torch.tensor(row) for row in copy_sources(generator, 16)], batch_first=True, padding_value=PAD
        )
        mask = (ids != PAD).long()
        loss = model(input_ids=ids, attention_mask=mask, labels=ids.masked_fill(ids == PAD, -100)).loss
        optimizer.zero_grad()
        loss.backward()
        optimizer.step()
    return model.eval()


def copy_sources(generator, count: int) -> list[list[int]]:
    """Token-id sources of 3-12 words (ids from 6 up, so that they decode to words) and `</s>`."""
    lengths = torch.randint(3, 13, (count,), generator=generator).tolist()
    return [torch.randint(6, VOCAB, (length,), generator=generator).tolist() + [EOS] for length in lengths]


def copy_accuracy(outputs: list[str], expected: list[str]) -> float:
    """The share of the expected words that the outputs hold at their place."""
    pairs = [(output.split(), words.split()) for output, words in zip(outputs, expected, strict=True)]
    hits = sum(sum(a == b for a, b in zip(output, words, strict=False)) for output, words in pairs)
    return hits / sum(len(words) for _, words in pairs)


@pytest.mark.parametrize("num_beams", [1, 4])
def test_a_trained_model_translates_in_int8_as_in_float32(num_beams, copier, toy_tokenizer):
    """Through `translate` (the fast loop) and transformers' loop: the int8 model copies its sources as the float32
    one does, and both loops write the same tokens with it."""
    sources = copy_sources(torch.Generator().manual_seed(1), 12)
    kwargs = dict(batch_size=5, num_beams=num_beams, max_new_tokens=16, progress_bar=False)
    float32 = translate(copier, toy_tokenizer, sources, **kwargs)
    int8_model = quantize_int8(copier)
    int8 = translate(int8_model, toy_tokenizer, sources, **kwargs)
    expected = toy_tokenizer.batch_decode([source[:-1] for source in sources])
    float32_accuracy, int8_accuracy = copy_accuracy(float32, expected), copy_accuracy(int8, expected)
    # The tiny model's training takes another course on every CPU and thread count: it copies 0.64-0.93 of the
    # words (AMD EPYC AVX512 and AVX2, 1 and 2 threads), and int8 moves its near-ties: 0.04 below float32 at most.
    assert float32_accuracy > 0.6, float32
    assert int8_accuracy > float32_accuracy - 0.06, (int8, float32)
    assert copy_accuracy(int8, float32) > 0.85, (int8, float32, copy_accuracy(int8, float32))
    assert translate(int8_model, toy_tokenizer, sources, fast_decoding=False, **kwargs) == int8


@pytest.mark.parametrize("overrides", [overrides for _, overrides in VARIANTS], ids=[i for i, _ in VARIANTS])
def test_every_registered_module_decodes_in_int8(overrides, tiny_model, source_batch):
    """Beam 4 through the fast loop (its beams sharing the cross-attention keys, as int8 sets it) and through
    transformers' loop, with every linear layer int8 (modules that read a layer's weight read the dequantized one):
    the same tokens (the shared keys' rounding moves none of these models' choices)."""
    model = tiny_model(**overrides)
    quantized = quantize_int8(model)
    assert int8_count(quantized) == linear_count(model) and linear_count(quantized) == 0
    ids, mask = source_batch()
    settings = dict(input_ids=ids, attention_mask=mask, num_beams=4, max_new_tokens=5)
    with torch.no_grad():
        fast = quantized.generate(**settings, fast_decoding=True)
        loop = quantized.generate(**settings)
    assert torch.equal(fast, loop)


def test_load_translation_model_quantizes_when_asked(model_dir, toy_tokenizer):
    model, tokenizer = load_translation_model(model_dir, int8=True)
    assert int8_count(model) > 0 and linear_count(model) == 0
    assert len(translate(model, tokenizer, SOURCES, num_beams=4, max_new_tokens=4, progress_bar=False)) == 5
    plain, _ = load_translation_model(model_dir)
    assert int8_count(plain) == 0
    with pytest.raises(TypeError, match=r"int8='yes' must be True or False"):
        load_translation_model(model_dir, int8="yes")


def test_bad_use_is_refused_by_name(tiny_model, toy_tokenizer):
    model = tiny_model()
    with pytest.raises(ValueError, match=r"model.training=True: int8 layers are for inference only"):
        quantize_int8(tiny_model().train())
    with pytest.raises(ValueError, match=r"weight is torch.bfloat16: .* allowed dtype: torch.float32"):
        quantize_int8(tiny_model().to(torch.bfloat16))
    with pytest.raises(
        ValueError, match=r"weight is on meta: int8 decoding runs on the CPU; allowed device: cpu"
    ):
        quantize_int8(tiny_model().to("meta"))
    with pytest.raises(TypeError, match=r"inplace='no' must be True or False"):
        quantize_int8(model, inplace="no")
    with pytest.raises(TypeError, match=r"takes a torch model \(nn.Module\), got a dict"):
        quantize_int8({})
    quantized = quantize_int8(model)
    with pytest.raises(
        ValueError, match=r"no nn.Linear layer to quantize: its linear layers are int8 already"
    ):
        quantize_int8(quantized)
    with pytest.raises(ValueError, match=r"train\(True\) on an int8 model"):
        quantized.train()
    with pytest.raises(ValueError, match=r"an int8 model computes no gradient"):
        quantized.lm_head(torch.randn(2, 32, requires_grad=True))
    with pytest.raises(ValueError, match=r"bf16=True: the model's linear layers are int8 .* allowed"):
        translate(quantized, toy_tokenizer, ["a dog runs"], bf16=True)


def test_the_evaluate_command_decodes_in_int8(model_dir, texts, tmp_path, monkeypatch):
    folder = tmp_path / "model"  # the command writes evaluation.hyp beside the model
    shutil.copytree(model_dir, folder)
    decoded_int8 = []

    def recording_translate(model, *args, **kwargs):
        decoded_int8.append(is_int8(model))
        return translate(model, *args, **kwargs)

    monkeypatch.setattr(command, "translate", recording_translate)
    test_set = ["--source", str(texts / "test.en"), "--reference", str(texts / "test.de")]
    output = tmp_path / "int8.json"
    report = evaluate_main([str(folder), *test_set, "--int8", "--num_beams", "2", "--output", str(output)])
    saved = json.loads(output.read_text())
    assert decoded_int8 == [True] and report["int8"] is True and saved["int8"] is True
    assert saved["shared_cross_attention"] is True  # int8 turns it on: the record says so
    assert saved["precision"]["precision"] == "fp32" and "int8" in saved["precision"]["reason"]
    assert len((folder / "evaluation.hyp").read_text().splitlines()) == len(SOURCES)
    evaluate_main([str(folder), *test_set, "--precision", "fp32", "--output", str(output)])
    saved = json.loads(output.read_text())
    assert (
        decoded_int8 == [True, False] and saved["int8"] is False and saved["shared_cross_attention"] is False
    )


@pytest.mark.parametrize(
    "flags, words",
    [
        (
            "--int8 --precision bf16",
            ["--int8 with --precision bf16", "allowed with --int8: --precision auto or fp32"],
        ),
        ("--int8 --hypotheses {t}/test.de", ["--int8 set decoding, but --hypotheses scores translations"]),
        ("--int8 --model {e}", ["--int8: {e} is a CTranslate2 export", "--quantization int8"]),
    ],
    ids=["bf16", "hypotheses", "ctranslate2-export"],
)
def test_the_evaluate_command_refuses_int8_where_it_cannot_apply(
    flags, words, model_dir, texts, tmp_path, run_tool
):
    export = tmp_path / "export"
    export.mkdir()
    (export / "model.bin").write_bytes(b"")  # what marks a CTranslate2 folder
    paths = {"t": texts, "e": export}
    test_set = [
        "--source",
        texts / "test.en",
        "--reference",
        texts / "test.de",
        "--output",
        tmp_path / "out.json",
    ]
    code, message = run_tool(evaluate_main, command_line(flags, paths, model_dir, *test_set))
    assert_refused(code, message, [word.format(**paths) for word in words])
    assert not (tmp_path / "out.json").exists()
