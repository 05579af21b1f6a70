"""Raw datasets for any task: Hub ids (through the mirror), local folders and local files.

In:  a :class:`~pipelines.config.DataConfig` (``path``/``name`` or ``files``, split names, sampling).
Out: a ``DatasetDict`` holding at least the train and eval splits, each non-empty, sampled to
     ``max_train_samples`` / ``max_eval_samples``, with a held-out eval split carved from train
     when the data has none and ``validation_fraction`` is set.

Tasks with their own file formats (CoNLL columns, nested SQuAD JSON) read them themselves and
hand the result to :func:`finalize_splits` so that sampling and checks stay in one place.

:func:`prepare_data` is a job's data end to end (raw splits, tokenizer, train and eval features): the
one place ``train()`` and both benchmark paths get it from, so they run on the same features.
"""

from __future__ import annotations

import codecs
import csv
import functools
import hashlib
import json
import logging
import sys
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any, Callable, Iterable, Iterator

import datasets
from datasets import Dataset, DatasetDict
from datasets.exceptions import DatasetGenerationError

from pipelines.config import DataConfig
from pipelines.errors import UserError, describe, failures_named
from pipelines.hub import resolve_dataset

if TYPE_CHECKING:
    from pipelines.config import RunConfig
    from pipelines.task import Task

logger = logging.getLogger(__name__)


class DataError(UserError, ValueError):
    """Input data that cannot be used as configured; the message names the file/split/column."""


_BUILDER_BY_SUFFIX = {
    ".csv": ("csv", {}),
    ".tsv": ("csv", {"delimiter": "\t"}),
    ".json": ("json", {}),
    ".jsonl": ("json", {}),
    ".parquet": ("parquet", {}),
    ".txt": ("text", {}),
    # Plain-text corpora under their customary names (WikiText ships .tokens and .raw).
    ".tokens": ("text", {}),
    ".raw": ("text", {}),
}


def builder_for_files(files: dict[str, str | list[str]]) -> tuple[str, dict]:
    """The ``datasets`` builder and its options for a set of local files (one format at a time)."""
    suffixes = {Path(path).suffix.lower() for paths in files.values() for path in _as_list(paths)}
    unknown = suffixes - set(_BUILDER_BY_SUFFIX)
    if unknown:
        raise DataError(f"data.files: unsupported file type(s) {sorted(unknown)}; use one of {sorted(_BUILDER_BY_SUFFIX)}")
    formats = {(_BUILDER_BY_SUFFIX[s][0], tuple(_BUILDER_BY_SUFFIX[s][1].items())) for s in suffixes}
    if len(formats) != 1:
        raise DataError(f"data.files mixes formats {sorted(suffixes)}; give all splits in one format")
    builder, options = formats.pop()
    return builder, dict(options)


def _as_list(paths: str | list[str]) -> list[str]:
    return [paths] if isinstance(paths, str) else list(paths)


def check_files_exist(files: dict[str, str | list[str]]) -> None:
    """Every configured file exists (before ``datasets`` reports a missing one without its key)."""
    for split, paths in files.items():
        for path in _as_list(paths):
            if not Path(path).is_file():
                raise DataError(f"data.files.{split}: file {path} {_not_a_file(Path(path))}")


def _not_a_file(path: Path) -> str:
    """Why ``path`` is not a readable file, in the words a message needs."""
    if not path.exists():
        return "does not exist"
    return "is a folder, not a file" if path.is_dir() else "is not a regular file"


@contextmanager
def naming_undecodable(paths_by_label: dict[str, list[str | Path]], encoding: str, *, scan_first: bool = False) -> Iterator[None]:
    """Turn a read that failed on a bad byte into a DataError naming the file, line and byte.

    The files are scanned only after a read has failed, so a good corpus is read once; a read that
    failed for another reason re-raises unchanged. ``scan_first`` scans before the read too, for
    readers that accept bad bytes silently. The label (e.g. ``data.files.train``) starts the
    message so the user knows which setting to fix.
    """

    def scan() -> None:
        for label, paths in paths_by_label.items():
            for path in paths:
                check_decodes(path, encoding, where=label)

    if scan_first:
        scan()
    try:
        yield
    except (UnicodeError, DatasetGenerationError):
        scan()
        raise


