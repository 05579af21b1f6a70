"""The task registry: ``task:`` in a YAML config -> the class that implements it.

Adding a task means one module in this package, one line here, its configs and its tests.
"""

from __future__ import annotations

from pipelines.task import Task
from tasks.classification import ClassificationTask
from tasks.ner import NerTask

TASKS: dict[str, type[Task]] = {
    "classification": ClassificationTask,
    "ner": NerTask,
}


def get_task(name: str) -> type[Task]:
    try:
        return TASKS[name]
    except KeyError:
        raise KeyError(f"unknown task {name!r}; registered tasks: {', '.join(sorted(TASKS))}") from None
