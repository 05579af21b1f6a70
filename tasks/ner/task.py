"""The NER ``Task``: tagged sentences in, a token-classification model and entity-level metrics out.

In:  a ``RunConfig`` whose ``data`` names a Hub dataset (``eriktks/conll2003``: ``tokens`` and
     ``ClassLabel`` tag sequences) or files (:mod:`tasks.ner.sentences`), and ``ner.*`` options.
Out: :class:`NerTask`, which the task-agnostic pipeline drives: raw splits as ``tokens``/``tags``
     (tag names)/``location``, checked sentence by sentence; an ``AutoModelForTokenClassification``
     whose config carries the tag names and ``pipeline()``'s defaults; features in windows
     (:mod:`tasks.ner.windows`); word-level predictions, seqeval metrics and entities
     (:mod:`tasks.ner.entities`).
"""

from __future__ import annotations

import logging
from pathlib import Path
from typing import Any, ClassVar, Literal, Sequence

import datasets
import numpy as np
import torch
from datasets import Dataset, DatasetDict
from pydantic import Field, field_validator
from transformers import AutoModelForTokenClassification, DataCollatorForTokenClassification

from pipelines.atomic_writes import write_text_atomically
from pipelines.config import RunConfig, TaskOptions, distinct_label_names
from pipelines.data import KeyedOnCode, finalize_splits, require_values
from pipelines.errors import DataError
from pipelines.files import builder_for_files, load_split_files, read_inputs
from pipelines.hub import resolve_dataset
from pipelines.metrics import load_metric
from pipelines.modeling import encode_words_as_in_running_text, load_model
from pipelines.task import TaskBase
from tasks.ner.entities import (
    is_chunk_tag_set, join_words, lenient_chunk_tags, sentence_entities, split_words, word_records, word_tags,
)
from tasks.ner.sentences import (
    CONLL_SUFFIXES, JSON_SUFFIXES, check_sentence, class_label_names, holds_tagged_columns, order_labels, read_conll,
    read_json_rows, sentences_dataset,
)
from tasks.ner.windows import IGNORE_INDEX, b_to_i_map, select_word_predictions, tokenize_and_align

PIPELINE_TASK = "token-classification"
WORD_AGGREGATION = "words"
"""The ``aggregation_strategy`` of ``pipeline("token-classification")`` that is ``bertpipe predict``'s word rule."""
DEFAULT_TAG_COLUMNS = ("ner_tags", "tags")

logger = logging.getLogger(__name__)


class NerOptions(TaskOptions):
    fixed_by_training: ClassVar[frozenset[str]] = frozenset({"label_names", "label_all_tokens"})
    label_names: list[str] | None = None
    """The tag set in id order; by default the ``ClassLabel`` names, else the train tags (``O`` first)."""
    label_all_tokens: bool = True
    """Label every word piece (continuations of ``B-X`` as ``I-X``); false: the first piece only.
    ``predict`` and the run's own ``pipeline("token-classification")`` aggregation read first pieces
    either way; transformers' ``aggregation_strategy="simple"`` reads every piece, and with first
    pieces only trained, a Unigram tokenizer's lone ``▁`` first piece (XLM-R, DeBERTa, ALBERT on rare
    words) carries the word's tag while the untrained rest of the word scatters the entity."""
    stride: int = Field(default=32, ge=0)
    """Word pieces of overlap between consecutive windows of a sentence longer than ``max_seq_length``
    (capped at half a window, so that windows always advance by at least half their length)."""
    conll_token_column: int = 0
    """Column of the token in CoNLL files (0-based; negative counts from the end)."""
    conll_tag_column: int = -1
    """Column of the tag in CoNLL files: -1 = last (NER in CoNLL-2003), 1 = POS, 2 = chunk."""
    scheme: Literal["IOB1", "IOB2", "IOE1", "IOE2", "IOBES", "BILOU"] | None = None
    """Tagging scheme for strict evaluation; by default BILOU when L-/U- tags exist, IOBES when S-/E- tags do, else IOB2."""
    strict: bool = False
    """Count an entity only when its tags form a valid chunk of ``scheme`` (seqeval strict mode);
    the default is conlleval's lenient reading, which accepts IOB1, IOB2 and IOBES alike."""

    @field_validator("label_names")
    @classmethod
    def _distinct_label_names(cls, value: list[str] | None) -> list[str] | None:
        return distinct_label_names(value)


