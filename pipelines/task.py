"""The interface every task implements; the loop, evaluation and CLI call only these methods.

A task object is built from the resolved :class:`~pipelines.config.RunConfig` and is called in
this order:

    load(include_train=)         -> DatasetDict of raw examples (train + eval split)
    build_tokenizer(raw)         -> fast tokenizer (raw is None when loading a finished run)
    build_model(raw)             -> PreTrainedModel whose forward returns ``.loss`` given labels
    preprocess(examples, train=, inputs=) -> model features (QA: one example -> many windows)
    collator(train=)             -> batch padding; MLM masking lives here
    predict_step(model, batch)   -> dict of tensors (batch-first) to gather across processes
    postprocess(outputs, features, examples) -> predictions at the example level
    compute_metrics(predictions, examples)   -> flat {name: float} (no ``eval_`` prefix)
    format_predictions(predictions, examples) -> one JSON-able dict per example (``bertpipe predict``)
    input_columns()              -> the predict input columns read; the others are copied to the output

The class attributes carry the facts ``pipelines/`` needs about a task (Auto class, peft task type,
ONNX outputs, model-card usage), so a new task needs no edit there.

There is no training hook: ``model(**batch).loss`` is the whole training step. Shared helpers are
plain functions in ``pipelines/``; :class:`TaskBase` holds the defaults a task may take (its settings,
the checkpoint's own fast tokenizer, no pipeline comparison); tasks do not inherit from each other.
"""

from __future__ import annotations

from typing import Any, Callable, ClassVar, Protocol

import torch
from datasets import Dataset, DatasetDict
from transformers import PreTrainedModel, PreTrainedTokenizerBase

from pipelines.config import ConfigError, RunConfig, TaskOptions


class Task(Protocol):
    name: ClassVar[str]
    """Registry key, equal to ``task:`` in the YAML."""
    Options: ClassVar[type[TaskOptions]]
    """The task's own settings, written under a YAML section named after the task."""
    pipeline_tag: ClassVar[str]
    """The ``transformers.pipeline`` task name a finished run serves (also the Hub tag)."""
    output_pad_values: ClassVar[dict[str, float]]
    """Pad value per ``predict_step`` output when batches of different lengths are joined."""
    higher_is_better: ClassVar[dict[str, bool]]
    """Direction of metrics for best-model selection; one not named is higher-is-better."""
    auto_model_class: ClassVar[type]
    """The transformers Auto class that loads a finished run (named in the model card's usage snippet)."""
    peft_task_type: ClassVar[str | None]
    """The peft ``TaskType`` member name for ``model.peft`` (``SEQ_CLS``...); None: a plain ``PeftModel``."""
    onnx_outputs: ClassVar[tuple[str, ...]]
    """The model outputs ``bertpipe export`` writes to ONNX; empty: the task cannot be exported."""
    card_pipeline_input: ClassVar[str | None]
    """The Python arguments the model card passes to ``pipeline(pipeline_tag)``'s call, where
    ``{max_seq_length}`` stands for the run's ``data.max_seq_length``; None where transformers has no
    pipeline for the task (the card then shows ``card_model_usage``)."""
    card_model_usage: ClassVar[str | None]
    """Python the model card runs on ``model`` and ``tokenizer`` when there is no pipeline to show."""
    packable: ClassVar[bool]
    """Whether training batches may be packed (``train.pack_sequences``): the collator's outputs are all
    per token, so examples can share a row (token classification, not a pooled [CLS] head)."""
    run_files: ClassVar[tuple[str, ...]]
    """The files ``save_artifacts`` writes beside the model: part of the run, which ``predict --output`` may not replace."""

    config: RunConfig
    tokenizer: PreTrainedTokenizerBase | None

    def __init__(self, config: RunConfig) -> None: ...

    def load(self, *, include_train: bool = True) -> DatasetDict: ...

    def load_inputs(self, path: str) -> Dataset: ...

    def build_tokenizer(self, raw: DatasetDict | None, model_path: str | None = None) -> PreTrainedTokenizerBase: ...

    def build_model(self, raw: DatasetDict | None, model_path: str | None = None) -> PreTrainedModel: ...

    def preprocess(self, examples: Dataset, *, train: bool, inputs: bool = False) -> Dataset:
        """Examples -> model features. ``inputs``: the examples are ``load_inputs`` rows to predict (no
        labels; MLM fills their own mask tokens instead of masking at random)."""

    def collator(self, *, train: bool) -> Callable[[list[dict[str, Any]]], dict[str, torch.Tensor]]: ...

    def predict_step(self, model: PreTrainedModel, batch: dict[str, torch.Tensor]) -> dict[str, torch.Tensor]: ...

    def postprocess(self, outputs: dict[str, Any], features: Dataset, examples: Dataset) -> Any: ...

    def compute_metrics(self, predictions: Any, examples: Dataset) -> dict[str, float]: ...

    def metric_names(self) -> tuple[str, ...]:
        """Every metric ``compute_metrics`` may report under this run's settings and label set (without ``eval_``),
        known once ``load`` has run, so that ``train.metric_for_best_model`` is checked before training. One that
        depends on the eval split (an entity type it lacks, SQuAD v2's NoAns_ group) is listed too."""

    def metrics_absent_from(self, examples: Dataset) -> dict[str, str]:
        """The ``metric_names`` that ``compute_metrics`` cannot report on these eval ``examples``, each with why
        (an entity type no gold sentence holds): checked before training against ``train.metric_for_best_model``,
        which otherwise came and went with the predictions, or stopped the run at an evaluation hours in."""

    def format_predictions(self, predictions: Any, examples: Dataset) -> list[dict[str, Any]]: ...

    def input_columns(self) -> tuple[str, ...]:
        """The columns of a ``predict`` input row the task reads (its text, under each name it accepts); the
        row's other columns (an ``id``, a gold label) are copied into its prediction row."""

    def pipeline_inputs(self, examples: Dataset) -> list[Any] | None:
        """What ``pipeline(pipeline_tag)`` takes for ``examples`` (from ``load_inputs``), for the prediction
        benchmark; None where the pipeline's outputs are not one ``label`` and ``score`` per example."""

    def save_artifacts(self, predictions: Any, examples: Dataset, run_dir: str) -> None: ...

    def check_distillation_teacher(self, teacher_options: TaskOptions, teacher_dir: str) -> None:
        """Raise a ``DataError`` when the teacher run's task options (``teacher_options``) make its outputs mean
        something else than this run's training reads them as (NER: a teacher trained on first pieces only)."""



