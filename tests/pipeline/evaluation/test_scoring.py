"""Decoding shows its progress without changing its output, takes texts or token ids alike, and a finished
run's garbage output is named as such with its likely causes (hf_posenc/pipeline/evaluation/scoring.py); sacreBLEU
scores a corpus in one place."""

import copy
import io
import logging
import re

import pytest
import torch
from conftest import REPO, tiny_model

from hf_posenc.pipeline.data.tokenization import train_joint_bpe
from hf_posenc.pipeline.evaluation.decoding import translate
from hf_posenc.pipeline.evaluation.scoring import COLLAPSED_ENCODER, degenerate_output, encoder_token_cosine

GOOD_RUN = [f"{n} Männer fahren Fahrrad." for n in range(120)]


def test_a_good_run_is_not_flagged():
    assert degenerate_output(GOOD_RUN, bleu=34.6, position_encoding="sinusoidal", updates=1003) == []


def test_mostly_empty_translations_are_flagged_with_the_likely_causes():
    """The failure this guards against: 23 updates of emulated bf16 in 16 minutes, then exit 0."""
    hypotheses = [""] * 900 + GOOD_RUN[:100]
    reasons = degenerate_output(
        hypotheses, bleu=0.0, position_encoding="sinusoidal", updates=23, warmup_steps=300, precision="bf16"
    )
    assert reasons[:2] == [
        "900 of 1000 translations are empty",
        "BLEU 0.00 is below 1 with position encoding 'sinusoidal'",
    ]
    causes = " | ".join(reasons[2:])
    assert all(reason.startswith("likely cause: ") for reason in reasons[2:])
    assert "23 trained, fewer than the 100" in causes and "--precision" in causes
    assert "23 updates < 300 warm-up steps" in causes and "--learning_rate" in causes
    assert "--test_limit" not in causes  # 1000 test sentences are plenty


def test_empty_translations_are_flagged_even_when_bleu_is_not_reported_low():
    reasons = degenerate_output([""] * 6 + ["Ein Hund."] * 4, bleu=5.0, position_encoding="learned")
    assert reasons[0] == "6 of 10 translations are empty"
    assert any("--test_limit" in reason for reason in reasons)  # 10 test sentences: BLEU says little


def test_a_few_repeated_translations_are_flagged_though_bleu_is_above_1():
    """Seen in a real run: 1000 test sentences, 8 distinct translations (707 the same), BLEU 3.2: a model that
    learned the target language and ignores its source."""
    hypotheses = ["Ein Mann und eine Frau sitzen auf einer Bank."] * 707 + GOOD_RUN[:8] * 36 + GOOD_RUN[:5]
    reasons = degenerate_output(hypotheses, bleu=3.2, position_encoding="sinusoidal", updates=1600)
    assert (
        reasons[0]
        == "only 9 distinct translations of 1000 test sentences: the output hardly depends on the source"
    )
    assert any("ignores the source" in reason and "--seed" in reason for reason in reasons[1:])
    assert degenerate_output(GOOD_RUN[:60] * 2, bleu=20.0, position_encoding="none") == []  # half distinct
    assert (
        degenerate_output(GOOD_RUN[:10] * 5, bleu=20.0, position_encoding="none") == []
    )  # 50 sentences: too few


def test_low_bleu_without_a_position_encoding_is_not_flagged():
    """A bag-of-words model may score below 1 legitimately."""
    assert degenerate_output(GOOD_RUN, bleu=0.4, position_encoding="none") == []
    assert degenerate_output(GOOD_RUN, bleu=0.4, position_encoding="rope") != []


class Terminal(io.StringIO):
    def isatty(self) -> bool:
        return True


SOURCES = ["a dog runs", "a man", "two dogs run on the grass", "a woman reads", "children play"]


@pytest.fixture(scope="module")
def model_and_tokenizer():
    tokenizer = train_joint_bpe(SOURCES * 3, vocab_size=60)
    return tiny_model(max_position_embeddings=64), tokenizer


def test_decoding_progress_is_logged_off_a_terminal_without_changing_the_translations(
    model_and_tokenizer, caplog
):
    model, tokenizer = model_and_tokenizer
    caplog.set_level(logging.INFO, logger="hf_posenc.pipeline.training.progress")
    kwargs = dict(batch_size=2, num_beams=1, max_new_tokens=4)
    logged = translate(
        model, tokenizer, SOURCES, progress_every_seconds=0, progress_stream=io.StringIO(), **kwargs
    )
    lines = [record.getMessage() for record in caplog.records]
    assert [line.split(",")[0] for line in lines] == [
        "decoding: 2/5 sentences",
        "decoding: 4/5 sentences",
        "decoding: 5/5 sentences",
    ]
    terminal = Terminal()
    shown = translate(model, tokenizer, SOURCES, progress_stream=terminal, **kwargs)
    assert "100%|" in terminal.getvalue() and "5/5 sentences" in terminal.getvalue()
    assert logged == shown


