"""The word-order probe (paper 1 Section 3.1): an encoder without positions is exactly permutation-equivariant
(Eq. 9); sinusoids and both PosNets break it (Eq. 13); the API and the CLI report gap and BLEU, and refuse what
they cannot measure before loading."""

import json
import random

import pytest
import torch

from hf_posenc.analysis import word_order_probe as probe_module
from hf_posenc.analysis.word_order_probe import (
    equivariance_gap,
    main,
    token_permutation,
    word_order_probe,
    word_permutation,
)
from hf_posenc.pipeline.evaluation import decoding
from tests.helpers import SOURCES, VOCAB, assert_refused, command_line

SENTENCES = [
    "a man and a woman run on the grass",
    "two dogs play near an old red house",
    "children play on the green grass while two dogs run",
]


def random_permutations(length, count, seed=0):
    generator = torch.Generator().manual_seed(seed)
    return [torch.randperm(length, generator=generator) for _ in range(count)]


def test_encoder_without_positions_is_permutation_equivariant(tiny_model):
    """Eq. 9: with "none" in the encoder, Enc(PX) = P Enc(X) up to float summation order."""
    encoder = tiny_model(encoder_position_encoding="none").get_encoder()
    ids = torch.randint(2, VOCAB, (1, 12), generator=torch.Generator().manual_seed(0))
    gaps = [equivariance_gap(encoder, ids, permutation) for permutation in random_permutations(12, 5)]
    assert max(gaps) < 1e-6


@pytest.mark.parametrize("encoding", ["sinusoidal", "posnet_embed", "posnet_attn"])
def test_position_encodings_break_permutation_equivariance(encoding, tiny_model):
    """Eq. 13: with positions (sinusoids or positional kernels), permuting the input changes more than the order."""
    encoder = tiny_model(encoder_position_encoding=encoding).get_encoder()
    ids = torch.randint(2, VOCAB, (1, 12), generator=torch.Generator().manual_seed(0))
    gaps = [equivariance_gap(encoder, ids, permutation) for permutation in random_permutations(12, 5)]
    assert min(gaps) > 1e-4  # 100x the float noise bound of the "none" test above


def test_word_permutations_move_whole_words_and_keep_specials_in_place():
    """Subword tokens of one word stay together and in order; the end-of-sentence token stays last."""
    word_ids = [0, 0, 1, 2, 2, 2, None]
    assert token_permutation(word_ids, [2, 0, 1]) == [3, 4, 5, 0, 1, 2, 6]
    rng = random.Random(0)
    swap = word_permutation(5, "local_swap", rng)
    assert sorted(swap) == list(range(5)) and sum(a != b for a, b in enumerate(swap)) == 2
    assert word_permutation(5, "shuffle", rng) != list(range(5))


def test_probe_reports_zero_gap_and_full_bleu_for_an_order_blind_encoder(toy_tokenizer, tiny_model):
    """End to end: without encoder positions (and position-free cross-attention) the translations of permuted
    sources equal the original translations (BLEU 100); with sinusoids the encoder states change."""
    kwargs = dict(num_permutations=2, seed=0, num_beams=1, max_new_tokens=8)
    blind = word_order_probe(tiny_model(encoder_position_encoding="none"), toy_tokenizer, SENTENCES, **kwargs)
    assert [result.kind for result in blind] == ["shuffle", "local_swap"]
    assert all(result.equivariance_gap < 1e-6 for result in blind)
    assert all(result.bleu_vs_original == pytest.approx(100.0) for result in blind)
    ordered = word_order_probe(
        tiny_model(encoder_position_encoding="sinusoidal"), toy_tokenizer, SENTENCES, **kwargs
    )
    assert all(result.equivariance_gap > 1e-3 for result in ordered)


def test_cli_prints_one_json_row_per_permutation_kind(toy_tokenizer, tmp_path, capsys, tiny_model):
    """`python -m hf_posenc.analysis.word_order_probe FOLDER --sentences ...` loads a saved model and tokenizer."""
    tiny_model(position_encoding="posnet_embed").save_pretrained(tmp_path)
    toy_tokenizer.save_pretrained(tmp_path)
    main(
        [
            str(tmp_path),
            "--sentences",
            *SENTENCES,
            "--permutations",
            "1",
            "--num_beams",
            "1",
            "--max_new_tokens",
            "4",
        ]
    )
    rows = json.loads(capsys.readouterr().out)
    assert [row["kind"] for row in rows] == ["shuffle", "local_swap"]
    assert all(row["sentences"] == 3 and row["equivariance_gap"] > 0 for row in rows)


def test_the_probe_decodes_with_the_saved_generation_config_unless_told(
    toy_tokenizer, monkeypatch, tiny_model
):
    """One decoding loop (`pipeline.evaluation.decoding.translate`): the probe passes on the caller's settings
    and nothing of its own, so without settings `generate` gets the model's saved ones (beam 4, source length +
    50) and the loop's switch to the fast decoding loop (token-identical), and it hands over token ids (the
    permuted sources) without tokenising them again."""
    assert probe_module.translate is decoding.translate
    model = tiny_model()
    calls = []
    generate = model.generate

    def recording_generate(*args, **kwargs):
        calls.append(sorted(set(kwargs) - {"input_ids", "attention_mask"}))
        return generate(*args, **kwargs)

    monkeypatch.setattr(model, "generate", recording_generate)
    word_order_probe(model, toy_tokenizer, SENTENCES, num_permutations=1, kinds=["local_swap"])
    assert calls == [["fast_decoding"]] * 2  # the originals, then the permuted sources: the saved config
    calls.clear()
    word_order_probe(model, toy_tokenizer, SENTENCES, num_permutations=1, kinds=["local_swap"], num_beams=1)
    assert calls == [["fast_decoding", "num_beams"]] * 2


