"""F1 score (sklearn), averaged as asked: binary, micro, macro, weighted or per label (average=None)."""

import evaluate

from sklearn.metrics import f1_score

from pipelines.metrics._info import LABELS, metric_info


class F1(evaluate.Metric):
    def _info(self):
        return metric_info(__doc__, LABELS)

    def _compute(self, predictions, references, labels=None, pos_label=1, average="binary", sample_weight=None):
        score = f1_score(references, predictions, labels=labels, pos_label=pos_label, average=average, sample_weight=sample_weight, zero_division=0)
        return {"f1": score.tolist() if average is None else float(score)}
