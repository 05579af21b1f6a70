"""Precision (sklearn), averaged as asked: binary, micro, macro, weighted or per label (average=None)."""

import datasets
import evaluate

from sklearn.metrics import precision_score


class Precision(evaluate.Metric):
    def _info(self):
        return evaluate.MetricInfo(
            description=__doc__,
            citation="",
            inputs_description="predictions and references, one per example",
            features=[datasets.Features({"predictions": datasets.Value("int64"), "references": datasets.Value("int64")}), datasets.Features({"predictions": datasets.Sequence(datasets.Value("int64")), "references": datasets.Sequence(datasets.Value("int64"))})],
        )

    def _compute(self, predictions, references, labels=None, pos_label=1, average="binary", sample_weight=None):
        score = precision_score(references, predictions, labels=labels, pos_label=pos_label, average=average, sample_weight=sample_weight, zero_division=0)
        return {"precision": score.tolist() if average is None else float(score)}
