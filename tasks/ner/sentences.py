"""Sentences from files: CoNLL column files and json/jsonl rows -> ``tokens``/``tags``/``location``, and their checks.

In:  a CoNLL file (``token ... tag`` per line, a blank line between sentences, ``-DOCSTART-`` lines
     skipped) or json/jsonl rows; a sentence's tokens and tags with the run's tag set.
Out: one ``{"tokens", "tags", "location"}`` per sentence, ``location`` naming the file and line (or
     record) for every later error; a ``DataError`` naming that place for an empty sentence, a length
     mismatch, an unknown tag or a ragged column; the tag set in a stable order (``O`` first, then
     each type's ``B``/``I``/``E``/``S``).
"""

from __future__ import annotations

import json
import re
from pathlib import Path
from typing import Any, Sequence

from datasets import ClassLabel, Dataset

from pipelines.errors import DataError
from pipelines.files import check_no_lone_surrogate, json_records, naming_undecodable, text_encoding
from pipelines.graphemes import is_blank, normalisation_note

CONLL_SUFFIXES = (".txt", ".conll")
JSON_SUFFIXES = (".json", ".jsonl")
DOCSTART = "-DOCSTART-"
_PREFIX_RANK = {"B": 0, "I": 1, "E": 2, "L": 2, "S": 3, "U": 3}


_ASCII_SPACE = " \t\n\r\f\v"
_COLUMN_SEPARATOR = re.compile(f"[{re.escape(_ASCII_SPACE)}]+")


def read_conll(
    path: str | Path, *, token_column: int = 0, tag_column: int | None = -1, encoding: str = "utf-8"
) -> list[dict[str, Any]]:
    """CoNLL column file -> ``[{"tokens", "tags", "location"}]``, one dict per sentence.

    ``tag_column=None`` reads tokens only (inputs to predict: a file of one token per line is fine,
    and its sentences have no ``tags``).

    Columns are split on ASCII whitespace (a no-break space stays inside its token); every token line of a file must have as many columns as the
    first one. Blank lines end sentences (several in a row are one break); ``-DOCSTART-`` lines are
    document markers, not words. ``location`` is ``path:line`` of the sentence's first token.
    """
    path = Path(path)
    sentences: list[dict[str, Any]] = []
    tokens: list[str] = []
    tags: list[str] = []
    start_line = 0
    width: int | None = None
    width_line = 0

    def flush() -> None:
        if tokens:
            sentence = {"tokens": list(tokens), "location": f"{path}:{start_line}"}
            if tag_column is not None:
                sentence["tags"] = list(tags)
            sentences.append(sentence)
            tokens.clear()
            tags.clear()

    with naming_undecodable({"input": [path]}, encoding), open(path, encoding=encoding) as handle:
        for number, line in enumerate(handle, start=1):
            columns = _line_columns(line, number)
            if not columns:
                flush()
                continue
            if columns[0] == DOCSTART:
                flush()
                continue
            if width is None:
                width, width_line = len(columns), number
                for name, index in (("conll_token_column", token_column), ("conll_tag_column", tag_column)):
                    if index is not None and not -width <= index < width:
                        raise DataError(f"{path}:{number}: ner.{name}={index} but the file has {width} columns")
                if width < 2 and tag_column is not None:
                    raise DataError(f"{path}:{number}: a CoNLL line needs a token and a tag column, found {width} column: {line.rstrip()!r}")
            elif len(columns) != width:
                raise DataError(
                    f"{path}:{number}: {len(columns)} columns where the file has {width} (as on line {width_line}): {line.rstrip()!r}"
                )
            if not tokens:
                start_line = number
            tokens.append(columns[token_column])
            if tag_column is not None:
                tags.append(columns[tag_column])
    flush()
    return sentences


def _line_columns(line: str, number: int) -> list[str]:
    """A CoNLL line's columns (none for a blank line)."""
    if number == 1:
        # A byte-order mark (files saved by Windows editors) is not part of the first token: left
        # in, "\ufeff-DOCSTART-" became a one-word sentence of training and evaluation data.
        line = line.removeprefix("\ufeff")
    # ASCII whitespace only: str.split() also cuts at a no-break space inside a token ("10\u00a0000" in
    # French or German data), which then read as one column too many.
    stripped = line.strip(_ASCII_SPACE)
    return _COLUMN_SEPARATOR.split(stripped) if stripped else []


