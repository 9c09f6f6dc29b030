"""Reference checks of the relative family (posenc_relative.py) against slow, loop-based equations.

Each scheme's attention is recomputed entry by entry from its paper's equation on a tiny input and must
match the vectorised module, including clipping/bucketing, padding and the decoder's cached positions.
"""

import copy
import math

import pytest
import torch
from transformers.models.t5.modeling_t5 import T5Attention

from hf_posenc import PositionContext
from hf_posenc.posenc_relative import alibi_slopes, t5_relative_bucket

HEADS = 4


def self_attention(model, stack: str, layer: int = 0):
    layers = model.model.encoder.layers if stack == "encoder" else model.model.decoder.layers
    return layers[layer].self_attn


def encoder_context(model, lengths: list[int], total: int) -> tuple[PositionContext, torch.Tensor]:
    """Right-padded encoder context and its SDPA-style boolean mask (B, 1, L, L)."""
    keep = torch.arange(total)[None] < torch.tensor(lengths)[:, None]  # (B, L)
    positions = (keep.long().cumsum(-1) - 1).clamp(min=0)
    mask = keep[:, None, None, :].expand(-1, 1, total, -1)
    return PositionContext(model.model.encoder.position_encoding, positions, positions), mask


def decoder_context(model, past: int, new: int) -> PositionContext:
    """Decoder self-attention context after `past` cached tokens: queries past..past+new-1, keys 0..past+new-1."""
    keys = torch.arange(past + new)[None]
    return PositionContext(model.model.decoder.position_encoding, keys[:, past:], keys)


def loop_attention(query, key, value, scaling, score_term, value_term, allowed):
    """softmax_j(q_i.k_j * scaling + score_term(b, h, i, j)) and sum_j alpha_ij (v_j + value_term(i, j)).

    query (B, H, q, Dh), key/value (B, H, k, Dh); `allowed(b, i, j)` says whether query i may see key j.
    Returns the output (B, q, H, Dh) one entry at a time.
    """
    batch, heads, queries, _ = query.shape
    keys = key.shape[2]
    output = torch.zeros(batch, queries, heads, query.shape[-1], dtype=torch.float64)
    for b in range(batch):
        for h in range(heads):
            for i in range(queries):
                visible = [j for j in range(keys) if allowed(b, i, j)]
                scores = torch.tensor(
                    [
                        float(query[b, h, i] @ key[b, h, j]) * scaling + score_term(b, h, i, j)
                        for j in visible
                    ],
                    dtype=torch.float64,
                )
                weights = torch.softmax(scores, dim=0)
                for weight, j in zip(weights, visible, strict=True):
                    output[b, i, h] += weight * (value[b, h, j].double() + value_term(i, j))
    return output


def projections(attention, hidden):
    shape = (*hidden.shape[:-1], HEADS, -1)
    query = attention.q_proj(hidden).view(shape).transpose(1, 2)  # (B, H, L, Dh)
    key = attention.k_proj(hidden).view(shape).transpose(1, 2)
    value = attention.v_proj(hidden).view(shape).transpose(1, 2)
    return query, key, value


def run_attention(attention, hidden, mask, context, reference_score_term, reference_value_term=None):
    """The module's output (before out_proj is undone) and the loop reference, both (B, q, D)."""
    with torch.no_grad():
        actual, _ = attention(hidden, attention_mask=mask, context=context)
        query, key, value = projections(attention, hidden)
        query, key = context.encoding.rotate_queries_keys(attention.layer_idx, query, key, context)

        def allowed(b, i, j):
            if mask is not None and not mask[b, 0, i, j]:
                return False
            query_position = int(context.query_positions[0, i])
            return not attention.is_causal or int(context.key_positions[0, j]) <= query_position

        def no_value_term(i, j):
            return 0.0

        expected = loop_attention(
            query,
            key,
            value,
            attention.scaling,
            reference_score_term,
            reference_value_term or no_value_term,
            allowed,
        )
        expected = attention.out_proj(expected.flatten(2).float())
    return actual, expected


