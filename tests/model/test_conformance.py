"""The conformance suite every positional module passes.

Variants come from the registries (`benchmarks.systems.conformance_variants`): every position
encoding in both stacks, every token mixer at every site it allows, and every option set a module class lists
in its `variants`. A new registry name or variant is tested without touching this file.
"""

import json
import subprocess
import sys
import textwrap

import pytest
import torch

import hf_posenc.modeling_marian_posenc
from benchmarks.systems import conformance_variants
from hf_posenc import POSITION_ENCODINGS, TOKEN_MIXERS
from tests.helpers import EOS, PAD, VOCAB, decode_with_cache

VARIANTS = conformance_variants()
VARIANT_IDS = [variant_id for variant_id, _ in VARIANTS]
VARIANT_OVERRIDES = [overrides for _, overrides in VARIANTS]
parametrize_variants = pytest.mark.parametrize("overrides", VARIANT_OVERRIDES, ids=VARIANT_IDS)


@parametrize_variants
def test_forward_shapes(overrides, source_batch, target_batch, tiny_model):
    model = tiny_model(**overrides)
    src, mask = source_batch()
    tgt = target_batch()
    out = model(input_ids=src, attention_mask=mask, decoder_input_ids=tgt, output_hidden_states=True)
    assert out.logits.shape == (3, tgt.shape[1], VOCAB)
    assert out.encoder_last_hidden_state.shape == (3, src.shape[1], 32)
    assert len(out.decoder_hidden_states) == model.config.decoder_layers + 1


@parametrize_variants
def test_loss_backward_gives_finite_gradients_to_every_parameter(
    overrides, source_batch, target_batch, tiny_model
):
    model = tiny_model(**overrides).train()
    src, mask = source_batch()
    labels = target_batch()[:, 1:].clone()
    labels[2, -3:] = -100
    loss = model(input_ids=src, attention_mask=mask, labels=labels).loss
    assert torch.isfinite(loss)
    loss.backward()
    for name, parameter in model.named_parameters():
        if parameter.requires_grad:
            assert parameter.grad is not None, f"{name} receives no gradient"
            assert torch.isfinite(parameter.grad).all(), f"{name} has a non-finite gradient"
            assert parameter.grad.abs().sum() > 0 or "final_logits_bias" in name, (
                f"{name} has an all-zero gradient"
            )


@pytest.mark.parametrize("use_reentrant", [False, True], ids=["checkpoint", "reentrant-checkpoint"])
@parametrize_variants
def test_activation_checkpointing_gives_the_same_loss_and_gradients(
    overrides, use_reentrant, source_batch, target_batch, tiny_model
):
    """`activation_checkpointing_enable` (layers recomputed in backward, transformers' default non-reentrant
    kind and the reentrant one) changes neither the loss nor any gradient; dropout masks are replayed."""
    src, mask = source_batch()
    labels = target_batch()[:, 1:].clone()
    results = []
    for checkpointing in (False, True):
        model = tiny_model(**overrides).train()
        if checkpointing:
            model.activation_checkpointing_enable({"use_reentrant": use_reentrant})
        torch.manual_seed(0)
        loss = model(input_ids=src, attention_mask=mask, labels=labels).loss
        loss.backward()
        results.append((loss, dict(model.named_parameters())))
    (loss, parameters), (checkpointed_loss, checkpointed) = results
    torch.testing.assert_close(checkpointed_loss, loss)
    for name, parameter in parameters.items():
        if parameter.grad is None:
            assert checkpointed[name].grad is None, name
        else:
            # recomputation may sum in another order: tolerance relative to the gradient's scale
            scale = max(float(parameter.grad.abs().max()), 1.0)
            torch.testing.assert_close(
                checkpointed[name].grad, parameter.grad, atol=1e-6 * scale, rtol=1e-4, msg=name
            )


