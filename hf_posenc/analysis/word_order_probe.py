"""Word-order probe of paper 1 (Zhang et al., ACL 2023, Section 3.1): how much does a model see word order?

Without positional information, self-attention is permutation-equivariant: permuting the input rows permutes
the output rows, Enc(PX) = P Enc(X) (Eq. 9). Position encodings, and the weight concatenation / positional
kernels of Eq. 10–17, break this (Eq. 13). The probe permutes the *words* of source sentences (each word
keeps its subword tokens together, end-of-sentence stays last) with random shuffles and with swaps of two
neighbouring words, and reports

* the equivariance gap ‖Enc(PX) − P Enc(X)‖_F / ‖Enc(X)‖_F of the encoder output over the real tokens,
  averaged over sentences and permutations (0 for an order-blind encoder);
* sacreBLEU of the translations of the permuted sources against the translations of the original sources
  (100 when the model translates a bag of words the same whatever its order).

    python -m hf_posenc.analysis.word_order_probe MODEL_DIR --source sentences.txt --permutations 5 --seed 0

Translations go through `hf_posenc.pipeline.evaluation.scoring.translate` with the model's saved generation config
(beam 4, length penalty 0.6, source length + 50 new tokens) unless `--num_beams` / `--max_new_tokens` (or the
API's `generate_kwargs`) override it, and are scored with its `score_translations`. They decode under
`--precision` (auto: bf16 autocast where it is measurably faster on this machine, see
`hf_posenc.pipeline.training.hardware.choose_precision`); the equivariance gap is always computed in fp32, where bf16
rounding would hide a small gap. A sentence of fewer than two words has no other order: it is left out, with a
warning.
"""

import argparse
import json
import logging
import random
from dataclasses import asdict, dataclass
from pathlib import Path

import torch

from ..pipeline.cli import check_number, run_cli
from ..pipeline.data.files import read_lines
from ..pipeline.evaluation.decoding import load_translation_model, translate
from ..pipeline.evaluation.scoring import score_translations
from ..pipeline.training.hardware import choose_precision

PERMUTATION_KINDS = ("shuffle", "local_swap")
logger = logging.getLogger(__name__)


@dataclass
class WordOrderProbeResult:
    kind: str
    sentences: int
    permutations_per_sentence: int
    equivariance_gap: float  # mean relative Frobenius gap of Eq. 9 over sentences and permutations
    bleu_vs_original: float  # sacreBLEU of permuted-source translations against original translations


def word_permutation(num_words: int, kind: str, rng: random.Random) -> list[int]:
    """A non-identity order of `num_words` words (identity only when there is a single word)."""
    order = list(range(num_words))
    if num_words < 2:
        return order
    if kind == "local_swap":
        left = rng.randrange(num_words - 1)
        order[left], order[left + 1] = order[left + 1], order[left]
    elif kind == "shuffle":
        while order == sorted(order):
            rng.shuffle(order)
    else:
        raise ValueError(f"kind={kind!r} is not known; allowed values: {', '.join(PERMUTATION_KINDS)}.")
    return order


def token_permutation(word_ids: list[int | None], word_order: list[int]) -> list[int]:
    """Token indices that put whole words in `word_order`; tokens outside words (specials) keep their place."""
    tokens_of_word: dict[int, list[int]] = {}
    for index, word in enumerate(word_ids):
        if word is not None:
            tokens_of_word.setdefault(word, []).append(index)
    words = sorted(tokens_of_word)
    reordered = iter([index for position in word_order for index in tokens_of_word[words[position]]])
    return [index if word is None else next(reordered) for index, word in enumerate(word_ids)]


@torch.no_grad()
def equivariance_gap(encoder, input_ids: torch.Tensor, permutation: torch.Tensor) -> float:
    """‖Enc(PX) − P Enc(X)‖_F / ‖Enc(X)‖_F for one unpadded sequence (1, L) and a permutation (L,) (Eq. 9/13)."""
    states = encoder(input_ids=input_ids).last_hidden_state[0]  # (L, D)
    permuted_states = encoder(input_ids=input_ids[:, permutation]).last_hidden_state[0]  # (L, D)
    return float((permuted_states - states[permutation]).norm() / states.norm())


def word_order_probe(
    model,
    tokenizer,
    sentences: list[str],
    num_permutations: int = 5,
    seed: int = 0,
    kinds=PERMUTATION_KINDS,
    batch_size: int = 32,
    bf16: bool = False,
    **generate_kwargs,
) -> list[WordOrderProbeResult]:
    """Equivariance gap and BLEU-vs-original for each kind of word permutation (see the module docstring).

    `generate_kwargs` override the model's saved generation config in `model.generate` (e.g. num_beams=1,
    max_new_tokens=64); `bf16` decodes under bf16 autocast (the gap stays fp32). Sentences of fewer than two
    words are left out (a warning counts them); no sentence left, no kind, or fewer than one permutation is an
    error.
    """
    check_probe_settings(num_permutations, batch_size, kinds)
    encodings = reorderable_sentences(tokenizer, sentences)
    model.eval()
    decode = {"batch_size": batch_size, "bf16": bf16, **generate_kwargs}
    originals = translate(model, tokenizer, [encoding["input_ids"] for encoding in encodings], **decode)
    return [
        probe_kind(
            model, tokenizer, encodings, originals, kind, num_permutations, random.Random(seed), decode
        )
        for kind in kinds
    ]