@pytest.mark.parametrize("stack", ["encoder", "decoder"])
def test_shaw_attention_equals_the_loop_over_eq_3_to_5_with_clipping(stack, tiny_model):
    """Shaw Eq. 3-5 (a^K in the scores, a^V in the values, clip(j - i, -k, k)) without the (q, k, d) tensor."""
    model = tiny_model(position_encoding="shaw", max_relative_position=2)
    encoding = getattr(model.model, stack).position_encoding
    layer = 1
    attention = self_attention(model, stack, layer)
    with torch.no_grad():
        encoding.key_tables.normal_()  # large relative terms, so a wrong index cannot hide
        encoding.value_tables.normal_()
    hidden = torch.randn(2, 7, 32)
    if stack == "encoder":
        context, mask = encoder_context(model, [7, 4], 7)
    else:
        context, mask = decoder_context(model, 0, 7), None

    def clipped(i, j):
        return min(max(int(context.key_positions[0, j] - context.query_positions[0, i]), -2), 2) + 2

    query, _, _ = projections(attention, hidden)

    def key_term(b, h, i, j):
        return float(query[b, h, i] @ encoding.key_tables[layer, clipped(i, j)]) * attention.scaling

    def value_term(i, j):
        return encoding.value_tables[layer, clipped(i, j)].double()

    actual, expected = run_attention(attention, hidden, mask, context, key_term, value_term)
    valid = slice(None) if mask is None else torch.tensor([[True] * 7, [True] * 4 + [False] * 3])
    torch.testing.assert_close(actual[valid], expected[valid], atol=1e-5, rtol=1e-4)


def test_shaw_returns_the_attention_weights_it_used(source_batch, target_batch, tiny_model):
    """output_attentions works for Shaw's own kernel: padded and future keys get zero weight."""
    model = tiny_model(position_encoding="shaw")
    src, mask = source_batch()
    out = model(input_ids=src, attention_mask=mask, decoder_input_ids=target_batch(), output_attentions=True)
    assert (out.encoder_attentions[0][1, :, :, int(mask[1].sum()) :] == 0).all()
    assert (out.decoder_attentions[0][0, :, 0, 1:] == 0).all()


@pytest.mark.parametrize("bidirectional", [True, False])
@pytest.mark.parametrize("num_buckets, max_distance", [(32, 128), (8, 8), (16, 40)])
def test_t5_buckets_match_transformers_t5(bidirectional, num_buckets, max_distance):
    """Our bucket function is T5's for every distance in [-300, 300] (exact, log and saturated regions)."""
    relative = torch.arange(-300, 301)
    expected = T5Attention._relative_position_bucket(relative, bidirectional, num_buckets, max_distance)
    torch.testing.assert_close(
        t5_relative_bucket(relative, bidirectional, num_buckets, max_distance), expected
    )


@pytest.mark.parametrize("stack, past", [("encoder", 0), ("decoder", 0), ("decoder", 3)])
def test_t5_bias_is_the_stack_table_at_transformers_buckets(stack, past, tiny_model):
    """bias_h(i, j) = b_h[bucket(j - i)] from the stack's one table, the same in every layer, cached or not."""
    model = tiny_model(position_encoding="t5_bias", t5_bias_num_buckets=8, t5_bias_max_distance=8)
    encoding = getattr(model.model, stack).position_encoding
    table = encoding.table  # (buckets, H)
    if stack == "encoder":
        context, _ = encoder_context(model, [9, 5], 9)
    else:  # queries past..8 over keys 0..8: the rows a cached decoding step sees
        context = decoder_context(model, past, 9 - past)
    with torch.no_grad():
        biases = [encoding.score_bias(layer, context) for layer in (0, 1)]
    torch.testing.assert_close(biases[0], biases[1])
    for b in range(context.query_positions.shape[0]):
        for i, query_position in enumerate(context.query_positions[b].tolist()):
            for j, key_position in enumerate(context.key_positions[b].tolist()):
                relative = torch.tensor(key_position - query_position)
                bucket = T5Attention._relative_position_bucket(relative, stack == "encoder", 8, 8)
                torch.testing.assert_close(biases[0][b, :, i, j], table[bucket].detach())


