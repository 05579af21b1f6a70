"""``bertpipe sweep``'s entry point: check everything, open the study, run the workers, report.

In:  a task config (YAML + ``key=value`` overrides), a search space (or the task's default), the
     number of trials to finish, the study's name and storage, worker processes, a timeout, a pruner.
Out: the study continued until it holds that many finished trials; the report (``sweep.md``,
     ``best.yaml``, plots) in OUTPUT_DIR; the summary dict :func:`pipelines.sweep.report.write_report`
     returns, plus any dead workers.
"""

from __future__ import annotations

import json
import math
import os
import time
from pathlib import Path
from typing import Any, Sequence

try:
    import optuna
except ImportError:  # the [sweep] extra; run_sweep says how to install it
    optuna = None

from pipelines.config import RunConfig, flatten_tree
from pipelines.config_loading import load_config, parse_override
from pipelines.sweep.plan import (
    JOURNAL_FILE, LOCK_FILE, TRIAL_FILE, TRIALS_DIR, SweepPlan, TaskLookup, make_pruner, open_storage,
)
from pipelines.sweep.report import write_report
from pipelines.sweep.space import SweepError, load_space
from pipelines.sweep.workers import fail_dead_trials, run_workers, trial_dir

# The objective when train.metric_for_best_model is unset: each task's headline metric, the first of these the task
# reports with the run's settings (a regression reports no accuracy, a POS tagger no F1).
DEFAULT_OBJECTIVES = {
    "classification": ("eval_accuracy", "eval_pearson"), "ner": ("eval_f1", "eval_accuracy"), "qa": ("eval_f1",),
    "translation": ("eval_bleu",), "mlm": ("eval_perplexity",),
}


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
    pruner: str | None = None,
) -> dict[str, Any]:
    """Run (or continue) the study until it holds ``trials`` finished trials; write the report. ``pruner``: none,
    median or hyperband; by default median where trials evaluate before their end (``train.eval_steps``), else none."""
    if optuna is None:
        raise SweepError("bertpipe sweep needs optuna: pip install -e '.[sweep]'")
    for flag, value in (("--trials", trials), ("--workers", workers)):
        if value < 1:
            raise SweepError(f"{flag} must be at least 1 (got {value})")
    if timeout is not None and not (math.isfinite(timeout) and timeout > 0):  # nan passed "<= 0" and ran no trial
        raise SweepError(f"--timeout must be a positive number of seconds (got {timeout})")
    options_for = lambda name: get_task(name).Options  # noqa: E731
    base = load_config(config_path, list(overrides), options_for)
    if base.train.resume_from_checkpoint:
        raise SweepError(
            f"{config_path}: train.resume_from_checkpoint={base.train.resume_from_checkpoint} (set in the config or on the "
            f"command line): each trial of a sweep is a new run; to continue a stopped sweep, run the same command "
            f"again without it"
        )
    if base.hub.push:
        # Every trial pushed to the same repository: it ended up holding the last trial to finish, not the best.
        raise SweepError(
            f"{config_path}: hub.push=true would push every trial to {base.hub.repo_id}, the last one to finish winning; "
            "sweep without it (hub.push=false), then publish the best trial's run with `bertpipe publish`"
        )
    params = load_space(space_path, base, config_path=config_path, overrides=overrides, options_for=options_for)
    metric = _objective(base, get_task, config_path)
    maximize = base.train.metric_greater_is_better(metric, get_task(base.task).higher_is_better)
    pruner = _pruner_for(base, pruner)
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
    _check_output_dir(base, output_dir)
    _check_trials_are_this_studys(plan)
    _check_journal_file(plan.storage)
    output_dir.mkdir(parents=True, exist_ok=True)
    study = _create_study(plan, base)
    for number in fail_dead_trials(study):
        print(f"trial {number}: its worker process is gone; marked failed, {trial_dir(plan, number)} left as it was")
    started = time.perf_counter()
    dead_workers = run_workers(plan, get_task, workers, imports=[get_task(base.task).__module__])
    wall = time.perf_counter() - started
    report = write_report(optuna.load_study(study_name=plan.study_name, storage=open_storage(plan.storage)), plan, wall, options_for)
    report["dead_workers"] = dead_workers
    return report