def check_probe_settings(num_permutations: int, batch_size: int, kinds) -> None:
    check_number("num_permutations", num_permutations, minimum=1, integer=True)
    check_number("batch_size", batch_size, minimum=1, integer=True)
    unknown = [kind for kind in kinds if kind not in PERMUTATION_KINDS]
    if not kinds or unknown:
        raise ValueError(
            f"kinds={list(kinds)!r}: give one or more of {', '.join(PERMUTATION_KINDS)}"
            + (f" ({', '.join(map(repr, unknown))} is not known)" if unknown else "")
        )


def count_words(encoding) -> int:
    return len({word for word in encoding.word_ids() if word is not None})


def reorderable_sentences(tokenizer, sentences: list[str]) -> list:
    """The tokenised sentences of two or more words; a warning counts those left out, none left is an error."""
    encodings = [tokenizer(sentence) for sentence in sentences]
    words = [count_words(encoding) for encoding in encodings]
    one_word = sum(count < 2 for count in words)
    if one_word:
        logger.warning(
            "leaving out %d of %d sentences of fewer than two words (no permutation changes them)",
            one_word,
            len(sentences),
        )
    encodings = [encoding for encoding, count in zip(encodings, words, strict=True) if count >= 2]
    if not encodings:
        raise ValueError(
            f"the word-order probe got {len(sentences)} source sentences, none of two or more words: "
            "give sentences whose words can be reordered"
        )
    return encodings


def probe_kind(
    model, tokenizer, encodings, originals: list[str], kind: str, num_permutations: int, rng, decode: dict
) -> WordOrderProbeResult:
    """One kind of permutation: `num_permutations` of each sentence, drawn from `rng`; the encoder's mean
    equivariance gap over them, and the BLEU of their translations against the original's translation."""
    encoder = model.get_encoder()
    gaps, permuted_sources, references = [], [], []
    for encoding, original in zip(encodings, originals, strict=True):
        word_ids = encoding.word_ids()
        ids = torch.tensor([encoding["input_ids"]], device=model.device)
        for _ in range(num_permutations):
            order = token_permutation(word_ids, word_permutation(count_words(encoding), kind, rng))
            gaps.append(equivariance_gap(encoder, ids, torch.tensor(order, device=model.device)))
            permuted_sources.append([encoding["input_ids"][index] for index in order])
            references.append(original)
    translations = translate(model, tokenizer, permuted_sources, **decode)
    return WordOrderProbeResult(
        kind=kind,
        sentences=len(encodings),
        permutations_per_sentence=num_permutations,
        equivariance_gap=sum(gaps) / len(gaps),
        bleu_vs_original=score_translations(translations, references)["bleu"],
    )


def read_sentences(args) -> list[str]:
    """The non-blank source sentences of `--source` or `--sentences`; none is an error naming where from."""
    lines = read_lines(args.source) if args.source is not None else args.sentences
    sentences = [line.strip() for line in lines if line.strip()]
    if not sentences:
        where = f"--source {args.source}" if args.source is not None else "--sentences"
        raise ValueError(f"{where} holds no sentence (only blank lines); the probe needs source sentences")
    return sentences


def main(argv=None):
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("model", help="folder with a saved model and its tokenizer")
    sources = parser.add_mutually_exclusive_group(required=True)
    sources.add_argument("--source", type=Path, help="text file, one source sentence per line (.gz ok)")
    sources.add_argument("--sentences", nargs="+", help="source sentences on the command line")
    parser.add_argument("--max_sentences", type=int, default=200, help="use only the first N sentences")
    parser.add_argument("--permutations", type=int, default=5, help="permutations per sentence and kind")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--kinds", nargs="+", choices=PERMUTATION_KINDS, default=list(PERMUTATION_KINDS))
    parser.add_argument("--num_beams", type=int, default=None, help="default: the model's generation config")
    parser.add_argument(
        "--max_new_tokens", type=int, default=None, help="default: the model's (source length + 50)"
    )
    parser.add_argument("--batch_size", type=int, default=32)
    parser.add_argument(
        "--precision",
        choices=["auto", "bf16", "fp32"],
        default="auto",
        help="decoding precision; auto: bf16 where measured faster than fp32 here",
    )
    parser.add_argument("--trust_remote_code", action="store_true")
    args = parser.parse_args(argv)
    for flag in ("max_sentences", "permutations", "num_beams", "max_new_tokens", "batch_size"):
        if getattr(args, flag) is not None:
            try:
                check_number(f"--{flag}", getattr(args, flag), minimum=1, integer=True)
            except ValueError as error:
                parser.error(str(error))

    sentences = read_sentences(args)[: args.max_sentences]
    model, tokenizer = load_translation_model(args.model, trust_remote_code=args.trust_remote_code)
    overrides = {
        name: getattr(args, name)
        for name in ("num_beams", "max_new_tokens")
        if getattr(args, name) is not None
    }
    beams = args.num_beams or model.generation_config.num_beams or 1
    config = model.config
    precision = choose_precision(
        args.precision, model.device, config.d_model, config.decoder_ffn_dim, args.batch_size * beams
    )
    logger.info("decoding %s", precision.line())
    results = word_order_probe(
        model,
        tokenizer,
        sentences,
        num_permutations=args.permutations,
        seed=args.seed,
        kinds=args.kinds,
        batch_size=args.batch_size,
        bf16=precision.precision == "bf16",
        **overrides,
    )
    print(json.dumps([asdict(result) for result in results], indent=2))


if __name__ == "__main__":
    run_cli(main)