@pytest.mark.parametrize("use_reentrant", [False, True])
@pytest.mark.parametrize("encoding_name", ["t5_bias", "adaptive_t5"])
def test_bias_gradients_are_the_same_under_activation_checkpointing(
    encoding_name, use_reentrant, source_batch, target_batch, tiny_model
):
    """The bias made once by the stack is an input of the checkpointed layers: its table gets the same
    gradient with checkpointing (either kind) as without."""
    src, mask = source_batch()
    gradients = []
    for checkpointing in (False, True):
        model = tiny_model(position_encoding=encoding_name, dropout=0.0, attention_dropout=0.0).train()
        if checkpointing:
            model.activation_checkpointing_enable({"use_reentrant": use_reentrant})
        model(input_ids=src, attention_mask=mask, labels=target_batch()).loss.backward()
        gradients.append(
            {name: p.grad for name, p in model.named_parameters() if "position_encoding" in name}
        )
    assert gradients[0] and all(gradient is not None for gradient in gradients[1].values())
    for name, gradient in gradients[0].items():
        torch.testing.assert_close(gradients[1][name], gradient, msg=name)


def test_t5_bias_attention_equals_the_loop_with_padding(tiny_model):
    """The bias folded into SDPA's mask gives softmax(q.k / sqrt(d) + b_h[bucket(j - i)]) over real keys."""
    model = tiny_model(position_encoding="t5_bias", t5_bias_num_buckets=8, t5_bias_max_distance=8)
    table = model.model.encoder.position_encoding.table
    context, mask = encoder_context(model, [9, 5], 9)

    def bias(b, h, i, j):
        bucket = T5Attention._relative_position_bucket(torch.tensor(j - i), True, 8, 8)
        return float(table[bucket, h])

    actual, expected = run_attention(
        self_attention(model, "encoder", 1), torch.randn(2, 9, 32), mask, context, bias
    )
    torch.testing.assert_close(actual[0], expected[0], atol=1e-5, rtol=1e-4)
    torch.testing.assert_close(actual[1, :5], expected[1, :5], atol=1e-5, rtol=1e-4)


def test_adaptive_t5_bias_equals_the_per_head_mlp_loop(tiny_model):
    """Wu et al. 2021: soft bucket f per direction, sigmoid MLP per head and direction."""
    model = tiny_model(position_encoding="adaptive_t5")
    for stack in ("encoder", "decoder"):
        encoding = getattr(model.model, stack).position_encoding
        context = decoder_context(model, 0, 6) if stack == "decoder" else encoder_context(model, [6], 6)[0]
        with torch.no_grad():
            bias = encoding.score_bias(0, context)[0]  # (H, q, k)
        for h in range(HEADS):
            for i in range(6):
                for j in range(6):
                    r = j - i
                    if stack == "decoder" and r > 0:
                        continue  # causal: future keys are masked, no direction of their own
                    direction = 1 if r > 0 else 0
                    rate = max(float(encoding.decay[0, direction, h].detach()), 0.0) / encoding.max_length
                    f = 1 - math.exp(-rate * r) if r > 0 else 1 - math.exp(rate * r)
                    hidden = torch.sigmoid(
                        f * encoding.hidden1_weight[0, direction, h] + encoding.hidden1_bias[0, direction, h]
                    )
                    hidden = torch.sigmoid(
                        hidden @ encoding.hidden2_weight[0, direction, h]
                        + encoding.hidden2_bias[0, direction, h]
                    )
                    expected = (
                        hidden @ encoding.output_weight[0, direction, h]
                        + encoding.output_bias[0, direction, h]
                    )
                    torch.testing.assert_close(bias[h, i, j], expected.detach(), atol=1e-6, rtol=1e-5)


