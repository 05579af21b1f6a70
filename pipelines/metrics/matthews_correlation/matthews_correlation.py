"""Matthews correlation coefficient (sklearn): -1 to 1, 0 for chance; robust to class imbalance."""

import datasets
import evaluate

from sklearn.metrics import matthews_corrcoef


class MatthewsCorrelation(evaluate.Metric):
    def _info(self):
        return evaluate.MetricInfo(
            description=__doc__,
            citation="",
            inputs_description="predictions and references, one per example",
            features=[datasets.Features({"predictions": datasets.Value("int64"), "references": datasets.Value("int64")}), datasets.Features({"predictions": datasets.Sequence(datasets.Value("int64")), "references": datasets.Sequence(datasets.Value("int64"))})],
        )

    def _compute(self, predictions, references, sample_weight=None):
        return {"matthews_correlation": float(matthews_corrcoef(references, predictions, sample_weight=sample_weight))}
