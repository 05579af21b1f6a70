"""What a sweep is to do, and where its study lives: shared by the runner, the workers and the report.

In:  the checked config, space and command-line choices (built by :func:`pipelines.sweep.run.run_sweep`);
     a storage URL or journal file path; a pruner name.
Out: :class:`SweepPlan` (picklable, so worker processes receive it whole); the names of the files a
     sweep writes in OUTPUT_DIR; an Optuna storage (:func:`open_storage`) and pruner (:func:`make_pruner`).
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Callable

try:
    import optuna
except ImportError:  # the [sweep] extra; run_sweep says how to install it
    optuna = None

from pipelines.sweep.space import Param, SweepError

JOURNAL_FILE = "optuna.journal"
LOCK_FILE = ".sweep.lock"
TRIALS_DIR = "trials"
TRIAL_FILE = "trial.json"
REPORT_FILE = "sweep.md"
BEST_CONFIG_FILE = "best.yaml"
BEST_RUN_DIR = "best"
PRUNERS = ("none", "median", "hyperband")
# A worker on another machine is presumed dead after missing heartbeats this long (RDB storages).
HEARTBEAT_SECONDS, HEARTBEAT_GRACE_SECONDS = 60, 180

TaskLookup = Callable[[str], type]


@dataclass(frozen=True)
class SweepPlan:
    """Everything a worker process needs (picklable: each worker process receives it)."""

    config_path: str
    overrides: tuple[str, ...]
    """The user's overrides plus the pins that make a trial reproducible elsewhere."""
    params: tuple[Param, ...]
    metric: str
    direction: str
    trials: int
    output_dir: str
    study_name: str
    storage: str
    pruner: str
    seed: int
    deadline: float | None
    first_report: int = 1
    """Examples seen at the first evaluation of the config as given (the Optuna step unit)."""

    @property
    def trials_dir(self) -> Path:
        return Path(self.output_dir) / TRIALS_DIR


def open_storage(storage: str):
    """An Optuna storage from a URL (RDB, ``redis://`` journal) or a journal file path."""
    if storage.startswith(("redis://", "rediss://")):
        from optuna.storages.journal import JournalRedisBackend

        return optuna.storages.JournalStorage(JournalRedisBackend(storage))
    if "://" in storage:
        # Heartbeats let a worker anywhere notice a trial whose worker died on another machine.
        return optuna.storages.RDBStorage(storage, heartbeat_interval=HEARTBEAT_SECONDS, grace_period=HEARTBEAT_GRACE_SECONDS)
    from optuna.storages.journal import JournalFileBackend, JournalFileOpenLock

    Path(storage).parent.mkdir(parents=True, exist_ok=True)
    # The open lock (an O_EXCL lock file) also works where symlinks do not, e.g. some network file systems.
    return optuna.storages.JournalStorage(JournalFileBackend(storage, lock_obj=JournalFileOpenLock(storage)))


def make_pruner(name: str, trials: int, first_report: int = 1):
    """An Optuna pruner; ``first_report`` is the examples seen at a trial's first evaluation."""
    if name == "none":
        return optuna.pruners.NopPruner()
    if name == "median":
        # Optuna's default (5 finished trials before pruning starts) would never prune a short sweep.
        return optuna.pruners.MedianPruner(n_startup_trials=max(1, min(5, trials // 4)))
    if name == "hyperband":
        # Rungs below the first evaluation would only add brackets that never see a report.
        return optuna.pruners.HyperbandPruner(min_resource=max(1, first_report))
    raise SweepError(f"--pruner {name!r}: choose one of {', '.join(PRUNERS)}")
