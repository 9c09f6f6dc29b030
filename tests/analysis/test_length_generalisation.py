"""The length-generalisation harness (analysis/length_generalisation.py).

Joining and bucketing on hand-made inputs; the scores of a perfect, a truncating and a length-capped stub
translator; "cannot" rows (never a crash) for tables too short for the input, from a stub and from a tiny
learned-table model; the plot, the tables, the cache and the CLI, which refuses bad input before loading."""

import json

import pytest
import torch

from hf_posenc.analysis import length_generalisation as harness
from hf_posenc.analysis.length_generalisation import (
    bucket_bounds,
    bucket_label,
    bucket_of,
    comparison_table,
    count_sentence_ends,
    join_consecutive,
    length_generalisation,
    length_generalisation_for_model_dir,
    main,
    mean_over_seeds,
    measure_length_generalisation,
    plot_length_generalisation,
    results_table,
    sentence_ends,
)
from hf_posenc.base import PositionLimitError
from tests.helpers import assert_refused

WORDS = "a man woman dog cat runs sits on the green red grass near old house while children play".split()


def word_count_plus_eos(batch):
    return [len(sentence.split()) + 1 for sentence in batch]


def identity(batch):
    return list(batch)


def first_half(batch):
    return [" ".join(s.split()[: len(s.split()) // 2]) for s in batch]


def eight_word_sentences(count):
    """`count` sentences of 8 words each: 9 source tokens with end-of-sentence, 65 once 8 are joined."""
    return [" ".join(WORDS[(i + j) % len(WORDS)] for j in range(8)) for i in range(count)]


# Joining and bucketing.


def test_joining_groups_consecutive_sentences_and_drops_the_remainder():
    """k consecutive sources (and references) become one input; a remainder short of k is dropped."""
    sources, references = ["s1", "s2", "s3", "s4", "s5"], ["r1", "r2", "r3", "r4", "r5"]
    assert join_consecutive(sources, references, 2) == (["s1 s2", "s3 s4"], ["r1 r2", "r3 r4"])
    assert join_consecutive(sources, references, 1) == (sources, references)
    assert join_consecutive(sources, references, 6) == ([], [])
    for bad in (0, 1.5, True):
        with pytest.raises(ValueError, match=r"k=.*whole numbers >= 1"):
            join_consecutive(sources, references, bad)
    with pytest.raises(ValueError, match="line-aligned"):
        join_consecutive(sources, references[:4], 2)


def test_buckets_cover_every_length_once_with_edges_as_upper_bounds():
    """Edges (3, 6) give 1-3, 4-6, >6; a length equal to an edge belongs to the bucket below it."""
    assert bucket_bounds([3, 6]) == [(1, 3), (4, 6), (7, None)]
    assert [bucket_label(*bounds) for bounds in bucket_bounds([3, 6])] == ["1-3", "4-6", ">6"]
    assert [bucket_of(length, [3, 6]) for length in (1, 3, 4, 6, 7, 100)] == [0, 0, 1, 1, 2, 2]
    for bad in ([], [0], [5, 5], [6, 3], [2.5]):
        with pytest.raises(ValueError, match=r"bucket_edges=.*strictly increasing"):
            bucket_bounds(bad)


# Scores of stub translators.


def test_perfect_translator_scores_100_with_length_ratio_one_everywhere():
    sentences = [" ".join(WORDS[i : i + 4]) for i in range(12)]
    result = measure_length_generalisation(
        identity, word_count_plus_eos, sentences, sentences, k=[1, 2, 4, 8], bucket_edges=[4, 10]
    )
    joined = {row["k"]: row for row in result["joined"]}
    assert [joined[k]["inputs"] for k in (1, 2, 4, 8)] == [12, 6, 3, 1]
    assert [joined[k]["dropped_sentences"] for k in (1, 2, 4, 8)] == [0, 0, 0, 4]
    assert [joined[k]["mean_source_tokens"] for k in (1, 2, 4, 8)] == [5.0, 9.0, 17.0, 33.0]
    for row in result["joined"] + [row for row in result["buckets"] if row["inputs"]]:
        assert row["bleu"] == 100.0 and row["chrf++"] == 100.0 and row["length_ratio"] == 1.0
        assert row["cannot"] is None
    buckets = {row["bucket"]: row for row in result["buckets"]}
    assert buckets["1-4"]["inputs"] == 0 and buckets["1-4"]["bleu"] is None  # an empty bucket has no scores
    assert buckets["5-10"]["inputs"] == 12 and buckets[">10"]["inputs"] == 0
    assert result["signatures"]["bleu"].startswith("nrefs:1")
    json.dumps(result)  # JSON-serialisable as it is


def test_truncating_translator_has_length_ratio_one_half():
    """A translator that stops half way: length ratio 0.5 (sacreBLEU sys_len / ref_len) and a lower BLEU."""
    sentences = [" ".join(WORDS[i : i + 6]) for i in range(8)]
    result = measure_length_generalisation(
        first_half, word_count_plus_eos, sentences, sentences, k=[1, 2], bucket_edges=[10]
    )
    for row in result["joined"]:
        assert row["length_ratio"] == 0.5 and row["hyp_len"] * 2 == row["ref_len"]
        assert row["bleu"] < 70


def test_a_translator_capped_at_training_lengths_stops_earlier_as_k_grows():
    """The failure the harness exists to show: a model that never writes more than it saw in training."""
    sentences = [" ".join(WORDS[i : i + 6]) for i in range(8)]

    def capped(batch):
        return [" ".join(s.split()[:6]) for s in batch]

    result = measure_length_generalisation(capped, word_count_plus_eos, sentences, sentences, k=[1, 2, 4, 8])
    ratios = [row["length_ratio"] for row in result["joined"]]
    assert ratios == [1.0, 0.5, 0.25, 0.125]


# Tables too short: "cannot", never a crash.


def limited_translator(max_words):
    """Raises the models' PositionLimitError for any batch holding an input longer than `max_words` words."""

    def translator(batch):
        longest = max(len(s.split()) for s in batch)
        if longest > max_words:
            raise PositionLimitError(longest + 1, max_words, "learned")
        return list(batch)

    return translator


def test_inputs_past_a_table_are_recorded_as_cannot_and_the_other_buckets_still_score():
    """k = 1 holds a too-long sentence, so it is "cannot" (k = 2 joins the two short ones and drops it); the
    buckets are then decoded one by one, and only the bucket past the table is "cannot"."""
    sentences = [
        "a man runs on grass",
        "the dog sits near houses",
        "a cat sits on the green grass near the old red house",
    ]
    result = measure_length_generalisation(
        limited_translator(10), word_count_plus_eos, sentences, sentences, k=[1, 2], bucket_edges=[6]
    )
    single, joined = result["joined"]
    assert single["cannot"] == {"positions": 13, "max_positions": 10, "module": "learned"}
    assert single["bleu"] is None and single["inputs"] == 3
    assert joined["cannot"] is None and joined["bleu"] == 100.0 and joined["dropped_sentences"] == 1
    short, long = result["buckets"]
    assert short["bucket"] == "1-6" and short["bleu"] == 100.0 and short["cannot"] is None
    assert long["bucket"] == ">6" and long["cannot"]["max_positions"] == 10
    assert "| >6 tokens | 1 | 13.0 | cannot: 13 positions > 10 (learned) |" in results_table(result)


def test_other_value_errors_are_not_mistaken_for_a_position_limit():
    def broken(batch):
        raise ValueError("some other problem")

    with pytest.raises(ValueError, match="some other problem"):
        measure_length_generalisation(broken, word_count_plus_eos, ["a man"], ["a man"], k=[1])


def test_bounded_tables_raise_position_limit_error_a_value_error_naming_both_numbers(tiny_model):
    model = tiny_model(position_encoding="learned")
    too_long = torch.full((1, 65), 5)
    with pytest.raises(
        PositionLimitError, match=r"65 positions .* 64 positions of the 'learned' table"
    ) as error:
        model(input_ids=too_long, decoder_input_ids=torch.zeros(1, 1, dtype=torch.long))
    assert isinstance(error.value, ValueError)
    assert (error.value.positions, error.value.max_positions, error.value.module_name) == (65, 64, "learned")


def test_tiny_learned_table_model_gives_cannot_instead_of_crashing(toy_tokenizer, tiny_model):
    """The tiny model has 64 positions: 8 joined 8-word sentences (65 tokens) cannot be encoded, while
    single sentences (9 tokens, up to 9 + 50 decoder positions) translate."""
    sentences = eight_word_sentences(8)
    model = tiny_model(position_encoding="learned")
    result = length_generalisation(model, toy_tokenizer, sentences, sentences, k=[1, 8], bucket_edges=[5])
    single, joined = result["joined"]
    assert single["cannot"] is None and single["inputs"] == 8 and single["bleu"] is not None
    assert joined["cannot"] == {"positions": 65, "max_positions": 64, "module": "learned"}
    assert joined["mean_source_tokens"] == 65.0  # the joined input: 64 words + end of sentence
    assert result["buckets"][1]["bleu"] == single["bleu"]  # all 8 sentences in ">5": the k = 1 translations
    assert result["max_position_embeddings"] == 64


# Reports: plot, tables, cache, CLI.


def test_plot_and_comparison_table_show_every_model_and_cannot_cells(tmp_path):
    sentences = [
        "a man runs on grass",
        "the dog sits near houses",
        "a cat sits on the green grass near the old red house",
        "a",
    ]
    results = {
        "perfect": measure_length_generalisation(identity, word_count_plus_eos, sentences, sentences, [1, 2]),
        "bounded": measure_length_generalisation(
            limited_translator(10), word_count_plus_eos, sentences, sentences, [1, 2]
        ),
    }
    for series in ("joined", "buckets"):
        path = tmp_path / f"{series}.png"
        plot_length_generalisation(results, path, series=series)
        assert path.read_bytes().startswith(b"\x89PNG")
    with pytest.raises(ValueError, match="series='words'.*joined, buckets"):
        plot_length_generalisation(results, tmp_path / "x.png", series="words")
    table = comparison_table(results).splitlines()
    assert table[0] == "| system | BLEU k=1 | ratio k=1 | BLEU k=2 | ratio k=2 |"
    assert table[2] == "| perfect | 100.0 | 1.00 | 100.0 | 1.00 |"
    assert table[3].startswith("| bounded | cannot (>10 pos.) |")
    buckets = comparison_table(results, series="buckets").splitlines()
    labels = [row["bucket"] for row in results["perfect"]["buckets"]]
    assert buckets[0] == "| system | " + " | ".join(f"BLEU {b} tok. | ratio {b} tok." for b in labels) + " |"
    assert buckets[2].startswith("| perfect | 100.0 | 1.00 |")
    with pytest.raises(ValueError, match="series='words'.*joined, buckets"):
        comparison_table(results, series="words")


@pytest.fixture
def saved_model(tmp_path, toy_tokenizer, tiny_model):
    """A tiny sinusoidal model (64 positions) with its tokenizer and generation config (beam 4), saved."""
    model = tiny_model(position_encoding="sinusoidal")
    folder = tmp_path / "model"
    model.save_pretrained(folder)
    toy_tokenizer.save_pretrained(folder)
    return folder


def test_model_folder_results_are_cached_next_to_the_model(saved_model, monkeypatch):
    """A second call with the same text and settings reads the JSON instead of decoding; new settings decode."""
    sentences = eight_word_sentences(4)
    first = length_generalisation_for_model_dir(saved_model, sentences, sentences, k=[1, 2], bucket_edges=[5])
    assert json.loads((saved_model / harness.CACHE_NAME).read_text()) == first

    def no_decoding(*args, **kwargs):
        raise AssertionError("decoded although the cache matched")

    monkeypatch.setattr(harness, "translate", no_decoding)
    assert length_generalisation_for_model_dir(saved_model, sentences, sentences, [1, 2], [5]) == first
    with pytest.raises(AssertionError, match="decoded although"):
        length_generalisation_for_model_dir(saved_model, sentences, sentences, [1], [5])


def test_cli_prints_a_table_and_writes_json_and_plot(saved_model, tmp_path, capsys, texts):
    sentences = eight_word_sentences(8)
    (tmp_path / "test.src").write_text("\n".join(sentences) + "\n")
    (tmp_path / "test.ref").write_text("\n".join(sentences) + "\n")
    output, plot = tmp_path / "length.json", tmp_path / "length.png"
    texts = ["--source", str(tmp_path / "test.src"), "--reference", str(tmp_path / "test.ref")]
    main(
        [
            str(saved_model),
            *texts,
            "--k",
            "1",
            "8",
            "--buckets",
            "5",
            "--output",
            str(output),
            "--plot",
            str(plot),
        ]
    )
    printed = capsys.readouterr().out
    assert "| k=1 joined | 8 | 9.0 |" in printed
    assert "| k=8 joined | 1 | 65.0 | cannot: 65 positions > 64 (sinusoidal) | – | – |" in printed
    result = json.loads(output.read_text())
    assert result["k"] == [1, 8] and result["joined"][1]["cannot"]["module"] == "sinusoidal"
    assert plot.read_bytes().startswith(b"\x89PNG")


def test_sentence_ends_show_a_translator_that_writes_one_sentence_per_input(texts):
    """The failure seen in every comparison run at k = 4: one sentence written for four joined ones."""
    texts = ("Ein Hund läuft. Eine Frau liest!", "3.5 m hoch.", "", "ja")
    assert [count_sentence_ends(text) for text in texts] == [2, 1, 0, 0]
    assert count_sentence_ends("一只狗在跑。一个女人在读书。") == 2
    sentences = [f"{WORDS[i]} {WORDS[i + 1]}." for i in range(8)]

    def first_sentence(batch):
        return [text.split(". ")[0].rstrip(".") + "." for text in batch]

    result = measure_length_generalisation(
        first_sentence, word_count_plus_eos, sentences, sentences, k=[1, 2, 4]
    )
    joined = {row["k"]: row for row in result["joined"]}
    assert [(joined[k]["hyp_sentence_ends"], joined[k]["ref_sentence_ends"]) for k in (1, 2, 4)] == [
        (8, 8),
        (4, 8),
        (2, 8),
    ]
    assert [joined[k]["inputs_with_all_sentence_ends"] for k in (1, 2, 4)] == [8, 0, 0]
    table = results_table(result)
    assert "| k=4 joined | 2 | " in table and table.count("1.00 / 4.00 | 0 |") == 1
    assert "| k=1 joined | 8 | " in table and "1.00 / 1.00 | 8 | – | – |" in table
    assert sentence_ends({"inputs": 3, "hyp_sentence_ends": None}) == "–"  # results from before the count


def test_mean_over_seeds_averages_each_row_and_keeps_a_table_limit():
    def result(bleu, ratio, cannot=None):
        joined = [
            {"k": 1, "bleu": bleu, "length_ratio": ratio, "cannot": None},
            {
                "k": 8,
                "bleu": None if cannot else 1.0,
                "length_ratio": None if cannot else 0.3,
                "cannot": cannot,
            },
        ]
        return {
            "joined": joined,
            "buckets": [{"bucket": ">40", "bleu": None, "length_ratio": None, "cannot": None}],
        }

    limit = {"positions": 130, "max_positions": 128, "module": "learned"}
    mean = mean_over_seeds([result(30.0, 0.9), result(32.0, 1.0, cannot=limit)])
    assert mean["seeds"] == 2
    assert (mean["joined"][0]["bleu"], mean["joined"][0]["length_ratio"]) == (31.0, 0.95)
    assert mean["joined"][1]["cannot"] == limit and mean["joined"][1]["bleu"] is None
    assert mean["buckets"][0]["bleu"] is None  # an empty bucket stays unscored
    assert "| mean | 31.0 | 0.95 | cannot (>128 pos.) |" in comparison_table({"mean": mean})
    other = result(30.0, 0.9)
    other["joined"] = other["joined"][:1]
    with pytest.raises(ValueError, match=r"joined rows differ \(\[\[1, 8\], \[1\]\]\)"):
        mean_over_seeds([result(30.0, 0.9), other])


LENGTH_FAULTS = {
    "batch-size-0": ("--batch_size 0", ["--batch_size=0 must be at least 1"]),
    "max-sentences-0": ("--max_sentences 0", ["--max_sentences=0 must be at least 1"]),
    "max-sentences-negative": ("--max_sentences -2", ["--max_sentences=-2 must be at least 1"]),
    "k-0": ("--k 0 2", ["--k=[0, 2]: expected one or more whole numbers >= 1"]),
    "buckets-not-increasing": ("--buckets 5 5", ["--buckets=[5, 5]: expected strictly increasing"]),
}


@pytest.mark.parametrize("flags, words", list(LENGTH_FAULTS.values()), ids=list(LENGTH_FAULTS))
def test_length_harness_cli_refuses_before_loading(flags, words, model_dir, texts, monkeypatch, run_tool):
    monkeypatch.setattr(harness, "load_translation_model", lambda *a, **k: pytest.fail("loaded"))
    argv = [model_dir, "--source", texts / "test.en", "--reference", texts / "test.de", *flags.split()]
    code, message = run_tool(main, argv)
    assert_refused(code, message, words)
