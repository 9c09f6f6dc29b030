"""Export a MarianPosEnc model to CTranslate2 and decode the export as `generate` does.

CTranslate2 (github.com/OpenNMT/CTranslate2) runs Marian-family translation models several times faster than
`generate` on a CPU. Its stock `ct2-transformers-converter` fails on our models: its Marian loader drops the
last vocabulary entry as `<pad>` and starts the decoder from a zero vector, while here `<pad>` is id 0, is the
decoder start token and has a trained (tied, non-zero) embedding. This module describes the model to
CTranslate2 itself, through `ctranslate2.specs` (`TransformerSpec` of a post-norm `TransformerEncoderSpec` and
`TransformerDecoderSpec`), with every weight copied, the vocabulary in id order and `<pad>` as the decoder start
token.

Only what CTranslate2 computes exactly as our model does is exported (`export_refusals` says why anything else
is not, module by module):

* `none`, `sinusoidal`, `learned`: the stack's own position table is written out (zeros for `none`: without a
  table CTranslate2 would add its own sinusoids, whose layout is not Marian's);
* `shaw`: `relative_position` with per-layer key and value tables of 2k + 1 rows; CTranslate2 clips j - i to
  [-k, k] and adds q.w^K[r] (scaled like q.k) and the weights summed per distance times w^V (Shaw Eq. 3-5);
* `t5_bias`: `relative_attention_bias` with the stack's one table in every layer, bidirectional buckets in the
  encoder and causal ones in the decoder, added after the 1/sqrt(d_h) scaling (`queries_scale` left at its
  default), its `relative_attention_max_distance` = our `t5_bias_max_distance`;
* `rope`: `rotary_dim=0` (every feature), `rotary_interleave=False` (the "rotate half" pairing we use),
  `rotary_base` = `rope_theta`, positions from 0 in the encoder and the decoding step in the decoder;
* `alibi` in the decoder only: `alibi` with `alibi_use_positive_positions=False`, which adds m_h (j - (k - 1))
  = -m_h (i - j) for the decoding step's query i = k - 1, and `scale_alibi=False` (the bias is added after the
  scaling, as ours). CTranslate2's encoder has no ALiBi option.

Content attention is the only token mixer CTranslate2 has (`MultiHeadAttentionSpec`), without the gating of
paper 2. The tests (tests/pipeline/export/test_ctranslate2.py) check greedy and beam-4 decoding token for token
against `generate` for every exportable module. `translate_ctranslate2` maps the saved generation config onto
`Translator.translate_batch`; docs/export.md lists the mapping and where the two decoders differ.
"""

import argparse
import json
import math
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from types import SimpleNamespace

import torch
from transformers import AutoConfig

from ...base import DECODER, ENCODER, STACKS
from ...generation_length import (
    MATCH_SOURCE_SENTENCE_COUNT,
    WINDOW_SENTENCES,
    WORD_REWARD,
    LengthControl,
    loop_guard_ngram_size,
)
from ...registry import POSITION_ENCODINGS, TOKEN_MIXERS
from ..cli import check_number
from ..evaluation.decoding import check_decoding_memory, check_model_files, load_translation_model
from ..training.averaging import write_whole

