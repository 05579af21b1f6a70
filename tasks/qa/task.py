"""The QA task: :class:`QATask`, which the pipeline's train/evaluate/predict loop drives.

In:  a ``RunConfig`` with ``task: qa`` and its ``qa:`` options (:class:`QAOptions`); SQuAD data from the
     Hub or local files (:mod:`tasks.qa.squad_files`).
Out: raw splits, window features (:mod:`tasks.qa.windows`), an ``AutoModelForQuestionAnswering`` whose
     config carries the pipeline's defaults, decoded answers (:mod:`tasks.qa.decoding`), SQuAD exact
     match / F1 (0-100; v2 adds HasAns/NoAns and the best no-answer threshold), prediction rows and
     the run-directory files ``predictions.json``, ``nbest_predictions.json`` and (v2) ``null_odds.json``.
"""

from __future__ import annotations

import json
import logging
from pathlib import Path
from typing import Any, ClassVar, Literal

import numpy as np
import torch
from datasets import Dataset, DatasetDict
from pydantic import Field
from transformers import AutoModelForQuestionAnswering

from pipelines.atomic_writes import write_json
from pipelines.config import RunConfig, TaskOptions
from pipelines.data import KeyedOnCode, finalize_splits, load_raw, require_columns, split_where
from pipelines.errors import DataError
from pipelines.files import load_split_files
from pipelines.metrics import load_metric
from pipelines.modeling import classification_token_comes_last, load_model
from pipelines.task import TaskBase
from tasks.qa.decoding import postprocess_qa_predictions
from tasks.qa.pipeline import PIPELINE_TASK
from tasks.qa.squad_files import (
    WRITTEN_ID, check_examples, check_unique_ids, find_answer_mismatches, flat_row, read_squad_file, rows_to_dataset,
)
from tasks.qa.windows import check_question_lengths, prepare_features

logger = logging.getLogger(__name__)

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


class QACollator:
    """Pads the model inputs of window features on the right; drops the postprocessing columns."""

    def __init__(self, tokenizer) -> None:
        self.tokenizer = tokenizer

    def __call__(self, features: list[dict[str, Any]]) -> dict[str, torch.Tensor]:
        # On the right whatever the tokenizer's padding_side (XLNet's is left): start/end labels,
        # cls_index and offset_mapping count a window's tokens from position 0, and so does decoding.
        return self.tokenizer.pad(
            [{key: value for key, value in feature.items() if key not in POSTPROCESS_COLUMNS} for feature in features],
            padding=True, padding_side="right", return_tensors="pt",
        )


