"""Sentences -> word-boundary windows of word pieces with aligned labels, and window predictions -> one per word.

In:  sentences as word lists (with tag ids when training), a fast tokenizer, the window size in
     pieces and the overlap (``ner.stride``); later, the model's per-piece tag ids and scores.
Out: one feature per window (model inputs, ``labels`` with -100 where no label is trained,
     ``example_index`` and ``word_index``: the sentence and the word each first piece starts), and
     per word the prediction of the window where the word has the most context on both sides.

Words are never cut by truncation: a sentence too long for one window is cut at word boundaries into
windows that overlap by about ``stride`` pieces. Predictions are read from first pieces only, so
metrics and entities count words, never pieces.
"""

from __future__ import annotations

from typing import Sequence

import numpy as np

from pipelines.errors import DataError

IGNORE_INDEX = -100


def b_to_i_map(label_names: Sequence[str]) -> list[int]:
    """Label id -> the id a continuation piece gets under ``label_all_tokens``: ``B-X`` -> ``I-X``."""
    index = {name: i for i, name in enumerate(label_names)}
    return [index.get("I-" + name[2:], i) if name.startswith("B-") else i for i, name in enumerate(label_names)]


def word_windows(piece_counts: Sequence[int], max_pieces: int, stride: int) -> list[tuple[int, int]]:
    """Cut a sentence at word boundaries into ``[start, end)`` word windows of at most ``max_pieces`` pieces.

    Consecutive windows share the trailing words of the previous one, up to ``stride`` pieces (at
    most half a window), so words near a cut also get context on both sides. Every word lies in some window; a
    single word longer than ``max_pieces`` gets a window of its own (the tokenizer truncates its
    tail pieces, but its first piece, which carries the prediction, survives).
    """
    count = len(piece_counts)
    if count == 0:
        return []
    # An overlap of more than half a window would make windows crawl forward a word at a time.
    stride = min(stride, max_pieces // 2)
    windows = []
    start = 0
    while True:
        end, used = start, 0
        while end < count and (end == start or used + piece_counts[end] <= max_pieces):
            used += piece_counts[end]
            end += 1
        windows.append((start, end))
        if end >= count:
            return windows
        # Step back from the end while the overlap stays within ``stride``; always move forward.
        next_start, overlap = end, 0
        while next_start - 1 > start and overlap + piece_counts[next_start - 1] <= stride:
            next_start -= 1
            overlap += piece_counts[next_start]
        # ... but never so far back that the next window could not reach a new word.
        while next_start < end and sum(piece_counts[next_start:end]) + piece_counts[end] > max_pieces:
            next_start += 1
        start = next_start


def align_labels(
    word_ids: Sequence[int | None], word_label_ids: Sequence[int], *, label_all_tokens: bool, b_to_i: Sequence[int]
) -> list[int]:
    """Piece labels from word labels: first piece of each word labelled, the rest -100 (or continued)."""
    labels = []
    previous = None
    for word in word_ids:
        if word is None:
            labels.append(IGNORE_INDEX)
        elif word != previous:
            labels.append(word_label_ids[word])
        else:
            labels.append(b_to_i[word_label_ids[word]] if label_all_tokens else IGNORE_INDEX)
        previous = word
    return labels


def first_piece_words(word_ids: Sequence[int | None], offset: int = 0) -> list[int]:
    """Per piece: the (sentence-level) index of the word it starts, or -1 (special or continuation piece)."""
    out = []
    previous = None
    for word in word_ids:
        out.append(word + offset if word is not None and word != previous else -1)
        previous = word
    return out


def tokenize_and_align(
    batch: dict[str, list], indices: list[int], *, tokenizer, max_length: int, stride: int,
    label2id: dict[str, int] | None, label_all_tokens: bool, b_to_i: list[int],
) -> dict[str, list]:
    """Sentences -> one feature per window. Module-level so that ``datasets`` can hash and cache it."""
    sentences = batch["tokens"]
    pieces = tokenizer(sentences, is_split_into_words=True, add_special_tokens=False)
    budget = max(1, max_length - tokenizer.num_special_tokens_to_add(pair=False))
    window_words_, window_example, window_offset = [], [], []
    for position, words in enumerate(sentences):
        counts = [0] * len(words)
        for word in pieces.word_ids(position):
            if word is not None:
                counts[word] += 1
        if label2id is not None:
            _refuse_entity_words_without_pieces(words, batch["tags"][position], counts, (batch.get("location") or [None] * len(sentences))[position])
        for start, end in word_windows(counts, budget, stride):
            window_words_.append(words[start:end])
            window_example.append(position)
            window_offset.append(start)
    if not window_words_:  # only empty sentences (raw-text predict inputs): no features; [] would read as one sentence
        empty = {**{name: [] for name in tokenizer.model_input_names}, "example_index": [], "word_index": []}
        return {**empty, "labels": []} if label2id is not None else empty
    encoded = tokenizer(window_words_, is_split_into_words=True, truncation=True, max_length=max_length)
    encoded["example_index"] = [indices[position] for position in window_example]
    encoded["word_index"] = []
    if label2id is not None:
        encoded["labels"] = []
    for window, (position, offset) in enumerate(zip(window_example, window_offset)):
        word_ids = encoded.word_ids(window)
        encoded["word_index"].append(first_piece_words(word_ids, offset))
        if label2id is not None:
            word_labels = [label2id[tag] for tag in batch["tags"][position][offset : offset + len(window_words_[window])]]
            encoded["labels"].append(align_labels(word_ids, word_labels, label_all_tokens=label_all_tokens, b_to_i=b_to_i))
    return encoded


def _refuse_entity_words_without_pieces(words: list[str], tags: list[str], counts: list[int], location: str | None) -> None:
    """A DataError naming the sentence when a word tagged as part of an entity gives the tokenizer no piece (BERT's
    drops U+FFFD and a lone combining mark): no model could predict its tag, and the entity was counted as missed."""
    for index, (word, tag, count) in enumerate(zip(words, tags, counts)):
        if count == 0 and tag != "O":
            raise DataError(f"{location or 'a sentence'}: word {index} {word!r} is tagged {tag!r} but the tokenizer gives it no "
                            "piece, so no model can predict it; tag it O, or drop the word")


def select_word_predictions(
    tag_ids: np.ndarray, tag_scores: np.ndarray, example_index: Sequence[int], word_index: Sequence[Sequence[int]],
    words_per_example: Sequence[int],
) -> tuple[list[list[int]], list[list[float]], list[list[int]]]:
    """Window predictions -> one (tag id, score) per word, from the window where the word has most context.

    A word's context in a window is the number of pieces on its thinner side, ``min(p, n - 1 - p)``
    for the word's first piece at position ``p`` of an ``n``-piece window. Returns tag ids (-1 for a
    word no window holds), scores, and each word's chosen context (for tests and diagnostics).
    """
    chosen_tags = [[-1] * count for count in words_per_example]
    chosen_scores = [[0.0] * count for count in words_per_example]
    context = [[-1] * count for count in words_per_example]
    for feature, (example, words) in enumerate(zip(example_index, word_index)):
        length = len(words)
        for position, word in enumerate(words):
            if word < 0:
                continue
            room = min(position, length - 1 - position)
            if room > context[example][word]:
                context[example][word] = room
                chosen_tags[example][word] = int(tag_ids[feature, position])
                chosen_scores[example][word] = float(tag_scores[feature, position])
    return chosen_tags, chosen_scores, context


def encode_word_windows(tokenizer, words: Sequence[str], *, max_length: int, stride: int):
    """One sentence's words -> its windows as ``bertpipe predict`` encodes them (model inputs + ``word_index``)."""
    return tokenize_and_align(
        {"tokens": [list(words)]}, [0], tokenizer=tokenizer, max_length=max_length, stride=stride,
        label2id=None, label_all_tokens=False, b_to_i=[],
    )
