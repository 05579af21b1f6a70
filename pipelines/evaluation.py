"""Evaluation and prediction: predict -> pad across processes -> gather_for_metrics -> postprocess -> metrics.

In:  a prepared model and eval dataloader, the task, the eval features and raw examples.
Out: the task's example-level predictions and a flat ``{"eval_<name>": value}`` dict. Forward passes
     run in fp32 unless told to keep the accelerator's mixed precision (pipelines.runtime: the
     inference-precision rule), so scores do not depend on what ``auto`` meant for training. Every process
     runs the forward passes; ``gather_for_metrics`` drops the samples Accelerate repeats to even
     out the last batch, so each feature is counted exactly once. Postprocessing runs on every
     process on identical gathered arrays (cheap, and it keeps processes in step).
"""

from __future__ import annotations

import json
import logging
import time
from pathlib import Path
from typing import Any

import numpy as np
import torch
from accelerate import Accelerator
from datasets import Dataset
from tqdm.auto import tqdm

from pipelines.adapters import MERGED_DIR, is_adapter_dir, is_peft_model, save_merged_model
from pipelines.atomic_writes import replacing_folder, write_json, writing_atomically
from pipelines.autocast_safety import make_autocast_safe
from pipelines.batching import eval_dataloader, exact_eval_batch_size
from pipelines.checkpoint import CHECKPOINTS_DIR, SOURCES_FILE, STATE_FILE, source_digests
from pipelines.config import RunConfig
from pipelines.data import load_raw, split_source, split_where
from pipelines.errors import DataError, ModelError, OutputDirError, failures_named
from pipelines.first_position import last_layer_at_first_position
from pipelines.labelled_positions import head_at_labelled_positions
from pipelines.input_columns import carried_input_columns, with_input_columns
from pipelines.modeling import check_sequence_lengths
from pipelines.onnx_model import export_precision, is_export_dir
from pipelines.outputs import (
    CONFIG_FILE, LOG_FILE, METRICS_FILE, data_files_by_key, is_run_dir, load_saved_config, replaced_run_note, run_inputs,
)
from pipelines.runtime import build_accelerator, resolve_inference_precision, without_autocast
from pipelines.task import Task

logger = logging.getLogger(__name__)


def concat_padded(chunks: list[np.ndarray], pad_value: float) -> np.ndarray:
    """Join batch-first arrays whose second dimension differs, padding it with ``pad_value``."""
    if chunks[0].ndim < 2:
        return np.concatenate(chunks)
    width = max(chunk.shape[1] for chunk in chunks)
    padded = []
    for chunk in chunks:
        if chunk.shape[1] < width:
            pad = [(0, 0)] * chunk.ndim
            pad[1] = (0, width - chunk.shape[1])
            chunk = np.pad(chunk, pad, constant_values=pad_value)
        padded.append(chunk)
    return np.concatenate(padded)


@torch.no_grad()
def run_predictions(
    accelerator: Accelerator, model, dataloader, task: Task, *, order: np.ndarray | None = None, description: str = "eval",
    mixed_precision: bool = False,
) -> dict[str, np.ndarray]:
    """Forward every feature once across all processes; returns gathered outputs in dataset order.

    ``order`` is the feature index of each row in iteration order (the sampler's), when the
    dataloader does not walk the dataset in order. ``mixed_precision``: keep the accelerator's
    bf16/fp16 autocast instead of running in fp32.
    """
    model.eval()
    collected: dict[str, list[np.ndarray]] = {}
    for batch in tqdm(dataloader, desc=description, disable=not accelerator.is_local_main_process, leave=False):
        if mixed_precision:
            outputs = task.predict_step(model, batch)
        else:
            with without_autocast(accelerator, model):
                outputs = task.predict_step(model, batch)
        for key, tensor in outputs.items():
            pad_value = task.output_pad_values.get(key, -100)
            if tensor.ndim >= 2:
                tensor = accelerator.pad_across_processes(tensor, dim=1, pad_index=pad_value)
            gathered = accelerator.gather_for_metrics(tensor)
            collected.setdefault(key, []).append(_to_numpy(gathered))
    joined = {key: concat_padded(chunks, task.output_pad_values.get(key, -100)) for key, chunks in collected.items()}
    if order is not None:
        inverse = np.argsort(order)
        joined = {key: array[inverse] for key, array in joined.items()}
    return joined


def _to_numpy(tensor: torch.Tensor) -> np.ndarray:
    if tensor.is_floating_point():
        tensor = tensor.float()
    return tensor.cpu().numpy()


