"""Local data files in their native formats -> ``datasets`` splits, with errors that name the file and row.

In:  ``data.files`` (split -> path or paths; csv, tsv, json, jsonl, parquet, txt, .tokens/.raw) and their
     text encoding; or one ``bertpipe predict`` input file.
Out: a ``DatasetDict`` by split (``load_local_files``), a ``Dataset`` of inputs (``read_inputs``), or a
     :class:`~pipelines.errors.DataError` naming the file, line and byte or row: a missing file, a bad byte,
     a csv without rows or with a duplicated header, a JSON-lines line that is not an object.

Tasks with their own formats (CoNLL columns, nested SQuAD JSON) read them with their own reader through
``load_split_files`` and share ``json_records`` and ``naming_undecodable``.
"""

from __future__ import annotations

import codecs
import csv
import hashlib
import json
import logging
import re
from contextlib import contextmanager
from pathlib import Path
from typing import Any, Callable, Iterable, Iterator

import datasets
from datasets import Dataset, DatasetDict
from datasets.exceptions import DatasetGenerationError

from pipelines.errors import DataError, UserError, describe
from pipelines.graphemes import is_blank

logger = logging.getLogger(__name__)

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

BUILDER_SUFFIXES = frozenset(_BUILDER_BY_SUFFIX)


def builder_for_files(files: dict[str, str | list[str]]) -> tuple[str, dict]:
    """The ``datasets`` builder and its options for a set of local files (one format at a time)."""
    suffixes = {Path(path).suffix.lower() for paths in files.values() for path in as_list(paths)}
    unknown = [(split, path) for split, paths in files.items() for path in as_list(paths)
               if Path(path).suffix.lower() not in _BUILDER_BY_SUFFIX]
    if unknown:
        named = ", ".join(f"data.files.{split}: {path}" for split, path in unknown)
        raise DataError(f"{named}: unsupported file type {sorted({Path(path).suffix.lower() for _, path in unknown})}; use one of "
                        f"{sorted(_BUILDER_BY_SUFFIX)}")
    formats = {(_BUILDER_BY_SUFFIX[s][0], tuple(_BUILDER_BY_SUFFIX[s][1].items())) for s in suffixes}
    if len(formats) != 1:
        raise DataError(f"data.files mixes formats {sorted(suffixes)}; give all splits in one format")
    builder, options = formats.pop()
    return builder, dict(options)


def as_list(paths: str | list[str]) -> list[str]:
    return [paths] if isinstance(paths, str) else list(paths)


def check_files_exist(files: dict[str, str | list[str]]) -> None:
    """Every configured file exists (before ``datasets`` reports a missing one without its key)."""
    for split, paths in files.items():
        for path in as_list(paths):
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
        check_no_lone_surrogate(line, record, f"{source}, line {number}")
        yield number, record


# A JSON escape of a UTF-16 surrogate (\ud800 to \udfff). A pair of them is one character (an emoji, \ud83d\ude00);
# one alone is half of one, which json.loads keeps in the string and pyarrow refuses later, in a traceback.
_SURROGATE_ESCAPE = re.compile(r"\\u[dD][89a-fA-F][0-9a-fA-F]{2}")


def check_no_lone_surrogate(text: str, parsed: Any, where: str) -> None:
    """A DataError naming ``where`` and the key when a string of ``parsed`` (read from the JSON ``text``) holds
    half of a surrogate pair. Only a text holding such an escape at all is walked."""
    if not _SURROGATE_ESCAPE.search(text):
        return
    found = _lone_surrogate_at(parsed, "")
    if found is not None:
        raise DataError(f"{where}: {found or 'the value'} holds a \\ud800-\\udfff escape without its pair (half of a UTF-16 "
                        "surrogate pair, not a character); write the character itself, or both halves of the pair")


def _lone_surrogate_at(value: Any, at: str) -> str | None:
    """The JSON path (``data[0].paragraphs[2].context``) of the first string holding a lone surrogate; None if none."""
    if isinstance(value, str):
        try:
            value.encode("utf-8")
        except UnicodeEncodeError:
            return at
        return None
    items = value.items() if isinstance(value, dict) else enumerate(value) if isinstance(value, list) else ()
    for key, item in items:
        item_at = f"{at}[{key}]" if isinstance(key, int) else f"{at}.{key}" if at else str(key)
        found = _lone_surrogate_at(key, item_at) if isinstance(key, str) else None
        found = found if found is not None else _lone_surrogate_at(item, item_at)
        if found is not None:
            return found
    return None


