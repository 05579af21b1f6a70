"""Raw datasets for any task: Hub ids (through the mirror), local folders and local files.

In:  a :class:`~pipelines.config.DataConfig` (``path``/``name`` or ``files``, split names, sampling).
Out: a ``DatasetDict`` holding at least the train and eval splits, each non-empty, sampled to
     ``max_train_samples`` / ``max_eval_samples``, with a held-out eval split carved from train
     when the data has none and ``validation_fraction`` is set.

Tasks with their own file formats (CoNLL columns, nested SQuAD JSON) read them themselves and
hand the result to :func:`finalize_splits` so that sampling and checks stay in one place.
"""

from __future__ import annotations

import codecs
from contextlib import contextmanager
from pathlib import Path
from typing import Iterable, Iterator

import datasets
from datasets import Dataset, DatasetDict
from datasets.exceptions import DatasetGenerationError

from pipelines.config import DataConfig
from pipelines.hub import resolve_dataset


class DataError(ValueError):
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
                raise DataError(f"data.files.{split}: file {path} does not exist")


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


def _reader_accepts_bad_bytes(builder: str, encoding: str) -> bool:
    # For UTF-8 the JSON builder hands the raw bytes to pyarrow, which stores invalid UTF-8 in the Arrow
    # column without complaint: the bad row would fail only when read, long after caching. Other
    # encodings it decodes in Python first, which fails on the spot like the text and csv builders.
    return builder == "json" and codecs.lookup(encoding).name == "utf-8"


def _load_local_files(files: dict[str, str | list[str]], encoding: str, *, label: str) -> DatasetDict:
    """``datasets``' builder for the files' format, decoding text in ``encoding``; a bad byte names
    ``label + split``, the file, line and byte."""
    builder, options = builder_for_files(files)
    if builder != "parquet":
        options["encoding"] = encoding
    data_files = {split: _as_list(paths) for split, paths in files.items()}
    paths_by_label = {label + split: paths for split, paths in data_files.items()}
    with naming_undecodable(paths_by_label, encoding, scan_first=_reader_accepts_bad_bytes(builder, encoding)):
        return datasets.load_dataset(builder, data_files=data_files, **options)


def load_raw(data: DataConfig) -> DatasetDict:
    """Load the configured data as a DatasetDict of raw examples (no sampling yet)."""
    if data.files:
        check_files_exist(data.files)
        return _load_local_files(data.files, data.encoding, label="data.files.")
    source = resolve_dataset(data.path)
    return datasets.load_dataset(source, data.name)


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
            raise DataError(f"split {split!r} is empty")
    return DatasetDict({split: raw[split] for split in wanted})


def require_columns(dataset: Dataset, columns: Iterable[str | None], split: str) -> None:
    """Fail with the available columns when a configured column is missing."""
    missing = [column for column in columns if column is not None and column not in dataset.column_names]
    if missing:
        raise DataError(
            f"split {split!r} has no column(s) {missing}; available columns: {dataset.column_names}. "
            "Set the data.*_column keys to map yours."
        )


def read_inputs(path: str | Path, *, encoding: str = "utf-8") -> Dataset:
    """Inputs for ``bertpipe predict``: jsonl/json, csv/tsv, parquet, or txt (one ``text`` per line).

    Text formats are decoded with ``encoding`` (the run's ``data.encoding``, which a ``predict``
    override such as ``data.encoding=latin-1`` changes).
    """
    path = Path(path)
    if not path.is_file():
        raise DataError(f"input file {path} does not exist")
    loaded = _load_local_files({"input": str(path)}, encoding, label="")["input"]
    if len(loaded) == 0:
        raise DataError(f"input file {path} holds no examples")
    return loaded