def evaluate(
    accelerator: Accelerator, model, dataloader, task: Task, features: Dataset, examples: Dataset, *,
    order: np.ndarray | None = None, mixed_precision: bool = False,
) -> tuple[Any, dict[str, float]]:
    outputs = run_predictions(accelerator, model, dataloader, task, order=order, mixed_precision=mixed_precision)
    count = len(next(iter(outputs.values())))
    if count != len(features):
        raise RuntimeError(f"gathered {count} predictions for {len(features)} features; evaluation lost or repeated some")
    predictions = task.postprocess(outputs, features, examples)
    computed = task.compute_metrics(predictions, examples)
    if undeclared := sorted(set(computed) - set(task.metric_names())):
        # train.metric_for_best_model is checked against metric_names() before training: they must not drift apart.
        raise RuntimeError(f"task {task.name!r} reported metrics {undeclared} that its metric_names() does not list")
    metrics = {f"eval_{name}": float(value) for name, value in computed.items()}
    metrics["eval_samples"] = len(examples)
    return predictions, metrics


def _prepare_finished_run(config: RunConfig, task: Task, run_dir: str, precision: str):
    """An accelerator in the inference ``precision`` (fp32, bf16, fp16, auto), and the run's tokenizer
    and model; an adapter run comes back as a PeftModel on its base weights
    (``pipelines.modeling.load_model`` rebuilds it when the task loads ``model_path``)."""
    # An export directory is finished by construction (only a finished run can be exported).
    folder = Path(run_dir)
    if (folder / STATE_FILE).is_file() and folder.parent.name == CHECKPOINTS_DIR:
        # Its config.yaml names the run's output_dir, so "resume from it" would point back at the run.
        run = folder.parent.parent
        raise OutputDirError(
            f"{run_dir} is a training checkpoint of the run {run}, not a finished run: point to {run}, or, if "
            f"its training was interrupted, finish it with `bertpipe train {run / CONFIG_FILE} train.resume_from_checkpoint=latest`"
        )
    if not is_export_dir(run_dir):
        _refuse_an_unfinished_run(folder)
    accelerator = build_accelerator(config, with_trackers=False, mixed_precision=resolve_inference_precision(precision))
    task.build_tokenizer(None, model_path=run_dir)
    model = task.build_model(None, model_path=run_dir)
    if is_adapter_dir(run_dir) and not is_peft_model(model):
        raise ModelError(
            f"{run_dir} holds a peft adapter but task {config.task!r} did not load it through "
            "pipelines.modeling.load_model; its build_model(model_path=...) must use load_model"
        )
    make_autocast_safe(model)  # --precision bf16|auto: a family whose transformers code fails under autocast
    # Predict and evaluate read a sequence classifier's logits only: its last layer need not compute the
    # positions its head never reads (pipelines/first_position.py), nor a masked-LM head the positions no
    # label scores (pipelines/labelled_positions.py); any other model is left as loaded.
    last_layer_at_first_position(model)
    head_at_labelled_positions(model)
    return accelerator, model


def _eval_batch_size(config: RunConfig, task: Task, accelerator, model, features, run_dir: str) -> int:
    return exact_eval_batch_size(task.predict_step, model, task.collator(train=False), features,
                                 config.train.eval_batch_size_or_default, where=run_dir, accelerator=accelerator)


def evaluate_run(config: RunConfig, task: Task, run_dir: str, *, precision: str = "fp32") -> dict[str, float]:
    """Evaluate a finished run on ``data.eval_split``; writes ``eval_<split>.json`` beside the model."""
    check_held_out_split_unchanged(config, run_dir)
    accelerator, model = _prepare_finished_run(config, task, run_dir, precision)
    # An export computes in its own precision (int8), whatever this process's accelerator was built with; read
    # before the evaluation, so that an unreadable export.json is refused before minutes of it.
    inference_precision = export_precision(run_dir) if is_export_dir(run_dir) else _precision_name(accelerator.mixed_precision)
    with accelerator.main_process_first():
        examples = task.load(include_train=False)[config.data.eval_split]
        features = task.preprocess(examples, train=False)
    # An override (data.max_seq_length, another data.files split) can make features longer than the
    # positions training checked: the forward pass would fail mid-evaluation with a shape error.
    split = config.data.eval_split
    check_sequence_lengths(model.config, features, where=split_where(config.data, split))
    loader, sampler = eval_dataloader(features, task.collator(train=False), _eval_batch_size(config, task, accelerator, model, features, run_dir),
                                      num_workers=config.train.dataloader_num_workers)
    model, loader = accelerator.prepare(model, loader)
    started = time.perf_counter()
    predictions, metrics = evaluate(
        accelerator, model, loader, task, features, examples, order=sampler.order, mixed_precision=accelerator.mixed_precision != "no"
    )
    # Not "eval_precision": that is a task's own metric (NER's entity precision), which it would overwrite.
    metrics["inference_precision"] = inference_precision
    metrics["eval_runtime"] = round(time.perf_counter() - started, 3)
    metrics["num_processes"] = accelerator.num_processes
    if accelerator.is_main_process:
        write_json(Path(run_dir) / f"eval_{config.data.eval_split}.json", metrics)
    return metrics


