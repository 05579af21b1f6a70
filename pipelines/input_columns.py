"""A predict input's other columns, carried into its prediction rows so that predictions join back to the data.

In:  a table input (jsonl, csv, tsv, parquet) and the columns the task reads from it; the task's prediction rows.
Out: each other column as the list of its rows' values in a JSON form that keeps them (:func:`carried_input_columns`),
     read before the forward pass so that a value with no JSON form is a DataError naming column and row then,
     not after minutes of predicting; and the prediction rows with those columns added (:func:`with_input_columns`).
"""

from __future__ import annotations

import base64
import logging
from pathlib import Path
from typing import Any, Iterable

import pyarrow as pa

from pipelines.atomic_writes import json_safe
from pipelines.errors import DataError
from pipelines.files import json_records, read_inputs, text_encoding

logger = logging.getLogger(__name__)

_TABLE_SUFFIXES = (".jsonl", ".csv", ".tsv", ".parquet")


def carried_input_columns(input_path: str, read_columns: Iterable[str], encoding: str) -> dict[str, list[Any]]:
    """A table input's columns other than those the task reads (an ``id``, a gold label, a date), each as
    the list of its rows' values in JSON form, for :func:`with_input_columns`; ``{}`` for other inputs.

    A jsonl value is the one the file holds (a date string stays that string). A parquet value with no
    JSON type of its own is written as text that keeps it exactly (see ``_json_form``); one that has no
    such text is a DataError naming the column and row. NaN and infinities are null, as in every JSON
    file bertpipe writes.
    """
    suffix = Path(input_path).suffix.lower()
    if suffix not in _TABLE_SUFFIXES:
        return {}
    read_columns = set(read_columns)
    table = read_inputs(input_path, encoding=encoding)
    names = [name for name in table.column_names if name not in read_columns]
    # A table with none of the columns the task reads was not read as that table's rows: a nested SQuAD
    # document in a .jsonl is one row of 'version' and 'data', whose whole document was copied into the
    # prediction of its one question (and with more questions, the count mismatch ended in a traceback).
    if not names or read_columns.isdisjoint(table.column_names):
        return {}
    if suffix == ".jsonl":
        raw = _json_lines_columns(input_path, encoding, names, len(table))
        if raw is not None:
            return raw
    if suffix in (".csv", ".tsv"):
        # A csv cell has no type: an id "007" is copied as written, not as pandas' guess, the number 7.
        # (Nor is a date parsed: the cells are read as text.)
        table = read_inputs(input_path, encoding=encoding, text_columns=names)
    arrow = table.with_format("arrow")[:]
    return {name: _json_column(arrow[name], name, input_path) for name in names}


def _json_lines_columns(input_path: str, encoding: str, names: list[str], count: int) -> dict[str, list[Any]] | None:
    """The ``names`` of each JSON-lines record as the file wrote them; None when the file is not one record
    per line for each of the reader's ``count`` rows (one JSON array of rows, which the reader also takes).

    The reader's table is not what the file held: pyarrow types an ISO date string as a timestamp
    ("2024-03-05T10:00:00Z" came back as a naive datetime, its zone dropped), makes every number of a
    column with one decimal a float (an id 1 became 1.0) and fills a missing key of a nested object with
    null. The reader cannot be told to keep strings: ``datasets`` hands pyarrow no schema, and its
    ``features`` only casts the parsed timestamp back ("2024-01-02 00:00:00", not what the file said).
    """
    text = Path(input_path).read_text(encoding=text_encoding(encoding))
    try:
        records = [record for _, record in json_records(text, input_path)]
    except DataError:
        return None
    if len(records) != count:
        return None
    return {name: [json_safe(record.get(name)) for record in records] for name in names}


def _json_column(column: pa.ChunkedArray, name: str, input_path: str) -> list[Any]:
    if _is_json_native(column.type):
        return [json_safe(value) for value in column.to_pylist()]
    values = []
    for row, scalar in enumerate(column, start=1):
        try:
            values.append(_json_form(scalar))
        except (ValueError, OverflowError, TypeError) as error:
            raise DataError(
                f"--input {input_path}, row {row}: column {name!r} ({column.type}) holds a value the output cannot carry "
                f"as JSON ({error}); drop or convert the column, or predict from a copy of the file without it"
            ) from None
    return values


def _is_json_native(arrow_type: pa.DataType) -> bool:
    """Whether ``to_pylist`` gives JSON values (str, int, float, bool, None, and lists and objects of them)."""
    if pa.types.is_list(arrow_type) or pa.types.is_large_list(arrow_type) or pa.types.is_fixed_size_list(arrow_type):
        return _is_json_native(arrow_type.value_type)
    if pa.types.is_struct(arrow_type):
        return all(_is_json_native(field.type) for field in arrow_type)
    return (pa.types.is_string(arrow_type) or pa.types.is_large_string(arrow_type) or pa.types.is_integer(arrow_type)
            or pa.types.is_float32(arrow_type) or pa.types.is_float64(arrow_type) or pa.types.is_boolean(arrow_type)
            or pa.types.is_null(arrow_type))


