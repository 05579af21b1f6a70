"""pipelines.sweep: search-space parsing and checking against the config schema."""

from __future__ import annotations

from pathlib import Path

import pytest
import yaml

from pipelines.config import TaskOptions
from pipelines.config_loading import load_config
from pipelines.sweep import Param, SweepError, load_space, yaml_scalar


class DemoOptions(TaskOptions):
    doc_stride: int = 128
    label_all_tokens: bool = False


def options_for(name: str) -> type[TaskOptions]:
    if name not in ("demo", "classification"):
        raise KeyError(f"unknown task {name!r}")
    return DemoOptions


BASE = """task: demo
output_dir: runs/x
data:
  path: some/dataset
"""


def space_of(tmp_path: Path, text: str | None, *overrides: str, base: str = BASE) -> list[Param]:
    config_path = tmp_path / "run.yaml"
    config_path.write_text(base)
    config = load_config(config_path, list(overrides), options_for)
    space_path = None
    if text is not None:
        space_path = tmp_path / "space.yaml"
        space_path.write_text(text)
    return load_space(space_path, config, config_path=config_path, overrides=list(overrides), options_for=options_for)


def test_sweep_space_reads_every_distribution(tmp_path):
    params = space_of(tmp_path, """
train.learning_rate: {log_uniform: [1e-5, 5.0e-4]}
train.batch_size: {choice: [16, 32]}
train.warmup_fraction: {uniform: [0, 0.2], step: 0.05}
train.num_epochs: {int: [1, 4]}
train.gradient_accumulation_steps: {log_int: [1, 8]}
demo.doc_stride: {int: [64, 256], step: 64}
model.architecture.num_hidden_layers: {int: [2, 6]}
""")
    by_key = {param.key: param for param in params}
    # 1e-5 without a dot is a string to PyYAML; the space reads it as the number meant.
    assert by_key["train.learning_rate"] == Param("train.learning_rate", "log_uniform", 1e-5, 5e-4)
    assert by_key["train.batch_size"].choices == (16, 32)
    assert by_key["train.warmup_fraction"].step == 0.05
    assert by_key["demo.doc_stride"] == Param("demo.doc_stride", "int", 64, 256, 64)
    assert by_key["train.gradient_accumulation_steps"].kind == "log_int"


@pytest.mark.parametrize(("text", "expected"), [
    ("train.learnig_rate: {log_uniform: [1.0e-5, 1.0e-3]}", "unknown key 'train.learnig_rate'; did you mean 'train.learning_rate'"),
    ("trian.learning_rate: {log_uniform: [1.0e-5, 1.0e-3]}", "unknown key 'trian.learning_rate'; did you mean 'train'"),
    ("demo.stride: {int: [1, 4]}", "unknown key 'demo.stride'; did you mean 'demo.doc_stride'"),
    ("train.lr_scheduler: {uniform: [0, 1]}", "'train.lr_scheduler' takes one of 'linear', 'cosine', 'constant', so a uniform"),
    ("data.text_column: {int: [0, 3]}", "'data.text_column' takes null or str, so an int distribution cannot search it; use choice"),
    ("train.batch_size: {uniform: [8, 32]}", "'train.batch_size' takes int, so a uniform distribution cannot search it; use int"),
    ("train.batch_size: {choice: []}", "train.batch_size: choice needs a non-empty list"),
    ("train.batch_size: {choice: [8, 8]}", "choice lists a value twice"),
    # Two spellings of one setting: the schema reads them alike, and the study searched it twice.
    ("train.batch_size: {choice: [8, '8']}", "train.batch_size: choices 8 and '8' are the same setting (8); list it once"),
    ("train.learning_rate: {choice: [1, 1.0, 2]}", "choices 1 and 1.0 are the same setting (1.0)"),
    ("train.batch_size: 16", "train.batch_size: expected one distribution"),
    ("train.learning_rate: {log_uniform: [1.0e-3, 1.0e-5]}", "needs low < high"),
    ("train.learning_rate: {log_uniform: [0, 1.0e-3]}", "needs a positive low bound"),
    ("train.num_epochs: {int: [1, 2.5]}", "int needs whole-number bounds"),
    ("train.warmup_fraction: {uniform: [0, 1]}", "train.warmup_fraction=1 (uniform [0, 1]) is not a valid config"),
    ("train.lr_scheduler: {choice: [linear, bogus]}", "Input should be 'linear', 'cosine' or 'constant' (got 'bogus')"),
    ("train: {uniform: [0, 1]}", "'train' is a config section"),
    ("train.learning_rate: {uniform: [0.1, 0.2], choice: [1]}", "one distribution per key"),
    ("{}", "the search space is empty"),
])
def test_sweep_space_bad_input_names_key_and_file(tmp_path, text, expected):
    with pytest.raises(SweepError) as raised:
        space_of(tmp_path, text)
    assert expected in str(raised.value)
    assert str(tmp_path / "space.yaml") in str(raised.value)


