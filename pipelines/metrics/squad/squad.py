"""SQuAD v1.1 exact match and F1 (0-100), the official ``evaluate-v1.1.py`` scoring, offline.

predictions: [{"id": str, "prediction_text": str}]
references:  [{"id": str, "answers": {"text": [str, ...], "answer_start": [int, ...]}}]
returns:     {"exact_match": float, "f1": float}
"""

import datasets
import evaluate

from pipelines.metrics.squad_scoring import squad_v1_scores


class Squad(evaluate.Metric):
    def _info(self):
        return evaluate.MetricInfo(
            description=__doc__,
            citation="Rajpurkar et al., SQuAD: 100,000+ Questions for Machine Comprehension of Text (EMNLP 2016)",
            inputs_description="predictions {id, prediction_text}, references {id, answers {text, answer_start}}",
            features=datasets.Features({
                "predictions": {"id": datasets.Value("string"), "prediction_text": datasets.Value("string")},
                "references": {
                    "id": datasets.Value("string"),
                    "answers": datasets.Sequence({"text": datasets.Value("string"), "answer_start": datasets.Value("int32")}),
                },
            }),
        )

    def _compute(self, predictions, references):
        predicted = {row["id"]: row["prediction_text"] for row in predictions}
        gold = {row["id"]: row["answers"]["text"] for row in references}
        return squad_v1_scores(predicted, gold)