def check_room_for_text(tokenizer: PreTrainedTokenizerBase, max_length: int, *, texts: int = 1) -> None:
    """A ConfigError when ``data.max_seq_length`` leaves no token of an input's text(s) beside the tokenizer's special
    tokens: NER then dropped every word and a classifier read ``[CLS] [SEP]`` alone, with exit status 0 (and below
    the special tokens' count the tokenizer cut nothing at all, while a warning said the texts were cut)."""
    specials = tokenizer.num_special_tokens_to_add(pair=texts == 2)
    if max_length < specials + texts:
        what = "pair of texts" if texts == 2 else "text"
        raise ConfigError(f"data.max_seq_length={max_length} leaves no room for text: the tokenizer adds {specials} special "
                          f"token(s) to each {what}; give at least {specials + texts}")


class TaskBase:
    """The defaults a task may take instead of writing them; it still declares the Protocol's class attributes."""

    def __init__(self, config: RunConfig) -> None:
        self.config = config
        self.options = config.task_options
        self.tokenizer: PreTrainedTokenizerBase | None = None

    def build_tokenizer(self, raw: DatasetDict | None, model_path: str | None = None) -> PreTrainedTokenizerBase:
        """The fast tokenizer of ``model.tokenizer_name_or_path`` or ``model.name_or_path``, or of the finished run
        at ``model_path``."""
        from pipelines.modeling import load_tokenizer, tokenizer_source

        # A finished run's tokenizer is its own: the base's revision names none of its versions.
        self.tokenizer = load_tokenizer(tokenizer_source(self.config.model, model_path), None if model_path else self.config.model.revision)
        check_room_for_text(self.tokenizer, self.config.data.max_seq_length, texts=self.texts_per_input())
        return self.tokenizer

    def texts_per_input(self) -> int:
        """How many texts one model input holds (a sentence pair: 2), for :func:`check_room_for_text`."""
        return 1

    def metrics_absent_from(self, examples: Dataset) -> dict[str, str]:
        return {}  # every metric the task names is reported on any eval split

    def check_distillation_teacher(self, teacher_options: TaskOptions, teacher_dir: str) -> None:
        return None

    def pipeline_inputs(self, examples: Dataset) -> list[Any] | None:
        return None  # no pipeline() whose outputs are one label and score per input
