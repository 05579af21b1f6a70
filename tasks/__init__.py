"""The task registry: ``task:`` in a YAML config -> the class that implements it.

Adding a task means one module in this package, one line here, its configs and its tests.
"""

from __future__ import annotations

from pipelines.task import Task
from tasks.classification import ClassificationTask
from tasks.mlm import MlmTask
from tasks.ner import NerTask
from tasks.qa import QATask
from tasks.translation import TranslationTask

TASKS: dict[str, type[Task]] = {
    "classification": ClassificationTask,
    "mlm": MlmTask,
    "ner": NerTask,
    "qa": QATask,
    "translation": TranslationTask,
}


def get_task(name: str) -> type[Task]:
    try:
        return TASKS[name]
    except KeyError:
        raise KeyError(f"unknown task {name!r}; registered tasks: {', '.join(sorted(TASKS))}") from None
