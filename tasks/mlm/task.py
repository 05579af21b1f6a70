"""The masked-LM task: :class:`MlmTask`, which the pipeline's train/evaluate/predict loop drives, and its metrics.

In:  a ``RunConfig`` with ``task: mlm`` and its ``mlm:`` options (:mod:`tasks.mlm.options`); a text corpus
     (plain-text files, a Hub text dataset, or jsonl/csv/parquet with a text column);
     ``model.name_or_path`` set means continued pretraining, unset a new model from ``model.architecture``.
Out: cleaned splits (:mod:`tasks.mlm.corpus`), a tokenizer (:mod:`tasks.mlm.tokenizer`), packed or
     per-row features (:mod:`tasks.mlm.examples`) with fixed evaluation masks (:mod:`tasks.mlm.masking`),
     an ``AutoModelForMaskedLM`` (``AutoModelForPreTraining`` with next-sentence prediction), metrics
     ``eval_perplexity``, ``eval_accuracy``, ``eval_loss`` (+ ``eval_nsp_accuracy``), and for
     ``bertpipe predict`` the top-k fillers of every mask token of each input line.
"""

from __future__ import annotations

import logging
from pathlib import Path
from typing import Any, ClassVar

import numpy as np
import torch
import torch.nn.functional as F
from datasets import Dataset, DatasetDict
from transformers import AutoModelForMaskedLM, AutoModelForPreTraining

from pipelines.config import ConfigError, DataConfig, RunConfig, TaskOptions
from pipelines.data import finalize_splits, load_raw, require_columns, require_text, split_where
from pipelines.errors import DataError
from pipelines.files import builder_for_files, read_inputs, skip_blank_lines
from pipelines.errors import ModelError, failures_named
from pipelines.modeling import load_model, load_tokenizer, tokenizer_source
from pipelines.task import TaskBase
from tasks.mlm.corpus import clean_rows, hold_out_documents, split_documents
from tasks.mlm.examples import NO_WORD, make_sentence_pairs, number_words, pack_blocks
from tasks.mlm.masking import IGNORE_INDEX, MaskingCollator, eval_masking_rng, mask_tokens, random_token_ids
from tasks.mlm.options import MlmOptions
from tasks.mlm.tokenizer import DEFAULT_VOCAB_SIZE, special_template, train_wordpiece_tokenizer

logger = logging.getLogger(__name__)


# ----- metrics --------------------------------------------------------------------------------
def masked_lm_metrics(loss_sums: np.ndarray, counts: np.ndarray, correct: np.ndarray) -> dict[str, float]:
    """Perplexity, loss and accuracy over all masked tokens of a split (token-weighted, not batch means)."""
    total = float(np.sum(counts, dtype=np.float64))
    if total == 0:
        raise DataError("the evaluation split has no masked tokens; it is too small to evaluate masked-LM")
    loss = float(np.sum(loss_sums, dtype=np.float64)) / total
    return {"loss": loss, "perplexity": float(np.exp(loss)), "accuracy": float(np.sum(correct, dtype=np.float64)) / total}


def _mark_special(ids: list[int], special: list[int], special_ids: set[int]) -> list[int]:
    return [1 if flag or token in special_ids else 0 for token, flag in zip(ids, special)]


def _prediction_logits(outputs) -> torch.Tensor:
    return outputs.prediction_logits if hasattr(outputs, "prediction_logits") else outputs.logits


def _no_text(data: DataConfig, split: str, rows: int) -> DataError:
    held = "its only row is" if rows == 1 else f"all {rows} rows are"
    return DataError(f"{split_where(data, split)}: {held} empty (or headings); the corpus holds no text")