EXPORT_INFO = "hf_posenc_export.json"  # what was exported, from which model, with which CTranslate2
CTRANSLATE2_WEIGHTS = "model.bin"  # CTranslate2's weight file: the mark of an exported folder
INSTALL_HINT = "install it with `pip install 'hf_posenc[export]'` (or `pip install ctranslate2`)"
# CTranslate2's weight types (`ctranslate2.specs.model_spec.ACCEPTED_MODEL_TYPES`), kept here so that --help and
# the flag check work before ctranslate2 is imported; a test keeps the two equal.
QUANTIZATIONS = (
    "int8",
    "int8_float32",
    "int8_float16",
    "int8_bfloat16",
    "int16",
    "float16",
    "bfloat16",
    "float32",
)
# Why each decode-time length control (generation_length.py) that CTranslate2 cannot express is refused.
LENGTH_CONTROL_REFUSALS = {
    WORD_REWARD: "CTranslate2 has no per-word reward: translate_batch scores with length_penalty, coverage_penalty "
    "and repetition_penalty only",
    MATCH_SOURCE_SENTENCE_COUNT: "CTranslate2 cannot hold </s> back until a hypothesis holds its source's sentence "
    "ends: its only </s> constraint is one min_decoding_length per batch",
    WINDOW_SENTENCES: "CTranslate2 decodes each input whole: give it the windows of sentences as inputs of their "
    "own and join their translations",
}
# Why each attention window (attention_windows.py) is refused.
WINDOW_REFUSALS = {
    "attention_window": "CTranslate2's sliding window drops the oldest decoder keys, the start token among them, and "
    "has no encoder window",
    "cross_attention_window": "CTranslate2's cross-attention reads the whole source at every step",
}
# config.activation_function -> the name of CTranslate2's `common_spec.Activation` member computing the same
# function (GELU: erf form; GELUTanh: the tanh approximation; SWISH: x * sigmoid(x)).
ACTIVATIONS = {
    "relu": "RELU",
    "gelu": "GELU",
    "gelu_new": "GELUTanh",
    "gelu_pytorch_tanh": "GELUTanh",
    "silu": "SWISH",
    "swish": "SWISH",
}
EXPORTABLE_ENCODINGS = {
    ENCODER: ("none", "sinusoidal", "learned", "shaw", "t5_bias", "rope"),
    DECODER: ("none", "sinusoidal", "learned", "shaw", "t5_bias", "rope", "alibi"),
}
TABLE_ENCODINGS = ("none", "sinusoidal", "learned")  # written as a position table added to the embeddings
# Why each position encoding that CTranslate2 cannot express is refused: the missing CTranslate2 feature.
ENCODING_REFUSALS = {
    "rpe_head": "its recurrent positional embeddings run an RNN over the embeddings (Chen et al. 2019 Eq. 6); "
    "CTranslate2's Transformer specs have no recurrent layer",
    "mpr_head": "its recurrent positional embeddings run an RNN over the embeddings (Chen et al. 2019 Eq. 6); "
    "CTranslate2's Transformer specs have no recurrent layer",
    "posnet_embed": "its positional kernels multiply each position's embedding by a learned matrix (paper 1 Eq. "
    "24); CTranslate2 can only add a position vector (PositionEncoderSpec)",
    "posnet_attn": "its positional kernels transform every value by a per-position matrix (paper 1 Eq. 20/23); "
    "CTranslate2's MultiHeadAttentionSpec has no value transform",
    "adaptive_t5": "its bias is a per-head MLP of soft buckets (Wu et al. 2021); CTranslate2's "
    "relative_attention_bias is T5's table over fixed logarithmic buckets",
    "fire": "its bias is an MLP of the log-normalised distance (Li et al. 2024); CTranslate2 has no learned "
    "function of the distance, only T5's bucket table",
    "kerple": "its bias is a learned kernel -r1 log(1 + r2 |i - j|) or -r1 |i - j|^r2 (Chi et al. 2022); "
    "CTranslate2 has no such bias, only T5's bucket table and ALiBi's linear one",
    "alibi": "CTranslate2's TransformerEncoderSpec has no ALiBi option (only TransformerDecoderSpec has "
    "`alibi`), so a bidirectional ALiBi encoder cannot be expressed",
}
MIXER_REFUSAL = (
    "CTranslate2's MultiHeadAttentionSpec is content attention softmax(QK^T/sqrt(d_h))V only; it cannot mix "
    "tokens with {title} weights"
)


def require_ctranslate2():
    """The `ctranslate2` module, or a ModuleNotFoundError saying how to install it (an optional dependency); it
    names the missing module, so that a console command names the extra to install (`cli.run_cli`)."""
    try:
        import ctranslate2
    except ModuleNotFoundError as error:
        raise ModuleNotFoundError(f"ctranslate2 is not installed: {INSTALL_HINT}", name=error.name) from error
    return ctranslate2


