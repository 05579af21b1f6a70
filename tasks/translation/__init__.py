"""Translation (sequence to sequence): seq2seq checkpoints or BERT2BERT warm-started from encoders.

In:  parallel text in one of three layouts, direction chosen by ``translation.source_lang`` /
     ``translation.target_lang``:
       * one column per language (``bentrevett/multi30k``: ``en``, ``de``; local jsonl, or tsv/csv
         with a header row naming the languages);
       * the WMT layout, a ``translation`` column of ``{lang: text}`` dicts;
       * for ``bertpipe predict``: a txt file (one source sentence per line) or jsonl with the
         source-language field (or a ``translation`` dict, or ``text``).
     The model is any ``AutoModelForSeq2SeqLM`` checkpoint (Marian, T5 with ``source_prefix``, BART,
     mBART with ``src_lang``/``tgt_lang``/``forced_bos_token``) or an ``EncoderDecoderModel``
     warm-started from encoder-only checkpoints (BERT2BERT, Rothe et al. 2020: the decoder copy gets
     ``is_decoder`` + ``add_cross_attention``; optionally all encoder weights shared with the decoder).
Out: the model with decoder start / pad / end tokens and the beam-search settings on its config and
     ``generation_config`` (saved with it); metrics ``bleu`` and ``chrf`` (sacreBLEU on detokenised
     text, case-insensitive when the tokenizer lowercases) and ``gen_len``; ``generations.jsonl``
     (source, reference, hypothesis) and ``sacrebleu_signature.json`` in the run directory.

Importing this module also registers a ``translation`` pipeline (transformers 5 removed its own), so
``pipeline("translation", model=RUN_DIR)`` returns ``[{"translation_text": ...}]``.

The package, by seam: ``options`` (``TranslationOptions``, output names), ``data`` (pair layouts -> language
columns -> token features), ``model`` (checkpoint helpers: T5 prefix, decoder checks, shared BERT2BERT
weights), ``build`` (choosing and building the tokenizer and model), ``generation`` (ids -> hypotheses and
lengths), ``task`` (``TranslationTask``) and ``pipeline`` (the registered ``pipeline("translation")``).
"""

from __future__ import annotations

from tasks.translation.build import TranslationModelBuilding
from tasks.translation.data import empty_rows, strip_decoder_start, to_language_columns
from tasks.translation.generation import cut_generations, decode, generated_lengths, tokenizer_lowercases
from tasks.translation.model import (
    check_decoder_config,
    drop_encoder_pooler,
    is_seq2seq_config,
    t5_prefix,
    tie_encoder_decoder_weights,
)
from tasks.translation.options import GENERATED_KEY, GENERATIONS_FILE, SIGNATURE_FILE, TranslationOptions
from tasks.translation.pipeline import TranslationPipeline, register_translation_pipeline
from tasks.translation.task import TranslationTask

__all__ = [
    "GENERATED_KEY", "GENERATIONS_FILE", "SIGNATURE_FILE", "TranslationModelBuilding", "TranslationOptions", "TranslationPipeline",
    "TranslationTask", "check_decoder_config", "cut_generations", "decode", "drop_encoder_pooler", "empty_rows", "generated_lengths",
    "is_seq2seq_config", "register_translation_pipeline", "strip_decoder_start", "t5_prefix", "tie_encoder_decoder_weights",
    "to_language_columns", "tokenizer_lowercases",
]
