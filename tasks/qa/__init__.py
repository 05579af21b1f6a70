"""Extractive question answering (SQuAD v1.1 and v2): doc-stride windows, n-best span decoding, official metrics.

In:  examples with ``id, title, context, question, answers = {text: [...], answer_start: [...]}`` from
     the Hub (``rajpurkar/squad``, ``rajpurkar/squad_v2``) or local files, either the official nested
     SQuAD JSON (``data[].paragraphs[].qas[]``, ``is_impossible`` honoured) or flat jsonl; the format
     is read from the content. An empty ``answers.text`` list is an unanswerable (v2) question.
Out: an ``AutoModelForQuestionAnswering``; per example the best answer text with its character span
     in the context, its probability, the n-best list and (v2) the no-answer probability; SQuAD
     exact match / F1 (0-100; v2 adds HasAns/NoAns and the best no-answer threshold); and the
     run-directory files ``predictions.json``, ``nbest_predictions.json`` and (v2) ``null_odds.json``.

The package, in the order data flows through it:

- :mod:`tasks.qa.squad_files`: SQuAD files and Hub rows -> flat examples, and their checks.
- :mod:`tasks.qa.windows`: examples -> overlapping token windows with answer labels or offsets.
- :mod:`tasks.qa.decoding`: window logits -> one answer per example (pure; numpy only).
- :mod:`tasks.qa.task`: :class:`QATask`, the ``Task`` the pipeline drives.
- :mod:`tasks.qa.pipeline`: the ``question-answering`` ``transformers.pipeline``.

Importing this package registers :class:`ExtractiveQuestionAnsweringPipeline` as the
``question-answering`` task of ``transformers.pipeline`` (transformers 5 removed its own), so
``pipeline("question-answering", model=RUN_DIR)`` answers as in transformers 4.
"""

from tasks.qa.decoding import postprocess_qa_predictions, trim_span
from tasks.qa.pipeline import PIPELINE_TASK, ExtractiveQuestionAnsweringPipeline, register_qa_pipeline
from tasks.qa.squad_files import (
    EXAMPLE_FEATURES,
    check_examples,
    find_answer_mismatches,
    flat_row,
    flatten_squad_json,
    read_squad_file,
    rows_to_dataset,
)
from tasks.qa.task import POSTPROCESS_COLUMNS, QACollator, QAOptions, QATask
from tasks.qa.windows import (
    answer_token_span,
    check_question_lengths,
    context_offsets,
    encode_windows,
    prepare_features,
    question_first,
)

__all__ = [
    "EXAMPLE_FEATURES", "PIPELINE_TASK", "POSTPROCESS_COLUMNS", "ExtractiveQuestionAnsweringPipeline", "QACollator",
    "QAOptions", "QATask", "answer_token_span", "check_examples", "check_question_lengths", "context_offsets",
    "encode_windows", "find_answer_mismatches", "flat_row", "flatten_squad_json", "postprocess_qa_predictions",
    "prepare_features", "question_first", "read_squad_file", "register_qa_pipeline", "rows_to_dataset", "trim_span",
]
