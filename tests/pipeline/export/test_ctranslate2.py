"""CTranslate2 export (pipeline/export/ctranslate2.py): every module CTranslate2 can express decodes token for
token as `generate`, every other one is refused with the CTranslate2 feature it lacks, and the command never
destroys a folder.

The exactness tests run on tiny models with a BPE vocabulary learnt from a few Multi30k sentences. With random
weights (fixed seed) greedy decoding runs into the length limit, which checks the limit and the forced `</s>`.
Trained (a sinusoidal model for 150 steps, then each system's own 20, its new positional parameters included),
the models end most translations themselves at varied lengths, which checks beam search (beam 4, length
penalty 0.6) where hypotheses finish at different lengths."""

import gzip
import json
import subprocess
import sys
from types import SimpleNamespace

import pytest
import torch

from tests.helpers import REPO, TINY_FIELDS

ctranslate2 = pytest.importorskip("ctranslate2")

from benchmarks.systems import conformance_variants  # noqa: E402
from hf_posenc import MarianPosEncConfig, MarianPosEncForConditionalGeneration  # noqa: E402
from hf_posenc.pipeline.data.tokenization import train_joint_bpe  # noqa: E402
from hf_posenc.pipeline.evaluation.command import evaluate_main  # noqa: E402
from hf_posenc.pipeline.evaluation.decoding import translate  # noqa: E402
from hf_posenc.pipeline.export.ctranslate2 import (  # noqa: E402
    EXPORT_INFO,
    EXPORTABLE_ENCODINGS,
    QUANTIZATIONS,
    CTranslate2Model,
    check_exportable,
    decoding_length,
    decoding_options,
    export_ctranslate2,
    export_refusals,
    is_ctranslate2_folder,
    main,
)

EOS = TINY_FIELDS["eos_token_id"]
BPE_SENTENCES, BPE_VOCAB = 200, 300  # a few Multi30k sentences per language, a small joint vocabulary
TRAIN_BATCH, TRAIN_LR = 16, 1e-2
# Steps of the sinusoidal model every trained system starts from, and of each system's own training: enough for a
# tiny model to end most translations itself, at varied lengths.
BASE_STEPS, SYSTEM_STEPS = 150, 20
# Rounds of SYSTEM_STEPS a system trains until at least 2 beam-4 translations end themselves: the CPU's rounding
# decides when a tiny model learns to end a translation.
MAX_SYSTEM_ROUNDS = 4
# Every conformance variant CTranslate2 can express, and ALiBi in the decoder (the conformance suite runs ALiBi
# in both stacks, which CTranslate2 refuses).
EXPORTABLE = [
    (name, overrides)
    for name, overrides in conformance_variants()
    if not export_refusals(MarianPosEncConfig(**{**TINY_FIELDS, **overrides}))
] + [("alibi-decoder", {"encoder_position_encoding": "sinusoidal", "decoder_position_encoding": "alibi"})]


def read(folder, name: str, count: int) -> list[str]:
    path = folder / name
    with gzip.open(path, "rt", encoding="utf-8") as lines:
        return [next(lines).strip() for _ in range(count)]


@pytest.fixture(scope="module", autouse=True)
def one_thread():
    """torch on one thread here, as CTranslate2 decodes a batch and as the suite's two workers run: the trained
    models' weights and their near-ties between beams then come out alike whatever HF_POSENC_TEST_THREADS says."""
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(threads)


@pytest.fixture(scope="module")
def corpus(multi30k_dir):
    return read(multi30k_dir, "train.en.gz", BPE_SENTENCES), read(multi30k_dir, "train.de.gz", BPE_SENTENCES)


@pytest.fixture(scope="module")
def tokenizer(corpus):
    return train_joint_bpe(corpus[0] + corpus[1], vocab_size=BPE_VOCAB)


@pytest.fixture(scope="module")
def sentences(multi30k_dir):
    return read(multi30k_dir, "val.en.gz", 16)


@pytest.fixture(scope="module")
def base_model(tokenizer, corpus):
    """A sinusoidal model trained for `BASE_STEPS`: the start of every trained system."""
    return trained(translation_model(tokenizer, {}), tokenizer, corpus, BASE_STEPS)


