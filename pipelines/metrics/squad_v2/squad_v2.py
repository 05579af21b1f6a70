"""SQuAD v2 scoring (official ``evaluate-v2.0.py``), offline: exact/F1 (0-100), HasAns/NoAns, best thresholds.

predictions: [{"id": str, "prediction_text": str ("" = no answer), "no_answer_probability": float}]
references:  [{"id": str, "answers": {"text": [...], "answer_start": [...]}}] (empty text list = unanswerable)
returns:     exact, f1, total, HasAns_exact/f1/total, NoAns_exact/f1/total (when present),
             best_exact, best_exact_thresh, best_f1, best_f1_thresh (thresholds on no_answer_probability)
``no_answer_threshold`` (default 1.0 = keep the predicted texts) turns predictions whose no-answer
probability exceeds it into "no answer".
"""

import datasets
import evaluate

from pipelines.metrics.squad_scoring import squad_v2_scores


class SquadV2(evaluate.Metric):
    def _info(self):
        return evaluate.MetricInfo(
            description=__doc__,
            citation="Rajpurkar, Jia and Liang, Know What You Don't Know: Unanswerable Questions for SQuAD (ACL 2018)",
            inputs_description="predictions {id, prediction_text, no_answer_probability}, references {id, answers}",
            features=datasets.Features({
                "predictions": {
                    "id": datasets.Value("string"),
                    "prediction_text": datasets.Value("string"),
                    "no_answer_probability": datasets.Value("float64"),
                },
                "references": {
                    "id": datasets.Value("string"),
                    "answers": datasets.Sequence({"text": datasets.Value("string"), "answer_start": datasets.Value("int32")}),
                },
            }),
        )

    def _compute(self, predictions, references, no_answer_threshold=1.0):
        predicted = {row["id"]: row["prediction_text"] for row in predictions}
        probabilities = {row["id"]: row["no_answer_probability"] for row in predictions}
        gold = {row["id"]: row["answers"]["text"] for row in references}
        return squad_v2_scores(predicted, gold, probabilities, no_answer_threshold)
