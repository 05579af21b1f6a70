"""Hyperparameter search on Optuna: ``bertpipe sweep CONFIG --trials N``.

In:  a task config (YAML + ``key=value`` overrides) and a search space: YAML mapping dotted config
     keys to one distribution each (see :mod:`pipelines.sweep.space`), or the task's default space
     when none is given; the number of trials to finish; where the study lives (an Optuna journal
     file in OUTPUT_DIR, or any Optuna storage URL); worker processes.
Out: in the config's OUTPUT_DIR: ``trials/NNNN/``, one ordinary run directory per trial (its
     ``config.yaml`` holds the trial's values, ``trial.json`` its number, parameters and state);
     ``sweep.md`` (trials sorted by objective); ``best.yaml`` (the best trial's complete config:
     ``bertpipe train best.yaml`` reproduces it); PNG plots (optimisation history, parameter
     importances, one slice plot per parameter).

The modules, each importing only those above it:

- :mod:`~pipelines.sweep.space`: the search space, read and checked against the config schema;
- :mod:`~pipelines.sweep.plan`: the plan handed to every worker, the output file names, storage and pruner;
- :mod:`~pipelines.sweep.workers`: the worker processes, the trial objective, dead-trial handling;
- :mod:`~pipelines.sweep.report`: ``sweep.md``, ``best.yaml`` and the plots;
- :mod:`~pipelines.sweep.run`: :func:`run_sweep`, which ties them together.
"""

from pipelines.sweep.plan import (
    BEST_CONFIG_FILE,
    BEST_RUN_DIR,
    JOURNAL_FILE,
    REPORT_FILE,
    TRIAL_FILE,
    TRIALS_DIR,
    SweepPlan,
    make_pruner,
    open_storage,
)
from pipelines.sweep.report import write_best_config, write_plots, write_report
from pipelines.sweep.run import DEFAULT_OBJECTIVES, run_sweep
from pipelines.sweep.space import DEFAULT_SPACES, Param, SweepError, default_space, load_space, yaml_scalar
from pipelines.sweep.workers import HOST, _worker_identity, fail_dead_trials, work

__all__ = [
    "BEST_CONFIG_FILE", "BEST_RUN_DIR", "DEFAULT_OBJECTIVES", "DEFAULT_SPACES", "HOST", "JOURNAL_FILE", "REPORT_FILE",
    "TRIAL_FILE", "TRIALS_DIR", "Param", "SweepError", "SweepPlan", "default_space", "fail_dead_trials", "load_space",
    "make_pruner", "open_storage", "run_sweep", "work", "write_best_config", "write_plots", "write_report", "yaml_scalar",
    "_worker_identity",
]
