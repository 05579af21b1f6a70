"""Accuracy: share of predictions equal to their reference (for multi-label rows, all labels must match)."""

import evaluate

from sklearn.metrics import accuracy_score

from pipelines.metrics._info import LABELS, metric_info


class Accuracy(evaluate.Metric):
    def _info(self):
        return metric_info(__doc__, LABELS)

    def _compute(self, predictions, references, normalize=True, sample_weight=None):
        score = accuracy_score(references, predictions, normalize=normalize, sample_weight=sample_weight)
        return {"accuracy": float(score)}
