"""Spearman rank correlation between predicted and reference scores (scipy), with its p-value on request."""

import evaluate

from scipy.stats import spearmanr

from pipelines.metrics._info import SCORES, metric_info, too_few_for_correlation


class SpearmanR(evaluate.Metric):
    def _info(self):
        return metric_info(__doc__, SCORES)

    def _compute(self, predictions, references, return_pvalue=False):
        statistic, pvalue = too_few_for_correlation("Spearman correlation", len(references)) or spearmanr(references, predictions)
        return {"spearmanr": float(statistic), **({"p-value": float(pvalue)} if return_pvalue else {})}
