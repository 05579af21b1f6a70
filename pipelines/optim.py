"""Optimizer, learning-rate schedule and the step arithmetic (the one place that knows it).

In:  the train config, the model, and the number of batches one process sees per epoch.
Out: a :class:`StepPlan` (optimizer updates per epoch, in total, warmup, epochs to run) and an
     AdamW optimizer with its scheduler, sized for Accelerate's prepared scheduler.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import torch
from transformers import get_scheduler

from pipelines.config import TrainConfig


@dataclass(frozen=True)
class StepPlan:
    batches_per_epoch: int
    """Batches one process draws per epoch (length of its prepared dataloader)."""
    accumulation_steps: int
    updates_per_epoch: int
    """Optimizer updates per epoch: a last partial accumulation still updates (Accelerate syncs at
    the end of the dataloader)."""
    total_updates: int
    num_epochs: int
    """Epochs to start (the last may stop early at ``total_updates``)."""
    warmup_updates: int


def plan_steps(train: TrainConfig, batches_per_epoch: int) -> StepPlan:
    if batches_per_epoch <= 0:
        raise ValueError("the training split gives no batches")
    updates_per_epoch = math.ceil(batches_per_epoch / train.gradient_accumulation_steps)
    if train.max_steps is not None:
        total_updates = train.max_steps
    else:
        # Fractional epochs (num_epochs=0.5) train on that share of the updates.
        total_updates = max(1, math.ceil(train.num_epochs * updates_per_epoch))
    num_epochs = math.ceil(total_updates / updates_per_epoch)
    if train.warmup_steps is not None:
        warmup = train.warmup_steps
    else:
        warmup = math.ceil(train.warmup_fraction * total_updates)
    return StepPlan(batches_per_epoch, train.gradient_accumulation_steps, updates_per_epoch, total_updates, num_epochs, min(warmup, total_updates))


def build_optimizer(model: torch.nn.Module, train: TrainConfig) -> torch.optim.AdamW:
    """AdamW with no weight decay on biases and normalisation weights (as in BERT)."""
    decay, no_decay = [], []
    for name, parameter in model.named_parameters():
        if not parameter.requires_grad:
            continue
        is_norm_or_bias = parameter.ndim < 2 or "norm" in name.lower()
        (no_decay if is_norm_or_bias else decay).append(parameter)
    groups = [
        {"params": decay, "weight_decay": train.weight_decay},
        {"params": no_decay, "weight_decay": 0.0},
    ]
    return torch.optim.AdamW(
        groups,
        lr=train.learning_rate,
        betas=(train.adam_beta1, train.adam_beta2),
        eps=train.adam_epsilon,
        # The fused kernel does one pass over all parameters instead of one per tensor.
        fused=True,
    )


def build_scheduler(optimizer: torch.optim.Optimizer, train: TrainConfig, plan: StepPlan, num_processes: int):
    """A schedule over ``plan.total_updates``; counts are scaled by the world size because a
    scheduler prepared by Accelerate steps once per process for every optimizer update."""
    name = "constant_with_warmup" if train.lr_scheduler == "constant" else train.lr_scheduler
    return get_scheduler(
        name,
        optimizer=optimizer,
        num_warmup_steps=plan.warmup_updates * num_processes,
        num_training_steps=plan.total_updates * num_processes,
    )
