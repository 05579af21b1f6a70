"""Extractive question answering (SQuAD v1.1 and v2): doc-stride windows, n-best span decoding, official metrics.

In:  examples with ``id, title, context, question, answers = {text: [...], answer_start: [...]}`` from
     the Hub (``rajpurkar/squad``, ``rajpurkar/squad_v2``) or local files, either the official nested
     SQuAD JSON (``data[].paragraphs[].qas[]``, ``is_impossible`` honoured) or flat jsonl; the format
     is read from the content. An empty ``answers.text`` list is an unanswerable (v2) question.
Out: an ``AutoModelForQuestionAnswering``; per example the best answer text with its character span
     in the context, its probability, the n-best list and (v2) the no-answer probability; SQuAD
     exact match / F1 (0-100; v2 adds HasAns/NoAns and the best no-answer threshold); and the
     run-directory files ``predictions.json``, ``nbest_predictions.json`` and (v2) ``null_odds.json``.

A long context becomes several windows of ``max_seq_length`` tokens overlapping by ``doc_stride``
tokens; training labels each window with the answer's token span, or with the CLS position when the
window does not hold the whole answer or the question has none. :func:`postprocess_qa_predictions`
gathers the windows of each example back and decodes spans; evaluation, ``bertpipe predict`` and
the ``question-answering`` pipeline registered here all go through it.

Importing this module registers :class:`ExtractiveQuestionAnsweringPipeline` as the
``question-answering`` task of ``transformers.pipeline`` (transformers 5 removed its own), so
``pipeline("question-answering", model=RUN_DIR)`` answers as in transformers 4.
"""

from __future__ import annotations

import collections
import json
import logging
from pathlib import Path
from typing import Any, ClassVar, Literal, Sequence

import numpy as np
import torch
from datasets import Dataset, DatasetDict, Features, Sequence as SequenceFeature, Value
from pydantic import Field
from transformers import AutoModelForQuestionAnswering, DataCollatorWithPadding, Pipeline

from pipelines.config import RunConfig, TaskOptions
from pipelines.data import DataError, check_files_exist, finalize_splits, json_lines, load_raw, naming_undecodable, require_columns
from pipelines.metrics import load_metric
from pipelines.modeling import load_model, load_tokenizer, tokenizer_source
from pipelines.outputs import write_json

logger = logging.getLogger(__name__)

PIPELINE_TASK = "question-answering"

EXAMPLE_FEATURES = Features({
    "id": Value("string"),
    "title": Value("string"),
    "context": Value("string"),
    "question": Value("string"),
    "answers": {"text": SequenceFeature(Value("string")), "answer_start": SequenceFeature(Value("int32"))},
})

# Feature columns kept for postprocessing only; the collator drops them before the model sees a batch.
POSTPROCESS_COLUMNS = ("example_index", "offset_mapping", "cls_index")


class QAOptions(TaskOptions):
    version_2_with_negative: bool = False
    """SQuAD v2: some questions have no answer; the model may predict the empty answer."""
    doc_stride: int = Field(default=128, gt=0)
    """Tokens shared by consecutive windows of a long context (the HF ``stride``)."""
    n_best_size: int = Field(default=20, gt=0)
    """Start and end candidates taken per window, and the length of the n-best list per example."""
    max_answer_length: int = Field(default=30, gt=0)
    """Longest answer span in tokens."""
    null_score_diff_threshold: float = 0.0
    """v2: predict "no answer" when (null score - best span score) exceeds this (logit units)."""
    answer_mismatch: Literal["error", "skip"] = "error"
    """A training answer whose text is not found at ``answer_start`` in the context: fail on the first,
    or skip those examples (counted, with the first one named, in a warning)."""


# ----------------------------------------------------------------------------------------------
# Reading data
# ----------------------------------------------------------------------------------------------
def _answers_of(raw: Any, where: str) -> dict[str, list]:
    """Answers as ``{text: [...], answer_start: [...]}`` from the Hub layout or a list of dicts."""
    if raw is None:
        return {"text": [], "answer_start": []}
    if isinstance(raw, dict):
        texts, starts = list(raw.get("text") or []), list(raw.get("answer_start") or [])
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
    return {"text": [str(text) for text in texts], "answer_start": [int(start) for start in starts]}


