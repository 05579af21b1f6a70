"""Hyperparameter search on Optuna: ``bertpipe sweep CONFIG --trials N``.

In:  a task config (YAML + ``key=value`` overrides) and a search space: YAML mapping dotted config
     keys to one distribution each, e.g.

         train.learning_rate: {log_uniform: [1.0e-5, 5.0e-4]}
         train.batch_size: {choice: [16, 32]}
         train.warmup_fraction: {uniform: [0.0, 0.2]}
         train.num_epochs: {int: [1, 4]}

     (``uniform``/``int`` also take ``step``; ``log_int`` is an integer range on a log scale), or
     the task's default space when none is given; the number of trials to finish; where the study
     lives (an Optuna journal file in OUTPUT_DIR, or any Optuna storage URL); worker processes.
Out: in the config's OUTPUT_DIR: ``trials/NNNN/``, one ordinary run directory per trial (its
     ``config.yaml`` holds the trial's values, ``trial.json`` its number, parameters and state);
     ``sweep.md`` (trials sorted by objective); ``best.yaml`` (the best trial's complete config:
     ``bertpipe train best.yaml`` reproduces it); PNG plots (optimisation history, parameter
     importances, one slice plot per parameter).

Every key of the space is checked against the task's config schema before the first trial: an
unknown key, a numeric distribution on a non-numeric key, an empty choice or a bound the schema
rejects is a :class:`SweepError` (exit 2) naming the key and the file.

A trial is :func:`pipelines.train.train` on the config plus the trial's values. Its objective is
``train.metric_for_best_model`` (a default per task when unset), in the task's direction, reported
at every scheduled evaluation so the pruner can stop a hopeless trial there. Each worker runs
trials one after another until the study holds N finished (complete or pruned) trials. A killed
sweep is continued by rerunning the same command: trials whose worker process is gone are marked
failed, their run directories are left as they were, and new trials (new numbers, so new
directories) take their places.
"""

from __future__ import annotations

import difflib
import math
import os
import socket
import time
import types
import typing
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable, Sequence

import numpy as np
import psutil
import yaml
from pydantic import BaseModel

try:
    import optuna
except ImportError:  # the [sweep] extra; run_sweep says how to install it
    optuna = None

from pipelines.config import ConfigError, RunConfig, TaskOptions, load_config, parse_override, read_yaml

OptionsLookup = Callable[[str], type[TaskOptions]]


class SweepError(ConfigError):
    """A sweep that cannot run as asked (bad search space, objective, storage or study)."""


FLOAT_DISTRIBUTIONS = ("uniform", "log_uniform")
INT_DISTRIBUTIONS = ("int", "log_int")
DISTRIBUTIONS = (*FLOAT_DISTRIBUTIONS, *INT_DISTRIBUTIONS, "choice")

# What most fine-tuning papers search (learning rate first, then batch size, warmup and length);
# ranges per task from their usual recipes. Keys not in the table fall back to ``_COMMON_SPACE``.
_COMMON_SPACE: dict[str, dict[str, Any]] = {
    "train.learning_rate": {"log_uniform": [1.0e-5, 3.0e-4]},
    "train.batch_size": {"choice": [16, 32]},
    "train.warmup_fraction": {"uniform": [0.0, 0.2]},
    "train.num_epochs": {"int": [1, 4]},
}
DEFAULT_SPACES: dict[str, dict[str, dict[str, Any]]] = {
    "classification": _COMMON_SPACE,
    "ner": _COMMON_SPACE,
    "qa": {**_COMMON_SPACE, "train.learning_rate": {"log_uniform": [1.0e-5, 1.0e-4]}, "train.num_epochs": {"int": [1, 3]}},
    "translation": {**_COMMON_SPACE, "train.learning_rate": {"log_uniform": [1.0e-5, 1.0e-3]}, "train.num_epochs": {"int": [1, 5]}},
    "mlm": {**_COMMON_SPACE, "train.learning_rate": {"log_uniform": [5.0e-5, 1.0e-3]}, "train.batch_size": {"choice": [32, 64]},
            "train.warmup_fraction": {"uniform": [0.0, 0.1]}},
}


