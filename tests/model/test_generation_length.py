"""Length control at decode time (generation_length.py): each option does what it says per example, composes with
beam search and the length penalty as documented, decodes the same with and without the cache, is read from the
saved generation config, also by the folder's own code without hf_posenc, and refuses bad values by name."""

import json
import math
import re
import subprocess
import sys
import textwrap

import pytest
import torch
from transformers import AutoModelForSeq2SeqLM, GenerationConfig

from hf_posenc.generation_length import (
    LENGTH_CONTROL_DEFAULTS,
    LOOP_GUARD_NGRAM_SIZE,
    MinLengthRatioLogitsProcessor,
    continuation_token_ids,
    measure_min_length_ratio,
    sentence_boundary_settings,
    sentence_end_positions,
    sentence_end_token_ids,
)
from tests.helpers import EOS, PAD

END_A, END_B = 5, 6  # the sentence-end tokens of these tests
SOURCE_SENTENCE_ENDS = [3, 1, 0]
MIN_LENGTH_RATIO = 1.5


@pytest.fixture
def eager_model(tiny_model):
    """`eager_model()`: a tiny model whose `</s>` is the best token at every step, and `END_A` the second best."""

    def build():
        model = tiny_model()
        with torch.no_grad():
            model.final_logits_bias[0, EOS] = 1.0
            model.final_logits_bias[0, END_A] = 0.7
        return model

    return build


@pytest.fixture
def sources(source_batch):
    """Three right-padded sources (11, 9 and 7 tokens, `</s>` included) holding 3, 1 and 0 sentence ends."""
    ids, mask = source_batch()
    ids[(ids == END_A) | (ids == END_B)] = 7
    ids[0, [1, 3, 5]] = END_A
    ids[1, 2] = END_B
    return ids, mask


def lengths(sequences: torch.Tensor) -> list[int]:
    """Tokens of each hypothesis up to and including its first `</s>` (the start token not counted)."""
    hypotheses = sequences[:, 1:]
    return [int((row == EOS).nonzero()[0]) + 1 if (row == EOS).any() else row.numel() for row in hypotheses]


def source_lengths(mask) -> list[int]:
    return mask.sum(-1).tolist()


@pytest.mark.parametrize("num_beams", [1, 4])
def test_min_length_ratio_holds_for_each_example_of_the_batch(num_beams, eager_model, sources):
    model = eager_model()
    src, mask = sources
    decode = dict(attention_mask=mask, num_beams=num_beams, max_new_tokens=40)
    assert lengths(model.generate(src, **decode)) == [1, 1, 1]
    generated = model.generate(src, min_length_ratio=MIN_LENGTH_RATIO, **decode)
    expected = [math.ceil(MIN_LENGTH_RATIO * n) for n in source_lengths(mask)]
    assert expected == [17, 14, 11]
    assert lengths(generated) == expected  # `</s>` comes as soon as it is allowed, per example


def test_the_eos_ban_changes_the_eos_columns_only_and_keeps_eos_where_nothing_else_is_allowed():
    """`SourceTiedEosBlock` (here through `MinLengthRatioLogitsProcessor`): in the rows still too short `</s>` gets
    -inf unless it is the row's only allowed token; every other score stays as it was, and the input is left as it
    is (greedy search keeps it as the raw logits)."""
    eos_ids = [EOS, 5]
    processor = MinLengthRatioLogitsProcessor(torch.tensor([4, 1]), eos_ids, prompt_length=1)
    scores = torch.randn(4, 9)  # rows 0-1: example 0 (too short), rows 2-3: example 1 (long enough)
    scores[1] = -math.inf
    scores[1, eos_ids] = 0.5  # only </s> is allowed: it stays
    given = scores.clone()
    expected = scores.clone()
    expected[0, eos_ids] = -math.inf
    hypotheses = torch.full((4, 2), 7)  # the start token and one token: with </s> 2 tokens, below 4
    assert torch.equal(processor(hypotheses, scores), expected)
    assert torch.equal(scores, given)


@pytest.mark.parametrize("num_beams", [1, 4])
def test_eos_waits_until_the_hypothesis_holds_as_many_sentence_ends_as_its_source(
    num_beams, eager_model, sources
):
    model = eager_model()
    src, mask = sources
    decode = dict(attention_mask=mask, num_beams=num_beams, max_new_tokens=40)
    assert lengths(model.generate(src, **decode)) == [1, 1, 1]
    generated = model.generate(
        src, match_source_sentence_count=True, sentence_end_token_ids=[END_A, END_B], **decode
    )
    hypotheses = [row[1 : 1 + n] for row, n in zip(generated, lengths(generated), strict=True)]
    counts = [int(torch.isin(row, torch.tensor([END_A, END_B])).sum()) for row in hypotheses]
    assert counts == SOURCE_SENTENCE_ENDS
    assert lengths(generated) == [n + 1 for n in SOURCE_SENTENCE_ENDS]


