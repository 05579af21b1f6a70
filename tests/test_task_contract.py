"""The task contract is checked, not hoped for (issue 22): every registered task implements every
method and class attribute the ``Task`` Protocol declares, with the Protocol's parameter names, and
``pipelines/`` never imports ``tasks/`` (read from the source, so a lazy import inside a function counts)."""

from __future__ import annotations

import ast
import inspect
import typing
from pathlib import Path

import pytest

from pipelines.config import TaskOptions
from pipelines.task import Task
from tasks import TASK_NAMES, get_task

REPO_ROOT = Path(__file__).resolve().parents[1]
_PROTOCOL_HINTS = typing.get_type_hints(Task, include_extras=True)
CLASS_ATTRIBUTES = sorted(name for name, hint in _PROTOCOL_HINTS.items() if typing.get_origin(hint) is typing.ClassVar)
METHODS = sorted(
    name for name, value in vars(Task).items()
    if inspect.isfunction(value) and (not name.startswith("_") or name == "__init__")
)


def test_the_protocol_declares_what_the_loop_calls():
    # Guards the two lists below against reading nothing (a refactor of the Protocol's annotations).
    assert {"name", "Options", "pipeline_tag", "output_pad_values", "higher_is_better"} <= set(CLASS_ATTRIBUTES)
    assert {"load", "preprocess", "collator", "predict_step", "postprocess", "compute_metrics"} <= set(METHODS)


@pytest.mark.parametrize("task_name", TASK_NAMES)
def test_every_task_has_every_class_attribute_of_the_protocol(task_name):
    task = get_task(task_name)
    missing = [name for name in CLASS_ATTRIBUTES if not hasattr(task, name)]
    assert not missing, f"{task.__name__} lacks {missing}"
    assert task.name == task_name
    assert issubclass(task.Options, TaskOptions)
    assert isinstance(task.pipeline_tag, str) and task.pipeline_tag
    assert all(isinstance(value, bool) for value in task.higher_is_better.values()) and task.higher_is_better


@pytest.mark.parametrize("task_name", TASK_NAMES)
def test_every_task_carries_the_facts_pipelines_would_otherwise_look_up_by_tag(task_name):
    from transformers.models.auto.auto_factory import _BaseAutoModelClass

    from pipelines.adapters import peft_task_type

    task = get_task(task_name)
    assert issubclass(task.auto_model_class, _BaseAutoModelClass)
    peft_task_type(task.peft_task_type)  # a peft TaskType member name, or None
    assert isinstance(task.onnx_outputs, tuple) and all(isinstance(name, str) for name in task.onnx_outputs)
    # The model card shows either a pipeline() call on an input, or code on model and tokenizer, and it compiles.
    assert (task.card_pipeline_input is None) != (task.card_model_usage is None)
    compile(task.card_model_usage or f"print({task.card_pipeline_input})", task_name, "exec")


@pytest.mark.parametrize("task_name", TASK_NAMES)
def test_every_task_implements_every_method_of_the_protocol_with_its_parameters(task_name):
    task = get_task(task_name)
    for name in METHODS:
        implementation = getattr(task, name, None)
        assert callable(implementation), f"{task.__name__}.{name} is missing"
        declared = inspect.signature(getattr(Task, name)).parameters
        actual = inspect.signature(implementation).parameters
        accepts_any_keyword = any(p.kind is inspect.Parameter.VAR_KEYWORD for p in actual.values())
        for parameter in declared.values():
            # The loop calls these by keyword (``train=``, ``include_train=``) and positionally: both must work.
            assert parameter.name in actual or accepts_any_keyword, f"{task.__name__}.{name} lacks {parameter.name!r}"
            if parameter.default is not inspect.Parameter.empty and parameter.name in actual:
                assert actual[parameter.name].default is not inspect.Parameter.empty, \
                    f"{task.__name__}.{name}: {parameter.name!r} needs a default, as in the Protocol"


def _imported_modules(path: Path) -> list[str]:
    modules = []
    for node in ast.walk(ast.parse(path.read_text(), filename=str(path))):
        if isinstance(node, ast.Import):
            modules += [alias.name for alias in node.names]
        elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
            modules.append(node.module)
    return modules


def test_pipelines_never_import_tasks():
    sources = sorted((REPO_ROOT / "pipelines").rglob("*.py"))
    assert len(sources) > 10
    offenders = [
        f"{path.relative_to(REPO_ROOT)} imports {module}"
        for path in sources for module in _imported_modules(path) if module == "tasks" or module.startswith("tasks.")
    ]
    assert not offenders


def test_the_import_check_sees_an_import_inside_a_function(tmp_path):
    source = tmp_path / "lazy.py"
    source.write_text("def f():\n    from tasks.qa import QATask\n    import tasks\n")
    assert _imported_modules(source) == ["tasks.qa", "tasks"]
