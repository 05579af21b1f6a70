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
"""

from __future__ import annotations

import logging
import re
from dataclasses import dataclass
from pathlib import Path
from typing import Any, ClassVar, Iterable, Sequence

import numpy as np
import torch
import torch.nn.functional as F
from datasets import Dataset, DatasetDict
from pydantic import Field, model_validator
from transformers import AutoModelForMaskedLM, AutoModelForPreTraining, PreTrainedTokenizerBase

from pipelines.config import RunConfig, TaskOptions
from pipelines.data import DataError, finalize_splits, load_raw, read_inputs, require_columns, skip_blank_lines
from pipelines.modeling import ModelError, load_model, load_tokenizer, tokenizer_source

logger = logging.getLogger(__name__)

IGNORE_INDEX = -100
NO_WORD = -1
DEFAULT_VOCAB_SIZE = 30522
BERT_SPECIAL_TOKENS = ["[PAD]", "[UNK]", "[CLS]", "[SEP]", "[MASK]"]


class MlmOptions(TaskOptions):
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


# ----- corpus: cleaning, documents, held-out split --------------------------------------------
_HEADING = re.compile(r"^\s*(=\s+)+[^=].*?(\s+=)+\s*$")
_TOP_HEADING = re.compile(r"^\s*=\s+[^=](.*[^=])?\s+=\s*$")


def is_heading(line: str) -> bool:
    """WikiText section headings: `` = Title = ``, `` = = Section = = `` and deeper."""
    return bool(_HEADING.match(line))


def split_documents(rows: Sequence[str]) -> list[list[int]]:
    """Row indices grouped into documents, in corpus order.

    Top-level WikiText headings start documents when the corpus has at least two; otherwise blank
    rows separate paragraphs; otherwise every row is its own document.
    """
    starts = [i for i, row in enumerate(rows) if _TOP_HEADING.match(row)]
    if len(starts) >= 2:
        bounds = ([0] if starts[0] != 0 else []) + starts + [len(rows)]
        return [list(range(a, b)) for a, b in zip(bounds, bounds[1:]) if b > a]
    paragraphs, current = [], []
    for i, row in enumerate(rows):
        if row.strip():
            current.append(i)
        elif current:
            paragraphs.append(current)
            current = []
    if current:
        paragraphs.append(current)
    if len(paragraphs) >= 2:
        return paragraphs
    return [[i] for i in range(len(rows))]


def hold_out_documents(documents: list[list[int]], fraction: float, seed: int) -> tuple[list[int], list[int]]:
    """(train rows, held-out rows): a seeded random set of whole documents holding ``fraction`` of the rows.

    Both keep corpus order. At least one document goes each way when there are two or more.
    """
    if len(documents) < 2:
        raise DataError("data.validation_fraction: the corpus has a single document/row; it cannot be split")
    order = np.random.default_rng(seed).permutation(len(documents))
    total = sum(len(doc) for doc in documents)
    held, held_rows = set(), 0
    for index in order:
        if held and held_rows + len(documents[index]) / 2 > fraction * total:
            break
        held.add(int(index))
        held_rows += len(documents[index])
        if len(held) == len(documents) - 1:
            break
    train = [row for i, doc in enumerate(documents) if i not in held for row in doc]
    held_out = [row for i, doc in enumerate(documents) if i in held for row in doc]
    return train, held_out


def clean_rows(rows: Iterable[str], *, drop_headings: bool) -> list[str]:
    """Strip rows; drop empty ones and (optionally) WikiText headings."""
    kept = []
    for row in rows:
        row = (row or "").strip()
        if row and not (drop_headings and is_heading(row)):
            kept.append(row)
    return kept


# ----- tokenizer ------------------------------------------------------------------------------
def train_wordpiece_tokenizer(
    texts: Iterable[str], *, vocab_size: int, lowercase: bool, min_frequency: int, model_max_length: int
):
    """A BERT WordPiece tokenizer (``[PAD] [UNK] [CLS] [SEP] [MASK]``) trained on ``texts``."""
    from tokenizers import Tokenizer, decoders, models, normalizers, pre_tokenizers, processors, trainers
    from transformers import BertTokenizerFast

    tokenizer = Tokenizer(models.WordPiece(unk_token="[UNK]"))
    tokenizer.normalizer = normalizers.BertNormalizer(lowercase=lowercase, strip_accents=lowercase)
    tokenizer.pre_tokenizer = pre_tokenizers.BertPreTokenizer()
    trainer = trainers.WordPieceTrainer(vocab_size=vocab_size, special_tokens=BERT_SPECIAL_TOKENS, min_frequency=min_frequency)
    tokenizer.train_from_iterator(texts, trainer=trainer)
    cls_id, sep_id = tokenizer.token_to_id("[CLS]"), tokenizer.token_to_id("[SEP]")
    tokenizer.post_processor = processors.TemplateProcessing(
        single="[CLS] $A [SEP]", pair="[CLS] $A [SEP] $B:1 [SEP]:1", special_tokens=[("[CLS]", cls_id), ("[SEP]", sep_id)]
    )
    tokenizer.decoder = decoders.WordPiece(prefix="##")
    return BertTokenizerFast(tokenizer_object=tokenizer, model_max_length=model_max_length, do_lower_case=lowercase)


@dataclass(frozen=True)
class SpecialTemplate:
    """Where a tokenizer puts its special tokens around one or two segments, and their segment ids."""

    prefix: list[int]
    middle: list[int]
    suffix: list[int]
    type_a: int = 0
    type_b: int = 1

    @property
    def single_overhead(self) -> int:
        return len(self.prefix) + len(self.suffix)

    @property
    def pair_overhead(self) -> int:
        return len(self.prefix) + len(self.middle) + len(self.suffix)

    def single(self, ids: list[int]) -> tuple[list[int], list[int]]:
        """(input_ids, special_tokens_mask) of one segment."""
        return self.prefix + ids + self.suffix, [1] * len(self.prefix) + [0] * len(ids) + [1] * len(self.suffix)

    def pair(self, a: list[int], b: list[int]) -> tuple[list[int], list[int], list[int]]:
        """(input_ids, token_type_ids, special_tokens_mask) of a segment pair."""
        ids = self.prefix + a + self.middle + b + self.suffix
        types = [self.type_a] * (len(self.prefix) + len(a) + len(self.middle)) + [self.type_b] * (len(b) + len(self.suffix))
        special = [1] * len(self.prefix) + [0] * len(a) + [1] * len(self.middle) + [0] * len(b) + [1] * len(self.suffix)
        return ids, types, special


def special_template(tokenizer: PreTrainedTokenizerBase) -> SpecialTemplate:
    """Read the special-token template off the tokenizer by encoding two probe words with and without it."""
    a = tokenizer("a", add_special_tokens=False)["input_ids"]
    b = tokenizer("b", add_special_tokens=False)["input_ids"]
    single = tokenizer("a")["input_ids"]
    paired = tokenizer("a", "b")
    pair_ids, pair_types = paired["input_ids"], paired.get("token_type_ids") or [0] * len(paired["input_ids"])
    start = _find(single, a)
    prefix, suffix = single[:start], single[start + len(a):]
    a_at = _find(pair_ids, a)
    b_at = _find(pair_ids, b, a_at + len(a))
    if pair_ids[:a_at] != prefix or pair_ids[b_at + len(b):] != suffix:
        # Tokenizers whose pair template differs at the ends (rare) still get the pair's own ends.
        prefix, suffix = pair_ids[:a_at], pair_ids[b_at + len(b):]
    return SpecialTemplate(prefix, pair_ids[a_at + len(a):b_at], suffix, pair_types[a_at], pair_types[b_at])


def _find(haystack: list[int], needle: list[int], start: int = 0) -> int:
    for i in range(start, len(haystack) - len(needle) + 1):
        if haystack[i:i + len(needle)] == needle:
            return i
    raise ModelError("could not locate the text among the special tokens of the tokenizer's template")


# ----- examples: packing, lines, sentence pairs -------------------------------------------------
def number_words(word_ids_per_row: Sequence[Sequence[int | None]]) -> list[list[int]]:
    """Per-row ``word_ids()`` -> word numbers unique across the rows (so packed blocks keep words apart)."""
    numbered, offset = [], 0
    for word_ids in word_ids_per_row:
        present = [w for w in word_ids if w is not None]
        numbered.append([NO_WORD if w is None else w + offset for w in word_ids])
        offset += (max(present) + 1) if present else 0
    return numbered


def pack_blocks(token_rows: Sequence[Sequence[int]], word_rows: Sequence[Sequence[int]], block_length: int) -> list[tuple[list[int], list[int]]]:
    """Concatenate the rows' tokens and cut them into blocks of ``block_length`` (the last keeps the rest).

    Returns (token ids, word numbers) per block; every token appears exactly once, in order.
    """
    stream = [t for row in token_rows for t in row]
    words = [w for row in word_rows for w in row]
    return [(stream[i:i + block_length], words[i:i + block_length]) for i in range(0, len(stream), block_length)]


def make_sentence_pairs(
    token_rows: Sequence[Sequence[int]], max_tokens: int, rng: np.random.Generator
) -> list[tuple[list[int], list[int], int]]:
    """(segment A, segment B, next_sentence_label) from consecutive rows, as in BERT's pretraining data.

    Rows are gathered into chunks of about ``max_tokens``; a chunk of several rows is cut at a random
    row boundary, a single long row at a random token. Half the time B is replaced by a stretch of
    the same length from elsewhere in the corpus (label 1, "not next"; 0 means B follows A). A + B
    is trimmed to ``max_tokens`` from the longer side (A at its start, B at its end).
    """
    stream = [t for row in token_rows for t in row]
    pairs, chunk, size = [], [], 0
    rows = [list(row) for row in token_rows if row]

    def flush(chunk: list[list[int]]) -> None:
        if len(chunk) >= 2:
            cut = int(rng.integers(1, len(chunk)))
            a, b = [t for r in chunk[:cut] for t in r], [t for r in chunk[cut:] for t in r]
        else:
            tokens = chunk[0][: max_tokens]
            if len(tokens) < 2:
                return
            cut = int(rng.integers(1, len(tokens)))
            a, b = tokens[:cut], tokens[cut:]
        label = 0
        if rng.random() < 0.5 and len(stream) > len(a) + len(b):
            length = max(1, min(len(b), max_tokens - min(len(a), max_tokens - 1)))
            start = int(rng.integers(0, len(stream) - length + 1))
            b, label = stream[start:start + length], 1
        while len(a) + len(b) > max_tokens:
            if len(a) > len(b):
                a = a[1:]  # from the front, so that A still ends where B begins
            else:
                b = b[:-1]
        pairs.append((a, b, label))

    for row in rows:
        chunk.append(row)
        size += len(row)
        if size >= max_tokens:
            flush(chunk)
            chunk, size = [], 0
    if chunk:
        flush(chunk)
    return pairs


# ----- masking --------------------------------------------------------------------------------
def choose_mask_targets(
    maskable: np.ndarray, word_ids: np.ndarray | None, probability: float, rng: np.random.Generator
) -> np.ndarray:
    """Boolean (batch, length) of prediction targets: tokens, or whole words, each chosen with ``probability``.

    ``maskable`` is False on special and padding tokens; ``word_ids`` (same shape, -1 outside words)
    groups the tokens of one word, which are then chosen together.
    """
    if word_ids is None:
        return (rng.random(maskable.shape) < probability) & maskable
    rows = np.broadcast_to(np.arange(maskable.shape[0])[:, None], maskable.shape)
    keys = np.where(maskable & (word_ids >= 0), rows * (int(word_ids.max()) + 2) + word_ids, -1)
    unique, inverse = np.unique(keys, return_inverse=True)
    chosen_words = rng.random(len(unique)) < probability
    chosen_words[unique < 0] = False
    return chosen_words[inverse.reshape(keys.shape)] & maskable


def mask_tokens(
    input_ids: np.ndarray,
    maskable: np.ndarray,
    word_ids: np.ndarray | None,
    *,
    rng: np.random.Generator,
    mlm_probability: float,
    mask_replace_prob: float,
    random_replace_prob: float,
    mask_token_id: int,
    random_token_ids: np.ndarray,
) -> tuple[np.ndarray, np.ndarray]:
    """BERT masking: (corrupted input ids, labels with -100 outside the targets).

    Of the targets, ``mask_replace_prob`` become ``mask_token_id``, ``random_replace_prob`` a token
    drawn from ``random_token_ids``, the rest keep their id. If no token of the whole batch was
    chosen, one maskable token is, so the loss is never an average over nothing.
    """
    targets = choose_mask_targets(maskable, word_ids, mlm_probability, rng)
    if not targets.any() and maskable.any():
        candidates = np.argwhere(maskable)
        targets[tuple(candidates[rng.integers(len(candidates))])] = True
    labels = np.where(targets, input_ids, IGNORE_INDEX)
    draw = rng.random(input_ids.shape)
    replaced = targets & (draw < mask_replace_prob)
    randomised = targets & (draw >= mask_replace_prob) & (draw < mask_replace_prob + random_replace_prob)
    corrupted = input_ids.copy()
    corrupted[replaced] = mask_token_id
    corrupted[randomised] = random_token_ids[rng.integers(0, len(random_token_ids), size=int(randomised.sum()))]
    return corrupted, labels


def eval_masking_rng(seed: int, index: int) -> np.random.Generator:
    """The generator for example ``index`` of an evaluation split: masks depend on nothing else."""
    return np.random.default_rng([seed, 0x6D6C6D, index])


_PAD_VALUES = {"attention_mask": 0, "token_type_ids": 0, "special_tokens_mask": 1, "word_ids": NO_WORD, "labels": IGNORE_INDEX}


def pad_batch(features: list[dict[str, Any]], pad_token_id: int) -> dict[str, np.ndarray]:
    """Right-pad every per-token column to the batch's longest row; scalars are stacked."""
    batch = {}
    for key in features[0]:
        values = [feature[key] for feature in features]
        if isinstance(values[0], (list, tuple, np.ndarray)):
            width = max(len(v) for v in values)
            pad = pad_token_id if key == "input_ids" else _PAD_VALUES.get(key, 0)
            array = np.full((len(values), width), pad, dtype=np.int64)
            for row, value in enumerate(values):
                array[row, : len(value)] = value
            batch[key] = array
        else:
            batch[key] = np.asarray(values, dtype=np.int64)
    return batch