@dataclass(frozen=True)
class Param:
    """One searched config key and its distribution."""

    key: str
    kind: str
    low: float | int | None = None
    high: float | int | None = None
    step: float | int | None = None
    choices: tuple[Any, ...] = ()

    def suggest(self, trial) -> Any:
        """The value an Optuna trial proposes for this key."""
        if self.kind == "choice":
            return trial.suggest_categorical(self.key, list(self.choices))
        if self.kind in INT_DISTRIBUTIONS:
            return trial.suggest_int(self.key, int(self.low), int(self.high), step=int(self.step or 1), log=self.kind == "log_int")
        return trial.suggest_float(self.key, float(self.low), float(self.high), step=self.step, log=self.kind == "log_uniform")

    def describe(self) -> str:
        if self.kind == "choice":
            return f"choice {list(self.choices)}"
        step = f" step {self.step}" if self.step is not None else ""
        return f"{self.kind} [{self.low}, {self.high}]{step}"

    def candidate_values(self) -> list[Any]:
        """Values that must all pass the config schema: the bounds, or every choice."""
        return list(self.choices) if self.kind == "choice" else [self.low, self.high]


def yaml_scalar(value: Any) -> str:
    """``value`` as an override's right-hand side that YAML reads back as the same value.

    ``str(1e-05)`` would not do: PyYAML reads ``1e-05`` (no dot) as a string.
    """
    return yaml.safe_dump([value], default_flow_style=True, width=10**6).strip()[1:-1]


# ----- reading and checking a space ------------------------------------------------------------------
def default_space(config: RunConfig) -> dict[str, dict[str, Any]]:
    """The task's default space; epochs are left out when ``train.max_steps`` fixes the length."""
    space = dict(DEFAULT_SPACES.get(config.task, _COMMON_SPACE))
    if config.train.max_steps:
        space.pop("train.num_epochs", None)
    return space


def load_space(
    space_path: str | Path | None,
    config: RunConfig,
    *,
    config_path: str | Path,
    overrides: Sequence[str],
    options_for: OptionsLookup,
) -> list[Param]:
    """Read and check the search space (``space_path``, or the task's default space)."""
    if space_path is None:
        tree, source = default_space(config), f"the default search space of task {config.task!r}"
    else:
        try:
            tree = read_yaml(space_path)
        except ConfigError as error:
            raise SweepError(f"search space: {error}") from None
        source = str(space_path)
    if not tree:
        raise SweepError(f"{source}: the search space is empty; give at least one key with a distribution")
    fixed = {".".join(parse_override(override)[0]) for override in overrides}
    params = []
    for key, spec in tree.items():
        param = _parse_param(str(key), spec, source)
        if param.key in fixed:
            raise SweepError(f"{source}: {param.key} is searched here but also fixed on the command line; drop one of them")
        _check_against_schema(param, source, config.task, options_for(config.task))
        _check_values(param, source, config_path, overrides, options_for)
        params.append(param)
    return params


def _parse_param(key: str, spec: Any, source: str) -> Param:
    where = f"{source}: {key}"
    if not isinstance(spec, dict) or not any(name in spec for name in DISTRIBUTIONS):
        raise SweepError(f"{where}: expected one distribution, e.g. {{log_uniform: [1.0e-5, 5.0e-4]}}, "
                         f"{{choice: [16, 32]}}; the distributions are {', '.join(DISTRIBUTIONS)} (got {spec!r})")
    kinds = [name for name in spec if name in DISTRIBUTIONS]
    extra = [name for name in spec if name not in (*DISTRIBUTIONS, "step")]
    if len(kinds) > 1 or extra:
        raise SweepError(f"{where}: one distribution per key (and an optional step), got {sorted(map(str, spec))}")
    kind, value = kinds[0], spec[kinds[0]]
    if kind == "choice":
        if not isinstance(value, list) or not value:
            raise SweepError(f"{where}: choice needs a non-empty list of values (got {value!r})")
        if "step" in spec:
            raise SweepError(f"{where}: step goes with uniform or int, not choice")
        odd = [choice for choice in value if not isinstance(choice, (bool, int, float, str)) and choice is not None]
        if odd:
            raise SweepError(f"{where}: choices must be numbers, strings, booleans or null (got {odd[0]!r})")
        if len(set(map(repr, value))) != len(value):
            raise SweepError(f"{where}: choice lists a value twice ({value!r})")
        return Param(key, kind, choices=tuple(value))
    if not isinstance(value, list) or len(value) != 2:
        raise SweepError(f"{where}: {kind} needs [low, high] (got {value!r})")
    low, high = (_number(bound, where) for bound in value)
    step = _number(spec["step"], where) if spec.get("step") is not None else None
    if kind in INT_DISTRIBUTIONS:
        if any(not float(x).is_integer() for x in (low, high, step or 1)):
            raise SweepError(f"{where}: {kind} needs whole-number bounds (got {value!r}); use uniform for fractions")
        low, high, step = int(low), int(high), (int(step) if step is not None else None)
    if not low < high:
        raise SweepError(f"{where}: {kind} needs low < high (got {value!r})")
    if kind.startswith("log") and low <= 0:
        raise SweepError(f"{where}: {kind} needs a positive low bound (got {low!r})")
    if step is not None and (kind.startswith("log") or step <= 0):
        raise SweepError(f"{where}: step must be positive and goes with uniform or int, not {kind}")
    return Param(key, kind, low, high, step)


