"""Examples -> token windows: question/context pairs cut into overlapping windows, each labelled.

In:  a tokenizer and batches of ``question``, ``context`` (and, to train, ``answers``) columns, with
     ``max_length`` (``data.max_seq_length``) and ``doc_stride`` (``qa.doc_stride``).
Out: window features from :func:`prepare_features`: a long context becomes several windows of
     ``max_length`` tokens overlapping by ``doc_stride`` tokens. Training labels each window with the
     answer's token span (``start_positions``/``end_positions``), or with the CLS position when the
     window does not hold the whole answer or the question has none; evaluation features carry
     ``example_index``, the context-only ``offset_mapping`` and ``cls_index`` for
     :func:`tasks.qa.decoding.postprocess_qa_predictions`. Shared by the task and the pipeline.
"""

from __future__ import annotations

from typing import Sequence

from pipelines.errors import DataError
from pipelines.graphemes import GRAPHEME
from tasks.qa.decoding import trim_span


def question_first(tokenizer) -> bool:
    """Question then context when the tokenizer pads on the right (BERT); context first when it pads left (XLNet)."""
    return tokenizer.padding_side == "right"


def check_question_lengths(tokenizer, questions: Sequence[str], ids: Sequence[str], *, max_length: int, doc_stride: int,
                           where: str = "input") -> None:
    """Every window must hold the question and more than ``doc_stride`` context tokens; ``where`` names the split and file
    (or the --input) in the message."""
    if doc_stride >= max_length:
        raise DataError(f"qa.doc_stride ({doc_stride}) must be smaller than data.max_seq_length ({max_length})")
    specials = tokenizer.num_special_tokens_to_add(pair=True)
    lengths = [len(ids_) for ids_ in tokenizer([q.lstrip() for q in questions], add_special_tokens=False)["input_ids"]]
    for index, length in enumerate(lengths):
        room = max_length - specials - length
        if room <= doc_stride:
            raise DataError(
                f"{where}, example {index + 1} (id {ids[index]!r}): the question has {length} tokens, so a window of "
                f"data.max_seq_length={max_length} leaves {max(room, 0)} context tokens, not more than qa.doc_stride={doc_stride}; "
                f"shorten the question or raise data.max_seq_length / lower qa.doc_stride (question: {questions[index][:80]!r})"
            )


def encode_windows(tokenizer, questions: Sequence[str], contexts: Sequence[str], *, max_length: int, doc_stride: int):
    """Tokenise question/context pairs into overlapping windows (one example -> one or more features).

    Returns the tokenizer's ``BatchEncoding`` with ``overflow_to_sample_mapping`` (window -> example)
    and ``offset_mapping``; ``sequence_ids(i)`` tells question from context tokens.
    """
    questions = [question.lstrip() for question in questions]  # leading spaces only waste window room
    first = question_first(tokenizer)
    return tokenizer(
        questions if first else contexts,
        contexts if first else questions,
        truncation="only_second" if first else "only_first",
        max_length=max_length,
        stride=doc_stride,
        return_overflowing_tokens=True,
        return_offsets_mapping=True,
        padding=False,
    )


def context_offsets(offsets: Sequence[Sequence[int]], sequence_ids: Sequence[int | None], context_id: int) -> list:
    """Character offsets of context tokens; ``None`` for question and special tokens (never an answer)."""
    return [list(offset) if sequence_id == context_id else None for offset, sequence_id in zip(offsets, sequence_ids)]


def answer_token_span(offsets: Sequence, start_char: int, end_char: int, cls_index: int) -> tuple[int, int]:
    """Token positions of the answer ``[start_char, end_char)`` in one window, or ``(cls, cls)``.

    ``offsets`` come from :func:`context_offsets` (``None`` outside the context). A window that does
    not contain the whole answer is labelled with the CLS position, like an unanswerable question.
    """
    context_tokens = [i for i, offset in enumerate(offsets) if offset is not None]
    if not context_tokens:
        return cls_index, cls_index
    first, last = context_tokens[0], context_tokens[-1]
    if not (offsets[first][0] <= start_char and offsets[last][1] >= end_char):
        return cls_index, cls_index
    start = first
    while start <= last and offsets[start][1] <= start_char:
        start += 1
    end = last
    while end >= first and offsets[end][0] >= end_char:
        end -= 1
    return start, end