def test_adaptive_t5_decoder_step_uses_query_row_t_against_keys_0_to_t(tiny_model):
    """The incremental bias is row t of the full bias (the authors' code slices it to [:1, :1] instead)."""
    model = tiny_model(position_encoding="adaptive_t5")
    encoding = model.model.decoder.position_encoding
    with torch.no_grad():
        full = encoding.score_bias(0, decoder_context(model, 0, 7))  # (1, H, 7, 7)
        for t in range(7):
            step = encoding.score_bias(0, decoder_context(model, t, 1))  # (1, H, 1, t + 1)
            torch.testing.assert_close(step, full[:, :, t : t + 1, : t + 1])


def test_adaptive_t5_is_first_layer_only_unless_every_layer_is_set(tiny_model):
    """Default: the bias exists in layer 0 only; with adaptive_t5_every_layer each layer has its own."""
    context_of = lambda model: decoder_context(model, 0, 5)  # noqa: E731
    first_only = tiny_model(position_encoding="adaptive_t5")
    assert first_only.model.decoder.position_encoding.score_bias(1, context_of(first_only)) is None
    every = tiny_model(position_encoding="adaptive_t5", adaptive_t5_every_layer=True)
    encoding = every.model.decoder.position_encoding
    with torch.no_grad():
        assert not torch.equal(
            encoding.score_bias(0, context_of(every)), encoding.score_bias(1, context_of(every))
        )


DISTANCE_BIASES = {
    "t5_bias": dict(position_encoding="t5_bias"),
    "adaptive_t5-every-layer": dict(position_encoding="adaptive_t5", adaptive_t5_every_layer=True),
}


@pytest.mark.parametrize("overrides", DISTANCE_BIASES.values(), ids=DISTANCE_BIASES.keys())
def test_decoding_reads_a_kept_bias_per_distance_instead_of_recomputing_the_prefix(
    overrides, monkeypatch, source_batch, tiny_model
):
    """Without gradients the bias of every distance up to a power of two is computed once per table (T5: the
    stack's; Adaptive-T5: each biased layer's) and kept, so the decoding steps of `generate` compute no bias per
    distance of their own; a longer context extends the table."""
    model = tiny_model(**overrides)
    encoding = model.model.decoder.position_encoding
    computed = []  # distances each call of the bias per distance covers
    compute = encoding.bias_per_distance

    def recording(*args):
        computed.append(args[-1].numel())
        return compute(*args)

    monkeypatch.setattr(encoding, "bias_per_distance", recording)
    src, mask = source_batch()
    tables = 1 if encoding.score_bias_shared_by_layers else model.config.decoder_layers
    with torch.no_grad():
        model.generate(input_ids=src, attention_mask=mask, max_new_tokens=12, min_new_tokens=12, num_beams=2)
    # each table covers -(L-1)..L-1, built for L = 1, 2, 4, 8, 16 as the prefix grows to 13 tokens: five builds
    # per table over the whole generation (beam search included), none per step
    assert sorted(computed) == sorted([1, 3, 7, 15, 31] * tables)


@pytest.mark.parametrize("overrides", DISTANCE_BIASES.values(), ids=DISTANCE_BIASES.keys())
def test_the_kept_bias_per_distance_follows_parameter_changes(overrides, tiny_model):
    """The kept bias equals the bias computed with gradients on, also after the parameters change in place
    (loading) and for a longer context than the kept table covers."""
    model = tiny_model(**overrides)
    encoding = model.model.decoder.position_encoding
    contexts = [decoder_context(model, 5, 1), decoder_context(model, 0, 7), decoder_context(model, 30, 2)]
    for scale in (1.0, 3.0):  # the kept tables of the first pass are stale in the second
        state = {name: scale * value for name, value in encoding.state_dict().items()}
        encoding.load_state_dict(state)  # in place
        reference = copy.deepcopy(encoding)  # computes with gradients on, leaving `encoding`'s tables alone
        with torch.no_grad():
            kept = [encoding.score_bias(0, context) for context in contexts]
        for context, bias in zip(contexts, kept, strict=True):
            torch.testing.assert_close(bias, reference.score_bias(0, context))