_BINARY_SUFFIXES = {".parquet", ".arrow"}


def check_decodes(path: str | Path, encoding: str, *, where: str = "input") -> None:
    """Raise a DataError naming the line and byte when a text file is not valid ``encoding``.

    ``datasets`` reports a bad byte as a generic generation error without the file, and one
    Latin-1 book among UTF-8 ones is a common way to meet it. Decoding in chunks keeps memory flat.
    """
    path = Path(path)
    if path.suffix.lower() in _BINARY_SUFFIXES:
        return
    decoder = codecs.getincrementaldecoder(encoding)()
    offset, line = 0, 1
    with open(path, "rb") as handle:
        while chunk := handle.read(1 << 20):
            pending = decoder.getstate()[0]  # the start of a character split across chunks
            try:
                decoder.decode(chunk)
            except UnicodeDecodeError as error:
                buffer = pending + chunk
                bad = offset - len(pending) + error.start
                line += buffer[len(pending): error.start].count(b"\n")
                context = buffer[max(0, error.start - 30): error.start + 10]
                raise DataError(
                    f"{where}: {path}, line {line} (byte {bad}): byte 0x{buffer[error.start]:02x} is not valid {encoding} "
                    f"(near {context!r}); set data.encoding to the file's encoding (e.g. latin-1, cp1252) "
                    f"or convert it (iconv -f latin1 -t utf-8)"
                ) from None
            offset += len(chunk)
            line += chunk.count(b"\n")
    try:
        decoder.decode(b"", final=True)
    except UnicodeDecodeError:
        raise DataError(f"{where}: {path} ends inside a multi-byte {encoding} character (truncated file?)") from None


def json_lines(text: str) -> Iterator[tuple[int, str]]:
    """The non-blank lines of a JSON-lines text with their 1-based numbers.

    Splits on ``\\n`` only: ``str.splitlines()`` also splits at U+2028 and other separators that a JSON
    string may hold raw, which would cut a record in two.
    """
    for number, line in enumerate(text.split("\n"), start=1):
        if line.strip():
            yield number, line


def json_records(text: str, source: str | Path) -> Iterator[tuple[int, dict[str, Any]]]:
    """(line number, object) per non-blank line of a JSON-lines text; a line that is not a JSON object
    is one ``DataError`` naming ``source`` and the line."""
    for number, line in json_lines(text):
        try:
            record = json.loads(line)
        except json.JSONDecodeError as error:
            raise DataError(f"{source}, line {number}: not valid JSON ({error.msg} at column {error.colno})") from None
        if not isinstance(record, dict):
            raise DataError(f"{source}, line {number}: a JSON-lines record must be an object, got {type(record).__name__}")
        yield number, record


def load_split_files(
    files: dict[str, str | list[str]], read_file: Callable[[Path], list[dict[str, Any]]],
    to_dataset: Callable[[list[dict[str, Any]]], Dataset],
) -> DatasetDict:
    """``data.files`` through a task's own reader: each split's files in order, their rows one Dataset."""
    check_files_exist(files)
    return DatasetDict({
        split: to_dataset([row for path in _as_list(paths) for row in read_file(Path(path))]) for split, paths in files.items()
    })


def _reader_accepts_bad_bytes(builder: str, encoding: str) -> bool:
    # For UTF-8 the JSON builder hands the raw bytes to pyarrow, which stores invalid UTF-8 in the Arrow
    # column without complaint: the bad row would fail only when read, long after caching. Other
    # encodings it decodes in Python first, which fails on the spot like the text and csv builders.
    return builder == "json" and codecs.lookup(encoding).name == "utf-8"