@pytest.mark.parametrize("num_beams", [1, 4])
def test_a_sentence_end_before_a_continuation_token_is_not_counted(num_beams, eager_model, sources):
    model = eager_model()
    src, mask = sources
    src[src == 9] = 7
    src[0, 4] = 9  # source 0: the end at 3 is followed by a continuation (the `.` of `18.4`): 2 sentence ends
    decode = dict(
        attention_mask=mask, num_beams=num_beams, max_new_tokens=40, match_source_sentence_count=True
    )
    generated = model.generate(
        src, sentence_end_token_ids=[END_A, END_B], continuation_token_ids=[9], **decode
    )
    assert lengths(generated) == [3, 2, 1]
    assert lengths(model.generate(src, sentence_end_token_ids=[END_A, END_B], **decode)) == [4, 2, 1]


def test_sentence_ends_are_end_tokens_not_followed_by_a_continuation():
    ids = torch.tensor([[7, END_A, 9, 7, END_A, 7, END_B], [END_A, END_A, 9, 9, 7, 7, 7]])
    ends = sentence_end_positions(ids, [END_A, END_B], [9])
    assert ends.tolist() == [[0, 0, 0, 0, 1, 0, 1], [1, 0, 0, 0, 0, 0, 0]]
    assert sentence_end_positions(ids, [END_A, END_B]).sum().item() == 5  # without continuations: every end


@pytest.fixture
def reward_model(tiny_model):
    """A tiny model that ends at once in greedy and beam-4 decoding, by a small margin."""
    model = tiny_model()
    with torch.no_grad():
        model.final_logits_bias[0, EOS] = 0.3
    return model


@pytest.mark.parametrize("num_beams", [1, 4])
def test_a_word_reward_lengthens_the_translations(num_beams, reward_model, source_batch):
    model = reward_model
    src, mask = source_batch()
    decode = dict(attention_mask=mask, num_beams=num_beams, max_new_tokens=30)
    assert lengths(model.generate(src, **decode)) == [1, 1, 1]
    assert min(lengths(model.generate(src, word_reward=0.5, **decode))) > 5
    assert lengths(model.generate(src, word_reward=-0.5, **decode)) == [1, 1, 1]


def test_beam_scores_are_the_rewarded_log_probability_sum_over_the_length_penalty(reward_model, source_batch):
    """A finished beam of n tokens, W of them not `</s>`, scores (Σ log p + ρ·W) / n^α."""
    model, reward, alpha = reward_model, 0.2, 0.6
    src, mask = source_batch()
    out = model.generate(
        src,
        attention_mask=mask,
        num_beams=4,
        max_new_tokens=30,
        word_reward=reward,
        length_penalty=alpha,
        forced_eos_token_id=None,
        return_dict_in_generate=True,
        output_scores=True,
    )
    assert min(lengths(out.sequences)) > 1  # the reward changed the search
    with torch.no_grad():
        logits = model(input_ids=src, attention_mask=mask, decoder_input_ids=out.sequences[:, :-1]).logits
    token_log_probs = logits.log_softmax(-1).gather(-1, out.sequences[:, 1:, None])[..., 0]  # (B, T)
    for row, n in enumerate(lengths(out.sequences)):
        words = int((out.sequences[row, 1 : 1 + n] != EOS).sum())
        expected = (token_log_probs[row, :n].sum() + reward * words) / n**alpha
        torch.testing.assert_close(out.sequences_scores[row], expected, atol=1e-4, rtol=1e-4)


def repeats_an_ngram(row: list[int], n: int) -> bool:
    grams = [tuple(row[i : i + n]) for i in range(len(row) - n + 1)]
    return len(grams) != len(set(grams))


@pytest.mark.parametrize("num_beams", [1, 4])
def test_length_control_turns_on_the_no_repeat_ngram_loop_guard(num_beams, eager_model, sources):
    model = eager_model()
    src, mask = sources
    decode = dict(
        attention_mask=mask, num_beams=num_beams, max_new_tokens=40, min_length_ratio=MIN_LENGTH_RATIO
    )
    unguarded = model.generate(src, no_repeat_ngram_size=0, **decode)
    assert any(
        repeats_an_ngram(row[1:n].tolist(), LOOP_GUARD_NGRAM_SIZE)
        for row, n in zip(unguarded, lengths(unguarded), strict=True)
    )
    guarded = model.generate(src, **decode)
    for row, n in zip(guarded, lengths(guarded), strict=True):
        assert not repeats_an_ngram(row[1:n].tolist(), LOOP_GUARD_NGRAM_SIZE)
    assert lengths(guarded) == lengths(unguarded)
    assert torch.equal(
        model.generate(src, attention_mask=mask, num_beams=num_beams, max_new_tokens=40),
        model.generate(
            src, attention_mask=mask, num_beams=num_beams, max_new_tokens=40, no_repeat_ngram_size=None
        ),
    )


