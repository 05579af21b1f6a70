"""Corpus chrF / chrF++ with sacreBLEU (Popović, 2015; 2017): character n-gram F-score.

In:  ``predictions`` (one hypothesis string per segment) and ``references`` (a list of reference
     strings per segment, the same number for every segment).
Out: ``score`` (0-100), ``char_order``, ``word_order``, ``beta`` and ``signature``, the sacreBLEU
     signature string (``nrefs:1|case:lc|eff:yes|nc:6|nw:0|space:no|version:...``).

Options as in ``sacrebleu.CHRF``: ``char_order`` (6), ``word_order`` (0 = chrF, 2 = chrF++),
``beta`` (2: recall weighs twice precision), ``lowercase``, ``whitespace`` (count spaces as characters).
"""

import math
import warnings

import datasets
import evaluate
import sacrebleu as scb


class ChrF(evaluate.Metric):
    def _info(self):
        return evaluate.MetricInfo(
            description=__doc__,
            citation="Popović, M. (2015). chrF: character n-gram F-score for automatic MT evaluation. WMT 2015.",
            inputs_description="predictions: list of str; references: list of list of str (same count per segment)",
            features=datasets.Features(
                {"predictions": datasets.Value("string"), "references": datasets.Sequence(datasets.Value("string"))}
            ),
        )

    def _compute(self, predictions, references, char_order=6, word_order=0, beta=2, lowercase=False, whitespace=False):
        references = [list(refs) for refs in references]
        counts = {len(refs) for refs in references}
        if len(counts) > 1:
            raise ValueError(f"chrF needs the same number of references per segment; got counts {sorted(counts)}")
        streams = [[refs[i] for refs in references] for i in range(counts.pop() if counts else 0)]
        chrf = scb.CHRF(char_order=char_order, word_order=word_order, beta=beta, lowercase=lowercase, whitespace=whitespace)
        if not predictions:
            # sacreBLEU fails on an empty corpus with an IndexError; chrF of no segment is undefined.
            warnings.warn("chrf: no segments to score; chrF is undefined and NaN", RuntimeWarning, stacklevel=3)
            return {"score": math.nan, "char_order": char_order, "word_order": word_order, "beta": beta,
                    "signature": None}  # nrefs: unknown
        result = chrf.corpus_score(list(predictions), streams)
        return {
            "score": float(result.score),
            "char_order": char_order,
            "word_order": word_order,
            "beta": beta,
            "signature": str(chrf.get_signature()),
        }
