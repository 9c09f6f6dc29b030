"""Translation scores: sacreBLEU scores with signatures, paired bootstrap resampling, the
n-gram sweep of paper 1 (Fig. 4), and a check that a run's output is not garbage.

Scores are computed on detokenised text with sacreBLEU: BLEU (13a tokenisation) and chrF++ (character
6-grams + word 2-grams). Significance follows paper 1: paired bootstrap resampling (Koehn 2004) against a
baseline system, marked at p < 0.05 and p < 0.10. `corpus_score` is the one place a sacreBLEU metric scores a
corpus: the scripts and the analyses (word-order probe, length generalisation) go through it.
"""

import torch
from sacrebleu.metrics import BLEU, CHRF
from sacrebleu.significance import PairedTest

from ..training.progress import MIN_UPDATES

SIGNIFICANCE_LEVELS = (0.05, 0.10)
SMALL_TEST_SET = 100  # sentences: below this, corpus BLEU says little
# Mean cosine between a sentence's encoder outputs at which the encoder counts as collapsed (finished comparison
# runs: 0.09-0.14 working; 0.997 and 0.914 in two whose decoders ignored the source).
COLLAPSED_ENCODER = 0.9


@torch.no_grad()
def encoder_token_cosine(model, tokenizer, sentences: list[str], batch_size: int = 64) -> float:
    """Mean cosine similarity between the final encoder outputs of different tokens of the same sentence, over
    the first `batch_size` sentences. Near 1, the encoder gives every token the same vector (rank collapse:
    every query attends to one token), and the decoder cannot see the source."""
    model.eval()
    batch = tokenizer(sentences[:batch_size], return_tensors="pt", padding=True).to(model.device)
    states = torch.nn.functional.normalize(model.get_encoder()(**batch).last_hidden_state.float(), dim=-1)
    mask = batch["attention_mask"].float()  # (B, S)
    cosines = states @ states.transpose(1, 2)  # (B, S, S)
    distinct = 1 - torch.eye(mask.shape[1], device=mask.device)  # (S, S)
    pairs = mask[:, :, None] * mask[:, None, :] * distinct  # (B, S, S)
    if not pairs.any():
        raise ValueError("encoder_token_cosine needs a sentence of two or more tokens")
    return float((cosines * pairs).sum() / pairs.sum())


def degenerate_output(
    hypotheses: list[str],
    bleu: float,
    position_encoding: str,
    *,
    updates: int | None = None,
    warmup_steps: int | None = None,
    precision: str | None = None,
    device: str = "cpu",
    min_updates: int = MIN_UPDATES,
    encoder_cosine: float | None = None,
) -> list[str]:
    """Why a finished run's translations look like garbage, as sentences for logs and scores.json; [] when
    they do not.

    Fires when more than half the hypotheses are empty; when BLEU is below 1 for a model with a position
    encoding (without one, a bag-of-words model may legitimately score that low); or when, on a test set of at
    least `SMALL_TEST_SET` sentences, fewer than half the translations are distinct (a model that ignores its
    source repeats a few target-language sentences, which can still score a few BLEU); or when `encoder_cosine`
    (`encoder_token_cosine` of the model) reaches `COLLAPSED_ENCODER`. The returned list names the symptoms,
    then the likely causes; the optional facts of the run (`updates` trained, `warmup_steps`, `precision`)
    make the causes specific.
    """
    repeated = repeated_output(hypotheses)
    collapsed = collapsed_encoder(encoder_cosine)
    symptoms = [empty_output(hypotheses), bleu_below_one(bleu, position_encoding), repeated, collapsed]
    symptoms = [symptom for symptom in symptoms if symptom]
    if not symptoms:
        return []
    causes = [
        *failed_training_causes(repeated=bool(repeated), collapsed=bool(collapsed)),
        *short_training_causes(updates, warmup_steps, precision, device, min_updates),
        "the learning rate: too high diverges (the loss stops falling or turns NaN), too low barely moves "
        "(--learning_rate, --warmup_steps)",
        *small_test_set_causes(len(hypotheses)),
    ]
    return symptoms + [f"likely cause: {cause}" for cause in causes]


def count_empty(hypotheses: list[str]) -> int:
    return sum(not hypothesis.strip() for hypothesis in hypotheses)


def empty_output(hypotheses: list[str]) -> str | None:
    """The symptom of more than half the translations being empty."""
    empty = count_empty(hypotheses)
    if empty > len(hypotheses) / 2:
        return f"{empty} of {len(hypotheses)} translations are empty"
    return None