# ----- the task -------------------------------------------------------------------------------
def _check_words_are_split(texts: list[str], word_ids: list[list[int | None]], tokenizer) -> None:
    """A ConfigError when the tokenizer's ``word_ids()`` holds a row of several words as one word: a tokenizer whose
    normalizer turns spaces into ``▁`` before its pre-tokenizer (Gemma's, Llama 2's) numbers every token of a row 0,
    and whole-word masking masked whole rows or nothing, without a word."""
    for text, ids in zip(texts, word_ids):
        if len(text.split()) > 1 and len({word for word in ids if word is not None}) == 1:
            raise ConfigError(
                f"mlm.whole_word_mask=true: the tokenizer {getattr(tokenizer, 'name_or_path', '')!r} does not split "
                f"words before cutting pieces (word_ids() holds {text[:40]!r} as one word), so a whole word would be a "
                "whole row; set mlm.whole_word_mask=false"
            )


class MlmTask(TaskBase):
    name: ClassVar[str] = "mlm"
    Options: ClassVar[type[TaskOptions]] = MlmOptions
    pipeline_tag: ClassVar[str] = "fill-mask"
    output_pad_values: ClassVar[dict[str, float]] = {"top_token_ids": -1, "top_scores": 0.0}
    higher_is_better: ClassVar[dict[str, bool]] = {"perplexity": False, "loss": False}
    # With next-sentence prediction the run is an AutoModelForPreTraining; AutoModelForMaskedLM loads it without that head.
    auto_model_class: ClassVar[type] = AutoModelForMaskedLM
    # peft has no fill-mask task type: a plain PeftModel, with the MLM head kept trainable through modules_to_save.
    peft_task_type: ClassVar[str | None] = None
    onnx_outputs: ClassVar[tuple[str, ...]] = ()
    # transformers' fill-mask pipeline does not truncate unless told to; predict cuts at data.max_seq_length.
    card_pipeline_input: ClassVar[str | None] = (
        'f"Paris is the {predictor.tokenizer.mask_token} of France.", '
        'tokenizer_kwargs={"truncation": True, "max_length": {max_seq_length}}'
    )
    card_model_usage: ClassVar[str | None] = None
    packable: ClassVar[bool] = False  # mlm.packing already fills whole blocks from the token stream
    run_files: ClassVar[tuple[str, ...]] = ()

    def __init__(self, config: RunConfig) -> None:
        super().__init__(config)
        self.options: MlmOptions = config.task_options
        self._input_places: list[str] | None = None  # where each predict input sits in its file (load_inputs)
        self.trained_tokenizer = False

    @property
    def text_column(self) -> str:
        return self.config.data.text_column or "text"

    # ----- data ---------------------------------------------------------------------------
    def load(self, *, include_train: bool = True) -> DatasetDict:
        data = self.config.data
        raw = DatasetDict(load_raw(data, text_columns=[self.text_column]))
        for split_name, split in raw.items():
            require_columns(split, [self.text_column], split_where(data, split_name))
            # Numbers (or a mix) in the text column would reach str.strip below, and 0 or false be dropped as empty.
            require_text(split, [self.text_column], split_where(data, split_name), keys="data.text_column")
        rows = {name: list(split[self.text_column]) for name, split in raw.items()}
        # Before the hold-out, so that the message counts the file's rows and names it.
        for name, split_rows in rows.items():
            if split_rows and not clean_rows(split_rows, drop_headings=self.options.drop_headings):
                raise _no_text(data, name, len(split_rows))
        held_out = data.eval_split not in rows and bool(data.validation_fraction) and data.train_split in rows
        if held_out:
            corpus = rows[data.train_split]
            train_rows, held_rows = hold_out_documents(split_documents(corpus), data.validation_fraction, self.config.seed)
            rows[data.train_split] = [corpus[i] for i in train_rows]
            rows[data.eval_split] = [corpus[i] for i in held_rows]
        cleaned = DatasetDict()
        for name, split_rows in rows.items():
            kept = clean_rows(split_rows, drop_headings=self.options.drop_headings)
            if len(kept) < len(split_rows):
                logger.info("split %r: dropped %d empty/heading rows of %d", name, len(split_rows) - len(kept), len(split_rows))
            if split_rows and not kept:  # one side of the hold-out got only documents that are a heading alone
                raise _no_text(data, name, len(split_rows))
            cleaned[name] = Dataset.from_dict({"text": kept})
        # held_out: data.validation_fraction was used here (whole documents), not made unused by a split of the data's own.
        return finalize_splits(cleaned, data, self.config.seed, need_train=include_train, held_out=held_out)

    def load_inputs(self, path: str) -> Dataset:
        read = read_inputs(path, encoding=self.config.data.encoding, text_columns=[self.text_column, "text"])
        inputs = skip_blank_lines(read, path)
        # Where each example sits in the file, for an error about one: a txt file's line (its blank lines are
        # skipped above, so the example's index is not its line), else its row.
        if builder_for_files({"input": str(path)})[0] == "text":
            self._input_places = [f"--input {path}, line {number}" for number, text in enumerate(read["text"], start=1) if text.strip()]
        else:
            self._input_places = [f"--input {path}, row {number} (rows count from 1)" for number in range(1, len(inputs) + 1)]
        if self.text_column not in inputs.column_names and "text" in inputs.column_names:
            inputs = inputs.rename_column("text", self.text_column)
        require_columns(inputs, [self.text_column], f"--input {path}")
        require_text(inputs, [self.text_column], f"--input {path}", keys="data.text_column")
        if self.text_column == "text":
            return inputs
        # The configured column is the text; a "text" column beside it is some other field of the row.
        return inputs.remove_columns([name for name in ["text"] if name in inputs.column_names]).rename_column(self.text_column, "text")

    # ----- tokenizer and model ------------------------------------------------------------
    def build_tokenizer(self, raw: DatasetDict | None, model_path: str | None = None):
        model = self.config.model
        if model_path is None and model.name_or_path is None and model.tokenizer_name_or_path is None:
            self.tokenizer = self._train_or_reload_tokenizer(raw)
            self.trained_tokenizer = True
        else:
            super().build_tokenizer(raw, model_path)
        if self.tokenizer.mask_token is None or self.tokenizer.mask_token_id is None:
            raise ModelError(
                f"the tokenizer of {tokenizer_source(model, model_path)!r} has no mask token; masked-LM needs one "
                "(set model.tokenizer_name_or_path to a tokenizer with e.g. [MASK], or leave it unset to train one)"
            )
        return self.tokenizer

    def _train_or_reload_tokenizer(self, raw: DatasetDict | None):
        from accelerate.state import PartialState

        run_dir = Path(self.config.output_dir)
        if self.config.train.resume_from_checkpoint:
            # Retraining is no way back: tokenizers' WordPiece trainer breaks frequency ties in hash order,
            # so the same corpus can give another vocabulary than the one the checkpoint was trained with.
            # The loop saved the trained one in output_dir when the run started.
            if not (run_dir / "tokenizer.json").is_file():
                raise ModelError(
                    f"train.resume_from_checkpoint: {run_dir} holds no tokenizer.json, the tokenizer this run trained; "
                    "the checkpoint cannot be resumed with another one. Start a new run (overwrite=true)."
                )
            return load_tokenizer(str(run_dir))
        state = PartialState()
        if not state.is_main_process:
            # main_process_first: the main process has trained and shared it by now.
            return load_tokenizer(str(self._shared_tokenizer_dir()))
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
        # Not saved into output_dir here: the run may still be refused (model, sequence lengths,
        # checkpoint) and a refused command leaves an old run (overwrite=true) and a new folder as they
        # were. The loop saves it there when the run starts; the other processes read this copy.
        if state.num_processes > 1:
            shared = self._shared_tokenizer_dir()
            with failures_named(ModelError, f"cannot share the trained tokenizer with the other processes through {shared}"):
                tokenizer.save_pretrained(shared)
        return tokenizer

    def _shared_tokenizer_dir(self) -> Path:
        """Where the main process of a multi-process run leaves the tokenizer it trained for the others: a
        cache folder named by output_dir and the whole config, so two runs never share one."""
        import hashlib
        import json

        from huggingface_hub import constants

        key = json.dumps([str(Path(self.config.output_dir).absolute()), self.config.to_yaml_dict()], sort_keys=True, default=str)
        return Path(constants.HF_HOME) / "bertpipe" / "mlm-tokenizers" / hashlib.sha256(key.encode()).hexdigest()[:16]

    def _unk_to_token(self, texts: list[str], unk_token: str | None) -> list[str]:
        marker = self.options.corpus_unk_token
        if not marker or not unk_token or marker == unk_token:
            return list(texts)
        return [text.replace(marker, unk_token) for text in texts]

    def _check_one_update_per_batch(self) -> None:
        """Next-sentence prediction trains on one batch per update on one process, or not at all.

        BertForPreTraining's loss is a mean over masked tokens plus a mean over sentence pairs, and the loop makes a
        window of batches (accumulated, or one per process) the update of one batch of all of them by weighting each
        batch's loss by its masked tokens: the pairs' term was weighted by them too, an update one big batch does not
        make (gradients 1.3% off on a tiny model), without a word.
        """
        from accelerate.state import PartialState

        if not self.options.next_sentence_prediction:
            return
        processes, accumulation = PartialState().num_processes, self.config.train.gradient_accumulation_steps
        if accumulation > 1 or processes > 1:
            raise ConfigError(
                f"mlm.next_sentence_prediction=true with train.gradient_accumulation_steps={accumulation} on {processes} "
                "process(es): its loss adds a mean over sentence pairs to the masked tokens', which an update over several "
                "batches cannot weigh as one batch; give one batch per update on one process (or turn it off)"
            )

    def _auto_class(self):
        return AutoModelForPreTraining if self.options.next_sentence_prediction else AutoModelForMaskedLM

    def build_model(self, raw: DatasetDict | None, model_path: str | None = None):
        model_cfg = self.config.model
        if model_path is not None:
            return load_model(self._auto_class(), model_cfg, model_path=model_path)
        self._check_one_update_per_batch()
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
    def preprocess(self, examples: Dataset, *, train: bool, inputs: bool = False) -> Dataset:
        """Corpus rows -> masked (eval) or maskable (train) blocks; ``inputs`` rows -> their own [MASK]s to fill."""
        tokenizer = self.tokenizer
        if inputs:
            return self._fill_mask_features(examples)
        texts = self._unk_to_token(examples["text"], tokenizer.unk_token)
        # verbose=False: rows longer than the model are expected here; packing or truncation follows.
        encoded = tokenizer(texts, add_special_tokens=False, verbose=False)
        token_rows = encoded["input_ids"]
        template = special_template(tokenizer)
        # Special tokens inside the text (WikiText's <unk> read as the unknown token, a literal mask token)
        # are never targets either: the template alone marks only the frame around the segments.
        special_ids = set(tokenizer.all_special_ids)
        length = self.config.data.max_seq_length
        split = self.config.data.train_split if train else self.config.data.eval_split
        columns: dict[str, list] = {"input_ids": [], "token_type_ids": [], "attention_mask": [], "special_tokens_mask": [], "word_ids": []}
        word_ids = [encoded.word_ids(i) for i in range(len(texts))]
        if self.options.whole_word_mask:
            _check_words_are_split(texts, word_ids, tokenizer)
        word_rows = number_words(word_ids)
        if self.options.next_sentence_prediction:
            rng = np.random.default_rng([self.config.seed, 0 if train else 1])
            columns["next_sentence_label"] = []
            # Pairs are cut from (token, word number) items, so each token keeps its word through the cuts,
            # the trimming and the random "not next" stretch (the same draws as from the tokens alone).
            items = [list(zip(ids, words)) for ids, words in zip(token_rows, word_rows)]
            for a, b, label in make_sentence_pairs(items, length - template.pair_overhead, rng):
                ids, types, special = template.pair([t for t, _ in a], [t for t, _ in b])
                special = _mark_special(ids, special, special_ids)
                for key, value in zip(("input_ids", "token_type_ids", "special_tokens_mask", "next_sentence_label"), (ids, types, special, label)):
                    columns[key].append(value)
                columns["attention_mask"].append([1] * len(ids))
                columns["word_ids"].append(
                    [NO_WORD] * len(template.prefix) + [w for _, w in a] + [NO_WORD] * len(template.middle)
                    + [w for _, w in b] + [NO_WORD] * len(template.suffix)
                )
        else:
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
                special = _mark_special(full, special, special_ids)
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
        whole_words = options.whole_word_mask
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
        places = self._input_places
        if places is None or len(places) != len(texts):  # examples that did not come from load_inputs
            places = [f"input example {number}" for number in range(1, len(texts) + 1)]
        for index, ids in enumerate(encoded["input_ids"]):
            if tokenizer.mask_token_id not in ids:
                raise DataError(f"{places[index]} ({texts[index][:60]!r}) holds no {tokenizer.mask_token} token (within data.max_seq_length)")
        return Dataset.from_dict({key: encoded[key] for key in encoded.keys()})

    def collator(self, *, train: bool):
        return MaskingCollator(self.tokenizer, self.options if train else None, self.config.seed)

    # ----- prediction and metrics ---------------------------------------------------------
    def predict_step(self, model, batch: dict[str, torch.Tensor]) -> dict[str, torch.Tensor]:
        batch = dict(batch)
        labels = batch.pop("labels", None)
        next_sentence = batch.pop("next_sentence_label", None)
        if labels is None:
            # Fill-mask: only the mask positions are read. Handed them as labels, a listed family computes its
            # head there alone and returns their logits row by row (its loss against the mask token is unused).
            at_mask = batch["input_ids"] == self.tokenizer.mask_token_id
            logits = _prediction_logits(model(**batch, labels=torch.where(at_mask, batch["input_ids"], IGNORE_INDEX)))
            return self._top_fillers(logits if logits.dim() == 2 else logits[at_mask], at_mask)
        # Only masked positions are scored, and only per-example sums leave the step: the
        # full-vocabulary logits are never gathered. Given the labels, a listed family's model computes
        # its head at the labelled positions only and returns their logits, row by row
        # (pipelines/labelled_positions.py); any other returns every position's.
        outputs = model(**batch, labels=labels)
        logits = _prediction_logits(outputs)
        targets = labels != IGNORE_INDEX
        rows = targets.nonzero()[:, 0]
        scored = (logits if logits.dim() == 2 else logits[targets]).float()
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

    def _top_fillers(self, mask_logits: torch.Tensor, at_mask: torch.Tensor) -> dict[str, torch.Tensor]:
        """The top-k fillers of each mask position, from its logits (one row per mask position, row-major)."""
        k = min(self.options.top_k, mask_logits.shape[-1])
        top_ids = torch.full((*at_mask.shape, k), -1, dtype=torch.long, device=mask_logits.device)
        top_scores = torch.zeros((*at_mask.shape, k), device=mask_logits.device)
        scores, ids = mask_logits.float().softmax(-1).topk(k, dim=-1)
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

    def metric_names(self) -> tuple[str, ...]:
        return ("loss", "perplexity", "accuracy", *(("nsp_accuracy",) if self.options.next_sentence_prediction else ()))

    def input_columns(self) -> tuple[str, ...]:
        return (self.text_column, "text")

    def format_predictions(self, predictions: list[dict[str, Any]], examples: Dataset) -> list[dict[str, Any]]:
        return [{"text": text, **filled} for text, filled in zip(examples["text"], predictions)]

    def save_artifacts(self, predictions, examples: Dataset, run_dir: str) -> None:
        """The run directory (model, tokenizer, metrics) is the whole result of pretraining."""
        if self.trained_tokenizer:
            import shutil

            # Every process read it long ago, and the run holds its own copy.
            shutil.rmtree(self._shared_tokenizer_dir(), ignore_errors=True)
