"""Evaluation and prediction: predict -> pad across processes -> gather_for_metrics -> postprocess -> metrics.

In:  a prepared model and eval dataloader, the task, the eval features and raw examples.
Out: the task's example-level predictions and a flat ``{"eval_<name>": value}`` dict. Every process
     runs the forward passes; ``gather_for_metrics`` drops the samples Accelerate repeats to even
     out the last batch, so each feature is counted exactly once. Postprocessing runs on every
     process on identical gathered arrays (cheap, and it keeps processes in step).
"""

from __future__ import annotations

from typing import Any

import numpy as np
import torch
from accelerate import Accelerator
from datasets import Dataset
from tqdm.auto import tqdm

from pipelines.task import Task


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
def run_predictions(accelerator: Accelerator, model, dataloader, task: Task, *, description: str = "eval") -> dict[str, np.ndarray]:
    """Forward every feature once across all processes; returns gathered outputs in dataset order."""
    model.eval()
    collected: dict[str, list[np.ndarray]] = {}
    for batch in tqdm(dataloader, desc=description, disable=not accelerator.is_local_main_process, leave=False):
        outputs = task.predict_step(model, batch)
        for key, tensor in outputs.items():
            pad_value = task.output_pad_values.get(key, -100)
            if tensor.ndim >= 2:
                tensor = accelerator.pad_across_processes(tensor, dim=1, pad_index=pad_value)
            gathered = accelerator.gather_for_metrics(tensor)
            collected.setdefault(key, []).append(_to_numpy(gathered))
    return {key: concat_padded(chunks, task.output_pad_values.get(key, -100)) for key, chunks in collected.items()}


def _to_numpy(tensor: torch.Tensor) -> np.ndarray:
    if tensor.is_floating_point():
        tensor = tensor.float()
    return tensor.cpu().numpy()


def evaluate(
    accelerator: Accelerator, model, dataloader, task: Task, features: Dataset, examples: Dataset
) -> tuple[Any, dict[str, float]]:
    outputs = run_predictions(accelerator, model, dataloader, task)
    count = len(next(iter(outputs.values())))
    if count != len(features):
        raise RuntimeError(f"gathered {count} predictions for {len(features)} features; evaluation lost or repeated some")
    predictions = task.postprocess(outputs, features, examples)
    metrics = {f"eval_{name}": float(value) for name, value in task.compute_metrics(predictions, examples).items()}
    metrics["eval_samples"] = len(examples)
    return predictions, metrics
