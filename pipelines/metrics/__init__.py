"""The project's own ``evaluate`` metric modules, so evaluation works with no network.

In:  a metric name (``accuracy``, ``f1``, ``seqeval``, ...).
Out: an ``evaluate.EvaluationModule`` loaded by local path from this folder when bertpipe ships
     one under that name, else loaded by name from the Hub (online only).
"""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    import evaluate

METRICS_DIR = Path(__file__).parent


def local_metric_names() -> list[str]:
    return sorted(path.name for path in METRICS_DIR.iterdir() if (path / f"{path.name}.py").is_file())


def load_metric(name: str, **kwargs) -> evaluate.EvaluationModule:
    import evaluate  # on first use: a second of imports that predict, export and a refused command never need

    local = METRICS_DIR / name
    if (local / f"{name}.py").is_file():
        return evaluate.load(str(local), **kwargs)
    return evaluate.load(name, **kwargs)
