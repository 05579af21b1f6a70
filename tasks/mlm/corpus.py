"""Corpus rows -> cleaned rows, documents and a held-out split (pure: strings and indices).

In:  the text rows of a split, in order (WikiText ``.tokens``/``.raw`` lines, ``.txt`` lines, a text column).
Out: :func:`clean_rows`: every row stripped, empty rows and (``drop_headings``) WikiText headings
     (`` = Title = ``, `` = = Section = = ``) dropped; :func:`split_documents`: the row indices of each
     document (top-level headings delimit them; else blank-line paragraphs; else rows);
     :func:`hold_out_documents`: whole documents for ``data.validation_fraction``, so no packed block
     straddles the train and held-out splits.
"""

from __future__ import annotations

import re
from typing import Iterable, Sequence

import numpy as np

from pipelines.errors import DataError

_HEADING = re.compile(r"^\s*(=\s+)+[^=].*?(\s+=)+\s*$")
_TOP_HEADING = re.compile(r"^\s*=\s+[^=](.*[^=])?\s+=\s*$")


def is_heading(line: str) -> bool:
    """WikiText section headings: `` = Title = ``, `` = = Section = = `` and deeper."""
    return bool(_HEADING.match(line))


def split_documents(rows: Sequence[str]) -> list[list[int]]:
    """Row indices grouped into documents, in corpus order.

    Top-level WikiText headings start documents when the corpus has at least two; otherwise blank
    rows separate paragraphs; otherwise every row is its own document.
    """
    starts = [i for i, row in enumerate(rows) if _TOP_HEADING.match(row)]
    if len(starts) >= 2:
        bounds = ([0] if starts[0] != 0 else []) + starts + [len(rows)]
        return [list(range(a, b)) for a, b in zip(bounds, bounds[1:]) if b > a]
    paragraphs, current = [], []
    for i, row in enumerate(rows):
        if row.strip():
            current.append(i)
        elif current:
            paragraphs.append(current)
            current = []
    if current:
        paragraphs.append(current)
    if len(paragraphs) >= 2:
        return paragraphs
    return [[i] for i in range(len(rows))]


def hold_out_documents(documents: list[list[int]], fraction: float, seed: int) -> tuple[list[int], list[int]]:
    """(train rows, held-out rows): a seeded random set of whole documents holding ``fraction`` of the rows.

    Both keep corpus order. At least one document goes each way when there are two or more.
    """
    if len(documents) < 2:
        raise DataError("data.validation_fraction: the corpus has a single document/row; it cannot be split")
    order = np.random.default_rng(seed).permutation(len(documents))
    total = sum(len(doc) for doc in documents)
    held, held_rows = set(), 0
    for index in order:
        if held and held_rows + len(documents[index]) / 2 > fraction * total:
            break
        held.add(int(index))
        held_rows += len(documents[index])
        if len(held) == len(documents) - 1:
            break
    train = [row for i, doc in enumerate(documents) if i not in held for row in doc]
    held_out = [row for i, doc in enumerate(documents) if i in held for row in doc]
    return train, held_out


def clean_rows(rows: Iterable[str], *, drop_headings: bool) -> list[str]:
    """Strip rows; drop empty ones and (optionally) WikiText headings."""
    kept = []
    for row in rows:
        row = (row or "").strip()
        if row and not (drop_headings and is_heading(row)):
            kept.append(row)
    return kept
