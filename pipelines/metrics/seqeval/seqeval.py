"""Entity-level precision, recall and F1 for tag sequences (the CoNLL ``conlleval`` measure), via seqeval.

In:  predictions and references: one list of string tags per sentence (``O``, ``B-PER``, ``I-LOC``,
     ``S-ORG``...), one tag per *word*. Options: ``mode=None`` (conlleval's lenient chunking, which
     reads IOB1, IOB2, IOE and IOBES tags alike) or ``mode="strict"`` with a ``scheme`` (``IOB1``,
     ``IOB2``, ``IOE1``, ``IOE2``, ``IOBES``, ``BILOU``), where a chunk counts only if its tags form a
     valid entity of that scheme; ``suffix=True`` for tags written ``PER-B``.
Out: ``overall_precision``, ``overall_recall``, ``overall_f1`` (micro over entities),
     ``overall_accuracy`` (share of words whose tag is right), and per entity type a dict
     ``{"precision", "recall", "f1", "number"}`` (``number`` = reference entities of that type).
     With no entity in references and predictions, the overall precision/recall/F1 are NaN (undefined,
     with a warning), as is every measure with no word at all; other divisions by zero give ``zero_division``.
"""

import math
import warnings

import datasets
import evaluate

from seqeval.metrics import accuracy_score, classification_report
from seqeval import scheme as seqeval_scheme

_SCHEMES = {name: getattr(seqeval_scheme, name) for name in ("IOB1", "IOB2", "IOE1", "IOE2", "IOBES", "BILOU")}


class Seqeval(evaluate.Metric):
    def _info(self):
        return evaluate.MetricInfo(
            description=__doc__,
            citation="Hiroki Nakayama, seqeval: a Python framework for sequence labeling evaluation, 2018.",
            inputs_description="predictions and references: a list of string tags per sentence",
            features=datasets.Features(
                {
                    "predictions": datasets.Sequence(datasets.Value("string")),
                    "references": datasets.Sequence(datasets.Value("string")),
                }
            ),
        )

    def _compute(self, predictions, references, scheme=None, mode=None, suffix=False, zero_division=0):
        if mode not in (None, "default", "strict"):
            raise ValueError(f"mode must be None/'default' or 'strict', got {mode!r}")
        if mode == "default":
            mode = None
        if scheme is not None and scheme not in _SCHEMES:
            raise ValueError(f"unknown scheme {scheme!r}; choose one of {sorted(_SCHEMES)}")
        if mode == "strict" and scheme is None:
            raise ValueError("mode='strict' needs a scheme (IOB1, IOB2, IOE1, IOE2, IOBES or BILOU)")
        for index, (predicted, reference) in enumerate(zip(predictions, references)):
            if len(predicted) != len(reference):
                raise ValueError(f"sentence {index}: {len(predicted)} predicted tags for {len(reference)} reference tags")
        words = sum(len(reference) for reference in references)
        if words == 0:
            # seqeval raises a TypeError (no sentences) or a ZeroDivisionError (empty sentences) here.
            warnings.warn("seqeval: no words to score; every measure is undefined and NaN", RuntimeWarning, stacklevel=3)
            return {f"overall_{name}": math.nan for name in ("precision", "recall", "f1", "accuracy")}
        with warnings.catch_warnings():
            # Without any entity, the report's macro and weighted averages are means over no type: numpy
            # warns of an empty mean (six warnings that say nothing to the user).
            warnings.filterwarnings("ignore", "Mean of empty slice", RuntimeWarning)
            warnings.filterwarnings("ignore", "invalid value encountered", RuntimeWarning)
            report = classification_report(
                y_true=references, y_pred=predictions, suffix=suffix, output_dict=True,
                scheme=_SCHEMES[scheme] if scheme else None, mode=mode, zero_division=zero_division,
            )
        overall = report.pop("micro avg")
        for average in ("macro avg", "weighted avg"):
            report.pop(average, None)
        if not report:
            # No entity in the references or the predictions: precision, recall and F1 are all 0/0. As 0
            # they read as a model that found nothing of something, and as a tie that makes the first
            # evaluation the best model; NaN is never the best (pipelines/train.py) and metrics.json says null.
            warnings.warn("seqeval: no entities in the references or the predictions; entity precision, recall and F1 "
                          "are undefined and NaN", RuntimeWarning, stacklevel=3)
            overall = {"precision": math.nan, "recall": math.nan, "f1-score": math.nan}
        scores = {
            entity_type: {
                "precision": float(values["precision"]), "recall": float(values["recall"]),
                "f1": float(values["f1-score"]), "number": int(values["support"]),
            }
            for entity_type, values in report.items()
        }
        scores.update(
            overall_precision=float(overall["precision"]),
            overall_recall=float(overall["recall"]),
            overall_f1=float(overall["f1-score"]),
            overall_accuracy=float(accuracy_score(y_true=references, y_pred=predictions)),
        )
        return scores