def test_cli_passes_only_the_decoding_flags_given(toy_tokenizer, tmp_path, monkeypatch, capsys, tiny_model):
    tiny_model().save_pretrained(tmp_path)
    toy_tokenizer.save_pretrained(tmp_path)
    settings = []

    def recording_translate(model, toy_tokenizer, sources, batch_size, bf16=False, **kwargs):
        settings.append(kwargs)
        return ["x"] * len(sources)

    monkeypatch.setattr(probe_module, "translate", recording_translate)
    flags = [str(tmp_path), "--sentences", *SENTENCES, "--permutations", "1", "--precision", "fp32"]
    main(flags)
    main([*flags, "--max_new_tokens", "7"])
    assert settings[0] == {} and settings[-1] == {"max_new_tokens": 7}


def test_sentences_of_one_word_are_left_out_with_a_warning(toy_tokenizer, caplog, tiny_model):
    """A one-word sentence has no other order: counted in, it would pull the gap towards 0 and BLEU to 100."""
    kwargs = dict(num_permutations=1, kinds=["shuffle"], num_beams=1, max_new_tokens=2)
    results = word_order_probe(tiny_model(), toy_tokenizer, [*SENTENCES, "dogs"], **kwargs)
    assert results[0].sentences == len(SENTENCES)
    assert "leaving out 1 of 4 sentences of fewer than two words" in caplog.text


@pytest.mark.parametrize("precision, bf16", [("bf16", True), ("fp32", False)])
def test_cli_precision_flag_sets_the_decoding_precision(
    toy_tokenizer, tmp_path, monkeypatch, capsys, precision, bf16, tiny_model
):
    tiny_model().save_pretrained(tmp_path)
    toy_tokenizer.save_pretrained(tmp_path)
    decoded_bf16 = set()

    def recording_translate(model, toy_tokenizer, sources, batch_size, bf16=False, **kwargs):
        decoded_bf16.add(bf16)
        return ["x"] * len(sources)

    monkeypatch.setattr(probe_module, "translate", recording_translate)
    main([str(tmp_path), "--sentences", *SENTENCES, "--permutations", "1", "--precision", precision])
    assert decoded_bf16 == {bf16}


PROBE_FAULTS = {
    "permutations-0": ("--sentences a dog runs --permutations 0", ["--permutations=0 must be at least 1"]),
    "permutations-negative": (
        "--sentences a dog runs --permutations -2",
        ["--permutations=-2 must be at least 1"],
    ),
    "max-sentences-0": ("--sentences a dog runs --max_sentences 0", ["--max_sentences=0 must be at least 1"]),
    "batch-size-0": ("--sentences a dog runs --batch_size 0", ["--batch_size=0 must be at least 1"]),
    "num-beams-0": ("--sentences a dog runs --num_beams 0", ["--num_beams=0 must be at least 1"]),
    "max-new-tokens-0": (
        "--sentences a dog runs --max_new_tokens 0",
        ["--max_new_tokens=0 must be at least 1"],
    ),
    "missing-source": ("--source {t}/missing.en", ["{t}/missing.en does not exist"]),
    "blank-source": ("--source {t}/blank.txt", ["--source {t}/blank.txt holds no sentence"]),
    "missing-model-folder": (
        "--model {t}/no_model --sentences a dog",
        ["model folder {t}/no_model does not exist"],
    ),
}


@pytest.mark.parametrize("flags, words", list(PROBE_FAULTS.values()), ids=list(PROBE_FAULTS))
def test_word_order_probe_cli_refuses_before_loading(flags, words, model_dir, texts, monkeypatch, run_tool):
    monkeypatch.setattr(probe_module, "translate", lambda *args, **kwargs: pytest.fail("decoded"))
    if "--model" not in flags:
        monkeypatch.setattr(probe_module, "load_translation_model", lambda *a, **k: pytest.fail("loaded"))
    argv = command_line(flags, {"t": texts}, model_dir)
    code, message = run_tool(main, argv)
    assert_refused(code, message, [word.format(t=texts) for word in words])


# id: (sentences, keyword arguments, words of the ValueError)
PROBE_API_FAULTS = {
    "no-sentences": ([], {}, ["got 0 source sentences, none of two or more words"]),
    "only-one-word-sentences": (
        ["dogs", "children"],
        {},
        ["got 2 source sentences, none of two or more words"],
    ),
    "no-permutations": (SOURCES, {"num_permutations": 0}, ["num_permutations=0 must be at least 1"]),
    "unknown-kind": (SOURCES, {"kinds": ["reverse"]}, ["'reverse' is not known", "shuffle, local_swap"]),
    "no-kind": (SOURCES, {"kinds": []}, ["kinds=[]: give one or more of shuffle, local_swap"]),
    "batch-size-0": (SOURCES, {"batch_size": 0}, ["batch_size=0 must be at least 1"]),
}


@pytest.mark.parametrize(
    "sentences, kwargs, words", list(PROBE_API_FAULTS.values()), ids=list(PROBE_API_FAULTS)
)
def test_word_order_probe_refuses_what_it_cannot_measure(
    sentences, kwargs, words, bpe_tokenizer, monkeypatch, tiny_model
):
    monkeypatch.setattr(probe_module, "translate", lambda *args, **kwargs: pytest.fail("decoded"))
    with pytest.raises(ValueError) as error:
        word_order_probe(tiny_model(), bpe_tokenizer, sentences, **kwargs)
    for word in words:
        assert word in str(error.value)