def _objective(base: RunConfig, get_task: TaskLookup, config_path: str) -> str:
    """The metric the study optimises, checked against what the task reports on this data before any trial trains.

    Checked only when a trial first reported (train's own check, on the trial's data), a regression's default
    ``eval_accuracy`` failed the sweep after its first trial had trained, and left a study that then refused the
    objective that fits, as another study's.
    """
    from pipelines.train import BestModel

    task = get_task(base.task)(base)
    eval_examples = task.load()[base.data.eval_split]
    reported = [f"eval_{name}" for name in task.metric_names()]
    absent = {f"eval_{name}" for name in task.metrics_absent_from(eval_examples)}
    metric = base.train.metric_for_best_model or next(
        (name for name in DEFAULT_OBJECTIVES.get(base.task, ()) if name in reported and name not in absent), None)
    if not metric:
        raise SweepError(f"{config_path}: set train.metric_for_best_model: the objective of the sweep (the {base.task} task "
                         f"reports {', '.join(name for name in reported if name not in absent)} here)")
    train = base.train.model_copy(update={"metric_for_best_model": metric})
    BestModel.from_config(base.model_copy(update={"train": train}), task, eval_examples)  # a metric it cannot give: refused
    return metric


def _pruner_for(config: RunConfig, asked: str | None) -> str:
    """A pruner stops a trial at an evaluation; without ``train.eval_steps`` a trial's only one is its last, so
    ``--pruner median`` was accepted, named in sweep.md, and never pruned anything."""
    if asked is None:
        return "median" if config.train.eval_steps else "none"
    if asked != "none" and not config.train.eval_steps:
        raise SweepError(
            f"--pruner {asked} stops trials at their evaluations, and without train.eval_steps a trial evaluates only "
            f"at its end; set train.eval_steps, or drop --pruner"
        )
    return asked


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


def _holds_a_sweep(folder: Path) -> bool:
    """What an earlier sweep leaves first in its output_dir: the workers' lock, the journal (default storage), trial
    records. Not a ``sweep.md`` or a ``trials/`` folder alone: a user's notes were taken for a sweep and written over."""
    return (folder / LOCK_FILE).is_file() or (folder / JOURNAL_FILE).is_file() or any((folder / TRIALS_DIR).glob(f"*/{TRIAL_FILE}"))


def _check_output_dir(config: RunConfig, output_dir: Path) -> None:
    """A sweep writes only into a new or empty folder, or an earlier sweep's, before anything is written.

    It writes ``sweep.md``, ``best.yaml``, plots and ``trials/`` there: in a training run's folder (the
    same config's ``output_dir``) or any folder of other files, it mixed its files with theirs and wrote
    over any of the same name.
    """
    from pipelines.outputs import check_outside_data_folder, is_run_dir

    if output_dir.exists() and not output_dir.is_dir():
        raise SweepError(f"output_dir {output_dir} is a file; a sweep writes its trials and report into a folder. Choose another output_dir")
    check_outside_data_folder(config, output_dir)  # its trials' runs would lie inside the data too
    if not output_dir.is_dir() or not any(output_dir.iterdir()) or _holds_a_sweep(output_dir):
        return
    what = "a bertpipe training run" if is_run_dir(output_dir) else "not empty and holds no sweep"
    raise SweepError(
        f"output_dir {output_dir} is {what}; a sweep writes its trials, sweep.md, best.yaml and plots only into a new "
        f"or empty folder, or an earlier sweep's. Give the sweep its own output_dir (e.g. output_dir={output_dir}-sweep)"
    )


def _check_trials_are_this_studys(plan: SweepPlan) -> None:
    """Refuse an output_dir whose trial folders belong to another study, before anything is written.

    Trial numbers start at 0 in every study, so a second study there would run its trials in the
    first one's folders.
    """
    for record_path in sorted(plan.trials_dir.glob(f"*/{TRIAL_FILE}")):
        try:
            study = json.loads(record_path.read_text(encoding="utf-8")).get("study")
        except (OSError, ValueError, AttributeError):
            continue  # not a record of ours: the trial itself will refuse to run in that folder
        if study is not None and study != plan.study_name:
            raise SweepError(
                f"{plan.output_dir} holds the trials of study {study!r} ({record_path}); study {plan.study_name!r} would "
                f"run its trials in the same numbered folders. Give study {plan.study_name!r} its own output_dir, or "
                f"continue {study!r} with --study {study}"
            )


