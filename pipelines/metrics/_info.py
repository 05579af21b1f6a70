"""Shared ``MetricInfo`` for the label and score metrics (plain functions: evaluate picks the first
``EvaluationModule`` subclass it finds in a metric file, so no base class lives here)."""

import datasets
import evaluate

LABELS = [
    datasets.Features({"predictions": datasets.Value("int64"), "references": datasets.Value("int64")}),
    # Multi-label rows: one 0/1 indicator per label.
    datasets.Features({"predictions": datasets.Sequence(datasets.Value("int64")), "references": datasets.Sequence(datasets.Value("int64"))}),
]
SCORES = datasets.Features({"predictions": datasets.Value("float64"), "references": datasets.Value("float64")})


def metric_info(description: str, features) -> evaluate.MetricInfo:
    return evaluate.MetricInfo(
        description=description, citation="", inputs_description="predictions and references, one per example", features=features
    )