@parametrize_variants
def test_padding_a_row_does_not_change_its_logits(overrides, source_batch, target_batch, tiny_model):
    model = tiny_model(**overrides)
    src, mask = source_batch()
    tgt = target_batch()
    with torch.no_grad():
        batched = model(input_ids=src, attention_mask=mask, decoder_input_ids=tgt).logits
        for row in range(src.shape[0]):
            length = int(mask[row].sum())
            alone = model(input_ids=src[row : row + 1, :length], decoder_input_ids=tgt[row : row + 1]).logits
            torch.testing.assert_close(batched[row : row + 1], alone, atol=1e-5, rtol=1e-4)


@parametrize_variants
def test_incremental_decoding_with_cache_equals_full_forward(
    overrides, source_batch, target_batch, tiny_model
):
    model = tiny_model(**overrides)
    src, mask = source_batch()
    tgt = target_batch()
    with torch.no_grad():
        encoder_outputs = model.get_encoder()(input_ids=src, attention_mask=mask)
        full = model(encoder_outputs=encoder_outputs, attention_mask=mask, decoder_input_ids=tgt).logits

        for prefill in (1, 4):  # one token at a time, and a 4-token prefill followed by single steps
            incremental = decode_with_cache(model, encoder_outputs, mask, tgt, prefill)
            torch.testing.assert_close(incremental, full, atol=1e-4, rtol=1e-4)


@parametrize_variants
def test_greedy_generation_is_identical_with_and_without_cache(overrides, source_batch, tiny_model):
    model = tiny_model(**overrides)
    src, mask = source_batch()
    kwargs = dict(attention_mask=mask, max_new_tokens=12, do_sample=False, num_beams=1)
    cached = model.generate(src, use_cache=True, **kwargs)
    uncached = model.generate(src, use_cache=False, **kwargs)
    assert cached.tolist() == uncached.tolist()


@parametrize_variants
def test_beam_search_scores_are_identical_with_and_without_cache(overrides, source_batch, tiny_model):
    model = tiny_model(**overrides)
    src, mask = source_batch()
    kwargs = dict(
        attention_mask=mask,
        max_new_tokens=8,
        num_beams=4,
        do_sample=False,
        output_scores=True,
        return_dict_in_generate=True,
        length_penalty=0.6,
    )
    cached = model.generate(src, use_cache=True, **kwargs)
    uncached = model.generate(src, use_cache=False, **kwargs)
    assert cached.sequences.tolist() == uncached.sequences.tolist()
    assert len(cached.scores) == len(uncached.scores)
    for step_cached, step_uncached in zip(cached.scores, uncached.scores, strict=True):
        finite = torch.isfinite(step_uncached)
        assert torch.equal(finite, torch.isfinite(step_cached))
        torch.testing.assert_close(step_cached[finite], step_uncached[finite], atol=1e-4, rtol=1e-4)


@parametrize_variants
@pytest.mark.parametrize("num_beams", [1, 4])
def test_fast_decoding_returns_generates_sequences(num_beams, overrides, source_batch, tiny_model):
    """The fast loop (fast_decoding.py) against transformers' loop, greedy and beam 4: `</s>` is favoured and held
    back until ⌈1.0 · |x|⌉ tokens (`min_length_ratio`, with its loop guard), so the rows (11, 9 and 7 source tokens)
    finish at different steps and finished examples leave the fast loop's batch."""
    model = tiny_model(**overrides)
    with torch.no_grad():
        model.final_logits_bias[0, EOS] += 3.0
        model.get_input_embeddings().weight.mul_(
            8.0
        )  # each row's tokens, not the shared weights, decide its output
    src, mask = source_batch()
    kwargs = dict(attention_mask=mask, max_new_tokens=14, num_beams=num_beams, length_penalty=0.6)
    kwargs["min_length_ratio"] = 1.0
    expected = model.generate(src, **kwargs)
    assert torch.equal(model.generate(src, fast_decoding=True, **kwargs), expected)


