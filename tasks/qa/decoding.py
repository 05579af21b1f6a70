"""Window logits -> one answer per example: n-best span decoding (pure: numpy, no model, no tokenizer).

In:  the examples' contexts, and per window its example index, context-only character offsets
     (``None`` outside the context), start and end logits and CLS position, as
     :func:`tasks.qa.windows.prepare_features` and a QA model give them.
Out: per example the best answer text with its character span, its probability, the n-best list
     and (v2) the no-answer probability. Evaluation, ``bertpipe predict`` and the
     ``question-answering`` pipeline all decode through :func:`postprocess_qa_predictions`.
"""

from __future__ import annotations

import collections
from typing import Any, Iterator, Sequence

import numpy as np

from pipelines.graphemes import grapheme_boundaries, visible_span


def _softmax(scores: np.ndarray) -> np.ndarray:
    shifted = np.exp(scores - scores.max())
    return shifted / shifted.sum()


def trim_span(context: str, start: int, end: int) -> tuple[int, int] | None:
    """``[start, end)`` without the whitespace or invisible characters at either end; None when nothing else is left.

    Some tokenizers give a word-initial piece offsets that include the space before it (DeBERTa-v2/v3's
    Metaspace without a whitespace split, ModernBERT's byte-level BPE without offset trimming), and a
    piece of its own for a lone space marker or a zero-width space; the answer is the text, not the
    space (which the SQuAD scoring would count against it).
    """
    return visible_span(context, start, end, None)  # character by character: no clusters to keep whole


def _ranked_spans(
    starts: np.ndarray, ends: np.ndarray, offsets: Sequence, max_answer_length: int, first: int,
) -> Iterator[tuple[int, int]]:
    """Every valid token span ``(s, e)`` of one window, best ``starts[s] + ends[e]`` first.

    Valid: both ends are context tokens, ``s <= e`` and ``e - s + 1 <= max_answer_length``. Exact
    ties go by ``s``, then ``e``. The scores form a ``(width, max_answer_length)`` matrix (11,520
    entries for 384 tokens), sorted a part at a time (``first`` spans or more, then 4x as many):
    a caller mostly stops after its first ``n_best_size`` spans.
    """
    width = len(offsets)
    length = max(min(max_answer_length, width), 0)
    in_context = np.fromiter((offset is not None for offset in offsets), dtype=bool, count=width)
    end_index = np.arange(width)[:, None] + np.arange(length)[None, :]
    valid = end_index < width
    end_index = np.where(valid, end_index, 0)
    valid &= in_context[:, None] & in_context[end_index]
    scores = np.where(valid, starts[:, None] + ends[end_index], -np.inf).ravel()
    # The k-th best of the starts' best spans bounds the k-th best span from below, so everything
    # at or above it is the k best spans and their ties: a prefix of the full order, found without
    # sorting all of the matrix.
    best_per_start = scores.reshape(width, length).max(axis=1, initial=-np.inf)
    with_spans = int(np.count_nonzero(best_per_start > -np.inf))
    done, wanted = 0, max(first, 1)
    while True:
        if wanted < with_spans:
            chosen = np.flatnonzero(scores >= np.partition(best_per_start, width - wanted)[width - wanted])
        else:
            chosen = np.flatnonzero(valid)
        order = chosen[np.argsort(-scores[chosen], kind="stable")]  # stable: ties stay in (s, e) order
        for flat in order[done:].tolist():
            s, d = divmod(flat, length)
            yield s, s + d
        if wanted >= with_spans:
            return
        done, wanted = len(order), wanted * 4