def test_bf16_is_blamed_only_when_too_few_updates_ran():
    """bf16 hurts through speed: after plenty of updates, low BLEU has other causes."""
    few = degenerate_output([""] * 200, bleu=0.0, position_encoding="learned", updates=23, precision="bf16")
    many = degenerate_output(
        [""] * 200, bleu=0.0, position_encoding="learned", updates=2000, precision="bf16"
    )
    assert any("bf16" in reason for reason in few) and not any("bf16" in reason for reason in many)


def test_encoder_token_cosine_ignores_padding_and_sees_a_collapsed_encoder(model_and_tokenizer):
    """Seen in a real run (sinusoidal+concat, seed 1): every encoder output of a sentence nearly the same vector
    (0.997 over the test set; the working sinusoidal and none runs 0.09 and 0.13), so the decoder ignored the
    source."""
    model, tokenizer = model_and_tokenizer
    pairs, total = 0, 0.0  # each sentence alone, no padding: its own pairs of distinct tokens
    for sentence in SOURCES:
        n = len(tokenizer(sentence)["input_ids"])
        total += encoder_token_cosine(model, tokenizer, [sentence]) * n * (n - 1)
        pairs += n * (n - 1)
    working = encoder_token_cosine(model, tokenizer, SOURCES)
    assert working == pytest.approx(total / pairs, abs=1e-5) and working < COLLAPSED_ENCODER
    collapsed = copy.deepcopy(model)
    norm = collapsed.get_encoder().layers[-1].final_layer_norm
    torch.nn.init.zeros_(norm.weight), torch.nn.init.ones_(norm.bias)  # every output the same vector
    assert encoder_token_cosine(collapsed, tokenizer, SOURCES) == pytest.approx(1.0)
    with pytest.raises(ValueError, match="two or more tokens"):
        encoder_token_cosine(model, tokenizer, [""])


def test_a_collapsed_encoder_is_named_as_the_cause():
    """Finished comparison runs: 0.997 and 0.914 where the decoder ignored the source, 0.09-0.14 working."""
    reasons = degenerate_output(GOOD_RUN, bleu=3.2, position_encoding="sinusoidal", encoder_cosine=0.99999)
    assert reasons[0].startswith(
        "the encoder gives every token of a sentence nearly the same vector (mean cosine 1.0000"
    )
    assert any("encoder collapsed" in reason and "--warmup_steps" in reason for reason in reasons[1:])
    assert degenerate_output(GOOD_RUN, bleu=5.4, position_encoding="sinusoidal", encoder_cosine=0.914) != []
    assert degenerate_output(GOOD_RUN, bleu=34.6, position_encoding="sinusoidal", encoder_cosine=0.14) == []


def test_texts_and_their_token_ids_translate_alike(model_and_tokenizer):
    """One `translate` for the scripts and the word-order probe (issue #47): token ids made by the tokenizer
    (the probe's permuted sources) decode exactly as the texts they come from."""
    model, tokenizer = model_and_tokenizer
    kwargs = dict(batch_size=2, num_beams=2, max_new_tokens=4)
    ids = [tokenizer(sentence)["input_ids"] for sentence in SOURCES]
    assert translate(model, tokenizer, ids, **kwargs) == translate(model, tokenizer, SOURCES, **kwargs)


def test_bf16_translation_decodes_under_bf16_autocast(model_and_tokenizer, monkeypatch):
    model, tokenizer = model_and_tokenizer
    autocast_seen = []
    generate = model.generate

    def recording_generate(*args, **kwargs):
        autocast_seen.append(
            torch.is_autocast_enabled("cpu") and torch.get_autocast_dtype("cpu") == torch.bfloat16
        )
        return generate(*args, **kwargs)

    monkeypatch.setattr(model, "generate", recording_generate)
    translate(model, tokenizer, SOURCES, batch_size=8, bf16=True, max_new_tokens=2)
    translate(model, tokenizer, SOURCES, batch_size=8, max_new_tokens=2)
    assert autocast_seen == [True, False]


def test_sacrebleu_scores_a_corpus_in_one_place():
    """Issue #47: BLEU and chrF come from `evaluation.corpus_score` alone (through `score_translations` or
    `ngram_sweep`); no other module of the package or the scripts scores a corpus (the study's bootstrap sums
    sentence statistics, checked against `corpus_score` in test_verdicts), and the unused `evaluate` metric of
    train_scripts/metrics/ is gone."""
    scoring = re.compile(r"\bcorpus_bleu\(|\bcorpus_chrf\(|\.corpus_score\(")
    sources = [*(REPO / "hf_posenc").rglob("*.py"), *(REPO / "train_scripts").rglob("*.py")]
    places = []
    for path in sources:
        for number, line in enumerate(path.read_text().splitlines(), start=1):
            if scoring.search(line):
                places.append(f"{path.relative_to(REPO)}:{number}")
    assert len(places) == 1 and places[0].startswith("hf_posenc/pipeline/evaluation/scoring.py:"), places
    assert not (REPO / "train_scripts" / "metrics").exists()