def bleu_below_one(bleu: float, position_encoding: str) -> str | None:
    """The symptom of BLEU below 1, for a model with a position encoding."""
    if bleu < 1 and position_encoding != "none":
        return f"BLEU {bleu:.2f} is below 1 with position encoding {position_encoding!r}"
    return None


def repeated_output(hypotheses: list[str]) -> str | None:
    """The symptom of fewer than half the translations being distinct, on a test set of at least
    `SMALL_TEST_SET` sentences that are not mostly empty."""
    distinct = len({hypothesis.strip() for hypothesis in hypotheses if hypothesis.strip()})
    mostly_empty = count_empty(hypotheses) > len(hypotheses) / 2
    if len(hypotheses) >= SMALL_TEST_SET and not mostly_empty and distinct < len(hypotheses) / 2:
        return (
            f"only {distinct} distinct translations of {len(hypotheses)} test sentences: the output hardly "
            "depends on the source"
        )
    return None


def collapsed_encoder(encoder_cosine: float | None) -> str | None:
    """The symptom of an encoder whose outputs within a sentence reach `COLLAPSED_ENCODER` mean cosine."""
    if encoder_cosine is not None and encoder_cosine >= COLLAPSED_ENCODER:
        return (
            f"the encoder gives every token of a sentence nearly the same vector (mean cosine {encoder_cosine:.4f} "
            f"between a sentence's encoder outputs; {COLLAPSED_ENCODER} or more is a collapse)"
        )
    return None


def failed_training_causes(*, repeated: bool, collapsed: bool) -> list[str]:
    """What training settled on, read from the symptoms: a collapsed encoder, or else a source-blind decoder."""
    if collapsed:
        return [
            "the encoder collapsed in training (its self-attention sends every query to one token, so the "
            "decoder cannot see the source): train again with another --seed, a lower --learning_rate or a "
            "longer --warmup_steps"
        ]
    if repeated:
        return [
            "training settled on a target-language model that ignores the source (the training loss stays well "
            "above a working run's): train again with another --seed or a lower --learning_rate"
        ]
    return []


def short_training_causes(
    updates: int | None, warmup_steps: int | None, precision: str | None, device: str, min_updates: int
) -> list[str]:
    """Too few updates for the budget (made specific by the updates trained), bf16 emulated on the CPU as a
    reason for them, and a warm-up the run never finished."""
    causes = []
    if updates is None:
        causes.append(
            "too few updates for the time budget: compare the updates trained with the budget check"
        )
    elif updates < min_updates:
        causes.append(
            f"too few updates for the budget: {updates} trained, fewer than the {min_updates} a translation model "
            "needs (see the budget check's seconds per update; give more --minutes or a smaller model)"
        )
    too_few = updates is None or updates < min_updates
    if precision == "bf16" and torch.device(device).type == "cpu" and too_few:
        causes.append(
            "bf16 on the CPU: a CPU without bf16 units emulates it, about 25x slower per update than fp32 "
            "(--precision auto times both, --precision fp32 avoids it)"
        )
    if updates is not None and warmup_steps and updates < warmup_steps:
        causes.append(
            f"the learning rate never reached its peak: {updates} updates < {warmup_steps} warm-up steps"
        )
    return causes


def small_test_set_causes(test_sentences: int) -> list[str]:
    if test_sentences < SMALL_TEST_SET:
        return [
            f"only {test_sentences} test sentences (--test_limit): corpus BLEU on so few is noisy and can be 0 "
            "for a model that works"
        ]
    return []


def check_aligned(hypotheses: list[str], references: list[str], name: str = "hypotheses") -> None:
    if len(hypotheses) != len(references):
        raise ValueError(f"{name} has {len(hypotheses)} lines but the references have {len(references)}")


def corpus_score(metric, hypotheses: list[str], references: list[str], name: str = "hypotheses"):
    """`metric` (a sacreBLEU BLEU or CHRF) of line-aligned hypotheses against one reference each: the one
    place a corpus is scored (`score_translations` for the reported scores, `ngram_sweep` for its orders)."""
    check_aligned(hypotheses, references, name)
    return metric.corpus_score(hypotheses, [references])