def test_sweep_space_file_missing_is_named_as_the_search_space_not_a_config_file(tmp_path):
    config_path = tmp_path / "run.yaml"
    config_path.write_text(BASE)
    config = load_config(config_path, [], options_for)
    with pytest.raises(SweepError) as raised:
        load_space(tmp_path / "nope.yaml", config, config_path=config_path, overrides=[], options_for=options_for)
    assert str(raised.value) == f"search space: file {tmp_path / 'nope.yaml'} does not exist"


def test_sweep_space_key_also_fixed_on_command_line_is_an_error(tmp_path):
    with pytest.raises(SweepError, match="train.learning_rate is searched here but also fixed on the command line"):
        space_of(tmp_path, "train.learning_rate: {log_uniform: [1.0e-5, 1.0e-3]}", "train.learning_rate=0.001")


@pytest.mark.parametrize(("searched", "override", "base"), [
    ("train.batch_size: {choice: [8, 16]}", "train={batch_size: 4}", BASE),
    ("train.batch_size: {choice: [8, 16]}", "train={batch_size: 4}", BASE + "train:\n  learning_rate: 0.001\n"),
    ("demo.doc_stride: {int: [64, 256]}", "demo={doc_stride: 64}", BASE),
    ("model.peft.r: {choice: [4, 8]}", "model={peft: {r: 2}}", BASE),
    # A mapping-valued setting is replaced whole: a key searched inside it would be written into the user's mapping.
    ("data.files.train: {choice: [a.jsonl, b.jsonl]}", "data.files={train: c.jsonl}", BASE),
    ("data.files.train: {choice: [a.jsonl, b.jsonl]}", "data={files: {train: c.jsonl}}", BASE),
], ids=["section", "section-in-the-file", "task-section", "nested-section", "mapping-valued-key", "mapping-valued-key-in-a-section"])
def test_sweep_space_key_fixed_through_a_section_mapping_override_is_an_error_too(tmp_path, searched, override, base):
    key = searched.split(":")[0]
    with pytest.raises(SweepError, match=f"{key} is searched here but also fixed on the command line"):
        space_of(tmp_path, searched, override, base=base)


def test_sweep_space_section_mapping_override_fixes_only_the_keys_it_gives(tmp_path):
    params = space_of(tmp_path, "train.batch_size: {choice: [8, 16]}", "train={learning_rate: 0.001}")
    assert [param.key for param in params] == ["train.batch_size"]


@pytest.mark.parametrize(("searched", "overrider", "where", "overrides", "base"), [
    ("train.num_epochs: {int: [1, 4]}", "train.max_steps", "on the command line", ["train.max_steps=50"], BASE),
    ("train.num_epochs: {int: [1, 4]}", "train.max_steps", "on the command line", ["train={max_steps: 50}"], BASE),
    ("train.num_epochs: {int: [1, 4]}", "train.max_steps", "in {config}", [], BASE + "train:\n  max_steps: 50\n"),
    # warmup_steps=0 is a warmup of zero updates, not unset: warmup_fraction changes nothing either.
    ("train.warmup_fraction: {uniform: [0.0, 0.2]}", "train.warmup_steps", "on the command line", ["train.warmup_steps=0"], BASE),
    ("data.path: {choice: [a/b, c/d]}", "data.files", "on the command line", ["data.files={train: a.jsonl}"], BASE),
    ("data.name: {choice: [mrpc, sst2]}", "data.files", "in {config}", [], BASE + "  files: {train: a.jsonl}\n"),
    # A checkpoint brings its architecture: the trials' configs recorded 1 to 4 layers of one and the same model.
    ("model.architecture.num_hidden_layers: {int: [1, 4]}", "model.name_or_path", "in {config}", [], BASE + "model:\n  name_or_path: m\n"),
    ("model.model_type: {choice: [bert, roberta]}", "model.name_or_path", "on the command line", ["model.name_or_path=m"], BASE),
], ids=["epochs-dotted", "epochs-section", "epochs-file", "warmup-fraction", "data-path", "data-name", "architecture", "model-type"])
def test_sweep_space_key_that_a_set_key_overrides_is_an_error_naming_both_and_where(tmp_path, searched, overrider, where, overrides, base):
    key = searched.split(":")[0]
    with pytest.raises(SweepError) as raised:
        space_of(tmp_path, searched, *overrides, base=base)
    where = where.format(config=tmp_path / "run.yaml")
    assert f"{tmp_path / 'space.yaml'}: {key} is searched here, but {overrider}, set {where}, overrides it" in str(raised.value)


