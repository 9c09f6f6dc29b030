"""Scores, significance and the degenerate-output check (pipeline/evaluation/scoring.py): a finished run's garbage
output is named as such with its likely causes, sacreBLEU scores a corpus in one place, the paired bootstrap and
the n-gram sweep."""

import copy
import random
import re

import pytest
import torch

from hf_posenc.pipeline.evaluation.scoring import (  # noqa: E402
    COLLAPSED_ENCODER,
    degenerate_output,
    encoder_token_cosine,
    ngram_sweep,
    paired_bootstrap,
    plot_ngram_sweep,
)
from tests.helpers import REPO, SOURCES

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


def test_sacrebleu_scores_a_corpus_in_one_place():
    """BLEU and chrF come from `evaluation.corpus_score` alone (through `score_translations` or
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


def test_zero_bootstrap_samples_are_an_error_not_sacrebleus_default():
    with pytest.raises(ValueError, match="bootstrap samples=0 must be at least 1"):
        paired_bootstrap(["a"], ["a"], ["a"], samples=0)


def test_paired_bootstrap_marks_a_clearly_better_system(multi30k_dir):
    from hf_posenc.pipeline.data.files import read_split

    test = read_split(multi30k_dir, "test_2016_flickr", "en", "de", limit=200)
    good = test.target
    bad = [" ".join(line.split()[::-1]) for line in test.target]  # word order destroyed
    report = paired_bootstrap(bad, good, test.target, samples=200)
    assert report["bleu"]["system"] == 100.0 and report["bleu"]["significance"] == "**"
    assert report["bleu"]["p_value"] < 0.05 and "bs:200" in report["bleu"]["signature"]
    # two systems of the same expected quality: each damages a random half of the lines
    generator = random.Random(0)
    first, second = (
        [g if generator.random() < 0.5 else b for g, b in zip(good, bad, strict=True)] for _ in range(2)
    )
    tie = paired_bootstrap(first, second, test.target, samples=1000)
    assert tie["bleu"]["significance"] == "" and tie["bleu"]["p_value"] > 0.10


def test_ngram_sweep_grows_with_order_for_word_order_damage(multi30k_dir, tmp_path):
    from hf_posenc.pipeline.data.files import read_split

    test = read_split(multi30k_dir, "test_2016_flickr", "en", "de", limit=100)
    shuffled = [" ".join(line.split()[::-1]) for line in test.target]
    sweep = ngram_sweep(test.target, shuffled, test.target)
    assert [n for n, _ in sweep["chrf_char"]] == list(range(1, 31))
    assert sweep["bleu"][0][1] == pytest.approx(0, abs=1e-6)  # unigrams ignore order
    assert sweep["bleu"][3][1] > sweep["bleu"][1][1] > 0  # the gap grows with the n-gram order
    plot_ngram_sweep(sweep, tmp_path / "sweep.png")
    assert (tmp_path / "sweep.png").read_bytes()[:4] == b"\x89PNG"