def export_refusals(config) -> list[str]:
    """Every reason why CTranslate2 cannot compute `config`'s model exactly as `generate` does, one sentence
    each naming the config field, its value and the CTranslate2 feature it would need; [] when it can."""
    reasons = []
    for stack in STACKS:
        field = f"{stack}_position_encoding"
        name = getattr(config, field)
        if name not in EXPORTABLE_ENCODINGS[stack]:
            why = ENCODING_REFUSALS.get(name, "no CTranslate2 mapping is written for it")
            reasons.append(f"{field}={name!r} ({POSITION_ENCODINGS[name].title}): {why}")
    for site in ("encoder_self_attention", "decoder_self_attention", "cross_attention"):
        mixer = getattr(config, site)
        if mixer != "attention":
            title = TOKEN_MIXERS[mixer].title
            reasons.append(f"{site}={mixer!r} ({title}): {MIXER_REFUSAL.format(title=title)}")
    if getattr(config, "attention_gating", False):
        reasons.append(
            "attention_gating=True (paper 2 Eq. 4): CTranslate2's attention has no GELU gate on its output "
            "nor LayerNorm on its values"
        )
    if config.sentence_end_token_ids:
        reasons.append(
            f"sentence_end_token_ids={config.sentence_end_token_ids} (sentence-aware positions): positions restart "
            "at each sentence end and the sentence index adds a learned row or a cross-attention bias; CTranslate2 "
            "takes positions from the token index and has neither"
        )
    if config.log_length_scaling:
        reasons.append(
            f"log_length_scaling={list(config.log_length_scaling)} (length-aware attention): CTranslate2 scales "
            "attention logits by a constant, not by the log of each query's key count"
        )
    for field, why in WINDOW_REFUSALS.items():
        if getattr(config, field) is not None:
            reasons.append(f"{field}={getattr(config, field)} (attention windows): {why}")
    if config.randomized_positions_inference != "plain":
        reasons.append(
            f"randomized_positions_inference={config.randomized_positions_inference!r} (randomized positions at "
            "the training draw's expected positions): CTranslate2 takes positions from the token index"
        )
    if config.rope_scaling is not None:
        reasons.append(
            f"rope_scaling={config.rope_scaling} (RoPE scaling at inference): no CTranslate2 mapping is written for "
            "it (export the model without rope_scaling)"
        )
    if config.activation_function not in ACTIVATIONS:
        reasons.append(
            f"activation_function={config.activation_function!r}: CTranslate2 computes "
            f"{', '.join(sorted(ACTIVATIONS))} exactly, not this one"
        )
    return reasons


def check_exportable(config) -> None:
    """Raise a ValueError listing every `export_refusals` reason; nothing when the model can be exported."""
    reasons = export_refusals(config)
    if reasons:
        raise ValueError(
            "this model cannot be exported to CTranslate2 exactly: "
            + "; ".join(reasons)
            + ". Exportable: position encodings "
            + ", ".join(EXPORTABLE_ENCODINGS[DECODER])
            + " (alibi in the decoder only) with content attention ('attention', no gating) at every site."
        )


def as_array(tensor: torch.Tensor):
    return tensor.detach().to(torch.float32).cpu().numpy()


def set_linear(spec, *layers: torch.nn.Linear) -> None:
    """One CTranslate2 linear from one or more of ours stacked on the output axis (fused Q/K/V, fused K/V)."""
    spec.weight = as_array(torch.cat([layer.weight for layer in layers]))
    spec.bias = as_array(torch.cat([layer.bias for layer in layers]))


def set_layer_norm(spec, norm: torch.nn.LayerNorm) -> None:
    spec.gamma = as_array(norm.weight)
    spec.beta = as_array(norm.bias)


def set_attention(spec, attention, fused: bool) -> None:
    """Self-attention (`fused`: one Q|K|V projection) or cross-attention (Q, then K|V) and the output projection."""
    if fused:
        set_linear(spec.linear[0], attention.q_proj, attention.k_proj, attention.v_proj)
    else:
        set_linear(spec.linear[0], attention.q_proj)
        set_linear(spec.linear[1], attention.k_proj, attention.v_proj)
    set_linear(spec.linear[-1], attention.out_proj)


def set_position_encoding(spec, stack, name: str, max_positions: int, d_model: int) -> None:
    """The stack's positions: an additive table, or the relative tables of each self-attention layer."""
    encoding = stack.position_encoding
    if name in TABLE_ENCODINGS:
        table = {
            "none": lambda: torch.zeros(max_positions, d_model),
            "sinusoidal": lambda: encoding.table,
            "learned": lambda: encoding.weight,
        }[name]()
        spec.position_encodings.encodings = as_array(table)  # (L_max, D)
    for layer_idx, layer_spec in enumerate(spec.layer):
        attention = layer_spec.self_attention
        if name == "shaw":
            attention.relative_position_keys = as_array(encoding.key_tables[layer_idx])  # (2k+1, Dh)
            attention.relative_position_values = as_array(encoding.value_tables[layer_idx])  # (2k+1, Dh)
        elif name == "t5_bias":
            attention.relative_attention_bias = as_array(encoding.table)  # (buckets, H), every layer
            attention.relative_attention_max_distance = torch.tensor(
                encoding.max_distance, dtype=torch.int32
            ).numpy()