def test_sweep_space_validation_fraction_with_an_eval_file_is_an_error(tmp_path):
    # The eval split has a file of its own: no trial held a row out, and the study ranked fractions that trained alike.
    with pytest.raises(SweepError, match=r"data.validation_fraction is searched here, but data.files.validation gives the eval split"):
        space_of(tmp_path, "data.validation_fraction: {uniform: [0.1, 0.5]}", "data.files={train: a.jsonl, validation: b.jsonl}")


def test_sweep_space_key_overridden_in_every_trial_by_another_searched_key_is_an_error(tmp_path):
    with pytest.raises(SweepError, match="train.num_epochs is searched here, but train.max_steps, searched here too, overrides it in every trial"):
        space_of(tmp_path, "train.num_epochs: {int: [1, 4]}\ntrain.max_steps: {int: [16, 64]}")


@pytest.mark.parametrize(("searched", "overrides", "base"), [
    ("train.num_epochs: {int: [1, 4]}", ["train.max_steps=null"], BASE + "train:\n  max_steps: 50\n"),
    ("train.num_epochs: {int: [1, 4]}\ntrain.max_steps: {choice: [50, null]}", [], BASE),
    ("data.name: {choice: [mrpc, sst2]}", ["data.files={}"], BASE),  # no files: data.path and data.name are read
    ("model.architecture.num_hidden_layers: {int: [1, 4]}", [], BASE),  # no checkpoint: built from the architecture
    ("data.validation_fraction: {uniform: [0.1, 0.3]}", ["data.files={train: a.jsonl}"], BASE),  # no eval file: rows held out
], ids=["unset-on-the-command-line", "null-among-the-searched-values", "empty-files", "from-scratch", "held-out"])
def test_sweep_space_key_whose_overriding_key_is_unset_in_some_trials_is_searched(tmp_path, searched, overrides, base):
    keys = [param.key for param in space_of(tmp_path, searched, *overrides, base=base)]
    assert keys == [line.split(":")[0] for line in searched.splitlines()]


def test_sweep_default_space_per_task_and_without_epochs_under_max_steps(tmp_path):
    base = BASE.replace("task: demo", "task: classification")
    keys = [param.key for param in space_of(tmp_path, None, base=base)]
    assert keys == ["train.learning_rate", "train.batch_size", "train.warmup_fraction", "train.num_epochs"]
    keys = [param.key for param in space_of(tmp_path, None, "train.max_steps=50", base=base)]
    assert "train.num_epochs" not in keys and "train.learning_rate" in keys


@pytest.mark.parametrize("overrides", [["train.warmup_steps=0"], ["train={warmup_steps: 10}"], ["train.warmup_steps=10", "train.max_steps=50"]])
def test_sweep_default_space_leaves_out_warmup_fraction_under_warmup_steps(tmp_path, overrides):
    base = BASE.replace("task: demo", "task: classification")
    keys = [param.key for param in space_of(tmp_path, None, *overrides, base=base)]
    assert "train.warmup_fraction" not in keys and "train.learning_rate" in keys
    assert ("train.num_epochs" in keys) == ("train.max_steps=50" not in overrides)


@pytest.mark.parametrize("value", [1e-05, 3.0e-4, 16, 0.0, "linear", True, None, "1e-5"])
def test_sweep_yaml_scalar_reads_back_as_the_same_value(value):
    assert yaml.safe_load(yaml_scalar(value)) == value


