"""The per-token decoding phase (benchmarks/harness.py): each timed step runs on the model's own cache at the
prefix it names, and timing a step leaves that cache as it was, so that every round measures the same prefix."""

import torch

from benchmarks.harness import (
    MODEL_SIZES,
    build_model,
    decode_step_seconds,
    prefilled_decoder,
    timed_decode_step,
)

FIELDS = {
    **MODEL_SIZES["tiny"],
    "pad_token_id": 0,
    "decoder_start_token_id": 0,
    "eos_token_id": 1,
    "max_position_embeddings": 32,
    "attn_implementation": "eager",
}
SYSTEMS = {
    "marian": None,
    "rpe_head": {"encoder_position_encoding": "rpe_head", "decoder_position_encoding": "rpe_head"},
}


def test_a_prefilled_cache_is_the_models_state_at_the_prefix_and_a_timed_step_leaves_it_unchanged():
    source = torch.randint(2, FIELDS["vocab_size"], (1, 5), generator=torch.Generator().manual_seed(0))
    for name, overrides in SYSTEMS.items():
        model = build_model(FIELDS, overrides, "cpu").eval()
        encoder_outputs, cache = prefilled_decoder(model, source, 6, "cpu", None)
        assert cache.get_seq_length() == 6, name
        keys = cache.self_attention_cache.layers[0].keys.clone()
        assert timed_decode_step(model, encoder_outputs, cache, "cpu", None) > 0
        assert cache.get_seq_length() == 6 and torch.equal(cache.self_attention_cache.layers[0].keys, keys), (
            name
        )

        # the step on the prefilled cache gives the logits of the whole prefix + 1 tokens without a cache
        tokens = torch.randint(2, FIELDS["vocab_size"], (1, 6), generator=torch.Generator().manual_seed(6))
        tokens[0, 0] = model.config.decoder_start_token_id
        token = torch.full((1, 1), 2)
        with torch.inference_mode():
            step = model(encoder_outputs=encoder_outputs, decoder_input_ids=token, past_key_values=cache)
            whole = model(encoder_outputs=encoder_outputs, decoder_input_ids=torch.cat([tokens, token], 1))
        torch.testing.assert_close(step.logits[:, -1], whole.logits[:, -1], rtol=1e-4, atol=1e-5, msg=name)


def test_every_system_and_prefix_is_timed_once_per_round():
    source = torch.randint(2, FIELDS["vocab_size"], (1, 5), generator=torch.Generator().manual_seed(0))
    models = {name: build_model(FIELDS, overrides, "cpu").eval() for name, overrides in SYSTEMS.items()}
    seconds = decode_step_seconds(models, source, [3, 9], rounds=4, device="cpu", autocast_dtype=None)
    assert seconds.keys() == {"marian@3", "marian@9", "rpe_head@3", "rpe_head@9"}
    assert all(len(values) == 4 and min(values) > 0 for values in seconds.values())
