"""The fast decoding loop (fast_decoding.py) on a model that reads its source: a tiny model trained for a few
seconds to copy it, so that every row's translation differs and finished rows leave the loop's batch at
different steps. Token-identical to `generate`, greedy and beam 4, with the length control, the windows and a
caller's processor; what it cannot serve is refused by name; the pipeline's decoding uses it."""

import itertools
import re

import pytest
import torch
from transformers import LogitsProcessor, LogitsProcessorList
from transformers.generation.logits_process import (
    MinLengthLogitsProcessor,
    MinNewTokensLengthLogitsProcessor,
    NoBadWordsLogitsProcessor,
)

from hf_posenc import fast_decoding
from tests.helpers import EOS, PAD, VOCAB, RecordedOps

END = 5  # a sentence-end token of these tests


def copy_batch(generator, batch=16) -> tuple[torch.Tensor, torch.Tensor]:
    """Right-padded sources of 3-12 tokens and `</s>`, with their mask."""
    lengths = torch.randint(3, 13, (batch,), generator=generator)
    ids = torch.full((batch, 13), PAD)
    for row, length in enumerate(lengths.tolist()):
        ids[row, :length] = torch.randint(6, VOCAB, (length,), generator=generator)
        ids[row, length] = EOS
    return ids, (ids != PAD).long()


@pytest.fixture(scope="module")
def copier(tiny_model):
    """A tiny RPEHead model (its decoder carries an RNN state in the cache, which the loop must keep with its rows)
    trained for 200 updates to copy its source (the labels are the source); about 15 s on one loaded core."""
    torch.manual_seed(0)
    model = tiny_model(position_encoding="rpe_head", dropout=0.0).train()
    optimizer = torch.optim.Adam(model.parameters(), lr=1e-2)
    generator = torch.Generator().manual_seed(0)
    for _ in range(200):
        ids, mask = copy_batch(generator)
        loss = model(input_ids=ids, attention_mask=mask, labels=ids.masked_fill(ids == PAD, -100)).loss
        optimizer.zero_grad()
        loss.backward()
        optimizer.step()
    return model.eval()


@pytest.fixture
def sources():
    return copy_batch(torch.Generator().manual_seed(1), batch=12)


@pytest.mark.parametrize("num_beams", [1, 4])
@pytest.mark.parametrize(
    "settings",
    [
        {},
        {"early_stopping": True},
        {"early_stopping": "never"},
        {"min_length_ratio": 1.2, "word_reward": 0.1},
        {"window_sentences": 1, "sentence_end_token_ids": [END]},
        {"min_new_tokens": 9, "bad_words_ids": [[7], [EOS], [9]], "no_repeat_ngram_size": 3},
        {"min_length": 12},
    ],
    ids=["plain", "early-stopping", "never-stop-early", "length-control", "windows", "bans", "min-length"],
)
def test_the_fast_loop_returns_generates_sequences(num_beams, settings, copier, sources):
    ids, mask = sources
    ids = ids.clone()
    ids[::3, 2] = END  # some sources hold two sentences
    kwargs = dict(attention_mask=mask, max_new_tokens=16, num_beams=num_beams, length_penalty=0.6, **settings)
    expected = copier.generate(ids, **kwargs)
    ends = {int((row == EOS).nonzero()[0]) for row in expected if (row == EOS).any()}
    assert len(ends) > 2 and len({tuple(row.tolist()) for row in expected}) > 8  # rows differ and end apart
    assert torch.equal(copier.generate(ids, fast_decoding=True, **kwargs), expected)


@pytest.mark.parametrize("num_beams", [1, 4])
def test_without_a_mask_the_source_is_read_as_generate_reads_it(num_beams, copier, sources):
    """Given no attention mask, transformers 5's `generate` passes none to an encoder-decoder model (it infers one
    from the padding for decoder-only models only): the padding is read as tokens. The loop does the same, so
    that it returns `generate`'s tokens; with the mask both read the sources alone."""
    ids, mask = sources
    kwargs = dict(max_new_tokens=16, num_beams=num_beams)
    unmasked = copier.generate(ids, **kwargs)
    assert not torch.equal(
        unmasked, copier.generate(ids, attention_mask=mask, **kwargs)
    )  # the padding counts
    assert torch.equal(copier.generate(ids, fast_decoding=True, **kwargs), unmasked)