def _load_local_files(files: dict[str, str | list[str]], encoding: str, *, label: str, text_columns: Iterable[str | None] = ()) -> DatasetDict:
    """``datasets``' builder for the files' format, decoding text in ``encoding``; a bad byte names
    ``label + split``, the file, line and byte. csv/tsv ``text_columns`` are read as written."""
    builder, options = builder_for_files(files)
    if builder == "csv":
        # pandas reads a cell "None", "NA", "null" or "nan" as missing and a column of numbers as
        # numbers: the intent label "None" (common in intent data) became an empty cell, the text "NA"
        # a missing one, and the text "007" the number 7 (and a text column typed per 10,000-row chunk:
        # numbers in one, strings in the next). Only an empty cell is missing; text stays text.
        options.update(keep_default_na=False, na_values=[""], converters={column: str for column in text_columns if column})
    if builder != "parquet":
        # utf-8-sig reads utf-8 alike and drops a leading byte-order mark (Windows editors write one): the
        # text reader kept it in a file's first example ("\ufeffgood film"), another input for byte-level
        # BPE. The json and csv readers drop it themselves.
        utf8 = codecs.lookup(encoding).name == "utf-8"
        options["encoding"] = "utf-8-sig" if builder == "text" and utf8 else encoding
    data_files = {split: _as_list(paths) for split, paths in files.items()}
    paths_by_label = {label + split: paths for split, paths in data_files.items()}
    if options.get("delimiter") == "\t":
        options["quoting"] = _tsv_quoting(paths_by_label, encoding)
    if builder == "csv":
        _check_unique_header(paths_by_label, encoding, options.get("delimiter", ","), options.get("quoting", csv.QUOTE_MINIMAL))
    try:
        with naming_undecodable(paths_by_label, encoding, scan_first=_reader_accepts_bad_bytes(builder, encoding)):
            return datasets.load_dataset(builder, data_files=data_files, **options)
    except UserError:
        raise
    except Exception as error:  # whatever the builder raised: find the file (and line) that caused it
        raise _blame_file(error, builder, options, paths_by_label, encoding) from error


def _tsv_quoting(paths_by_label: dict[str, list[str]], encoding: str) -> int:
    """How to read tab-separated files: with csv quoting when they were written with it, else without.

    Both kinds are common. Plain TSV (GLUE, Tatoeba, most corpora) has no quoting: a sentence opening
    with a quote (``"Hello" he said``) is text, and reading it as csv silently drops those quotes or
    runs the field on to a later closing quote. Writers with csv quoting (pandas, R, Python's csv) wrap
    a field holding a quote in quotes and double the inner ones, which a plain read would keep. A file
    whose quoted fields all parse as csv quoting is read with it; any other is plain.
    """
    quoted, plain = [], []
    for label, paths in paths_by_label.items():
        for path in paths:
            kind = _tsv_kind(Path(path), encoding)
            if kind is not None:
                (quoted if kind == "quoted" else plain).append(f"{label}: {path}")
    if quoted and plain:
        raise DataError(
            f"the tsv files quote differently: {'; '.join(quoted)} wrap(s) fields in quotes as csv does, "
            f"{'; '.join(plain)} hold(s) unquoted text with quotes in it; write them all one way"
        )
    return csv.QUOTE_NONE if plain else csv.QUOTE_MINIMAL


def _check_unique_header(paths_by_label: dict[str, list[str]], encoding: str, delimiter: str, quoting: int) -> None:
    """A csv/tsv header naming a column twice is a DataError naming the file and column.

    pandas renames the second ``text`` to ``text.1`` without a word, so the first one was read as the
    text (or the labels) whichever the user meant.
    """
    for label, paths in paths_by_label.items():
        for path in paths:
            try:
                with open(path, encoding="utf-8-sig" if codecs.lookup(encoding).name == "utf-8" else encoding, newline="") as handle:
                    header = next(csv.reader(handle, delimiter=delimiter, quoting=quoting), [])
            except (OSError, UnicodeError, csv.Error):
                continue  # the read itself names the file (and the byte)
            seen: dict[str, int] = {}
            for number, name in enumerate(header, start=1):
                if name.strip() and name in seen:
                    raise DataError(
                        f"{label}: {path}: the header names column {name!r} twice (columns {seen[name]} and {number}); "
                        "give each column its own name"
                    )
                seen.setdefault(name, number)


