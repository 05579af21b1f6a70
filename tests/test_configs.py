"""Every YAML under configs/ loads: task configs validate against their task's schema, and the
Accelerate configs parse with Accelerate's own config class."""

from __future__ import annotations

from pathlib import Path

import pytest
import yaml

from pipelines.cli import load_run_config
from tasks import TASKS, get_task

CONFIGS = Path(__file__).resolve().parents[1] / "configs"
TASK_CONFIGS = sorted(p for p in CONFIGS.rglob("*.yaml") if "accelerate" not in p.parts)
ACCELERATE_CONFIGS = sorted((CONFIGS / "accelerate").glob("*.yaml"))


def test_configs_exist_for_every_registered_task():
    tasks_with_configs = {yaml.safe_load(path.read_text())["task"] for path in TASK_CONFIGS}
    assert set(TASKS) <= tasks_with_configs


@pytest.mark.parametrize("path", TASK_CONFIGS, ids=lambda p: str(p.relative_to(CONFIGS)))
def test_configs_task_config_loads_and_says_how_to_run_it(path):
    config = load_run_config(get_task, str(path), [])
    assert config.task in TASKS
    first_line = path.read_text().splitlines()[0]
    assert first_line.startswith("#") and ("bertpipe" in first_line or "accelerate launch" in first_line)


@pytest.mark.parametrize("path", ACCELERATE_CONFIGS, ids=lambda p: p.name)
def test_configs_accelerate_config_parses(path):
    from accelerate.commands.config.config_args import ClusterConfig

    config = ClusterConfig.from_yaml_file(str(path))
    assert config.num_processes >= 1
    assert path.read_text().startswith("#")