def check_held_out_split_unchanged(config: RunConfig, run_dir: str) -> None:
    """An eval split held out of the training data (``data.validation_fraction``) is carved again from it: the rows
    the run held out only with the data, the seed and the fraction it trained with. A train file (or a local
    ``data.path`` folder) reordered or edited since was scored without a word, over rows the model had trained on."""
    data = config.data
    if not data.validation_fraction or (data.files and (data.eval_split in data.files or data.train_split not in data.files)):
        return
    saved = load_saved_config(run_dir)
    held_out_as = saved.get("data", {}).get("eval_split", data.eval_split)
    if data.eval_split != held_out_as and (data.files or data.eval_split not in load_raw(data)):
        # Carved under any name asked for: data.eval_split=test (no test file given) scored the held-out validation
        # rows and wrote them as eval_test.json, exit 0.
        raise DataError(
            f"split {data.eval_split!r} not found in {split_source(data, data.train_split)}; the run held out split "
            f"{held_out_as!r} of it by data.validation_fraction: evaluate data.eval_split={held_out_as}, or give "
            f"data.files.{data.eval_split}=FILE"
        )
    # Compared whatever digests the run kept: an export, a Hub dataset or a run from before sources.json skipped
    # this too, and an evaluation with another seed scored other rows, some of them trained on.
    changed = [(name, now, then) for name, now, then in (
        ("seed", config.seed, saved.get("seed")),
        ("data.validation_fraction", data.validation_fraction, saved.get("data", {}).get("validation_fraction")),
    ) if now != then]
    key = f"data.files.{data.train_split}" if data.files else "data.path"
    source = data.files[data.train_split] if data.files else data.path
    recorded_file = Path(run_dir) / SOURCES_FILE
    data_changed = False
    if recorded_file.is_file():  # else a run from before the run folder kept its sources' digests: nothing to compare
        with failures_named(OutputDirError, f"run directory {run_dir}: cannot read {recorded_file}"):
            recorded = json.loads(recorded_file.read_text(encoding="utf-8"))
        # A Hub id (read through the mirror or the cache) has no digest: no folder of the user's was digested.
        if data.files or key in recorded:
            data_changed = source_digests({"data": {"files": {data.train_split: source}} if data.files else {"path": source}}).get(key) != recorded.get(key)
    if not changed and not data_changed:
        return
    if not data.files and data.eval_split in load_raw(data):  # read as the task reads it, only now that it matters
        return  # the folder has an eval split of its own: nothing was held out
    where = f"split {data.eval_split!r} (held out of {key} by data.validation_fraction)"
    if changed:
        name, now, then = changed[0]
        raise DataError(f"{where}: {name}={now}, but the run held its rows out with {name}={then}; other rows would be "
                        "scored, some of them trained on. Leave it as the run had it")
    raise DataError(
        f"{where}: {split_source(data, data.train_split)} is not the {'file' if data.files else 'data'} the run was "
        "trained on (its rows or their order changed since), so the rows "
        f"held out now are not the ones the run held out, and some were trained on. Evaluate on a file of its own "
        f"(data.files.{data.eval_split}=FILE)"
    )


def predict_file(config: RunConfig, task: Task, run_dir: str, input_path: str, output_path: str, *, precision: str = "fp32") -> int:
    """Predict every example of ``input_path``; writes one JSON object per line; returns the count.

    The output is written beside its final name and renamed into place, so a failure never leaves a
    half-written file, and it may not be the input itself or one of the run's own files.
    """
    check_prediction_output(run_dir, input_path, output_path, config=config, run_files=task.run_files)
    accelerator, model = _prepare_finished_run(config, task, run_dir, precision)
    examples = task.load_inputs(input_path)
    # Read before the forward pass: a column the output cannot carry fails now, not after minutes of predicting.
    carried = carried_input_columns(input_path, task.input_columns(), config.data.encoding)
    features = task.preprocess(examples, train=False, inputs=True)
    check_sequence_lengths(model.config, features, where=f"--input {input_path}")
    loader, sampler = eval_dataloader(features, task.collator(train=False), _eval_batch_size(config, task, accelerator, model, features, run_dir),
                                      num_workers=config.train.dataloader_num_workers)
    model, loader = accelerator.prepare(model, loader)
    outputs = run_predictions(
        accelerator, model, loader, task, order=sampler.order, description="predict", mixed_precision=accelerator.mixed_precision != "no"
    )
    predictions = task.postprocess(outputs, features, examples)
    rows = with_input_columns(task.format_predictions(predictions, examples), carried, input_path)
    if accelerator.is_main_process:
        output = Path(output_path)
        with failures_named(OutputDirError, f"--output {output_path}"):
            output.parent.mkdir(parents=True, exist_ok=True)
            with writing_atomically(output) as handle:
                for row in rows:
                    handle.write(json.dumps(row, ensure_ascii=False) + "\n")
    return len(rows)