def _number(value: Any, where: str) -> float:
    # PyYAML reads ``1e-5`` (no dot) as a string; accept it as the number the user meant.
    if isinstance(value, str):
        try:
            value = float(value)
        except ValueError:
            pass
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not math.isfinite(value):
        raise SweepError(f"{where}: bounds must be finite numbers (got {value!r})")
    return value


def _section_type(annotation: Any) -> type[BaseModel] | None:
    candidates = [annotation, *typing.get_args(annotation)]
    return next((c for c in candidates if isinstance(c, type) and issubclass(c, BaseModel)), None)


def _is_free_mapping(annotation: Any) -> bool:
    """``dict[...]`` fields (``model.architecture``, ``data.files``) take keys the schema does not list."""
    return any(typing.get_origin(c) is dict or c is dict for c in (annotation, *typing.get_args(annotation)))


def _leaf_types(annotation: Any) -> set[Any]:
    if typing.get_origin(annotation) in (typing.Union, types.UnionType):
        return set().union(*(_leaf_types(arg) for arg in typing.get_args(annotation)))
    return {annotation}


def _check_against_schema(param: Param, source: str, task_name: str, options_cls: type[TaskOptions]) -> None:
    """The key names a setting of the task's schema, and a numeric distribution a numeric setting."""
    model: type[BaseModel] = RunConfig
    annotation: Any = None
    parts = param.key.split(".")
    for depth, part in enumerate(parts):
        at_top = model is RunConfig
        if at_top and part == task_name:
            model, annotation = options_cls, options_cls
        else:
            fields = {name: field for name, field in model.model_fields.items() if name != "task_options"}
            if part not in fields:
                valid = sorted([*fields, *([task_name] if at_top else [])])
                close = difflib.get_close_matches(part, valid, n=1, cutoff=0.5)
                hint = f"; did you mean {'.'.join([*parts[:depth], close[0]])!r}?" if close else ""
                raise SweepError(f"{source}: unknown key {param.key!r}{hint} (valid here: {', '.join(valid)})")
            annotation = fields[part].annotation
        if depth == len(parts) - 1:
            break
        if _is_free_mapping(annotation):
            annotation = Any  # its keys and values belong to the model's / the data's own config
            break
        section = _section_type(annotation)
        if section is None:
            raise SweepError(f"{source}: {param.key!r}: {'.'.join(parts[:depth + 1])} is a setting, not a section")
        model = section
    if annotation is not Any and _section_type(annotation) is not None and not _leaf_types(annotation) & {int, float}:
        raise SweepError(f"{source}: {param.key!r} is a config section; search one of its keys instead")
    if param.kind == "choice" or annotation is Any:
        return
    accepted = _leaf_types(annotation)
    wanted = {float} if param.kind in FLOAT_DISTRIBUTIONS else {int, float}
    if not accepted & wanted:
        advice = "use int for a whole-number key" if int in accepted else "use choice for a non-numeric key"
        raise SweepError(
            f"{source}: {param.key!r} takes {_describe_type(accepted)}, so {'an' if param.kind == 'int' else 'a'} {param.kind} distribution cannot search it; {advice}"
        )


def _describe_type(accepted: set[Any]) -> str:
    names = []
    for kind in accepted:
        if typing.get_origin(kind) is typing.Literal:
            names.append("one of " + ", ".join(map(repr, typing.get_args(kind))))
        elif kind is type(None):
            names.append("null")
        else:
            names.append(getattr(kind, "__name__", str(kind)))
    return " or ".join(sorted(names))


def _check_values(param: Param, source: str, config_path, overrides: Sequence[str], options_for: OptionsLookup) -> None:
    """Every bound / choice passes the schema's own checks (ranges, literals, cross-field rules)."""
    for value in param.candidate_values():
        try:
            load_config(config_path, [*overrides, f"{param.key}={yaml_scalar(value)}"], options_for)
        except ConfigError as error:
            message = str(error).replace("the command line", source)
            raise SweepError(f"{source}: {param.key}={value!r} ({param.describe()}) is not a valid config: {message}") from None


