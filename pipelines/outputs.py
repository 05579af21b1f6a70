"""The run directory: what a finished run leaves behind besides the model.

In:  the resolved config, the step log records and the final metrics.
Out: ``config.yaml`` (resolved config), ``log.jsonl`` (one record per logging/eval step),
     ``metrics.json`` (flat final metrics), ``training_curves.png`` (loss and eval metrics over
     steps). ``metrics.json`` is written last, so its presence marks a finished run.
"""

from __future__ import annotations

import json
import math
import os
from pathlib import Path
from typing import Any

import yaml

from pipelines.config import RunConfig

CONFIG_FILE = "config.yaml"
METRICS_FILE = "metrics.json"
LOG_FILE = "log.jsonl"
PLOT_FILE = "training_curves.png"


class OutputDirError(RuntimeError):
    """An ``output_dir`` that would lose a finished run if written into."""


def check_output_dir(config: RunConfig) -> None:
    finished = Path(config.output_dir) / METRICS_FILE
    if finished.exists() and not config.overwrite and not config.train.resume_from_checkpoint:
        raise OutputDirError(
            f"{config.output_dir} already holds a finished run ({METRICS_FILE} exists). Choose another output_dir, "
            "set overwrite=true to replace it, or train.resume_from_checkpoint=latest to continue it."
        )


def write_json(path: Path, payload: Any) -> None:
    temporary = path.with_name(path.name + ".tmp")
    temporary.write_text(json.dumps(payload, indent=2, sort_keys=False) + "\n")
    os.replace(temporary, path)


def save_config(config: RunConfig, run_dir: str | Path) -> None:
    path = Path(run_dir) / CONFIG_FILE
    path.write_text(yaml.safe_dump(config.to_yaml_dict(), sort_keys=False))


def load_saved_config(run_dir: str | Path) -> dict[str, Any]:
    path = Path(run_dir) / CONFIG_FILE
    if not path.is_file():
        raise FileNotFoundError(f"{run_dir} is not a bertpipe run directory (no {CONFIG_FILE})")
    return yaml.safe_load(path.read_text())


class StepLog:
    """One JSON record per line, flushed each time, so a crash keeps every record written so far."""

    def __init__(self, run_dir: str | Path) -> None:
        self.path = Path(run_dir) / LOG_FILE
        self.path.parent.mkdir(parents=True, exist_ok=True)
        self._file = self.path.open("w")

    def write(self, record: dict[str, Any]) -> None:
        self._file.write(json.dumps(record) + "\n")
        self._file.flush()

    def close(self) -> None:
        self._file.close()


def read_log(run_dir: str | Path) -> list[dict[str, Any]]:
    path = Path(run_dir) / LOG_FILE
    if not path.is_file():
        return []
    return [json.loads(line) for line in path.read_text().splitlines() if line.strip()]


def plot_training_curves(records: list[dict[str, Any]], path: str | Path) -> Path | None:
    """Loss (left) and each eval metric (right) against the optimizer step."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    train = [(r["step"], r["loss"]) for r in records if "loss" in r]
    eval_keys = sorted({k for r in records for k in r if k.startswith("eval_") and k not in {"eval_samples", "eval_runtime"}})
    if not train and not eval_keys:
        return None
    figure, (loss_axes, eval_axes) = plt.subplots(1, 2, figsize=(11, 4))
    if train:
        loss_axes.plot(*zip(*train), label="train loss")
    eval_loss = [(r["step"], r["eval_loss"]) for r in records if r.get("eval_loss") is not None]
    if eval_loss:
        loss_axes.plot(*zip(*eval_loss), marker="o", label="eval loss")
    loss_axes.set(xlabel="optimizer step", ylabel="loss", title="loss")
    loss_axes.legend()
    for key in eval_keys:
        if key == "eval_loss":
            continue
        points = [(r["step"], r[key]) for r in records if isinstance(r.get(key), (int, float)) and math.isfinite(r[key])]
        if points:
            eval_axes.plot(*zip(*points), marker="o", label=key)
    eval_axes.set(xlabel="optimizer step", title="evaluation")
    if eval_axes.get_legend_handles_labels()[0]:
        eval_axes.legend(fontsize="small")
    figure.tight_layout()
    figure.savefig(path, dpi=100)
    plt.close(figure)
    return Path(path)