def load_split_files(
    files: dict[str, str | list[str]], read_file: Callable[[Path], list[dict[str, Any]]],
    to_dataset: Callable[[list[dict[str, Any]]], Dataset],
) -> DatasetDict:
    """``data.files`` through a task's own reader: each split's files in order, their rows one Dataset."""
    check_files_exist(files)
    return DatasetDict({
        split: to_dataset([row for path in as_list(paths) for row in read_file(Path(path))]) for split, paths in files.items()
    })


def _reader_accepts_bad_bytes(builder: str, encoding: str) -> bool:
    # For UTF-8 the JSON builder hands the raw bytes to pyarrow, which stores invalid UTF-8 in the Arrow
    # column without complaint: the bad row would fail only when read, long after caching. Other
    # encodings it decodes in Python first, which fails on the spot like the text and csv builders.
    return builder == "json" and codecs.lookup(encoding).name == "utf-8"


def load_local_files(files: dict[str, str | list[str]], encoding: str, *, label: str, text_columns: Iterable[str | None] = ()) -> DatasetDict:
    """``datasets``' builder for the files' format, decoding text in ``encoding``; a bad byte names
    ``label + split``, the file, line and byte. csv/tsv ``text_columns`` are read as written."""
    builder, options = builder_for_files(files)
    if builder == "csv":
        # pandas reads a cell "None", "NA", "null" or "nan" as missing and a column of numbers as
        # numbers: the intent label "None" (common in intent data) became an empty cell, the text "NA"
        # a missing one, and the text "007" the number 7. Only an empty cell is missing; text stays text.
        options.update(keep_default_na=False, na_values=[""])
    if builder != "parquet":
        # The text reader kept a byte-order mark in a file's first example ("\ufeffgood film"), another input
        # for byte-level BPE. The json and csv readers drop it themselves.
        options["encoding"] = text_encoding(encoding) if builder == "text" else encoding
    data_files = {split: as_list(paths) for split, paths in files.items()}
    paths_by_label = {label + split: paths for split, paths in data_files.items()}
    if options.get("delimiter") == "\t":
        options["quoting"] = _tsv_quoting(paths_by_label, encoding)
    if builder == "csv":
        delimiter, quoting = options.get("delimiter", ","), options.get("quoting", csv.QUOTE_MINIMAL)
        # A column holding any cell that is not a number is read as written: typed by pandas per chunk, a label
        # column of numbers in the first and a word in a later one was refused, and true/false became True/False.
        words, with_nan = _csv_columns_holding_words(paths_by_label, encoding, delimiter, quoting)
        # pandas (default NA values off) reads "inf" as a float but "nan" as text: a column of scores holding one
        # "nan" became a column of text, and a regression job a classification into as many classes as scores.
        # Read as a float, the "nan" is a missing value, which the task names by its row.
        options["converters"] = {
            **{column: _float_or_missing for column in with_nan - words},
            **{column: str for column in {*text_columns, *words} if column},
        }
    try:
        with naming_undecodable(paths_by_label, encoding, scan_first=_reader_accepts_bad_bytes(builder, encoding)):
            # One split at a time: read together, every split took the first one's column types, and a validation
            # column of text holding one number (a json Json column) was cast to text by writing each row as JSON:
            # '"good film"', quotes included, then scored without a word.
            return DatasetDict({
                split: datasets.load_dataset(builder, _cache_name(paths), data_files={split: paths}, **options)[split]
                for split, paths in data_files.items()
            })
    except UserError:
        raise
    except Exception as error:  # whatever the builder raised: find the file (and line) that caused it
        raise _blame_file(error, builder, options, paths_by_label, encoding) from error