def _check_journal_file(storage: str) -> None:
    """A journal file path (not a URL) names an Optuna journal or a new file, and its last record is whole.

    Optuna appended its records to any file it was given (a user's notes gained a study after their last line) and
    then failed; and a record cut short by a full disk or a crash failed the next run with a JSON traceback, after
    which every run appended to the fragment and failed again."""
    if "://" in storage:
        return
    path = Path(storage)
    if not path.is_file() or path.stat().st_size == 0:
        return
    with path.open("rb") as journal:
        first = journal.readline()
        journal.seek(-1, os.SEEK_END)
        whole = journal.read(1) == b"\n"
    try:
        record = json.loads(first)
    except ValueError:
        record = None
    if not isinstance(record, dict) or "op_code" not in record:
        raise SweepError(
            f"--storage {storage} is a file but not an Optuna journal (its first line is no journal record); bertpipe "
            "never writes into another file. Give a new file's path, or an earlier sweep's journal"
        )
    if not whole:
        raise SweepError(
            f"--storage {storage}: its last record is cut short (a write that never finished: a full disk or a crash), "
            "and Optuna cannot read the journal past it. Delete the text after the file's last newline, then run the "
            "command again to continue the study"
        )


def _check_same_job(plan: SweepPlan, study, base: RunConfig) -> None:
    """Refuse to continue a study with another job than the one its trials ran (the config with its overrides,
    before the search space's values) or another search space: only the objective was compared, so a rerun with
    other overrides, an edited config, or another sweep sharing the storage under the same study name added its
    trials to the same study, and sweep.md named one "best" among trials of different jobs; a space of another
    kind for a key ended in Optuna's traceback (exit 1) after a failed trial was added to the journal, and one of
    other bounds mixed trials of two spaces without a word."""
    job = json.loads(json.dumps(flatten_tree(base.to_yaml_dict()), default=str))
    space = {param.key: param.describe() for param in plan.params}
    recorded_job, recorded_space = study.user_attrs.get("job"), study.user_attrs.get("space")
    for what, now, recorded, absent in (("config", job, recorded_job, "None"), ("search space", space, recorded_space, "not searched")):
        if recorded is None:
            continue
        differing = sorted(key for key in set(now) | set(recorded) if now.get(key) != recorded.get(key))
        if differing:
            shown = "; ".join(f"{key}: {_shown(recorded, key, absent)} in the study, {_shown(now, key, absent)} now" for key in differing[:5])
            more = f" (and {len(differing) - 5} more)" if len(differing) > 5 else ""
            raise SweepError(
                f"study {plan.study_name!r} in {plan.storage} ran its trials with another {what}: {shown}{more}. Continue "
                f"it with the config, overrides and --space it began with, or give the new sweep its own output_dir (or --study)"
            )
    # A study begun before these were recorded: from now on, its job and space are these.
    if recorded_job is None:
        study.set_user_attr("job", job)
    if recorded_space is None:
        study.set_user_attr("space", space)


def _shown(setting: dict[str, Any], key: str, absent: str) -> str:
    return repr(setting[key]) if key in setting else absent


def _create_study(plan: SweepPlan, base: RunConfig):
    try:
        storage = open_storage(plan.storage)
        try:
            # Loaded first, not created "if missing": Optuna appends a creation record to a journal even when the study
            # exists, and a continuation refused below would have changed the journal.
            study = optuna.load_study(study_name=plan.study_name, storage=storage)
        except KeyError:
            study = optuna.create_study(storage=storage, study_name=plan.study_name, direction=plan.direction, load_if_exists=True)
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
            f"{plan.metric} ({plan.direction}); give the new study its own output_dir"
        )
    _check_same_job(plan, study, base)
    return study