def test_sweep_fail_dead_trials_marks_only_trials_of_dead_local_workers():
    import subprocess
    import sys

    import optuna

    from pipelines.sweep import HOST, _worker_identity, fail_dead_trials

    finished = subprocess.run([sys.executable, "-c", "import os; print(os.getpid())"], capture_output=True, text=True)
    dead_pid = int(finished.stdout)
    study = optuna.create_study(direction="maximize")
    alive, dead, elsewhere, reused = (study.ask() for _ in range(4))
    alive.set_user_attr("worker", _worker_identity())
    dead.set_user_attr("worker", {"host": HOST, "pid": dead_pid, "process_started": 0.0})
    elsewhere.set_user_attr("worker", {"host": HOST + "-other", "pid": dead_pid, "process_started": 0.0})
    # This process's pid with another start time: a later process that reuses a dead worker's pid.
    reused.set_user_attr("worker", {**_worker_identity(), "process_started": 1.0})
    assert fail_dead_trials(study) == [dead.number, reused.number]
    states = {trial.number: trial.state.name for trial in study.get_trials()}
    assert states == {alive.number: "RUNNING", dead.number: "FAIL", elsewhere.number: "RUNNING", reused.number: "FAIL"}


def test_sweep_report_sorts_complete_then_pruned_by_objective(tmp_path):
    import optuna

    from pipelines.sweep import SweepPlan, write_report

    params = (Param("train.learning_rate", "log_uniform", 1e-5, 1e-3),)
    plan = SweepPlan(config_path="unused.yaml", overrides=(), params=params, metric="eval_loss", direction="minimize",
                     trials=4, output_dir=str(tmp_path), study_name="demo", storage="memory", pruner="median", seed=0, deadline=None)
    study = optuna.create_study(direction="minimize")
    for value, state in [(0.5, "COMPLETE"), (0.9, "PRUNED"), (0.3, "COMPLETE"), (0.7, "PRUNED"), (None, "FAIL")]:
        trial = study.ask({"train.learning_rate": optuna.distributions.FloatDistribution(1e-5, 1e-3, log=True)})
        if value is not None:
            trial.report(value, 64)  # examples seen, the sweep's Optuna step
        if state == "PRUNED":
            trial.set_user_attr("pruned_at_step", 8)
        study.tell(trial, value if state == "COMPLETE" else None, state=optuna.trial.TrialState[state])
    report = write_report(study, plan)
    rows = [line.split(" | ") for line in report["table"].splitlines()[2:]]
    assert [(row[1], row[2]) for row in rows] == [("2", "COMPLETE"), ("0", "COMPLETE"), ("3", "PRUNED"), ("1", "PRUNED"), ("4", "FAIL")]
    assert rows[2][3] == "0.7000 (at step 8)"
    assert (report["complete"], report["pruned"], report["failed"], report["best_trial"]) == (2, 2, 1, 2)
    text = (tmp_path / "sweep.md").read_text()
    assert "2 finished of 4 asked" not in text and "4 finished of 4 asked (2 complete, 2 pruned), 1 failed" in text


def test_sweep_trial_with_a_nan_objective_is_recorded_failed_as_the_study_counts_it(tmp_path, monkeypatch, tiny_bert, sentiment_files):
    import json
    import math

    import optuna

    import pipelines.train
    from pipelines.sweep import SweepPlan
    from pipelines.sweep.workers import _objective
    from tasks import get_task
    from tests.conftest import classification_config

    def diverged(config, task, *, on_start, on_evaluate):  # a learning rate that blew the run up
        Path(config.output_dir).mkdir(parents=True)
        on_start(Path(config.output_dir))
        return {"eval_accuracy": math.nan}

    monkeypatch.setattr(pipelines.train, "train", diverged)
    config = classification_config(tmp_path, tiny_bert, sentiment_files, run_name="nan")
    plan = SweepPlan(config_path=str(config), overrides=(), params=(Param("train.learning_rate", "log_uniform", 1e-5, 1e-3),),
                     metric="eval_accuracy", direction="maximize", trials=1, output_dir=str(tmp_path / "nan"), study_name="nan",
                     storage="memory", pruner="none", seed=0, deadline=None)
    study = optuna.create_study(direction="maximize")
    study.optimize(lambda trial: _objective(trial, plan, get_task, lambda: None), n_trials=1)
    assert study.trials[0].state.name == "FAIL"
    record = json.loads((tmp_path / "nan" / "trials" / "0000" / "trial.json").read_text())
    assert record["state"] == "FAIL" and record["error"] == "eval_accuracy is NaN"


