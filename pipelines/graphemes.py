"""Character spans made of whole grapheme clusters (what a reader sees as one character, UAX #29).

In:  a text and a character span ``[start, end)`` into it, e.g. from a tokenizer's offsets.
Out: the span widened to the clusters it touches, so ``text[start:end]`` never ends inside one.

Why: normalizers that strip accents (uncased WordPiece, ALBERT, DeBERTa-v2) leave combining marks out
of every piece's offsets, so a span built from offsets ended before the accent of "José" (NFD) or a
Devanagari vowel sign: QA answers and NER entities read "Jose", "नमस्त".
"""

from __future__ import annotations

import bisect

import regex  # transformers' own dependency; unlike re, it knows grapheme clusters (\X)

GRAPHEME = regex.compile(r"\X")


def grapheme_boundaries(text: str | None) -> list[int] | None:
    """Every grapheme cluster boundary of ``text`` in order (None for ASCII or no text, where each char is one)."""
    if text is None or text.isascii():
        return None
    return [0] + [match.end() for match in GRAPHEME.finditer(text)]


def whole_graphemes(start: int, end: int, boundaries: list[int] | None) -> tuple[int, int]:
    """``[start, end)`` widened to whole grapheme clusters (``boundaries`` from :func:`grapheme_boundaries`)."""
    if boundaries is None:
        return start, end
    return boundaries[bisect.bisect_right(boundaries, start) - 1], boundaries[bisect.bisect_left(boundaries, end)]
