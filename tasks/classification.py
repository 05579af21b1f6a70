"""Text classification: single sentence or sentence pair; multi-class, multi-label or regression.

In:  examples with a text column, an optional text-pair column and a label column (a ``ClassLabel``,
     strings, integers, lists of those for multi-label, or floats for regression).
Out: an ``AutoModelForSequenceClassification`` whose config carries ``id2label``/``label2id`` (so
     ``pipeline("text-classification")`` reports label names), metrics (accuracy, F1, precision,
     recall, Matthews correlation; Pearson/Spearman for regression) and per-example predictions.
"""

from __future__ import annotations

import logging
import math
from typing import Any, ClassVar, Literal

import numpy as np
import torch
from datasets import ClassLabel, Dataset, DatasetDict, LargeList, Sequence, Value
from pydantic import Field, field_validator
from transformers import AutoModelForSequenceClassification, DataCollatorWithPadding

from pipelines.config import RunConfig, TaskOptions, distinct_label_names
from pipelines.data import (
    KeyedOnCode, finalize_splits, load_raw, require_columns, require_one_type, require_text, require_values, row_list, split_source,
    split_where, tokenize_with_lengths,
)
from pipelines.errors import DataError
from pipelines.files import read_inputs, skip_blank_lines
from pipelines.graphemes import normalisation_note
from pipelines.metrics import load_metric
from pipelines.modeling import classification_token_comes_last, load_model
from pipelines.task import TaskBase

logger = logging.getLogger(__name__)

ProblemType = Literal["auto", "single_label", "multi_label", "regression"]
_HF_PROBLEM_TYPE = {
    "single_label": "single_label_classification",
    "multi_label": "multi_label_classification",
    "regression": "regression",
}


class ClassificationOptions(TaskOptions):
    fixed_by_training: ClassVar[frozenset[str]] = frozenset({"problem_type", "label_names"})
    problem_type: ProblemType = "auto"
    """``auto`` reads it from the label column: floats -> regression, lists -> multi-label."""
    label_names: list[str] | None = None
    """The label set in id order; by default the ``ClassLabel`` names or the sorted train labels."""
    multi_label_threshold: float = Field(default=0.5, gt=0, lt=1)

    @field_validator("label_names")
    @classmethod
    def _distinct_label_names(cls, value: list[str] | None) -> list[str] | None:
        return distinct_label_names(value)


