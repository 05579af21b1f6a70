"""Translation's run options and the names its outputs share.

In:  the ``translation:`` block of a run config (validated by pydantic as ``TranslationOptions``).
Out: ``TranslationOptions`` (languages, layout, BERT2BERT sources, generation and metric settings), and the
     file names ``generations.jsonl`` / ``sacrebleu_signature.json`` and the predictions key the task writes.
"""

from __future__ import annotations

from typing import ClassVar, Literal

from pydantic import Field

from pipelines.config import TaskOptions

GENERATIONS_FILE = "generations.jsonl"
SIGNATURE_FILE = "sacrebleu_signature.json"
GENERATED_KEY = "generated_tokens"


class TranslationOptions(TaskOptions):
    fixed_by_training: ClassVar[frozenset[str]] = frozenset({"tie_encoder_decoder"})
    source_lang: str = "de"
    """Column (or ``translation`` dict key) of the source sentences."""
    target_lang: str = "en"
    translation_column: str = "translation"
    """The WMT-layout column of ``{lang: text}`` dicts, used when the language columns are absent."""
    source_prefix: str | None = None
    """Prepended to every source (T5: ``"translate German to English: "``; filled in for T5 when unset)."""
    encoder_name_or_path: str | None = None
    """BERT2BERT: the encoder checkpoint (default ``model.name_or_path``)."""
    decoder_name_or_path: str | None = None
    """BERT2BERT: the decoder checkpoint (default: the encoder's); it must share the tokenizer's vocabulary."""
    tie_encoder_decoder: bool = False
    """BERT2BERT: share every encoder weight with the decoder (cross-attention and LM head stay separate)."""
    src_lang: str | None = None
    """mBART-style source language code set on the tokenizer (e.g. ``de_DE``)."""
    tgt_lang: str | None = None
    """mBART-style target language code; also the decoder start token when the checkpoint sets none."""
    forced_bos_token: str | None = None
    """Token forced first after the decoder start. Unset, it is ``tgt_lang`` when the tokenizer opens targets
    with that code and the decoder starts with another token (NLLB, mBART-50)."""
    max_target_length: int = Field(default=128, gt=0)
    """Labels are truncated to this many tokens (sources to ``data.max_seq_length``)."""
    num_beams: int = Field(default=4, gt=0)
    max_new_tokens: int = Field(default=64, gt=0)
    """Generation length bound; it replaces transformers' 20-token default ``max_length``."""
    length_penalty: float = 1.0
    """Beam score = log-prob / length ** length_penalty (> 1 favours longer hypotheses)."""
    no_repeat_ngram_size: int = Field(default=0, ge=0)
    early_stopping: bool = True
    """Stop beam search once ``num_beams`` finished hypotheses exist."""
    empty_lines: Literal["error", "skip"] = "error"
    """Pairs with an empty source or target: fail (naming them), or drop them with a warning. A ``bertpipe
    predict`` input row with an empty source is kept with an empty ``translation_text`` instead, so that
    output row i stays input row i."""
    bleu_tokenize: Literal["13a", "intl", "none", "char", "zh", "flores101", "flores200"] = "13a"
    lowercase_metrics: bool | None = None
    """Case-insensitive BLEU/chrF; ``null`` = exactly when the tokenizer lowercases (uncased BERT)."""
