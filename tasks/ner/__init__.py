"""Token classification (NER, POS, chunking): one tag per word, predicted from word pieces.

In:  sentences as word lists with one tag per word, from a Hub dataset (``eriktks/conll2003``: ``tokens``
     and ``ClassLabel`` tag sequences ``ner_tags``/``pos_tags``/``chunk_tags``), CoNLL column files
     (``.txt``/``.conll``: ``token ... tag`` per line, a blank line between sentences, ``-DOCSTART-``
     lines skipped) or json/jsonl rows with a token list and a tag list. ``bertpipe predict`` also
     takes raw text (a ``.txt`` line or a jsonl ``text`` field), split into words here.
Out: an ``AutoModelForTokenClassification`` whose ``id2label`` holds the dataset's tag names and whose
     config stores ``aggregation_strategy: words`` for ``pipeline("token-classification")``, word-level
     predictions, and entity-level seqeval metrics (micro P/R/F1, per-type P/R/F1, word accuracy).

Word pieces. Words are tokenised pre-split (``is_split_into_words``), as they are in running text
(byte-level BPE gets its prefix space: :func:`pipelines.modeling.encode_words_as_in_running_text`),
and aligned through the fast tokenizer's ``word_ids()``: by default (``label_all_tokens``) every piece
is labelled, continuations of a ``B-X`` word as ``I-X``, so that transformers' piece-level
``aggregation_strategy="simple"`` has trained pieces to group; or only the first piece carries the
word's tag and the others are ignored (-100). Predictions are read from first pieces only, so metrics
count words, never pieces.

Long sentences. A sentence whose pieces do not fit ``max_seq_length`` is cut at word boundaries into
windows that overlap by about ``stride`` pieces; no word is dropped by truncation. A word seen in
several windows takes its prediction from the window where it has the most context on both sides.

The package, in the order data flows through it:

- :mod:`tasks.ner.sentences`: CoNLL and json files -> checked sentences; the tag set's order.
- :mod:`tasks.ner.windows`: sentences -> word-boundary windows with aligned labels; window
  predictions -> one per word.
- :mod:`tasks.ner.entities`: raw text -> words with offsets; word tags -> entity spans.
- :mod:`tasks.ner.task`: :class:`NerTask`, the ``Task`` the pipeline drives.
- :mod:`tasks.ner.pipeline`: the ``token-classification`` ``transformers.pipeline``.

Importing this package registers :class:`WordTokenClassificationPipeline` as the
``token-classification`` pipeline, so ``pipeline("token-classification", model=RUN_DIR)`` on a
bertpipe NER run returns exactly ``bertpipe predict``'s entities (other models keep transformers'
pipeline).
"""

from tasks.ner.entities import join_words, sentence_entities, split_words, word_entities, word_tags
from tasks.ner.pipeline import WordTokenClassificationPipeline, register_ner_pipeline
from tasks.ner.sentences import check_sentence, order_labels, read_conll, read_json_rows
from tasks.ner.task import PIPELINE_TASK, WORD_AGGREGATION, NerOptions, NerTask
from tasks.ner.windows import (
    IGNORE_INDEX,
    align_labels,
    b_to_i_map,
    encode_word_windows,
    first_piece_words,
    select_word_predictions,
    tokenize_and_align,
    word_windows,
)

__all__ = [
    "IGNORE_INDEX", "PIPELINE_TASK", "WORD_AGGREGATION", "NerOptions", "NerTask", "WordTokenClassificationPipeline",
    "align_labels", "b_to_i_map", "check_sentence", "encode_word_windows", "first_piece_words", "join_words",
    "order_labels", "read_conll", "read_json_rows", "register_ner_pipeline", "select_word_predictions",
    "sentence_entities", "split_words", "tokenize_and_align", "word_entities", "word_tags", "word_windows",
]