@pytest.mark.parametrize("share", [16, 2], ids=["compact-default", "compact-at-half"])
@pytest.mark.parametrize(
    "settings",
    [
        {},
        {"min_length_ratio": 1.2, "word_reward": 0.1},
        {"window_sentences": 1, "sentence_end_token_ids": [END]},
    ],
    ids=["plain", "length-control", "windows"],
)
def test_shared_cross_attention_keeps_one_copy_per_example_and_the_same_translations(
    settings, share, copier, sources, monkeypatch
):
    """With `shared_cross_attention`, the cross-attention cache holds one row per example (not per beam), also after
    finished examples leave (at every selection), and the trained copier's beams choose the tokens they choose
    with a copy per beam (float rounding apart, which moves no choice of this model)."""
    ids, mask = sources
    ids = ids.clone()
    ids[::3, 2] = END
    kwargs = dict(attention_mask=mask, max_new_tokens=16, num_beams=4, length_penalty=0.6, **settings)
    expected = copier.generate(ids, **kwargs)
    shapes = []
    select = fast_decoding.Decoder.select

    def spy(self, rows):
        select(self, rows)
        shapes.append((len(rows), self.cache.cross_attention_cache.layers[0].keys.shape[0]))

    monkeypatch.setattr(fast_decoding.Decoder, "select", spy)
    monkeypatch.setattr(fast_decoding, "COMPACT_SHARE", share)
    assert torch.equal(
        copier.generate(ids, fast_decoding=True, shared_cross_attention=True, **kwargs), expected
    )
    assert shapes and all(rows == 4 * examples for rows, examples in shapes)


def test_shared_cross_attention_needs_the_fast_loop(copier, sources):
    ids, mask = sources
    with pytest.raises(
        ValueError, match="shared_cross_attention=True is a setting of the fast loop.*fast_decoding=True"
    ):
        copier.generate(ids, attention_mask=mask, max_new_tokens=3, num_beams=4, shared_cross_attention=True)


@pytest.mark.parametrize("length", [3, 4, 5, 6, 9])
def test_the_token_bans_compute_what_transformers_processors_compute(length):
    """`BanTokens` against transformers' NoBadWords (single tokens, the end token among them dropped), MinLength
    and MinNewTokensLength processors, on scores that hold -inf and ties already."""
    scores = torch.randn(6, VOCAB, generator=torch.Generator().manual_seed(length))
    scores[0, 3], scores[1, :4] = -float("inf"), 0.5
    rows = torch.zeros(6, length, dtype=torch.long)
    pairs = [
        (NoBadWordsLogitsProcessor([[7], [EOS], [9]], EOS), [7, 9], None),
        (MinLengthLogitsProcessor(4, EOS), [EOS], 4),
        (MinNewTokensLengthLogitsProcessor(1, 5, EOS), [EOS], 6),
    ]
    for theirs, tokens, until in pairs:
        expected = theirs(rows, scores.clone())
        assert torch.equal(fast_decoding.BanTokens(tokens, until, "cpu")(rows, scores.clone()), expected)


class BanToken(LogitsProcessor):
    """A caller's processor: bans one token (it may hold state per row, so the fast loop keeps its batch whole)."""

    def __call__(self, input_ids, scores):
        return scores.index_fill(-1, torch.tensor([7]), -float("inf"))


@pytest.mark.parametrize("num_beams", [1, 4])
def test_a_callers_processor_is_applied_and_the_batch_stays_whole(num_beams, copier, sources, monkeypatch):
    ids, mask = sources
    kwargs = dict(attention_mask=mask, max_new_tokens=16, num_beams=num_beams)
    processors = LogitsProcessorList([BanToken()])
    expected = copier.generate(ids, logits_processor=processors, **kwargs)
    selections = []
    monkeypatch.setattr(fast_decoding.Decoder, "select", lambda self, rows: selections.append(rows))
    fast = copier.generate(ids, logits_processor=processors, fast_decoding=True, **kwargs)
    assert torch.equal(fast, expected) and not (fast == 7).any() and selections == []


def test_finished_examples_leave_the_batch(copier, sources, monkeypatch):
    selected = []
    select = fast_decoding.Decoder.select

    def spy(self, rows):
        selected.append(len(rows))
        select(self, rows)

    monkeypatch.setattr(fast_decoding.Decoder, "select", spy)
    ids, mask = sources
    copier.generate(ids, attention_mask=mask, max_new_tokens=16, num_beams=4, fast_decoding=True)
    assert selected and selected == sorted(selected, reverse=True) and selected[-1] < 4 * len(ids)