def flat_row(row: dict[str, Any], where: str, default_id: str) -> dict[str, Any]:
    """One flat SQuAD row with every column of :data:`EXAMPLE_FEATURES`; ``is_impossible`` empties answers."""
    if not isinstance(row, dict):
        raise DataError(f"{where}: expected a JSON object, got {type(row).__name__}")
    missing = [key for key in ("question", "context") if not isinstance(row.get(key), str)]
    if missing:
        raise DataError(f"{where}: missing or non-text field(s) {missing}; a row needs 'question' and 'context' (and 'answers' to train)")
    answers = _answers_of(row.get("answers"), where)
    if row.get("is_impossible"):
        answers = {"text": [], "answer_start": []}
    identifier = row.get("id")
    return {
        "id": str(identifier) if identifier is not None else default_id,
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
    """Nested SQuAD JSON, a JSON list of flat rows, or jsonl of flat rows: detected from the content."""
    path = Path(path)
    if not path.is_file():
        raise DataError(f"file {path} does not exist")
    with naming_undecodable({"input": [path]}, encoding):
        text = path.read_text(encoding=encoding)
    if not text.strip():
        raise DataError(f"{path} is empty")
    document: Any = None
    if text.lstrip()[0] in "{[":
        try:
            document = json.loads(text)
        except json.JSONDecodeError:
            document = None  # several objects: jsonl
    if isinstance(document, dict) and "data" in document:
        return flatten_squad_json(document, str(path))
    if isinstance(document, list):
        return [flat_row(row, f"{path}: item {i}", str(i)) for i, row in enumerate(document)]
    if isinstance(document, dict):
        return [flat_row(document, f"{path}: line 1", "0")]
    rows = []
    for number, line in json_lines(text):
        try:
            row = json.loads(line)
        except json.JSONDecodeError as error:
            raise DataError(f"{path}: line {number} is neither nested SQuAD JSON nor a JSON object per line ({error})") from None
        rows.append(flat_row(row, f"{path}: line {number}", str(len(rows))))
    return rows


def rows_to_dataset(rows: list[dict[str, Any]]) -> Dataset:
    return Dataset.from_list(rows, features=EXAMPLE_FEATURES)


def check_examples(examples: Dataset, split: str, *, version_2_with_negative: bool | None) -> None:
    """Empty contexts and (for v1) unanswerable questions are errors naming the example."""
    for index, (identifier, context, answers) in enumerate(zip(examples["id"], examples["context"], examples["answers"])):
        if not context.strip():
            raise DataError(f"split {split!r}, example {index} (id {identifier!r}): the context is empty")
        if version_2_with_negative is False and not answers["text"]:
            raise DataError(
                f"split {split!r}, example {index} (id {identifier!r}) has no answer, which SQuAD v1.1 does not allow; "
                "set qa.version_2_with_negative=true for data with unanswerable questions"
            )


def find_answer_mismatches(examples: Dataset) -> list[int]:
    """Indices of examples whose first answer text is not at its ``answer_start`` in the context."""
    bad = []
    for index, (context, answers) in enumerate(zip(examples["context"], examples["answers"])):
        if answers["text"]:
            text, start = answers["text"][0], answers["answer_start"][0]
            if start < 0 or context[start : start + len(text)] != text:
                bad.append(index)
    return bad


# ----------------------------------------------------------------------------------------------
# Windows and labels
# ----------------------------------------------------------------------------------------------
def question_first(tokenizer) -> bool:
    """Question then context when the tokenizer pads on the right (BERT); context first when it pads left (XLNet)."""
    return tokenizer.padding_side == "right"


def check_question_lengths(tokenizer, questions: Sequence[str], ids: Sequence[str], *, max_length: int, doc_stride: int) -> None:
    """Every window must hold the question and more than ``doc_stride`` context tokens."""
    if doc_stride >= max_length:
        raise DataError(f"qa.doc_stride ({doc_stride}) must be smaller than data.max_seq_length ({max_length})")
    specials = tokenizer.num_special_tokens_to_add(pair=True)
    lengths = [len(ids_) for ids_ in tokenizer([q.lstrip() for q in questions], add_special_tokens=False)["input_ids"]]
    for index, length in enumerate(lengths):
        room = max_length - specials - length
        if room <= doc_stride:
            raise DataError(
                f"example {index} (id {ids[index]!r}): the question has {length} tokens, so a window of "
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


def _cls_index(input_ids: list[int], cls_token_id: int | None) -> int:
    return input_ids.index(cls_token_id) if cls_token_id is not None and cls_token_id in input_ids else 0


def prepare_features(batch: dict[str, list], indices: list[int], *, tokenizer, max_length: int, doc_stride: int, train: bool) -> dict:
    """Examples -> window features; module-level so that ``datasets`` can hash it and cache the result.

    Train features carry ``start_positions``/``end_positions``; eval features carry the
    example index, the context-only offsets and the CLS position for :func:`postprocess_qa_predictions`.
    """
    encoded = encode_windows(tokenizer, batch["question"], batch["context"], max_length=max_length, doc_stride=doc_stride)
    context_id = 1 if question_first(tokenizer) else 0
    sample_map = encoded.pop("overflow_to_sample_mapping")
    all_offsets = encoded.pop("offset_mapping")
    starts, ends, example_index, offsets_out, cls_out = [], [], [], [], []
    for window, sample in enumerate(sample_map):
        offsets = context_offsets(all_offsets[window], encoded.sequence_ids(window), context_id)
        cls_index = _cls_index(encoded["input_ids"][window], tokenizer.cls_token_id)
        if train:
            answers = batch["answers"][sample]
            if answers["text"]:
                start_char = answers["answer_start"][0]
                start, end = answer_token_span(offsets, start_char, start_char + len(answers["text"][0]), cls_index)
            else:
                start = end = cls_index
            starts.append(start)
            ends.append(end)
        else:
            example_index.append(indices[sample])
            offsets_out.append(offsets)
            cls_out.append(cls_index)
    features = dict(encoded)
    if train:
        features.update(start_positions=starts, end_positions=ends)
    else:
        features.update(example_index=example_index, offset_mapping=offsets_out, cls_index=cls_out)
    return features


# ----------------------------------------------------------------------------------------------
# Postprocessing
# ----------------------------------------------------------------------------------------------
def _softmax(scores: np.ndarray) -> np.ndarray:
    shifted = np.exp(scores - scores.max())
    return shifted / shifted.sum()


def trim_span(context: str, start: int, end: int) -> tuple[int, int] | None:
    """``[start, end)`` without the whitespace at either end; None when nothing else is left.

    Some tokenizers give a word-initial piece offsets that include the space before it (DeBERTa-v2/v3's
    Metaspace without a whitespace split, ModernBERT's byte-level BPE without offset trimming), and a
    piece of its own for a lone space marker; the answer is the text, not the space.
    """
    while start < end and context[start].isspace():
        start += 1
    while end > start and context[end - 1].isspace():
        end -= 1
    return (start, end) if start < end else None


def postprocess_qa_predictions(
    contexts: Sequence[str],
    feature_example_index: Sequence[int],
    offsets: Sequence[Sequence],
    start_logits: Sequence[np.ndarray],
    end_logits: Sequence[np.ndarray],
    cls_index: Sequence[int],
    *,
    n_best_size: int = 20,
    max_answer_length: int = 30,
    version_2_with_negative: bool = False,
    null_score_diff_threshold: float = 0.0,
) -> list[dict[str, Any]]:
    """Window logits -> one answer per example (pure function, no model, no tokenizer).

    For each example, every window ``f`` with ``feature_example_index[f] == example`` proposes the
    pairs of its ``n_best_size`` best start and end tokens that are both context tokens
    (``offsets[f][i]`` not ``None``), in order, and at most ``max_answer_length`` tokens long; a
    span's score is ``start_logit + end_logit``. A span is its characters without surrounding
    whitespace (:func:`trim_span`), so ``context[start:end] == text`` holds for every tokenizer. The same character span proposed by two
    overlapping windows counts once, with its best score. Logit arrays may be longer than the
    window (padding); positions past ``len(offsets[f])`` are ignored.

    v2: the null score is ``start_logit[cls] + end_logit[cls]``, taken at its *minimum* over the
    windows (the window most sure an answer exists); "no answer" is predicted when
    ``null score - best span score > null_score_diff_threshold`` or no span is valid. The null
    candidate joins the n-best list, and the softmax over the n-best scores gives every candidate a
    probability; the null candidate's is the ``no_answer_probability``.

    Returns, in example order: ``prediction_text``, ``start``/``end`` (character span, ``0, 0`` for
    no answer), ``score`` (the prediction's n-best probability), ``no_answer_probability``
    (0.0 for v1), ``null_score_diff`` (v2, else None) and ``nbest`` (dicts with text, start, end,
    start_logit, end_logit, score, probability; best first).
    """
    windows_of: dict[int, list[int]] = collections.defaultdict(list)
    for feature, example in enumerate(feature_example_index):
        windows_of[int(example)].append(feature)

    results = []
    for example, context in enumerate(contexts):
        spans: dict[tuple[int, int], dict[str, Any]] = {}
        null: dict[str, Any] | None = None
        for feature in windows_of.get(example, []):
            window_offsets = offsets[feature]
            width = len(window_offsets)
            starts = np.asarray(start_logits[feature][:width], dtype=np.float64)
            ends = np.asarray(end_logits[feature][:width], dtype=np.float64)
            cls = int(cls_index[feature])
            null_score = starts[cls] + ends[cls]
            if null is None or null_score < null["score"]:
                null = {"text": "", "start": 0, "end": 0, "start_logit": float(starts[cls]), "end_logit": float(ends[cls]), "score": float(null_score)}
            best_starts = np.argsort(-starts, kind="stable")[:n_best_size]
            best_ends = np.argsort(-ends, kind="stable")[:n_best_size]
            for s in best_starts:
                if window_offsets[s] is None:
                    continue
                for e in best_ends:
                    if window_offsets[e] is None or e < s or e - s + 1 > max_answer_length:
                        continue
                    char_span = trim_span(context, int(window_offsets[s][0]), int(window_offsets[e][1]))
                    if char_span is None:
                        continue
                    score = float(starts[s] + ends[e])
                    if char_span not in spans or score > spans[char_span]["score"]:
                        spans[char_span] = {
                            "text": context[char_span[0] : char_span[1]], "start": char_span[0], "end": char_span[1],
                            "start_logit": float(starts[s]), "end_logit": float(ends[e]), "score": score,
                        }
        ranked = sorted(spans.values(), key=lambda candidate: -candidate["score"])[:n_best_size]
        nbest = list(ranked)
        if version_2_with_negative and null is not None:
            nbest = sorted(nbest[: n_best_size - 1] + [null], key=lambda candidate: -candidate["score"])
        if nbest:
            for candidate, probability in zip(nbest, _softmax(np.array([c["score"] for c in nbest]))):
                candidate["probability"] = float(probability)
        best_span = ranked[0] if ranked else None

        null_score_diff = None
        no_answer_probability = 0.0
        predicted = best_span
        if version_2_with_negative:
            no_answer_probability = null["probability"] if null is not None else 1.0
            if best_span is None:
                null_score_diff = float("inf")
            else:
                null_score_diff = null["score"] - best_span["score"] if null is not None else float("-inf")
            if null_score_diff > null_score_diff_threshold:
                predicted = None
        if predicted is None:
            text, start, end = "", 0, 0
            score = no_answer_probability if version_2_with_negative else 0.0
        else:
            text, start, end, score = predicted["text"], predicted["start"], predicted["end"], predicted.get("probability", 1.0)
        results.append({
            "prediction_text": text, "start": start, "end": end, "score": float(score),
            "no_answer_probability": float(no_answer_probability), "null_score_diff": null_score_diff, "nbest": nbest,
        })
    return results


# ----------------------------------------------------------------------------------------------
# The task
# ----------------------------------------------------------------------------------------------
class QACollator:
    """Pads the model inputs (and labels) of window features; drops the postprocessing columns."""

    def __init__(self, tokenizer) -> None:
        self.pad = DataCollatorWithPadding(tokenizer)

    def __call__(self, features: list[dict[str, Any]]) -> dict[str, torch.Tensor]:
        return self.pad([{key: value for key, value in feature.items() if key not in POSTPROCESS_COLUMNS} for feature in features])


class QATask:
    name: ClassVar[str] = "qa"
    Options: ClassVar[type[TaskOptions]] = QAOptions
    pipeline_tag: ClassVar[str] = PIPELINE_TASK
    # Padded logit positions lie outside every window's offsets and are never read; a very low
    # value keeps them harmless anyway.
    output_pad_values: ClassVar[dict[str, float]] = {"start_logits": -1e4, "end_logits": -1e4}
    higher_is_better: ClassVar[dict[str, bool]] = {"loss": False}

    def __init__(self, config: RunConfig) -> None:
        self.config = config
        self.options: QAOptions = config.task_options
        self.tokenizer = None
        self._metric = None

    # ----- data ----------------------------------------------------------------------------
    def _normalise_hub_split(self, split: Dataset, name: str) -> Dataset:
        require_columns(split, ["question", "context"], name)
        rows = split.to_list()
        return rows_to_dataset([flat_row(row, f"split {name!r}, row {i}", str(i)) for i, row in enumerate(rows)])

    def load(self, *, include_train: bool = True) -> DatasetDict:
        data = self.config.data
        if data.files:
            check_files_exist(data.files)
            raw = DatasetDict({
                split: rows_to_dataset([
                    row for path in ([paths] if isinstance(paths, str) else paths)
                    for row in read_squad_file(path, encoding=data.encoding)
                ])
                for split, paths in data.files.items()
            })
        else:
            raw = DatasetDict({name: self._normalise_hub_split(split, name) for name, split in load_raw(data).items()})
        raw = finalize_splits(raw, data, self.config.seed, need_train=include_train)
        for split_name, split in raw.items():
            check_examples(split, split_name, version_2_with_negative=self.options.version_2_with_negative)
        return raw

    def load_inputs(self, path: str) -> Dataset:
        examples = rows_to_dataset(read_squad_file(path))
        check_examples(examples, "input", version_2_with_negative=None)
        return examples

    def build_tokenizer(self, raw, model_path: str | None = None):
        self.tokenizer = load_tokenizer(tokenizer_source(self.config.model, model_path), self.config.model.revision)
        return self.tokenizer

    def build_model(self, raw, model_path: str | None = None):
        # The pipeline reads its defaults from here, so a saved run answers as it was evaluated.
        defaults = {PIPELINE_TASK: {
            "max_seq_len": self.config.data.max_seq_length, "doc_stride": self.options.doc_stride,
            "max_answer_len": self.options.max_answer_length, "n_best_size": self.options.n_best_size,
            "handle_impossible_answer": self.options.version_2_with_negative,
            "null_score_diff_threshold": self.options.null_score_diff_threshold,
        }}
        if model_path is not None:
            return load_model(AutoModelForQuestionAnswering, self.config.model, model_path=model_path)
        return load_model(AutoModelForQuestionAnswering, self.config.model, config_overrides={"task_specific_params": defaults})

    def preprocess(self, examples: Dataset, *, train: bool) -> Dataset:
        data, options = self.config.data, self.options
        check_question_lengths(self.tokenizer, examples["question"], examples["id"], max_length=data.max_seq_length, doc_stride=options.doc_stride)
        if train:
            examples = self._drop_or_fail_mismatches(examples)
        return examples.map(
            prepare_features, batched=True, with_indices=True, remove_columns=examples.column_names,
            num_proc=data.preprocessing_num_workers,
            fn_kwargs={"tokenizer": self.tokenizer, "max_length": data.max_seq_length, "doc_stride": options.doc_stride, "train": train},
            desc="windows" + (" (train)" if train else ""),
        )

    def _drop_or_fail_mismatches(self, examples: Dataset) -> Dataset:
        bad = find_answer_mismatches(examples)
        if not bad:
            return examples
        first = examples[bad[0]]
        text, start = first["answers"]["text"][0], first["answers"]["answer_start"][0]
        found = first["context"][max(start, 0) : max(start, 0) + len(text)]
        message = (
            f"{len(bad)} training example(s) have an answer text that does not match the context at answer_start; "
            f"the first is example {bad[0]} (id {first['id']!r}): answer {text!r} at {start}, context there reads {found!r}"
        )
        if self.options.answer_mismatch == "error":
            raise DataError(message + ". Fix the data or set qa.answer_mismatch=skip to leave them out of training")
        logger.warning("%s; skipping them (qa.answer_mismatch=skip)", message)
        keep = sorted(set(range(len(examples))) - set(bad))
        if not keep:
            raise DataError(message + "; no training example is left")
        return examples.select(keep)

    def collator(self, *, train: bool):
        return QACollator(self.tokenizer)

    def predict_step(self, model, batch: dict[str, torch.Tensor]) -> dict[str, torch.Tensor]:
        batch = {key: value for key, value in batch.items() if key not in ("start_positions", "end_positions")}
        outputs = model(**batch)
        return {"start_logits": outputs.start_logits, "end_logits": outputs.end_logits}

    def postprocess(self, outputs: dict[str, np.ndarray], features: Dataset, examples: Dataset) -> list[dict[str, Any]]:
        options = self.options
        return postprocess_qa_predictions(
            examples["context"], features["example_index"], features["offset_mapping"],
            outputs["start_logits"], outputs["end_logits"], features["cls_index"],
            n_best_size=options.n_best_size, max_answer_length=options.max_answer_length,
            version_2_with_negative=options.version_2_with_negative, null_score_diff_threshold=options.null_score_diff_threshold,
        )

    def compute_metrics(self, predictions: list[dict[str, Any]], examples: Dataset) -> dict[str, float]:
        v2 = self.options.version_2_with_negative
        if self._metric is None:
            self._metric = load_metric("squad_v2" if v2 else "squad")
        references = [{"id": str(i), "answers": answers} for i, answers in enumerate(examples["answers"])]
        # Row numbers, not ids, key the metric: ids need not be unique across files.
        predicted = [{"id": str(i), "prediction_text": p["prediction_text"]} for i, p in enumerate(predictions)]
        if not v2:
            return self._metric.compute(predictions=predicted, references=references)
        for row, prediction in zip(predicted, predictions):
            row["no_answer_probability"] = prediction["no_answer_probability"]
        scores = self._metric.compute(predictions=predicted, references=references)
        scores["exact_match"] = scores.pop("exact")
        return scores

    def format_predictions(self, predictions: list[dict[str, Any]], examples: Dataset) -> list[dict[str, Any]]:
        rows = []
        for identifier, question, prediction in zip(examples["id"], examples["question"], predictions):
            row = {
                "id": identifier, "question": question, "answer": prediction["prediction_text"],
                "score": round(prediction["score"], 6), "start": prediction["start"], "end": prediction["end"],
            }
            if self.options.version_2_with_negative:
                row["no_answer_probability"] = round(prediction["no_answer_probability"], 6)
            rows.append(row)
        return rows

    def save_artifacts(self, predictions: list[dict[str, Any]], examples: Dataset, run_dir: str) -> None:
        """``predictions.json`` {id: text}, ``nbest_predictions.json`` {id: [candidates]} and, for v2,
        ``null_odds.json`` {id: no-answer probability} (the official v2 script's ``--na-prob-file``)."""
        run_dir = Path(run_dir)
        ids = examples["id"]
        write_json(run_dir / "predictions.json", {qid: p["prediction_text"] for qid, p in zip(ids, predictions)})
        write_json(run_dir / "nbest_predictions.json", {qid: p["nbest"] for qid, p in zip(ids, predictions)})
        if self.options.version_2_with_negative:
            write_json(run_dir / "null_odds.json", {qid: p["no_answer_probability"] for qid, p in zip(ids, predictions)})


# ----------------------------------------------------------------------------------------------
# transformers.pipeline("question-answering")
# ----------------------------------------------------------------------------------------------
class ExtractiveQuestionAnsweringPipeline(Pipeline):
    """``pipeline("question-answering", model=RUN_DIR)``: the transformers 4 interface on bertpipe's windows.

    ``qa(question=..., context=...)`` -> ``{score, start, end, answer}``; lists of questions and
    contexts (or of ``{"question", "context"}`` dicts) give a list; ``top_k > 1`` gives a list of
    answers per question. Keyword options: ``top_k``, ``doc_stride``, ``max_seq_len``,
    ``max_answer_len``, ``n_best_size``, ``handle_impossible_answer``, ``null_score_diff_threshold``;
    their defaults come from the run (``config.task_specific_params["question-answering"]``).
    ``score`` is the answer's probability among the n-best candidates (not transformers 4's
    product of start and end probabilities).
    """

    _load_processor = False
    _load_image_processor = False
    _load_feature_extractor = False
    _load_tokenizer = True

    _DEFAULTS = {"max_seq_len": 384, "doc_stride": 128, "max_answer_len": 30, "n_best_size": 20,
                 "handle_impossible_answer": False, "null_score_diff_threshold": 0.0, "top_k": 1}

    def _run_defaults(self) -> dict[str, Any]:
        saved = (getattr(self.model.config, "task_specific_params", None) or {}).get(PIPELINE_TASK, {})
        return {**self._DEFAULTS, **{key: value for key, value in saved.items() if key in self._DEFAULTS}}

    def _sanitize_parameters(self, top_k=None, doc_stride=None, max_seq_len=None, max_answer_len=None, n_best_size=None,
                             handle_impossible_answer=None, null_score_diff_threshold=None, **unused):
        # Only what the caller gave: call-time values then override construction-time ones, and
        # the run's defaults fill the rest in preprocess/postprocess.
        if unused:
            raise TypeError(f"unknown question-answering pipeline option(s): {sorted(unused)}")
        if top_k is not None and top_k < 1:
            raise ValueError(f"top_k must be at least 1, got {top_k}")
        given = lambda **values: {key: value for key, value in values.items() if value is not None}  # noqa: E731
        return (
            given(doc_stride=doc_stride, max_seq_len=max_seq_len),
            {},
            given(top_k=top_k, max_answer_len=max_answer_len, n_best_size=n_best_size,
                  handle_impossible_answer=handle_impossible_answer, null_score_diff_threshold=null_score_diff_threshold),
        )

    def __call__(self, *args, question=None, context=None, **kwargs):
        if question is not None or context is not None:
            if question is None or context is None:
                raise ValueError("give both question= and context=")
            if isinstance(question, str) and isinstance(context, str):
                inputs: Any = {"question": question, "context": context}
            else:
                questions = [question] * len(context) if isinstance(question, str) else list(question)
                contexts = [context] * len(questions) if isinstance(context, str) else list(context)
                if len(questions) != len(contexts):
                    raise ValueError(f"{len(questions)} questions but {len(contexts)} contexts")
                inputs = [{"question": q, "context": c} for q, c in zip(questions, contexts)]
        elif len(args) == 1:
            inputs = args[0]
        elif len(args) == 2 and all(isinstance(arg, str) for arg in args):
            inputs = {"question": args[0], "context": args[1]}
        else:
            raise ValueError("call with question=..., context=... or with {'question': ..., 'context': ...} (or a list)")
        # One example's windows already form one forward batch; batching examples would mix them.
        kwargs.pop("batch_size", None)
        return super().__call__(inputs, batch_size=1, **kwargs)

    def preprocess(self, example: dict[str, str], **options) -> dict[str, Any]:
        options = {**self._run_defaults(), **options}
        doc_stride, max_seq_len = options["doc_stride"], options["max_seq_len"]
        if not isinstance(example, dict) or not {"question", "context"} <= set(example):
            raise ValueError(f"a question-answering input needs 'question' and 'context', got {example!r}")
        question, context = example["question"], example["context"]
        if not context.strip():
            raise ValueError(f"the context is empty (question {question[:80]!r})")
        check_question_lengths(self.tokenizer, [question], ["input"], max_length=max_seq_len, doc_stride=doc_stride)
        features = prepare_features(
            {"question": [question], "context": [context]}, [0], tokenizer=self.tokenizer,
            max_length=max_seq_len, doc_stride=doc_stride, train=False,
        )
        model_inputs = self.tokenizer.pad(
            {name: features[name] for name in self.tokenizer.model_input_names if name in features}, return_tensors="pt"
        )
        return {"model_inputs": dict(model_inputs), "context": context, "offset_mapping": features["offset_mapping"], "cls_index": features["cls_index"]}

    def _forward(self, inputs: dict[str, Any]) -> dict[str, Any]:
        outputs = self.model(**inputs["model_inputs"])
        return {**inputs, "model_inputs": None, "start_logits": outputs.start_logits, "end_logits": outputs.end_logits}

    def postprocess(self, outputs: dict[str, Any], **options):
        options = {**self._run_defaults(), **options}
        top_k, max_answer_len = options["top_k"], options["max_answer_len"]
        n_best_size = max(options["n_best_size"], top_k)
        handle_impossible_answer, null_score_diff_threshold = options["handle_impossible_answer"], options["null_score_diff_threshold"]
        starts, ends = outputs["start_logits"].float().numpy(), outputs["end_logits"].float().numpy()
        (result,) = postprocess_qa_predictions(
            [outputs["context"]], [0] * len(starts), outputs["offset_mapping"], starts, ends, outputs["cls_index"],
            n_best_size=n_best_size, max_answer_length=max_answer_len,
            version_2_with_negative=handle_impossible_answer, null_score_diff_threshold=null_score_diff_threshold,
        )
        best = {"score": result["score"], "start": result["start"], "end": result["end"], "answer": result["prediction_text"]}
        if top_k == 1:
            return best
        others = [
            {"score": c["probability"], "start": c["start"], "end": c["end"], "answer": c["text"]}
            for c in result["nbest"] if (c["start"], c["end"], c["text"]) != (best["start"], best["end"], best["answer"])
        ]
        return ([best] + others)[:top_k]


def register_qa_pipeline() -> None:
    """Make ``pipeline("question-answering")`` build :class:`ExtractiveQuestionAnsweringPipeline` (idempotent).

    transformers 5 lists the task in ``REMOVED_TASKS``, which ``pipeline()`` checks (and raises on)
    before it consults ``PIPELINE_REGISTRY``; so the entry is removed as well as the task registered.
    """
    from transformers import pipelines as hf_pipelines

    registered = hf_pipelines.PIPELINE_REGISTRY.supported_tasks.get(PIPELINE_TASK)
    hf_pipelines.REMOVED_TASKS.pop(PIPELINE_TASK, None)
    if registered is not None and registered.get("impl") is ExtractiveQuestionAnsweringPipeline:
        return
    hf_pipelines.PIPELINE_REGISTRY.register_pipeline(
        PIPELINE_TASK, pipeline_class=ExtractiveQuestionAnsweringPipeline, pt_model=AutoModelForQuestionAnswering, type="text",
    )


register_qa_pipeline()
