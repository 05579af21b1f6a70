"""Parallel text -> language columns -> token features.

In:  a split in the flat layout (one column per language) or the WMT layout (a ``translation`` column of
     ``{lang: text}`` dicts); for features, a batch of source/target texts and the tokenizer.
Out: the split with one text column per requested language (errors name split, row and key; rows count
     from 1), the rows whose text is empty, and ``input_ids``/``attention_mask``/``labels`` (labels without a
     leading decoder start token, which the model prepends itself) with each text's length before truncation
     (``source_length``/``target_length``, for the task to say what was cut; it removes them).
"""

from __future__ import annotations

from functools import partial

from datasets import Dataset

from pipelines.data import KeyedOnCode, tokenize_with_lengths
from pipelines.errors import DataError
from pipelines.graphemes import is_blank


def to_language_columns(split: Dataset, languages: list[str], translation_column: str, split_name: str) -> Dataset:
    """Flat language columns, or the WMT ``translation`` dicts unpacked into them; errors name row and key."""
    if all(lang in split.column_names for lang in languages):
        return split
    if translation_column not in split.column_names:
        missing = [lang for lang in languages if lang not in split.column_names]
        raise DataError(
            f"split {split_name!r} has no column(s) {missing} and no {translation_column!r} column of "
            f"{{lang: text}} dicts; available columns: {split.column_names}. Set translation.source_lang / "
            "translation.target_lang to the language columns"
        )
    present = [lang for lang in languages if lang in split.column_names]
    return split.map(
        KeyedOnCode(_unpack_translation), batched=True, with_indices=True, remove_columns=[translation_column, *present],
        fn_kwargs={"languages": languages, "translation_column": translation_column, "split_name": split_name},
        desc="unpacking translation dicts",
    )


def _unpack_translation(batch: dict, indices: list[int], *, languages: list[str], translation_column: str, split_name: str) -> dict:
    columns: dict[str, list[str]] = {lang: [] for lang in languages}
    for index, pair in zip(indices, batch[translation_column]):
        row = f"row {index + 1} (rows count from 1)"
        if not isinstance(pair, dict):
            raise DataError(f"split {split_name!r}, {row}: {translation_column!r} holds {type(pair).__name__}, not a {{lang: text}} dict")
        for lang in languages:
            if pair.get(lang) is None:
                present = sorted(key for key, value in pair.items() if value is not None)
                raise DataError(f"split {split_name!r}, {row}: the {translation_column!r} dict has languages {present}, not {lang!r}")
            if not isinstance(pair[lang], str):
                raise DataError(f"split {split_name!r}, {row}: the {translation_column!r} dict holds {type(pair[lang]).__name__} "
                                f"under {lang!r}, not text")
            columns[lang].append(pair[lang])
    return columns


def empty_rows(split: Dataset, columns: list[str]) -> list[int]:
    """Rows where any of ``columns`` is missing or blank (only whitespace and invisible characters)."""
    empty: set[int] = set()
    for column in columns:
        empty.update(row for row, text in enumerate(split[column]) if text is None or is_blank(str(text)))
    return sorted(empty)


def strip_decoder_start(label_ids: list[int], decoder_start_token_id: int | None) -> list[int]:
    """BERT tokenizers open targets with [CLS], which is also the decoder start: the model would learn to
    predict [CLS] after [CLS]. Labels begin at the first real token; the model prepends the start itself."""
    if decoder_start_token_id is not None and label_ids and label_ids[0] == decoder_start_token_id:
        return label_ids[1:]
    return label_ids


def _tokenize(batch: dict[str, list], *, tokenizer, source_column: str, target_column: str | None, prefix: str,
              max_source_length: int, max_target_length: int, decoder_start_token_id: int | None) -> dict:
    """Module-level (not a closure) so that ``datasets`` can hash it and cache the result."""
    # A predict input row without a source (kept in place, translated as "") tokenises as "".
    sources = [prefix + (text or "") for text in batch[source_column]]
    encoded, source_lengths = tokenize_with_lengths(partial(tokenizer, return_token_type_ids=False), [sources], max_source_length)
    encoded["source_length"] = source_lengths
    if target_column is not None:
        labels, target_lengths = tokenize_with_lengths(lambda texts, **options: tokenizer(text_target=texts, **options),
                                                       [batch[target_column]], max_target_length)
        encoded["target_length"] = target_lengths
        encoded["labels"] = [strip_decoder_start(ids, decoder_start_token_id) for ids in labels["input_ids"]]
    return encoded