# ----- running a study ---------------------------------------------------------------------------------
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
# The objective when train.metric_for_best_model is unset: each task's headline metric.
DEFAULT_OBJECTIVES = {
    "classification": "eval_accuracy", "ner": "eval_f1", "qa": "eval_f1", "translation": "eval_bleu", "mlm": "eval_perplexity",
}

TaskLookup = Callable[[str], type]


@dataclass(frozen=True)
class SweepPlan:
    """Everything a worker process needs (picklable: workers are spawned)."""

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


def run_sweep(
    config_path: str,
    overrides: Sequence[str],
    get_task: TaskLookup,
    *,
    trials: int,
    space_path: str | None = None,
    study_name: str | None = None,
    storage: str | None = None,
    workers: int = 1,
    timeout: float | None = None,
    pruner: str = "median",
) -> dict[str, Any]:
    """Run (or continue) the study until it holds ``trials`` finished trials; write the report."""
    if optuna is None:
        raise SweepError("bertpipe sweep needs optuna: pip install -e '.[sweep]'")
    for flag, value in (("--trials", trials), ("--workers", workers)):
        if value < 1:
            raise SweepError(f"{flag} must be at least 1 (got {value})")
    if timeout is not None and timeout <= 0:
        raise SweepError(f"--timeout must be positive seconds (got {timeout})")
    options_for = lambda name: get_task(name).Options  # noqa: E731
    base = load_config(config_path, list(overrides), options_for)
    params = load_space(space_path, base, config_path=config_path, overrides=overrides, options_for=options_for)
    metric = base.train.metric_for_best_model or DEFAULT_OBJECTIVES.get(base.task)
    if not metric:
        raise SweepError(f"{config_path}: set train.metric_for_best_model: the objective of the sweep")
    if base.train.greater_is_better is not None:
        maximize = base.train.greater_is_better
    else:
        maximize = get_task(base.task).higher_is_better.get(metric.removeprefix("eval_"), True)
    make_pruner(pruner, trials)  # an unknown name fails here, before anything is written
    output_dir = Path(base.output_dir)
    plan = SweepPlan(
        config_path=str(config_path), overrides=tuple(_pins(base, overrides, workers)), params=tuple(params),
        metric=metric, direction="maximize" if maximize else "minimize", trials=trials, output_dir=str(output_dir),
        study_name=study_name or output_dir.name, storage=storage or str(output_dir / JOURNAL_FILE),
        pruner=pruner, seed=base.seed, deadline=time.time() + timeout if timeout else None,
        first_report=(base.train.eval_steps or 1) * base.train.batch_size * base.train.gradient_accumulation_steps,
    )
    optuna.logging.set_verbosity(optuna.logging.WARNING)
    output_dir.mkdir(parents=True, exist_ok=True)
    study = _create_study(plan)
    for number in fail_dead_trials(study):
        print(f"trial {number}: its worker process is gone; marked failed, {_trial_dir(plan, number)} left as it was")
    started = time.perf_counter()
    dead_workers = _run_workers(plan, get_task, workers)
    wall = time.perf_counter() - started
    report = write_report(optuna.load_study(study_name=plan.study_name, storage=open_storage(plan.storage)), plan, wall, options_for)
    report["dead_workers"] = dead_workers
    return report


def _pins(config: RunConfig, overrides: Sequence[str], workers: int) -> list[str]:
    """Settings a trial fixes so that its config reproduces it on another machine or process count."""
    from pipelines.runtime import resolve_mixed_precision

    # Each trial writes to its own directory: the sweep's output_dir is no trial's setting.
    pins = [override for override in overrides if parse_override(override)[0] != ["output_dir"]]
    if config.train.mixed_precision == "auto":
        # auto is bf16 on some machines and fp32 on others; best.yaml must say which one ran.
        pins.append(f"train.mixed_precision={resolve_mixed_precision('auto')}")
    if not config.train.torch_num_threads:
        # Each of K workers gets its share of the cores; the thread count also changes float
        # summation order, so best.yaml keeps it to reproduce the metric exactly.
        cores = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count() or 1
        pins.append(f"train.torch_num_threads={max(1, cores // workers)}")
    return pins


