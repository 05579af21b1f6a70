"""Shared ``MetricInfo`` for the label and score metrics (plain functions: evaluate picks the first
``EvaluationModule`` subclass it finds in a metric file, so no base class lives here), and the answer of
the correlation metrics where a correlation is undefined."""

import math
import warnings

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


def too_few_for_correlation(name: str, count: int) -> tuple[float, float] | None:
    """(NaN, NaN) and one warning when ``count`` pairs cannot have a correlation, else None.

    scipy answers a constant input with NaN and a warning, but fewer than two pairs with a ValueError
    (Pearson) or a silent NaN (Spearman): a one-example eval split would end a training run at its
    final evaluation with a traceback. Both now answer as scipy does for a constant input."""
    if count >= 2:
        return None
    warnings.warn(f"{name} is undefined for {count} example(s): a correlation needs 2 or more; it is NaN", RuntimeWarning, stacklevel=3)
    return math.nan, math.nan