class ClassificationTask(TaskBase):
    name: ClassVar[str] = "classification"
    Options: ClassVar[type[TaskOptions]] = ClassificationOptions
    pipeline_tag: ClassVar[str] = "text-classification"
    output_pad_values: ClassVar[dict[str, float]] = {}
    higher_is_better: ClassVar[dict[str, bool]] = {"mse": False}
    auto_model_class: ClassVar[type] = AutoModelForSequenceClassification
    peft_task_type: ClassVar[str | None] = "SEQ_CLS"
    onnx_outputs: ClassVar[tuple[str, ...]] = ("logits",)
    # transformers' text-classification pipeline does not truncate unless told to: without these a long
    # text gets another prediction than bertpipe predict's (and one past the model's positions, an error).
    card_pipeline_input: ClassVar[str | None] = '"a gripping, beautifully acted film", truncation=True, max_length={max_seq_length}'
    # A pair model shown one text would read it as a pair with an empty second text.
    card_pair_pipeline_input = ('{"text": "the company posted record profits", "text_pair": "profits at the company hit a record"}, '
                                'truncation=True, max_length={max_seq_length}')
    card_model_usage: ClassVar[str | None] = None
    packable: ClassVar[bool] = False  # the head reads each row's first token
    run_files: ClassVar[tuple[str, ...]] = ()

    def __init__(self, config: RunConfig) -> None:
        super().__init__(config)
        self.options: ClassificationOptions = config.task_options
        self.label_names: list[str] | None = None
        self.problem_type: str | None = None
        self._problem_type_because = ""
        self._metrics: dict[str, Any] = {}
        self._warned: set[str] = set()
        self._input_where = "--input"
        if config.data.text_pair_column:
            self.card_pipeline_input = self.card_pair_pipeline_input

    def _set_problem_type(self, problem_type: str, *, because: str) -> None:
        """``because`` says where the type came from, for the error a label column of the other kind gets."""
        self.problem_type = problem_type
        self._problem_type_because = because

    # ----- columns and labels -------------------------------------------------------------
    @property
    def text_column(self) -> str:
        return self.config.data.text_column or "text"

    @property
    def label_column(self) -> str:
        return self.config.data.label_column or "label"

    def _infer_problem_type(self, split: Dataset, split_name: str) -> tuple[str, str]:
        """The problem type and why it is that one."""
        if self.options.problem_type != "auto":
            return self.options.problem_type, f"classification.problem_type is {self.options.problem_type}"
        feature = split.features[self.label_column]
        if _holds_lists(feature):
            return "multi_label", f"split {split_name!r} holds lists of labels (multi_label)"
        # Decimal scores are what SQL and pandas-Decimal exports write to parquet: read as classes, every
        # distinct score became a label of its own.
        if isinstance(feature, Value) and feature.dtype.startswith(("float", "decimal")):
            return "regression", f"split {split_name!r} holds {feature.dtype} labels (regression)"
        return "single_label", f"split {split_name!r} holds one label per row (single_label)"

    def _check_label_kind(self, split: Dataset, split_name: str) -> None:
        """A label column of the other kind than the problem type is an error: a multi-label reading of
        string labels trained on their characters, and a single-label reading of lists on their repr."""
        if self.problem_type == "regression":
            return  # each value is read as a number, and a row that is not one is an error naming it
        holds_lists = _holds_lists(split.features[self.label_column])
        if holds_lists == (self.problem_type == "multi_label"):
            return
        example = split[0][self.label_column] if len(split) else None
        kind, needed = (("lists of labels", "one label per row") if holds_lists else
                        ("one label per row", "a list of labels per row"))
        raise DataError(
            f"{split_where(self.config.data, split_name)}: label column {self.label_column!r} holds "
            f"{kind} (e.g. {example!r}), but {self._problem_type_because}, which reads {needed}"
        )

    def _infer_label_names(self, split: Dataset) -> list[str]:
        if self.options.label_names:
            return list(self.options.label_names)
        feature = split.features[self.label_column]
        inner = getattr(feature, "feature", None)
        if isinstance(feature, ClassLabel):
            return list(feature.names)
        if isinstance(inner, ClassLabel):
            return list(inner.names)
        values = split[self.label_column]
        if self.problem_type == "multi_label":
            values = [value for row in values for value in row]
        return sorted({str(value) for value in values}, key=_natural_key)

    def _label_ids(self, split: Dataset, split_name: str) -> list[Any]:
        """Label column -> ids (or multi-hot / floats), failing on a label outside the label set."""
        column = split[self.label_column]
        where = split_where(self.config.data, split_name)
        if self.problem_type == "regression":
            return [_score(value, row, where) for row, value in enumerate(column)]
        feature = split.features[self.label_column]
        class_label = feature if isinstance(feature, ClassLabel) else getattr(feature, "feature", None)
        class_names = list(class_label.names) if isinstance(class_label, ClassLabel) else None
        named = class_names is not None
        label2id = {name: index for index, name in enumerate(self.label_names)}

        def to_id(value: Any, row: int) -> int:
            if isinstance(value, float) and not math.isfinite(value):  # json's NaN: a missing label, not a class "nan"
                raise DataError(
                    f"{where}, row {row + 1} (rows count from 1): label {value!r} is not a finite number, nor a label"
                )
            if named and int(value) < 0:
                raise DataError(
                    f"{where}, row {row + 1} (rows count from 1): label {value} means 'unlabelled'; "
                    "this split cannot be evaluated"
                )
            if class_names == self.label_names:
                return int(value)
            # A ClassLabel id indexes the dataset's own names; classification.label_names (or a finished
            # run's id2label) may order them differently, so the id is mapped through its name.
            name = class_names[int(value)] if named else str(value)
            if isinstance(value, float) and value.is_integer() and name not in label2id:
                name = str(int(value))  # labels 0/1 of a file that writes them 0.0/1.0
            if name not in label2id:
                raise DataError(
                    f"{where}, row {row + 1} (rows count from 1): label {value!r} is not in the label set "
                    f"{self.label_names}{normalisation_note(name, self.label_names)}"
                )
            return label2id[name]

        if self.problem_type == "multi_label":
            rows = []
            for row, values in enumerate(column):
                hot = [0.0] * len(self.label_names)
                for value in values:
                    hot[to_id(value, row)] = 1.0
                rows.append(hot)
            return rows
        return [to_id(value, row) for row, value in enumerate(column)]

    def _check_training_classes(self, label_ids: list[int]) -> None:
        """A training split without some classes trains a model that never predicts them, with no error;
        the usual cause is ``data.max_train_samples`` keeping the first rows of a split sorted by label."""
        data = self.config.data
        present = set(label_ids)
        missing = [name for index, name in enumerate(self.label_names) if index not in present]
        where = f"split {data.train_split!r} ({split_source(data, data.train_split)})"
        cut = (f"; data.max_train_samples={data.max_train_samples} keeps the split's first rows, and its rows may be sorted "
               "by label: shuffle the file or raise the limit") if data.max_train_samples else ""
        # Whatever the label set names (the file's labels, classification.label_names, a ClassLabel), one label is refused.
        if len(present) < 2:
            only = self.label_names[next(iter(present))] if present else None
            raise DataError(f"{where}: every training example has label {only!r}; a classifier needs examples of two or more labels{cut}")
        if missing:
            logger.warning("%s has no examples of label(s) %s, which the model will never learn to predict%s", where, missing, cut)

    # ----- the task interface ------------------------------------------------------------
    def load(self, *, include_train: bool = True) -> DatasetDict:
        data = self.config.data
        loaded = load_raw(data, text_columns=[self.text_column, data.text_pair_column])
        # Before sampling and hold-out, while row numbers are still the file's.
        used = {data.train_split, data.eval_split} if include_train else {data.eval_split}
        for split_name in sorted(used & set(loaded)):
            source = split_source(data, split_name)
            require_values(loaded[split_name], [self.text_column, data.text_pair_column, self.label_column], split_name, source)
            require_one_type(loaded[split_name], [self.label_column], split_name, source)
            require_text(loaded[split_name], [self.text_column, data.text_pair_column], split_where(data, split_name))
        raw = finalize_splits(loaded, data, self.config.seed, need_train=include_train)
        for split_name, split in raw.items():
            require_columns(split, [self.text_column, data.text_pair_column, self.label_column], split_where(data, split_name))
        reference = raw[data.train_split] if include_train else raw[data.eval_split]
        # A finished run's head (build_model(model_path=...) runs first) fixes the problem type; inferred
        # from an eval file instead, labels 0/1 written as 0.0/1.0 would score a classifier as a regression.
        if include_train or self.problem_type is None:
            problem_type, because = self._infer_problem_type(reference, data.train_split if include_train else data.eval_split)
            self._set_problem_type(problem_type, because=because)
        for split_name, split in raw.items():
            self._check_label_kind(split, split_name)
        if include_train and self.problem_type != "regression":
            # From the whole training file, not the rows data.max_train_samples kept: a file sorted by label and cut
            # keeps the labels it lost in the set (a warning names them), and one label left is refused.
            self.label_names = self._infer_label_names(loaded.get(data.train_split, reference))
        return raw

    def texts_per_input(self) -> int:
        return 2 if self.config.data.text_pair_column else 1

    def load_inputs(self, path: str) -> Dataset:
        text_columns = [self.text_column, self.config.data.text_pair_column, "text"]
        inputs = skip_blank_lines(read_inputs(path, encoding=self.config.data.encoding, text_columns=text_columns), path)
        if self.text_column not in inputs.column_names and "text" in inputs.column_names:
            inputs = inputs.rename_column("text", self.text_column)
        require_columns(inputs, [self.text_column, self.config.data.text_pair_column], f"--input {path}")
        require_values(inputs, [self.text_column, self.config.data.text_pair_column], "input", f"--input {path}")
        require_text(inputs, [self.text_column, self.config.data.text_pair_column], f"--input {path}")
        self._input_where = f"--input {path}"
        return inputs

    def build_tokenizer(self, raw, model_path: str | None = None):
        tokenizer = super().build_tokenizer(raw, model_path)
        # Padding goes after the token the head reads: a tokenizer saved with padding_side=left put [PAD] at position 0 of
        # every shorter row, which BERT's pooler reads (and XLNet's saved with right, at the last position its summary
        # reads). The run saves the tokenizer so, and pipeline() batches pad the same side.
        tokenizer.padding_side = "left" if classification_token_comes_last(tokenizer) else "right"
        return tokenizer

    def build_model(self, raw, model_path: str | None = None):
        if model_path is not None:
            model = load_model(self.auto_model_class, self.config.model, model_path=model_path)
            problem_type = {v: k for k, v in _HF_PROBLEM_TYPE.items()}.get(model.config.problem_type, "single_label")
            self._set_problem_type(problem_type, because=f"the model in {model_path} is {problem_type}")
            self.label_names = None if self.problem_type == "regression" else [model.config.id2label[i] for i in range(model.config.num_labels)]
            return model
        if self.problem_type == "regression":
            label_maps = {"num_labels": 1, "problem_type": "regression"}
        else:
            label_maps = {
                "num_labels": len(self.label_names),
                "id2label": dict(enumerate(self.label_names)),
                "label2id": {name: index for index, name in enumerate(self.label_names)},
                "problem_type": _HF_PROBLEM_TYPE[self.problem_type],
            }
        return load_model(self.auto_model_class, self.config.model, label_maps=label_maps)

    def preprocess(self, examples: Dataset, *, train: bool, inputs: bool = False) -> Dataset:
        data = self.config.data
        # Inputs to predict may carry gold labels (a test file), even ones the model lacks or nulls:
        # predict never reads them, so they are not checked against the label set.
        labelled = self.label_column in examples.column_names and not inputs
        if labelled:
            label_ids = self._label_ids(examples, data.train_split if train else data.eval_split)
            if train and self.problem_type == "single_label":
                self._check_training_classes(label_ids)
            examples = examples.add_column("__labels", label_ids)
        features = examples.map(
            KeyedOnCode(_tokenize), batched=True, remove_columns=examples.column_names, num_proc=data.preprocessing_num_workers,
            fn_kwargs={
                "tokenizer": self.tokenizer, "text_column": self.text_column, "pair_column": data.text_pair_column,
                "max_length": data.max_seq_length,
            },
            desc="tokenising",
        )
        where = self._input_where if inputs else f"split {(data.train_split if train else data.eval_split)!r}"
        self._warn_of_cut_texts(features, where, show_rows=inputs or not data.validation_fraction)
        return features.remove_columns(_LENGTH_COLUMN)

    def _warn_of_cut_texts(self, features: Dataset, where: str, *, show_rows: bool) -> None:
        """Truncation is silent in the tokenizer: a text cut at ``data.max_seq_length`` is trained on, scored
        and predicted without its end. Say so once per split or input file, as translation does.
        Rows are named where they are the file's (a split held out by data.validation_fraction is shuffled)."""
        lengths = features.with_format("arrow")[_LENGTH_COLUMN].to_numpy()
        cut = np.flatnonzero(lengths > self.config.data.max_seq_length).tolist()
        if not cut:
            return
        noun = "text pair(s)" if self.config.data.text_pair_column else "text(s)"
        rows = f" (rows {row_list(cut)}, counting from 1)" if show_rows else ""
        logger.warning(
            "%s: %d of %d %s%s are longer than data.max_seq_length=%d tokens (the longest has %d) and are cut there, so "
            "the model never reads their ends; raise data.max_seq_length",
            where, len(cut), len(lengths), noun, rows, self.config.data.max_seq_length, int(lengths.max()),
        )

    def collator(self, *, train: bool):
        return DataCollatorWithPadding(self.tokenizer)

    def predict_step(self, model, batch: dict[str, torch.Tensor]) -> dict[str, torch.Tensor]:
        batch = {key: value for key, value in batch.items() if key != "labels"}
        return {"logits": model(**batch).logits}

    def postprocess(self, outputs: dict[str, np.ndarray], features: Dataset, examples: Dataset) -> dict[str, np.ndarray]:
        logits = outputs["logits"].astype(np.float64)
        result: dict[str, np.ndarray] = {}
        if self.problem_type == "regression":
            result["scores"] = logits[:, 0]
        elif self.problem_type == "multi_label":
            result["probabilities"] = 1.0 / (1.0 + np.exp(-logits))
            result["predictions"] = (result["probabilities"] >= self.options.multi_label_threshold).astype(np.int64)
        else:
            shifted = np.exp(logits - logits.max(axis=1, keepdims=True))
            result["probabilities"] = shifted / shifted.sum(axis=1, keepdims=True)
            result["predictions"] = result["probabilities"].argmax(axis=1)
        if "labels" in features.column_names:
            result["references"] = np.asarray(features["labels"])
        return result

    def _warn_once(self, kind: str, message: str) -> None:
        """Evaluation runs every ``train.eval_steps``: a cause that stays (the eval split's own) is said once."""
        if kind not in self._warned:
            self._warned.add(kind)
            logger.warning(message)

    def _metric(self, name: str):
        if name not in self._metrics:
            self._metrics[name] = load_metric(name)
        return self._metrics[name]

    def compute_metrics(self, predictions: dict[str, np.ndarray], examples: Dataset) -> dict[str, float]:
        references = predictions["references"]
        if self.problem_type == "regression":
            scores = predictions["scores"]
            undefined = _undefined_correlation(scores, references)
            if undefined:
                # One warning naming the split, instead of one from scipy per metric (or, for a one-example
                # split, a traceback at the end of training); NaN is written to metrics.json as null.
                data = self.config.data
                self._warn_once(
                    undefined[0],
                    f"split {data.eval_split!r} ({split_source(data, data.eval_split)}): Pearson and Spearman correlations "
                    f"are undefined {undefined[1]}; eval pearson and spearmanr are NaN",
                )
                pearson = spearman = math.nan
            else:
                pearson = self._metric("pearsonr").compute(predictions=scores, references=references)["pearsonr"]
                spearman = self._metric("spearmanr").compute(predictions=scores, references=references)["spearmanr"]
            return {"pearson": pearson, "spearmanr": spearman, "mse": float(np.mean((scores - references) ** 2))}
        predicted = predictions["predictions"]
        if self.problem_type == "multi_label":
            # Macro over the labels that occur in the references or the predictions, as for one label per row
            # below (sklearn's multi-label default averages every column: a label the split lacks and the model
            # never predicts counted as 0, marking a perfect model down).
            occurring = np.flatnonzero(references.any(axis=0) | predicted.any(axis=0)).tolist() or None
            predicted, references = predicted.tolist(), references.astype(np.int64).tolist()
            return {
                "accuracy": self._metric("accuracy").compute(predictions=predicted, references=references)["accuracy"],
                **{
                    f"{name}_{average}": self._metric(name).compute(
                        predictions=predicted, references=references, average=average, labels=occurring
                    )[name]
                    for name in ("f1", "precision", "recall") for average in ("micro", "macro")
                },
            }
        binary = len(self.label_names) == 2
        metrics = {"accuracy": self._metric("accuracy").compute(predictions=predicted, references=references)["accuracy"]}
        if binary:
            metrics["f1"] = self._metric("f1").compute(predictions=predicted, references=references)["f1"]
        # Over the labels that occur in the references or the predictions (sklearn's default): a class the
        # split lacks and the model never predicts has no precision or recall, and averaging it in as 0 marks
        # a perfect model down.
        for name in ("f1", "precision", "recall"):
            for average in ("macro", "micro") if name == "f1" else ("macro",):
                metrics[f"{name}_{average}"] = self._metric(name).compute(
                    predictions=predicted, references=references, average=average
                )[name]
        metrics["matthews_correlation"] = self._metric("matthews_correlation").compute(
            predictions=predicted, references=references
        )["matthews_correlation"]
        return metrics

    def metric_names(self) -> tuple[str, ...]:
        if self.problem_type == "regression":
            return ("pearson", "spearmanr", "mse")
        if self.problem_type == "multi_label":
            return ("accuracy", *(f"{name}_{average}" for name in ("f1", "precision", "recall") for average in ("micro", "macro")))
        binary = ("f1",) if len(self.label_names) == 2 else ()
        return ("accuracy", *binary, "f1_macro", "f1_micro", "precision_macro", "recall_macro", "matthews_correlation")

    def input_columns(self) -> tuple[str, ...]:
        return tuple(name for name in (self.text_column, self.config.data.text_pair_column, "text") if name)

    def format_predictions(self, predictions: dict[str, np.ndarray], examples: Dataset) -> list[dict[str, Any]]:
        rows = []
        texts = examples[self.text_column]
        pairs = examples[self.config.data.text_pair_column] if self.config.data.text_pair_column else None
        for index, text in enumerate(texts):
            row: dict[str, Any] = {"text": text}
            if pairs is not None:
                row["text_pair"] = pairs[index]
            if self.problem_type == "regression":
                row["score"] = float(predictions["scores"][index])
            elif self.problem_type == "multi_label":
                probabilities = predictions["probabilities"][index]
                row["labels"] = [name for name, hot in zip(self.label_names, predictions["predictions"][index]) if hot]
                row["scores"] = {name: round(float(p), 6) for name, p in zip(self.label_names, probabilities)}
            else:
                probabilities = predictions["probabilities"][index]
                best = int(predictions["predictions"][index])
                row["label"] = self.label_names[best]
                row["score"] = round(float(probabilities[best]), 6)
                row["scores"] = {name: round(float(p), 6) for name, p in zip(self.label_names, probabilities)}
            rows.append(row)
        return rows

    def pipeline_inputs(self, examples: Dataset) -> list[Any]:
        texts = list(examples[self.text_column])
        pair_column = self.config.data.text_pair_column
        return [{"text": t, "text_pair": p} for t, p in zip(texts, examples[pair_column])] if pair_column else texts

    def save_artifacts(self, predictions, examples: Dataset, run_dir: str) -> None:
        """Classification has nothing beyond the model and metrics to save."""