def _create_study(plan: SweepPlan):
    try:
        study = optuna.create_study(
            storage=open_storage(plan.storage), study_name=plan.study_name, direction=plan.direction, load_if_exists=True,
        )
    except Exception as error:  # a bad URL, an unreachable server, a journal that is not one
        if isinstance(error, SweepError):
            raise
        raise SweepError(f"--storage {plan.storage}: cannot open the Optuna study: {error}") from None
    objective = study.user_attrs.get("objective")
    if objective is None:
        study.set_user_attr("objective", plan.metric)
    elif objective != plan.metric or study.direction.name.lower() != plan.direction:
        raise SweepError(
            f"study {plan.study_name!r} in {plan.storage} optimises {objective} ({study.direction.name.lower()}), not "
            f"{plan.metric} ({plan.direction}); use another --study or output_dir"
        )
    return study


# ----- which trials count ------------------------------------------------------------------------------
HOST = socket.gethostname()


def _worker_identity() -> dict[str, Any]:
    # The start time tells a live worker from a later process that reuses its pid.
    return {"host": HOST, "pid": os.getpid(), "process_started": psutil.Process().create_time()}


def _worker_alive(worker: dict[str, Any]) -> bool:
    try:
        process = psutil.Process(worker["pid"])
        return abs(process.create_time() - worker["process_started"]) < 0.5 and process.status() != psutil.STATUS_ZOMBIE
    except (psutil.NoSuchProcess, KeyError, TypeError):
        return False


def fail_dead_trials(study) -> list[int]:
    """Mark FAILED the running trials whose worker on this machine no longer exists (kill -9, crash).

    Workers on other machines are judged by the storage's heartbeat instead (RDB storages), which
    Optuna checks each time a trial starts.
    """
    failed = []
    for trial in study.get_trials(deepcopy=False, states=(optuna.trial.TrialState.RUNNING,)):
        worker = trial.user_attrs.get("worker")
        if worker and worker.get("host") == HOST and not _worker_alive(worker):
            study.tell(trial.number, state=optuna.trial.TrialState.FAIL, skip_if_finished=True)
            failed.append(trial.number)
    return failed


def _counts(study) -> tuple[int, int]:
    """(finished, running) trials; finished = complete or pruned, the ones --trials counts."""
    states = [trial.state for trial in study.get_trials(deepcopy=False)]
    finished = sum(state in (optuna.trial.TrialState.COMPLETE, optuna.trial.TrialState.PRUNED) for state in states)
    return finished, sum(state == optuna.trial.TrialState.RUNNING for state in states)


class _SurplusTrial(Exception):
    """A trial asked for after the study already had enough (workers on other machines racing)."""


# ----- workers -----------------------------------------------------------------------------------------
def _run_workers(plan: SweepPlan, get_task: TaskLookup, workers: int) -> list[str]:
    """Run the workers (here, or as spawned processes); the description of any that died."""
    if workers == 1:
        work(plan, get_task, 0)
        return []
    import multiprocessing

    context = multiprocessing.get_context("spawn")
    errors = context.SimpleQueue()
    processes = [context.Process(target=_worker_main, args=(plan, get_task, index, errors), name=f"sweep-worker-{index}")
                 for index in range(workers)]
    for process in processes:
        process.start()
    for process in processes:
        process.join()
    failures = []
    while not errors.empty():
        failures.append(errors.get())
    if failures:
        raise failures[0]
    return [f"worker {index} (pid {process.pid}) ended with exit code {process.exitcode}"
            for index, process in enumerate(processes) if process.exitcode]


def _worker_main(plan: SweepPlan, get_task: TaskLookup, index: int, errors) -> None:
    try:
        work(plan, get_task, index)
    except BaseException as error:  # handed to the parent, which reports it as the CLI would
        import pickle

        try:
            pickle.dumps(error)
        except Exception:
            error = RuntimeError(f"{type(error).__name__}: {error}")
        errors.put(error)
        raise SystemExit(1) from None