def _tsv_kind(path: Path, encoding: str) -> str | None:
    """``quoted`` (a field opens with a quote and the file parses as csv quoting), ``plain`` (it does
    not parse so) or None (no field opens with a quote, so both reads agree; or the read will fail)."""
    opens_with_quote = False

    def lines(handle):
        nonlocal opens_with_quote
        for line in handle:
            opens_with_quote = opens_with_quote or line.startswith('"') or '\t"' in line
            yield line

    try:
        with open(path, encoding=encoding, newline="") as handle:
            for _ in csv.reader(lines(handle), delimiter="\t", strict=True):
                pass
    except csv.Error:
        return "plain"
    except (OSError, UnicodeError):
        return None  # the read itself names the file (and the byte)
    return "quoted" if opens_with_quote else None


def _blame_file(error: Exception, builder: str, options: dict, paths_by_label: dict[str, list[str]], encoding: str) -> DataError:
    """A DataError naming the file (and line) that made a multi-file load fail.

    Runs only after a failure. Each file is checked on its own: first for the common shapes of bad
    input (empty, header only, a line that is not JSON), then by loading it alone, which catches
    whatever else the reader rejects (a ragged csv row, ...). When every file loads alone, the
    files disagree with each other, which ``datasets`` reports without naming them: their columns
    are listed side by side.
    """
    features: dict[str, datasets.Features] = {}
    for label, paths in paths_by_label.items():
        for path in paths:
            problem = _file_shape_problem(Path(path), builder, encoding, where=f"{label}: {path}")
            if problem:
                return DataError(problem)
            try:
                alone = datasets.load_dataset(builder, data_files={"alone": [path]}, **options)["alone"]
            except Exception as alone_error:
                return DataError(f"{label}: {path} cannot be read as {builder}: {describe(alone_error)}")
            features[f"{label} ({path})"] = alone.features
    if len({tuple(sorted(found)) for found in features.values()}) > 1:
        listed = "; ".join(f"{where}: {list(found)}" for where, found in features.items())
        return DataError(f"the data files have different columns; every file needs the same ones: {listed}")
    for column in next(iter(features.values()), {}):
        kinds = {where: _kind(found[column]) for where, found in features.items()}
        if len(set(kinds.values())) > 1:
            listed = "; ".join(f"{kind} in {where}" for where, kind in kinds.items())
            return DataError(f"column {column!r} holds different types in different files: {listed}")
    return DataError(f"{', '.join(paths_by_label)}: the files cannot be read as {builder}: {describe(error)}")


def _kind(feature) -> str:
    return feature.dtype if isinstance(feature, datasets.Value) else type(feature).__name__


def _file_shape_problem(path: Path, builder: str, encoding: str, *, where: str) -> str | None:
    """``WHERE is empty``, ``WHERE, line N: ...`` and the like for a file the reader will reject; else None."""
    if builder == "parquet":
        return None
    try:
        text = path.read_text(encoding=encoding)
    except (OSError, UnicodeError):
        return None  # loading the file alone reports it
    if not text.strip():
        return f"{where} is empty (no examples)"
    if builder == "csv" and sum(1 for line in text.splitlines() if line.strip()) < 2:
        return f"{where} holds a header but no rows"
    if builder == "json":
        try:
            json.loads(text)
            return None  # one JSON document: the reader's own message will say what it dislikes
        except json.JSONDecodeError:
            pass
        try:
            for _ in json_records(text, where):
                pass
        except DataError as error:
            return str(error)
    return None


def load_raw(data: DataConfig, *, text_columns: Iterable[str | None] = ()) -> DatasetDict:
    """Load the configured data as a DatasetDict of raw examples (no sampling yet); a local csv/tsv
    file's ``text_columns`` are read as the strings written (``"007"`` stays ``"007"``)."""
    if data.files:
        check_files_exist(data.files)
        return _load_local_files(data.files, data.encoding, label="data.files.", text_columns=text_columns)
    source = resolve_dataset(data.path)
    where = f"data.path={data.path}" + (f", data.name={data.name}" if data.name else "")
    with failures_named(DataError, f"{where}: cannot load the dataset from {source}"):
        return datasets.load_dataset(source, data.name)