def holds_tagged_columns(path: str | Path, *, tag_column: int, tags: set[str], encoding: str = "utf-8") -> bool:
    """Whether a text file is CoNLL columns tagged with ``tags``: each line blank, a ``-DOCSTART-`` marker,
    or as many columns (two or more) as the first such line with one of ``tags`` in ``tag_column``."""
    width = None
    with naming_undecodable({"input": [path]}, encoding), open(path, encoding=encoding) as handle:
        for number, line in enumerate(handle, start=1):
            columns = _line_columns(line, number)
            if not columns or columns[0] == DOCSTART:
                continue
            width = width or len(columns)
            if width < 2 or len(columns) != width or not -width <= tag_column < width or columns[tag_column] not in tags:
                return False
    return width is not None


def read_json_rows(path: Path, *, encoding: str = "utf-8") -> list[dict[str, Any]]:
    """``.jsonl`` (one object a line) or ``.json`` (a list of objects) -> rows with a ``location``."""
    with naming_undecodable({"input": [path]}, encoding):
        text = path.read_text(encoding=text_encoding(encoding))  # a byte-order mark dropped: json refuses it
    if path.suffix.lower() == ".jsonl":
        return [{**row, "location": f"{path}:{number}"} for number, row in json_records(text, path)]
    try:
        loaded = json.loads(text)
    except json.JSONDecodeError as error:
        raise DataError(f"{path}:{error.lineno}: not valid JSON ({error.msg})") from None
    check_no_lone_surrogate(text, loaded, str(path))
    if isinstance(loaded, dict) and isinstance(loaded.get("data"), list):
        loaded = loaded["data"]
    if not isinstance(loaded, list) or not all(isinstance(row, dict) for row in loaded):
        raise DataError(f"{path}: expected a list of objects (or {{'data': [...]}}), one per sentence")
    return [{**row, "location": f"{path}, record {index}"} for index, row in enumerate(loaded, start=1)]


def sentences_dataset(rows: list[dict[str, Any]]) -> Dataset:
    return Dataset.from_list(rows) if rows else Dataset.from_dict({"tokens": [], "tags": [], "location": []})


def check_sentence(tokens: Sequence[str], tags: Sequence[Any], label_set: set[str], location: str) -> None:
    """Raise a DataError naming ``location`` for an empty sentence, a length mismatch, an unknown tag or an entity tag
    on a word with nothing visible."""
    if not isinstance(tokens, (list, tuple)) or not isinstance(tags, (list, tuple)):
        raise DataError(f"{location}: tokens and tags must be lists, got {type(tokens).__name__} and {type(tags).__name__}")
    if len(tokens) == 0:
        raise DataError(f"{location}: empty sentence (no tokens)")
    if len(tokens) != len(tags):
        raise DataError(f"{location}: {len(tokens)} tokens but {len(tags)} tags (sentence starts {' '.join(map(str, tokens[:8]))!r})")
    for position, (token, tag) in enumerate(zip(tokens, tags)):
        if tag not in label_set:
            raise DataError(
                f"{location}: word {position} {token!r} has tag {tag!r}, which is not in the label set {order_labels(label_set)}"
                f"{normalisation_note(tag, label_set) if isinstance(tag, str) else ''}"
            )
        # Tokenizers give an empty or invisible word no piece: it trained nothing and was predicted O, so an entity
        # tag on it was a gold entity no model could find, counted against every run's recall without a word.
        if tag != "O" and isinstance(token, str) and is_blank(token):
            raise DataError(
                f"{location}: word {position} {token!r} holds nothing visible but is tagged {tag!r}; no model can tag "
                "a word tokenizers give no piece, so evaluation would count an entity none can find. Remove the word or tag it O"
            )


def order_labels(tags) -> list[str]:
    """``O`` first, then chunk tags grouped by type (B, I, E, S within a type), then other tags sorted."""

    def key(tag: str) -> tuple:
        if tag == "O":
            return (0, "", 0)
        prefix, _, entity_type = tag.partition("-")
        if entity_type and prefix in _PREFIX_RANK:
            return (1, entity_type, _PREFIX_RANK[prefix])
        return (2, tag, 0)

    return sorted(set(tags), key=key)


def class_label_names(split: Dataset, column: str) -> list[str] | None:
    feature = split.features.get(column)
    inner = getattr(feature, "feature", None)
    return list(inner.names) if isinstance(inner, ClassLabel) else None