def work(plan: SweepPlan, get_task: TaskLookup, index: int) -> None:
    """One worker: start trials one at a time until the study holds ``plan.trials`` finished ones."""
    import fcntl

    optuna.logging.set_verbosity(optuna.logging.WARNING)
    storage = open_storage(plan.storage)
    study = optuna.load_study(study_name=plan.study_name, storage=storage)
    # Seeded for a reproducible sweep, but differently per worker and per restart: the same seed
    # would propose the same values again.
    seed = int(np.random.SeedSequence([plan.seed, index, len(study.get_trials(deepcopy=False))]).generate_state(1)[0])
    study.sampler = optuna.samplers.TPESampler(seed=seed)
    study.pruner = make_pruner(plan.pruner, plan.trials, plan.first_report)
    plan.trials_dir.mkdir(parents=True, exist_ok=True)
    lock_path = Path(plan.output_dir) / LOCK_FILE
    while plan.deadline is None or time.time() < plan.deadline:
        # Counting and asking happen under one lock, so that workers on this machine never start
        # more trials than are missing; the objective releases it once its trial exists.
        with lock_path.open("a") as lock:
            fcntl.flock(lock, fcntl.LOCK_EX)
            released = []

            def release() -> None:
                if not released:
                    fcntl.flock(lock, fcntl.LOCK_UN)
                    released.append(True)

            try:
                finished, running = _counts(study)
                if finished + running >= plan.trials:
                    return
                study.optimize(
                    lambda trial: _objective(trial, plan, get_task, release), n_trials=1,
                    catch=(_SurplusTrial, *_recoverable_errors()), gc_after_trial=True,
                )
            finally:
                release()


def _recoverable_errors() -> tuple[type[Exception], ...]:
    """Errors that fail one trial but not the sweep: memory for one choice of batch size."""
    import torch

    return (torch.OutOfMemoryError,)


def _trial_dir(plan: SweepPlan, number: int) -> Path:
    return plan.trials_dir / f"{number:04d}"


def _objective(trial, plan: SweepPlan, get_task: TaskLookup, release: Callable[[], None]) -> float:
    from pipelines.outputs import write_json
    from pipelines.train import train

    trial.set_user_attr("worker", _worker_identity())
    release()
    ahead = [t for t in trial.study.get_trials(deepcopy=False) if t.number < trial.number and t.state in (
        optuna.trial.TrialState.COMPLETE, optuna.trial.TrialState.PRUNED, optuna.trial.TrialState.RUNNING)]
    if len(ahead) >= plan.trials:
        trial.set_user_attr("surplus", True)
        raise _SurplusTrial(f"trial {trial.number} is surplus: {plan.trials} trials were already finished or running")

    values = {param.key: param.suggest(trial) for param in plan.params}
    run_dir = _trial_dir(plan, trial.number)
    trial_overrides = [f"{key}={yaml_scalar(value)}" for key, value in values.items()]
    overrides = [*plan.overrides, *trial_overrides, f"output_dir={run_dir}"]
    trial.set_user_attr("run_dir", str(run_dir))
    trial.set_user_attr("overrides", overrides)
    options_for = lambda name: get_task(name).Options  # noqa: E731
    config = load_config(plan.config_path, overrides, options_for)
    record = {"study": plan.study_name, "trial": trial.number, "state": "RUNNING", "objective": plan.metric,
              "params": values, "overrides": trial_overrides, "pinned": list(plan.overrides)}

    def on_start(folder: Path) -> None:
        # Written once train() has made the folder a run: before that, a file of ours in it would make
        # train() refuse the folder as not a bertpipe run.
        write_json(folder / TRIAL_FILE, record)

    pruned_at: list[tuple[int, float]] = []
    # Pruners compare trials at equal Optuna steps. Counting examples trained on rather than updates
    # keeps a batch-32 trial from being judged against batch-16 trials that have seen half the data.
    examples_per_update = config.train.batch_size * config.train.gradient_accumulation_steps

    def on_evaluate(step: int, metrics: dict[str, float]) -> bool:
        value = _objective_value(metrics, plan.metric)
        trial.report(value, step * examples_per_update)
        if trial.should_prune():
            pruned_at.append((step, value))
            return True
        return False

    started = time.perf_counter()
    try:
        summary = train(config, get_task(config.task)(config), on_start=on_start, on_evaluate=on_evaluate)
        value = _objective_value(summary, plan.metric)
    except BaseException as error:
        run_dir.mkdir(parents=True, exist_ok=True)
        write_json(run_dir / TRIAL_FILE, {**record, "state": "FAIL", "error": f"{type(error).__name__}: {error}"})
        raise
    finally:
        _reset_accelerate()
    seconds = round(time.perf_counter() - started, 1)
    if pruned_at:
        step, last = pruned_at[-1]
        trial.set_user_attr("pruned_at_step", step)
        write_json(run_dir / TRIAL_FILE, {**record, "state": "PRUNED", "pruned_at_step": step, plan.metric: last,
                                          "pruner": plan.pruner, "seconds": seconds})
        print(f"trial {trial.number}: pruned at step {step} ({plan.metric}={last:.4f}, {seconds} s) {run_dir}", flush=True)
        raise optuna.TrialPruned(f"{plan.metric}={last} at step {step}")
    write_json(run_dir / TRIAL_FILE, {**record, "state": "COMPLETE", plan.metric: value, "seconds": seconds})
    print(f"trial {trial.number}: {plan.metric}={value:.4f} ({seconds} s) {run_dir}", flush=True)
    return value


