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

Translations decode under `--precision` (auto: bf16 autocast where it is measurably faster on this machine,
see `hf_posenc.pipeline.hardware.choose_precision`); the equivariance gap is always computed in fp32, where
bf16 rounding would hide a small gap.
"""

import argparse
import json
import logging
import random
from dataclasses import asdict, dataclass
from pathlib import Path

import sacrebleu
import torch

from ..pipeline.cli import run_cli
from ..pipeline.evaluation import load_translation_model
from ..pipeline.hardware import choose_precision

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


@torch.no_grad()
def translate(
    model, tokenizer, input_ids: list[list[int]], batch_size: int, bf16: bool = False, **generate_kwargs
) -> list[str]:
    """Translations of already tokenised sources (right-padded in batches), under bf16 autocast with `bf16`."""
    translations = []
    for start in range(0, len(input_ids), batch_size):
        chunk = input_ids[start : start + batch_size]
        longest = max(len(ids) for ids in chunk)
        padded = torch.full((len(chunk), longest), tokenizer.pad_token_id)
        mask = torch.zeros_like(padded)
        for row, ids in enumerate(chunk):
            padded[row, : len(ids)] = torch.tensor(ids)
            mask[row, : len(ids)] = 1
        with torch.autocast(device_type=model.device.type, dtype=torch.bfloat16, enabled=bf16):
            generated = model.generate(
                padded.to(model.device), attention_mask=mask.to(model.device), **generate_kwargs
            )
        translations += tokenizer.batch_decode(generated, skip_special_tokens=True)
    return translations


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

    `generate_kwargs` go to `model.generate` (e.g. num_beams=4, max_new_tokens=64); `bf16` decodes under bf16
    autocast (the gap stays fp32).
    """
    model.eval()
    encoder = model.get_encoder()
    encodings = [tokenizer(sentence) for sentence in sentences]
    originals = translate(
        model, tokenizer, [e["input_ids"] for e in encodings], batch_size, bf16, **generate_kwargs
    )
    results = []
    for kind in kinds:
        rng = random.Random(seed)
        gaps, permuted_sources, references = [], [], []
        for encoding, original in zip(encodings, originals, strict=True):
            word_ids = encoding.word_ids()
            num_words = len({word for word in word_ids if word is not None})
            ids = torch.tensor([encoding["input_ids"]], device=model.device)
            for _ in range(num_permutations):
                order = token_permutation(word_ids, word_permutation(num_words, kind, rng))
                gaps.append(equivariance_gap(encoder, ids, torch.tensor(order, device=model.device)))
                permuted_sources.append([encoding["input_ids"][index] for index in order])
                references.append(original)
        translations = translate(model, tokenizer, permuted_sources, batch_size, bf16, **generate_kwargs)
        results.append(
            WordOrderProbeResult(
                kind=kind,
                sentences=len(sentences),
                permutations_per_sentence=num_permutations,
                equivariance_gap=sum(gaps) / len(gaps),
                bleu_vs_original=sacrebleu.corpus_bleu(translations, [references]).score,
            )
        )
    return results


def main(argv=None):
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("model", help="folder with a saved model and its tokenizer")
    sources = parser.add_mutually_exclusive_group(required=True)
    sources.add_argument("--source", type=Path, help="text file, one source sentence per line")
    sources.add_argument("--sentences", nargs="+", help="source sentences on the command line")
    parser.add_argument("--max_sentences", type=int, default=200)
    parser.add_argument("--permutations", type=int, default=5, help="permutations per sentence and kind")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--kinds", nargs="+", choices=PERMUTATION_KINDS, default=list(PERMUTATION_KINDS))
    parser.add_argument("--num_beams", type=int, default=4)
    parser.add_argument("--max_new_tokens", type=int, default=64)
    parser.add_argument("--batch_size", type=int, default=32)
    parser.add_argument("--precision", choices=["auto", "bf16", "fp32"], default="auto",
                        help="decoding precision; auto: bf16 where measured faster than fp32 here")  # fmt: skip
    parser.add_argument("--trust_remote_code", action="store_true")
    args = parser.parse_args(argv)

    model, tokenizer = load_translation_model(args.model, trust_remote_code=args.trust_remote_code)
    if args.source is not None:
        sentences = [line.strip() for line in args.source.read_text().splitlines() if line.strip()]
    else:
        sentences = args.sentences
    config = model.config
    precision = choose_precision(
        args.precision, model.device, config.d_model, config.decoder_ffn_dim, args.batch_size * args.num_beams
    )
    logger.info("decoding %s", precision.line())
    results = word_order_probe(
        model,
        tokenizer,
        sentences[: args.max_sentences],
        num_permutations=args.permutations,
        seed=args.seed,
        kinds=args.kinds,
        batch_size=args.batch_size,
        bf16=precision.precision == "bf16",
        num_beams=args.num_beams,
        max_new_tokens=args.max_new_tokens,
    )
    print(json.dumps([asdict(result) for result in results], indent=2))


if __name__ == "__main__":
    run_cli(main)
