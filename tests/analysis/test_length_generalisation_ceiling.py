"""The length harness's ceiling (the model's own sentence-by-sentence translations of the same groups, joined)
and the sentence-by-sentence decoding option of the one decoding loop."""

import pytest

from hf_posenc.analysis.length_generalisation import (
    join_consecutive,
    measure_length_generalisation,
    results_table,
)
from hf_posenc.pipeline.evaluation.decoding import split_sentences

WORDS = "a man woman dog cat runs sits on the green red grass near old house while children play".split()


def sentences(count: int) -> list[str]:
    return [" ".join(WORDS[(i + j) % len(WORDS)] for j in range(5)).capitalize() + "." for i in range(count)]


def word_count(batch):
    return [len(text.split()) for text in batch]


def first_sentence_only(batch):
    """A translator that, like the extrapolation table's models, stops after the first sentence of an input."""
    return [split_sentences(text)[0] for text in batch]


def test_the_ceiling_is_the_joined_one_sentence_translations_on_exactly_the_rows_sentences():
    """With 18 sentences and k = 4 the row keeps 16: its ceiling joins the k = 1 translations of those 16, which
    for a translator that is perfect on one sentence scores 100, so `kept` is the row's own BLEU / 100."""
    source = sentences(18)
    result = measure_length_generalisation(
        first_sentence_only, word_count, source, source, k=[1, 4], bucket_edges=[8]
    )
    k1, k4 = result["joined"]
    assert "ceiling" not in k1 and k1["bleu"] == 100.0
    assert k4["inputs"] == 4 and k4["dropped_sentences"] == 2
    assert k4["ceiling"]["bleu"] == 100.0 and k4["ceiling"]["length_ratio"] == 1.0
    assert k4["ceiling"]["hyp_sentence_ends"] == 16 and k4["hyp_sentence_ends"] == 4
    assert k4["kept"] == pytest.approx(k4["bleu"] / 100.0, abs=1e-4) and k4["kept"] < 0.5


def test_the_printed_table_gives_each_joined_rows_ceiling_kept_share_and_whole_paragraphs():
    """What the command prints for a paragraph: a translator that keeps every sentence has all 4 inputs whole and
    keeps 100% of its ceiling; one that stops after the first sentence has none whole."""
    source = sentences(16)
    whole = results_table(
        measure_length_generalisation(lambda batch: batch, word_count, source, source, k=[1, 4])
    )
    assert "| k=4 joined | 4 | 20.0 | 100.00 | 100.00 | 1.000 | 4.00 / 4.00 | 4 | 100.00 | 100.0% |" in whole
    first = measure_length_generalisation(first_sentence_only, word_count, source, source, k=[1, 4])
    k4 = first["joined"][1]
    assert k4["inputs_with_all_sentence_ends"] == 0 and k4["hyp_sentence_ends"] == 4
    assert f"| 1.00 / 4.00 | 0 | 100.00 | {k4['kept']:.1%} |" in results_table(first)


def test_the_ceiling_uses_the_models_own_one_sentence_translations_not_the_references():
    """A translator that drops each sentence's last word: its ceiling is below 100 and its joined row, translated
    sentence by sentence, keeps all of its ceiling."""

    def drop_last_word_of_each_sentence(batch):
        return [" ".join(" ".join(s.split()[:-1]) for s in split_sentences(text)) for text in batch]

    source = sentences(12)
    result = measure_length_generalisation(
        drop_last_word_of_each_sentence, word_count, source, source, k=[1, 2], bucket_edges=[8]
    )
    k1, k2 = result["joined"]
    hypotheses, references = join_consecutive(drop_last_word_of_each_sentence(source), source, 2)
    assert k2["ceiling"]["bleu"] < 100 and k2["ceiling"]["length_ratio"] == pytest.approx(
        4 / 6, abs=0.001
    )  # 13a: 5 words and "."
    assert k2["kept"] == 1.0 and k2["bleu"] == k2["ceiling"]["bleu"]
    assert len(hypotheses) == k2["inputs"] == 6


@pytest.mark.parametrize(
    "text, expected",
    [
        ("A man runs. A dog sits.", ["A man runs.", "A dog sits."]),
        ('He said "go!" Then he left?  Yes', ['He said "go!"', "Then he left?", "Yes"]),
        ("No end mark here", ["No end mark here"]),
        ("Version 2.5 is out. Really.", ["Version 2.5 is out.", "Really."]),
        ("Zwei Hunde (klein.) Ein Mann.", ["Zwei Hunde (klein.)", "Ein Mann."]),
    ],
)
def test_split_sentences_cuts_after_final_punctuation_and_its_closing_marks(text, expected):
    assert split_sentences(text) == expected