def _objective_value(metrics: dict[str, Any], metric: str) -> float:
    if metric not in metrics:
        names = sorted(key for key in metrics if key.startswith("eval_"))
        raise SweepError(f"the objective {metric} is not among the evaluation metrics {names}; set train.metric_for_best_model")
    return float(metrics[metric])


def _reset_accelerate() -> None:
    """Forget the Accelerate process state, so that the next trial in this process starts afresh.

    Accelerate keeps it per process (mixed precision, gradient accumulation); a trial with another
    gradient_accumulation_steps would otherwise inherit the previous trial's.
    """
    from accelerate.state import AcceleratorState, GradientState

    AcceleratorState._reset_state(reset_partial_state=True)
    GradientState._reset_state()


# ----- the report --------------------------------------------------------------------------------------
def write_report(study, plan: SweepPlan, wall_seconds: float | None = None, options_for: OptionsLookup | None = None) -> dict[str, Any]:
    """``sweep.md``, ``best.yaml`` and the plots in OUTPUT_DIR; returns what was written and found."""
    output_dir = Path(plan.output_dir)
    trials = [trial for trial in study.get_trials(deepcopy=False) if not trial.user_attrs.get("surplus")]
    State = optuna.trial.TrialState
    complete = [t for t in trials if t.state == State.COMPLETE]
    pruned = [t for t in trials if t.state == State.PRUNED]
    maximize = plan.direction == "maximize"

    def order(trial) -> tuple:
        value = _shown_value(trial)
        rank = {State.COMPLETE: 0, State.PRUNED: 1}.get(trial.state, 2)
        return (rank, 0 if value is None else (-value if maximize else value), trial.number)

    keys = [param.key for param in plan.params]
    for trial in trials:  # params searched by an earlier run of the study with another space
        keys += [key for key in trial.params if key not in keys]
    header = ["rank", "trial", "state", plan.metric, *keys, "steps", "seconds", "run directory"]
    rows = []
    for rank, trial in enumerate(sorted(trials, key=order), start=1):
        value = _shown_value(trial)
        shown = "" if value is None else f"{value:.4f}"
        pruned_at_step = trial.user_attrs.get("pruned_at_step", "") if trial.state == State.PRUNED else ""
        if pruned_at_step != "":
            shown += f" (at step {pruned_at_step})"
        seconds = (trial.datetime_complete - trial.datetime_start).total_seconds() if trial.datetime_complete and trial.datetime_start else None
        steps = _global_step(trial) if trial.state == State.COMPLETE else pruned_at_step
        rows.append([
            str(rank), str(trial.number), trial.state.name, shown, *(_format_param(trial.params.get(key)) for key in keys),
            str(steps), "" if seconds is None else f"{seconds:.1f}", trial.user_attrs.get("run_dir", ""),
        ])
    table = "\n".join("| " + " | ".join(row) + " |" for row in [header, ["---"] * len(header), *rows])

    best_path, best = None, None
    if complete:
        best = study.best_trial
        best_path = write_best_config(best, plan, output_dir / BEST_CONFIG_FILE, options_for)
    plots, plot_notes = write_plots(study, plan, keys, output_dir)
    failed = sum(t.state == State.FAIL for t in trials)
    running = sum(t.state == State.RUNNING for t in trials)
    span = _study_span(trials)
    lines = [
        f"# Sweep `{plan.study_name}`", "",
        f"- objective: `{plan.metric}` ({plan.direction}); pruner: {plan.pruner}; storage: `{plan.storage}`",
        f"- trials: {len(complete) + len(pruned)} finished of {plan.trials} asked ({len(complete)} complete, "
        f"{len(pruned)} pruned), {failed} failed" + (f", {running} running" if running else ""),
        "- search space: " + ", ".join(f"`{param.key}` {param.describe()}" for param in plan.params),
        "- fixed for every trial: " + (", ".join(f"`{override}`" for override in plan.overrides) or "nothing"),
    ]
    if wall_seconds is not None:
        lines.append(f"- this run of the command: {wall_seconds:.1f} s wall" + (f"; the study so far: {span:.1f} s from first start to last finish" if span else ""))
    if best_path is not None:
        lines.append(f"- best: trial {best.number}, `{plan.metric}` = {best.value:.4f}, config `{BEST_CONFIG_FILE}` "
                     f"(`bertpipe train {output_dir / BEST_CONFIG_FILE}` reproduces it)")
    lines += ["", table, ""]
    lines += [f"![{name}]({name})" for name in plots]
    lines += [f"- {note}" for note in plot_notes]
    if failed:
        lines += ["", "Failed trials (a worker killed mid-trial, or an error) keep their run directories as they were; "
                      "they do not count towards the trials asked for."]
    report_path = output_dir / REPORT_FILE
    report_path.write_text("\n".join(lines) + "\n")
    return {
        "report": str(report_path), "table": table, "best_config": str(best_path) if best_path else None,
        "best_trial": best.number if best else None, "best_value": best.value if best else None,
        "complete": len(complete), "pruned": len(pruned), "failed": failed, "plots": [str(output_dir / name) for name in plots],
    }