def stack_options(name: str, config) -> dict:
    """The keyword arguments of CTranslate2's encoder/decoder spec for the stack's position encoding."""
    options = {"relative_position": name == "shaw", "relative_attention_bias": name == "t5_bias"}
    if name == "rope":
        options.update(rotary_dim=0, rotary_interleave=False, rotary_base=config.rope_theta)
    if name == "alibi":
        options.update(alibi=True, alibi_use_positive_positions=False, scale_alibi=False)
    return options


def layer_norm_epsilon(model) -> float:
    """The one epsilon of every LayerNorm of the model (CTranslate2 takes a single value)."""
    epsilons = {module.eps for module in model.modules() if isinstance(module, torch.nn.LayerNorm)}
    if len(epsilons) != 1:
        raise ValueError(
            f"the model's LayerNorms use different epsilons {sorted(epsilons)}; CTranslate2 has one"
        )
    return epsilons.pop()


def vocabulary(tokenizer, vocab_size: int) -> list[str]:
    """The tokens in id order, as many as the model's vocabulary (the embedding rows)."""
    tokens = tokenizer.convert_ids_to_tokens(list(range(min(len(tokenizer), vocab_size))))
    if len(tokens) != vocab_size or len(set(tokens)) != vocab_size:
        raise ValueError(
            f"the tokenizer has {len(tokenizer)} tokens for the model's vocab_size={vocab_size}: CTranslate2 "
            "maps tokens to embedding rows by position, so the two must be the same, one distinct token per id"
        )
    return tokens


def build_spec(model, tokenizer):
    """The `ctranslate2.specs.TransformerSpec` of a MarianPosEnc translation model, with all its weights."""
    require_ctranslate2()
    from ctranslate2.specs import common_spec, transformer_spec

    config = model.config
    check_exportable(config)
    activation = getattr(common_spec.Activation, ACTIVATIONS[config.activation_function])
    encoder_name, decoder_name = config.encoder_position_encoding, config.decoder_position_encoding
    encoder_spec = transformer_spec.TransformerEncoderSpec(
        config.encoder_layers,
        config.encoder_attention_heads,
        pre_norm=False,  # Marian is post-norm: x = LN(x + sublayer(x))
        activation=activation,
        **stack_options(encoder_name, config),
    )
    decoder_spec = transformer_spec.TransformerDecoderSpec(
        config.decoder_layers,
        config.decoder_attention_heads,
        pre_norm=False,
        activation=activation,
        **stack_options(decoder_name, config),
    )
    marian = model.model
    embeddings = as_array(marian.shared.weight)  # (V, D), tied: encoder, decoder and output layer
    for spec, stack, name in (
        (encoder_spec, marian.encoder, encoder_name),
        (decoder_spec, marian.decoder, decoder_name),
    ):
        (spec.embeddings[0] if isinstance(spec.embeddings, list) else spec.embeddings).weight = embeddings
        spec.scale_embeddings = bool(config.scale_embedding)  # True: times sqrt(d_model), as embed_scale
        set_position_encoding(spec, stack, name, config.max_position_embeddings, config.d_model)
        for layer_spec, layer in zip(spec.layer, stack.layers, strict=True):
            set_attention(layer_spec.self_attention, layer.self_attn, fused=True)
            set_layer_norm(layer_spec.self_attention.layer_norm, layer.self_attn_layer_norm)
            if stack is marian.decoder:
                set_attention(layer_spec.attention, layer.encoder_attn, fused=False)
                set_layer_norm(layer_spec.attention.layer_norm, layer.encoder_attn_layer_norm)
            set_linear(layer_spec.ffn.linear_0, layer.fc1)
            set_linear(layer_spec.ffn.linear_1, layer.fc2)
            set_layer_norm(layer_spec.ffn.layer_norm, layer.final_layer_norm)
    decoder_spec.projection.weight = as_array(model.lm_head.weight)
    decoder_spec.projection.bias = as_array(model.final_logits_bias[0])  # Marian's logits bias
    spec = transformer_spec.TransformerSpec(encoder_spec, decoder_spec)

    tokens = vocabulary(tokenizer, config.vocab_size)
    spec.register_source_vocabulary(tokens)
    spec.register_target_vocabulary(tokens)
    start = tokens[config.decoder_start_token_id]  # `<pad>`, id 0: the decoder starts from its embedding
    spec.config.decoder_start_token = start
    spec.config.bos_token = start
    spec.config.eos_token = tokens[config.eos_token_id]
    spec.config.unk_token = tokenizer.unk_token
    spec.config.layer_norm_epsilon = layer_norm_epsilon(model)
    spec.validate()
    return spec


