"""``transformers.pipeline("token-classification")`` that finds on a bertpipe run the entities ``bertpipe predict`` finds.

In:  a run directory (model, tokenizer, and in ``config.task_specific_params["token-classification"]``
     the run's ``aggregation_strategy: words``, ``max_seq_length`` and ``stride``); raw texts, or word
     lists with ``is_split_into_words=True``, at call time.
Out: per text the list ``bertpipe predict`` writes for it: ``{entity_group, word, start, end, score}``
     with ``word == text[start:end]`` (word lists also get ``start_word``/``end_word``; a run whose tags
     name no chunks, POS, gives ``{entity, word, start, end, score}`` per word, predict's ``words``), computed by
     predict's own functions (:mod:`tasks.ner.windows`, :mod:`tasks.ner.entities`): raw text split
     into words as predict splits it, words encoded pre-split in word-boundary windows, each word
     tagged by its first piece, tags chunked by seqeval. The two agree whatever the weights, for
     every tokenizer kind.

Why not transformers' own aggregation. ``TokenClassificationPipeline`` groups pieces into words by a
heuristic that depends on the tokenizer kind, and none of its strategies can agree with word-level
tags for all families:
  * WordPiece (a ``##`` continuing prefix): a piece starts a word unless its token and its text
    differ in length, so ``U.S``, ``Bob's`` or ``AT&T`` become several words; every other kind
    (byte-level BPE, Unigram): a piece starts a word only after a space, so ``Paris.`` or ``Paris,``
    is one word, and the model is given ``Paris.`` as running text where training gave ``Paris`` and
    ``.`` as words (other pieces on BPE/Unigram tokenizers);
  * ``"simple"`` tags pieces, not words, so a word whose pieces disagree is split or merged;
  * an entity's ``word`` is its pieces decoded (lower-cased by uncased tokenizers), not the text;
  * DeBERTa-v2's tokenizer class rebuilds its pre-tokenizer on load, and its offsets then include the
    space before a word, so entity ``start``s are one character early.
(On 3-step tiny models of the 8 encoder families, ``"first"`` disagreed with ``predict`` on 1-3 of 3
texts for every family, ``"simple"`` on 2-3.)

So a bertpipe NER run stores ``aggregation_strategy: words`` and this subclass, registered as the
``token-classification`` pipeline when :mod:`tasks.ner` is imported, applies it by default (or when
``aggregation_strategy="words"`` is given). An explicit transformers strategy (``"simple"``,
``"first"``, ...) keeps transformers' behaviour, except that on bertpipe runs the entity spans are
trimmed of surrounding whitespace (DeBERTa-v2) and widened to whole grapheme clusters (a combining mark
that an accent-stripping normalizer left out of the offsets), and a group that covers only a space is dropped.
Models that are not bertpipe NER runs get transformers' pipeline unchanged.
"""

from __future__ import annotations

from typing import Any

import numpy as np
import torch
from transformers.pipelines.token_classification import AggregationStrategy, TokenClassificationPipeline

from pipelines.batching import undo_rewrites_after_each_call
from pipelines.graphemes import grapheme_boundaries, visible_span
from pipelines.modeling import encode_words_as_in_running_text
from tasks.ner.entities import is_chunk_tag_set, join_words, sentence_entities, split_words, word_records, word_tags
from tasks.ner.task import PIPELINE_TASK, WORD_AGGREGATION, NerOptions, piece_predictions
from tasks.ner.windows import encode_word_windows, select_word_predictions


