"""The task registry: ``task:`` in a YAML config -> the class that implements it.

Adding a task means one module in this package, one line here, its configs and its tests.
Importing this package also lets ``pipeline(TASK, model=RUN_DIR)`` load LoRA/IA3 adapter run
directories through peft, for every registered task's pipeline.
"""

from __future__ import annotations

from pipelines.modeling import enable_adapter_runs_in_pipeline
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

for _task in TASKS.values():
    enable_adapter_runs_in_pipeline(_task.pipeline_tag)


def get_task(name: str) -> type[Task]:
    try:
        return TASKS[name]
    except KeyError:
        raise KeyError(f"unknown task {name!r}; registered tasks: {', '.join(sorted(TASKS))}") from None
