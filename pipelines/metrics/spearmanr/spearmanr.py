"""Spearman rank correlation between predicted and reference scores (scipy), with its p-value on request."""

import datasets
import evaluate

from scipy.stats import spearmanr


class SpearmanR(evaluate.Metric):
    def _info(self):
        return evaluate.MetricInfo(
            description=__doc__,
            citation="",
            inputs_description="predictions and references, one per example",
            features=datasets.Features({"predictions": datasets.Value("float64"), "references": datasets.Value("float64")}),
        )

    def _compute(self, predictions, references, return_pvalue=False):
        statistic, pvalue = spearmanr(references, predictions)
        return {"spearmanr": float(statistic), **({"p-value": float(pvalue)} if return_pvalue else {})}
