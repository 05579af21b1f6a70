"""The job, made identical for every setting: the config each run gets and the Trainer's arguments for it.

In:  the user's ``RunConfig`` (and, for the Trainer, a setting name, output folder, warmup and bf16 choice).
Out: the config tree every run is rebuilt from (no intermediate evaluation, checkpoints or trackers), the
     ``RunConfig`` for one seed and folder, ``TrainingArguments`` keywords describing the same job, and the
     precision and batch sampler each setting runs with. Also the names every part shares: ``SETTINGS``,
     ``TaskLookup`` and ``BenchmarkError``.
"""

from __future__ import annotations

import math
from typing import Any, Callable

from pipelines.config import TRAINER_LENGTH_GROUP_BATCHES, RunConfig
from pipelines.config_loading import load_config
from pipelines.optim import plan_steps
from pipelines.runtime import has_accelerator_device, native_bf16, resolve_mixed_precision

SETTINGS = ("bertpipe", "trainer_default", "trainer_best")

TaskLookup = Callable[[str], type]


class BenchmarkError(ValueError):
    """A benchmark request that cannot run as asked (unknown setting, no metric of that name)."""


def check_comparable(config: RunConfig) -> None:
    """Refuse a config whose bertpipe run would train another model than the Trainer reference.

    The reference builds the task's plain model and trains every weight of it: against a peft adapter
    (a fraction of the weights trained) or a distilled student (fewer layers, and a teacher's forward
    on every batch), the table would compare two different jobs and say nothing about the machinery.
    """
    if config.model.peft is not None:
        raise BenchmarkError(
            f"model.peft ({config.model.peft.method}): the Trainer reference trains every weight of the full model, so "
            "the table would compare an adapter with a full fine-tune; benchmark without model.peft"
        )
    if config.distill is not None:
        raise BenchmarkError(
            f"distill (teacher {config.distill.teacher}): the Trainer reference trains the task's model without a "
            "teacher, so the table would compare two different jobs; benchmark the config without its distill section"
        )


def benchmark_config_tree(config: RunConfig) -> dict[str, Any]:
    """The config as the benchmark runs it: no intermediate evaluation, checkpoints or trackers.

    Those would cost bertpipe time the Trainer reference (``eval_strategy="no"``,
    ``save_strategy="no"``, ``report_to="none"``) does not spend.
    """
    tree = config.to_yaml_dict()
    tree["train"].update(
        eval_steps=None, eval_on_start=False, save_steps=None, early_stopping_patience=None, load_best_model_at_end=False,
        report_to=[], resume_from_checkpoint=None,
    )
    tree["overwrite"] = True
    return tree


def run_config(tree: dict[str, Any], get_task: TaskLookup, *, seed: int, output_dir: str) -> RunConfig:
    return load_config(None, [], lambda name: get_task(name).Options, base={**tree, "seed": seed, "output_dir": output_dir})


def warmup_updates(config: RunConfig, num_train_features: int) -> int:
    """bertpipe's warmup in optimizer updates, handed to the Trainer as an exact ``warmup_steps``."""
    batches = math.ceil(num_train_features / config.train.batch_size)
    return plan_steps(config.train, batches).warmup_updates


def trainer_arguments(config: RunConfig, setting: str, output_dir: str, *, warmup_steps: int, bf16: bool) -> dict[str, Any]:
    """``TrainingArguments`` keywords (transformers 5.x names) for one Trainer setting of the job."""
    train = config.train
    return {
        "output_dir": output_dir,
        "seed": config.seed,
        "num_train_epochs": train.num_epochs,
        "max_steps": train.max_steps or -1,
        "per_device_train_batch_size": train.batch_size,
        "per_device_eval_batch_size": train.eval_batch_size_or_default,
        "gradient_accumulation_steps": train.gradient_accumulation_steps,
        "learning_rate": train.learning_rate,
        "weight_decay": train.weight_decay,
        "adam_beta1": train.adam_beta1,
        "adam_beta2": train.adam_beta2,
        "adam_epsilon": train.adam_epsilon,
        "max_grad_norm": train.max_grad_norm or 0.0,
        # bertpipe's "constant" warms up too; the Trainer's plain "constant" would ignore warmup_steps.
        "lr_scheduler_type": "constant_with_warmup" if train.lr_scheduler == "constant" else train.lr_scheduler,
        "warmup_steps": warmup_steps,
        "bf16": bf16,
        "train_sampling_strategy": "group_by_length" if setting == "trainer_best" else "random",
        "eval_strategy": "no",
        "save_strategy": "no",
        "logging_steps": train.logging_steps,
        "report_to": "none",
        "use_cpu": not has_accelerator_device(),
        "dataloader_num_workers": train.dataloader_num_workers,
    }


def setting_precision(config: RunConfig, setting: str) -> str:
    if setting == "bertpipe":
        resolved = resolve_mixed_precision(config.train.mixed_precision)
        return "fp32" if resolved == "no" else resolved
    if setting == "trainer_best" and native_bf16():
        return "bf16"
    return "fp32"


def setting_sampler(config: RunConfig, setting: str) -> str:
    if setting == "bertpipe" and config.train.pack_sequences:
        return "random, packed"
    window = config.train.length_group_batches
    if setting == "bertpipe" and config.train.group_by_length and window != TRAINER_LENGTH_GROUP_BATCHES:
        return f"length-grouped by {window} batches"
    grouped = config.train.group_by_length if setting == "bertpipe" else setting == "trainer_best"
    return "length-grouped" if grouped else "random"