def translation_model(tokenizer, overrides: dict, seed: int = 0):
    """A tiny model over the BPE vocabulary, with room for source length + 50 decoded positions."""
    torch.manual_seed(seed)
    fields = {**TINY_FIELDS, "vocab_size": len(tokenizer), "max_position_embeddings": 256}
    if overrides.get(
        "randomized_positions_max"
    ):  # positions drawn from the whole table: the corpus's pairs fit
        overrides = {**overrides, "randomized_positions_max": fields["max_position_embeddings"]}
    return MarianPosEncForConditionalGeneration(MarianPosEncConfig(**{**fields, **overrides})).eval()


def trained(model, tokenizer, corpus, steps: int):
    """The model after `steps` Adam steps on the corpus (dropout on), back in eval mode."""
    optimizer = torch.optim.Adam(model.parameters(), lr=TRAIN_LR)
    model.train()
    for step in range(steps):
        start = step * TRAIN_BATCH % len(corpus[0])
        batch = tokenizer(
            corpus[0][start : start + TRAIN_BATCH],
            text_target=corpus[1][start : start + TRAIN_BATCH],
            return_tensors="pt",
            padding=True,
        )
        batch["labels"] = batch["labels"].masked_fill(batch["labels"] == tokenizer.pad_token_id, -100)
        model(**batch).loss.backward()
        optimizer.step()
        optimizer.zero_grad()
    return model.eval()


def save(model, tokenizer, folder):
    model.save_pretrained(folder)
    tokenizer.save_pretrained(folder)
    return folder


def exported(model, tokenizer, tmp_path, **options) -> CTranslate2Model:
    export_ctranslate2(save(model, tokenizer, tmp_path / "model"), tmp_path / "ct2", **options)
    return CTranslate2Model.load(tmp_path / "ct2", threads=1)


def generate_ids(model, tokenizer, sentences, num_beams, **settings) -> list[list[int]]:
    """`generate`'s tokens for one batch, without the start token and the padding after `</s>`."""
    batch = tokenizer(sentences, return_tensors="pt", padding=True)
    with torch.no_grad():
        generated = model.generate(**batch, num_beams=num_beams, **settings)
    rows = [row[1:] for row in generated.tolist()]
    return [row[: row.index(EOS) + 1] if EOS in row else row for row in rows]


def ctranslate2_ids(export: CTranslate2Model, sentences, num_beams) -> list[list[int]]:
    """CTranslate2's tokens for the same batch, with `</s>` appended where the length limit stopped it (where
    `generate` forces it)."""
    tokenizer, settings = export.tokenizer, export.generation_config
    sources = tokenizer(sentences)["input_ids"]
    vocabulary = tokenizer.convert_ids_to_tokens(list(range(len(tokenizer))))
    results = export.translator.translate_batch(
        [tokenizer.convert_ids_to_tokens(row) for row in sources],
        max_decoding_length=decoding_length(settings, max(map(len, sources))),
        **decoding_options(settings, vocabulary, beam_size=num_beams),
    )
    rows = [tokenizer.convert_tokens_to_ids(result.hypotheses[0]) for result in results]
    return [row if row[-1:] == [EOS] else [*row, EOS] for row in rows]


@pytest.mark.parametrize("name, overrides", EXPORTABLE, ids=[name for name, _ in EXPORTABLE])
def test_greedy_decoding_with_random_weights_equals_generate_up_to_the_length_limit(
    name, overrides, tokenizer, sentences, tmp_path
):
    model = translation_model(tokenizer, overrides)
    export = exported(model, tokenizer, tmp_path)
    expected = generate_ids(model, tokenizer, sentences, num_beams=1)
    assert ctranslate2_ids(export, sentences, num_beams=1) == expected
    limit = decoding_length(model.generation_config, max(map(len, tokenizer(sentences)["input_ids"]))) + 1
    assert any(len(row) == limit for row in expected), (
        "no row reached the length limit: the limit is untested"
    )


def normalised_score(model, tokenizer, sentence: str, tokens: list[int]) -> float:
    """Beam search's score of a translation: its log-probability divided by length ** length_penalty."""
    source = tokenizer([sentence], return_tensors="pt")
    decoder_input = torch.tensor([[model.config.decoder_start_token_id, *tokens[:-1]]])
    with torch.no_grad():
        log_probs = model(**source, decoder_input_ids=decoder_input).logits.log_softmax(-1)[0]  # (T, V)
    total = log_probs[torch.arange(len(tokens)), torch.tensor(tokens)].sum()
    return float(total) / len(tokens) ** model.generation_config.length_penalty


