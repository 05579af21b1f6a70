"""Matthews correlation coefficient (sklearn): -1 to 1, 0 for chance; robust to class imbalance."""

import evaluate

from sklearn.metrics import matthews_corrcoef

from pipelines.metrics._info import LABELS, metric_info


class MatthewsCorrelation(evaluate.Metric):
    def _info(self):
        return metric_info(__doc__, LABELS)

    def _compute(self, predictions, references, sample_weight=None):
        return {"matthews_correlation": float(matthews_corrcoef(references, predictions, sample_weight=sample_weight))}