class WordTokenClassificationPipeline(TokenClassificationPipeline):
    """``pipeline("token-classification", model=RUN_DIR)``: bertpipe predict's entities (see the module docstring).

    Options: ``aggregation_strategy`` (the run's ``"words"`` by default; a transformers strategy
    switches to transformers' aggregation), ``stride`` (pieces of overlap between the windows of a long
    text; the run's ``ner.stride`` by default), ``ignore_labels`` (entity types left out),
    ``is_split_into_words``/``delimiter`` (word lists joined by ``delimiter``, a space by default).
    """

    def __init__(self, *args, **kwargs):
        super().__init__(*args, **kwargs)
        if self._run_defaults():
            # Each forward pass of a bertpipe run on the model as loaded, as predict runs it: BigBird switches
            # itself to full attention for good on its first input too short for blocks.
            undo_rewrites_after_each_call(self.model)
            if self.tokenizer is not None and self.tokenizer.is_fast:
                # Words pre-split as predict encodes them: a class that rebuilds its normalizer on load
                # (GemmaTokenizer) lost the space the run gave each word; a run folder's own tokenizer is unchanged.
                encode_words_as_in_running_text(self.tokenizer)

    def _run_defaults(self) -> dict[str, Any]:
        return (getattr(self.model.config, "task_specific_params", None) or {}).get(PIPELINE_TASK, {})

    def _sanitize_parameters(self, aggregation_strategy=None, stride=None, **options):
        words = isinstance(aggregation_strategy, str) and aggregation_strategy.lower() == WORD_AGGREGATION
        if words and not self.tokenizer.is_fast:
            raise ValueError('aggregation_strategy="words" needs a fast tokenizer (its word_ids())')
        if aggregation_strategy is not None:
            word_path = words
        else:  # the construction-time choice, else the run's default
            chosen = getattr(self, "_preprocess_params", {}).get("word_level")
            word_path = chosen if chosen is not None else (
                self._run_defaults().get("aggregation_strategy") == WORD_AGGREGATION and self.tokenizer.is_fast)
        # The word path takes its stride itself, capped at half a window as predict caps it; transformers' check
        # (below the model's length) refused a stride predict accepts.
        preprocess, forward, postprocess = super()._sanitize_parameters(
            aggregation_strategy=None if words else aggregation_strategy, stride=None if word_path else stride, **options
        )
        # Only what the caller gave: a call-time choice then overrides the construction-time one, and
        # the run's default fills in when neither chose.
        if aggregation_strategy is not None:
            preprocess["word_level"] = words
        if stride is not None:
            preprocess["word_stride"] = stride
        return preprocess, forward, postprocess

    def preprocess(self, sentence, offset_mapping=None, word_level=None, word_stride=None, **params):
        if word_level is None:
            word_level = self._run_defaults().get("aggregation_strategy") == WORD_AGGREGATION and self.tokenizer.is_fast
        if not word_level:
            yield from super().preprocess(sentence, offset_mapping=offset_mapping, **params)
            return
        if params.get("is_split_into_words"):
            if not isinstance(sentence, list) or not all(isinstance(word, str) for word in sentence):
                raise ValueError("When `is_split_into_words=True`, `sentence` must be a list of words (strings).")
            words = list(sentence)
            text, offsets = join_words(words, params.get("delimiter") or " ")
        else:
            if not isinstance(sentence, str):
                raise ValueError("When `is_split_into_words=False`, `sentence` must be an untokenized string.")
            text = sentence
            split = split_words(text)
            words, offsets = [word for word, _ in split], [span for _, span in split]
        defaults = self._run_defaults()
        max_length = min(defaults.get("max_seq_length", self.tokenizer.model_max_length), self.tokenizer.model_max_length)
        stride = word_stride if word_stride is not None else defaults.get("stride", NerOptions().stride)
        windows = encode_word_windows(self.tokenizer, words, max_length=max_length, stride=stride)
        if not windows["input_ids"]:  # no word at all: one window of special tokens, so the text still gets its []
            windows = self.tokenizer([""], truncation=True, max_length=max_length)
            windows["word_index"] = [[-1] * len(windows["input_ids"][0])]
        names = [name for name in self.tokenizer.model_input_names if name in windows]
        count = len(windows["input_ids"])
        sentence_info = {"text": text, "offsets": offsets, "word_count": len(words), "raw_text": not params.get("is_split_into_words")}
        for index in range(count):
            yield {
                **{name: torch.tensor([windows[name][index]]) for name in names},
                "word_index": windows["word_index"][index],
                "sentence_info": sentence_info if index == 0 else None,
                "is_last": index == count - 1,
            }

    def _forward(self, model_inputs):
        if "word_index" not in model_inputs:
            return super()._forward(model_inputs)
        metadata = {key: model_inputs.pop(key) for key in ("word_index", "sentence_info", "is_last")}
        if model_inputs["input_ids"].shape[-1] == 0:
            # A text without a word, and a tokenizer that adds no special tokens (Gemma's): no input to embed, nothing to tag.
            return {"tag_ids": torch.full((1, 0), -1), "tag_scores": torch.zeros(1, 0), **metadata}
        tag_ids, scores = piece_predictions(self.model(**model_inputs).logits, model_inputs.get("attention_mask"))
        return {"tag_ids": tag_ids, "tag_scores": scores, **metadata}

    def postprocess(self, all_outputs, aggregation_strategy=AggregationStrategy.NONE, ignore_labels=None):
        if "word_index" not in all_outputs[0]:
            entities = super().postprocess(all_outputs, aggregation_strategy=aggregation_strategy, ignore_labels=ignore_labels)
            if self._run_defaults():
                sentence = all_outputs[0]["sentence"]
                boundaries = grapheme_boundaries(sentence)
                entities = [_trim_span(entity, sentence, boundaries) for entity in entities]
                # A group of nothing but a space piece (a lone ``Ġ`` of byte-level BPE) names no text.
                entities = [e for e in entities if "entity_group" not in e or e["start"] is None or e["start"] < e["end"]]
            return entities
        info = all_outputs[0]["sentence_info"]
        width = max(len(output["word_index"]) for output in all_outputs)
        tag_ids = np.full((len(all_outputs), width), -1, dtype=np.int64)
        tag_scores = np.zeros((len(all_outputs), width), dtype=np.float32)
        for row, output in enumerate(all_outputs):
            length = len(output["word_index"])
            tag_ids[row, :length] = output["tag_ids"].reshape(-1)[:length].numpy()
            tag_scores[row, :length] = output["tag_scores"].reshape(-1)[:length].numpy()
        ids, scores, _ = select_word_predictions(
            tag_ids, tag_scores, [0] * len(all_outputs), [output["word_index"] for output in all_outputs], [info["word_count"]]
        )
        label_names = [self.model.config.id2label[index] for index in range(len(self.model.config.id2label))]
        tags = word_tags(ids[0], label_names)
        ignored = ["O"] if ignore_labels is None else ignore_labels
        if not is_chunk_tag_set(label_names):  # POS and other tags that name no chunks: every word's tag
            return [word for word in word_records(tags, scores[0], info["offsets"], info["text"]) if word["entity"] not in ignored]
        entities = sentence_entities(tags, scores[0], info["offsets"], info["text"], raw_text=info["raw_text"],
                                     strict_scheme=self._run_defaults().get("strict_scheme"))
        return [entity for entity in entities if entity["entity_group"] not in ignored]