@pytest.mark.parametrize("name, overrides", EXPORTABLE, ids=[name for name, _ in EXPORTABLE])
def test_beam_4_and_greedy_decoding_of_a_trained_model_equal_generate_where_it_ends_its_translation(
    name, overrides, tokenizer, corpus, base_model, sentences, tmp_path
):
    """Greedy: every row identical. Beam 4, against `generate` with early_stopping=True (CTranslate2 stops at
    4 finished hypotheses, `patience=1`): identical where `generate` ends the translation itself, up to one row
    in eight where float rounding (CTranslate2's kernels are not torch's) breaks a near-tie between candidates
    differently; there CTranslate2's translation must score at least as well. Rows that reach the length limit
    are left out: `generate` forces `</s>` and counts it in the length penalty, CTranslate2 stops without it
    (docs/export.md), so a hypothesis cut by the limit scores lower in CTranslate2 and a translation that
    `generate` ends itself stays the best there too."""
    model = translation_model(tokenizer, overrides)
    model.load_state_dict(
        base_model.state_dict(), strict=False
    )  # the system's own positional parameters stay new
    limit = decoding_length(model.generation_config, max(map(len, tokenizer(sentences)["input_ids"]))) + 1
    for _ in range(MAX_SYSTEM_ROUNDS):
        model = trained(model, tokenizer, corpus, SYSTEM_STEPS)
        expected = generate_ids(model, tokenizer, sentences, num_beams=4, early_stopping=True)
        ended = [row for row, theirs in enumerate(expected) if len(theirs) < limit]
        if len(ended) >= 2:
            break
    assert len(ended) >= 2, "too few translations end before the limit to test beam search"
    export = exported(model, tokenizer, tmp_path)
    assert model.generation_config.num_beams == 4 and model.generation_config.length_penalty == 0.6
    assert ctranslate2_ids(export, sentences, num_beams=1) == generate_ids(model, tokenizer, sentences, 1)
    ours = ctranslate2_ids(export, sentences, num_beams=4)
    differing = [row for row in ended if ours[row] != expected[row]]
    assert len(differing) <= len(sentences) // 8, f"beam-4 translations differ in rows {differing}"
    for row in differing:
        score = normalised_score(model, tokenizer, sentences[row], ours[row])
        assert score >= normalised_score(model, tokenizer, sentences[row], expected[row]) - 1e-4, f"row {row}"


MODULE_FIELDS = (
    "encoder_position_encoding",
    "decoder_position_encoding",
    "encoder_self_attention",
    "decoder_self_attention",
    "cross_attention",
)


@pytest.mark.parametrize(
    "name, overrides", conformance_variants(), ids=[name for name, _ in conformance_variants()]
)
def test_every_module_is_exported_or_refused_naming_it_and_the_missing_ctranslate2_feature(
    name, overrides, tiny_config
):
    config = tiny_config(**overrides)
    reasons = export_refusals(config)
    refused = [
        f"{field}={getattr(config, field)!r}"
        for field in MODULE_FIELDS
        if getattr(config, field) not in (*EXPORTABLE_ENCODINGS.get(field.split("_")[0], ()), "attention")
    ] + (["attention_gating=True"] if config.attention_gating else [])
    if config.sentence_end_token_ids:
        refused.append(f"sentence_end_token_ids={config.sentence_end_token_ids}".replace(" ", ""))
    if config.log_length_scaling:
        refused.append(f"log_length_scaling={list(config.log_length_scaling)}".replace(" ", ""))
    for window in ("attention_window", "cross_attention_window"):
        if getattr(config, window) is not None:
            refused.append(f"{window}={getattr(config, window)}")
    if config.randomized_positions_inference != "plain":
        refused.append(f"randomized_positions_inference={config.randomized_positions_inference!r}")
    if config.rope_scaling is not None:
        refused.append(f"rope_scaling={config.rope_scaling}".replace(" ", ""))
    assert [reason.split(" (")[0].replace(" ", "") for reason in reasons] == refused
    assert all("CTranslate2" in reason for reason in reasons)
    if not reasons:
        check_exportable(config)
        return
    with pytest.raises(ValueError, match="cannot be exported to CTranslate2 exactly") as error:
        check_exportable(config)
    assert all(reason in str(error.value) for reason in reasons)


