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

import functools
import hashlib
import logging
import sys
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any, Callable, Iterable

import datasets
from datasets import Dataset, DatasetDict
from datasets.data_files import DataFilesDict, get_data_patterns
from huggingface_hub import DatasetCard

from pipelines.config import DataConfig
from pipelines.errors import DataError, describe, failures_named
from pipelines.files import BUILDER_SUFFIXES, as_list, builder_for_files, check_files_exist, load_local_files
from pipelines.graphemes import is_blank
from pipelines.hub import resolve_dataset

if TYPE_CHECKING:
    from pipelines.config import RunConfig
    from pipelines.task import Task

logger = logging.getLogger(__name__)


def load_raw(data: DataConfig, *, text_columns: Iterable[str | None] = ()) -> DatasetDict:
    """Load the configured data as a DatasetDict of raw examples (no sampling yet); a local csv/tsv
    file's ``text_columns`` are read as the strings written (``"007"`` stays ``"007"``)."""
    if data.files:
        check_files_exist(data.files)
        return load_local_files(data.files, data.encoding, label="data.files.", text_columns=text_columns)
    source = resolve_dataset(data.path)
    where = f"data.path={data.path}" + (f", data.name={data.name}" if data.name else "")
    with failures_named(DataError, f"{where}: cannot load the dataset from {source}"):
        files = plain_folder_files(source) if data.name is None else None
        if files is None:
            return datasets.load_dataset(source, data.name)
    return load_local_files(files, data.encoding, label=f"data.path={data.path}, split ", text_columns=text_columns)


def plain_folder_files(source: str) -> dict[str, list[str]] | None:
    """The split files of a local folder of data files (``train.csv``, ``data/validation-0.tsv``, found by ``datasets``'
    own split-name patterns), when they are all of one format :func:`load_local_files` reads; None for a Hub id, a
    dataset repository whose card configures its data or features (``configs``, ``dataset_info`` in README.md),
    and any other folder.

    ``datasets.load_dataset(folder)`` reads csv with pandas' defaults: ``NA`` became a missing cell, ``true`` the
    label ``True``, and a plain tsv lost the quotes of ``"Hello" he said`` or ran a sentence opening a quote on over
    the rows after it, none of which the same files read through ``data.files`` do.
    """
    folder = Path(source)
    if not folder.is_dir() or _card_configures_data(folder):
        return None
    try:
        found = DataFilesDict.from_patterns(get_data_patterns(folder.resolve().as_posix()), base_path=folder.resolve().as_posix())
    except (FileNotFoundError, ValueError):  # no data files, a split named twice: datasets' own load says so
        return None
    files = {str(split): [str(path) for path in paths] for split, paths in found.items() if paths}
    suffixes = {Path(path).suffix.lower() for paths in files.values() for path in paths}
    if not files or not suffixes <= BUILDER_SUFFIXES:
        return None
    try:
        builder_for_files(files)
    except DataError:  # more than one format: datasets picks the commonest and reads that
        return None
    return files


def _card_configures_data(folder: Path) -> bool:
    if (folder / ".huggingface.yaml").is_file():
        return True
    readme = folder / "README.md"
    # A card's dataset_info names the features (ClassLabel names), which datasets applies and plain files lack.
    return readme.is_file() and bool({"configs", "dataset_info"} & set(DatasetCard.load(readme).data.to_dict()))


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


def finalize_splits(raw: DatasetDict, data: DataConfig, seed: int, *, need_train: bool = True, held_out: bool = False) -> DatasetDict:
    """Check splits exist and are non-empty, carve a held-out split if asked, then sample.

    ``held_out``: the task already held its eval split out of train by ``data.validation_fraction`` (MLM holds out
    whole documents), so the setting was used, not made unused by a split of the data's own.
    """
    raw = DatasetDict(raw)
    if data.eval_split in raw and data.validation_fraction and need_train and not held_out:
        logger.warning("data.validation_fraction=%s unused: the data has its own %r split (%s)", data.validation_fraction,
                       data.eval_split, split_source(data, data.eval_split))
    if data.eval_split not in raw and data.validation_fraction and data.train_split in raw:
        try:
            held_out = raw[data.train_split].train_test_split(test_size=data.validation_fraction, seed=seed)
        except ValueError as error:  # a share that leaves one side without a row
            raise DataError(
                f"data.validation_fraction={data.validation_fraction}: the {len(raw[data.train_split])} row(s) of split "
                f"{data.train_split!r} ({split_source(data, data.train_split)}) cannot be split into training and held-out "
                f"rows ({describe(error)}); give more rows, another fraction, or an evaluation file"
            ) from error
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
        return f"data.files.{split}: {', '.join(as_list(data.files[split]))}"
    if data.files and split == data.eval_split and data.validation_fraction:
        return f"held out of data.files.{data.train_split} by data.validation_fraction"
    return f"data.path={data.path}" + (f", data.name={data.name}" if data.name else "")


def split_where(data: DataConfig, split: str) -> str:
    """``split 'train' (data.files.train: a.csv)``: a split and where its rows come from, for messages."""
    return f"split {split!r} ({split_source(data, split)})"


def _is_empty(value) -> bool:
    return value is None or (isinstance(value, str) and is_blank(value))


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
    by ``datasets`` as a ``Json`` column of Python objects, which would otherwise pass as text labels.

    Such a column also decodes each string that reads as JSON: the labels ``1`` and ``"1"`` both came back as
    the number 1 (one class where the file wrote two kinds), ``"true"`` as a bool. A ``Json`` column always
    means the rows mixed kinds, so it is refused even when its decoded values look alike.
    """
    for column in columns:
        if column is None or column not in split.column_names or type(split.features[column]).__name__ != "Json":
            continue
        values = split[column]
        first = next((index for index, value in enumerate(values) if value is not None), None)
        if first is None:
            continue
        fix = f"write every row's {column!r} as the same kind (all strings, or all numbers)"
        for index, value in enumerate(values):
            if value is not None and type(value) is not type(values[first]):
                raise DataError(
                    f"split {split_name!r} ({source}), row {index + 1}: {column!r} is read as a {type(value).__name__} where "
                    f"row {first + 1} is read as a {type(values[first]).__name__} (a quoted \"1\" or \"true\" reads as "
                    f"the number or bool it spells when the rows mix kinds); {fix}"
                )
        raise DataError(f"split {split_name!r} ({source}): the rows' {column!r} values mix kinds (e.g. the number 1 and "
                        f"the string \"1\"), which the JSON reader cannot keep apart; {fix}")


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


def require_columns(dataset: Dataset, columns: Iterable[str | None], where: str) -> None:
    """Fail with the available columns when a configured column is missing; ``where`` names the split and its
    file (or the --input)."""
    missing = [column for column in columns if column is not None and column not in dataset.column_names]
    if missing:
        raise DataError(
            f"{where} has no column(s) {missing}; available columns: {dataset.column_names}. "
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
        with failures_named(DataError, f"{split_where(config.data, split)} cannot be preprocessed"):
            features[split] = task.preprocess(raw[split], train=train)
    return PreparedData(
        raw, tokenizer, raw[config.data.train_split], raw[config.data.eval_split],
        features[config.data.train_split], features[config.data.eval_split],
    )