def _trim_span(entity: dict[str, Any], sentence: str | None, boundaries: list[int] | None = None) -> dict[str, Any]:
    """An entity (or piece) of whole grapheme clusters without the whitespace or invisible characters its offsets
    include (:func:`pipelines.graphemes.visible_span`).

    DeBERTa-v2 counts the space before a word; XLM-R gives a combining mark after a space a piece of its own. Normalizers that strip accents (uncased WordPiece,
    ALBERT, DeBERTa-v2) leave combining marks out of every piece's offsets, so an entity "José" (NFD)
    or "नमस्ते" ended before its last mark; an ``[UNK]`` piece's ``word``, the text under its offsets, too.
    """
    start, end = entity.get("start"), entity.get("end")
    if sentence is None or start is None or end is None:
        return entity
    span = visible_span(sentence, start, end, boundaries)
    if span is None:  # nothing visible (a lone space piece): an empty span, which postprocess drops
        return {**entity, "start": start, "end": start}
    trimmed = {**entity, "start": span[0], "end": span[1]}
    if entity.get("word") == sentence[start:end].strip():  # an [UNK] piece's word: the text under its offsets
        trimmed["word"] = sentence[span[0] : span[1]]
    return trimmed


def register_ner_pipeline() -> None:
    """Make ``pipeline("token-classification")`` (alias ``"ner"``) build :class:`WordTokenClassificationPipeline` (idempotent).

    Only the entry's implementation changes: its model classes (with the adapter-run loader
    :func:`pipelines.adapters.enable_adapter_runs_in_pipeline` may have added) and default model stay.
    """
    from transformers.pipelines import PIPELINE_REGISTRY

    PIPELINE_REGISTRY.supported_tasks[PIPELINE_TASK]["impl"] = WordTokenClassificationPipeline


register_ner_pipeline()