def piece_predictions(logits: torch.Tensor, attention_mask: torch.Tensor | None) -> tuple[torch.Tensor, torch.Tensor]:
    """Per piece the most probable tag id and its probability (in fp32 whatever the model's dtype), each
    row's pieces first in their order, its padding last.

    A feature's ``word_index`` counts positions from its first piece, but a tokenizer that pads on the
    left (XLNet) puts a shorter row's pieces after its padding: read as they came, every word of it took
    the tag of a piece (or pad) ``padding`` positions earlier, without an error.
    """
    scores, tag_ids = logits.float().softmax(dim=-1).max(dim=-1)
    if attention_mask is None:
        return tag_ids, scores
    pieces_first = torch.argsort((attention_mask == 0).to(torch.int8), dim=1, stable=True)
    return tag_ids.gather(1, pieces_first), scores.gather(1, pieces_first)

class NerTask(TaskBase):
    name: ClassVar[str] = "ner"
    Options: ClassVar[type[TaskOptions]] = NerOptions
    pipeline_tag: ClassVar[str] = PIPELINE_TASK
    output_pad_values: ClassVar[dict[str, float]] = {"tag_ids": IGNORE_INDEX, "tag_scores": 0.0}
    higher_is_better: ClassVar[dict[str, bool]] = {"f1": True}
    auto_model_class: ClassVar[type] = AutoModelForTokenClassification
    peft_task_type: ClassVar[str | None] = "TOKEN_CLS"
    onnx_outputs: ClassVar[tuple[str, ...]] = ("logits",)
    card_pipeline_input: ClassVar[str | None] = None
    # transformers' pipeline alone gives one row per piece; its "first" strategy groups pieces into words by a
    # per-tokenizer heuristic, close to predict's word-level entities but not always the same (docs/ner.md).
    card_model_usage: ClassVar[str | None] = """from transformers import pipeline

# Words tagged by their first piece, grouped into entities by transformers' heuristic. With bertpipe installed,
# `import tasks; tasks.load_tasks()` first and no aggregation_strategy give exactly `bertpipe predict`'s entities.
tagger = pipeline("token-classification", model=model, tokenizer=tokenizer, aggregation_strategy="first")
print(tagger("Angela Merkel visited Paris in May."))"""
    packable: ClassVar[bool] = True
    run_files: ClassVar[tuple[str, ...]] = ("eval_predictions.conll",)

    def __init__(self, config: RunConfig) -> None:
        super().__init__(config)
        self.options: NerOptions = config.task_options
        self.label_names: list[str] | None = list(self.options.label_names) if self.options.label_names else None
        self._metric = None

    # ----- columns ------------------------------------------------------------------------
    @property
    def tokens_column(self) -> str:
        return self.config.data.text_column or "tokens"

    def _tag_column(self, column_names: Sequence[str], where: str) -> str:
        if self.config.data.label_column:
            return self.config.data.label_column
        for candidate in DEFAULT_TAG_COLUMNS:
            if candidate in column_names:
                return candidate
        raise DataError(
            f"{where} has no tag column ({' or '.join(DEFAULT_TAG_COLUMNS)}); available columns: {list(column_names)}. "
            "Set data.label_column (e.g. pos_tags) to choose one."
        )

    # ----- loading ------------------------------------------------------------------------
    def load(self, *, include_train: bool = True) -> DatasetDict:
        """Raw examples as ``tokens`` / ``tags`` (tag names) / ``location`` (file:line or split/row)."""
        data = self.config.data
        if data.files:
            raw = load_split_files(data.files, self._read_file, sentences_dataset)
            source = None
        else:
            source = resolve_dataset(data.path)
            raw = datasets.load_dataset(source, data.name)
        loaded_train = raw.get(data.train_split)
        raw = finalize_splits(raw, data, self.config.seed, need_train=include_train)
        if include_train and self.label_names is None:
            # From the whole training file, as classification's labels: the rows data.max_train_samples kept may
            # lack a tag the evaluation file holds, which was then refused as not in the tag set of that file.
            self.label_names = self._infer_label_names(raw[data.train_split] if loaded_train is None else loaded_train)
        if self.label_names is None:
            raise DataError("the tag set is unknown: load a finished run's model first or set ner.label_names")
        return DatasetDict({name: self._normalise(split, name, data.path) for name, split in raw.items()})

    def _read_file(self, path: Path) -> list[dict[str, Any]]:
        suffix = path.suffix.lower()
        if suffix in CONLL_SUFFIXES:
            return read_conll(
                path, token_column=self.options.conll_token_column, tag_column=self.options.conll_tag_column,
                encoding=self.config.data.encoding,
            )
        if suffix in JSON_SUFFIXES:
            rows = read_json_rows(path, encoding=self.config.data.encoding)
            if not rows:
                return rows
            tag_column = self._tag_column(list(rows[0]), str(path))
            out = []
            tag_kind = None
            for row in rows:
                for column in (self.tokens_column, tag_column):
                    if column not in row:
                        raise DataError(f"{row['location']}: no {column!r} field; the row has {sorted(k for k in row if k != 'location')}")
                tokens, tags = row[self.tokens_column], row[tag_column]
                # Checked here, before the rows become one Arrow table: a number among the words (or tag names mixed
                # with tag ids) ended in pyarrow's "Expected bytes, got a 'int' object", a traceback naming no row.
                if not isinstance(tokens, list) or not all(isinstance(token, str) for token in tokens):
                    raise DataError(f"{row['location']}: {self.tokens_column!r} must be a list of strings, not {tokens!r}")
                kinds = {type(tag) for tag in tags} if isinstance(tags, list) else {list}
                if len(kinds) > 1 or not kinds <= {str, int} or (tag_kind is not None and kinds and kinds != {tag_kind}):
                    raise DataError(f"{row['location']}: {tag_column!r} must be a list of tag names (or of tag ids, in every "
                                    f"row alike), not {tags!r}")
                tag_kind = tag_kind or next(iter(kinds), None)
                out.append({"tokens": tokens, "tags": tags, "location": row["location"]})
            return out
        if suffix == ".parquet":
            table = datasets.load_dataset("parquet", data_files=[str(path)])["train"]
            tag_column = self._tag_column(table.column_names, str(path))
            return [
                {"tokens": tokens, "tags": tags, "location": f"{path}, row {index}"}
                for index, (tokens, tags) in enumerate(zip(table[self.tokens_column], table[tag_column]), start=1)
            ]
        raise DataError(f"{path}: unsupported file type {suffix!r} for ner; use .txt/.conll (CoNLL columns), .json/.jsonl or .parquet")

    def _infer_label_names(self, train: Dataset) -> list[str]:
        if "location" in train.column_names and "tags" in train.column_names:  # local files: string tags
            tags = {tag for row in train["tags"] for tag in row}
            if any(not isinstance(tag, str) for tag in tags):
                raise DataError("integer tags in data files need their names: set ner.label_names (in id order)")
            return order_labels(self._with_continuations(tags))
        names = class_label_names(train, self._tag_column(train.column_names, "the train split"))
        if names is not None:
            return names
        column = self._tag_column(train.column_names, "the train split")
        tags = {tag for row in train[column] for tag in row}
        if any(not isinstance(tag, str) for tag in tags):
            raise DataError(f"column {column!r} holds integer tags without names: set ner.label_names (in id order)")
        return order_labels(self._with_continuations(tags))

    def _with_continuations(self, tags: set[str]) -> set[str]:
        """With ``label_all_tokens``, ``I-X`` for every ``B-X``: the tag of a ``B-X`` word's later pieces.

        A type whose entities are all one word long has no ``I-X`` in the data; its later pieces
        would then be labelled ``B-X`` each, and ``pipeline()`` would read every piece as a new entity.
        """
        if not self.options.label_all_tokens:
            return tags
        return tags | {"I-" + tag[2:] for tag in tags if tag.startswith("B-")}

    def _normalise(self, split: Dataset, split_name: str, dataset_path: str | None) -> Dataset:
        """Any source -> ``tokens``/``tags``/``location`` with tag names, checking every sentence."""
        if "location" in split.column_names:
            tokens, tags, locations = list(split["tokens"]), list(split["tags"]), list(split["location"])
            if self.options.label_names and all(isinstance(t, int) for sentence in tags for t in sentence):
                names = self.options.label_names  # integer tags in files, named by ner.label_names
                tags = [[names[t] if 0 <= t < len(names) else t for t in sentence] for sentence in tags]
        else:
            tag_column = self._tag_column(split.column_names, f"split {split_name!r}")
            missing = [c for c in (self.tokens_column, tag_column) if c not in split.column_names]
            if missing:
                raise DataError(
                    f"split {split_name!r} has no column(s) {missing}; available columns: {split.column_names}. "
                    "Set data.text_column (the token lists) and data.label_column (the tag lists)."
                )
            tokens, tags = list(split[self.tokens_column]), list(split[tag_column])
            class_names = class_label_names(split, tag_column)
            ids = list(split["id"]) if "id" in split.column_names else None
            locations = [
                f"{dataset_path} split {split_name!r}, row {row + 1}" + (f" (id {ids[row]})" if ids else "") for row in range(len(split))
            ]
            if class_names is not None:
                tags = [[class_names[t] if 0 <= t < len(class_names) else t for t in sentence] for sentence in tags]
        label_set = set(self.label_names)
        for sentence_tokens, sentence_tags, location in zip(tokens, tags, locations):
            check_sentence(sentence_tokens, sentence_tags, label_set, location)
        return Dataset.from_dict({"tokens": tokens, "tags": tags, "location": locations})

    def load_inputs(self, path: str) -> Dataset:
        """``.txt``: one raw text per line; ``.conll``: CoNLL columns; json/jsonl: ``tokens`` lists or ``text``.

        A ``.txt`` of CoNLL columns tagged with the run's tags (the eval file training read as ``.txt``)
        is read as CoNLL columns: as raw text, each token line was a "sentence" of token and tags."""
        path = Path(path)
        suffix = path.suffix.lower()
        if suffix == ".txt" and holds_tagged_columns(
            path, tag_column=self.options.conll_tag_column, tags=set(self.label_names or ()), encoding=self.config.data.encoding
        ):
            logger.info("%s holds CoNLL columns tagged with the run's tags: tagging its tokens (column %d), one "
                        "sentence per block of lines, as training reads a .txt", path, self.options.conll_token_column)
        elif suffix != ".conll":
            return self._load_text_or_json_inputs(path)
        # Tags are not read: text to tag often comes one token per line, with no tag column at all.
        rows = read_conll(path, token_column=self.options.conll_token_column, tag_column=None, encoding=self.config.data.encoding)
        _require_a_word([r["tokens"] for r in rows], path)
        return Dataset.from_dict({"tokens": [r["tokens"] for r in rows], "location": [r["location"] for r in rows]})

    def _load_text_or_json_inputs(self, path: Path) -> Dataset:
        inputs = read_inputs(path, encoding=self.config.data.encoding, text_columns=["text"])
        if self.tokens_column in inputs.column_names:
            tokens = inputs[self.tokens_column]
            for index, words in enumerate(tokens):
                # A string was read as its characters (one-letter words and entities), and a row of 'text'
                # among rows of token lists (its tokens null) ended in a TypeError.
                if not isinstance(words, list) or any(not isinstance(word, str) for word in words):
                    raise DataError(
                        f"{path}, row {index + 1}: {self.tokens_column!r} must be a list of strings, not {words!r} (every row of "
                        f"an input gives a {self.tokens_column!r} word list, or every row a 'text' string)"
                    )
            _require_a_word(tokens, path)
            return Dataset.from_dict({"tokens": tokens, "location": [f"{path}, row {i + 1}" for i in range(len(tokens))]})
        if "text" not in inputs.column_names:
            raise DataError(f"{path}: each input needs a 'text' string or a {self.tokens_column!r} word list; found {inputs.column_names}")
        feature = inputs.features["text"]
        if not (isinstance(feature, datasets.Value) and feature.dtype in ("string", "large_string", "null")):
            kind = feature.dtype if isinstance(feature, datasets.Value) else type(feature).__name__
            raise DataError(f"{path}: 'text' holds {kind} values, not text (give each input a 'text' string, or a "
                            f"{self.tokens_column!r} word list)")
        if builder_for_files({"input": str(path)})[0] != "text":
            # A blank line of a txt input is a line without entities; an empty or missing cell is a row left out.
            require_values(inputs, ["text"], "input", f"--input {path}")
        texts = [text or "" for text in inputs["text"]]
        words = [split_words(text) for text in texts]
        _require_a_word(words, path)
        return Dataset.from_dict({
            "text": texts,
            "tokens": [[word for word, _ in sentence] for sentence in words],
            "word_offsets": [[list(span) for _, span in sentence] for sentence in words],
            "location": [f"{path}, line {i + 1}" for i in range(len(texts))],
        })

    # ----- model --------------------------------------------------------------------------
    def build_tokenizer(self, raw, model_path: str | None = None):
        tokenizer = super().build_tokenizer(raw, model_path)
        # Words arrive pre-split; byte-level BPE must still see them as running text does (and the run
        # directory saves the tokenizer in this form, so pipeline() on raw text gets the same pieces).
        self.tokenizer = encode_words_as_in_running_text(tokenizer)
        return self.tokenizer

    def build_model(self, raw, model_path: str | None = None):
        if model_path is not None:
            model = load_model(self.auto_model_class, self.config.model, model_path=model_path)
            self.label_names = [model.config.id2label[i] for i in range(model.config.num_labels)]
            return model
        label_maps = {
            "num_labels": len(self.label_names),
            "id2label": dict(enumerate(self.label_names)),
            "label2id": {name: index for index, name in enumerate(self.label_names)},
        }
        # pipeline("token-classification", model=RUN_DIR) reads these (tasks.ner.pipeline), so that it
        # finds the entities this run's predict finds, in windows of the size it was trained on.
        defaults = {PIPELINE_TASK: {
            "aggregation_strategy": WORD_AGGREGATION, "max_seq_length": self.config.data.max_seq_length, "stride": self.options.stride,
            "strict_scheme": self._entity_scheme() if self._entity_metrics() else None,
        }}
        return load_model(
            self.auto_model_class, self.config.model, label_maps=label_maps, config_overrides={"task_specific_params": defaults}
        )

    @property
    def max_length(self) -> int:
        return min(self.config.data.max_seq_length, self.tokenizer.model_max_length)

    def preprocess(self, examples: Dataset, *, train: bool, inputs: bool = False) -> Dataset:
        labelled = "tags" in examples.column_names
        label2id = {name: index for index, name in enumerate(self.label_names)}
        return examples.map(
            KeyedOnCode(tokenize_and_align), batched=True, with_indices=True, remove_columns=examples.column_names,
            num_proc=self.config.data.preprocessing_num_workers,
            fn_kwargs={
                "tokenizer": self.tokenizer, "max_length": self.max_length, "stride": self.options.stride,
                "label2id": label2id if labelled else None, "label_all_tokens": self.options.label_all_tokens,
                "b_to_i": b_to_i_map(self.label_names),
            },
            desc="tokenising and aligning tags",
        )

    def collator(self, *, train: bool):
        pad = DataCollatorForTokenClassification(self.tokenizer, label_pad_token_id=IGNORE_INDEX)

        def collate(features: list[dict[str, Any]]) -> dict[str, torch.Tensor]:
            # example_index/word_index serve postprocess only; the model must not see them.
            return pad([{k: v for k, v in f.items() if k not in ("example_index", "word_index")} for f in features])

        return collate

    def predict_step(self, model, batch: dict[str, torch.Tensor]) -> dict[str, torch.Tensor]:
        batch = {key: value for key, value in batch.items() if key != "labels"}
        tag_ids, scores = piece_predictions(model(**batch).logits, batch.get("attention_mask"))
        return {"tag_ids": tag_ids, "tag_scores": scores}

    # ----- predictions and metrics --------------------------------------------------------
    def postprocess(self, outputs: dict[str, np.ndarray], features: Dataset, examples: Dataset) -> dict[str, Any]:
        tag_ids, scores, _ = select_word_predictions(
            outputs["tag_ids"], outputs["tag_scores"], list(features["example_index"]), list(features["word_index"]),
            [len(words) for words in examples["tokens"]],
        )
        return {"tags": [word_tags(sentence, self.label_names) for sentence in tag_ids], "scores": scores}

    def _entity_metrics(self) -> bool:
        """seqeval's entity measures only make sense for chunk tags (O, B-X, I-X...), not for POS tags."""
        return is_chunk_tag_set(self.label_names)

    def _entity_scheme(self) -> str | None:
        """The scheme entities are chunked by, as the metric counts them: None for conlleval's lenient reading."""
        return self._strict_scheme() if self.options.strict else None

    def _strict_scheme(self) -> str:
        if self.options.scheme:
            return self.options.scheme
        prefixes = {name.split("-", 1)[0] for name in self.label_names if name != "O"}
        # BILOU tags under IOB2 made seqeval raise "Invalid token is found: L-PER" (a traceback).
        if prefixes & {"L", "U"}:
            return "BILOU"
        return "IOBES" if prefixes & {"E", "S"} else "IOB2"

    def compute_metrics(self, predictions: dict[str, Any], examples: Dataset) -> dict[str, float]:
        references = list(examples["tags"])
        predicted = predictions["tags"]
        words = sum(len(sentence) for sentence in references)
        if not self._entity_metrics():
            correct = sum(p == r for ps, rs in zip(predicted, references) for p, r in zip(ps, rs))
            return {"accuracy": correct / words, "words": words}
        if self._metric is None:
            self._metric = load_metric("seqeval")
        if self.options.strict:
            result = self._metric.compute(predictions=predicted, references=references, mode="strict", scheme=self._strict_scheme())
        else:
            result = self._metric.compute(predictions=[lenient_chunk_tags(tags) for tags in predicted],
                                          references=[lenient_chunk_tags(tags) for tags in references])
        metrics = {
            "precision": result.pop("overall_precision"), "recall": result.pop("overall_recall"),
            "f1": result.pop("overall_f1"), "accuracy": result.pop("overall_accuracy"), "words": words,
        }
        for entity_type, values in sorted(result.items()):
            for name in ("precision", "recall", "f1"):
                metrics[f"{entity_type}_{name}"] = values[name]
        return metrics

    def metric_names(self) -> tuple[str, ...]:
        if not self._entity_metrics():
            return ("accuracy", "words")
        types = sorted({name.split("-", 1)[1] for name in self.label_names if name != "O"})
        per_type = (f"{entity_type}_{name}" for entity_type in types for name in ("precision", "recall", "f1"))
        return ("precision", "recall", "f1", "accuracy", "words", *per_type)

    def metrics_absent_from(self, examples: Dataset) -> dict[str, str]:
        if not self._entity_metrics():
            return {}
        # seqeval scores a type only when the references or the predictions hold one: without gold entities of
        # a type its scores are zeros that come and go with what the model predicts. Strict mode counts only the
        # chunks its scheme allows (an IOB1 file's I-LOC opening an entity is none under IOB2), so those are read.
        if self.options.strict:
            from seqeval import scheme as seqeval_scheme

            chunks = seqeval_scheme.Entities(list(examples["tags"]), getattr(seqeval_scheme, self._strict_scheme()))
            held = set(chunks.unique_tags)
        else:
            held = {tag.split("-", 1)[1] for tags in examples["tags"] for tag in tags if tag != "O"}
        types = sorted({name.split("-", 1)[1] for name in self.label_names if name != "O"} - held)
        counted = f" that strict {self._strict_scheme()} chunking counts" if self.options.strict else ""
        return {f"{entity_type}_{name}": f"the eval split holds no {entity_type} entity{counted}"
                for entity_type in types for name in ("precision", "recall", "f1")}

    def check_distillation_teacher(self, teacher_options: TaskOptions, teacher_dir: str) -> None:
        if self.options.label_all_tokens and not teacher_options.label_all_tokens:
            # Soft targets are read at the labelled pieces: with every piece labelled here, two thirds of them came
            # from continuation pieces the teacher never trained on.
            raise DataError(
                f"ner.label_all_tokens=true, but the teacher {teacher_dir} trained on each word's first piece only "
                "(label_all_tokens=false): its outputs at the other pieces are untrained; set ner.label_all_tokens=false"
            )

    def input_columns(self) -> tuple[str, ...]:
        return ("text", self.tokens_column)

    def format_predictions(self, predictions: dict[str, Any], examples: Dataset) -> list[dict[str, Any]]:
        rows = []
        raw_text = "text" in examples.column_names
        for index, words in enumerate(examples["tokens"]):
            tags, scores = predictions["tags"][index], predictions["scores"][index]
            if raw_text:
                text = examples[index]["text"]
                offsets = [tuple(span) for span in examples[index]["word_offsets"]]
            else:
                text, offsets = join_words(words)
            row: dict[str, Any] = {"text": text}
            if not raw_text:
                row.update(tokens=list(words), tags=tags)
            if self._entity_metrics():
                row["entities"] = sentence_entities(tags, scores, offsets, text, raw_text=raw_text, strict_scheme=self._entity_scheme())
            else:  # POS and other tags that name no chunks: each word's tag, as pipeline() gives it
                row["words"] = word_records(tags, scores, offsets, text)
            rows.append(row)
        return rows

    def save_artifacts(self, predictions, examples: Dataset, run_dir: str) -> None:
        """Write the eval split's word-level predictions as CoNLL columns (token, gold, predicted)."""
        lines = []
        for words, gold, predicted in zip(examples["tokens"], examples["tags"], predictions["tags"]):
            lines.extend(f"{w} {g} {p}" for w, g, p in zip(words, gold, predicted))
            lines.append("")
        write_text_atomically(Path(run_dir) / "eval_predictions.conll", "\n".join(lines) + "\n")


def _require_a_word(sentences: list[list], path: Path) -> None:
    # Inputs without one word (a .conll file of -DOCSTART- lines, rows of empty word lists) have nothing to tag;
    # batching them ended in a traceback (no input_ids column).
    if not any(sentences):
        raise DataError(f"input file {path} holds no words to tag")