ALL_OPTIONS = dict(
    min_length_ratio=1.2,
    word_reward=0.1,
    match_source_sentence_count=True,
    sentence_end_token_ids=[END_A, END_B],
)


@pytest.mark.parametrize("encoding", ["sinusoidal", "rope", "rpe_head", "t5_bias"])
@pytest.mark.parametrize("num_beams", [1, 4])
def test_every_option_decodes_the_same_with_and_without_the_cache(num_beams, encoding, sources, tiny_model):
    model = tiny_model(position_encoding=encoding)
    with torch.no_grad():
        model.final_logits_bias[0, EOS] = 0.3
    src, mask = sources
    runs = [
        model.generate(
            src,
            attention_mask=mask,
            num_beams=num_beams,
            max_new_tokens=20,
            use_cache=use_cache,
            return_dict_in_generate=True,
            output_scores=True,
            **ALL_OPTIONS,
        )
        for use_cache in (True, False)
    ]
    assert torch.equal(runs[0].sequences, runs[1].sequences)
    assert min(lengths(runs[0].sequences)) >= 9  # 1.2 × 7 source tokens, rounded up
    for cached, uncached in zip(runs[0].scores, runs[1].scores, strict=True):
        torch.testing.assert_close(cached, uncached, atol=1e-5, rtol=1e-5)


def test_the_saved_generation_config_turns_the_options_on_and_round_trips(tmp_path, eager_model, sources):
    model = eager_model()
    stored = json.loads(json.dumps(model.generation_config.to_dict()))
    assert {key: stored[key] for key in LENGTH_CONTROL_DEFAULTS} == LENGTH_CONTROL_DEFAULTS  # off by default
    for key, value in ALL_OPTIONS.items():
        setattr(model.generation_config, key, value)
    model.save_pretrained(tmp_path)
    saved = json.loads((tmp_path / "generation_config.json").read_text())
    assert {key: saved[key] for key in ALL_OPTIONS} == ALL_OPTIONS
    assert {
        key: getattr(GenerationConfig.from_pretrained(tmp_path), key) for key in ALL_OPTIONS
    } == ALL_OPTIONS
    loaded = AutoModelForSeq2SeqLM.from_pretrained(tmp_path).eval()
    src, mask = sources
    expected = model.generate(src, attention_mask=mask, max_new_tokens=40)
    assert torch.equal(loaded.generate(src, attention_mask=mask, max_new_tokens=40), expected)
    assert torch.equal(
        eager_model().generate(src, attention_mask=mask, max_new_tokens=40, **ALL_OPTIONS), expected
    )
    assert lengths(expected) != [1, 1, 1]


REMOTE_GENERATE = textwrap.dedent(
    """
    import json, sys
    sys.modules["hf_posenc"] = None  # the package must not be importable: the folder's own code is used
    import torch
    from transformers import AutoModelForSeq2SeqLM
    model = AutoModelForSeq2SeqLM.from_pretrained(sys.argv[1], trust_remote_code=True).eval()
    src, mask = torch.load(sys.argv[1] + "/inputs.pt")
    generated = model.generate(src, attention_mask=mask, max_new_tokens=40)
    print(json.dumps({"module": type(model).__module__, "generated": generated.tolist()}))
    """
)


def test_a_saved_folder_decodes_with_length_control_without_hf_posenc(tmp_path, eager_model, sources):
    model = eager_model()
    for key, value in ALL_OPTIONS.items():
        setattr(model.generation_config, key, value)
    model.save_pretrained(tmp_path)
    assert (tmp_path / "generation_length.py").is_file()  # save_pretrained copied the closure
    src, mask = sources
    torch.save((src, mask), tmp_path / "inputs.pt")
    completed = subprocess.run(
        [sys.executable, "-c", REMOTE_GENERATE, str(tmp_path)],
        capture_output=True,
        text=True,
        cwd=tmp_path,
        timeout=300,
    )
    assert completed.returncode == 0, completed.stderr[-3000:]
    result = json.loads(completed.stdout.strip().splitlines()[-1])
    assert result["module"].startswith("transformers_modules"), result["module"]
    expected = model.generate(src, attention_mask=mask, max_new_tokens=40)
    assert result["generated"] == expected.tolist()
    assert lengths(expected) != [1, 1, 1]


