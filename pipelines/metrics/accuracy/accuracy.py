"""Accuracy: share of predictions equal to their reference (for multi-label rows, all labels must match)."""

import datasets
import evaluate

from sklearn.metrics import accuracy_score


class Accuracy(evaluate.Metric):
    def _info(self):
        return evaluate.MetricInfo(
            description=__doc__,
            citation="",
            inputs_description="predictions and references, one per example",
            features=[datasets.Features({"predictions": datasets.Value("int64"), "references": datasets.Value("int64")}), datasets.Features({"predictions": datasets.Sequence(datasets.Value("int64")), "references": datasets.Sequence(datasets.Value("int64"))})],
        )

    def _compute(self, predictions, references, normalize=True, sample_weight=None):
        score = accuracy_score(references, predictions, normalize=normalize, sample_weight=sample_weight)
        return {"accuracy": float(score)}
