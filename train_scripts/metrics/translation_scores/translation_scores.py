"""A local `evaluate` metric: sacreBLEU BLEU and chrF++ (the Hub's "sacrebleu" metric needs network).

metric = evaluate.load("train_scripts/metrics/translation_scores")
metric.compute(predictions=["..."], references=["..."])  # {"bleu": ..., "chrf++": ..., signatures}
"""

import datasets
import evaluate
from sacrebleu.metrics import BLEU, CHRF


class TranslationScores(evaluate.Metric):
    def _info(self):
        return evaluate.MetricInfo(
            description="Corpus BLEU (13a) and chrF++ from sacreBLEU, with signatures.",
            citation="Post, 2018. A Call for Clarity in Reporting BLEU Scores. WMT.",
            inputs_description="predictions: list of str; references: list of str (one reference each)",
            features=datasets.Features(
                {"predictions": datasets.Value("string"), "references": datasets.Value("string")}
            ),
        )

    def _compute(self, predictions, references):
        bleu, chrf = BLEU(), CHRF(word_order=2)
        return {
            "bleu": bleu.corpus_score(predictions, [references]).score,
            "chrf++": chrf.corpus_score(predictions, [references]).score,
            "bleu_signature": str(bleu.get_signature()),
            "chrf++_signature": str(chrf.get_signature()),
        }
