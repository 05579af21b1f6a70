"""Entity-level precision, recall and F1 for tag sequences (the CoNLL ``conlleval`` measure), via seqeval.

In:  predictions and references: one list of string tags per sentence (``O``, ``B-PER``, ``I-LOC``,
     ``S-ORG``...), one tag per *word*. Options: ``mode=None`` (conlleval's lenient chunking, which
     reads IOB1, IOB2, IOE and IOBES tags alike) or ``mode="strict"`` with a ``scheme`` (``IOB1``,
     ``IOB2``, ``IOE1``, ``IOE2``, ``IOBES``, ``BILOU``), where a chunk counts only if its tags form a
     valid entity of that scheme; ``suffix=True`` for tags written ``PER-B``.
Out: ``overall_precision``, ``overall_recall``, ``overall_f1`` (micro over entities),
     ``overall_accuracy`` (share of words whose tag is right), and per entity type a dict
     ``{"precision", "recall", "f1", "number"}`` (``number`` = reference entities of that type).
"""

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
        report = classification_report(
            y_true=references, y_pred=predictions, suffix=suffix, output_dict=True,
            scheme=_SCHEMES[scheme] if scheme else None, mode=mode, zero_division=zero_division,
        )
        overall = report.pop("micro avg")
        for average in ("macro avg", "weighted avg"):
            report.pop(average, None)
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
