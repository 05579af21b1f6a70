"""pipelines/graphemes.py: spans of whole grapheme clusters with nothing invisible at their edges."""

from __future__ import annotations

import pytest

from pipelines.graphemes import grapheme_boundaries, visible_span, whole_graphemes


def _visible(text: str, start: int, end: int) -> str | None:
    span = visible_span(text, start, end, grapheme_boundaries(text))
    return None if span is None else text[span[0] : span[1]]


def test_graphemes_whole_graphemes_widens_to_the_accent_the_offsets_left_out():
    text = "met Jose\u0301 today"
    assert text[slice(*whole_graphemes(4, 8, grapheme_boundaries(text)))] == "Jose\u0301"


@pytest.mark.parametrize(
    "text, start, end, expected",
    [
        # A combining mark after a space is one cluster with the space; XLM-R and DeBERTa-v2 give the mark a piece
        # of its own, whose offsets start at the mark: widened, the span began with the space.
        ("in \u0301Paris .", 3, 9, "Paris"),
        ("in \u0301Paris .", 2, 9, "Paris"),
        # "s\u200d" is one cluster: the pieces cover "Paris", widening brought the joiner back.
        ("in Paris\u200d\u2764\ufe0f .", 3, 8, "Paris"),
        ("in Paris\u200d\u2764\ufe0f .", 3, 9, "Paris"),
        # A space with a mark at the end goes whole too.
        ("Paris \u0301 .", 0, 7, "Paris"),
        # Whitespace and format characters at either end, ASCII and not.
        (" Paris ", 0, 7, "Paris"),
        ("\u200bParis\ufeff", 0, 7, "Paris"),
        # What is inside stays: an accent (widened to), a Persian non-joiner, a joined emoji, a space.
        ("met Jose\u0301 today", 4, 8, "Jose\u0301"),
        ("می\u200cخواهم", 0, 8, "می\u200cخواهم"),
        ("a 👩\u200d💻 b", 2, 5, "👩\u200d💻"),
        ("New York", 0, 8, "New York"),
        # Nothing visible: no span.
        ("a \u0301 b", 1, 3, None),
        ("a \u200b b", 1, 4, None),
        ("a  b", 1, 3, None),
    ],
)
def test_graphemes_visible_span_keeps_no_space_or_invisible_character_at_its_edges(text, start, end, expected):
    assert _visible(text, start, end) == expected


def test_graphemes_normalisation_note_says_why_two_strings_that_print_alike_differ():
    from pipelines.graphemes import normalisation_note

    note = normalisation_note("cafe\u0301", ["neg", "caf\u00e9"])
    assert "'cafe\u0301' and 'caf\u00e9' differ only in Unicode normalisation" in note and "NFC" in note
    assert normalisation_note("caf\u00e9", ["caf\u00e9", "neg"]) == ""  # the same string: nothing to explain
    assert normalisation_note("cafe", ["caf\u00e9"]) == ""