def _shown_value(trial) -> float | None:
    if trial.state == optuna.trial.TrialState.COMPLETE:
        return trial.value
    if trial.intermediate_values:
        return trial.intermediate_values[max(trial.intermediate_values)]
    return None


def _global_step(trial) -> int | str:
    import json

    try:
        return json.loads((Path(trial.user_attrs["run_dir"]) / "metrics.json").read_text())["global_step"]
    except (KeyError, OSError, ValueError):
        return ""


def _format_param(value: Any) -> str:
    if isinstance(value, float):
        return f"{value:.3g}"
    return "" if value is None else str(value)


def _study_span(trials) -> float | None:
    starts = [t.datetime_start for t in trials if t.datetime_start]
    ends = [t.datetime_complete for t in trials if t.datetime_complete]
    return (max(ends) - min(starts)).total_seconds() if starts and ends else None


def write_best_config(best, plan: SweepPlan, path: Path, options_for: OptionsLookup | None = None) -> Path | None:
    """The best trial's resolved config, writing to OUTPUT_DIR/best instead of its own directory."""
    from pipelines.outputs import CONFIG_FILE

    run_dir = Path(best.user_attrs.get("run_dir", ""))
    if (run_dir / CONFIG_FILE).is_file():
        tree = yaml.safe_load((run_dir / CONFIG_FILE).read_text())
    elif "overrides" in best.user_attrs:  # it ran on another machine sharing the storage: rebuild its config
        tree = load_config(plan.config_path, best.user_attrs["overrides"], options_for).to_yaml_dict()
    else:
        return None
    tree["output_dir"] = str(Path(plan.output_dir) / BEST_RUN_DIR)
    tree["overwrite"] = False
    header = (
        f"# Run:  bertpipe train {path}\n"
        f"# Trial {best.number} of sweep {plan.study_name!r}: {plan.metric} = {best.value!r} (run directory {run_dir}).\n"
        "# The complete config of that trial; the same seed, precision and thread count reproduce its metric.\n"
    )
    path.write_text(header + yaml.safe_dump(tree, sort_keys=False))
    return path


def write_plots(study, plan: SweepPlan, keys: list[str], folder: Path) -> tuple[list[str], list[str]]:
    """Optimisation history, parameter importances and a slice plot per parameter, as PNG files."""
    import warnings

    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    from optuna.visualization import matplotlib as plots

    wanted = [
        ("optimization_history.png", lambda: plots.plot_optimization_history(study, target_name=plan.metric)),
        ("param_importances.png", lambda: plots.plot_param_importances(study, target_name=plan.metric)),
        *((f"slice_{key}.png", lambda key=key: plots.plot_slice(study, params=[key], target_name=plan.metric)) for key in keys),
    ]
    written, notes = [], []
    for name, draw in wanted:
        try:
            with warnings.catch_warnings():
                warnings.simplefilter("ignore")  # Optuna marks its matplotlib backend experimental
                axes = draw()
            figure = np.atleast_1d(axes).flat[0].figure
            figure.savefig(folder / name, dpi=100, bbox_inches="tight")
            plt.close(figure)
            written.append(name)
        except (ValueError, RuntimeError, ZeroDivisionError) as error:
            # Too few complete trials, or a parameter that never varied: say so rather than fail the sweep.
            notes.append(f"{name} not drawn: {error}")
    return written, notes
