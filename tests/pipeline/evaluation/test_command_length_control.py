"""The evaluate command and decode-time length control (docs/length.md): the model's saved generation config
applies, the flags override it, bad values are refused before decoding, and a CTranslate2 export decodes what it
can express and refuses the rest by name."""

import pytest
import torch

from hf_posenc.pipeline.data.tokenization import train_joint_bpe
from hf_posenc.pipeline.evaluation import command
from hf_posenc.pipeline.evaluation.command import evaluate_main
from tests.helpers import EOS, assert_refused


@pytest.fixture
def eager_dir(tmp_path, tiny_model, bpe_tokenizer):
    """A saved tiny model whose `</s>` is the best token at every step (it translates everything as "")."""
    model = tiny_model(max_position_embeddings=256)
    with torch.no_grad():
        model.final_logits_bias[0, EOS] = 1.0
    model.generation_config.early_stopping = True  # beam search as CTranslate2 runs it

    def save(**generation):
        for key, value in generation.items():
            setattr(model.generation_config, key, value)
        folder = tmp_path / "model"
        model.save_pretrained(folder)
        bpe_tokenizer.save_pretrained(folder)
        return folder

    return save


def hypotheses(folder, texts, *flags) -> list[str]:
    test_set = ["--source", str(texts / "test.en"), "--reference", str(texts / "test.de")]
    precision = [] if (folder / "model.bin").is_file() else ["--precision", "fp32"]  # an export: its own
    evaluate_main([str(folder), *test_set, *precision, "--threads", "1", *flags])
    return (folder / "evaluation.hyp").read_text().split("\n")[:-1]


def test_the_saved_length_control_applies_and_the_flags_override_it(eager_dir, texts):
    folder = eager_dir()
    assert set(hypotheses(folder, texts)) == {""}
    longer = hypotheses(folder, texts, "--min_length_ratio", "2")
    assert all(longer)
    folder = eager_dir(min_length_ratio=2.0)
    assert hypotheses(folder, texts) == longer
    assert set(hypotheses(folder, texts, "--min_length_ratio", "0")) == {""}
    assert set(hypotheses(folder, texts, "--word_reward", "5", "--num_beams", "1")) != {""}


def test_the_sentence_count_flag_takes_the_tokenizers_sentence_ends_where_the_model_saved_none(
    tmp_path, tiny_model
):
    """Before: `--match_source_sentence_count true` on a model trained without --length_control or
    --sentence_positions was refused for lack of `sentence_end_token_ids`, which no flag of the command sets."""
    sources = ["a dog runs . a man sits .", "two dogs run . children play ."]
    model = tiny_model(max_position_embeddings=256)
    with torch.no_grad():
        model.final_logits_bias[0, EOS] = 1.0  # </s> first: it translates everything as ""
    folder = tmp_path / "model"
    model.save_pretrained(folder)
    train_joint_bpe(sources * 3, vocab_size=60).save_pretrained(folder)
    for name in ("test.en", "test.de"):
        (tmp_path / name).write_text("\n".join(sources) + "\n")
    assert set(hypotheses(folder, tmp_path)) == {""}
    assert all(hypotheses(folder, tmp_path, "--match_source_sentence_count", "true"))


def test_the_window_flag_translates_each_sentence_window_on_its_own(tmp_path, tiny_model):
    """`--window_sentences 1` on a model that saved no sentence-end ids cuts at the tokenizer's sentence ends, and
    not at the `.` of `dogs.com` (a continuation token follows it): each source's translation is its sentences'
    translations, each made alone, joined."""
    sources = ["a dog runs to dogs.com. a man sits.", "two dogs run. children play."]
    sentences = ["a dog runs to dogs.com.", "a man sits.", "two dogs run.", "children play."]
    folder = tmp_path / "model"
    tiny_model(max_position_embeddings=256).save_pretrained(folder)
    train_joint_bpe(sources * 3, vocab_size=60).save_pretrained(folder)
    for name, texts in (("test", sources), ("sentences", sentences)):
        for language in ("en", "de"):
            (tmp_path / f"{name}.{language}").write_text("\n".join(texts) + "\n")
    windowed = hypotheses(folder, tmp_path, "--window_sentences", "1", "--num_beams", "1")
    flags = ["--source", str(tmp_path / "sentences.en"), "--reference", str(tmp_path / "sentences.de")]
    evaluate_main([str(folder), *flags, "--precision", "fp32", "--threads", "1", "--num_beams", "1"])
    alone = [text.replace(" ", "") for text in (folder / "evaluation.hyp").read_text().split("\n")[:-1]]
    # the windows' tokens are joined as generated: a random model need not start a translation with a word
    # start, so the words are compared without the spaces between them
    assert [text.replace(" ", "") for text in windowed] == ["".join(alone[:2]), "".join(alone[2:])]


LENGTH_CONTROL_FAULTS = {
    "ratio-negative": ("--min_length_ratio -1", ["--min_length_ratio=-1.0 must be at least 0"]),
    "ratio-nan": ("--min_length_ratio nan", ["--min_length_ratio=nan must be a finite number"]),
    "reward-inf": ("--word_reward inf", ["--word_reward=inf must be a finite number"]),
    "ngram-negative": ("--no_repeat_ngram_size -1", ["--no_repeat_ngram_size=-1 must be at least 0"]),
    "sentence-count-yes": ("--match_source_sentence_count yes", ["invalid choice: 'yes'"]),
    "window-zero": ("--window_sentences 0", ["--window_sentences=0 must be at least 1"]),
    "with-hypotheses": (
        "--hypotheses {t}/test.de --word_reward 0.5",
        ["--word_reward set decoding, but --hypotheses scores translations without decoding"],
    ),
}


@pytest.mark.parametrize(
    "flags, words", list(LENGTH_CONTROL_FAULTS.values()), ids=list(LENGTH_CONTROL_FAULTS)
)
def test_bad_length_control_flags_are_refused_before_decoding(
    flags, words, model_dir, texts, monkeypatch, run_tool
):
    def no_work(*args, **kwargs):
        raise AssertionError("the tool started its work before refusing the input")

    monkeypatch.setattr(command, "translate", no_work)
    monkeypatch.setattr(command, "load_translation_model", no_work)
    argv = [model_dir, "--source", texts / "test.en", "--reference", texts / "test.de"]
    argv += flags.format(t=texts).split()
    code, message = run_tool(evaluate_main, argv)
    assert_refused(code, message, words)


def test_an_export_decodes_the_minimum_ratio_as_the_model_and_refuses_the_word_reward(
    eager_dir, texts, tmp_path, run_tool
):
    pytest.importorskip("ctranslate2")
    from hf_posenc.pipeline.export.ctranslate2 import export_ctranslate2

    folder = eager_dir(min_length_ratio=2.0)
    export = export_ctranslate2(folder, tmp_path / "ct2")
    greedy = [
        "--num_beams",
        "1",
    ]  # token for token (beam search can break a near-tie of random weights apart)
    expected = hypotheses(folder, texts, *greedy)
    assert all(expected) and hypotheses(export, texts, *greedy) == expected
    assert set(hypotheses(export, texts, "--min_length_ratio", "0")) == {""}
    test_set = ["--source", texts / "test.en", "--reference", texts / "test.de"]
    code, message = run_tool(evaluate_main, [export, *test_set, "--word_reward", "0.5"])
    assert_refused(code, message, ["word_reward=0.5", "CTranslate2 has no per-word reward"])