@pytest.mark.parametrize(
    "key, value, allowed",
    [
        ("min_length_ratio", -0.5, "a finite number >= 0"),
        ("min_length_ratio", float("nan"), "finite number"),
        ("min_length_ratio", True, "a finite number >= 0"),
        ("word_reward", float("nan"), "finite number"),
        ("word_reward", float("inf"), "finite number"),
        ("word_reward", "0.5", "a finite number"),
        ("match_source_sentence_count", "yes", "True or False"),
        ("sentence_end_token_ids", [5, 1.5], "a list of token ids in 0..59, without </s> and <pad>"),
        ("sentence_end_token_ids", [5, 60], "a list of token ids in 0..59"),
        ("sentence_end_token_ids", 5, "a list of token ids in 0..59"),
        ("sentence_end_token_ids", [5, EOS], "without </s> and <pad> ([0, 1])"),
    ],
)
def test_bad_values_are_refused_naming_the_key_the_value_and_what_is_allowed(
    key, value, allowed, tiny_model, source_batch
):
    model = tiny_model()
    src, mask = source_batch()
    with pytest.raises(ValueError, match=re.escape(f"{key}={value!r}") + ".*" + re.escape(allowed)):
        model.generate(src, attention_mask=mask, max_new_tokens=3, **{key: value})
    setattr(model.generation_config, key, value)  # the same from the generation config
    with pytest.raises(ValueError, match=key):
        model.generate(src, attention_mask=mask, max_new_tokens=3)


def test_the_sentence_count_needs_sentence_end_ids_and_length_control_needs_token_ids(
    tiny_model, source_batch
):
    model = tiny_model()
    src, mask = source_batch()
    with pytest.raises(ValueError, match="match_source_sentence_count=True needs a non-empty list"):
        model.generate(src, attention_mask=mask, max_new_tokens=3, match_source_sentence_count=True)
    ids_from_the_model = tiny_model(sentence_end_token_ids=[END_A])  # also sentence-aware positions
    ids_from_the_model.generate(src, attention_mask=mask, max_new_tokens=3, match_source_sentence_count=True)
    embeds = model.get_input_embeddings()(src)
    with pytest.raises(ValueError, match="needs the source token ids"):
        model.generate(inputs_embeds=embeds, attention_mask=mask, max_new_tokens=3, word_reward=0.1)


def test_measured_ratio_is_a_low_quantile_of_target_over_source_lengths():
    sources_ = [10] * 20
    targets = list(range(1, 21))  # ratios 0.1 .. 2.0
    assert measure_min_length_ratio(sources_, targets, quantile=0.0) == 0.1
    assert measure_min_length_ratio(sources_, targets, quantile=1.0) == 2.0
    assert measure_min_length_ratio([3], [2]) == 0.666  # rounded down
    with pytest.raises(ValueError, match="as many target lengths"):
        measure_min_length_ratio([1, 2], [1])
    with pytest.raises(ValueError, match="quantile=1.5"):
        measure_min_length_ratio([1], [1], quantile=1.5)


class Vocabulary:
    def __init__(self, tokens, special):
        self.tokens, self.all_special_ids = tokens, special

    def get_vocab(self):
        return {token: token_id for token_id, token in enumerate(self.tokens)}


def test_sentence_end_tokens_are_read_from_the_vocabulary():
    tokens = ["<pad>", "</s>", "<unk>", "▁cat.", ".", "▁Hi!", "?", '."', "▁3.5", "▁Mann", "。", ".)", "▁"]
    found = sentence_end_token_ids(Vocabulary(tokens, special=[PAD, EOS, 2]))
    assert [tokens[i] for i in found] == ["▁cat.", ".", "▁Hi!", "?", '."', "。", ".)"]


def test_continuation_tokens_are_those_without_a_word_start_mark():
    tokens = ["<pad>", "</s>", "<unk>", "▁18", ".", "4", "▁The", "▁U", "S", "ĠHi", ")", "▁"]
    vocabulary = Vocabulary(tokens, special=[PAD, EOS, 2])
    assert [tokens[i] for i in continuation_token_ids(vocabulary)] == [".", "4", "S", ")"]
    settings = sentence_boundary_settings(vocabulary)
    assert settings == {"sentence_end_token_ids": [4], "continuation_token_ids": [4, 5, 8, 10]}
    unmarked = Vocabulary(["<pad>", "</s>", "cat", ".", "4"], special=[PAD, EOS])
    assert continuation_token_ids(unmarked) == []  # nothing says where words start
    assert sentence_boundary_settings(unmarked) == {"sentence_end_token_ids": [3]}