def check_output_folder(output_dir: Path, model_dir: Path, force: bool) -> None:
    """Refuse, before any work, an output that is a file, the model folder itself or one inside it, and an
    existing non-empty folder without `force`."""
    if output_dir.exists() and not output_dir.is_dir():
        raise ValueError(f"OUTPUT_DIR {output_dir} is a file, not a folder; give a new folder")
    resolved, model = output_dir.resolve(), model_dir.resolve()
    if resolved == model or model in resolved.parents or resolved in model.parents:
        raise ValueError(
            f"OUTPUT_DIR {output_dir} is, holds or lies inside MODEL_DIR {model_dir}; give a separate folder"
        )
    if output_dir.is_dir() and any(output_dir.iterdir()) and not force:
        raise ValueError(
            f"OUTPUT_DIR {output_dir} already exists and holds files; give a new folder, or --force to replace "
            "it whole (it is swapped for the new export only once that is complete)"
        )


def export_ctranslate2(model_dir, output_dir, quantization: str | None = None, force: bool = False) -> Path:
    """Write `model_dir`'s model as a self-contained CTranslate2 folder: the CTranslate2 model (model.bin,
    config.json, shared_vocabulary.json), the tokenizer, the generation config and `hf_posenc_export.json`.

    `quantization` is one of `QUANTIZATIONS` (None: float32 weights, as saved). The folder is written beside
    `output_dir` and renamed into place (`write_whole`), so an existing folder replaced with `force` survives a
    failed export. CTranslate2's own `Converter.convert` would delete an existing output folder first; the spec
    is validated, quantized and saved here directly instead.
    """
    require_ctranslate2()  # before any work
    model_dir, output_dir = Path(model_dir), Path(output_dir)
    if not model_dir.is_dir():
        raise FileNotFoundError(f"MODEL_DIR {model_dir} does not exist or is not a folder")
    if is_ctranslate2_folder(model_dir):
        info = model_dir / EXPORT_INFO
        source = json.loads(info.read_text()).get("source_model") if info.is_file() else None
        raise ValueError(
            f"MODEL_DIR {model_dir} is already a CTranslate2 export (it holds {CTRANSLATE2_WEIGHTS}); export the "
            f"model folder it came from{f' ({source})' if source else ''}, or decode this one as it is"
        )
    if quantization is not None and quantization not in QUANTIZATIONS:
        raise ValueError(f"--quantization={quantization!r} is not known; allowed: {', '.join(QUANTIZATIONS)}")
    check_output_folder(output_dir, model_dir, force)
    check_model_files(model_dir)  # a readable config.json of a known model type, weights and a tokenizer
    # refused from the config alone, before the weights are read
    check_exportable(AutoConfig.from_pretrained(model_dir))
    model, tokenizer = load_translation_model(model_dir)
    check_exportable(model.config)
    length_control_for_ctranslate2(model.generation_config, None, len(tokenizer))
    model = model.float().eval()
    spec = build_spec(model, tokenizer)
    spec.optimize(quantization=quantization)
    with write_whole(output_dir) as folder:
        spec.save(str(folder))
        tokenizer.save_pretrained(folder)
        model.generation_config.save_pretrained(folder)
        info = {
            "source_model": str(model_dir.resolve()),
            "encoder_position_encoding": model.config.encoder_position_encoding,
            "decoder_position_encoding": model.config.decoder_position_encoding,
            "quantization": quantization or "float32",
            "ctranslate2_version": require_ctranslate2().__version__,
            "model_config": model.config.to_dict(),
        }
        (folder / EXPORT_INFO).write_text(json.dumps(info, indent=2, default=str) + "\n")
    return output_dir