def shared_decoding_logits(model, src, mask, shared: bool) -> tuple[list[torch.Tensor], int]:
    """The fast loop's `Decoder` over 4 beams per example for 4 steps: every beam its own tokens, the beams
    reordered within their example after each step and the first example dropped after the second; the logits of
    each step and the rows of the cross-attention cache."""
    from hf_posenc.fast_decoding import Decoder

    encoder_outputs = model.get_encoder()(input_ids=src, attention_mask=mask, return_dict=True)
    step = Decoder(model, encoder_outputs, mask, num_beams=4, shared=shared)
    generator = torch.Generator().manual_seed(0)
    tokens, examples, logits = torch.full((4 * len(src),), model.config.decoder_start_token_id), len(src), []
    with torch.no_grad():
        for index in range(4):
            logits.append(step(tokens))
            order = torch.stack([torch.randperm(4, generator=generator) for _ in range(examples)])  # (B, 4)
            rows = (order + 4 * torch.arange(examples)[:, None]).view(-1)
            if index == 1:  # the first example leaves, the others' beams reordered in the same selection
                rows, examples = rows[4:], examples - 1
                step.select(rows)
            else:
                step.cache.reorder_cache(rows)
            tokens = torch.randint(2, VOCAB, (4 * examples,), generator=generator)
    return logits, step.cache.cross_attention_cache.layers[0].keys.shape[0]


@parametrize_variants
def test_shared_cross_attention_computes_what_a_copy_per_beam_computes(overrides, source_batch, tiny_model):
    """The fast loop's `shared_cross_attention` (int8 decoding turns it on): an example's beams query one copy of
    its cross-attention keys and values, where every cross-attention mixer supports it (else they keep a copy
    each). Each step's logits equal those with a copy per beam up to float rounding, whatever each beam's own
    tokens add to the cross-attention mask (the sentence bias, windows) or its queries (log-length scaling)."""
    model = tiny_model(**overrides)
    src, mask = source_batch()
    copies, copy_rows = shared_decoding_logits(model, src, mask, shared=False)
    shared, shared_rows = shared_decoding_logits(model, src, mask, shared=True)
    supported = all(
        layer.encoder_attn.supports_shared_cross_attention for layer in model.model.decoder.layers
    )
    assert (copy_rows, shared_rows) == (4 * (len(src) - 1), len(src) - 1 if supported else 4 * (len(src) - 1))
    for step_copies, step_shared in zip(copies, shared, strict=True):
        finite = torch.isfinite(step_copies)
        assert torch.equal(finite, torch.isfinite(step_shared))
        torch.testing.assert_close(step_shared[finite], step_copies[finite], atol=1e-5, rtol=1e-5)


@parametrize_variants
def test_save_then_auto_load_gives_identical_logits(
    overrides, tmp_path, source_batch, target_batch, tiny_model
):
    from transformers import AutoModelForSeq2SeqLM

    model = tiny_model(**overrides)
    src, mask = source_batch()
    tgt = target_batch()
    model.save_pretrained(tmp_path)
    assert (tmp_path / "model.safetensors").exists() and not list(tmp_path.glob("*.bin"))
    loaded = AutoModelForSeq2SeqLM.from_pretrained(tmp_path).eval()
    assert type(loaded) is type(model)
    with torch.no_grad():
        expected = model(input_ids=src, attention_mask=mask, decoder_input_ids=tgt).logits
        actual = loaded(input_ids=src, attention_mask=mask, decoder_input_ids=tgt).logits
    torch.testing.assert_close(actual, expected, atol=0, rtol=0)


REMOTE_CODE_CHECK = textwrap.dedent(
    """
    import json, sys
    sys.modules["hf_posenc"] = None  # the package must not be importable: the folder's own code is used
    import torch
    from transformers import AutoModelForSeq2SeqLM
    torch.set_num_threads(int(sys.argv[2]))  # same kernels as the parent: RNN results depend on the thread count
    results = {}
    for folder in json.loads(sys.argv[1]):
        model = AutoModelForSeq2SeqLM.from_pretrained(folder, trust_remote_code=True).eval()
        src, mask, tgt = torch.load(folder + "/inputs.pt")
        with torch.no_grad():
            logits = model(input_ids=src, attention_mask=mask, decoder_input_ids=tgt).logits
        generated = model.generate(src, attention_mask=mask, num_beams=4, max_new_tokens=8)
        results[folder] = {
            "module": type(model).__module__,
            "max_diff": (logits - torch.load(folder + "/logits.pt")).abs().max().item(),
            "generated": generated.tolist(),
        }
    print(json.dumps(results))
    """
)


