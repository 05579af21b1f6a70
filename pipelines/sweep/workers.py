"""The workers of a sweep and the trials they run; which trials count towards ``--trials``.

In:  a :class:`~pipelines.sweep.plan.SweepPlan`, a task lookup and a worker count.
Out: trials in the study, each an ordinary run directory ``trials/NNNN/`` (its ``config.yaml`` holds
     the trial's values, ``trial.json`` its number, parameters and state).

A trial is :func:`pipelines.train.train` on the config plus the trial's values. Its objective is
``train.metric_for_best_model`` (a default per task when unset), in the task's direction, reported
at every scheduled evaluation so the pruner can stop a hopeless trial there. Each worker runs
trials one after another until the study holds N finished (complete or pruned) trials. A killed
sweep is continued by rerunning the same command: trials whose worker process is gone are marked
failed (:func:`fail_dead_trials`), their run directories are left as they were, and new trials
(new numbers, so new directories) take their places.
"""

from __future__ import annotations

import math
import os
import socket
import time
from pathlib import Path
from typing import Any, Callable, Sequence

import numpy as np
import psutil

try:
    import optuna
except ImportError:  # the [sweep] extra; run_sweep says how to install it
    optuna = None

from pipelines.config_loading import load_config
from pipelines.sweep.plan import LOCK_FILE, TRIAL_FILE, SweepPlan, TaskLookup, make_pruner, open_storage
from pipelines.sweep.space import SweepError, yaml_scalar

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
FAILURES_IN_A_ROW_LIMIT = 10
"""A worker stops the sweep after this many of its trials failed in a row (every batch size out of
memory, every learning rate diverging): failed trials are replaced, so it would otherwise run until
--timeout, or forever."""


def run_workers(plan: SweepPlan, get_task: TaskLookup, workers: int, *, imports: Sequence[str] = ()) -> list[str]:
    """Run the workers (here, or as processes of their own); the description of any that died. ``imports``:
    modules a trial needs beyond this one and :mod:`pipelines.train` (the task's), imported once for all workers."""
    if workers == 1:
        work(plan, get_task, 0)
        return []
    import multiprocessing

    from pipelines.preemption import passed_on_to

    # Each worker is a fork of one process that imported the libraries, where spawn started an interpreter per
    # worker that imported them all again (seconds of CPU each, all at once). That process computes nothing
    # before it forks: no OpenMP pool or CUDA context is copied into a worker.
    context = multiprocessing.get_context("forkserver")
    context.set_forkserver_preload([__name__, "pipelines.train", *imports])
    errors = context.SimpleQueue()
    processes = [context.Process(target=_worker_main, args=(plan, get_task, index, errors), name=f"sweep-worker-{index}")
                 for index in range(workers)]
    for process in processes:
        process.start()
    with passed_on_to(processes):
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
    import signal

    from pipelines.preemption import ending_with_parent

    # As for a SIGTERM the parent passes on: the trial stops at a step boundary, is marked failed, and a rerun continues.
    ending_with_parent(signal.SIGTERM)
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

    # Optuna logs every failed trial with its traceback at WARNING. A trial error that ends the sweep
    # is reported once by the CLI (exit 2, no traceback); one that does not, the objective prints itself.
    optuna.logging.set_verbosity(optuna.logging.ERROR)
    storage = open_storage(plan.storage)
    study = optuna.load_study(study_name=plan.study_name, storage=storage)
    # Seeded for a reproducible sweep, but differently per worker and per restart: the same seed
    # would propose the same values again.
    seed = int(np.random.SeedSequence([plan.seed, index, len(study.get_trials(deepcopy=False))]).generate_state(1)[0])
    study.sampler = optuna.samplers.TPESampler(seed=seed)
    study.pruner = make_pruner(plan.pruner, plan.trials, plan.first_report)
    plan.trials_dir.mkdir(parents=True, exist_ok=True)
    lock_path = Path(plan.output_dir) / LOCK_FILE
    failed_in_a_row: list[int] = []

    def count_failures(study, trial) -> None:
        # Only trials that ran and failed: a surplus trial (workers racing) writes no record.
        record = trial_dir(plan, trial.number) / TRIAL_FILE
        if trial.state == optuna.trial.TrialState.FAIL and record.is_file():
            failed_in_a_row.append(trial.number)
        elif trial.state != optuna.trial.TrialState.FAIL:
            failed_in_a_row.clear()

    while plan.deadline is None or time.time() < plan.deadline:
        if len(failed_in_a_row) >= FAILURES_IN_A_ROW_LIMIT:
            _stop_after_failures(plan, failed_in_a_row)
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
                    catch=(_SurplusTrial, *_recoverable_errors()), gc_after_trial=True, callbacks=[count_failures],
                )
            finally:
                release()


