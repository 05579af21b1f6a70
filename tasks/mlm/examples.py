"""Token rows -> training examples: packed blocks, or sentence pairs for next-sentence prediction (pure).

In:  the token ids of a split's rows (and their ``word_ids()``), a block or pair length, a generator.
Out: :func:`pack_blocks`: the token stream cut into blocks of ``max_seq_length`` content tokens (the
     last, shorter block keeps the remainder, so every token is used exactly once), with word numbers
     unique across rows (:func:`number_words`) for whole-word masking; :func:`make_sentence_pairs`:
     (segment A, segment B, next_sentence_label) as in BERT's pretraining data.
"""

from __future__ import annotations

from typing import Any, Sequence

import numpy as np

NO_WORD = -1


def number_words(word_ids_per_row: Sequence[Sequence[int | None]]) -> list[list[int]]:
    """Per-row ``word_ids()`` -> word numbers unique across the rows (so packed blocks keep words apart)."""
    numbered, offset = [], 0
    for word_ids in word_ids_per_row:
        present = [w for w in word_ids if w is not None]
        numbered.append([NO_WORD if w is None else w + offset for w in word_ids])
        offset += (max(present) + 1) if present else 0
    return numbered


def pack_blocks(token_rows: Sequence[Sequence[int]], word_rows: Sequence[Sequence[int]], block_length: int) -> list[tuple[list[int], list[int]]]:
    """Concatenate the rows' tokens and cut them into blocks of ``block_length`` (the last keeps the rest).

    Returns (token ids, word numbers) per block; every token appears exactly once, in order.
    """
    stream = [t for row in token_rows for t in row]
    words = [w for row in word_rows for w in row]
    return [(stream[i:i + block_length], words[i:i + block_length]) for i in range(0, len(stream), block_length)]


def make_sentence_pairs(
    token_rows: Sequence[Sequence[Any]], max_tokens: int, rng: np.random.Generator
) -> list[tuple[list[Any], list[Any], int]]:
    """(segment A, segment B, next_sentence_label) from consecutive rows, as in BERT's pretraining data.

    The rows' items are token ids, or any per-token values (``(token id, word number)`` pairs keep words
    through the cuts): only their counts decide the cuts, so the draws are the same either way.

    Rows are gathered into chunks of about ``max_tokens``; a chunk of several rows is cut at a random
    row boundary, a single long row at a random token. Half the time B is replaced by a stretch of
    the same length from elsewhere in the corpus (label 1, "not next"; 0 means B follows A). A + B
    is trimmed to ``max_tokens`` from the longer side (A at its start, B at its end).
    """
    stream = [t for row in token_rows for t in row]
    pairs, chunk, size = [], [], 0
    rows = [list(row) for row in token_rows if row]

    def flush(chunk: list[list[Any]]) -> None:
        if len(chunk) >= 2:
            cut = int(rng.integers(1, len(chunk)))
            a, b = [t for r in chunk[:cut] for t in r], [t for r in chunk[cut:] for t in r]
        else:
            tokens = chunk[0][: max_tokens]
            if len(tokens) < 2:
                return
            cut = int(rng.integers(1, len(tokens)))
            a, b = tokens[:cut], tokens[cut:]
        label = 0
        if rng.random() < 0.5 and len(stream) > len(a) + len(b):
            length = max(1, min(len(b), max_tokens - min(len(a), max_tokens - 1)))
            start = int(rng.integers(0, len(stream) - length + 1))
            b, label = stream[start:start + length], 1
        while len(a) + len(b) > max_tokens:
            if len(a) > len(b):
                a = a[1:]  # from the front, so that A still ends where B begins
            else:
                b = b[:-1]
        pairs.append((a, b, label))

    for row in rows:
        chunk.append(row)
        size += len(row)
        if size >= max_tokens:
            flush(chunk)
            chunk, size = [], 0
    if chunk:
        flush(chunk)
    return pairs