def _cache_name(paths: list[str]) -> str:
    """A ``datasets`` config name that changes whenever one of ``paths`` is written to.

    ``datasets`` keys a local file's cached Arrow table by its path and modification time: a file replaced by
    another with the same name and time (``cp -p``, ``rsync -t``, unpacking an archive) was read as the old rows,
    without a word. The inode change time cannot be set back by those tools; with the size and inode it names the
    cache, so an unchanged file is still read from the cache and a rewritten one is read again.
    """
    stats = [Path(path).stat() for path in paths]
    key = "|".join(f"{path}:{stat.st_ino}:{stat.st_size}:{stat.st_ctime_ns}" for path, stat in zip(paths, stats))
    return "files-" + hashlib.sha256(key.encode()).hexdigest()[:16]


def _tsv_quoting(paths_by_label: dict[str, list[str]], encoding: str) -> int:
    """How to read tab-separated files: with csv quoting when they were written with it, else without.

    Both kinds are common. Plain TSV (GLUE, Tatoeba, most corpora) has no quoting: a sentence opening
    with a quote (``"Hello" he said``) is text, and reading it as csv silently drops those quotes or
    runs the field on to a later closing quote. Writers with csv quoting (pandas, R, Python's csv) wrap
    a field holding a quote in quotes and double the inner ones, which a plain read would keep. A file
    whose quoted fields all parse as csv quoting is read with it, unless that joins lines each of which holds a
    whole row as written (quotes opened in one sentence and closed in a later one); any other is plain.
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


def text_encoding(encoding: str) -> str:
    """The codec to read a text file in: ``utf-8-sig`` for utf-8, which reads utf-8 alike and drops a leading
    byte-order mark (Windows editors write one; json refuses it, and a text reader keeps it in the first example)."""
    return "utf-8-sig" if codecs.lookup(encoding).name == "utf-8" else encoding


# A number's cell: decimals, exponents, inf and nan (pandas, its default NA values off, reads all but nan as floats).
_NUMBER = re.compile(r"\s*[+-]?(\d+\.?\d*|\.\d+)([eE][+-]?\d+)?\s*|\s*[+-]?(inf|infinity|nan)\s*", re.IGNORECASE)
_NAN = re.compile(r"\s*[+-]?nan\s*", re.IGNORECASE)


def _float_or_missing(cell: str) -> float | None:
    return float(cell) if cell.strip() else None


def _csv_columns_holding_words(paths_by_label: dict[str, list[str]], encoding: str, delimiter: str,
                               quoting: int) -> tuple[set[str], set[str]]:
    """The csv/tsv columns in which some cell, in any of the files, is not a number (nor empty), and those in
    which some cell is ``nan``; a header naming a column twice, or a row with another number of fields than the
    header, is a DataError naming the file and column or line.

    pandas types a column per 10,000-row chunk (a column of numbers there and a word later was refused) and
    renames a second ``text`` to ``text.1`` without a word (the first one was read as the text, or the labels,
    whichever the user meant).
    """
    words: set[str] = set()
    with_nan: set[str] = set()
    for label, paths in paths_by_label.items():
        for path in paths:
            try:
                with open(path, encoding=text_encoding(encoding), newline="") as handle:
                    rows = csv.reader(handle, delimiter=delimiter, quoting=quoting)
                    header = next(rows, [])
                    _check_unique_header(header, f"{label}: {path}")
                    open_columns = dict(enumerate(header))
                    for row in rows:
                        # A line of spaces alone is blank to pandas too (skip_blank_lines), not a short row.
                        if row and len(row) != len(header) and not (len(row) == 1 and is_blank(row[0])):
                            raise DataError(_ragged_row(f"{label}: {path}", rows.line_num, row, header, delimiter))
                        for index in [index for index in open_columns if index < len(row)]:
                            if row[index] and not _NUMBER.fullmatch(row[index]):
                                words.add(open_columns.pop(index))
                            elif _NAN.fullmatch(row[index]):
                                with_nan.add(open_columns[index])
            except (OSError, UnicodeError, csv.Error):
                continue  # the read itself names the file (and the byte or row)
    return words, with_nan


def _ragged_row(where: str, line: int, row: list[str], header: list[str], delimiter: str) -> str:
    # pandas reads a file whose every row has one field more than its header (a trailing delimiter, as spreadsheet
    # and database exports write) by taking the first column as an index: each column then held its right-hand
    # neighbour's values, and the job trained on them without a word. A row with fewer fields got empty cells.
    fields = len(row)
    trailing = " (a delimiter at the end of the line?)" if fields == len(header) + 1 and not row[-1] else ""
    name = "tab" if delimiter == "\t" else repr(delimiter)
    return (f"{where}, line {line}: {fields} field(s) where the header has {len(header)} ({header}){trailing}; every row "
            f"needs one field per column, separated by {name}")


def _check_unique_header(header: list[str], where: str) -> None:
    seen: dict[str, int] = {}
    for number, name in enumerate(header, start=1):
        if name.strip() and name in seen:
            raise DataError(
                f"{where}: the header names column {name!r} twice (columns {seen[name]} and {number}); give each column its own name"
            )
        seen.setdefault(name, number)


def _tsv_kind(path: Path, encoding: str) -> str | None:
    """``quoted`` (a field opens with a quote and the file parses as csv quoting), ``plain`` (it does
    not parse so, or a quoted field would run over lines that each hold a whole row as they stand) or None
    (no field opens with a quote, so both reads agree; or the read will fail)."""
    opens_with_quote = False
    widths: set[int] = set()  # fields per non-blank line, split at every tab

    def lines(handle):
        nonlocal opens_with_quote
        for line in handle:
            opens_with_quote = opens_with_quote or line.startswith('"') or '\t"' in line
            if line.strip():
                widths.add(line.rstrip("\r\n").count("\t") + 1)
            yield line

    spans_lines = False
    try:
        with open(path, encoding=encoding, newline="") as handle:
            rows = csv.reader(lines(handle), delimiter="\t", strict=True)
            last_line = 0
            for _ in rows:
                spans_lines = spans_lines or rows.line_num - last_line > 1
                last_line = rows.line_num
    except csv.Error:
        return "plain"
    except (OSError, UnicodeError):
        return None  # the read itself names the file (and the byte)
    if not opens_with_quote:
        return None
    # A sentence-split dialogue ('"I will not go.' then 'Leave me."' on the next line) parses as csv quoting too,
    # one field swallowing the rows between its quotes; a quoted field that truly holds a line break leaves its
    # lines short of the header's fields.
    # With one column every line is a whole row as it stands: nothing tells the two apart, so csv quoting, as written
    # by pandas and friends, is read as before.
    return "plain" if spans_lines and len(widths) == 1 and widths != {1} else "quoted"


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
    if builder == "csv" and len({tuple(found) for found in features.values()}) > 1:
        listed = "; ".join(f"{where}: {list(found)}" for where, found in features.items())
        return DataError(f"the csv files of one split list their columns in different orders, which the csv reader "
                         f"cannot join; write every file's columns in one order: {listed}")
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
            document = json.loads(text)
        except json.JSONDecodeError:
            pass
        else:
            try:
                check_no_lone_surrogate(text, document, where)
            except DataError as error:
                return str(error)
            return None  # one JSON document: the reader's own message will say what it dislikes
        try:
            for _ in json_records(text, where):
                pass
        except DataError as error:
            return str(error)
    return None


def read_inputs(path: str | Path, *, encoding: str = "utf-8", text_columns: Iterable[str | None] = ()) -> Dataset:
    """Inputs for ``bertpipe predict``: jsonl/json, csv/tsv, parquet, or txt (one ``text`` per line).

    Text formats are decoded with ``encoding`` (the run's ``data.encoding``, which a ``predict``
    override such as ``data.encoding=latin-1`` changes); csv/tsv ``text_columns`` are read as written.
    """
    path = Path(path)
    if not path.is_file():
        raise DataError(f"input file {path} {_not_a_file(path)}")
    if path.suffix.lower() not in _BUILDER_BY_SUFFIX:  # named as data.files, which the command line does not set
        raise DataError(f"--input {path}: unsupported file type {path.suffix.lower()!r}; use one of {sorted(_BUILDER_BY_SUFFIX)}")
    loaded = load_local_files({"input": str(path)}, encoding, label="", text_columns=text_columns)["input"]
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
    blank = [index for index, text in enumerate(inputs["text"]) if is_blank(text)]
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