@pytest.fixture(scope="module")
def remote_code_results(tmp_path_factory, source_batch, target_batch, tiny_model):
    """Save every variant, then load them all in ONE fresh process where hf_posenc cannot be imported."""
    root = tmp_path_factory.mktemp("remote")
    expected = {}
    for variant_id, overrides in VARIANTS:
        folder = root / variant_id
        model = tiny_model(**overrides)
        model.save_pretrained(folder)
        src, mask = source_batch()
        tgt = target_batch()
        with torch.no_grad():
            torch.save(
                model(input_ids=src, attention_mask=mask, decoder_input_ids=tgt).logits, folder / "logits.pt"
            )
        torch.save((src, mask, tgt), folder / "inputs.pt")
        expected[variant_id] = (
            str(folder),
            model.generate(src, attention_mask=mask, num_beams=4, max_new_tokens=8).tolist(),
        )
    folders = json.dumps([folder for folder, _ in expected.values()])
    completed = subprocess.run(
        [sys.executable, "-c", REMOTE_CODE_CHECK, folders, str(torch.get_num_threads())],
        capture_output=True,
        text=True,
        cwd=root,
        timeout=600,
    )
    assert completed.returncode == 0, completed.stderr[-3000:]
    results = json.loads(completed.stdout.strip().splitlines()[-1])
    return {variant_id: (results[folder], generated) for variant_id, (folder, generated) in expected.items()}


@pytest.mark.parametrize("variant_id", VARIANT_IDS)
def test_trust_remote_code_round_trip_without_the_package(variant_id, remote_code_results):
    result, expected_generation = remote_code_results[variant_id]
    assert result["module"].startswith("transformers_modules"), result["module"]
    assert result["max_diff"] == 0.0
    assert result["generated"] == expected_generation


@parametrize_variants
def test_a_training_step_under_bf16_autocast_is_finite(overrides, source_batch, target_batch, tiny_model):
    """bf16 autocast (the CPU training default where bf16 is faster) mixes bf16 and fp32 tensors inside every
    module: forward and backward run, and the loss and every gradient are finite."""
    model = tiny_model(**overrides).train()
    src, mask = source_batch()
    with torch.autocast("cpu", dtype=torch.bfloat16):
        loss = model(input_ids=src, attention_mask=mask, labels=target_batch()[:, 1:]).loss
    loss.backward()
    assert torch.isfinite(loss)
    for name, parameter in model.named_parameters():
        assert parameter.grad is None or torch.isfinite(parameter.grad).all(), name


@parametrize_variants
def test_bf16_forward_is_finite(overrides, source_batch, target_batch, tiny_model):
    model = tiny_model(**overrides).to(torch.bfloat16)
    src, mask = source_batch()
    with torch.no_grad():
        logits = model(input_ids=src, attention_mask=mask, decoder_input_ids=target_batch()).logits
    assert logits.dtype == torch.bfloat16
    assert torch.isfinite(logits).all()


@parametrize_variants
def test_input_longer_than_a_bounded_table_gives_a_clear_error(overrides, tiny_model):
    model = tiny_model(**overrides)
    too_long = model.config.max_position_embeddings + 5
    src = torch.randint(2, VOCAB, (1, too_long))
    # one sentence: positions that restart at each sentence end (sentence_end_token_ids) would fit the table
    ends = torch.tensor(model.config.sentence_end_token_ids, dtype=torch.long)
    src[torch.isin(src, ends)] = next(i for i in range(2, VOCAB) if i not in ends)
    tgt = torch.full((1, 3), PAD)
    bounded = [
        module
        for module in (model.model.encoder.position_encoding, *model.model.encoder.modules())
        if getattr(module, "max_positions", None) is not None
    ]
    limit = model.config.max_position_embeddings
    if model.config.randomized_positions_inference == "spread":  # Eq. 1 places sources of at most L tokens
        bounded, limit = True, model.config.randomized_positions_max
    if bounded:
        with pytest.raises(ValueError, match=rf"{too_long}.*{limit}"):
            model(input_ids=src, decoder_input_ids=tgt)
    else:  # unbounded modules must then genuinely handle the longer input
        with torch.no_grad():
            logits = model(input_ids=src, decoder_input_ids=tgt).logits
        assert torch.isfinite(logits).all()


