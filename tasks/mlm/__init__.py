"""Masked-language-model pretraining (BERT-style), from scratch or continued from any encoder checkpoint.

In:  a text corpus (plain-text files such as WikiText's ``.tokens``/``.raw`` or ``.txt``, a Hub text
     dataset, or jsonl/csv/parquet with a text column); ``model.name_or_path`` set means continued
     pretraining from that checkpoint, unset means a new model built from ``model.architecture``
     with a WordPiece tokenizer trained on the train split (unless ``model.tokenizer_name_or_path``
     names one).
Out: an ``AutoModelForMaskedLM`` run directory (``AutoModelForPreTraining`` with next-sentence
     prediction) holding the tokenizer, so that ``pipeline("fill-mask", model=RUN_DIR)`` works and
     the directory is a valid ``model.name_or_path`` for every fine-tuning task; metrics
     ``eval_perplexity`` (exp of the mean cross-entropy over *all* masked tokens of the split),
     ``eval_accuracy`` (masked-token top-1), ``eval_loss`` (+ ``eval_nsp_accuracy``); and for
     ``bertpipe predict`` the top-k fillers of every mask token of each input line.

Corpus cleaning: every row is stripped; empty rows and WikiText headings (`` = Title = ``,
`` = = Section = = ``) are dropped (``drop_headings``), and WikiText's ``<unk>`` marker becomes the
tokenizer's unknown token, a special token that is never masked. When the data has no eval split,
``data.validation_fraction`` holds out whole documents (top-level headings delimit them; else
blank-line paragraphs; else rows), before packing, so no block straddles the two splits.

Examples: ``packing: true`` concatenates the token stream of a split and cuts it into blocks of
``max_seq_length`` (special tokens included, no padding; the last, shorter block keeps the
remainder so every token is used exactly once); ``packing: false`` keeps one row per example,
truncated and padded per batch. Masking (``mlm_probability`` of the tokens, of which
``mask_replace_prob`` become the mask token, ``random_replace_prob`` a random token, the rest stay;
special tokens never) happens in the collator, so every epoch sees new masks; evaluation masks are
drawn once per example from ``(seed, example index)``, so two evaluations of a model agree.
Whole-word masking groups tokens by the fast tokenizer's ``word_ids()`` (any tokenizer, not only
WordPiece ``##`` pieces).

The package, in the order data flows through it:

- :mod:`tasks.mlm.options`: the ``mlm:`` options (:class:`MlmOptions`).
- :mod:`tasks.mlm.corpus`: rows -> cleaned rows, documents and the held-out split.
- :mod:`tasks.mlm.tokenizer`: a WordPiece tokenizer trained on the corpus; any tokenizer's special-token template.
- :mod:`tasks.mlm.examples`: token rows -> packed blocks, or sentence pairs for next-sentence prediction.
- :mod:`tasks.mlm.masking`: BERT masking and the collator that pads and masks each batch.
- :mod:`tasks.mlm.task`: :class:`MlmTask`, the ``Task`` the pipeline drives, and its metrics.
"""

from tasks.mlm.corpus import clean_rows, hold_out_documents, is_heading, split_documents
from tasks.mlm.examples import NO_WORD, make_sentence_pairs, number_words, pack_blocks
from tasks.mlm.masking import (
    IGNORE_INDEX,
    MaskingCollator,
    choose_mask_targets,
    eval_masking_rng,
    mask_tokens,
    pad_batch,
    random_token_ids,
)
from tasks.mlm.options import MlmOptions
from tasks.mlm.task import MlmTask, masked_lm_metrics
from tasks.mlm.tokenizer import (
    BERT_SPECIAL_TOKENS,
    DEFAULT_VOCAB_SIZE,
    SpecialTemplate,
    special_template,
    train_wordpiece_tokenizer,
)

__all__ = [
    "BERT_SPECIAL_TOKENS", "DEFAULT_VOCAB_SIZE", "IGNORE_INDEX", "NO_WORD", "MaskingCollator", "MlmOptions", "MlmTask",
    "SpecialTemplate", "choose_mask_targets", "clean_rows", "eval_masking_rng", "hold_out_documents", "is_heading",
    "make_sentence_pairs", "mask_tokens", "masked_lm_metrics", "number_words", "pack_blocks", "pad_batch",
    "random_token_ids", "special_template", "split_documents", "train_wordpiece_tokenizer",
]