class MaskingCollator:
    """Pads features and, for training, draws fresh BERT masks for every batch.

    Without ``masking`` (evaluation, prediction) it only pads: evaluation features already carry
    their fixed masks and labels. Helper columns (``word_ids``, ``special_tokens_mask``) are used
    here and dropped, so the batch holds exactly the model's forward arguments.
    """

    def __init__(self, tokenizer: PreTrainedTokenizerBase, options: MlmOptions | None, seed: int) -> None:
        self.pad_token_id = tokenizer.pad_token_id if tokenizer.pad_token_id is not None else 0
        self.options = options
        self.seed = seed
        self.mask_token_id = tokenizer.mask_token_id
        self.random_token_ids = random_token_ids(tokenizer)
        self._rng: np.random.Generator | None = None
        self._rng_key: Any = None

    def _generator(self) -> np.random.Generator:
        # In DataLoader workers the collator is a copy: seed from the worker's own torch seed, which
        # differs per worker and per epoch, or every worker would repeat the same masks.
        worker = torch.utils.data.get_worker_info()
        key = ("worker", worker.seed) if worker is not None else ("main", self.seed)
        if self._rng is None or self._rng_key != key:
            self._rng = np.random.default_rng(worker.seed if worker is not None else self.seed)
            self._rng_key = key
        return self._rng

    def __call__(self, features: list[dict[str, Any]]) -> dict[str, torch.Tensor]:
        batch = pad_batch(features, self.pad_token_id)
        word_ids = batch.pop("word_ids", None)
        special = batch.pop("special_tokens_mask", None)
        if self.options is not None:
            maskable = (batch["attention_mask"] == 1) & (special == 0)
            batch["input_ids"], batch["labels"] = mask_tokens(
                batch["input_ids"], maskable, word_ids if self.options.whole_word_mask else None, rng=self._generator(),
                mlm_probability=self.options.mlm_probability, mask_replace_prob=self.options.mask_replace_prob,
                random_replace_prob=self.options.random_replace_prob, mask_token_id=self.mask_token_id,
                random_token_ids=self.random_token_ids,
            )
        return {key: torch.from_numpy(value) for key, value in batch.items()}


