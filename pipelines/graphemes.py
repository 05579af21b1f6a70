"""What a reader sees of a text: spans of whole grapheme clusters (UAX #29), and whether anything is visible.

In:  a text and a character span ``[start, end)`` into it, e.g. from a tokenizer's offsets; or a text.
Out: the span widened to the clusters it touches, so ``text[start:end]`` never ends inside one
     (:func:`whole_graphemes`), and then without what a reader cannot see at either end (:func:`visible_span`);
     whether a character is invisible and a text blank (:func:`is_blank`: what every reader of examples calls empty).

Why: normalizers that strip accents (uncased WordPiece, ALBERT, DeBERTa-v2) leave combining marks out
of every piece's offsets, so a span built from offsets ended before the accent of "José" (NFD) or a
Devanagari vowel sign: QA answers and NER entities read "Jose", "नमस्त".
"""

from __future__ import annotations

import bisect
import unicodedata
from typing import Iterable

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


def visible_span(text: str, start: int, end: int, boundaries: list[int] | None) -> tuple[int, int] | None:
    """``[start, end)`` of whole grapheme clusters with nothing invisible at either end; None when nothing visible is left.

    Widened first and trimmed after, because each undoes the other the other way round: trimmed first, a
    cluster that begins with a space (a combining mark after one, a piece of its own on XLM-R and DeBERTa-v2)
    or one that ends in a joiner (``"s\u200d"`` of ``"Paris\u200d❤️"``) brought the space or the joiner back.
    A cluster that begins with an invisible character is dropped whole: its marks sit on no visible base.
    An invisible character that ends a visible cluster (a trailing joiner) is cut off it, so the span may end
    inside that cluster, on the visible character before it. ``boundaries`` from :func:`grapheme_boundaries`.
    """
    start, end = whole_graphemes(start, end, boundaries)
    while start < end and is_invisible(text[start]):
        start = start + 1 if boundaries is None else boundaries[bisect.bisect_right(boundaries, start)]
    while start < end:
        last_cluster = end - 1 if boundaries is None else boundaries[bisect.bisect_right(boundaries, end - 1) - 1]
        if is_invisible(text[last_cluster]):
            end = last_cluster
        elif is_invisible(text[end - 1]):
            end -= 1
        else:
            break
    return (start, end) if start < end else None


def normalisation_note(text: str, candidates: Iterable[str]) -> str:
    """For a message saying ``text`` is not among ``candidates``: the candidate it differs from in Unicode
    normalisation alone ("café" composed and decomposed), which prints alike, and why; else nothing."""
    composed = unicodedata.normalize("NFC", text)
    twin = next((c for c in candidates if c != text and unicodedata.normalize("NFC", c) == composed), None)
    if twin is None:
        return ""
    return (f" ({text!r} and {twin!r} differ only in Unicode normalisation: one writes accents as separate combining "
            "characters (NFD), the other composed (NFC); write every file one way, e.g. unicodedata.normalize('NFC', ...))")


def is_invisible(char: str) -> bool:
    """Whitespace, a control or a format character (zero-width space, byte-order mark, bidi mark)."""
    return char.isspace() or unicodedata.category(char) in ("Cc", "Cf")


def is_blank(text: str) -> bool:
    """Nothing to read: only whitespace, control and format characters.

    A zero-width space, a byte-order mark or a bidi mark passes ``str.strip``, yet gives no piece on most
    tokenizers (their normalizers drop it) and an invisible one on byte-level BPE: an "example" of nothing.
    """
    return all(is_invisible(char) for char in text)