def is_ctranslate2_folder(folder) -> bool:
    """Whether `folder` holds a CTranslate2 model (its weight file), e.g. one `export_ctranslate2` wrote."""
    return (Path(folder) / CTRANSLATE2_WEIGHTS).is_file()


def length_control_for_ctranslate2(
    generation_config, overrides: dict | None, vocab_size: int
) -> LengthControl:
    """The decode-time length control of `generation_config` with `overrides` (generation_length.py's keys, as
    `generate` takes them), checked as `generate` checks it; a `word_reward` or `match_source_sentence_count`,
    which CTranslate2 cannot express, is refused with `LENGTH_CONTROL_REFUSALS`' reason."""
    control = LengthControl.from_settings(
        generation_config, dict(overrides or {}), SimpleNamespace(vocab_size=vocab_size)
    )
    refused = [
        f"{key}={getattr(control, key)!r} ({reason})"
        for key, reason in LENGTH_CONTROL_REFUSALS.items()
        if getattr(control, key) not in (None, False)
    ]
    if refused:
        raise ValueError(
            "CTranslate2 cannot decode with the length control "
            + "; ".join(refused)
            + ". Turn it off (None / False in generation_config.json, or the evaluate flag) or decode with generate"
        )
    return control


def min_decoding_length(control: LengthControl, minimum: int, source_length: int) -> int:
    """CTranslate2's `min_decoding_length` for one source of `source_length` tokens (`</s>` included): the
    larger of the generation config's `minimum` and ⌈r·|x|⌉ - 1 for `min_length_ratio` r (`generate` lets `</s>`
    be the ⌈r·|x|⌉-th token; CTranslate2's minimum, like `min_new_tokens`, counts the tokens before it)."""
    if control.min_length_ratio is None:
        return minimum
    return max(minimum, math.ceil(source_length * control.min_length_ratio) - 1)


def decoding_options(
    generation_config, tokens: Sequence[str], beam_size=None, length_penalty=None, length_control=None
) -> dict:
    """`Translator.translate_batch` options that decode as `generate` does with `generation_config`, except
    `max_decoding_length` (per batch: `decoding_length`) and, with `min_length_ratio`, `min_decoding_length` (per
    source: `min_decoding_length`). `beam_size` / `length_penalty` override the saved values, `length_control`
    (a dict of generation_length.py's keys and `no_repeat_ngram_size`) the saved length control, whose loop
    guard is mapped and the rest refused by `length_control_for_ctranslate2`. docs/export.md has the table; the
    differences that remain are in beam search only:

    * CTranslate2 stops a sentence once `beam_size` hypotheses have finished (`patience=1`), as `generate` does
      with `early_stopping=True`; our saved config has transformers' default `early_stopping=False`, whose
      heuristic may go on while a running beam could still beat the worst finished one.
    * At the length limit `generate` forces `</s>` (forced_eos_token_id): those hypotheses end in `</s>` scored
      0 and are one token longer for the length penalty than CTranslate2's, which end without it.
    """
    if generation_config.do_sample:
        raise ValueError(
            "the generation config samples (do_sample=True); translate_ctranslate2 maps deterministic search "
            "only (greedy or beam)"
        )
    beams = beam_size if beam_size is not None else generation_config.num_beams or 1
    check_number("beam_size", beams, minimum=1, integer=True)
    penalty = length_penalty if length_penalty is not None else generation_config.length_penalty
    check_number("length_penalty", penalty)
    min_new = generation_config.min_new_tokens
    if min_new is None:  # min_length counts the decoder start token in an encoder-decoder model
        min_new = max((generation_config.min_length or 0) - 1, 0)
    overrides = dict(length_control or {})
    ngram = overrides.pop("no_repeat_ngram_size", generation_config.no_repeat_ngram_size)
    control = length_control_for_ctranslate2(generation_config, overrides, len(tokens))
    return {
        "beam_size": beams,
        "length_penalty": penalty,  # score / length ** penalty, the length counting </s>, as in generate
        "patience": 1,  # stop at beam_size finished hypotheses (generate's early_stopping=True)
        "return_end_token": True,  # keeps </s> in the length the penalty divides by; removed afterwards
        "suppress_sequences": [
            [tokens[token_id] for token_id in sequence] for sequence in generation_config.bad_words_ids or []
        ],
        "min_decoding_length": min_new,
        "no_repeat_ngram_size": loop_guard_ngram_size(control, ngram) or 0,
        "repetition_penalty": generation_config.repetition_penalty or 1.0,
        "max_input_length": 0,  # no truncation: generate does not truncate either
    }


