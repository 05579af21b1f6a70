"""Corpus BLEU with sacreBLEU (Post, 2018): detokenised hypotheses and references in, one score out.

In:  ``predictions`` (one hypothesis string per segment) and ``references`` (a list of reference
     strings per segment; every segment must have the same number of references).
Out: ``score`` (0-100), ``counts``/``totals``/``precisions`` per n-gram order, ``bp``, ``sys_len``,
     ``ref_len`` and ``signature``, the sacreBLEU signature string (``nrefs:1|case:lc|eff:no|tok:13a|
     smooth:exp|version:...``) that says how the score was computed, so scores are comparable.

Options: ``tokenize`` (sacreBLEU tokeniser, default ``13a`` as in WMT), ``lowercase`` (case-insensitive
BLEU), ``smooth_method``/``smooth_value`` and ``use_effective_order`` as in ``sacrebleu.BLEU``.
"""

import math
import warnings

import datasets
import evaluate
import sacrebleu as scb


class SacreBLEU(evaluate.Metric):
    def _info(self):
        return evaluate.MetricInfo(
            description=__doc__,
            citation="Post, M. (2018). A Call for Clarity in Reporting BLEU Scores. WMT 2018.",
            inputs_description="predictions: list of str; references: list of list of str (same count per segment)",
            features=datasets.Features(
                {"predictions": datasets.Value("string"), "references": datasets.Sequence(datasets.Value("string"))}
            ),
        )

    def _compute(self, predictions, references, tokenize="13a", lowercase=False, smooth_method="exp",
                 smooth_value=None, use_effective_order=False):
        references = [list(refs) for refs in references]
        counts = {len(refs) for refs in references}
        if len(counts) > 1:
            raise ValueError(f"sacrebleu needs the same number of references per segment; got counts {sorted(counts)}")
        # sacreBLEU takes one stream per reference position: transpose segments x refs -> refs x segments.
        streams = [[refs[i] for refs in references] for i in range(counts.pop() if counts else 0)]
        bleu = scb.BLEU(tokenize=tokenize, lowercase=lowercase, smooth_method=smooth_method,
                        smooth_value=smooth_value, effective_order=use_effective_order)
        if not predictions:
            # sacreBLEU fails on an empty corpus with an IndexError; BLEU of no segment is undefined.
            warnings.warn("sacrebleu: no segments to score; BLEU is undefined and NaN", RuntimeWarning, stacklevel=3)
            orders = bleu.max_ngram_order
            return {"score": math.nan, "counts": [0] * orders, "totals": [0] * orders, "precisions": [math.nan] * orders,
                    "bp": math.nan, "sys_len": 0, "ref_len": 0, "signature": None}  # nrefs: unknown
        result = bleu.corpus_score(list(predictions), streams)
        return {
            "score": float(result.score),
            "counts": list(result.counts),
            "totals": list(result.totals),
            "precisions": [float(p) for p in result.precisions],
            "bp": float(result.bp),
            "sys_len": int(result.sys_len),
            "ref_len": int(result.ref_len),
            "signature": str(bleu.get_signature()),
        }