def random_token_ids(tokenizer: PreTrainedTokenizerBase) -> np.ndarray:
    special = set(tokenizer.all_special_ids)
    return np.array([i for i in range(len(tokenizer)) if i not in special], dtype=np.int64)


# ----- metrics --------------------------------------------------------------------------------
def masked_lm_metrics(loss_sums: np.ndarray, counts: np.ndarray, correct: np.ndarray) -> dict[str, float]:
    """Perplexity, loss and accuracy over all masked tokens of a split (token-weighted, not batch means)."""
    total = float(np.sum(counts, dtype=np.float64))
    if total == 0:
        raise DataError("the evaluation split has no masked tokens; it is too small to evaluate masked-LM")
    loss = float(np.sum(loss_sums, dtype=np.float64)) / total
    return {"loss": loss, "perplexity": float(np.exp(loss)), "accuracy": float(np.sum(correct, dtype=np.float64)) / total}


def _prediction_logits(outputs) -> torch.Tensor:
    return outputs.prediction_logits if hasattr(outputs, "prediction_logits") else outputs.logits


# ----- the task -------------------------------------------------------------------------------
class MlmTask:
    name: ClassVar[str] = "mlm"
    Options: ClassVar[type[TaskOptions]] = MlmOptions
    pipeline_tag: ClassVar[str] = "fill-mask"
    output_pad_values: ClassVar[dict[str, float]] = {"top_token_ids": -1, "top_scores": 0.0}
    higher_is_better: ClassVar[dict[str, bool]] = {"perplexity": False, "loss": False}

    def __init__(self, config: RunConfig) -> None:
        self.config = config
        self.options: MlmOptions = config.task_options
        self.tokenizer = None
        self.trained_tokenizer = False
        self.fill_mask_inputs = False

    @property
    def text_column(self) -> str:
        return self.config.data.text_column or "text"

    # ----- data ---------------------------------------------------------------------------
    def load(self, *, include_train: bool = True) -> DatasetDict:
        data = self.config.data
        raw = DatasetDict(load_raw(data))
        for split_name, split in raw.items():
            require_columns(split, [self.text_column], split_name)
        rows = {name: list(split[self.text_column]) for name, split in raw.items()}
        if data.eval_split not in rows and data.validation_fraction and data.train_split in rows:
            corpus = rows[data.train_split]
            train_rows, held_rows = hold_out_documents(split_documents(corpus), data.validation_fraction, self.config.seed)
            rows[data.train_split] = [corpus[i] for i in train_rows]
            rows[data.eval_split] = [corpus[i] for i in held_rows]
        cleaned = DatasetDict()
        for name, split_rows in rows.items():
            kept = clean_rows(split_rows, drop_headings=self.options.drop_headings)
            if len(kept) < len(split_rows):
                logger.info("split %r: dropped %d empty/heading rows of %d", name, len(split_rows) - len(kept), len(split_rows))
            if split_rows and not kept:
                raise DataError(f"split {name!r}: all {len(split_rows)} rows are empty (or headings); the corpus holds no text")
            cleaned[name] = Dataset.from_dict({"text": kept})
        return finalize_splits(cleaned, data, self.config.seed, need_train=include_train)

    def load_inputs(self, path: str) -> Dataset:
        inputs = skip_blank_lines(read_inputs(path, encoding=self.config.data.encoding), path)
        if self.text_column not in inputs.column_names and "text" in inputs.column_names:
            inputs = inputs.rename_column("text", self.text_column)
        require_columns(inputs, [self.text_column], "input")
        self.fill_mask_inputs = True
        return inputs.rename_column(self.text_column, "text") if self.text_column != "text" else inputs

    # ----- tokenizer and model ------------------------------------------------------------
    def build_tokenizer(self, raw: DatasetDict | None, model_path: str | None = None):
        model = self.config.model
        if model_path is None and model.name_or_path is None and model.tokenizer_name_or_path is None:
            self.tokenizer = self._train_or_reload_tokenizer(raw)
            self.trained_tokenizer = True
        else:
            self.tokenizer = load_tokenizer(tokenizer_source(model, model_path), model.revision)
        if self.tokenizer.mask_token is None or self.tokenizer.mask_token_id is None:
            raise ModelError(
                f"the tokenizer of {tokenizer_source(model, model_path)!r} has no mask token; masked-LM needs one "
                "(set model.tokenizer_name_or_path to a tokenizer with e.g. [MASK], or leave it unset to train one)"
            )
        return self.tokenizer

    def _train_or_reload_tokenizer(self, raw: DatasetDict | None):
        from accelerate.state import PartialState

        run_dir = Path(self.config.output_dir)
        resuming = bool(self.config.train.resume_from_checkpoint)
        # Other processes (and a resumed run) read the tokenizer the main process trained for this run.
        if (resuming or not PartialState().is_main_process) and (run_dir / "tokenizer.json").is_file():
            return load_tokenizer(str(run_dir))
        if raw is None:
            raise ModelError("no tokenizer: set model.name_or_path or model.tokenizer_name_or_path")
        architecture = self.config.model.architecture
        vocab_size = self.options.tokenizer_vocab_size or architecture.get("vocab_size", DEFAULT_VOCAB_SIZE)
        texts = self._unk_to_token(raw[self.config.data.train_split]["text"], "[UNK]")
        tokenizer = train_wordpiece_tokenizer(
            texts, vocab_size=vocab_size, lowercase=self.options.lowercase,
            min_frequency=self.options.tokenizer_min_frequency,
            model_max_length=architecture.get("max_position_embeddings", 512),
        )
        if len(tokenizer) < vocab_size:
            logger.warning("the corpus yields a WordPiece vocabulary of %d < %d asked; the model uses %d", len(tokenizer), vocab_size, len(tokenizer))
        if PartialState().is_main_process:
            run_dir.mkdir(parents=True, exist_ok=True)
            tokenizer.save_pretrained(run_dir)
        return tokenizer

    def _unk_to_token(self, texts: list[str], unk_token: str | None) -> list[str]:
        marker = self.options.corpus_unk_token
        if not marker or not unk_token or marker == unk_token:
            return list(texts)
        return [text.replace(marker, unk_token) for text in texts]

    def _auto_class(self):
        return AutoModelForPreTraining if self.options.next_sentence_prediction else AutoModelForMaskedLM

    def build_model(self, raw: DatasetDict | None, model_path: str | None = None):
        model_cfg = self.config.model
        if model_path is not None:
            return load_model(self._auto_class(), model_cfg, model_path=model_path)
        vocab = len(self.tokenizer)
        if model_cfg.name_or_path is None:
            architecture = dict(model_cfg.architecture)
            asked = architecture.get("vocab_size")
            if asked is not None and asked != vocab and not self.trained_tokenizer:
                raise ModelError(
                    f"model.architecture.vocab_size={asked} disagrees with the tokenizer "
                    f"{model_cfg.tokenizer_name_or_path!r}, which has {vocab} tokens; set it to {vocab} or leave it unset"
                )
            architecture.update(vocab_size=vocab, pad_token_id=self.tokenizer.pad_token_id)
            positions = architecture.get("max_position_embeddings", 512)
            if positions < self.config.data.max_seq_length:
                raise ModelError(
                    f"data.max_seq_length={self.config.data.max_seq_length} exceeds "
                    f"model.architecture.max_position_embeddings={positions}"
                )
            model = load_model(self._auto_class(), model_cfg.model_copy(update={"architecture": architecture}))
        else:
            model = load_model(self._auto_class(), model_cfg)
            if vocab > model.config.vocab_size:
                raise ModelError(
                    f"the tokenizer has {vocab} tokens but {model_cfg.name_or_path!r} embeds only "
                    f"{model.config.vocab_size}; use the checkpoint's own tokenizer or one of at most that size"
                )
            positions = getattr(model.config, "max_position_embeddings", None)
            if positions is not None and positions < self.config.data.max_seq_length:
                raise ModelError(f"data.max_seq_length={self.config.data.max_seq_length} exceeds the checkpoint's max_position_embeddings={positions}")
        self._check_tied(model)
        return model

    @staticmethod
    def _check_tied(model) -> None:
        """The (possibly new) decoder must share the input embedding matrix, as in BERT."""
        output, inputs = model.get_output_embeddings(), model.get_input_embeddings()
        if getattr(model.config, "tie_word_embeddings", True) and output is not None and output.weight is not inputs.weight:
            model.tie_weights()
            if output.weight is not inputs.weight:
                raise ModelError("the masked-LM decoder could not be tied to the input embeddings")

    # ----- features -----------------------------------------------------------------------
    def preprocess(self, examples: Dataset, *, train: bool) -> Dataset:
        tokenizer = self.tokenizer
        if self.fill_mask_inputs:
            return self._fill_mask_features(examples)
        texts = self._unk_to_token(examples["text"], tokenizer.unk_token)
        # verbose=False: rows longer than the model are expected here; packing or truncation follows.
        encoded = tokenizer(texts, add_special_tokens=False, verbose=False)
        token_rows = encoded["input_ids"]
        template = special_template(tokenizer)
        length = self.config.data.max_seq_length
        split = "train" if train else self.config.data.eval_split
        columns: dict[str, list] = {"input_ids": [], "token_type_ids": [], "attention_mask": [], "special_tokens_mask": [], "word_ids": []}
        if self.options.next_sentence_prediction:
            rng = np.random.default_rng([self.config.seed, 0 if train else 1])
            columns.pop("word_ids")
            columns["next_sentence_label"] = []
            for a, b, label in make_sentence_pairs(token_rows, length - template.pair_overhead, rng):
                ids, types, special = template.pair(a, b)
                for key, value in zip(("input_ids", "token_type_ids", "special_tokens_mask", "next_sentence_label"), (ids, types, special, label)):
                    columns[key].append(value)
                columns["attention_mask"].append([1] * len(ids))
            # Whole words are not tracked across pair cuts; grouping falls back to tokens.
        else:
            word_rows = number_words([encoded.word_ids(i) for i in range(len(texts))])
            content = length - template.single_overhead
            if self.options.packing:
                total = sum(len(row) for row in token_rows)
                if total < content:
                    raise DataError(
                        f"split {split!r} holds {total} tokens, fewer than one block of data.max_seq_length={length} "
                        f"({content} text tokens); add text, lower data.max_seq_length, or set mlm.packing=false"
                    )
                pieces = pack_blocks(token_rows, word_rows, content)
            else:
                pieces = [(ids[:content], words[:content]) for ids, words in zip(token_rows, word_rows) if ids]
            for ids, words in pieces:
                full, special = template.single(list(ids))
                columns["input_ids"].append(full)
                columns["special_tokens_mask"].append(special)
                columns["word_ids"].append([NO_WORD] * len(template.prefix) + list(words) + [NO_WORD] * len(template.suffix))
                columns["token_type_ids"].append([template.type_a] * len(full))
                columns["attention_mask"].append([1] * len(full))
        if not columns["input_ids"]:
            raise DataError(f"split {split!r} yields no examples (no tokens after cleaning)")
        if "token_type_ids" not in tokenizer.model_input_names:
            columns.pop("token_type_ids")
        if not train:
            self._fix_eval_masks(columns)
        return Dataset.from_dict(columns)

    def _fix_eval_masks(self, columns: dict[str, list]) -> None:
        """Draw every evaluation example's mask once, from (seed, index): evaluations then agree."""
        options, mask_id, pool = self.options, self.tokenizer.mask_token_id, random_token_ids(self.tokenizer)
        whole_words = options.whole_word_mask and "word_ids" in columns
        columns["labels"] = []
        for index, ids in enumerate(columns["input_ids"]):
            maskable = np.asarray([columns["special_tokens_mask"][index]]) == 0
            words = np.asarray([columns["word_ids"][index]]) if whole_words else None
            corrupted, labels = mask_tokens(
                np.asarray([ids]), maskable, words, rng=eval_masking_rng(self.config.seed, index),
                mlm_probability=options.mlm_probability, mask_replace_prob=options.mask_replace_prob,
                random_replace_prob=options.random_replace_prob, mask_token_id=mask_id, random_token_ids=pool,
            )
            columns["input_ids"][index] = corrupted[0].tolist()
            columns["labels"].append(labels[0].tolist())

    def _fill_mask_features(self, examples: Dataset) -> Dataset:
        tokenizer = self.tokenizer
        texts = [text.replace("[MASK]", tokenizer.mask_token) for text in examples["text"]]
        encoded = tokenizer(texts, truncation=True, max_length=self.config.data.max_seq_length)
        for line, ids in enumerate(encoded["input_ids"], start=1):
            if tokenizer.mask_token_id not in ids:
                raise DataError(f"input line {line} ({texts[line - 1][:60]!r}) holds no {tokenizer.mask_token} token (within data.max_seq_length)")
        return Dataset.from_dict({key: encoded[key] for key in encoded.keys()})

    def collator(self, *, train: bool):
        return MaskingCollator(self.tokenizer, self.options if train else None, self.config.seed)

    # ----- prediction and metrics ---------------------------------------------------------
    def predict_step(self, model, batch: dict[str, torch.Tensor]) -> dict[str, torch.Tensor]:
        batch = dict(batch)
        labels = batch.pop("labels", None)
        next_sentence = batch.pop("next_sentence_label", None)
        outputs = model(**batch)
        logits = _prediction_logits(outputs)
        if labels is None:
            return self._top_fillers(logits, batch["input_ids"])
        # Only masked positions are scored, and only per-example sums leave the step: the
        # full-vocabulary logits are never gathered.
        targets = labels != IGNORE_INDEX
        rows = targets.nonzero()[:, 0]
        scored = logits[targets].float()
        losses = F.cross_entropy(scored, labels[targets], reduction="none")
        hits = (scored.argmax(-1) == labels[targets]).float()
        size = labels.shape[0]
        result = {
            "masked_loss_sum": torch.zeros(size, device=logits.device).index_add_(0, rows, losses),
            "masked_tokens": targets.sum(-1),
            "masked_correct": torch.zeros(size, device=logits.device).index_add_(0, rows, hits),
        }
        if next_sentence is not None and hasattr(outputs, "seq_relationship_logits"):
            result["nsp_correct"] = (outputs.seq_relationship_logits.argmax(-1) == next_sentence).long()
        return result

    def _top_fillers(self, logits: torch.Tensor, input_ids: torch.Tensor) -> dict[str, torch.Tensor]:
        k = min(self.options.top_k, logits.shape[-1])
        at_mask = input_ids == self.tokenizer.mask_token_id
        top_ids = torch.full((*input_ids.shape, k), -1, dtype=torch.long, device=logits.device)
        top_scores = torch.zeros((*input_ids.shape, k), device=logits.device)
        scores, ids = logits[at_mask].float().softmax(-1).topk(k, dim=-1)
        top_ids[at_mask], top_scores[at_mask] = ids, scores
        return {"top_token_ids": top_ids, "top_scores": top_scores}

    def postprocess(self, outputs: dict[str, np.ndarray], features: Dataset, examples: Dataset) -> Any:
        if "top_token_ids" not in outputs:
            return outputs
        filled = []
        for row, input_ids in enumerate(features["input_ids"]):
            top_ids, top_scores = outputs["top_token_ids"][row], outputs["top_scores"][row]
            positions = [p for p in range(len(input_ids)) if top_ids[p, 0] >= 0]
            sequence = list(input_ids)
            masks = []
            for position in positions:
                sequence[position] = int(top_ids[position, 0])
                masks.append({
                    "position": position,
                    "predictions": [
                        {"token": self.tokenizer.convert_ids_to_tokens(int(i)), "token_id": int(i), "score": round(float(s), 6)}
                        for i, s in zip(top_ids[position], top_scores[position]) if i >= 0
                    ],
                })
            filled.append({"masks": masks, "sequence": self.tokenizer.decode(sequence, skip_special_tokens=True)})
        return filled

    def compute_metrics(self, predictions: dict[str, np.ndarray], examples: Dataset) -> dict[str, float]:
        metrics = masked_lm_metrics(predictions["masked_loss_sum"], predictions["masked_tokens"], predictions["masked_correct"])
        if "nsp_correct" in predictions:
            metrics["nsp_accuracy"] = float(np.mean(predictions["nsp_correct"]))
        return metrics

    def format_predictions(self, predictions: list[dict[str, Any]], examples: Dataset) -> list[dict[str, Any]]:
        return [{"text": text, **filled} for text, filled in zip(examples["text"], predictions)]

    def save_artifacts(self, predictions, examples: Dataset, run_dir: str) -> None:
        """The run directory (model, tokenizer, metrics) is the whole result of pretraining."""