def decoding_length(generation_config, source_length: int) -> int:
    """CTranslate2's `max_decoding_length` for a batch whose longest source has `source_length` tokens.

    `generate` allows max_new_tokens = source length + `max_new_tokens_over_source` (the padded batch's length,
    `MarianPosEncForConditionalGeneration.generate`) and, with `forced_eos_token_id`, forces `</s>` as the last
    of them; CTranslate2 stops after `max_decoding_length` tokens without forcing anything, so it gets one token
    fewer: the same text (`</s>` is a special token, which decoding drops).
    """
    over_source = getattr(generation_config, "max_new_tokens_over_source", None)
    if over_source is not None:
        limit = source_length + over_source
    elif generation_config.max_new_tokens is not None:
        limit = generation_config.max_new_tokens
    else:  # max_length counts the decoder start token
        limit = generation_config.max_length - 1
    return limit - 1 if generation_config.forced_eos_token_id is not None else limit


@dataclass
class CTranslate2Model:
    """A loaded export: the `ctranslate2.Translator`, the tokenizer and the generation config saved with it."""

    translator: object
    tokenizer: object
    generation_config: object

    @classmethod
    def load(cls, folder, threads: int | None = None, compute_type: str = "default") -> "CTranslate2Model":
        """Load an exported folder on the CPU with `threads` threads (None: torch's thread count), each decoding
        whole batches of its own (CTranslate2's `inter_threads`, one intra-op thread each): at d256, two threads
        on one batch decode no faster than one (docs/export.md). `compute_type` "default" computes in the type
        the weights were exported in."""
        from transformers import AutoTokenizer, GenerationConfig

        ctranslate2 = require_ctranslate2()
        folder = Path(folder)
        if not is_ctranslate2_folder(folder):
            raise FileNotFoundError(
                f"{folder} holds no CTranslate2 model ({CTRANSLATE2_WEIGHTS}); write one with "
                "train_scripts/export_ctranslate2.py MODEL_DIR OUTPUT_DIR"
            )
        if not (folder / "tokenizer.json").is_file() or not (folder / "generation_config.json").is_file():
            raise ValueError(
                f"{folder} lacks tokenizer.json or generation_config.json: export it again with "
                "train_scripts/export_ctranslate2.py, which writes both beside the CTranslate2 model"
            )
        torch_threads = torch.get_num_threads()
        threads = threads if threads is not None else torch_threads
        check_number("threads", threads, minimum=1, integer=True)
        translator = ctranslate2.Translator(
            str(folder), device="cpu", compute_type=compute_type, inter_threads=threads, intra_threads=1
        )
        # CTranslate2 sets the calling thread's OpenMP thread count to intra_threads, which is torch's on the CPU:
        # torch's own decoding in this process would run on one thread from here on
        torch.set_num_threads(torch_threads)
        return cls(
            translator, AutoTokenizer.from_pretrained(folder), GenerationConfig.from_pretrained(folder)
        )

    def translate(
        self,
        sentences: Sequence[str],
        beam_size=None,
        length_penalty=None,
        batch_size: int = 64,
        length_control: dict | None = None,
    ) -> list[str]:
        """Translate in the batches `evaluation.translate` makes (sorted by length, `batch_size` sentences), so
        each batch gets the length limit `generate` gives it; outputs in the input order. Every batch is queued at
        once, and the translator's threads decode them side by side. `length_control`
        overrides the saved length control (`decoding_options`); with `min_length_ratio`, the sources of a batch
        that need the same minimum length are decoded together (CTranslate2 takes one per call)."""
        check_number("batch_size", batch_size, minimum=1, integer=True)
        tokens = self.tokenizer.convert_ids_to_tokens(list(range(len(self.tokenizer))))
        options = decoding_options(self.generation_config, tokens, beam_size, length_penalty, length_control)
        control = length_control_for_ctranslate2(self.generation_config, length_control, len(tokens))
        minimum = options.pop("min_decoding_length")
        at_once = min(batch_size * self.translator.num_translators, len(sentences))  # one batch a thread
        check_decoding_memory(at_once, options["beam_size"], len(tokens), "cpu")
        order = sorted(range(len(sentences)), key=lambda i: len(sentences[i]))
        outputs, queued = [None] * len(sentences), []
        for start in range(0, len(order), batch_size):
            indices = order[start : start + batch_size]
            ids = dict(
                zip(indices, self.tokenizer([sentences[i] for i in indices])["input_ids"], strict=True)
            )
            limit = decoding_length(self.generation_config, max(map(len, ids.values())))
            groups = {}  # min_decoding_length -> the batch's sentences that need it
            for index, row in ids.items():
                groups.setdefault(min_decoding_length(control, minimum, len(row)), []).append(index)
            for group_minimum, group in groups.items():
                results = self.translator.translate_batch(
                    [self.tokenizer.convert_ids_to_tokens(ids[i]) for i in group],
                    max_decoding_length=limit,
                    min_decoding_length=group_minimum,
                    asynchronous=True,
                    **options,
                )
                queued.append((group, results))
        for group, results in queued:
            for index, result in zip(group, results, strict=True):
                outputs[index] = self.decode(result.result().hypotheses[0])
        return outputs

    def decode(self, hypothesis: list[str]) -> str:
        """The text of a hypothesis's tokens, without the `</s>` that `return_end_token` keeps."""
        if hypothesis and hypothesis[-1] == self.tokenizer.convert_ids_to_tokens(
            self.generation_config.eos_token_id
        ):
            hypothesis = hypothesis[:-1]
        return self.tokenizer.decode(
            self.tokenizer.convert_tokens_to_ids(hypothesis), skip_special_tokens=True
        )