def _stop_after_failures(plan: SweepPlan, numbers: list[int]) -> None:
    import json

    last = trial_dir(plan, numbers[-1])
    try:
        reason = json.loads((last / TRIAL_FILE).read_text(encoding="utf-8")).get("error", "unknown")
    except (OSError, ValueError):
        reason = "unknown"
    raise SweepError(
        f"{len(numbers)} trials in a row failed (trials {numbers[0]}..{numbers[-1]}; the last: {reason}, see {last / TRIAL_FILE}); "
        "the search space or the config makes every trial fail: narrow the space, then rerun the same command to continue the study"
    )


def _recoverable_errors() -> tuple[type[Exception], ...]:
    """Errors that fail one trial but not the sweep: memory for one choice of batch size."""
    import torch

    return (torch.OutOfMemoryError,)


def trial_dir(plan: SweepPlan, number: int) -> Path:
    return plan.trials_dir / f"{number:04d}"


def _objective(trial, plan: SweepPlan, get_task: TaskLookup, release: Callable[[], None]) -> float:
    from pipelines.atomic_writes import write_json
    from pipelines.train import train

    trial.set_user_attr("worker", _worker_identity())
    release()
    ahead = [t for t in trial.study.get_trials(deepcopy=False) if t.number < trial.number and t.state in (
        optuna.trial.TrialState.COMPLETE, optuna.trial.TrialState.PRUNED, optuna.trial.TrialState.RUNNING)]
    if len(ahead) >= plan.trials:
        trial.set_user_attr("surplus", True)
        raise _SurplusTrial(f"trial {trial.number} is surplus: {plan.trials} trials were already finished or running")

    values = {param.key: param.suggest(trial) for param in plan.params}
    run_dir = trial_dir(plan, trial.number)
    if run_dir.exists():
        # Trial numbers restart at 0 in a new study (another --study, or a removed journal): this folder
        # is another trial's run, which train() would refuse or, under overwrite=true, delete.
        raise SweepError(
            f"trial {trial.number} of study {plan.study_name!r} would run in {run_dir}, which already exists (a trial of "
            f"another study, or of one whose storage was removed); it was left as it was. Give this study its own output_dir"
        )
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
        if isinstance(error, _recoverable_errors()):
            print(f"trial {trial.number}: failed ({type(error).__name__}: {error}); another trial takes its place", flush=True)
        raise
    seconds = round(time.perf_counter() - started, 1)
    if pruned_at:
        step, last = pruned_at[-1]
        trial.set_user_attr("pruned_at_step", step)
        write_json(run_dir / TRIAL_FILE, {**record, "state": "PRUNED", "pruned_at_step": step, plan.metric: last,
                                          "pruner": plan.pruner, "seconds": seconds})
        print(f"trial {trial.number}: pruned at step {step} ({plan.metric}={last:.4f}, {seconds} s) {run_dir}", flush=True)
        raise optuna.TrialPruned(f"{plan.metric}={last} at step {step}")
    if math.isnan(value):
        # Optuna fails a trial whose objective is NaN (a diverged run); its record says so too.
        write_json(run_dir / TRIAL_FILE, {**record, "state": "FAIL", "error": f"{plan.metric} is NaN", "seconds": seconds})
        print(f"trial {trial.number}: {plan.metric} is NaN (diverged?); failed, another trial takes its place {run_dir}", flush=True)
        return value
    write_json(run_dir / TRIAL_FILE, {**record, "state": "COMPLETE", plan.metric: value, "seconds": seconds})
    print(f"trial {trial.number}: {plan.metric}={value:.4f} ({seconds} s) {run_dir}", flush=True)
    return value


def _objective_value(metrics: dict[str, Any], metric: str) -> float:
    if metric not in metrics:
        names = sorted(key for key in metrics if key.startswith("eval_"))
        raise SweepError(f"the objective {metric} is not among the evaluation metrics {names}; set train.metric_for_best_model")
    return float(metrics[metric])