def test_alibi_is_refused_in_the_encoder_only_because_ctranslate2_s_encoder_spec_has_no_alibi(tiny_config):
    (reason,) = export_refusals(tiny_config(position_encoding="alibi"))
    assert reason.startswith("encoder_position_encoding='alibi'") and "TransformerEncoderSpec" in reason
    assert export_refusals(tiny_config(decoder_position_encoding="alibi")) == []


def test_gating_and_a_non_attention_mixer_are_refused_together_with_their_reasons(tiny_config):
    reasons = export_refusals(tiny_config(attention_gating=True, encoder_self_attention="fourier"))
    assert any(reason.startswith("encoder_self_attention='fourier' (FourierNet)") for reason in reasons)
    assert any(reason.startswith("attention_gating=True") for reason in reasons)


def test_the_quantization_choices_are_ctranslate2_s_own():
    from ctranslate2.specs.model_spec import ACCEPTED_MODEL_TYPES

    assert QUANTIZATIONS == ACCEPTED_MODEL_TYPES


def test_decoding_options_map_the_saved_generation_config(tokenizer):
    settings = translation_model(tokenizer, {}).generation_config
    vocabulary = tokenizer.convert_ids_to_tokens(list(range(len(tokenizer))))
    options = decoding_options(settings, vocabulary)
    assert options["beam_size"] == 4 and options["length_penalty"] == 0.6
    assert options["suppress_sequences"] == [["<pad>"]]  # bad_words_ids: <pad> is never generated
    assert options["return_end_token"] and options["patience"] == 1 and options["min_decoding_length"] == 0
    assert options["max_input_length"] == 0
    assert decoding_length(settings, 12) == 12 + 50 - 1  # generate's last token is the forced </s>
    assert decoding_options(settings, vocabulary, beam_size=1, length_penalty=1.0)["beam_size"] == 1
    with pytest.raises(ValueError, match="beam_size=0 must be at least 1"):
        decoding_options(settings, vocabulary, beam_size=0)


@pytest.fixture(scope="module")
def model_folder(tokenizer, base_model, tmp_path_factory):
    """The trained sinusoidal model saved as train.py saves one."""
    return save(base_model, tokenizer, tmp_path_factory.mktemp("trained") / "model")


def test_the_export_is_self_contained_and_loads_without_the_model_folder(model_folder, tmp_path, sentences):
    output = main([str(model_folder), str(tmp_path / "ct2"), "--quantization", "int8"])
    assert is_ctranslate2_folder(output)
    written = (
        "model.bin",
        "config.json",
        "shared_vocabulary.json",
        "tokenizer.json",
        "generation_config.json",
    )
    for name in (*written, EXPORT_INFO):
        assert (output / name).is_file(), name
    info = json.loads((output / EXPORT_INFO).read_text())
    assert info["quantization"] == "int8" and info["decoder_position_encoding"] == "sinusoidal"
    translations = CTranslate2Model.load(output, threads=1).translate(sentences[:4])
    assert len(translations) == 4 and all(isinstance(text, str) for text in translations)


def test_beams_whose_scores_cannot_fit_in_memory_are_refused_before_ctranslate2_decodes(
    model_folder, tmp_path, sentences, monkeypatch
):
    """The check of `translate` (`check_decoding_memory`), with the export's vocabulary and a batch for each of the
    translator's threads: CTranslate2 would allocate until the kernel killed the process."""
    export = CTranslate2Model.load(main([str(model_folder), str(tmp_path / "ct2")]), threads=1)
    # two threads, each decoding a batch of 2 at once; any decoding would fail on this translator
    monkeypatch.setattr(export, "translator", SimpleNamespace(num_translators=2))
    vocabulary = len(export.tokenizer)
    with pytest.raises(ValueError) as raised:
        export.translate(sentences[:5], beam_size=10**12, batch_size=2)
    assert str(raised.value).startswith(
        f"decoding 4 sentences x {10**12} beams at once (a step's scores: {4 * 10**12} rows x {vocabulary} tokens)"
    )
    assert str(raised.value).endswith("available (cpu): lower batch_size or num_beams")


