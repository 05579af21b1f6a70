"""Words and entities: raw text -> words with character offsets, word tags -> entity spans in that text.

In:  a raw text (``bertpipe predict`` on ``.txt`` lines or a jsonl ``text``), or pre-split words; per
     word a tag name and a score; the run's tag set and, for strict runs, its scheme.
Out: CoNLL-like words with their ``(start, end)`` offsets; for chunk tags (``O``, ``B-X``...) entities
     ``{entity_group, word, start, end, score}`` chunked as the run's metric counts them (conlleval's
     lenient reading, or seqeval's strict one), with ``word == text[start:end]``; for other tag sets
     (POS) one ``{entity, word, start, end, score}`` per word.
"""

from __future__ import annotations

import re
from typing import Any, Sequence

import numpy as np
import regex  # transformers' own dependency; unlike re, its \w knows combining marks and joiners

# Raw text -> words: runs of word characters (joined by inner hyphens, apostrophes, dots, ampersands,
# slashes or soft hyphens, so "U.S", "1996-08-22", "AT&T" stay one word) or single punctuation marks.
# Word characters are Unicode's (UTS #18): letters, digits and also combining marks (Devanagari vowel
# signs and viramas, Thai vowels, decomposed accents "e\u0301") and the zero-width (non-)joiners inside
# Persian or Indic words. re's \w has no marks, so it cut "नरेंद्र" into 6 words and "José" (NFD) into 2.
# Invisible control and format characters between words (a byte-order mark, a zero-width space, bidi
# marks) separate words like spaces: as words of their own they were tagged (an entity "\ufeff" on
# byte-level BPE) or, mapped to no piece, tagged O inside an entity, splitting it. So is a joiner that
# does not join two word characters: one at a word's end ("Paris\u200d❤️") made the entity "Paris\u200d".
# A punctuation mark or symbol is a word with the rest of its grapheme cluster (UAX #29, \X): a
# variation selector ("❤\ufe0f"), a skin-tone modifier ("👍\U0001f3fd"), a keycap mark, a flag's second
# regional indicator, a zero-width-joined emoji sequence ("👩\u200d👧"). Cut off, a selector or modifier
# was a word of its own: tagged on cased and byte-level tokenizers (an entity of invisible text), and
# given other pieces than in the running text.
# CJK ideographs are words of one character each (with any marks or variation selectors after them),
# as BERT's tokenizer splits them and as Chinese NER data (MSRA, People's Daily, Weibo) is tokenised:
# as one run of word characters, "张三在北京工作" was a single word tagged by its first character, so
# "北京" could never be an entity of its own.
_IDEOGRAPH = r"[\p{Unified_Ideograph}\uf900-\ufaff\U0002f800-\U0002fa1f]"
_WORD_CHAR = rf"(?:(?!{_IDEOGRAPH})[\w\p{{N}}])"
_WORD = regex.compile(
    rf"(?!\p{{Join_Control}}){_WORD_CHAR}+(?:[-'’.&/\u00ad]{_WORD_CHAR}+)*(?<!\p{{Join_Control}})"
    rf"|{_IDEOGRAPH}\p{{M}}*|(?=[^\w\p{{N}}\s\p{{Cc}}\p{{Cf}}])\X"
)


def split_words(text: str) -> list[tuple[str, tuple[int, int]]]:
    """Raw text -> CoNLL-like words with their ``(start, end)`` character offsets in ``text``."""
    return [(match.group(), match.span()) for match in _WORD.finditer(text)]


def join_words(words: Sequence[str], separator: str = " ") -> tuple[str, list[tuple[int, int]]]:
    """Pre-tokenised words -> the text they make joined by ``separator``, and each word's offsets in it."""
    offsets, position = [], 0
    for word in words:
        offsets.append((position, position + len(word)))
        position += len(word) + len(separator)
    return separator.join(words), offsets


_CHUNK_TAG = re.compile(r"^(?:O|[BIESLU]-.+)$")


