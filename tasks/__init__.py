"""The task registry: ``task:`` in a YAML config -> the class that implements it.

In:  a task name (``get_task``), or nothing (``load_tasks`` / ``TASKS``: every registered task).
Out: the task class, imported on first use. The registry holds module paths, not classes, so that
     ``bertpipe --help``, ``--version`` and argument errors answer without importing torch,
     transformers and datasets (each task module imports them).

Adding a task means one module in this package, one line in ``_REGISTRY``, its configs and its tests.
Loading a task also lets ``pipeline(TASK, model=RUN_DIR)`` load LoRA/IA3 adapter run directories through
peft for that task's pipeline; ``load_tasks()`` does it for every registered task (call it before
``pipeline()`` on a bertpipe run directory).
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from pipelines.task import Task

_REGISTRY: dict[str, str] = {
    "classification": "tasks.classification:ClassificationTask",
    "mlm": "tasks.mlm:MlmTask",
    "ner": "tasks.ner:NerTask",
    "qa": "tasks.qa:QATask",
    "translation": "tasks.translation:TranslationTask",
}

TASK_NAMES: tuple[str, ...] = tuple(_REGISTRY)


def get_task(name: str) -> type[Task]:
    try:
        target = _REGISTRY[name]
    except KeyError:
        raise KeyError(f"unknown task {name!r}; registered tasks: {', '.join(sorted(_REGISTRY))}") from None
    from pipelines.adapters import enable_adapter_runs_in_pipeline

    module, _, attribute = target.partition(":")
    task = getattr(importlib.import_module(module), attribute)
    enable_adapter_runs_in_pipeline(task.pipeline_tag)
    return task


def load_tasks() -> dict[str, type[Task]]:
    """Every registered task by name, with its ``pipeline()`` task registered (QA, translation) and adapter-aware."""
    return {name: get_task(name) for name in _REGISTRY}


def __getattr__(name: str):
    # ``from tasks import TASKS`` keeps working, and loads the tasks only when asked for.
    if name == "TASKS":
        return load_tasks()
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
