"""Token classification (NER, POS, chunking): one tag per word, predicted from word pieces.

In:  sentences as word lists with one tag per word, from a Hub dataset (``eriktks/conll2003``: ``tokens``
     and ``ClassLabel`` tag sequences ``ner_tags``/``pos_tags``/``chunk_tags``), CoNLL column files
     (``.txt``/``.conll``: ``token ... tag`` per line, a blank line between sentences, ``-DOCSTART-``
     lines skipped) or json/jsonl rows with a token list and a tag list. ``bertpipe predict`` also
     takes raw text (a ``.txt`` line or a jsonl ``text`` field), split into words here.
Out: an ``AutoModelForTokenClassification`` whose ``id2label`` holds the dataset's tag names and whose
     config stores ``aggregation_strategy: words`` for ``pipeline("token-classification")`` (with
     this module imported, the pipeline on the run directory returns exactly ``bertpipe predict``'s
     entities: :mod:`tasks.ner_pipeline`), word-level predictions, and entity-level seqeval metrics
     (micro P/R/F1, per-type P/R/F1, word accuracy).

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
"""

from __future__ import annotations

import json
import re
from pathlib import Path
from typing import Any, ClassVar, Literal, Sequence

import datasets
import numpy as np
import torch
from datasets import ClassLabel, Dataset, DatasetDict
from pydantic import Field
from transformers import AutoModelForTokenClassification, DataCollatorForTokenClassification

from pipelines.config import RunConfig, TaskOptions
from pipelines.data import DataError, finalize_splits, json_records, load_split_files, naming_undecodable, read_inputs
from pipelines.hub import resolve_dataset
from pipelines.metrics import load_metric
from pipelines.modeling import encode_words_as_in_running_text, load_model
from pipelines.task import TaskBase

IGNORE_INDEX = -100
PIPELINE_TASK = "token-classification"
WORD_AGGREGATION = "words"
"""The ``aggregation_strategy`` of ``pipeline("token-classification")`` that is ``bertpipe predict``'s word rule."""
CONLL_SUFFIXES = (".txt", ".conll")
JSON_SUFFIXES = (".json", ".jsonl")
DOCSTART = "-DOCSTART-"
DEFAULT_TAG_COLUMNS = ("ner_tags", "tags")
_ENTITY_TAG = re.compile(r"^(?:O|[BIESLU]-.+)$")
_PREFIX_RANK = {"B": 0, "I": 1, "E": 2, "L": 2, "S": 3, "U": 3}
# Raw text -> words: runs of word characters (joined by inner hyphens, apostrophes, dots, ampersands
# or slashes, so "U.S", "1996-08-22", "AT&T" stay one word) or single punctuation marks.
_WORD = re.compile(r"\w+(?:[-'’.&/]\w+)*|[^\w\s]")


class NerOptions(TaskOptions):
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
    """Tagging scheme for strict evaluation; by default IOBES when S-/E- tags exist, else IOB2."""
    strict: bool = False
    """Count an entity only when its tags form a valid chunk of ``scheme`` (seqeval strict mode);
    the default is conlleval's lenient reading, which accepts IOB1, IOB2 and IOBES alike."""