def test_sweep_stops_when_every_trial_fails_instead_of_replacing_them_forever(tmp_path, monkeypatch, tiny_bert, sentiment_files):
    import math

    import pipelines.train
    from pipelines.sweep import run_sweep
    from pipelines.sweep.workers import FAILURES_IN_A_ROW_LIMIT
    from tasks import get_task
    from tests.conftest import classification_config

    runs = []

    def diverged(config, task, *, on_start, on_evaluate):  # every learning rate of the space blows the run up
        Path(config.output_dir).mkdir(parents=True)
        on_start(Path(config.output_dir))
        runs.append(config.output_dir)
        return {"eval_accuracy": math.nan}

    monkeypatch.setattr(pipelines.train, "train", diverged)
    config = classification_config(tmp_path, tiny_bert, sentiment_files, run_name="diverging")
    with pytest.raises(SweepError, match=rf"{FAILURES_IN_A_ROW_LIMIT} trials in a row failed .*the last: eval_accuracy is NaN"):
        run_sweep(str(config), [], get_task, trials=2)
    assert len(runs) == FAILURES_IN_A_ROW_LIMIT


def test_sweep_best_yaml_is_replaced_whole_or_not_at_all(tmp_path, monkeypatch):
    # Each run of the command rewrites best.yaml: written in place, a full disk (or Ctrl-C) mid-write
    # left the last run's best config cut short, and `bertpipe train best.yaml` then failed.
    import builtins
    import errno
    import io
    import os
    import types

    from pipelines.sweep import SweepPlan, write_best_config

    trial_run = tmp_path / "trials" / "0000"
    trial_run.mkdir(parents=True)
    (trial_run / "config.yaml").write_text("task: classification\noutput_dir: x\nseed: 3\n")
    plan = SweepPlan(config_path="unused.yaml", overrides=(), params=(), metric="eval_accuracy", direction="maximize",
                     trials=1, output_dir=str(tmp_path), study_name="demo", storage="memory", pruner="none", seed=0, deadline=None)
    best = types.SimpleNamespace(number=0, value=0.9, user_attrs={"run_dir": str(trial_run)})
    path = tmp_path / "best.yaml"
    path.write_text("# the last run's best config\n")
    real_open = io.open

    def disk_full_at_best_yaml(file, mode="r", *args, **kwargs):
        handle = real_open(file, mode, *args, **kwargs)  # opened for writing: truncated
        if any(flag in mode for flag in "wx") and Path(file).name.startswith("best.yaml"):
            handle.close()
            raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC))
        return handle

    monkeypatch.setattr(io, "open", disk_full_at_best_yaml)
    monkeypatch.setattr(builtins, "open", disk_full_at_best_yaml)
    with pytest.raises(OSError):
        write_best_config(best, plan, path)
    monkeypatch.undo()
    assert path.read_text() == "# the last run's best config\n"
    assert sorted(item.name for item in tmp_path.iterdir()) == ["best.yaml", "trials"]
    assert yaml.safe_load(write_best_config(best, plan, path).read_text())["seed"] == 3


def test_sweep_plots_are_replaced_whole_or_not_at_all(tmp_path, monkeypatch):
    """A sweep redraws its plots each time it reports (resumed, extended): a plot that failed mid-write (a
    full disk) replaced the last good image with a truncated one. Now it stays as it was, nothing beside it."""
    import optuna
    from matplotlib.figure import Figure

    from pipelines.sweep import SweepPlan, write_plots

    plan = SweepPlan(config_path="unused.yaml", overrides=(), params=(), metric="eval_accuracy", direction="maximize",
                     trials=3, output_dir=str(tmp_path), study_name="demo", storage="memory", pruner="none", seed=0, deadline=None)
    study = optuna.create_study(direction="maximize")
    for value in (0.5, 0.7, 0.6):
        trial = study.ask({"train.learning_rate": optuna.distributions.FloatDistribution(1e-5, 1e-3, log=True)})
        study.tell(trial, value)
    history = tmp_path / "optimization_history.png"
    assert write_plots(study, plan, [], tmp_path)[0] == ["optimization_history.png", "param_importances.png"]
    drawn = history.read_bytes()

    def disk_full_halfway(figure, path, **options):
        Path(path).write_bytes(b"\x89PNG truncated")
        raise OSError(28, "No space left on device")

    monkeypatch.setattr(Figure, "savefig", disk_full_halfway)
    with pytest.raises(OSError) as failed:
        write_plots(study, plan, [], tmp_path)
    assert failed.value.filename == str(history)
    assert history.read_bytes() == drawn
    assert sorted(path.name for path in tmp_path.iterdir()) == ["optimization_history.png", "param_importances.png"]
