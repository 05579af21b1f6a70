"""Pearson correlation between predicted and reference scores (scipy), with its p-value on request."""

import evaluate

from scipy.stats import pearsonr

from pipelines.metrics._info import SCORES, metric_info, too_few_for_correlation


class PearsonR(evaluate.Metric):
    def _info(self):
        return metric_info(__doc__, SCORES)

    def _compute(self, predictions, references, return_pvalue=False):
        statistic, pvalue = too_few_for_correlation("Pearson correlation", len(references)) or pearsonr(references, predictions)
        return {"pearsonr": float(statistic), **({"p-value": float(pvalue)} if return_pvalue else {})}
