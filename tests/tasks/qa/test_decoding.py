"""Span decoding (tasks.qa.decoding): the n-best list is the exact best spans over all (start, end) pairs."""

from __future__ import annotations

import numpy as np
import pytest

from tasks.qa import postprocess_qa_predictions

# [CLS] q q [SEP] aa bb cc dd ee ff gg hh [SEP] [PAD] [PAD]
CONTEXT = "aa bb cc dd ee ff gg hh"
OFFSETS = [None, None, None, None] + [[3 * i, 3 * i + 2] for i in range(8)] + [None]
WIDTH = len(OFFSETS)  # 13 tokens: context tokens 4..11


def logits(width: int = WIDTH, base: float = -10.0, **values: float) -> np.ndarray:
    array = np.full(width, base)
    for key, value in values.items():
        array[int(key[1:])] = value
    return array


def decode(starts, ends, **options) -> dict:
    (result,) = postprocess_qa_predictions([CONTEXT], [0], [OFFSETS], [starts], [ends], [0], **options)
    return result


@pytest.mark.parametrize("case, starts, ends, options", [
    # The best starts all lie after the best ends.
    ("ends before starts", logits(p10=8.0, p11=8.0, p6=4.0), logits(p4=8.0, p5=8.0, p7=4.0), {}),
    # The best starts and ends are question tokens, or padding the model scored high.
    ("outside the context", logits(15, p1=9.0, p2=9.0, p13=9.0, p6=4.0), logits(15, p1=9.0, p3=9.0, p14=9.0, p7=4.0), {}),
    # The best start and end make a span longer than max_answer_length.
    ("too long", logits(p4=9.0, p5=9.0, p6=4.0), logits(p10=9.0, p11=9.0, p7=4.0), {"max_answer_length": 2}),
])
def test_decoding_finds_the_best_valid_span_that_the_best_starts_and_ends_miss(case, starts, ends, options):
    # Pairing only the 2 best starts with the 2 best ends found no valid span here: no answer, though
    # "cc dd" (start 4.0 + end 4.0) is valid and the best valid span.
    result = decode(starts, ends, n_best_size=2, **options)
    assert (result["prediction_text"], result["start"], result["end"]) == ("cc dd", 6, 11), case
    assert result["nbest"][0]["score"] == 8.0


def reference_nbest(contexts_windows, n_best_size, max_answer_length):
    """By hand: every valid (start, end) pair of every window, best score per character span, best first."""
    context, windows = contexts_windows
    best = {}
    for offsets, starts, ends in windows:
        for s in range(len(offsets)):
            for e in range(s, min(s + max_answer_length, len(offsets))):
                if offsets[s] is None or offsets[e] is None:
                    continue
                start, end = offsets[s][0], offsets[e][1]
                while start < end and context[start] == " ":
                    start += 1
                while end > start and context[end - 1] == " ":
                    end -= 1
                if start < end:
                    best[(start, end)] = max(best.get((start, end), -np.inf), starts[s] + ends[e])
    return sorted(((score, span) for span, score in best.items()), reverse=True)[:n_best_size]


@pytest.mark.parametrize("seed", range(20))
def test_decoding_nbest_is_the_best_character_spans_of_all_pairs(seed):
    # Two overlapping windows, and a lone-space piece (DeBERTa/ModernBERT) that makes several token
    # pairs give one character span: each span counts once, and no better span is left out for it.
    rng = np.random.default_rng(seed)
    context = "aa bb cc dd ee ff gg hh"
    pieces = [[0, 2]] + [piece for i in range(1, 8) for piece in ([3 * i - 1, 3 * i], [3 * i, 3 * i + 2])]  # aa, " ", bb, " ", cc ...
    windows = []
    for first, last in ((0, 9), (5, 15)):
        offsets = [None, None, None] + pieces[first:last] + [None]
        windows.append((offsets, rng.normal(size=len(offsets) + 2), rng.normal(size=len(offsets) + 2)))  # + padding
    n_best_size, max_answer_length = int(rng.integers(1, 8)), int(rng.integers(1, 6))
    (result,) = postprocess_qa_predictions(
        [context], [0, 0], [w[0] for w in windows], [w[1] for w in windows], [w[2] for w in windows], [0, 0],
        n_best_size=n_best_size, max_answer_length=max_answer_length,
    )
    expected = reference_nbest((context, [(o, s[: len(o)], e[: len(o)]) for o, s, e in windows]), n_best_size, max_answer_length)
    assert [(c["score"], (c["start"], c["end"])) for c in result["nbest"]] == expected
    assert (result["start"], result["end"]) == expected[0][1]


def test_decoding_score_is_continuous_at_the_n_best_cutoff():
    # n_best_size=2: the 2nd best start is token 9 or token 6 (near-tied); from 9 no span is valid
    # (the best ends lie before it), from 6 "cc dd" is. The 2nd n-best span, and with it the
    # softmax denominator, came and went with a 1e-6 change of one logit: 1.0 vs 0.99909.
    starts = logits(p4=5.0, p9=1.0, p6=1.0 - 5e-7)
    ends = logits(p5=5.0, p7=2.0)
    before = decode(starts, ends, n_best_size=2, max_answer_length=2)
    starts[6] += 1e-6
    after = decode(starts, ends, n_best_size=2, max_answer_length=2)
    assert abs(after["score"] - before["score"]) < 1e-5
    assert before["prediction_text"] == after["prediction_text"] == "aa bb"
    assert [c["text"] for c in before["nbest"]] == [c["text"] for c in after["nbest"]] == ["aa bb", "cc dd"]


def test_decoding_ties_go_to_the_earlier_start_then_the_earlier_end():
    # Every context pair scores the same: the n-best list is in (start, end) order, on every run.
    flat = np.zeros(WIDTH)
    result = decode(flat, flat, n_best_size=4, max_answer_length=2)
    assert [c["text"] for c in result["nbest"]] == ["aa", "aa bb", "bb", "bb cc"]


def test_decoding_reads_on_past_the_best_pairs_when_they_are_only_whitespace():
    # Lone-space pieces (DeBERTa-v2/v3, ModernBERT) can hold the best starts and ends: the first pairs
    # give no text at all, and the answer is the best pair after them.
    context = "aa  bb"
    offsets = [None, [0, 2], [2, 3], [3, 4], [4, 6], None]
    starts, ends = logits(6, p2=9.0, p3=8.5), logits(6, p2=9.0, p3=8.4, p4=0.0)
    (result,) = postprocess_qa_predictions([context], [0], [offsets], [starts], [ends], [0], n_best_size=1)
    assert (result["prediction_text"], result["start"], result["end"]) == ("bb", 4, 6)
    assert result["nbest"][0]["score"] == 9.0