class NerTask(TaskBase):
    name: ClassVar[str] = "ner"
    Options: ClassVar[type[TaskOptions]] = NerOptions
    pipeline_tag: ClassVar[str] = PIPELINE_TASK
    output_pad_values: ClassVar[dict[str, float]] = {"tag_ids": IGNORE_INDEX, "tag_scores": 0.0}
    higher_is_better: ClassVar[dict[str, bool]] = {"loss": False}
    auto_model_class: ClassVar[type] = AutoModelForTokenClassification
    peft_task_type: ClassVar[str | None] = "TOKEN_CLS"
    onnx_outputs: ClassVar[tuple[str, ...]] = ("logits",)
    card_pipeline_input: ClassVar[str | None] = '"Angela Merkel visited Paris in May."'
    card_model_usage: ClassVar[str | None] = None
    packable: ClassVar[bool] = True

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
            raw = load_split_files(data.files, self._read_file, _sentences_dataset)
            source = None
        else:
            source = resolve_dataset(data.path)
            raw = datasets.load_dataset(source, data.name)
        raw = finalize_splits(raw, data, self.config.seed, need_train=include_train)
        if include_train and self.label_names is None:
            self.label_names = self._infer_label_names(raw[data.train_split])
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
            for row in rows:
                for column in (self.tokens_column, tag_column):
                    if column not in row:
                        raise DataError(f"{row['location']}: no {column!r} field; the row has {sorted(k for k in row if k != 'location')}")
                out.append({"tokens": row[self.tokens_column], "tags": row[tag_column], "location": row["location"]})
            return out
        if suffix == ".parquet":
            table = datasets.load_dataset("parquet", data_files=[str(path)])["train"]
            tag_column = self._tag_column(table.column_names, str(path))
            return [
                {"tokens": tokens, "tags": tags, "location": f"{path}, row {index}"}
                for index, (tokens, tags) in enumerate(zip(table[self.tokens_column], table[tag_column]))
            ]
        raise DataError(f"{path}: unsupported file type {suffix!r} for ner; use .txt/.conll (CoNLL columns), .json/.jsonl or .parquet")

    def _infer_label_names(self, train: Dataset) -> list[str]:
        if "location" in train.column_names and "tags" in train.column_names:  # local files: string tags
            tags = {tag for row in train["tags"] for tag in row}
            if any(not isinstance(tag, str) for tag in tags):
                raise DataError("integer tags in data files need their names: set ner.label_names (in id order)")
            return order_labels(self._with_continuations(tags))
        names = _class_label_names(train, self._tag_column(train.column_names, "the train split"))
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
            class_names = _class_label_names(split, tag_column)
            ids = list(split["id"]) if "id" in split.column_names else None
            locations = [
                f"{dataset_path} split {split_name!r}, row {row}" + (f" (id {ids[row]})" if ids else "") for row in range(len(split))
            ]
            if class_names is not None:
                tags = [[class_names[t] if 0 <= t < len(class_names) else t for t in sentence] for sentence in tags]
        label_set = set(self.label_names)
        for sentence_tokens, sentence_tags, location in zip(tokens, tags, locations):
            check_sentence(sentence_tokens, sentence_tags, label_set, location)
        return Dataset.from_dict({"tokens": tokens, "tags": tags, "location": locations})

    def load_inputs(self, path: str) -> Dataset:
        """``.txt``: one raw text per line; ``.conll``: CoNLL columns; json/jsonl: ``tokens`` lists or ``text``."""
        path = Path(path)
        if path.suffix.lower() == ".conll":
            rows = read_conll(
                path, token_column=self.options.conll_token_column, tag_column=self.options.conll_tag_column,
                encoding=self.config.data.encoding,
            )
            return Dataset.from_dict({"tokens": [r["tokens"] for r in rows], "location": [r["location"] for r in rows]})
        inputs = read_inputs(path, encoding=self.config.data.encoding)
        if self.tokens_column in inputs.column_names:
            tokens = [list(words) for words in inputs[self.tokens_column]]
            for index, words in enumerate(tokens):
                if any(not isinstance(word, str) for word in words):
                    raise DataError(f"{path}, row {index}: {self.tokens_column!r} must be a list of strings")
            return Dataset.from_dict({"tokens": tokens, "location": [f"{path}, row {i}" for i in range(len(tokens))]})
        if "text" not in inputs.column_names:
            raise DataError(f"{path}: each input needs a 'text' string or a {self.tokens_column!r} word list; found {inputs.column_names}")
        texts = [text or "" for text in inputs["text"]]
        words = [split_words(text) for text in texts]
        if not any(words):
            raise DataError(f"{path}: no input line holds any word")
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
        # pipeline("token-classification", model=RUN_DIR) reads these (tasks.ner_pipeline), so that it
        # finds the entities this run's predict finds, in windows of the size it was trained on.
        defaults = {PIPELINE_TASK: {
            "aggregation_strategy": WORD_AGGREGATION, "max_seq_length": self.config.data.max_seq_length, "stride": self.options.stride,
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
            _tokenize_and_align, batched=True, with_indices=True, remove_columns=examples.column_names,
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
        probabilities = model(**batch).logits.float().softmax(dim=-1)
        scores, tag_ids = probabilities.max(dim=-1)
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
        return all(_ENTITY_TAG.match(name) for name in self.label_names)

    def _strict_scheme(self) -> str:
        if self.options.scheme:
            return self.options.scheme
        prefixes = {name.split("-", 1)[0] for name in self.label_names if name != "O"}
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
        strict = {"mode": "strict", "scheme": self._strict_scheme()} if self.options.strict else {}
        result = self._metric.compute(predictions=predicted, references=references, **strict)
        metrics = {
            "precision": result.pop("overall_precision"), "recall": result.pop("overall_recall"),
            "f1": result.pop("overall_f1"), "accuracy": result.pop("overall_accuracy"), "words": words,
        }
        for entity_type, values in sorted(result.items()):
            for name in ("precision", "recall", "f1"):
                metrics[f"{entity_type}_{name}"] = values[name]
        return metrics

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
            row["entities"] = sentence_entities(tags, scores, offsets, text, raw_text=raw_text)
            rows.append(row)
        return rows

    def save_artifacts(self, predictions, examples: Dataset, run_dir: str) -> None:
        """Write the eval split's word-level predictions as CoNLL columns (token, gold, predicted)."""
        lines = []
        for words, gold, predicted in zip(examples["tokens"], examples["tags"], predictions["tags"]):
            lines.extend(f"{w} {g} {p}" for w, g, p in zip(words, gold, predicted))
            lines.append("")
        (Path(run_dir) / "eval_predictions.conll").write_text("\n".join(lines) + "\n")


# ----- data readers -----------------------------------------------------------------------------
def read_conll(path: str | Path, *, token_column: int = 0, tag_column: int = -1, encoding: str = "utf-8") -> list[dict[str, Any]]:
    """CoNLL column file -> ``[{"tokens", "tags", "location"}]``, one dict per sentence.

    Columns are split on whitespace; every token line of a file must have as many columns as the
    first one. Blank lines end sentences (several in a row are one break); ``-DOCSTART-`` lines are
    document markers, not words. ``location`` is ``path:line`` of the sentence's first token.
    """
    path = Path(path)
    sentences: list[dict[str, Any]] = []
    tokens: list[str] = []
    tags: list[str] = []
    start_line = 0
    width: int | None = None
    width_line = 0

    def flush() -> None:
        if tokens:
            sentences.append({"tokens": list(tokens), "tags": list(tags), "location": f"{path}:{start_line}"})
            tokens.clear()
            tags.clear()

    with naming_undecodable({"input": [path]}, encoding), open(path, encoding=encoding) as handle:
        for number, line in enumerate(handle, start=1):
            columns = line.split()
            if not columns:
                flush()
                continue
            if columns[0] == DOCSTART:
                flush()
                continue
            if width is None:
                width, width_line = len(columns), number
                for name, index in (("conll_token_column", token_column), ("conll_tag_column", tag_column)):
                    if not -width <= index < width:
                        raise DataError(f"{path}:{number}: ner.{name}={index} but the file has {width} columns")
                if width < 2:
                    raise DataError(f"{path}:{number}: a CoNLL line needs a token and a tag column, found {width} column: {line.rstrip()!r}")
            elif len(columns) != width:
                raise DataError(
                    f"{path}:{number}: {len(columns)} columns where the file has {width} (as on line {width_line}): {line.rstrip()!r}"
                )
            if not tokens:
                start_line = number
            tokens.append(columns[token_column])
            tags.append(columns[tag_column])
    flush()
    return sentences


def read_json_rows(path: Path, *, encoding: str = "utf-8") -> list[dict[str, Any]]:
    """``.jsonl`` (one object a line) or ``.json`` (a list of objects) -> rows with a ``location``."""
    with naming_undecodable({"input": [path]}, encoding):
        text = path.read_text(encoding=encoding)
    if path.suffix.lower() == ".jsonl":
        return [{**row, "location": f"{path}:{number}"} for number, row in json_records(text, path)]
    try:
        loaded = json.loads(text)
    except json.JSONDecodeError as error:
        raise DataError(f"{path}:{error.lineno}: not valid JSON ({error.msg})") from None
    if isinstance(loaded, dict) and isinstance(loaded.get("data"), list):
        loaded = loaded["data"]
    if not isinstance(loaded, list) or not all(isinstance(row, dict) for row in loaded):
        raise DataError(f"{path}: expected a list of objects (or {{'data': [...]}}), one per sentence")
    return [{**row, "location": f"{path}, record {index}"} for index, row in enumerate(loaded)]


def _sentences_dataset(rows: list[dict[str, Any]]) -> Dataset:
    return Dataset.from_list(rows) if rows else Dataset.from_dict({"tokens": [], "tags": [], "location": []})


def check_sentence(tokens: Sequence[str], tags: Sequence[Any], label_set: set[str], location: str) -> None:
    """Raise a DataError naming ``location`` for an empty sentence, a length mismatch or an unknown tag."""
    if not isinstance(tokens, (list, tuple)) or not isinstance(tags, (list, tuple)):
        raise DataError(f"{location}: tokens and tags must be lists, got {type(tokens).__name__} and {type(tags).__name__}")
    if len(tokens) == 0:
        raise DataError(f"{location}: empty sentence (no tokens)")
    if len(tokens) != len(tags):
        raise DataError(f"{location}: {len(tokens)} tokens but {len(tags)} tags (sentence starts {' '.join(map(str, tokens[:8]))!r})")
    for position, (token, tag) in enumerate(zip(tokens, tags)):
        if tag not in label_set:
            raise DataError(
                f"{location}: word {position} {token!r} has tag {tag!r}, which is not in the label set {order_labels(label_set)}"
            )


def order_labels(tags) -> list[str]:
    """``O`` first, then chunk tags grouped by type (B, I, E, S within a type), then other tags sorted."""

    def key(tag: str) -> tuple:
        if tag == "O":
            return (0, "", 0)
        prefix, _, entity_type = tag.partition("-")
        if entity_type and prefix in _PREFIX_RANK:
            return (1, entity_type, _PREFIX_RANK[prefix])
        return (2, tag, 0)

    return sorted(set(tags), key=key)


def _class_label_names(split: Dataset, column: str) -> list[str] | None:
    feature = split.features.get(column)
    inner = getattr(feature, "feature", None)
    return list(inner.names) if isinstance(inner, ClassLabel) else None


# ----- word pieces: windows and label alignment ------------------------------------------------
def b_to_i_map(label_names: Sequence[str]) -> list[int]:
    """Label id -> the id a continuation piece gets under ``label_all_tokens``: ``B-X`` -> ``I-X``."""
    index = {name: i for i, name in enumerate(label_names)}
    return [index.get("I-" + name[2:], i) if name.startswith("B-") else i for i, name in enumerate(label_names)]


def word_windows(piece_counts: Sequence[int], max_pieces: int, stride: int) -> list[tuple[int, int]]:
    """Cut a sentence at word boundaries into ``[start, end)`` word windows of at most ``max_pieces`` pieces.

    Consecutive windows share the trailing words of the previous one, up to ``stride`` pieces (at
    most half a window), so words near a cut also get context on both sides. Every word lies in some window; a
    single word longer than ``max_pieces`` gets a window of its own (the tokenizer truncates its
    tail pieces, but its first piece, which carries the prediction, survives).
    """
    count = len(piece_counts)
    if count == 0:
        return []
    # An overlap of more than half a window would make windows crawl forward a word at a time.
    stride = min(stride, max_pieces // 2)
    windows = []
    start = 0
    while True:
        end, used = start, 0
        while end < count and (end == start or used + piece_counts[end] <= max_pieces):
            used += piece_counts[end]
            end += 1
        windows.append((start, end))
        if end >= count:
            return windows
        # Step back from the end while the overlap stays within ``stride``; always move forward.
        next_start, overlap = end, 0
        while next_start - 1 > start and overlap + piece_counts[next_start - 1] <= stride:
            next_start -= 1
            overlap += piece_counts[next_start]
        # ... but never so far back that the next window could not reach a new word.
        while next_start < end and sum(piece_counts[next_start:end]) + piece_counts[end] > max_pieces:
            next_start += 1
        start = next_start


def align_labels(
    word_ids: Sequence[int | None], word_label_ids: Sequence[int], *, label_all_tokens: bool, b_to_i: Sequence[int]
) -> list[int]:
    """Piece labels from word labels: first piece of each word labelled, the rest -100 (or continued)."""
    labels = []
    previous = None
    for word in word_ids:
        if word is None:
            labels.append(IGNORE_INDEX)
        elif word != previous:
            labels.append(word_label_ids[word])
        else:
            labels.append(b_to_i[word_label_ids[word]] if label_all_tokens else IGNORE_INDEX)
        previous = word
    return labels


def first_piece_words(word_ids: Sequence[int | None], offset: int = 0) -> list[int]:
    """Per piece: the (sentence-level) index of the word it starts, or -1 (special or continuation piece)."""
    out = []
    previous = None
    for word in word_ids:
        out.append(word + offset if word is not None and word != previous else -1)
        previous = word
    return out


def _tokenize_and_align(
    batch: dict[str, list], indices: list[int], *, tokenizer, max_length: int, stride: int,
    label2id: dict[str, int] | None, label_all_tokens: bool, b_to_i: list[int],
) -> dict[str, list]:
    """Sentences -> one feature per window. Module-level so that ``datasets`` can hash and cache it."""
    sentences = batch["tokens"]
    pieces = tokenizer(sentences, is_split_into_words=True, add_special_tokens=False)
    budget = max(1, max_length - tokenizer.num_special_tokens_to_add(pair=False))
    window_words_, window_example, window_offset = [], [], []
    for position, words in enumerate(sentences):
        counts = [0] * len(words)
        for word in pieces.word_ids(position):
            if word is not None:
                counts[word] += 1
        for start, end in word_windows(counts, budget, stride):
            window_words_.append(words[start:end])
            window_example.append(position)
            window_offset.append(start)
    if not window_words_:  # only empty sentences (raw-text predict inputs): no features; [] would read as one sentence
        empty = {**{name: [] for name in tokenizer.model_input_names}, "example_index": [], "word_index": []}
        return {**empty, "labels": []} if label2id is not None else empty
    encoded = tokenizer(window_words_, is_split_into_words=True, truncation=True, max_length=max_length)
    encoded["example_index"] = [indices[position] for position in window_example]
    encoded["word_index"] = []
    if label2id is not None:
        encoded["labels"] = []
    for window, (position, offset) in enumerate(zip(window_example, window_offset)):
        word_ids = encoded.word_ids(window)
        encoded["word_index"].append(first_piece_words(word_ids, offset))
        if label2id is not None:
            word_labels = [label2id[tag] for tag in batch["tags"][position][offset : offset + len(window_words_[window])]]
            encoded["labels"].append(align_labels(word_ids, word_labels, label_all_tokens=label_all_tokens, b_to_i=b_to_i))
    return encoded


def select_word_predictions(
    tag_ids: np.ndarray, tag_scores: np.ndarray, example_index: Sequence[int], word_index: Sequence[Sequence[int]],
    words_per_example: Sequence[int],
) -> tuple[list[list[int]], list[list[float]], list[list[int]]]:
    """Window predictions -> one (tag id, score) per word, from the window where the word has most context.

    A word's context in a window is the number of pieces on its thinner side, ``min(p, n - 1 - p)``
    for the word's first piece at position ``p`` of an ``n``-piece window. Returns tag ids (-1 for a
    word no window holds), scores, and each word's chosen context (for tests and diagnostics).
    """
    chosen_tags = [[-1] * count for count in words_per_example]
    chosen_scores = [[0.0] * count for count in words_per_example]
    context = [[-1] * count for count in words_per_example]
    for feature, (example, words) in enumerate(zip(example_index, word_index)):
        length = len(words)
        for position, word in enumerate(words):
            if word < 0:
                continue
            room = min(position, length - 1 - position)
            if room > context[example][word]:
                context[example][word] = room
                chosen_tags[example][word] = int(tag_ids[feature, position])
                chosen_scores[example][word] = float(tag_scores[feature, position])
    return chosen_tags, chosen_scores, context


# ----- words, entities and character spans --------------------------------------------------------
def split_words(text: str) -> list[tuple[str, tuple[int, int]]]:
    """Raw text -> CoNLL-like words with their ``(start, end)`` character offsets in ``text``."""
    return [(match.group(), match.span()) for match in _WORD.finditer(text)]


def join_words(words: Sequence[str], separator: str = " ") -> tuple[str, list[tuple[int, int]]]:
    """Pre-tokenised words -> the text they make joined by ``separator``, and each word's offsets in it."""
    offsets, position = [], 0
    for word in words:
        offsets.append((position, position + len(word)))
        position += len(word) + len(separator)
    return separator.join(words), offsets


def encode_word_windows(tokenizer, words: Sequence[str], *, max_length: int, stride: int):
    """One sentence's words -> its windows as ``bertpipe predict`` encodes them (model inputs + ``word_index``)."""
    return _tokenize_and_align(
        {"tokens": [list(words)]}, [0], tokenizer=tokenizer, max_length=max_length, stride=stride,
        label2id=None, label_all_tokens=False, b_to_i=[],
    )


def word_tags(tag_ids: Sequence[int], label_names: Sequence[str]) -> list[str]:
    """A sentence's word tag ids (-1: no window held the word) -> tag names.

    A word no window could hold a piece of (a tokenizer that maps it to nothing) is tagged O, so that
    it is still counted rather than dropped.
    """
    outside = list(label_names).index("O") if "O" in label_names else 0
    return [label_names[i if i >= 0 else outside] for i in tag_ids]


def sentence_entities(
    tags: Sequence[str], scores: Sequence[float], offsets: Sequence[tuple[int, int]], text: str, *, raw_text: bool
) -> list[dict[str, Any]]:
    """The entities ``bertpipe predict`` reports for one text (``start_word``/``end_word`` for given words only)."""
    entities = word_entities(tags, scores, offsets, text)
    if raw_text:  # word indices refer to our own split of the text: not part of the answer
        entities = [{k: v for k, v in e.items() if k not in ("start_word", "end_word")} for e in entities]
    return entities


def word_entities(
    tags: Sequence[str], scores: Sequence[float], offsets: Sequence[tuple[int, int]], text: str
) -> list[dict[str, Any]]:
    """Word tags -> entity spans (conlleval chunking, as the metric counts them) with character offsets."""
    from seqeval.metrics.sequence_labeling import get_entities

    entities = []
    for entity_type, first, last in get_entities(list(tags)):
        start, end = offsets[first][0], offsets[last][1]
        entities.append({
            "entity_group": entity_type, "word": text[start:end], "start": start, "end": end,
            "score": round(float(np.mean(scores[first : last + 1])), 6), "start_word": first, "end_word": last + 1,
        })
    return entities


# pipeline("token-classification") on a bertpipe run: predict's entities, from the functions above
# (imported last, once they exist; tasks.ner_pipeline imports them from here).
import tasks.ner_pipeline  # noqa: E402,F401  (registers the pipeline)