def eval_split_files_only(data: DataConfig) -> DataConfig:
    """``data`` listing only the eval split's own file(s), for commands on a finished run (evaluate, export).

    Loading reads (and checks) every file of ``data.files``: evaluating on another machine, or after the
    big train file was deleted, was refused for the missing train file, or waited for it to be read. A
    finished run needs no train split (its labels come with its model). Unchanged when the eval split
    has no file of its own: it is then held out of train, which must be read to carve the same rows.
    """
    if not data.files or data.eval_split not in data.files:
        return data
    return data.model_copy(update={"files": {data.eval_split: data.files[data.eval_split]}})


def finalize_splits(raw: DatasetDict, data: DataConfig, seed: int, *, need_train: bool = True) -> DatasetDict:
    """Check splits exist and are non-empty, carve a held-out split if asked, then sample."""
    raw = DatasetDict(raw)
    if data.eval_split not in raw and data.validation_fraction and data.train_split in raw:
        held_out = raw[data.train_split].train_test_split(test_size=data.validation_fraction, seed=seed)
        raw[data.train_split], raw[data.eval_split] = held_out["train"], held_out["test"]
    wanted = [data.train_split, data.eval_split] if need_train else [data.eval_split]
    for split in wanted:
        if split not in raw:
            hint = " (or set data.validation_fraction to hold out part of train)" if split == data.eval_split else ""
            raise DataError(f"split {split!r} not found; the data has {sorted(raw)}{hint}")
    limits = {data.train_split: data.max_train_samples, data.eval_split: data.max_eval_samples}
    for split, limit in limits.items():
        if split in raw and limit is not None and limit < len(raw[split]):
            raw[split] = raw[split].select(range(limit))
    for split in wanted:
        if len(raw[split]) == 0:
            raise DataError(f"split {split!r} is empty ({split_source(data, split)})")
    return DatasetDict({split: raw[split] for split in wanted})


def split_source(data: DataConfig, split: str) -> str:
    """Where a split's rows come from, for messages: ``data.files.train: a.csv`` or ``data.path=...``."""
    if data.files and split in data.files:
        return f"data.files.{split}: {', '.join(_as_list(data.files[split]))}"
    if data.files and split == data.eval_split and data.validation_fraction:
        return f"held out of data.files.{data.train_split} by data.validation_fraction"
    return f"data.path={data.path}" + (f", data.name={data.name}" if data.name else "")


def _is_empty(value) -> bool:
    return value is None or (isinstance(value, str) and not value.strip())


def require_values(split: Dataset, columns: Iterable[str | None], split_name: str, source: str) -> None:
    """Every row holds a value in each column, or a DataError names split, source, row and column.

    ``datasets`` reads an empty csv cell, a JSON null and a key missing from some rows all as None,
    which would otherwise become the label ``"None"`` or an empty text. Rows count from 1 (csv: the
    row after the header is row 1). A column empty in every row is reported as missing, since that is
    what a file without the column looks like once ``datasets`` has unified the splits' columns.
    """
    for column in columns:
        if column is None or column not in split.column_names:
            continue
        empty = [index for index, value in enumerate(split[column]) if _is_empty(value)]
        if not empty:
            continue
        if len(empty) == len(split):
            raise DataError(f"split {split_name!r} ({source}) has no {column!r} column, or every {column!r} cell is empty")
        raise DataError(f"split {split_name!r} ({source}), row {row_list(empty)}: empty {column!r} cell (rows count from 1)")


def require_one_type(split: Dataset, columns: Iterable[str | None], split_name: str, source: str) -> None:
    """Each column holds one kind of value: a JSON file whose rows mix, say, strings and lists is read
    by ``datasets`` as a ``Json`` column of Python objects, which would otherwise pass as text labels."""
    for column in columns:
        if column is None or column not in split.column_names or type(split.features[column]).__name__ != "Json":
            continue
        values = split[column]
        first = next((index for index, value in enumerate(values) if value is not None), None)
        if first is None:
            continue
        for index, value in enumerate(values):
            if value is not None and type(value) is not type(values[first]):
                raise DataError(
                    f"split {split_name!r} ({source}), row {index + 1}: {column!r} holds a {type(value).__name__} where "
                    f"row {first + 1} holds a {type(values[first]).__name__}; every row needs the same kind of value"
                )