def answer_char_span(context: str, start_char: int, text: str) -> tuple[int, int]:
    """The characters of the answer ``text`` at ``start_char`` that a window's tokens must cover to hold it.

    Whitespace around the answer text and the combining marks that end its last grapheme (the accent
    of "José" in NFD, a Devanagari vowel sign) lie in no piece's offsets when the normalizer strips
    them (or at all, for whitespace): counted, an answer at the end of the context, or ending at a
    window's last token, was held by no window and trained as "no answer". Decoding widens a span to
    whole graphemes (:func:`pipelines.graphemes.whole_graphemes`), so the first character of the last
    grapheme is enough.
    """
    end_char = start_char + len(text)
    span = trim_span(context, start_char, end_char)
    if span is None:
        return start_char, end_char
    start, end = span
    last_grapheme = None
    for last_grapheme in GRAPHEME.finditer(context, start, end):
        pass
    return start, last_grapheme.start() + 1


def _cls_index(input_ids: list[int], sequence_ids: list[int | None], cls_token_id: int | None) -> int:
    """The position of the CLS token the tokenizer's template added (no text sequence owns it), 0 without one (the
    question's first piece: a tokenizer without a CLS token reads the question first, see ``QATask.build_tokenizer``).

    Not the first CLS id of the window: a context or question holding the text ``<cls>`` encodes it as that id, and
    XLNet's template puts its own CLS last, after the context. The text's token was then the no-answer position:
    trained towards, and its span's score taken for the null score, so SQuAD v2 never answered "no answer".
    """
    if cls_token_id is None:
        return 0
    return next((position for position, (token, part) in enumerate(zip(input_ids, sequence_ids))
                 if token == cls_token_id and part is None), 0)


def prepare_features(batch: dict[str, list], indices: list[int], *, tokenizer, max_length: int, doc_stride: int, train: bool) -> dict:
    """Examples -> window features; module-level so that ``datasets`` can hash it and cache the result.

    Every feature carries its example's index and its CLS position; train features add
    ``start_positions``/``end_positions``, eval features the context-only offsets for
    :func:`postprocess_qa_predictions`.
    """
    encoded = encode_windows(tokenizer, batch["question"], batch["context"], max_length=max_length, doc_stride=doc_stride)
    context_id = 1 if question_first(tokenizer) else 0
    sample_map = encoded.pop("overflow_to_sample_mapping")
    all_offsets = encoded.pop("offset_mapping")
    starts, ends, example_index, offsets_out, cls_out = [], [], [], [], []
    for window, sample in enumerate(sample_map):
        sequence_ids = encoded.sequence_ids(window)
        offsets = context_offsets(all_offsets[window], sequence_ids, context_id)
        cls_index = _cls_index(encoded["input_ids"][window], sequence_ids, tokenizer.cls_token_id)
        if train:
            answers = batch["answers"][sample]
            if answers["text"]:
                start_char, end_char = answer_char_span(batch["context"][sample], answers["answer_start"][0], answers["text"][0])
                start, end = answer_token_span(offsets, start_char, end_char, cls_index)
            else:
                start = end = cls_index
            starts.append(start)
            ends.append(end)
        else:
            offsets_out.append(offsets)
        example_index.append(indices[sample])
        cls_out.append(cls_index)
    features = dict(encoded)
    features.update(example_index=example_index, cls_index=cls_out)
    if train:
        features.update(start_positions=starts, end_positions=ends)
    else:
        features.update(offset_mapping=offsets_out)
    return features