def test_variants_use_the_requested_modules(tiny_model):
    model = tiny_model(encoder_position_encoding="learned", decoder_position_encoding="none")
    assert type(model.model.encoder.position_encoding) is POSITION_ENCODINGS["learned"]
    assert type(model.model.decoder.position_encoding) is POSITION_ENCODINGS["none"]


def stack_encodings(overrides: dict) -> set[str]:
    """The position encodings of both stacks a variant builds."""
    shorthand = overrides.get("position_encoding", "sinusoidal")
    return {overrides.get(f"{stack}_position_encoding", shorthand) for stack in ("encoder", "decoder")}


SHARED_BIAS_VARIANTS = [
    (variant_id, overrides)
    for variant_id, overrides in VARIANTS
    if all(POSITION_ENCODINGS[name].score_bias_shared_by_layers for name in stack_encodings(overrides))
]


@pytest.mark.parametrize(
    "overrides", [o for _, o in SHARED_BIAS_VARIANTS], ids=[i for i, _ in SHARED_BIAS_VARIANTS]
)
def test_a_bias_shared_by_layers_is_computed_once_per_stack_forward(
    overrides, monkeypatch, source_batch, target_batch, tiny_model
):
    """Encodings whose score bias is the same in every layer (T5, ALiBi, FIRE, KERPLE) compute it once per stack
    forward, not once per layer, and the model's output is the one of the per-layer path (the stack's merged
    mask unset)."""
    model = tiny_model(**overrides)
    src, mask = source_batch()
    calls = []
    for stack in (model.model.encoder, model.model.decoder):
        encoding = stack.position_encoding
        monkeypatch.setattr(
            encoding,
            "score_bias",
            lambda layer, context, f=encoding.score_bias: calls.append(layer) or f(layer, context),
        )
    with torch.no_grad():
        shared = model(input_ids=src, attention_mask=mask, decoder_input_ids=target_batch()).logits
        assert len(calls) == 2  # one per stack, for 2 + 2 layers
        monkeypatch.setattr(
            hf_posenc.modeling_marian_posenc, "stack_score_mask", lambda *args, **kwargs: None
        )
        per_layer = model(input_ids=src, attention_mask=mask, decoder_input_ids=target_batch()).logits
    assert len(calls) == 2 + 4
    torch.testing.assert_close(shared, per_layer)


@parametrize_variants
def test_no_generic_init_overwrites_a_module_s_own_initialisation(overrides, monkeypatch, tiny_model):
    """Each position encoding and token mixer initialises what it owns in `reset_parameters` (the papers'
    initialisations); building the model must write none of those parameters afterwards. transformers
    initialises children before parents, so a child `nn.Embedding`/`nn.Linear` of a module would be re-drawn
    at `init_std` after the module's own init ran (T5's bias table was, at 0.02 instead of d_model^-1/2)."""
    after_reset = {}

    def recording(own_reset):
        def reset_parameters(self):
            own_reset(self)
            after_reset[id(self)] = {name: p._version for name, p in self.named_parameters()}

        return reset_parameters

    for cls in {*POSITION_ENCODINGS.values(), *TOKEN_MIXERS.values()}:
        if "reset_parameters" in vars(cls):
            monkeypatch.setattr(cls, "reset_parameters", recording(vars(cls)["reset_parameters"]))
    model = tiny_model(**overrides)
    for module in (module for module in model.modules() if id(module) in after_reset):
        for name, parameter in module.named_parameters():
            assert parameter._version == after_reset[id(module)][name], (
                f"{type(module).__name__}.{name} was written after its reset_parameters"
            )
