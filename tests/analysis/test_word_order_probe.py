"""The word-order probe (paper 1 Section 3.1): an encoder without positions is exactly permutation-equivariant
(Eq. 9); sinusoids and both PosNets break it (Eq. 13); the API and the CLI report gap and BLEU."""

import json
import random

import pytest
import torch
from conftest import EOS, PAD, VOCAB, tiny_model

from hf_posenc.analysis import word_order_probe as probe_module
from hf_posenc.analysis.word_order_probe import (
    equivariance_gap,
    main,
    token_permutation,
    word_order_probe,
    word_permutation,
)
from hf_posenc.pipeline.evaluation import decoding

WORDS = "a man a woman two dogs run on the green grass near an old red house while children play".split()
SENTENCES = [
    "a man and a woman run on the grass",
    "two dogs play near an old red house",
    "children play on the green grass while two dogs run",
]


@pytest.fixture(scope="module")
def tokenizer():
    from tokenizers import Tokenizer, models, pre_tokenizers, processors
    from transformers import PreTrainedTokenizerFast

    vocab = {"<pad>": PAD, "</s>": EOS, "<unk>": 2}
    for word in sorted(set(WORDS + " ".join(SENTENCES).split())):
        vocab.setdefault(word, len(vocab))
    while len(vocab) < VOCAB:  # every id the tiny model can generate decodes to a word
        vocab[f"filler{len(vocab)}"] = len(vocab)
    backend = Tokenizer(models.WordLevel(vocab, unk_token="<unk>"))
    backend.pre_tokenizer = pre_tokenizers.WhitespaceSplit()
    backend.post_processor = processors.TemplateProcessing(single="$A </s>", special_tokens=[("</s>", EOS)])
    return PreTrainedTokenizerFast(
        tokenizer_object=backend, pad_token="<pad>", eos_token="</s>", unk_token="<unk>"
    )


def random_permutations(length, count, seed=0):
    generator = torch.Generator().manual_seed(seed)
    return [torch.randperm(length, generator=generator) for _ in range(count)]


def test_encoder_without_positions_is_permutation_equivariant():
    """Eq. 9: with "none" in the encoder, Enc(PX) = P Enc(X) up to float summation order."""
    encoder = tiny_model(encoder_position_encoding="none").get_encoder()
    ids = torch.randint(2, VOCAB, (1, 12), generator=torch.Generator().manual_seed(0))
    gaps = [equivariance_gap(encoder, ids, permutation) for permutation in random_permutations(12, 5)]
    assert max(gaps) < 1e-6


@pytest.mark.parametrize("encoding", ["sinusoidal", "posnet_embed", "posnet_attn"])
def test_position_encodings_break_permutation_equivariance(encoding):
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


def test_probe_reports_zero_gap_and_full_bleu_for_an_order_blind_encoder(tokenizer):
    """End to end: without encoder positions (and position-free cross-attention) the translations of permuted
    sources equal the original translations (BLEU 100); with sinusoids the encoder states change."""
    kwargs = dict(num_permutations=2, seed=0, num_beams=1, max_new_tokens=8)
    blind = word_order_probe(tiny_model(encoder_position_encoding="none"), tokenizer, SENTENCES, **kwargs)
    assert [result.kind for result in blind] == ["shuffle", "local_swap"]
    assert all(result.equivariance_gap < 1e-6 for result in blind)
    assert all(result.bleu_vs_original == pytest.approx(100.0) for result in blind)
    ordered = word_order_probe(
        tiny_model(encoder_position_encoding="sinusoidal"), tokenizer, SENTENCES, **kwargs
    )
    assert all(result.equivariance_gap > 1e-3 for result in ordered)


def test_cli_prints_one_json_row_per_permutation_kind(tokenizer, tmp_path, capsys):
    """`python -m hf_posenc.analysis.word_order_probe FOLDER --sentences ...` loads a saved model and tokenizer."""
    tiny_model(position_encoding="posnet_embed").save_pretrained(tmp_path)
    tokenizer.save_pretrained(tmp_path)
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


def test_the_probe_decodes_with_the_saved_generation_config_unless_told(tokenizer, monkeypatch):
    """One decoding loop (`pipeline.evaluation.decoding.translate`): the probe passes on the caller's settings
    and nothing of its own, so without settings `generate` gets the model's saved ones (beam 4, source length +
    50), and it hands over token ids (the permuted sources) without tokenising them again."""
    assert probe_module.translate is decoding.translate
    model = tiny_model()
    calls = []
    generate = model.generate

    def recording_generate(*args, **kwargs):
        calls.append(sorted(set(kwargs) - {"input_ids", "attention_mask"}))
        return generate(*args, **kwargs)

    monkeypatch.setattr(model, "generate", recording_generate)
    word_order_probe(model, tokenizer, SENTENCES, num_permutations=1, kinds=["local_swap"])
    assert calls == [[], []]  # the originals, then the permuted sources: the saved config alone
    calls.clear()
    word_order_probe(model, tokenizer, SENTENCES, num_permutations=1, kinds=["local_swap"], num_beams=1)
    assert calls == [["num_beams"], ["num_beams"]]


def test_cli_passes_only_the_decoding_flags_given(tokenizer, tmp_path, monkeypatch, capsys):
    tiny_model().save_pretrained(tmp_path)
    tokenizer.save_pretrained(tmp_path)
    settings = []

    def recording_translate(model, tokenizer, sources, batch_size, bf16=False, **kwargs):
        settings.append(kwargs)
        return ["x"] * len(sources)

    monkeypatch.setattr(probe_module, "translate", recording_translate)
    flags = [str(tmp_path), "--sentences", *SENTENCES, "--permutations", "1", "--precision", "fp32"]
    main(flags)
    main([*flags, "--max_new_tokens", "7"])
    assert settings[0] == {} and settings[-1] == {"max_new_tokens": 7}


def test_sentences_of_one_word_are_left_out_with_a_warning(tokenizer, caplog):
    """A one-word sentence has no other order: counted in, it would pull the gap towards 0 and BLEU to 100."""
    kwargs = dict(num_permutations=1, kinds=["shuffle"], num_beams=1, max_new_tokens=2)
    results = word_order_probe(tiny_model(), tokenizer, [*SENTENCES, "dogs"], **kwargs)
    assert results[0].sentences == len(SENTENCES)
    assert "leaving out 1 of 4 sentences of fewer than two words" in caplog.text


@pytest.mark.parametrize("precision, bf16", [("bf16", True), ("fp32", False)])
def test_cli_precision_flag_sets_the_decoding_precision(
    tokenizer, tmp_path, monkeypatch, capsys, precision, bf16
):
    tiny_model().save_pretrained(tmp_path)
    tokenizer.save_pretrained(tmp_path)
    decoded_bf16 = set()

    def recording_translate(model, tokenizer, sources, batch_size, bf16=False, **kwargs):
        decoded_bf16.add(bf16)
        return ["x"] * len(sources)

    monkeypatch.setattr(probe_module, "translate", recording_translate)
    main([str(tmp_path), "--sentences", *SENTENCES, "--permutations", "1", "--precision", precision])
    assert decoded_bf16 == {bf16}