_LENGTH_COLUMN = "__length"


def _tokenize(batch: dict[str, list], *, tokenizer, text_column: str, pair_column: str | None, max_length: int) -> dict:
    """Module-level (not a closure) so that ``datasets`` can hash it and cache the result. Each row's length
    before truncation goes to ``_LENGTH_COLUMN``, so the task can say what was cut."""
    encoded, lengths = tokenize_with_lengths(tokenizer, [batch[text_column], batch[pair_column] if pair_column else None], max_length)
    encoded[_LENGTH_COLUMN] = lengths
    if "__labels" in batch:
        encoded["labels"] = batch["__labels"]
    return encoded


def _holds_lists(feature: Any) -> bool:
    # LargeList (Polars' list type, and what datasets writes for one) is not a Sequence: read as one label
    # per row, each combination of labels became a class named after the list's printed form.
    return isinstance(feature, (Sequence, LargeList, list, dict))


def _undefined_correlation(scores: np.ndarray, references: np.ndarray) -> tuple[str, str] | None:
    """Why no correlation of ``scores`` with ``references`` exists (a kind and the words), or None."""
    if len(references) < 2:
        return "count", f"for {len(references)} example(s) (they need 2 or more)"
    if np.all(references == references[0]):
        return "references", f"because every reference score is {float(references[0]):g}"
    if np.all(scores == scores[0]):
        return "scores", f"because the model predicts the same score ({float(scores[0]):g}) for every example"
    return None


def _score(value: Any, row: int, where: str) -> float:
    try:
        score = float(value)
    except (TypeError, ValueError):
        raise DataError(
            f"{where}, row {row + 1} (rows count from 1): label {value!r} is not a number; "
            "a regression run needs a numeric score in every row"
        ) from None
    if not math.isfinite(score):  # json reads NaN and Infinity: one such score trained every weight to NaN, exit 0
        raise DataError(
            f"{where}, row {row + 1} (rows count from 1): label {value!r} is not a finite number; "
            "a regression run needs a finite score in every row (a missing score has none)"
        )
    return score


def _natural_key(name: str) -> tuple:
    """Sort ``"2" < "10"`` numerically and names alphabetically.

    The names come from a set, whose order changes with each process's string-hash seed, so the key must
    order any two names: numbers that tie ("1", "01") fall back to the name, and "nan"/"inf" (which do not
    compare) count as names. Otherwise each process of a run could number the labels its own way.
    """
    try:
        number = float(name)
    except ValueError:
        return (1, 0.0, name)
    return (0, number, name) if math.isfinite(number) else (1, 0.0, name)
