"""Masked-LM's run options: the ``mlm:`` block of a run config, validated by pydantic as ``MlmOptions``.

In:  the ``mlm:`` mapping of a YAML config (and its dotted overrides).
Out: :class:`MlmOptions`: masking shares, whole-word masking, packing, next-sentence prediction, corpus
     cleaning and the settings of a tokenizer trained here; read by the task and by the masking collator.
"""

from __future__ import annotations

from typing import ClassVar

from pydantic import Field, model_validator

from pipelines.config import TaskOptions


class MlmOptions(TaskOptions):
    fixed_by_training: ClassVar[frozenset[str]] = frozenset(
        {"next_sentence_prediction", "tokenizer_vocab_size", "lowercase", "tokenizer_min_frequency"}
    )
    mlm_probability: float = Field(default=0.15, gt=0, lt=1)
    """Share of the (non-special) tokens chosen as prediction targets."""
    mask_replace_prob: float = Field(default=0.8, ge=0, le=1)
    """Of the chosen tokens: share replaced by the mask token."""
    random_replace_prob: float = Field(default=0.1, ge=0, le=1)
    """Of the chosen tokens: share replaced by a random (non-special) token; the rest stay unchanged."""
    whole_word_mask: bool = False
    """Choose whole words (all their tokens, grouped by ``word_ids()``) instead of single tokens."""
    packing: bool = True
    """Pack the token stream into full blocks of ``data.max_seq_length``; false = one row per example."""
    next_sentence_prediction: bool = False
    """Sentence-pair inputs with segment ids and BERT's next-sentence objective (BertForPreTraining)."""
    drop_headings: bool = True
    """Drop WikiText heading rows (`` = Title = ``); empty rows are always dropped."""
    corpus_unk_token: str | None = "<unk>"
    """A marker the corpus uses for unknown words (WikiText: ``<unk>``), read as the tokenizer's unknown token."""
    tokenizer_vocab_size: int | None = Field(default=None, gt=0)
    """Vocabulary of a tokenizer trained here; default ``model.architecture.vocab_size``, else 30,522."""
    lowercase: bool = True
    """Lowercase (and strip accents) in a tokenizer trained here (an uncased model)."""
    tokenizer_min_frequency: int = Field(default=2, ge=1)
    """Minimum count of a merge for the WordPiece trainer."""
    top_k: int = Field(default=5, gt=0)
    """Fillers reported per mask token by ``bertpipe predict``."""

    @model_validator(mode="after")
    def _replacement_shares(self) -> "MlmOptions":
        if self.mask_replace_prob + self.random_replace_prob > 1:
            raise ValueError("mask_replace_prob + random_replace_prob must not exceed 1 (the rest stay unchanged)")
        return self