def test_a_missing_model_folder_and_an_unknown_quantization_are_refused(tmp_path, capsys):
    with pytest.raises(FileNotFoundError, match="MODEL_DIR .* does not exist"):
        main([str(tmp_path / "missing"), str(tmp_path / "out")])
    with pytest.raises(SystemExit) as exit_info:
        main([str(tmp_path), str(tmp_path / "out"), "--quantization", "int4"])
    assert exit_info.value.code == 2
    assert "int8_float32" in capsys.readouterr().err  # argparse lists the allowed choices
    assert not (tmp_path / "out").exists()


def test_a_non_empty_output_folder_is_kept_unless_forced_then_replaced_whole(model_folder, tmp_path):
    output = tmp_path / "ct2"
    output.mkdir()
    (output / "notes.txt").write_text("keep me")
    with pytest.raises(ValueError, match="already exists and holds files.*--force"):
        main([str(model_folder), str(output)])
    assert (output / "notes.txt").read_text() == "keep me"
    main([str(model_folder), str(output), "--force"])
    assert is_ctranslate2_folder(output) and not (output / "notes.txt").exists()
    assert [path.name for path in tmp_path.iterdir()] == ["ct2"]  # no partial or replaced folder left


def test_an_output_inside_the_model_folder_is_refused(model_folder):
    with pytest.raises(ValueError, match="lies inside MODEL_DIR"):
        main([str(model_folder), str(model_folder / "ct2")])


def test_a_model_ctranslate2_cannot_express_is_refused_before_anything_is_written(tokenizer, tmp_path):
    folder = save(
        translation_model(tokenizer, {"position_encoding": "kerple"}), tokenizer, tmp_path / "model"
    )
    with pytest.raises(ValueError, match="decoder_position_encoding='kerple' \\(KERPLE\\)"):
        main([str(folder), str(tmp_path / "ct2")])
    assert not (tmp_path / "ct2").exists()


def test_the_script_reports_a_bad_input_in_one_line_with_exit_code_2(tmp_path):
    done = subprocess.run(
        [sys.executable, str(REPO / "train_scripts" / "export_ctranslate2.py"), str(tmp_path / "no"), "out"],
        capture_output=True,
        text=True,
        cwd=tmp_path,
    )
    assert done.returncode == 2
    assert (
        done.stderr.strip()
        == f"export_ctranslate2.py: error: MODEL_DIR {tmp_path / 'no'} does not exist or is not a folder"
    )


def test_evaluate_translation_scores_an_export_as_it_scores_the_model(model_folder, tmp_path, multi30k_dir):
    source, reference = tmp_path / "test.en", tmp_path / "test.de"
    source.write_text("\n".join(read(multi30k_dir, "val.en.gz", 24)) + "\n")
    reference.write_text("\n".join(read(multi30k_dir, "val.de.gz", 24)) + "\n")
    export = main([str(model_folder), str(tmp_path / "ct2")])
    flags = ["--source", str(source), "--reference", str(reference), "--threads", "1"]
    ours = evaluate_main([str(export), *flags, "--output", str(tmp_path / "ct2.json")])
    theirs = evaluate_main(
        [str(model_folder), *flags, "--precision", "fp32", "--output", str(tmp_path / "hf.json")]
    )
    assert ours["engine"] == "ctranslate2" and ours["scores"] == theirs["scores"]
    assert (export / "evaluation.hyp").read_text() == (model_folder / "evaluation.hyp").read_text()
    with pytest.raises(SystemExit):  # the existing flag checks still apply
        evaluate_main([str(export), *flags, "--num_beams", "0"])
    with pytest.raises(SystemExit):
        evaluate_main([str(export), *flags, "--precision", "bf16"])


def test_translate_ctranslate2_equals_evaluation_translate_on_the_trained_model(model_folder, sentences):
    from hf_posenc.pipeline.evaluation.decoding import load_translation_model

    model, tokenizer = load_translation_model(model_folder)
    export_dir = model_folder.parent / "ct2-translate"
    export_ctranslate2(model_folder, export_dir)
    expected = translate(model, tokenizer, sentences, batch_size=5)
    # one thread, and two threads decoding batches side by side (each translation back in its place)
    for threads in (1, 2):
        torch.set_num_threads(2)
        try:
            export = CTranslate2Model.load(export_dir, threads=threads)
            assert (
                torch.get_num_threads() == 2
            )  # CTranslate2 sets it to its intra-op threads; load restores it
        finally:
            torch.set_num_threads(1)
        assert export.translator.num_translators == threads
        assert export.translate(sentences, batch_size=5) == expected
