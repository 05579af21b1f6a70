"""The translation task: what bertpipe's loop calls, from loading pairs to scoring and saving generations.

In:  a ``RunConfig`` whose ``task_options`` are ``TranslationOptions``; the loop hands it raw splits, features,
     batches and the model's generations.
Out: pairs as ``source_lang``/``target_lang`` columns (empty pairs refused or skipped; predict inputs keep
     their rows, one output row per input row), token features (a warning says how many sources or training
     targets were cut to their length limit), the collators, ``generate()`` outputs per batch, hypotheses (a
     warning says how many stopped at ``max_new_tokens``), metrics ``bleu``/``chrf`` (sacreBLEU) and
     ``gen_len``, prediction rows, and ``generations.jsonl`` + ``sacrebleu_signature.json`` in the run directory.
     Which model and tokenizer it builds is :class:`tasks.translation.build.TranslationModelBuilding`'s part.
"""

from __future__ import annotations

import copy
import logging
from pathlib import Path
from typing import Any, ClassVar

import numpy as np
import torch
from datasets import Dataset, DatasetDict
from transformers import AutoModelForSeq2SeqLM, DataCollatorForSeq2Seq, DataCollatorWithPadding, PreTrainedModel

from pipelines.atomic_writes import write_json, write_text_atomically
from pipelines.config import RunConfig, TaskOptions
from pipelines.data import KeyedOnCode, finalize_splits, load_raw, require_text, row_list, split_where
from pipelines.errors import DataError
from pipelines.files import read_inputs, skip_blank_lines
from pipelines.metrics import load_metric
from pipelines.task import TaskBase
from tasks.translation.build import TranslationModelBuilding
from tasks.translation.data import _tokenize, empty_rows, to_language_columns
from tasks.translation.generation import cut_generations, decode, generated_lengths
from tasks.translation.options import GENERATED_KEY, GENERATIONS_FILE, SIGNATURE_FILE, TranslationOptions

logger = logging.getLogger(__name__)