def require_text(split: Dataset, columns: Iterable[str | None], where: str, *, keys: str = "data.text_column / data.text_pair_column") -> None:
    """Each text column holds strings: a csv column of numbers is read as numbers and a jsonl column mixing
    numbers and strings as ``Json`` objects; either would reach the tokenizer and fail there without a name.
    ``where`` names the split and its file (or the --input), ``keys`` the settings that name the columns. (A
    column of nulls only is left to :func:`require_values`, which names the empty rows.)"""
    for column in columns:
        if column is None or column not in split.column_names:
            continue
        feature = split.features[column]
        if not (isinstance(feature, datasets.Value) and feature.dtype in ("string", "large_string", "null")):
            kind = feature.dtype if isinstance(feature, datasets.Value) else type(feature).__name__
            raise DataError(f"{where}: column {column!r} holds {kind} values, not text; point {keys} at a text column")


def require_columns(dataset: Dataset, columns: Iterable[str | None], split: str) -> None:
    """Fail with the available columns when a configured column is missing."""
    missing = [column for column in columns if column is not None and column not in dataset.column_names]
    if missing:
        raise DataError(
            f"split {split!r} has no column(s) {missing}; available columns: {dataset.column_names}. "
            "Set the data.*_column keys to map yours."
        )


@functools.cache
def _source_fingerprint(folder: Path) -> str:
    digest = hashlib.sha256()
    for path in sorted(folder.rglob("*.py")):
        digest.update(path.relative_to(folder).as_posix().encode() + b"\0" + path.read_bytes())
    return digest.hexdigest()[:16]


class KeyedOnCode:
    """A ``Dataset.map`` function whose cache key covers bertpipe's source code, not only its name.

    ``datasets`` hashes a module-level function by reference (module and name): after an upgrade that
    changes how a task tokenises (how NER splits words, what classification records), ``map`` reused the
    features the old code had cached for the same data and tokenizer, without a word. Wrapped, the key
    also holds a digest of the ``pipelines`` package and of the function's own top-level package.
    """

    def __init__(self, function: Callable[..., Any]) -> None:
        self.function = function
        packages = {Path(__file__).parent, Path(sys.modules[function.__module__.partition(".")[0]].__file__).parent}
        self.code = "+".join(_source_fingerprint(folder) for folder in sorted(packages))

    def __call__(self, *args: Any, **kwargs: Any) -> Any:
        return self.function(*args, **kwargs)


def features_digest(features: Dataset) -> str:
    """A digest of ``features``' rows in order, whatever their Arrow chunking: what a checkpoint was trained on.

    A resume compares it with the data it is given, so that rows added, removed or edited between a crash and
    the resume (same file names, so the same config) are refused instead of silently steering the run elsewhere.
    """
    import numpy as np
    import pyarrow as pa

    def add(array: pa.Array) -> None:
        if pa.types.is_list(array.type) or pa.types.is_large_list(array.type):
            offsets = np.asarray(array.offsets, dtype=np.int64)
            digest.update((offsets - offsets[0]).tobytes())
            add(array.flatten())
        elif pa.types.is_string(array.type) or pa.types.is_large_string(array.type):
            digest.update("\0".join(value or "" for value in array.to_pylist()).encode())
        else:
            digest.update(array.to_numpy(zero_copy_only=False).tobytes())

    digest = hashlib.sha256(str(len(features)).encode())
    table = features.with_format("arrow")[:]  # the rows in the dataset's order (selections applied)
    for name in sorted(table.column_names):
        digest.update(name.encode() + b"\0")
        add(table.column(name).combine_chunks())
    return digest.hexdigest()[:16]


