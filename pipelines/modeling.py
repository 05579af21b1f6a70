"""Tokenizer and model loading shared by every task.

In:  a model id or folder (resolved through the mirror), an Auto class for the task's head, and
     optionally the task's label maps or a from-scratch architecture.
Out: a fast tokenizer and a ``PreTrainedModel`` with label maps stored in its config, so that
     ``pipeline()`` on the saved run reports label names. A checkpoint whose head was trained for a
     different label set is loaded with ``ignore_mismatched_sizes`` (and a warning saying so); any
     other shape mismatch stays an error.
"""

from __future__ import annotations

import logging
from typing import Any

import torch
from transformers import AutoConfig, AutoTokenizer, PretrainedConfig, PreTrainedModel, PreTrainedTokenizerBase

import models  # noqa: F401  registers bertpipe's own BERT/Transformer with the Auto classes
from pipelines.config import ModelConfig
from pipelines.hub import resolve_model

logger = logging.getLogger(__name__)


class ModelError(ValueError):
    """A model or tokenizer that cannot serve the configured task."""


def load_tokenizer(name_or_path: str, revision: str | None = None) -> PreTrainedTokenizerBase:
    tokenizer = AutoTokenizer.from_pretrained(resolve_model(name_or_path), revision=revision)
    if not tokenizer.is_fast:
        raise ModelError(f"tokenizer of {name_or_path!r} is not a fast tokenizer; bertpipe needs offsets and word_ids()")
    return tokenizer


def tokenizer_source(model: ModelConfig, model_path: str | None = None) -> str:
    """The run folder when evaluating a finished run, else the configured tokenizer or model."""
    source = model_path or model.tokenizer_name_or_path or model.name_or_path
    if source is None:
        raise ModelError("set model.name_or_path (or model.tokenizer_name_or_path) to choose a tokenizer")
    return source


def _apply_dropout(config: PretrainedConfig, dropout: float | None) -> None:
    if dropout is None:
        return
    for key in ("hidden_dropout_prob", "attention_probs_dropout_prob", "dropout", "attention_dropout"):
        if hasattr(config, key):
            setattr(config, key, dropout)


def load_model(
    auto_class: Any,
    model: ModelConfig,
    *,
    model_path: str | None = None,
    label_maps: dict[str, Any] | None = None,
    config_overrides: dict[str, Any] | None = None,
) -> PreTrainedModel:
    """Load ``model_path`` (a finished run) or ``model.name_or_path``; build from scratch when neither.

    ``label_maps`` holds ``id2label``/``label2id`` (and ``num_labels``, ``problem_type``) for heads
    that classify; they override what the checkpoint carries.
    """
    label_maps = dict(label_maps or {})
    extra = dict(config_overrides or {})
    source = model_path or model.name_or_path
    if source is None:
        config = AutoConfig.for_model(model.model_type, **model.architecture, **label_maps, **extra)
        _apply_dropout(config, model.dropout)
        return auto_class.from_config(config)

    location = model_path or resolve_model(source)
    config = AutoConfig.from_pretrained(location, revision=model.revision)
    checkpoint_labels = list(config.id2label.values())
    mismatched_head = _head_labels_differ(config, label_maps)
    for key, value in {**label_maps, **extra}.items():
        setattr(config, key, value)
    _apply_dropout(config, model.dropout)
    if mismatched_head:
        logger.warning(
            "%s has a head trained for labels %s; a new head is initialised for labels %s",
            source, checkpoint_labels, list(label_maps["id2label"].values()),
        )
    return auto_class.from_pretrained(
        location, config=config, revision=model.revision, ignore_mismatched_sizes=mismatched_head
    )


def _head_labels_differ(config: PretrainedConfig, label_maps: dict[str, Any]) -> bool:
    """True when the checkpoint already has a task head whose label count differs from ours."""
    wanted = label_maps.get("id2label")
    architectures = getattr(config, "architectures", None) or []
    has_head = any(name.endswith(("ForSequenceClassification", "ForTokenClassification")) for name in architectures)
    return wanted is not None and has_head and len(config.id2label) != len(wanted)


def count_parameters(model: torch.nn.Module) -> tuple[int, int]:
    """(trainable, total) parameter counts."""
    trainable = sum(p.numel() for p in model.parameters() if p.requires_grad)
    total = sum(p.numel() for p in model.parameters())
    return trainable, total