def check_prediction_output(
    run_dir: str, input_path: str, output_path: str, *, config: RunConfig | None = None, run_files: tuple[str, ...] = (),
) -> None:
    """Refuse an ``--output`` that would overwrite the input, a folder, a file the run needs or wrote
    (``run_files``: the task's own, such as translation's ``generations.jsonl``), a file of the run's
    ``data.files``, or anything inside another input of ``config`` (``data.path``, the base model's folder)."""
    output, source = Path(output_path).resolve(), Path(input_path).resolve()
    if output == source or (output.exists() and source.exists() and output.samefile(source)):
        raise OutputDirError(f"--output {output_path} is the --input file; predictions would overwrite it. Choose another --output")
    if output.is_dir():
        raise OutputDirError(f"--output {output_path} is a folder; give a file name, e.g. {Path(output_path) / 'predictions.jsonl'}")
    # `--output train.jsonl` beside the data replaced the user's training file without a word (and one
    # deleted since training would come back as predictions that a retrain reads as data).
    # As the loader reads them (absolute in a config read now: pipelines.config makes local paths so).
    for key, path in ((key, Path(value).resolve()) for key, value in data_files_by_key(config.data.files if config else None).items()):
        if output == path or (output.exists() and path.exists() and output.samefile(path)):
            raise OutputDirError(f"--output {output_path} is {key} of the run's config; predictions would overwrite it. Choose another --output")
    # A folder the run reads (data.path, the base model): a dataset folder is read whole, so its files were replaced and
    # a new file in it is read as data by a retrain. (Input files, data.files, are the loop above.)
    for key, path in (run_inputs(config) if config else {}).items():
        if path.is_dir() and path in output.parents:
            raise OutputDirError(f"--output {output_path} lies in {key}={path}, which the run reads; predictions would change it. "
                                 "Choose another --output")
    # Earlier predictions (*.jsonl other than the step log, beside the model) may be replaced; the model,
    # tokenizer, config, metrics and card may not, nor anything in the run's subfolders (a checkpoint's
    # weights, merged/), which a resume or a merge would read back as a model. The same holds for every run
    # or export folder that holds the output: an export kept in RUN/onnx protected its own files alone, and
    # predictions from it replaced the run's model.safetensors.
    run = Path(run_dir).resolve()
    if not output.exists():
        return
    for folder in (folder for folder in output.parents if folder == run or is_run_dir(folder) or is_export_dir(folder)):
        earlier_predictions = output.parent == folder and output.suffix == ".jsonl" and output.name not in (LOG_FILE, *run_files)
        if not earlier_predictions:
            what = "export" if is_export_dir(folder) else "run"
            raise OutputDirError(f"--output {output_path} is a file of the {what} {run_dir if folder == run else folder}; "
                                 "predictions would replace it. Choose another --output")


def _precision_name(mixed_precision: str) -> str:
    return "fp32" if mixed_precision == "no" else mixed_precision


def _refuse_an_unfinished_run(folder: Path) -> None:
    """A run folder without ``metrics.json``: its training was interrupted or failed (checkpoints, no model yet)."""
    if not (folder / METRICS_FILE).is_file():
        raise OutputDirError(
            f"{folder} holds no finished run (no {METRICS_FILE}): its training was interrupted or failed. Finish it "
            f"with `bertpipe train {folder / CONFIG_FILE} train.resume_from_checkpoint=latest`, or point to a "
            f"finished run.{replaced_run_note(folder)}"
        )


def merge_run(config: RunConfig, task: Task, run_dir: str, out_dir: str | None = None) -> Path:
    """Load an adapter run through the task, fold the adapter in, save a full model + tokenizer.

    Writes ``RUN_DIR/merged`` by default; the result loads with Auto classes and ``pipeline()``.
    """
    _refuse_an_unfinished_run(Path(run_dir))
    if not is_adapter_dir(run_dir):
        raise ModelError(f"{run_dir} holds no peft adapter (no adapter_config.json); it is already a full model")
    tokenizer = task.build_tokenizer(None, model_path=run_dir)
    model = task.build_model(None, model_path=run_dir)
    if not is_peft_model(model):
        raise ModelError(f"task {config.task!r} did not load the adapter of {run_dir} through pipelines.modeling.load_model")
    target = Path(out_dir) if out_dir else Path(run_dir) / MERGED_DIR
    # Staged beside and swapped in: a kill mid-merge leaves the earlier merged/ whole.
    with replacing_folder(target, label="--out" if out_dir else "merged model folder") as staging:
        save_merged_model(model, tokenizer, staging)
    return target
