"""Windowed decoding (generation_length.py, `window_sentences`): the source is cut after its sentence ends into
windows of N sentences, every window is translated as an input of its own, and each example's translations are
joined; token-identical to translating each window alone, for every encoding family, greedy and beam 4, from
the call or the saved generation config; bad values and settings it cannot serve are refused by name."""

import re

import pytest
import torch

from hf_posenc.generation_length import LengthControl, join_windows, sentence_windows
from tests.helpers import EOS, PAD

END = 5  # the sentence-end token of these tests
DIGIT = 9  # a token that carries on the word before it (the `4` of `18.4`) in the continuation tests


@pytest.fixture
def documents(source_batch):
    """Three right-padded sources: 5 sentences, 2 sentences and 1 sentence without a final end token."""
    ids, mask = source_batch(length=16)
    ids[ids == END] = 7
    ids[0, [2, 5, 8, 11, 14]] = END  # 5 sentences ending at 14; </s> at 15
    ids[1, [3, 12]] = END  # 2 sentences; 14 tokens with </s>
    return ids, mask


def windows_of(ids, mask, size, continuations=None):
    control = LengthControl(
        sentence_end_token_ids=(END,), continuation_token_ids=continuations, window_sentences=size
    )
    windows, owners = sentence_windows(ids, mask, control, EOS)
    return [window.tolist() for window in windows], owners


def test_sources_are_cut_after_each_sentence_end_into_windows_of_n_sentences(documents):
    ids, mask = documents
    windows, owners = windows_of(ids, mask, 2)
    row = ids[0].tolist()
    assert windows[:3] == [row[:6] + [EOS], row[6:12] + [EOS], row[12:15] + [EOS]]
    assert windows[3] == ids[1, :13].tolist() + [EOS]  # 2 sentences: one window
    assert windows[4] == ids[2, :11].tolist() + [EOS]  # no sentence end: one window, the whole source
    assert owners == [0, 0, 0, 1, 2]
    singles, owners = windows_of(ids, mask, 1)
    assert len(singles) == 5 + 2 + 1 and owners == [0] * 5 + [1, 1, 2]
    assert [token for window in singles[:5] for token in window[:-1]] == row[:15]  # nothing lost or repeated


def test_a_sentence_end_token_before_a_continuation_token_cuts_nothing(documents):
    ids, mask = documents
    ids[ids == DIGIT] = 7
    ids[0, 6] = DIGIT  # the end at 5 is the `.` of `18.4`: sentences end at 2, 8, 11 and 14
    windows, owners = windows_of(ids, mask, 1, continuations=(DIGIT,))
    row = ids[0].tolist()
    assert windows[:4] == [row[:3] + [EOS], row[3:9] + [EOS], row[9:12] + [EOS], row[12:15] + [EOS]]
    assert owners[:5] == [0, 0, 0, 0, 1]
    without, _ = windows_of(ids, mask, 1)  # every end token cuts, as before continuation ids
    assert without[1] == row[3:6] + [EOS]


def test_joined_windows_keep_each_windows_tokens_in_order():
    outputs = torch.tensor(
        [[PAD, 8, 9, EOS, PAD], [PAD, 10, EOS, PAD, PAD], [PAD, 11, 12, 13, EOS], [PAD, 14, 15, 16, 17]]
    )
    joined = join_windows(outputs, [0, 0, 1, 2], 3, EOS, PAD)
    assert joined.tolist() == [
        [PAD, 8, 9, 10, EOS],
        [PAD, 11, 12, 13, EOS],
        [PAD, 14, 15, 16, 17],  # its window hit the length budget: no </s>, as generate returns it
    ]


def alone(model, window: list[int], **settings) -> list[int]:
    """`window` translated as a batch of its own, without start token, </s> or padding."""
    output = model.generate(torch.tensor([window]), **settings)[0, 1:]
    return [token for token in output.tolist() if token not in (EOS, PAD)]


@pytest.mark.parametrize("encoding", ["sinusoidal", "rope", "rpe_head", "t5_bias", "posnet_attn"])
@pytest.mark.parametrize("num_beams", [1, 4])
def test_windowed_decoding_equals_each_window_translated_alone(num_beams, encoding, documents, tiny_model):
    model = tiny_model(position_encoding=encoding)
    ids, mask = documents
    settings = {"num_beams": num_beams, "max_new_tokens": 6, "sentence_end_token_ids": [END]}
    windowed = model.generate(ids, attention_mask=mask, window_sentences=2, **settings)
    windows, owners = windows_of(ids, mask, 2)
    for row in range(ids.shape[0]):
        expected = [
            token
            for window, owner in zip(windows, owners, strict=True)
            if owner == row
            for token in alone(model, window, **settings)
        ]
        got = windowed[row, 1:].tolist()
        assert [token for token in got if token not in (EOS, PAD)] == expected
    whole = model.generate(ids[2:], attention_mask=mask[2:], **settings)  # one window: plain decoding
    assert windowed[2, : whole.shape[1]].tolist() == whole[0].tolist()


def test_the_saved_generation_config_turns_windows_on(tmp_path, documents, tiny_model):
    from transformers import AutoModelForSeq2SeqLM

    model = tiny_model()
    ids, mask = documents
    called = model.generate(
        ids, attention_mask=mask, max_new_tokens=6, window_sentences=1, sentence_end_token_ids=[END]
    )
    model.generation_config.window_sentences = 1
    model.generation_config.sentence_end_token_ids = [END]
    model.save_pretrained(tmp_path)
    loaded = AutoModelForSeq2SeqLM.from_pretrained(tmp_path).eval()
    assert loaded.generation_config.window_sentences == 1
    assert torch.equal(loaded.generate(ids, attention_mask=mask, max_new_tokens=6), called)
    plain = loaded.generate(ids, attention_mask=mask, max_new_tokens=6, window_sentences=None)
    assert not torch.equal(plain, called)  # the setting is what made the difference


@pytest.mark.parametrize(
    "settings, words",
    [
        ({"window_sentences": 0}, "window_sentences=0 is not allowed: a whole number >= 1"),
        ({"window_sentences": 2.5}, "window_sentences=2.5 is not allowed: a whole number >= 1"),
        ({"window_sentences": True}, "window_sentences=True is not allowed"),
        (
            {"window_sentences": 2, "sentence_end_token_ids": None},
            "window_sentences=2 needs a non-empty list",
        ),
        (
            {"window_sentences": 2, "continuation_token_ids": [DIGIT, EOS]},
            "continuation_token_ids=[9, 1] is not allowed: a list of token ids in 0..59, without </s> and <pad>",
        ),
        ({"window_sentences": 2, "return_dict_in_generate": True}, "without return_dict_in_generate"),
        (
            {"window_sentences": 2, "num_beams": 2, "num_return_sequences": 2},
            "without num_return_sequences > 1",
        ),
    ],
    ids=[
        "zero",
        "fraction",
        "bool",
        "no-sentence-ends",
        "bad-continuations",
        "dict-output",
        "several-sequences",
    ],
)
def test_bad_window_settings_are_refused_by_name(settings, words, documents, tiny_model):
    model = tiny_model()
    ids, mask = documents
    settings = {"sentence_end_token_ids": [END], **settings}
    with pytest.raises(ValueError, match=re.escape(words)):
        model.generate(ids, attention_mask=mask, max_new_tokens=3, **settings)
