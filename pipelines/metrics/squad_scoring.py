"""The official SQuAD scoring, as plain functions (v1.1 ``evaluate-v1.1.py`` and ``evaluate-v2.0.py``).

In:  predicted answer texts by question id, the reference answer texts by question id and, for v2,
     a no-answer probability by question id.
Out: exact match and F1 in percent (0-100), with the official answer normalisation (lowercase,
     strip punctuation, drop the articles a/an/the, collapse whitespace) and the maximum over the
     reference answers; for v2 also the HasAns/NoAns splits and the best no-answer threshold.

The ``evaluate`` modules ``squad`` and ``squad_v2`` in this folder wrap these functions; they live
in a plain module so that both can share them and tests can call them directly.
"""

from __future__ import annotations

import collections
import re
import string
from typing import Iterable, Mapping

_ARTICLES = re.compile(r"\b(a|an|the)\b", re.UNICODE)
_PUNCTUATION = set(string.punctuation)


def normalize_answer(text: str) -> str:
    """Lowercase, remove punctuation, articles and extra whitespace (the official order)."""
    text = text.lower()
    text = "".join(ch for ch in text if ch not in _PUNCTUATION)
    text = _ARTICLES.sub(" ", text)
    return " ".join(text.split())


def exact_match_score(prediction: str, reference: str) -> float:
    return float(normalize_answer(prediction) == normalize_answer(reference))


def f1_score(prediction: str, reference: str) -> float:
    """Bag-of-tokens F1 after normalisation; two empty answers agree (v2 no-answer)."""
    prediction_tokens = normalize_answer(prediction).split()
    reference_tokens = normalize_answer(reference).split()
    if not prediction_tokens or not reference_tokens:
        return float(prediction_tokens == reference_tokens)
    common = collections.Counter(prediction_tokens) & collections.Counter(reference_tokens)
    overlap = sum(common.values())
    if overlap == 0:
        return 0.0
    precision = overlap / len(prediction_tokens)
    recall = overlap / len(reference_tokens)
    return 2 * precision * recall / (precision + recall)


def v1_f1_score(prediction: str, reference: str) -> float:
    """``evaluate-v1.1.py``'s F1, which has no "no answer" to agree on: answers sharing no token score 0,
    even when both normalise to nothing (gold "The", predicted "the": EM 1 but F1 0 there)."""
    if not normalize_answer(prediction) or not normalize_answer(reference):
        return 0.0
    return f1_score(prediction, reference)


def squad_v1_scores(predictions: Mapping[str, str], references: Mapping[str, Iterable[str]]) -> dict[str, float]:
    """``evaluate-v1.1.py``: the mean over questions of the max over references, in percent.

    A question without a prediction scores 0 (the official script warns and counts it).
    """
    exact = f1 = 0.0
    for qid, answers in references.items():
        answers = list(answers)
        if qid not in predictions:
            continue
        prediction = predictions[qid]
        exact += max(exact_match_score(prediction, answer) for answer in answers)
        f1 += max(v1_f1_score(prediction, answer) for answer in answers)
    total = len(references)
    return {"exact_match": 100.0 * exact / total, "f1": 100.0 * f1 / total}


def _raw_v2_scores(predictions: Mapping[str, str], references: Mapping[str, Iterable[str]]):
    exact, f1 = {}, {}
    for qid, answers in references.items():
        # Answers that normalise to nothing do not count; no answer left means "unanswerable".
        gold = [answer for answer in answers if normalize_answer(answer)] or [""]
        if qid not in predictions:
            continue
        prediction = predictions[qid]
        exact[qid] = max(exact_match_score(prediction, answer) for answer in gold)
        f1[qid] = max(f1_score(prediction, answer) for answer in gold)
    return exact, f1


def _apply_no_answer_threshold(scores, na_probs, has_answer, threshold: float):
    """Predict "no answer" where the no-answer probability exceeds ``threshold``."""
    return {
        qid: (float(not has_answer[qid]) if na_probs[qid] > threshold else score) for qid, score in scores.items()
    }


def _mean(scores: Mapping[str, float], qids: list[str]) -> float:
    return 100.0 * sum(scores[qid] for qid in qids) / len(qids)


def find_best_threshold(predictions, scores, na_probs, has_answer) -> tuple[float, float]:
    """The official sweep: abstain on every question whose no-answer probability exceeds a threshold.

    Starts from "abstain everywhere" (credit for every unanswerable question) and walks the
    questions by increasing no-answer probability, answering each in turn. Returns the best score
    in percent and the threshold (a no-answer probability) that reaches it.
    """
    current = best = sum(1 for qid in scores if not has_answer[qid])
    best_threshold = 0.0
    for qid in sorted(na_probs, key=lambda key: na_probs[key]):
        if qid not in scores:
            continue
        if has_answer[qid]:
            current += scores[qid]
        elif predictions[qid]:
            current -= 1
        if current > best:
            best, best_threshold = current, na_probs[qid]
    return 100.0 * best / len(scores), best_threshold


def squad_v2_scores(
    predictions: Mapping[str, str],
    references: Mapping[str, Iterable[str]],
    no_answer_probabilities: Mapping[str, float],
    no_answer_threshold: float = 1.0,
) -> dict[str, float]:
    """``evaluate-v2.0.py``: exact/f1, HasAns_* and NoAns_* splits, best_exact/best_f1 and thresholds.

    ``no_answer_threshold`` = 1.0 (the official default) leaves the predicted texts as they are.
    """
    references = {qid: list(answers) for qid, answers in references.items()}
    # As the official script: any gold text makes a question answerable (HasAns), even one that normalises
    # to nothing ("The", "."), though it is then scored against "" (see _raw_v2_scores).
    has_answer = {qid: bool(answers) for qid, answers in references.items()}
    exact_raw, f1_raw = _raw_v2_scores(predictions, references)
    na_probs = {qid: float(no_answer_probabilities.get(qid, 0.0)) for qid in references}
    exact = _apply_no_answer_threshold(exact_raw, na_probs, has_answer, no_answer_threshold)
    f1 = _apply_no_answer_threshold(f1_raw, na_probs, has_answer, no_answer_threshold)
    qids = list(references)
    # Unpredicted questions score 0, as in the official script.
    exact_all = {qid: exact.get(qid, 0.0) for qid in qids}
    f1_all = {qid: f1.get(qid, 0.0) for qid in qids}
    result = {"exact": _mean(exact_all, qids), "f1": _mean(f1_all, qids), "total": float(len(qids))}
    for name, wanted in (("HasAns", True), ("NoAns", False)):
        subset = [qid for qid in qids if has_answer[qid] == wanted]
        if subset:
            result.update({
                f"{name}_exact": _mean(exact_all, subset), f"{name}_f1": _mean(f1_all, subset), f"{name}_total": float(len(subset)),
            })
    # The sweep starts from the raw scores (before any threshold), over the predicted questions.
    result["best_exact"], result["best_exact_thresh"] = find_best_threshold(predictions, exact_raw, na_probs, has_answer)
    result["best_f1"], result["best_f1_thresh"] = find_best_threshold(predictions, f1_raw, na_probs, has_answer)
    return result
