from __future__ import annotations

import numpy as np
import pytest
from scipy import stats
from sklearn import metrics as sk

from pipelines.metrics import load_metric, local_metric_names


def test_metrics_local_modules_exist_for_classification():
    assert {"accuracy", "f1", "precision", "recall", "matthews_correlation", "pearsonr", "spearmanr"} <= set(local_metric_names())


def test_metrics_classification_modules_agree_with_sklearn():
    rng = np.random.default_rng(0)
    references, predictions = rng.integers(0, 3, 200), rng.integers(0, 3, 200)
    assert load_metric("accuracy").compute(predictions=predictions, references=references)["accuracy"] == pytest.approx(
        sk.accuracy_score(references, predictions)
    )
    for name, function in [("f1", sk.f1_score), ("precision", sk.precision_score), ("recall", sk.recall_score)]:
        for average in ("macro", "micro"):
            value = load_metric(name).compute(predictions=predictions, references=references, average=average)[name]
            assert value == pytest.approx(function(references, predictions, average=average))
    assert load_metric("matthews_correlation").compute(predictions=predictions, references=references)[
        "matthews_correlation"
    ] == pytest.approx(sk.matthews_corrcoef(references, predictions))


def test_metrics_hand_made_binary_values():
    result = load_metric("f1").compute(predictions=[1, 1, 0, 0], references=[1, 0, 1, 0])
    assert result["f1"] == pytest.approx(0.5)
    assert load_metric("accuracy").compute(predictions=[1, 1, 0, 1], references=[1, 0, 0, 1])["accuracy"] == 0.75


def test_metrics_correlations_agree_with_scipy():
    rng = np.random.default_rng(1)
    references = rng.normal(size=50)
    predictions = references + rng.normal(scale=0.5, size=50)
    assert load_metric("pearsonr").compute(predictions=predictions, references=references)["pearsonr"] == pytest.approx(
        stats.pearsonr(references, predictions).statistic
    )
    assert load_metric("spearmanr").compute(predictions=predictions, references=references)["spearmanr"] == pytest.approx(
        stats.spearmanr(references, predictions).statistic
    )