class QATask(TaskBase):
    name: ClassVar[str] = "qa"
    Options: ClassVar[type[TaskOptions]] = QAOptions
    pipeline_tag: ClassVar[str] = PIPELINE_TASK
    # Padded logit positions lie outside every window's offsets and are never read; a very low
    # value keeps them harmless anyway.
    output_pad_values: ClassVar[dict[str, float]] = {"start_logits": -1e4, "end_logits": -1e4}
    higher_is_better: ClassVar[dict[str, bool]] = {"exact_match": True, "f1": True}
    auto_model_class: ClassVar[type] = AutoModelForQuestionAnswering
    peft_task_type: ClassVar[str | None] = "QUESTION_ANS"
    onnx_outputs: ClassVar[tuple[str, ...]] = ("start_logits", "end_logits")
    # transformers 5 has no question-answering pipeline (bertpipe registers its own, tasks.qa.pipeline).
    card_pipeline_input: ClassVar[str | None] = None
    # transformers 5 has no question-answering pipeline (bertpipe registers its own): the card decodes as
    # predict does, with the settings the run saved (one window; longer contexts need predict's stride).
    card_model_usage: ClassVar[str | None] = """import torch

question, context = "Who wrote Hamlet?", "Hamlet is a tragedy written by William Shakespeare."
settings = model.config.task_specific_params["question-answering"]  # what the run was evaluated with
question_first = tokenizer.padding_side == "right"  # tokenizers that pad on the left (XLNet) put the context first
inputs = tokenizer(*((question, context) if question_first else (context, question)), return_tensors="pt",
                   truncation="only_second" if question_first else "only_first", max_length=settings["max_seq_len"],
                   return_offsets_mapping=True)
offsets = inputs.pop("offset_mapping")[0].tolist()
with torch.no_grad():
    outputs = model(**inputs)
starts, ends = outputs.start_logits[0].tolist(), outputs.end_logits[0].tolist()
# The best span of context tokens by start + end logit: start <= end, at most max_answer_len tokens.
in_context = [part == (1 if question_first else 0) for part in inputs.sequence_ids(0)]
best, start, end = max((starts[s] + ends[e], s, e) for s in range(len(starts))
                       for e in range(s, min(s + settings["max_answer_len"], len(ends))) if in_context[s] and in_context[e])
# The template's CLS, owned by no text sequence (XLNet's comes last; a context may hold the text "<cls>" too).
# Without a CLS token (Gemma's tokenizer), position 0: the question's, never an answer.
cls = next((i for i, (token, part) in enumerate(zip(inputs["input_ids"][0].tolist(), inputs.sequence_ids(0)))
            if token == tokenizer.cls_token_id and part is None), 0)
if settings["handle_impossible_answer"] and starts[cls] + ends[cls] - best > settings["null_score_diff_threshold"]:
    print("(no answer)")
else:
    print(context[offsets[start][0] : offsets[end][1]].strip())"""
    packable: ClassVar[bool] = False  # start/end positions index the row
    run_files: ClassVar[tuple[str, ...]] = ("predictions.json", "nbest_predictions.json", "null_odds.json")

    def __init__(self, config: RunConfig) -> None:
        super().__init__(config)
        self.options: QAOptions = config.task_options
        self._metric = None
        self._input_where = "--input"  # with its path once load_inputs has read it

    # ----- data ----------------------------------------------------------------------------
    def _normalise_hub_split(self, split: Dataset, name: str) -> Dataset:
        require_columns(split, ["question", "context"], split_where(self.config.data, name))
        rows = split.to_list()
        return rows_to_dataset([flat_row(row, f"split {name!r}, row {i + 1}", str(i + 1)) for i, row in enumerate(rows)])

    def load(self, *, include_train: bool = True) -> DatasetDict:
        data = self.config.data
        if data.files:
            raw = load_split_files(data.files, lambda path: read_squad_file(path, encoding=data.encoding), rows_to_dataset)
        else:
            raw = DatasetDict({name: self._normalise_hub_split(split, name) for name, split in load_raw(data).items()})
        raw = finalize_splits(raw, data, self.config.seed, need_train=include_train)
        for split_name, split in raw.items():
            check_examples(split, split_where(data, split_name), version_2_with_negative=self.options.version_2_with_negative)
        if data.eval_split in raw:
            check_unique_ids(raw[data.eval_split], data.eval_split)
        return raw

    def load_inputs(self, path: str) -> Dataset:
        examples = rows_to_dataset(read_squad_file(path, encoding=self.config.data.encoding), written_ids=True)
        self._input_where = f"--input {path}"
        check_examples(examples, self._input_where, version_2_with_negative=None)
        return examples

    def build_tokenizer(self, raw, model_path: str | None = None):
        tokenizer = super().build_tokenizer(raw, model_path)
        if model_path is None:
            # The pair's order follows the padding side (question first when it pads right, as transformers' own
            # examples read it), and the run saves it so. A new run takes the order its template reads: context first
            # only where the classification token comes last (XLNet). A tokenizer with no CLS token saved to pad left
            # (GemmaTokenizer's default) put a context piece at position 0, the no-answer label of every window
            # without the answer. A finished run keeps the side it saved, the order it was trained in.
            tokenizer.padding_side = "left" if classification_token_comes_last(tokenizer) else "right"
        return tokenizer

    def build_model(self, raw, model_path: str | None = None):
        # The pipeline reads its defaults from here, so a saved run answers as it was evaluated.
        defaults = {PIPELINE_TASK: {
            "max_seq_len": self.config.data.max_seq_length, "doc_stride": self.options.doc_stride,
            "max_answer_len": self.options.max_answer_length, "n_best_size": self.options.n_best_size,
            "handle_impossible_answer": self.options.version_2_with_negative,
            "null_score_diff_threshold": self.options.null_score_diff_threshold,
        }}
        if model_path is not None:
            return load_model(self.auto_model_class, self.config.model, model_path=model_path)
        return load_model(self.auto_model_class, self.config.model, config_overrides={"task_specific_params": defaults})

    def preprocess(self, examples: Dataset, *, train: bool, inputs: bool = False) -> Dataset:
        data, options = self.config.data, self.options
        where = self._input_where if inputs else split_where(data, data.train_split if train else data.eval_split)
        check_question_lengths(self.tokenizer, examples["question"], examples["id"], max_length=data.max_seq_length,
                               doc_stride=options.doc_stride, where=where)
        if train:
            examples = self._drop_or_fail_mismatches(examples)
        features = examples.map(
            KeyedOnCode(prepare_features), batched=True, with_indices=True, remove_columns=examples.column_names,
            num_proc=data.preprocessing_num_workers,
            fn_kwargs={"tokenizer": self.tokenizer, "max_length": data.max_seq_length, "doc_stride": options.doc_stride, "train": train},
            desc="windows" + (" (train)" if train else ""),
        )
        if train:
            self._warn_of_answers_no_window_holds(examples, features)
        return features

    def _warn_of_answers_no_window_holds(self, examples: Dataset, features: Dataset) -> None:
        """An answer that no window holds whole (longer than a window's room for context, or across every
        window edge) trains each of its windows as "no answer", under v1 too: say how many, once."""
        answered = {index for index, answers in enumerate(examples["answers"]) if answers["text"]}
        labelled = {
            index for index, start, cls_index in zip(features["example_index"], features["start_positions"], features["cls_index"])
            if start != cls_index
        }
        lost = sorted(answered - labelled)
        if lost:
            first = examples[lost[0]]
            logger.warning(
                "%d of %d answered training example(s) have an answer that no window of data.max_seq_length=%d tokens "
                "(qa.doc_stride=%d) holds whole, so they train as 'no answer'; the first is example %d (id %r), "
                "answer %r. Raise data.max_seq_length or qa.doc_stride if these are many",
                len(lost), len(answered), self.config.data.max_seq_length, self.options.doc_stride, lost[0] + 1, first["id"],
                first["answers"]["text"][0][:80],
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
            f"the first is example {bad[0] + 1} (id {first['id']!r}): answer {text!r} at {start}, context there reads {found!r}"
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

    def metric_names(self) -> tuple[str, ...]:
        if not self.options.version_2_with_negative:
            return ("exact_match", "f1")
        groups = (f"{group}_{name}" for group in ("HasAns", "NoAns") for name in ("exact", "f1", "total"))
        return ("exact_match", "f1", "total", *groups, "best_exact", "best_exact_thresh", "best_f1", "best_f1_thresh")

    def metrics_absent_from(self, examples: Dataset) -> dict[str, str]:
        if not self.options.version_2_with_negative:
            return {}
        # evaluate-v2.0.py scores a group only when the eval split holds a question of it.
        answerable = [bool(answers["text"]) for answers in examples["answers"]]
        absent = {}
        for group, holds, what in (("HasAns", any(answerable), "answerable"), ("NoAns", not all(answerable), "unanswerable")):
            if not holds:
                why = f"the eval split holds no {what} question, and SQuAD v2 scores the {group} group over those alone"
                absent.update({f"{group}_{name}": why for name in ("exact", "f1", "total")})
        return absent

    def input_columns(self) -> tuple[str, ...]:
        return ("id", "question", "context")

    def format_predictions(self, predictions: list[dict[str, Any]], examples: Dataset) -> list[dict[str, Any]]:
        rows = []
        # Ids as the input wrote them (an integer id 17 came back as "17", and joined back to nothing).
        identifiers = [json.loads(written) for written in examples[WRITTEN_ID]] if WRITTEN_ID in examples.column_names else examples["id"]
        for identifier, question, prediction in zip(identifiers, examples["question"], predictions):
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
