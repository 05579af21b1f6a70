"""SQuAD files and rows -> flat examples (no tokenizer, no model).

In:  a local file, the official nested SQuAD JSON (``data[].paragraphs[].qas[]``, ``is_impossible``
     honoured), a JSON list of flat rows or jsonl of flat rows, the format read from the content;
     parquet of flat rows; or one Hub row. Answers come as ``{text: [...], answer_start: [...]}`` or a list of
     ``{text, answer_start}`` dicts.
Out: flat rows ``id, title, context, question, answers = {text: [...], answer_start: [...]}``
     (:data:`EXAMPLE_FEATURES`) and their ``Dataset``; an empty ``answers.text`` list (blank texts
     are dropped) is an unanswerable (v2) question. :func:`check_examples` and :func:`find_answer_mismatches` name
     the examples that cannot be used. Bad input raises ``DataError`` naming file and row.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pyarrow
import pyarrow.parquet
from datasets import Dataset, Features, Sequence as SequenceFeature, Value

from pipelines.errors import DataError, describe
from pipelines.files import check_no_lone_surrogate, json_records, naming_undecodable, text_encoding
from pipelines.graphemes import is_blank

WRITTEN_ID = "id_as_written"
EXAMPLE_FEATURES = Features({
    "id": Value("string"),
    "title": Value("string"),
    "context": Value("string"),
    "question": Value("string"),
    "answers": {"text": SequenceFeature(Value("string")), "answer_start": SequenceFeature(Value("int32"))},
})


def _answers_of(raw: Any, where: str) -> dict[str, list]:
    """Answers as ``{text: [...], answer_start: [...]}`` from the Hub layout or a list of dicts."""
    if raw is None:
        return {"text": [], "answer_start": []}
    if isinstance(raw, dict):
        texts, starts = raw.get("text") or [], raw.get("answer_start") or []
        if not isinstance(texts, list) or not isinstance(starts, list):
            raise DataError(f"{where}: 'answers' must hold lists, {{text: [...], answer_start: [...]}}, got {raw!r}")
    elif isinstance(raw, list):
        try:
            texts = [answer["text"] for answer in raw]
            starts = [answer["answer_start"] for answer in raw]
        except (TypeError, KeyError):
            raise DataError(f"{where}: each answer needs 'text' and 'answer_start', got {raw!r}") from None
    else:
        raise DataError(f"{where}: 'answers' must be {{text: [...], answer_start: [...]}} or a list of those, got {raw!r}")
    if len(texts) != len(starts):
        raise DataError(f"{where}: answers have {len(texts)} texts but {len(starts)} answer_start values")
    # A blank text (``{"text": [""], "answer_start": [-1]}``, a common way to write "unanswerable") is
    # no answer, as the official v2 scoring reads it; kept, it would label a window with a start token
    # after its end token, or be scored as an answer in v1.
    kept = [(str(text), start) for text, start in zip(texts, starts) if str(text).strip()]
    try:
        return {"text": [text for text, _ in kept], "answer_start": [int(start) for _, start in kept]}
    except (TypeError, ValueError):
        raise DataError(f"{where}: answer_start must be whole numbers (character offsets), got {starts!r}") from None


def flat_row(row: dict[str, Any], where: str, default_id: str) -> dict[str, Any]:
    """One flat SQuAD row with every column of :data:`EXAMPLE_FEATURES`; ``is_impossible`` empties answers."""
    if not isinstance(row, dict):
        raise DataError(f"{where}: expected a JSON object, got {type(row).__name__}")
    missing = [key for key in ("question", "context") if not isinstance(row.get(key), str)]
    if missing:
        raise DataError(f"{where}: missing or non-text field(s) {missing}; a row needs 'question' and 'context' (and 'answers' to train)")
    answers = _answers_of(row.get("answers"), where)
    impossible = row.get("is_impossible")
    # Only a JSON boolean (or 0/1): the string "False" that csv-to-json conversions write is truthy, and
    # read as such it turned an answered question into an unanswerable one without a word.
    if impossible is not None and not (isinstance(impossible, int) and impossible in (0, 1)):
        raise DataError(f"{where}: 'is_impossible' must be true or false (a JSON boolean), not {impossible!r}")
    if impossible:
        answers = {"text": [], "answer_start": []}
    identifier = row.get("id")
    return {
        "id": identifier if identifier is not None else default_id,  # as the file wrote it: rows_to_dataset makes it text
        "title": str(row.get("title") or ""),
        "context": row["context"],
        "question": row["question"],
        "answers": answers,
    }


def flatten_squad_json(document: dict[str, Any], source: str) -> list[dict[str, Any]]:
    """The official nested layout ``data[].paragraphs[].qas[]`` -> flat rows, in file order."""
    rows = []
    articles = document.get("data")
    if not isinstance(articles, list):
        raise DataError(f"{source}: nested SQuAD JSON needs a 'data' list of articles")
    for a, article in enumerate(articles):
        title = article.get("title", "") if isinstance(article, dict) else ""
        paragraphs = article.get("paragraphs") if isinstance(article, dict) else None
        if not isinstance(paragraphs, list):
            raise DataError(f"{source}: data[{a}] ({title!r}) has no 'paragraphs' list")
        for p, paragraph in enumerate(paragraphs):
            if not isinstance(paragraph, dict) or not isinstance(paragraph.get("context"), str) or not isinstance(paragraph.get("qas"), list):
                raise DataError(f"{source}: data[{a}].paragraphs[{p}] needs a 'context' string and a 'qas' list")
            for q, qa in enumerate(paragraph["qas"]):
                where = f"{source}: data[{a}].paragraphs[{p}].qas[{q}]"
                rows.append(flat_row({"title": title, "context": paragraph["context"], **qa}, where, f"{a}-{p}-{q}"))
    return rows


def read_squad_file(path: str | Path, *, encoding: str = "utf-8") -> list[dict[str, Any]]:
    """Nested SQuAD JSON, a JSON list of flat rows, or jsonl of flat rows (detected from the content), or
    parquet of flat rows."""
    path = Path(path)
    if not path.is_file():
        raise DataError(f"file {path} does not exist")
    if path.suffix.lower() == ".parquet":
        return [flat_row(row, f"{path}: row {index + 1}", str(index + 1)) for index, row in enumerate(_parquet_rows(path))]
    with naming_undecodable({"input": [path]}, encoding):
        text = path.read_text(encoding=text_encoding(encoding))  # a byte-order mark dropped: json refuses it
    if not text.strip():
        raise DataError(f"{path} is empty")
    document: Any = None
    if text.lstrip()[0] in "{[":
        try:
            document = json.loads(text)
        except json.JSONDecodeError:
            document = None  # several objects: jsonl
        else:
            check_no_lone_surrogate(text, document, str(path))
    # A flat row may carry a field named "data" of its own (one row: the file is one JSON object, as a nested file is).
    if isinstance(document, dict) and "data" in document and not {"question", "context"} <= document.keys():
        return flatten_squad_json(document, str(path))
    if isinstance(document, list):
        return [flat_row(row, f"{path}: item {i + 1}", str(i + 1)) for i, row in enumerate(document)]
    if isinstance(document, dict):
        return [flat_row(document, f"{path}: line 1", "1")]
    # Neither one JSON document nor nested SQuAD: JSON lines, one flat row each.
    return [flat_row(row, f"{path}: line {number}", str(index + 1)) for index, (number, row) in enumerate(json_records(text, path))]


def _parquet_rows(path: Path) -> list[dict[str, Any]]:
    try:
        return pyarrow.parquet.read_table(path).to_pylist()
    except (pyarrow.ArrowException, OSError) as error:
        raise DataError(f"{path} cannot be read as parquet: {describe(error)}") from error


def rows_to_dataset(rows: list[dict[str, Any]], *, written_ids: bool = False) -> Dataset:
    """Flat rows -> examples of :data:`EXAMPLE_FEATURES`, ids as text; with ``written_ids`` also each id as the
    file wrote it (an integer stays one), JSON-encoded in :data:`WRITTEN_ID`, for predict's output rows to join
    back on."""
    examples = [{**row, "id": str(row["id"])} for row in rows]
    if not written_ids:
        return Dataset.from_list(examples, features=EXAMPLE_FEATURES)
    for example, row in zip(examples, rows):
        example[WRITTEN_ID] = json.dumps(row["id"], default=str)
    return Dataset.from_list(examples, features=Features({**EXAMPLE_FEATURES, WRITTEN_ID: Value("string")}))


def check_examples(examples: Dataset, where: str, *, version_2_with_negative: bool | None) -> None:
    """Empty contexts, blank questions and (for v1) unanswerable questions are errors naming ``where`` (the split
    and its file, or the --input) and the example, counting from 1.

    A blank question was answered all the same (the model reads only the context), in predict and in
    evaluation, and trained a span for no question.
    """
    rows = zip(examples["id"], examples["question"], examples["context"], examples["answers"])
    for index, (identifier, question, context, answers) in enumerate(rows):
        if is_blank(context):
            raise DataError(
                f"{where}, example {index + 1} (id {identifier!r}): the context is empty (nothing but whitespace "
                "or invisible characters)"
            )
        if is_blank(question):
            raise DataError(f"{where}, example {index + 1} (id {identifier!r}): the question is blank ({question!r})")
        if version_2_with_negative is False and not answers["text"]:
            raise DataError(
                f"{where}, example {index + 1} (id {identifier!r}) has no answer, which SQuAD v1.1 does not allow; "
                "set qa.version_2_with_negative=true for data with unanswerable questions"
            )


def check_unique_ids(examples: Dataset, split: str) -> None:
    """Evaluation ids must be unique: they key ``predictions.json``, ``nbest_predictions.json``,
    ``null_odds.json`` and the official SQuAD scripts, where a repeated id would keep one example's answer."""
    first_row: dict[str, int] = {}
    for index, identifier in enumerate(examples["id"]):
        if identifier in first_row:
            raise DataError(
                f"split {split!r}: examples {first_row[identifier]} and {index} share the id {identifier!r}; the "
                "prediction files are keyed by id, so every evaluation example needs its own"
            )
        first_row[identifier] = index


def find_answer_mismatches(examples: Dataset) -> list[int]:
    """Indices of examples whose first answer text is not at its ``answer_start`` in the context."""
    bad = []
    for index, (context, answers) in enumerate(zip(examples["context"], examples["answers"])):
        if answers["text"]:
            text, start = answers["text"][0], answers["answer_start"][0]
            if start < 0 or context[start : start + len(text)] != text:
                bad.append(index)
    return bad