def is_chunk_tag_set(label_names: Sequence[str]) -> bool:
    """Whether the tags name chunks (``O``, ``B-X``, ``I-X``, ``E-``/``S-``/``L-``/``U-``): entities and
    seqeval's measures make sense for them, not for POS tags (``NNP`` is no chunk of type ``NP``)."""
    return all(_CHUNK_TAG.match(name) for name in label_names)


def word_tags(tag_ids: Sequence[int], label_names: Sequence[str]) -> list[str | None]:
    """A sentence's word tag ids (-1: no window held the word) -> tag names.

    A word no window could hold a piece of (a tokenizer that maps it to nothing) is tagged O among chunk
    tags, so that it is still counted rather than dropped; among other tags (POS) it has no tag (None):
    the tag set's first name would be a prediction nothing made.
    """
    chunks = is_chunk_tag_set(label_names)
    return [label_names[i] if i >= 0 else ("O" if chunks else None) for i in tag_ids]


def lenient_chunk_tags(tags: Sequence[str]) -> list[str]:
    """BILOU tags as IOBES (``L-`` as ``E-``, ``U-`` as ``S-``), which seqeval's lenient reading knows:
    it reads neither ``L-`` nor ``U-``, so ``U-PER U-PER`` was one entity of two names and ``B-LOC L-LOC
    U-LOC`` one of three words."""
    return [f"E-{tag[2:]}" if tag.startswith("L-") else f"S-{tag[2:]}" if tag.startswith("U-") else tag for tag in tags]


def sentence_entities(
    tags: Sequence[str], scores: Sequence[float], offsets: Sequence[tuple[int, int]], text: str, *, raw_text: bool,
    strict_scheme: str | None = None,
) -> list[dict[str, Any]]:
    """The entities ``bertpipe predict`` reports for one text (``start_word``/``end_word`` for given words only)."""
    entities = word_entities(tags, scores, offsets, text, strict_scheme=strict_scheme)
    if raw_text:  # word indices refer to our own split of the text: not part of the answer
        entities = [{k: v for k, v in e.items() if k not in ("start_word", "end_word")} for e in entities]
    return entities


def word_entities(
    tags: Sequence[str], scores: Sequence[float], offsets: Sequence[tuple[int, int]], text: str, *,
    strict_scheme: str | None = None,
) -> list[dict[str, Any]]:
    """Word tags -> entity spans with character offsets, chunked as the metric counts them: conlleval's
    lenient reading, or with ``strict_scheme`` (a run's ``ner.strict``) only the scheme's valid chunks."""
    if strict_scheme is None:
        from seqeval.metrics.sequence_labeling import get_entities

        chunks = get_entities(lenient_chunk_tags(tags))
    else:
        import seqeval.scheme

        scheme = getattr(seqeval.scheme, strict_scheme)
        chunks = [(e.tag, e.start, e.end - 1) for e in seqeval.scheme.Entities([list(tags)], scheme).entities[0]]
    entities = []
    for entity_type, first, last in chunks:
        # A word of spaces alone (" ", NBSP in a given word list) names no text: it neither starts nor ends an entity,
        # and an entity of nothing else is none (the model tags such a word as it tags any piece).
        while first <= last and not text[offsets[first][0] : offsets[first][1]].strip():
            first += 1
        while last >= first and not text[offsets[last][0] : offsets[last][1]].strip():
            last -= 1
        if first > last:
            continue
        start, end = offsets[first][0], offsets[last][1]
        entities.append({
            "entity_group": entity_type, "word": text[start:end], "start": start, "end": end,
            "score": round(float(np.mean(scores[first : last + 1])), 6), "start_word": first, "end_word": last + 1,
        })
    return entities


def word_records(
    tags: Sequence[str | None], scores: Sequence[float], offsets: Sequence[tuple[int, int]], text: str
) -> list[dict[str, Any]]:
    """Word tags of a tag set that names no chunks (POS) -> one ``{entity, word, start, end, score}`` per word,
    the fields of transformers' ungrouped token-classification output, for words instead of pieces."""
    return [
        {"entity": tag, "word": text[start:end], "start": start, "end": end, "score": round(float(score), 6)}
        for tag, score, (start, end) in zip(tags, scores, offsets)
    ]