def score_translations(hypotheses: list[str], references: list[str], *, lengths: bool = False) -> dict:
    """sacreBLEU BLEU (13a) and chrF++ with their signatures; with `lengths`, also BLEU's hypothesis and
    reference lengths in tokens (`hyp_len`, `ref_len`: sacreBLEU's sys_len and ref_len, which set the brevity
    penalty)."""
    bleu, chrf = BLEU(), CHRF(word_order=2)
    bleu_score = corpus_score(bleu, hypotheses, references)
    scores = {
        "bleu": round(bleu_score.score, 2),
        "chrf++": round(corpus_score(chrf, hypotheses, references).score, 2),
        "bleu_signature": str(bleu.get_signature()),
        "chrf++_signature": str(chrf.get_signature()),
    }
    if lengths:
        scores.update(hyp_len=bleu_score.sys_len, ref_len=bleu_score.ref_len)
    return scores


def paired_bootstrap(
    baseline: list[str], system: list[str], references: list[str], samples: int = 1000
) -> dict:
    """sacreBLEU's paired bootstrap resampling of `system` against `baseline` for BLEU and chrF++.

    Returns, per metric, both scores, the bootstrap mean and 95% interval of the system, the p-value and the
    paper-1 marks: "**" for p < 0.05, "*" for p < 0.10, "" otherwise. (sacreBLEU would take 0 samples as its
    default of 1000: it is an error here.)
    """
    if samples < 1:
        raise ValueError(f"bootstrap samples={samples} must be at least 1 (paper 1 uses 1000)")
    check_aligned(baseline, references, "baseline")
    check_aligned(system, references, "system")
    metrics = {"bleu": BLEU(), "chrf++": CHRF(word_order=2)}
    signatures, results = PairedTest(
        [("baseline", baseline), ("system", system)], metrics, [references], test_type="bs", n_samples=samples
    )()
    report = {}
    # sacreBLEU keys its results by the scores' own names ("BLEU", "chrF2++"), in the metrics' order.
    score_names = [key for key in results if key != "System"]
    for name, score_name in zip(metrics, score_names, strict=True):
        base, test = results[score_name]
        p_value = float(test.p_value)
        mark = "**" if p_value < SIGNIFICANCE_LEVELS[0] else "*" if p_value < SIGNIFICANCE_LEVELS[1] else ""
        report[name] = {
            "baseline": round(float(base.score), 2),
            "system": round(float(test.score), 2),
            "system_mean": round(float(test.mean), 2),
            "system_95ci": round(float(test.ci), 2),
            "p_value": round(p_value, 4),
            "significance": mark,
            "signature": str(signatures[score_name]),
        }
    return report


def ngram_sweep(
    system: list[str], baseline: list[str], references: list[str]
) -> dict[str, list[tuple[int, float]]]:
    """Paper 1 Fig. 4: score gap system − baseline as the n-gram order grows.

    chrF with character n-grams n = 1..30 (no word n-grams), chrF with word n-grams n = 1..8 (no character
    n-grams), and BLEU with n = 1..8.
    """
    check_aligned(system, references, "system")
    check_aligned(baseline, references, "baseline")

    def gap(metric) -> float:
        return round(
            corpus_score(metric, system, references, "system").score
            - corpus_score(metric, baseline, references, "baseline").score,
            3,
        )

    return {
        "chrf_char": [(n, gap(CHRF(char_order=n, word_order=0))) for n in range(1, 31)],
        "chrf_word": [(n, gap(CHRF(char_order=0, word_order=n))) for n in range(1, 9)],
        "bleu": [(n, gap(BLEU(max_ngram_order=n))) for n in range(1, 9)],
    }


def plot_ngram_sweep(sweep: dict, path, title: str = "system − baseline") -> None:
    """Three panels (chrF char n, chrF word n, BLEU n) of the score gap, written as a PNG."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    labels = {
        "chrf_char": "chrF, character n-gram order",
        "chrf_word": "chrF, word n-gram order",
        "bleu": "BLEU, max n-gram order",
    }
    figure, axes = plt.subplots(1, 3, figsize=(13, 3.6))
    for axis, (key, label) in zip(axes, labels.items(), strict=True):
        orders, gaps = zip(*sweep[key], strict=True)
        axis.plot(orders, gaps, marker="o", markersize=3)
        axis.axhline(0, color="grey", linewidth=0.8)
        axis.set_xlabel(label)
        axis.set_ylabel("score gap")
    figure.suptitle(title)
    figure.tight_layout()
    figure.savefig(path, dpi=110)
    plt.close(figure)
