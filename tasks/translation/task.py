"""The translation task: what bertpipe's loop calls, from loading pairs to scoring and saving generations.

In:  a ``RunConfig`` whose ``task_options`` are ``TranslationOptions``; the loop hands it raw splits, features,
     batches and the model's generations.
Out: pairs as ``source_lang``/``target_lang`` columns (empty pairs refused or skipped), token features, the
     collators, ``generate()`` outputs per batch, hypotheses, metrics ``bleu``/``chrf`` (sacreBLEU) and
     ``gen_len``, prediction rows, and ``generations.jsonl`` + ``sacrebleu_signature.json`` in the run directory.
     Which model and tokenizer it builds is :class:`tasks.translation.build.TranslationModelBuilding`'s part.
"""

from __future__ import annotations

import logging
from pathlib import Path
from typing import Any, ClassVar

import numpy as np
import torch
from datasets import Dataset, DatasetDict
from transformers import AutoModelForSeq2SeqLM, DataCollatorForSeq2Seq, DataCollatorWithPadding, PreTrainedModel

from pipelines.config import RunConfig, TaskOptions
from pipelines.data import DataError, finalize_splits, load_raw, read_inputs, skip_blank_lines, split_source
from pipelines.metrics import load_metric
from pipelines.outputs import write_json
from pipelines.task import TaskBase
from tasks.translation.build import TranslationModelBuilding
from tasks.translation.data import _tokenize, empty_rows, require_language_text, to_language_columns
from tasks.translation.generation import decode, generated_lengths
from tasks.translation.options import GENERATED_KEY, GENERATIONS_FILE, SIGNATURE_FILE, TranslationOptions

logger = logging.getLogger(__name__)


class TranslationTask(TranslationModelBuilding, TaskBase):
    name: ClassVar[str] = "translation"
    Options: ClassVar[type[TaskOptions]] = TranslationOptions
    pipeline_tag: ClassVar[str] = "translation"
    output_pad_values: dict[str, float] = {GENERATED_KEY: 0}
    higher_is_better: ClassVar[dict[str, bool]] = {"bleu": True, "chrf": True, "loss": False}
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
print([text.strip() for text in tokenizer.batch_decode(generated, skip_special_tokens=True, clean_up_tokenization_spaces=True)])"""
    card_sample_sources: ClassVar[dict[str, str]] = {
        "en": "A man is riding a bicycle.", "de": "Ein Mann fährt Fahrrad.", "fr": "Un homme fait du vélo.",
        "es": "Un hombre anda en bicicleta.", "ro": "Un bărbat merge cu bicicleta.",
    }
    packable: ClassVar[bool] = False  # encoder-decoder batches

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
        require_language_text(split, [src, tgt], f"split {split_name!r} ({split_source(self.config.data, split_name)})")
        return self._handle_empty(split, [src, tgt], split_name)

    def _handle_empty(self, split: Dataset, columns: list[str], split_name: str) -> Dataset:
        empty = empty_rows(split, columns)
        if not empty:
            return split
        shown = ", ".join(str(row) for row in empty[:10]) + (" ..." if len(empty) > 10 else "")
        if self.options.empty_lines == "error":
            raise DataError(
                f"split {split_name!r}: {len(empty)} row(s) have an empty {' or '.join(repr(c) for c in columns)} "
                f"(rows {shown}, counting from 0); set translation.empty_lines=skip to drop them"
            )
        logger.warning("split %r: skipping %d row(s) with an empty %s (rows %s)", split_name, len(empty), "/".join(columns), shown)
        drop = set(empty)
        return split.select([row for row in range(len(split)) if row not in drop])

    def load_inputs(self, path: str) -> Dataset:
        src = self.options.source_lang
        inputs = skip_blank_lines(read_inputs(path, encoding=self.config.data.encoding, text_columns=[self.options.source_lang, "text"]), path)
        if src not in inputs.column_names:
            if self.options.translation_column in inputs.column_names:
                inputs = to_language_columns(inputs, [src], self.options.translation_column, "input")
            elif "text" in inputs.column_names:
                inputs = inputs.rename_column("text", src)
            else:
                raise DataError(
                    f"input file {path} has no {src!r} field (the source language), no "
                    f"{self.options.translation_column!r} dict and no 'text' field; columns: {inputs.column_names}"
                )
        require_language_text(inputs, [src], f"--input {path}")
        return self._handle_empty(inputs, [src], f"input {path}")

    # ----- features -----------------------------------------------------------------------
    def preprocess(self, examples: Dataset, *, train: bool, inputs: bool = False) -> Dataset:
        src, tgt = self.options.source_lang, self.options.target_lang
        # A fine-tuned BERT2BERT given as model.name_or_path is a seq2seq checkpoint whose decoder start is
        # still [CLS]: the rule is the decoder start, not how the run began.
        decoder_start = self._special_ids()["decoder_start_token_id"] if self.warm_start else self.checkpoint_decoder_start
        return examples.map(
            _tokenize, batched=True, remove_columns=examples.column_names,
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

    def collator(self, *, train: bool):
        if train:
            # With the model it also builds decoder_input_ids (labels shifted right behind the decoder start).
            return DataCollatorForSeq2Seq(self.tokenizer, model=self.model, label_pad_token_id=-100)
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
        eos = self.model.generation_config.eos_token_id if self.model is not None else self.tokenizer.eos_token_id
        gen_lens = generated_lengths(generated, eos, self.tokenizer.pad_token_id)
        hypotheses = decode(self.tokenizer, generated)
        return {"hypotheses": hypotheses, "gen_lens": gen_lens}

    def _metric(self, name: str):
        if name not in self._metrics:
            self._metrics[name] = load_metric(name)
        return self._metrics[name]

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

    def format_predictions(self, predictions: dict[str, Any], examples: Dataset) -> list[dict[str, Any]]:
        sources = examples[self.options.source_lang]
        return [{"source": source, "translation_text": hypothesis} for source, hypothesis in zip(sources, predictions["hypotheses"])]

    def save_artifacts(self, predictions: dict[str, Any], examples: Dataset, run_dir: str) -> None:
        """``generations.jsonl``: source, reference, hypothesis per eval pair; the sacreBLEU signatures."""
        import json

        sources = examples[self.options.source_lang]
        references = examples[self.options.target_lang]
        with open(Path(run_dir) / GENERATIONS_FILE, "w") as handle:
            for source, reference, hypothesis in zip(sources, references, predictions["hypotheses"]):
                handle.write(json.dumps({"source": source, "reference": reference, "hypothesis": hypothesis}, ensure_ascii=False) + "\n")
        if self.signatures:
            write_json(Path(run_dir) / SIGNATURE_FILE, {**self.signatures, "lowercase": self.lowercase, "tokenize": self.options.bleu_tokenize})