def translate_ctranslate2(
    folder,
    sentences: Sequence[str],
    beam_size: int | None = None,
    length_penalty: float | None = None,
    batch_size: int = 64,
    threads: int | None = None,
    compute_type: str = "default",
    length_control: dict | None = None,
) -> list[str]:
    """Translate `sentences` with an exported folder, decoding with its saved generation config as `generate`
    does (`decoding_options`); `beam_size` / `length_penalty` / `length_control` override the saved values."""
    model = CTranslate2Model.load(folder, threads=threads, compute_type=compute_type)
    return model.translate(
        sentences,
        beam_size=beam_size,
        length_penalty=length_penalty,
        batch_size=batch_size,
        length_control=length_control,
    )


HELP = """Export a MarianPosEnc model folder to CTranslate2, self-contained (model, tokenizer, generation config).

    hf-posenc-export outputs/run outputs/run-ct2
    hf-posenc-export outputs/run outputs/run-ct2-int8 --quantization int8

Needs the [export] extra (CTranslate2): pip install 'hf_posenc[export]'.

Exportable: position encodings none, sinusoidal, learned, shaw, t5_bias, rope (either stack) and alibi (decoder
only), with content attention at every site; anything else is refused with the reason (docs/export.md).
OUTPUT_DIR must be new or empty unless --force; then it is replaced whole once the export is complete.
Score the export with hf-posenc-evaluate OUTPUT_DIR --source ... --reference ...
"""


def main(argv=None) -> Path:
    parser = argparse.ArgumentParser(description=HELP, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("model_dir", metavar="MODEL_DIR", help="a model folder written by train.py")
    parser.add_argument("output_dir", metavar="OUTPUT_DIR", help="a new folder for the CTranslate2 model")
    parser.add_argument(
        "--quantization",
        choices=QUANTIZATIONS,
        default=None,
        help="weight type (default: float32, as trained); int8 is the fast CPU choice",
    )
    parser.add_argument(
        "--force", action="store_true", help="replace an OUTPUT_DIR that holds files (the whole folder)"
    )
    args = parser.parse_args(argv)
    output = export_ctranslate2(args.model_dir, args.output_dir, args.quantization, force=args.force)
    print(f"exported {args.model_dir} -> {output} ({args.quantization or 'float32'} weights)")
    return output