def test_a_selection_copies_whole_rows_of_every_cache_with_index_select(copier, sources, monkeypatch):
    """The rows an example's end leaves are dropped from every cache (self- and cross-attention, the RNN state),
    the encoder output and the mask with `index_select`, never with advanced indexing (`aten.index`: 3.5x as long
    for a (256, 4, 32, 64) cache)."""
    recorder = RecordedOps()
    select = fast_decoding.Decoder.select

    def recorded(self, rows):
        with recorder:
            select(self, rows)

    monkeypatch.setattr(fast_decoding.Decoder, "select", recorded)
    ids, mask = sources
    copier.generate(ids, attention_mask=mask, max_new_tokens=16, num_beams=4, fast_decoding=True)
    assert torch.ops.aten.index_select.default in recorder.ops
    assert torch.ops.aten.index.Tensor not in recorder.ops


@pytest.mark.parametrize("num_beams", [1, 4])
def test_finished_rows_wait_for_their_share_of_the_batch(num_beams, copier, sources, monkeypatch):
    """With COMPACT_SHARE 2, a selection happens once half the rows (examples) have finished: each keeps at most
    half of the rows before it, and the tokens stay `generate`'s."""
    ids, mask = sources
    kwargs = dict(attention_mask=mask, max_new_tokens=16, num_beams=num_beams)
    expected = copier.generate(ids, **kwargs)
    sizes = [num_beams * len(ids)]
    select = fast_decoding.Decoder.select

    def spy(self, rows):
        sizes.append(len(rows))
        select(self, rows)

    monkeypatch.setattr(fast_decoding.Decoder, "select", spy)
    monkeypatch.setattr(fast_decoding, "COMPACT_SHARE", 2)
    assert torch.equal(copier.generate(ids, fast_decoding=True, **kwargs), expected)
    assert len(sizes) > 1 and all(2 * after <= before for before, after in itertools.pairwise(sizes))


def test_the_first_beam_step_runs_once_per_example(copier, sources):
    """Every beam of an example holds the start token at the first step: the decoder runs it on one row per
    example, then on every beam."""
    rows = []
    hook = copier.register_forward_pre_hook(
        lambda module, args, kwargs: rows.append(len(kwargs["decoder_input_ids"])), with_kwargs=True
    )
    ids, mask = sources
    try:
        copier.generate(ids, attention_mask=mask, max_new_tokens=4, num_beams=4, fast_decoding=True)
    finally:
        hook.remove()
    assert rows[:2] == [len(ids), 4 * len(ids)]


def test_the_saved_switch_turns_it_on(copier, sources, monkeypatch):
    calls = []
    monkeypatch.setattr(
        fast_decoding, "beam_search", lambda *args: calls.append(args) or torch.zeros(1, 1, dtype=torch.long)
    )
    ids, mask = sources
    copier.generation_config.fast_decoding = True
    try:
        copier.generate(ids, attention_mask=mask, max_new_tokens=4, num_beams=4)
    finally:
        copier.generation_config.fast_decoding = False
    assert len(calls) == 1


@pytest.mark.parametrize(
    "settings, words",
    [
        ({"do_sample": True}, "do_sample=True"),
        ({"num_beams": 4, "num_return_sequences": 2}, "num_return_sequences=2"),
        ({"return_dict_in_generate": True, "output_scores": True}, "output_scores=True"),
        ({"repetition_penalty": 1.3}, "repetition_penalty=1.3"),
        ({"bad_words_ids": [[7, 8]]}, "bad_words_ids=[[7, 8]] (only single tokens)"),
        ({"eos_token_id": [1, 2]}, "eos_token_id=[1, 2] (one end token)"),
        ({"shared_cross_attention": "yes"}, "shared_cross_attention='yes' (True or False)"),
        ({"shared_cross_attention": 0}, "shared_cross_attention=0 (True or False)"),
    ],
    ids=[
        "sampling",
        "several-sequences",
        "scores",
        "repetition-penalty",
        "bad-word-pairs",
        "two-ends",
        "shared",
        "shared-zero",
    ],
)
def test_what_it_cannot_serve_is_refused_by_name(settings, words, tiny_model, source_batch):
    ids, mask = source_batch()
    with pytest.raises(ValueError, match=re.escape(words) + ".*leave fast_decoding off"):
        tiny_model().generate(ids, attention_mask=mask, max_new_tokens=3, fast_decoding=True, **settings)
