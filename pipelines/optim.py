"""Optimizer, learning-rate schedule and the step arithmetic (the one place that knows it).

In:  the train config, the model, and the number of batches one process sees per epoch.
Out: a :class:`StepPlan` (optimizer updates per epoch, in total, warmup, epochs to run), an
     AdamW optimizer with its scheduler, sized for Accelerate's prepared scheduler, and
     :class:`LossWeighting`, which makes an update over several batches (accumulation, processes)
     the update of one batch holding them all; :func:`clip_gradients`, the gradient clipping the loop does.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import torch
from accelerate import Accelerator
from accelerate.utils import DistributedType
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
        # By name too, as the Trainer does: relative-position biases are matrices (XLNet's and Funnel's r_w_bias,
        # MPNet's and T5's relative_attention_bias.weight), which the dimension alone decayed.
        is_norm_or_bias = parameter.ndim < 2 or "norm" in name.lower() or "bias" in name.lower()
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


def loss_items(batch: dict[str, torch.Tensor]) -> torch.Tensor | int:
    """What the model's loss averages over in ``batch``: the labelled positions of per-token labels
    (NER, masked-LM, translation: every position but -100), else the examples."""
    labels = batch.get("labels")
    if isinstance(labels, torch.Tensor) and labels.dim() > 1 and not labels.is_floating_point():
        return (labels != -100).sum()
    return batch["input_ids"].shape[0] if "input_ids" in batch else next(iter(batch.values())).shape[0]


class LossWeighting:
    """Weights each batch's mean loss by the items it averages over, so that an update is the mean
    over every item of its window: across ``train.gradient_accumulation_steps`` batches and all processes.

    Without it an update is the mean of per-batch means: a batch of 3 labelled tokens counts as much as
    one of 300, so accumulating 4 batches of 8 sentences (or 2 processes of 16) does not train the model
    that one batch of 32 does; nor does an epoch's last, shorter window, which Accelerate still divides
    by the full accumulation count. Each batch's loss is multiplied by its item count before backward
    (a sum over its items) and the window's summed gradient is divided by the window's items over all
    processes before clipping. Inactive for one process without accumulation (the mean is then exact)
    and under DeepSpeed, whose engine steps inside ``backward``.
    """

    def __init__(self, accelerator: Accelerator) -> None:
        self.accelerator = accelerator
        self.active = (accelerator.gradient_accumulation_steps > 1 or accelerator.num_processes > 1) \
            and accelerator.distributed_type != DistributedType.DEEPSPEED
        self.window_items = torch.zeros((), device=accelerator.device)

    def weigh(self, loss: torch.Tensor, batch: dict[str, torch.Tensor]) -> torch.Tensor:
        """The loss to back-propagate for ``batch``."""
        if not self.active:
            return loss
        items = loss_items(batch)
        self.window_items += items
        return loss * items

    def finish_window(self, parameters) -> None:
        """Divides the window's gradients by its items over all processes; call once, after the window's last backward."""
        if not self.active:
            return
        total = self.accelerator.reduce(self.window_items.clone(), reduction="sum")
        # backward divided each loss by the accumulation count and the process group averages
        # gradients over processes; both are undone here so that only the item count divides.
        scale = self.accelerator.gradient_accumulation_steps * self.accelerator.num_processes / total.clamp(min=1)
        gradients = [parameter.grad for parameter in parameters if parameter.grad is not None]
        if gradients:
            torch._foreach_mul_(gradients, scale.to(gradients[0].dtype))
        self.window_items.zero_()


def clip_gradients(accelerator: Accelerator, parameters, max_norm: float) -> torch.Tensor:
    """Scales the gradients so their total 2-norm is at most ``max_norm``; returns the norm before.

    ``accelerator.clip_grad_norm_``, with the norm taken row by row where the gradients are plain CPU
    tensors of one process or of a DDP group (whose gradients are the same on every process by then).
    torch's norm of a whole CPU tensor adds every square into float32 sums on one core: MiniLM's
    30,522 × 384 word-embedding gradient (random normal entries) took 3.0 ms a step and came out 5e-4
    (relative) off its float64 value; the norm of its rows' norms takes 2.0 ms on two cores and is off
    by 1e-7. The rescale is torch's (``clip_grads_with_norm_``: every gradient times
    ``min(1, max_norm / (norm + 1e-6))``). Sharded, compiled-for-XLA or accelerator-device gradients
    go to Accelerate as before.
    """
    parameters = list(parameters)
    gradients = [parameter.grad for parameter in parameters if parameter.grad is not None]
    plain_cpu = accelerator.distributed_type in (DistributedType.NO, DistributedType.MULTI_CPU) and all(
        gradient.device.type == "cpu" and type(gradient) is torch.Tensor for gradient in gradients)
    if not plain_cpu or not gradients:
        return accelerator.clip_grad_norm_(parameters, max_norm)
    accelerator.unscale_gradients()  # an fp16 loss scale comes off first, as Accelerate does
    total = torch.linalg.vector_norm(torch.stack([_gradient_norm(gradient) for gradient in gradients]))
    torch.nn.utils.clip_grads_with_norm_(parameters, max_norm, total)
    return total


def _gradient_norm(gradient: torch.Tensor) -> torch.Tensor:
    if gradient.dim() < 2:
        return torch.linalg.vector_norm(gradient)
    return torch.linalg.vector_norm(torch.linalg.vector_norm(gradient.reshape(gradient.shape[0], -1), dim=1))