def test_adaptive_t5_keeps_no_bias_while_its_dropout_acts(tiny_model):
    """In training the MLP's dropout draws a new mask per forward, with or without gradients."""
    model = tiny_model(position_encoding="adaptive_t5").train()
    encoding = model.model.decoder.position_encoding
    context = decoder_context(model, 4, 1)
    with torch.no_grad():
        assert not torch.equal(encoding.score_bias(0, context), encoding.score_bias(0, context))
    model.eval()
    with torch.no_grad():
        assert torch.equal(encoding.score_bias(0, context), encoding.score_bias(0, context))


def test_alibi_slopes_follow_the_papers_geometric_sequence():
    """8 heads: 1/2 ... 1/256; 6 heads: the slopes of 4 heads, then every other slope of 8 heads."""
    torch.testing.assert_close(alibi_slopes(8), torch.tensor([2.0**-k for k in range(1, 9)]))
    torch.testing.assert_close(
        alibi_slopes(6), torch.tensor([2.0**-2, 2.0**-4, 2.0**-6, 2.0**-8, 2.0**-1, 2.0**-3])
    )


@pytest.mark.parametrize("stack", ["encoder", "decoder"])
def test_alibi_attention_equals_the_loop_with_linear_distance_penalty(stack, tiny_model):
    """Encoder: -m_h |i - j| (symmetric); decoder: -m_h (i - j) on the visible keys."""
    model = tiny_model(position_encoding="alibi")
    slopes = alibi_slopes(HEADS)
    attention = self_attention(model, stack)
    hidden = torch.randn(2, 6, 32)
    if stack == "encoder":
        context, mask = encoder_context(model, [6, 4], 6)
    else:
        context, mask = decoder_context(model, 0, 6), None

    def bias(b, h, i, j):
        return -float(slopes[h]) * abs(i - j)

    actual, expected = run_attention(attention, hidden, mask, context, bias)
    rows = slice(None) if mask is None else 0
    torch.testing.assert_close(actual[rows], expected[rows], atol=1e-5, rtol=1e-4)