def postprocess_qa_predictions(
    contexts: Sequence[str],
    feature_example_index: Sequence[int],
    offsets: Sequence[Sequence],
    start_logits: Sequence[np.ndarray],
    end_logits: Sequence[np.ndarray],
    cls_index: Sequence[int],
    *,
    n_best_size: int = 20,
    max_answer_length: int = 30,
    version_2_with_negative: bool = False,
    null_score_diff_threshold: float = 0.0,
) -> list[dict[str, Any]]:
    """Window logits -> one answer per example (pure function, no model, no tokenizer).

    For each example, every window ``f`` with ``feature_example_index[f] == example`` proposes its
    ``n_best_size`` best valid spans, searched over all (start, end) token pairs: both context
    tokens (``offsets[f][i]`` not ``None``), in order and at most ``max_answer_length`` tokens long;
    a span's score is ``start_logit + end_logit``. (Pairing only the ``n_best_size`` best starts
    with the best ends, as transformers' ``run_qa`` does, can miss the best valid span, and makes the
    n-best probabilities jump when near-tied logits swap places.) A span is its characters widened to
    whole grapheme clusters and then without invisible characters at either end
    (:func:`pipelines.graphemes.visible_span`), so ``context[start:end] == text`` holds for every tokenizer; token
    pairs that give the same character span count once, with their best score, within a window and
    across overlapping windows. The n-best list is thus exactly the ``n_best_size`` best character
    spans of the example. Logit arrays may be longer than the window (padding); positions past
    ``len(offsets[f])`` are ignored.

    v2: the null score is ``start_logit[cls] + end_logit[cls]``, taken at its *minimum* over the
    windows (the window most sure an answer exists); "no answer" is predicted when
    ``null score - best span score > null_score_diff_threshold`` or no span is valid. The null
    candidate joins the n-best list, and the softmax over the n-best scores gives every candidate a
    probability; the null candidate's is the ``no_answer_probability``.

    Returns, in example order: ``prediction_text``, ``start``/``end`` (character span, ``0, 0`` for
    no answer), ``score`` (the prediction's n-best probability), ``no_answer_probability``
    (0.0 for v1), ``null_score_diff`` (v2, else None) and ``nbest`` (dicts with text, start, end,
    start_logit, end_logit, score, probability; best first).
    """
    windows_of: dict[int, list[int]] = collections.defaultdict(list)
    for feature, example in enumerate(feature_example_index):
        windows_of[int(example)].append(feature)

    results = []
    for example, context in enumerate(contexts):
        boundaries = grapheme_boundaries(context)
        spans: dict[tuple[int, int], dict[str, Any]] = {}
        null: dict[str, Any] | None = None
        for feature in windows_of.get(example, []):
            window_offsets = offsets[feature]
            width = len(window_offsets)
            starts = np.asarray(start_logits[feature][:width], dtype=np.float64)
            ends = np.asarray(end_logits[feature][:width], dtype=np.float64)
            cls = int(cls_index[feature])
            seen: set[tuple[int, int]] = set()
            null_score = starts[cls] + ends[cls]
            if null is None or null_score < null["score"]:
                null = {"text": "", "start": 0, "end": 0, "start_logit": float(starts[cls]), "end_logit": float(ends[cls]), "score": float(null_score)}
            for s, e in _ranked_spans(starts, ends, window_offsets, max_answer_length, 2 * n_best_size):
                char_span = visible_span(context, int(window_offsets[s][0]), int(window_offsets[e][1]), boundaries)
                if char_span is None:
                    continue
                if char_span in seen:
                    continue  # pairs come best first: its first pair gave this span its best score here
                seen.add(char_span)
                score = float(starts[s] + ends[e])
                if char_span not in spans or score > spans[char_span]["score"]:
                    spans[char_span] = {
                        "text": context[char_span[0] : char_span[1]], "start": char_span[0], "end": char_span[1],
                        "start_logit": float(starts[s]), "end_logit": float(ends[e]), "score": score,
                    }
                if len(seen) == n_best_size:
                    break
        ranked = sorted(spans.values(), key=lambda candidate: -candidate["score"])[:n_best_size]
        nbest = list(ranked)
        if version_2_with_negative and null is not None:
            # The best span always stays (n_best_size=1 too): without it the null candidate's
            # probability would be 1.0 for every example and the v2 threshold search meaningless.
            nbest = sorted(nbest[: max(n_best_size - 1, 1)] + [null], key=lambda candidate: -candidate["score"])
        if nbest:
            for candidate, probability in zip(nbest, _softmax(np.array([c["score"] for c in nbest]))):
                candidate["probability"] = float(probability)
        best_span = ranked[0] if ranked else None

        null_score_diff = None
        no_answer_probability = 0.0
        predicted = best_span
        if version_2_with_negative:
            no_answer_probability = null["probability"] if null is not None else 1.0
            if best_span is None:
                null_score_diff = float("inf")
            else:
                null_score_diff = null["score"] - best_span["score"] if null is not None else float("-inf")
            if null_score_diff > null_score_diff_threshold:
                predicted = None
        if predicted is None:
            text, start, end = "", 0, 0
            score = no_answer_probability if version_2_with_negative else 0.0
        else:
            text, start, end, score = predicted["text"], predicted["start"], predicted["end"], predicted.get("probability", 1.0)
        results.append({
            "prediction_text": text, "start": start, "end": end, "score": float(score),
            "no_answer_probability": float(no_answer_probability), "null_score_diff": null_score_diff, "nbest": nbest,
        })
    return results