_FRACTION_DIGITS = {"s": 0, "ms": 3, "us": 6, "ns": 9}


def _json_form(scalar: pa.Scalar) -> Any:
    """One Arrow value as JSON that keeps it exactly, whatever reads the output (jq, Spark, pandas).

    Timestamps, dates and times are ISO-8601 strings (a zoned timestamp in its zone, with its offset) and a
    duration an ISO-8601 ``PT<seconds>S``, each to the column's precision: a number would need its unit
    and epoch said elsewhere. A decimal is the string of its exact value at the column's scale ("19.90"),
    not a float, which rounds an amount of money. Bytes are base64 (RFC 4648), as BigQuery and
    protobuf's JSON write them: refusing the column would make a file with a binary key or hash
    unpredictable, and base64 decodes back to the very bytes.
    """
    arrow_type = scalar.type
    if not scalar.is_valid:
        return None
    if pa.types.is_dictionary(arrow_type):
        return _json_form(scalar.value)
    if pa.types.is_timestamp(arrow_type) or pa.types.is_date(arrow_type):
        # For ns, as_py gives a pandas Timestamp, whose isoformat keeps the nanoseconds. Past the year 9999
        # no Python date exists: as_py raises, and the caller names the column and row.
        return scalar.as_py().isoformat()
    if pa.types.is_time(arrow_type):
        # From the stored integer: as_py cuts a time64[ns] to microseconds without a word.
        digits = _FRACTION_DIGITS[arrow_type.unit]
        seconds, fraction = divmod(scalar.value, 10 ** digits)
        clock = f"{seconds // 3600:02d}:{seconds // 60 % 60:02d}:{seconds % 60:02d}"
        return clock + (f".{fraction:0{digits}d}" if fraction else "")
    if pa.types.is_duration(arrow_type):
        digits = _FRACTION_DIGITS[arrow_type.unit]
        seconds, fraction = divmod(abs(scalar.value), 10 ** digits)
        sign = "-" if scalar.value < 0 else ""
        return f"{sign}PT{seconds}" + (f".{fraction:0{digits}d}".rstrip("0") if fraction else "") + "S"
    if pa.types.is_decimal(arrow_type):
        return format(scalar.as_py(), "f")  # str() would write 1E-7
    if (pa.types.is_binary(arrow_type) or pa.types.is_large_binary(arrow_type) or pa.types.is_fixed_size_binary(arrow_type)
            or pa.types.is_binary_view(arrow_type)):
        return base64.b64encode(scalar.as_py()).decode("ascii")
    if pa.types.is_list(arrow_type) or pa.types.is_large_list(arrow_type) or pa.types.is_fixed_size_list(arrow_type):
        return [_json_form(item) for item in scalar.values]
    if pa.types.is_struct(arrow_type):
        return {field.name: _json_form(scalar[index]) for index, field in enumerate(arrow_type)}
    value = json_safe(scalar.as_py())
    if not _is_json_value(value):
        raise TypeError(f"{type(value).__name__} has no JSON form")
    return value


def _is_json_value(value: Any) -> bool:
    if isinstance(value, dict):
        return all(isinstance(key, str) and _is_json_value(item) for key, item in value.items())
    if isinstance(value, list):
        return all(_is_json_value(item) for item in value)
    return value is None or isinstance(value, (str, int, float, bool))


def with_input_columns(rows: list[dict[str, Any]], carried: dict[str, list[Any]], input_path: str) -> list[dict[str, Any]]:
    """Each prediction row followed by its input row's other columns (``carried``, from
    :func:`carried_input_columns`), so predictions join back to the data they came from.

    A column named like a field of the prediction is left out (the prediction wins; one warning names
    it). Every task writes one prediction row per row of a table input, in order.
    """
    if not carried:
        return rows
    count = len(next(iter(carried.values())))
    if count != len(rows):
        raise RuntimeError(f"{len(rows)} predictions for the {count} rows of {input_path}: a task must predict each row once")
    fields = {field for row in rows for field in row}
    clashing = sorted(name for name in carried if name in fields)
    if clashing:
        logger.warning("%s: column(s) %s share names with prediction fields and are not copied into the output; rename them to keep them",
                       input_path, clashing)
    values = {name: column for name, column in carried.items() if name not in fields}
    return [{**row, **{name: column[index] for name, column in values.items()}} for index, row in enumerate(rows)]