class TranslationTask(TranslationModelBuilding, TaskBase):
    name: ClassVar[str] = "translation"
    Options: ClassVar[type[TaskOptions]] = TranslationOptions
    pipeline_tag: ClassVar[str] = "translation"
    output_pad_values: dict[str, float] = {GENERATED_KEY: 0}
    higher_is_better: ClassVar[dict[str, bool]] = {"bleu": True, "chrf": True}
    auto_model_class: ClassVar[type] = AutoModelForSeq2SeqLM
    peft_task_type: ClassVar[str | None] = "SEQ_2_SEQ_LM"
    onnx_outputs: ClassVar[tuple[str, ...]] = ()  # generation is not exported
    # transformers 5 has no translation pipeline (bertpipe registers its own, tasks.translation.pipeline).
    card_pipeline_input: ClassVar[str | None] = None
    # What predict does: the run's source prefix and truncation length (both on its config), generate()
    # with the beam settings saved in its generation_config, decoded as predict decodes.
    card_model_usage: ClassVar[str | None] = """sources = ['A man is riding a bicycle.']
inputs = tokenizer([(model.config.prefix or "") + text for text in sources], return_tensors="pt", truncation=True,
                   max_length=model.config.max_source_length, return_token_type_ids=False)
generated = model.generate(input_ids=inputs["input_ids"], attention_mask=inputs["attention_mask"])
backend = getattr(tokenizer, "backend_tokenizer", None)  # spaces before punctuation are cleaned up for WordPiece only
cleanup = backend is not None and type(backend.model).__name__ == "WordPiece"
print([text.strip() for text in tokenizer.batch_decode(generated, skip_special_tokens=True, clean_up_tokenization_spaces=cleanup)])"""
    card_sample_sources: ClassVar[dict[str, str]] = {
        "en": "A man is riding a bicycle.", "de": "Ein Mann fährt Fahrrad.", "fr": "Un homme fait du vélo.",
        "es": "Un hombre anda en bicicleta.", "ro": "Un bărbat merge cu bicicleta.",
    }
    packable: ClassVar[bool] = False  # encoder-decoder batches
    run_files: ClassVar[tuple[str, ...]] = (GENERATIONS_FILE, SIGNATURE_FILE)

    def __init__(self, config: RunConfig) -> None:
        super().__init__(config)
        self.options: TranslationOptions = config.task_options
        self.model: PreTrainedModel | None = None
        self.output_pad_values = dict(type(self).output_pad_values)
        self.warm_start: bool | None = None
        self.checkpoint_decoder_start: int | None = None
        self.source_prefix = self.options.source_prefix or ""
        sample = self.card_sample_sources.get(self.options.source_lang.split("_")[0].lower(), f"(a {self.options.source_lang} sentence)")
        self.card_model_usage = type(self).card_model_usage.replace(repr(self.card_sample_sources["en"]), repr(sample), 1)
        self.lowercase: bool = False
        self.signatures: dict[str, str] = {}
        self._metrics: dict[str, Any] = {}
        self._input_where = "--input"  # load_inputs names the file

    # ----- data -------------------------------------------------------------------------
    def load(self, *, include_train: bool = True) -> DatasetDict:
        data = self.config.data
        raw = load_raw(data, text_columns=[self.options.source_lang, self.options.target_lang])
        raw = DatasetDict({name: self._pairs(split, name) for name, split in raw.items()})
        return finalize_splits(raw, data, self.config.seed, need_train=include_train)

    def _pairs(self, split: Dataset, split_name: str) -> Dataset:
        """Any supported layout -> columns ``source_lang`` and ``target_lang`` (text), empty pairs handled."""
        src, tgt = self.options.source_lang, self.options.target_lang
        split = to_language_columns(split, [src, tgt], self.options.translation_column, split_name)
        require_text(split, [src, tgt], split_where(self.config.data, split_name), keys="translation.source_lang / translation.target_lang")
        return self._handle_empty(split, [src, tgt], f"split {split_name!r}")

    def _handle_empty(self, split: Dataset, columns: list[str], where: str, *, inputs: bool = False) -> Dataset:
        """Rows with an empty source (or target): an error naming them, or with empty_lines=skip dropped from a
        split; predict inputs keep them (translated as "", see postprocess) so that output row i is input row i."""
        empty = empty_rows(split, columns)
        if not empty:
            return split
        named = f"{len(empty)} row(s) with an empty {' or '.join(repr(c) for c in columns)} (rows {row_list(empty, 10)}, counting from 1)"
        if self.options.empty_lines == "error":
            action = "give them an empty translation" if inputs else "drop them"
            raise DataError(f"{where}: {named}; set translation.empty_lines=skip to {action}")
        if inputs:
            logger.warning("%s: %s are not translated; their translation_text is empty", where, named)
            return split
        logger.warning("%s: skipping %s", where, named)
        drop = set(empty)
        return split.select([row for row in range(len(split)) if row not in drop])

    def load_inputs(self, path: str) -> Dataset:
        src = self.options.source_lang
        inputs = skip_blank_lines(read_inputs(path, encoding=self.config.data.encoding, text_columns=[self.options.source_lang, "text"]), path)
        # The one column the sources come from (input_columns): another, e.g. a `text` beside the source language's,
        # is the caller's own and goes to the output.
        self._source_column = src
        if src not in inputs.column_names:
            if self.options.translation_column in inputs.column_names:
                self._source_column = self.options.translation_column
                inputs = to_language_columns(inputs, [src], self.options.translation_column, "input")
            elif "text" in inputs.column_names:
                self._source_column = "text"
                inputs = inputs.rename_column("text", src)
            else:
                raise DataError(
                    f"input file {path} has no {src!r} field (the source language), no "
                    f"{self.options.translation_column!r} dict and no 'text' field; columns: {inputs.column_names}"
                )
        self._input_where = f"--input {path}"
        require_text(inputs, [src], self._input_where, keys="translation.source_lang / translation.target_lang")
        return self._handle_empty(inputs, [src], self._input_where, inputs=True)

    # ----- features -----------------------------------------------------------------------
    def preprocess(self, examples: Dataset, *, train: bool, inputs: bool = False) -> Dataset:
        src, tgt = self.options.source_lang, self.options.target_lang
        # A fine-tuned BERT2BERT given as model.name_or_path is a seq2seq checkpoint whose decoder start is
        # still [CLS]: the rule is the decoder start, not how the run began.
        decoder_start = self._special_ids()["decoder_start_token_id"] if self.warm_start else self.checkpoint_decoder_start
        features = examples.map(
            KeyedOnCode(_tokenize), batched=True, remove_columns=examples.column_names,
            num_proc=self.config.data.preprocessing_num_workers,
            fn_kwargs={
                "tokenizer": self.tokenizer, "source_column": src,
                # Inputs to predict may hold references (a test set), even missing ones or ones longer than the
                # decoder's positions: predict never reads them, so they are not tokenised or checked.
                "target_column": tgt if tgt in examples.column_names and not inputs else None,
                "prefix": self.source_prefix, "max_source_length": self.config.data.max_seq_length,
                "max_target_length": self.options.max_target_length, "decoder_start_token_id": decoder_start,
            },
            desc="tokenising",
        )
        split = self.config.data.train_split if train else self.config.data.eval_split
        self._warn_of_cut_texts(features, self._input_where if inputs else f"split {split!r}", train=train, inputs=inputs)
        return features.remove_columns([column for column in ("source_length", "target_length") if column in features.column_names])

    def _warn_of_cut_texts(self, features: Dataset, where: str, *, train: bool, inputs: bool) -> None:
        """Truncation is silent in the tokenizer: a cut source is translated without its end, a cut training
        target teaches the model to stop there. Say so once per split or input file, with the longest length."""
        checks = [("source_length", "source(s)", self.config.data.max_seq_length, "data.max_seq_length",
                   "their translations leave the rest out")]
        if train:
            checks.append(("target_length", "target(s)", self.options.max_target_length, "translation.max_target_length",
                           "the model learns to end translations early"))
        for column, noun, limit, key, effect in checks:
            lengths = features.with_format("arrow")[column].to_numpy()
            cut = np.flatnonzero(lengths > limit).tolist()
            if not cut:
                continue
            rows = f" (rows {row_list(cut)}, counting from 1)" if inputs else ""
            logger.warning(
                "%s: %d of %d %s%s are longer than %s=%d tokens (the longest has %d) and are cut there, so %s; raise %s",
                where, len(cut), len(lengths), noun, rows, key, limit, int(lengths.max()), effect, key,
            )

    def collator(self, *, train: bool):
        if train:
            # With the model it also builds decoder_input_ids (labels shifted right behind the decoder start).
            # It pads labels on the tokenizer's padding side: on the left, the decoder would read pad tokens
            # between its start and the first word of every shorter target (unmasked: the decoder gets no
            # attention mask), which generation never shows it. A right-padding copy; the run's own stays as is.
            tokenizer = copy.copy(self.tokenizer)
            tokenizer.padding_side = "right"
            return DataCollatorForSeq2Seq(tokenizer, model=self.model, label_pad_token_id=-100)
        padding = DataCollatorWithPadding(self.tokenizer)

        def generation_inputs(features: list[dict[str, Any]]) -> dict[str, torch.Tensor]:
            # Evaluation generates from the source alone; references are compared as text.
            return padding([{k: v for k, v in f.items() if k != "labels"} for f in features])

        return generation_inputs

    def predict_step(self, model, batch: dict[str, torch.Tensor]) -> dict[str, torch.Tensor]:
        generator = getattr(model, "module", model)
        generated = generator.generate(input_ids=batch["input_ids"], attention_mask=batch["attention_mask"])
        return {GENERATED_KEY: generated}

    def postprocess(self, outputs: dict[str, np.ndarray], features: Dataset, examples: Dataset) -> dict[str, Any]:
        generated = outputs[GENERATED_KEY]
        generation = self.model.generation_config if self.model is not None else None
        eos = generation.eos_token_id if generation is not None else self.tokenizer.eos_token_id
        gen_lens = generated_lengths(generated, eos, self.tokenizer.pad_token_id)
        hypotheses = decode(self.tokenizer, generated)
        # Predict input rows without a source stay in place (empty_lines=skip): there was nothing to translate.
        empty = empty_rows(examples, [self.options.source_lang])
        for row in empty:
            hypotheses[row] = ""
        if generation is not None and generation.max_new_tokens:
            cut = cut_generations(gen_lens, generated, eos, generation.max_new_tokens, generation.forced_eos_token_id)
            cut[empty] = False
            if cut.any():
                logger.warning(
                    "%d of %d translation(s) (rows %s, counting from 1, in output order) reached translation.max_new_tokens=%d "
                    "without ending and are cut there; raise translation.max_new_tokens",
                    int(cut.sum()), len(cut), row_list(np.flatnonzero(cut).tolist()), generation.max_new_tokens,
                )
        return {"hypotheses": hypotheses, "gen_lens": gen_lens}

    def _metric(self, name: str):
        if name not in self._metrics:
            self._metrics[name] = load_metric(name)
        return self._metrics[name]

    def metric_names(self) -> tuple[str, ...]:
        return ("bleu", "chrf", "gen_len", "bleu_lowercased")

    def compute_metrics(self, predictions: dict[str, Any], examples: Dataset) -> dict[str, float]:
        references = [[text] for text in examples[self.options.target_lang]]
        hypotheses = predictions["hypotheses"]
        bleu = self._metric("sacrebleu").compute(
            predictions=hypotheses, references=references, tokenize=self.options.bleu_tokenize, lowercase=self.lowercase
        )
        chrf = self._metric("chrf").compute(predictions=hypotheses, references=references, lowercase=self.lowercase)
        self.signatures = {"bleu": bleu["signature"], "chrf": chrf["signature"]}
        return {
            "bleu": bleu["score"],
            "chrf": chrf["score"],
            "gen_len": float(np.mean(predictions["gen_lens"])) if len(hypotheses) else 0.0,
            # metrics.json holds numbers only; the full sacreBLEU signatures go to sacrebleu_signature.json.
            "bleu_lowercased": float(self.lowercase),
        }

    def input_columns(self) -> tuple[str, ...]:
        read = getattr(self, "_source_column", None)  # set by load_inputs
        return (read,) if read is not None else (self.options.source_lang, self.options.translation_column, "text")

    def format_predictions(self, predictions: dict[str, Any], examples: Dataset) -> list[dict[str, Any]]:
        sources = examples[self.options.source_lang]
        return [{"source": source, "translation_text": hypothesis} for source, hypothesis in zip(sources, predictions["hypotheses"])]

    def save_artifacts(self, predictions: dict[str, Any], examples: Dataset, run_dir: str) -> None:
        """``generations.jsonl``: source, reference, hypothesis per eval pair; the sacreBLEU signatures."""
        import json

        sources = examples[self.options.source_lang]
        references = examples[self.options.target_lang]
        write_text_atomically(Path(run_dir) / GENERATIONS_FILE, "".join(
            json.dumps({"source": source, "reference": reference, "hypothesis": hypothesis}, ensure_ascii=False) + "\n"
            for source, reference, hypothesis in zip(sources, references, predictions["hypotheses"])
        ))
        if self.signatures:
            write_json(Path(run_dir) / SIGNATURE_FILE, {**self.signatures, "lowercase": self.lowercase, "tokenize": self.options.bleu_tokenize})