def row_list(rows: list[int], shown: int = 5) -> str:
    """0-based row indices -> "2, 5, 9 and 3 more", counting from 1 as every message about rows does."""
    text = ", ".join(str(row + 1) for row in rows[:shown])
    return text + (f" and {len(rows) - shown} more" if len(rows) > shown else "")


def tokenize_with_lengths(tokenize: Callable[..., Any], columns: list[list[str] | None], max_length: int) -> tuple[dict, list[int]]:
    """``tokenize(*columns)`` truncated to ``max_length`` tokens, and each row's length before truncation
    (what a task needs to say which texts were cut: the tokenizer cuts silently).

    Only the rows that are too long are tokenised a second time, with truncation (which keeps the special
    tokens; a pair is cut in its longer text), so data that fits costs one pass. ``verbose=False``: a text
    longer than the tokenizer's ``model_max_length`` is expected here and cut below.
    """
    encoded = tokenize(*columns, verbose=False)
    lengths = [len(ids) for ids in encoded["input_ids"]]
    long = [row for row, length in enumerate(lengths) if length > max_length]
    if long:
        cut = tokenize(*[None if column is None else [column[row] for row in long] for column in columns],
                       max_length=max_length, truncation=True)
        for key in encoded:
            for position, row in enumerate(long):
                encoded[key][row] = cut[key][position]
    return dict(encoded), lengths


def read_inputs(path: str | Path, *, encoding: str = "utf-8", text_columns: Iterable[str | None] = ()) -> Dataset:
    """Inputs for ``bertpipe predict``: jsonl/json, csv/tsv, parquet, or txt (one ``text`` per line).

    Text formats are decoded with ``encoding`` (the run's ``data.encoding``, which a ``predict``
    override such as ``data.encoding=latin-1`` changes); csv/tsv ``text_columns`` are read as written.
    """
    path = Path(path)
    if not path.is_file():
        raise DataError(f"input file {path} {_not_a_file(path)}")
    loaded = _load_local_files({"input": str(path)}, encoding, label="", text_columns=text_columns)["input"]
    if len(loaded) == 0:
        raise DataError(f"input file {path} holds no examples")
    return loaded


def skip_blank_lines(inputs: Dataset, path: str | Path) -> Dataset:
    """A txt input without its blank lines, saying on stderr how many were skipped and where.

    In a txt input each line is one example; a blank line (a paragraph break, the end of a file) is
    not one, so tasks that predict one thing per example give it no prediction rather than a
    prediction for "". (NER keeps them: a blank line is a line with no entities.)
    """
    if builder_for_files({"input": str(path)})[0] != "text":
        return inputs
    blank = [index for index, text in enumerate(inputs["text"]) if not text.strip()]
    if not blank:
        return inputs
    logger.warning(
        "%s: skipped %d blank line(s) (line %s%s); the output has one row per non-blank line",
        path, len(blank), ", ".join(str(index + 1) for index in blank[:5]), " ..." if len(blank) > 5 else "",
    )
    if len(blank) == len(inputs):
        raise DataError(f"input file {path} holds no examples (every line is blank)")
    drop = set(blank)
    return inputs.select([index for index in range(len(inputs)) if index not in drop])


@dataclass(frozen=True)
class PreparedData:
    raw: DatasetDict
    tokenizer: Any
    train_examples: Dataset
    eval_examples: Dataset
    train_features: Dataset
    eval_features: Dataset


def prepare_data(task: Task, config: RunConfig) -> PreparedData:
    """The task's raw splits, its tokenizer (built on them: MLM may train one) and both splits' features.

    The user's rows meet the tokenizer in ``preprocess``, so a row it rejects is reported as a data
    problem of that split, with the library's error as the cause.
    """
    raw = task.load()
    tokenizer = task.build_tokenizer(raw)
    features = {}
    for split, train in ((config.data.train_split, True), (config.data.eval_split, False)):
        with failures_named(DataError, f"split {split!r} ({split_source(config.data, split)}) cannot be preprocessed"):
            features[split] = task.preprocess(raw[split], train=train)
    return PreparedData(
        raw, tokenizer, raw[config.data.train_split], raw[config.data.eval_split],
        features[config.data.train_split], features[config.data.eval_split],
    )