def test_rope_rotates_each_feature_pair_by_position_times_frequency(tiny_model):
    """RoFormer Eq. 14-15: pair (x_i, x_{i+d/2}) at position m turns by m * 10000^(-2i/d); q.k then depends
    only on the offset n - m."""
    model = tiny_model(position_encoding="rope")
    encoding = model.model.encoder.position_encoding
    head_dim = 8
    states = torch.randn(1, 1, 5, head_dim)
    positions = torch.tensor([[0, 1, 2, 7, 30]])
    rotated = encoding.rotate(states, positions)
    for row, m in enumerate(positions[0].tolist()):
        for i in range(head_dim // 2):
            angle = m * 10000 ** (-2 * i / head_dim)
            x, y = float(states[0, 0, row, i]), float(states[0, 0, row, i + head_dim // 2])
            expected = (x * math.cos(angle) - y * math.sin(angle), y * math.cos(angle) + x * math.sin(angle))
            actual = (float(rotated[0, 0, row, i]), float(rotated[0, 0, row, i + head_dim // 2]))
            assert actual == pytest.approx(expected, abs=1e-5)
    query, key = torch.randn(2, 1, 1, 1, head_dim)
    shifted = [
        float(encoding.rotate(query, torch.tensor([[m]])) @ encoding.rotate(key, torch.tensor([[m + 3]])).mT)
        for m in (0, 5, 40)
    ]
    assert shifted == pytest.approx([shifted[0]] * 3, abs=1e-4)


@pytest.mark.parametrize("name", ["shaw", "t5_bias", "adaptive_t5", "alibi", "rope"])
def test_output_attentions_returns_weights_and_leaves_the_logits_unchanged(
    name, source_batch, target_batch, tiny_model
):
    """output_attentions (eager weights, or Shaw's own) gives distributions and the same logits as SDPA."""
    model = tiny_model(position_encoding=name)
    src, mask = source_batch()
    tgt = target_batch()
    with torch.no_grad():
        fused = model(input_ids=src, attention_mask=mask, decoder_input_ids=tgt).logits
        out = model(input_ids=src, attention_mask=mask, decoder_input_ids=tgt, output_attentions=True)
    torch.testing.assert_close(out.logits, fused, atol=1e-5, rtol=1e-4)
    for weights in (*out.encoder_attentions, *out.decoder_attentions, *out.cross_attentions):
        torch.testing.assert_close(weights.sum(-1), torch.ones(weights.shape[:-1]))


def direct_shaw_attention(query, key, value, key_table, value_table, index, mask, scaling, keep, dropout):
    """Eq. 3-5 literally, with the (B, H, q, k, Dh) tensors a^K_ij, a^V_ij formed: plain autograd reference."""
    relative_keys = key_table[index]  # (B|1, 1, q, k, Dh)
    relative_values = value_table[index]
    scores = (query[:, :, :, None] * (key[:, :, None] + relative_keys)).sum(-1) * scaling  # Eq. 4
    scores = scores.masked_fill(~mask, torch.finfo(scores.dtype).min)
    weights = torch.softmax(scores, dim=-1)
    weights = weights * keep / (1 - dropout)
    return (weights[..., None] * (value[:, :, None] + relative_values)).sum(3), weights  # Eq. 3


@pytest.mark.parametrize("causal", [False, True])
@pytest.mark.parametrize("dropout", [0.0, 0.3])
def test_shaw_recomputing_backward_equals_autograd_through_the_equations(dropout, causal):
    """The hand-written backward of ShawAttentionFunction (weights recomputed, not saved) gives the same
    gradients for queries, keys, values and both tables as autograd through Eq. 3-5, with padding (or
    causality) and attention dropout (the keep-mask is replayed from the same seed)."""
    from hf_posenc.posenc_relative import ClippedDistances, ShawAttentionFunction

    generator = torch.Generator().manual_seed(0)
    batch, heads, length, head_dim, clip = 2, 3, 6, 4, 2

    def leaf(*shape):
        return torch.randn(*shape, generator=generator, dtype=torch.float64, requires_grad=True)

    query, key, value = (leaf(batch, heads, length, head_dim) for _ in range(3))
    key_table, value_table = leaf(2 * clip + 1, head_dim), leaf(2 * clip + 1, head_dim)
    positions = torch.arange(length)
    index = ((positions[None] - positions[:, None]).clamp(-clip, clip) + clip)[None, None]  # (1, 1, q, k)
    mask = (torch.arange(length)[None] < torch.tensor([[6], [4]]))[:, None, None]  # (B, 1, 1, k)
    if causal:
        mask = (positions[None] <= positions[:, None])[None, None]  # (1, 1, q, k)
    inputs = (query, key, value, key_table, value_table)
    upstream = torch.randn(batch, heads, length, head_dim, generator=generator, dtype=torch.float64)

    torch.manual_seed(1)
    distances = ClippedDistances.of_grid(length, length, clip, "cpu", torch.float64, causal)
    torch.testing.assert_close(distances.index, index, atol=0, rtol=0)
    output, weights = ShawAttentionFunction.apply(*inputs, distances, mask, 0.5, dropout)
    actual = torch.autograd.grad(output, inputs, upstream)
    torch.manual_seed(1)
    keep = torch.rand(batch, heads, length, length, dtype=torch.float64) >= dropout  # what forward drew
    expected_output, expected_weights = direct_shaw_attention(*inputs, index, mask, 0.5, keep, dropout)
    expected = torch.autograd.grad(expected_output, inputs, upstream)
    torch.testing.assert_close(output, expected_output)
    torch.testing.assert_close(weights, expected_weights)
    for name, got, want in zip(("query", "key", "value", "w^K", "w^V"), actual, expected, strict=True):
        torch.testing.assert_close(got, want, msg=name)


def test_shaw_in_batch_slices_equals_the_whole_batch(monkeypatch, source_batch, target_batch, tiny_model):
    """Shaw's kernel runs a slice of the batch at a time (cache-sized score maps); slicing changes nothing:
    same logits, weights and gradients as one slice, with padding in the encoder and causality in the decoder."""
    from hf_posenc import posenc_relative

    model = tiny_model(position_encoding="shaw")
    src, mask = source_batch()
    tgt = target_batch()

    def run():
        model.zero_grad()
        out = model(input_ids=src, attention_mask=mask, decoder_input_ids=tgt)
        out.logits.square().sum().backward()
        grads = [p.grad.clone() for p in model.parameters() if p.grad is not None]
        with (
            torch.no_grad()
        ):  # the kernel returns weights without autograd (with it, Shaw takes autograd's path)
            weights = model(input_ids=src, attention_mask=mask, decoder_input_ids=tgt, output_attentions=True)
        return out, weights, grads

    whole_out, whole, whole_grads = run()
    monkeypatch.setattr(posenc_relative, "SHAW_SCORES_PER_SLICE", 1)  # one sequence per slice
    sliced_out, sliced, sliced_grads = run()
    torch.testing.assert_close(sliced_out.logits, whole_out.logits)
    torch.testing.assert_close(sliced.logits, whole.logits)
    for name in ("encoder_attentions", "decoder_attentions"):
        for got, want in zip(getattr(sliced, name), getattr(whole, name), strict=True):
            torch.testing.assert_close(got, want)
    for got, want in zip(sliced_grads, whole_grads, strict=True):
        torch.testing.assert_close(got, want)


@pytest.mark.parametrize("causal", [False, True])
@pytest.mark.parametrize(
    ("queries", "keys", "clip"), [(7, 7, 2), (1, 9, 3), (3, 8, 2), (5, 5, 16), (1, 1, 2)]
)
def test_clipped_distances_of_a_grid_and_their_sums(queries, keys, clip, causal):
    """Shaw's kernel indexes (i, j) by clip(j - i - (k - q)) (queries are the last q keys: the full forward and
    decoding steps), and its per-distance sums (gathered interior distances, masked sums of the clipped
    ends) equal summing the weights of every key into its distance, also for distances no key reaches.
    Causal grids get weights that are 0 after each query, as causal attention's are."""
    from hf_posenc.posenc_relative import ClippedDistances

    distances = ClippedDistances.of_grid(queries, keys, clip, "cpu", torch.float64, causal)
    weights = torch.randn(2, 3, queries, keys, dtype=torch.float64)
    if causal:
        weights = weights.tril(keys - queries)  # key j visible to query i iff j <= i + (k - q)
    expected = torch.zeros(2, 3, queries, 2 * clip + 1, dtype=torch.float64)
    for i in range(queries):
        for j in range(keys):
            row = min(max(j - (keys - queries) - i, -clip), clip) + clip
            assert distances.index[0, 0, i, j] == row
            expected[:, :, i, row] += weights[:, :, i, j]
    torch.testing.assert_close(distances.sum_per_distance(weights), expected)


def test_shaw_attention_weights_asked_for_under_autograd_carry_gradients(
    source_batch, target_batch, tiny_model
):
    """An auxiliary loss on the attention weights Shaw returns (`output_attentions`) trains the query and key
    projections and the relative key table w^K: with autograd on, Shaw computes Eq. 3-5 through autograd
    (`shaw_attention_autograd`) instead of its kernel, whose weights are detached; both give the same logits and
    weights."""
    model = tiny_model(position_encoding="shaw")
    src, mask = source_batch()
    inputs = dict(
        input_ids=src, attention_mask=mask, decoder_input_ids=target_batch(), output_attentions=True
    )
    out = model(**inputs)
    attention_loss = sum(
        weights.square().sum() for weights in (*out.encoder_attentions, *out.decoder_attentions)
    )
    attention_loss.backward()
    for stack in (model.model.encoder, model.model.decoder):
        attention = stack.layers[0].self_attn
        for projection in (attention.q_proj, attention.k_proj):
            assert projection.weight.grad is not None and projection.weight.grad.abs().sum() > 0
        assert stack.position_encoding.key_tables.grad.abs().sum() > 0
    with torch.no_grad():
        kernel = model(**inputs)
    torch.testing.assert_close(out.logits, kernel.logits)
    for got, want in zip(
        (*out.encoder_attentions, *out.decoder_attentions),
        (*kernel.encoder_attentions, *kernel.decoder_attentions),
        strict=True,
    ):
        torch.testing.assert_close(got, want)
