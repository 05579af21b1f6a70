"""``bertpipe sweep`` end to end on the tiny model: pruning, workers, kill -9 and rerun, best.yaml, bad spaces."""

from __future__ import annotations

import json
import os
import subprocess
from pathlib import Path

import psutil
import pytest
import yaml

from tests.conftest import classification_config, run_cli, start_cli

optuna = pytest.importorskip("optuna")

# 24 updates with an evaluation every 8: a trial takes about a second, and the pruner sees it twice
# before the end. Precision pinned: auto is bf16 on some CPUs and fp32 on others.
TRAIN = dict(max_steps=24, eval_steps=8, mixed_precision="no")
# The pruning sweep needs trials that differ: at 3e-3 the tiny model predicts the cue words from about
# update 32 to 48 (before that, the majority label, as untrained), at 1e-7 never. Evaluated every 16 of 64
# updates, the median pruner (one finished trial before it starts pruning in a 4-trial sweep) sees the
# difference by update 48 and stops the second kind; a 3e-3 trial a little below the finished one there may
# be stopped too, which is the median rule working.
PRUNING_TRAIN = dict(TRAIN, max_steps=64, eval_steps=16)
SPACE = """train.learning_rate: {choice: [3.0e-3, 1.0e-7]}
train.warmup_fraction: {uniform: [0.0, 0.2]}
"""
FINISHED = ("COMPLETE", "PRUNED")


def sweep_config(tmp_path: Path, tiny_bert, sentiment_files, name: str, train: dict = TRAIN) -> tuple[Path, Path]:
    config = classification_config(tmp_path, tiny_bert, sentiment_files, run_name=name, **train)
    space = tmp_path / "space.yaml"
    space.write_text(SPACE)
    return config, space


def study_trials(output_dir: Path):
    from pipelines.sweep import JOURNAL_FILE, open_storage

    study = optuna.load_study(study_name=output_dir.name, storage=open_storage(str(output_dir / JOURNAL_FILE)))
    return study.get_trials(deepcopy=False)


def trial_records(output_dir: Path) -> dict[str, dict]:
    return {folder.name: json.loads((folder / "trial.json").read_text()) for folder in sorted((output_dir / "trials").iterdir())}


@pytest.fixture(scope="module")
def sweep(tmp_path_factory, tiny_bert, sentiment_files):
    tmp_path = tmp_path_factory.mktemp("sweep")
    config, space = sweep_config(tmp_path, tiny_bert, sentiment_files, "sweep", PRUNING_TRAIN)
    result = run_cli("sweep", str(config), "--trials", "4", "--space", str(space), "--pruner", "median")
    return tmp_path / "sweep", result


def test_cli_sweep_prunes_a_hopeless_trial_and_reports(sweep):
    output_dir, result = sweep
    records = trial_records(output_dir)
    assert sorted(records) == ["0000", "0001", "0002", "0003"]
    states = {name: record["state"] for name, record in records.items()}
    assert set(states.values()) <= set(FINISHED) and "PRUNED" in states.values() and "COMPLETE" in states.values()
    for name, record in records.items():
        run_dir = output_dir / "trials" / name
        saved = yaml.safe_load((run_dir / "config.yaml").read_text())
        # The trial's values are in its resolved config, and the run is an ordinary run directory.
        assert saved["train"]["learning_rate"] == record["params"]["train.learning_rate"]
        assert saved["train"]["warmup_fraction"] == record["params"]["train.warmup_fraction"]
        assert (run_dir / "metrics.json").is_file() and (run_dir / "model.safetensors").is_file()
        if record["state"] == "PRUNED":
            assert record["pruned_at_step"] < 64 and json.loads((run_dir / "metrics.json").read_text())["global_step"] < 64
    assert any(record["state"] == "PRUNED" for record in records.values() if record["params"]["train.learning_rate"] == 1e-7)
    # The premise: the kept learning rate learnt the cue words, not only the majority label.
    assert max(record["eval_accuracy"] for record in records.values() if record["state"] == "COMPLETE") > 0.9
    trials = study_trials(output_dir)
    assert {trial.state.name for trial in trials} <= set(FINISHED)
    # Reported at the evaluations of steps 16, 32 and 48 (not the final one), keyed by examples seen (batch 8).
    assert all(set(trial.intermediate_values) == {128, 256, 384} for trial in trials if trial.state.name == "COMPLETE")

    report = (output_dir / "sweep.md").read_text()
    assert "4 finished of 4 asked" in report and "| rank | trial |" in result.stdout
    rows = [line for line in report.splitlines() if line.startswith("| ") and line[2].isdigit()]
    assert len(rows) == 4
    complete_values = [float(row.split(" | ")[3]) for row in rows if "COMPLETE" in row]
    assert complete_values == sorted(complete_values, reverse=True)
    assert [row.split(" | ")[2] for row in rows] == sorted((row.split(" | ")[2] for row in rows), key=FINISHED.index)
    for plot in ("optimization_history.png", "param_importances.png", "slice_train.learning_rate.png", "slice_train.warmup_fraction.png"):
        assert (output_dir / plot).stat().st_size > 1000, plot


def test_cli_sweep_best_yaml_reproduces_its_trial(sweep):
    output_dir, _ = sweep
    best_yaml = output_dir / "best.yaml"
    assert best_yaml.read_text().startswith(f"# Run:  bertpipe train {best_yaml}")
    complete = {name: record for name, record in trial_records(output_dir).items() if record["state"] == "COMPLETE"}
    best_name = max(complete, key=lambda name: (complete[name]["eval_accuracy"], -int(name)))
    run_cli("train", str(best_yaml))
    expected = json.loads((output_dir / "trials" / best_name / "metrics.json").read_text())
    reproduced = json.loads((output_dir / "best" / "metrics.json").read_text())
    for key in [key for key in expected if key.startswith(("eval_", "train_loss", "global_step")) and key != "eval_runtime"]:
        assert reproduced[key] == expected[key], key


def test_cli_sweep_two_workers_share_one_journal(tmp_path, tiny_bert, sentiment_files):
    config, space = sweep_config(tmp_path, tiny_bert, sentiment_files, "workers")
    run_cli("sweep", str(config), "--trials", "4", "--space", str(space), "--workers", "2")
    trials = study_trials(tmp_path / "workers")
    assert sorted(trial.number for trial in trials) == [0, 1, 2, 3]
    assert all(trial.state.name in FINISHED for trial in trials)
    assert len({trial.user_attrs["worker"]["pid"] for trial in trials}) == 2, "both workers ran trials"
    assert sorted(trial_records(tmp_path / "workers")) == ["0000", "0001", "0002", "0003"]
    # Each worker got half of the cores.
    share = max(1, len(os.sched_getaffinity(0)) // 2)
    assert all(f"train.torch_num_threads={share}" in record["pinned"] for record in trial_records(tmp_path / "workers").values())


# The sweep kills its own process group with SIGKILL at trial 1's first evaluation: mid-trial, no cleanup.
KILL_DURING_TRIAL_1 = """
import os, signal, sys
import pipelines.outputs as outputs
write = outputs.StepLog.write
def write_then_die(self, record):
    write(self, record)
    if self.path.parent.name == "0001" and "eval_accuracy" in record:
        os.killpg(os.getpgrp(), signal.SIGKILL)
outputs.StepLog.write = write_then_die
from tasks.cli import main
sys.exit(main(sys.argv[1:]))
"""


def test_cli_sweep_killed_mid_trial_continues_on_rerun(tmp_path, tiny_bert, sentiment_files):
    config, space = sweep_config(tmp_path, tiny_bert, sentiment_files, "killed")
    args = ["sweep", str(config), "--trials", "3", "--space", str(space), "--pruner", "none"]
    killed = run_cli(*args, script=KILL_DURING_TRIAL_1, new_session=True, check=False)
    assert killed.returncode == -9, killed.stderr[-3000:]
    dead_dir = tmp_path / "killed" / "trials" / "0001"
    before = {path.name: path.read_bytes() for path in dead_dir.iterdir()}
    assert json.loads(before["trial.json"])["state"] == "RUNNING" and "metrics.json" not in before

    result = run_cli(*args)
    assert "trial 1: its worker process is gone; marked failed" in result.stdout
    trials = study_trials(tmp_path / "killed")
    assert sum(trial.state.name in FINISHED for trial in trials) == 3
    assert {trial.number: trial.state.name for trial in trials}[1] == "FAIL"
    # One directory per trial number, the dead trial's left byte for byte as it was.
    assert sorted(trial_records(tmp_path / "killed")) == [f"{trial.number:04d}" for trial in trials]
    assert {path.name: path.read_bytes() for path in dead_dir.iterdir()} == before


# A scheduler's SIGTERM as trial 1 (a second trial of 24 updates) ends its 3rd update.
SIGTERM_DURING_TRIAL_1 = """
import os, signal, sys
from pipelines.preemption import StopSignals
agreed, calls = StopSignals.agreed, []
def agreed_after_a_signal(self):
    calls.append(None)
    if len(calls) == 24 + 3:
        os.kill(os.getpid(), signal.SIGTERM)
    return agreed(self)
StopSignals.agreed = agreed_after_a_signal
from tasks.cli import main
sys.exit(main(sys.argv[1:]))
"""


def test_cli_sweep_stopped_by_sigterm_marks_its_trial_failed_and_continues_on_rerun(tmp_path, tiny_bert, sentiment_files):
    config, space = sweep_config(tmp_path, tiny_bert, sentiment_files, "stopped")
    args = ["sweep", str(config), "--trials", "3", "--space", str(space), "--pruner", "none"]
    stopped = run_cli(*args, script=SIGTERM_DURING_TRIAL_1, check=False)
    assert stopped.returncode == 143, stopped.stderr[-3000:]
    trial_1 = tmp_path / "stopped" / "trials" / "0001"
    assert stopped.stderr.strip().splitlines()[-1] == (
        f"bertpipe sweep: stopped by SIGTERM at step 3 of 24; checkpoint {trial_1 / 'checkpoints' / 'step-00000003'} is complete; "
        "its trial is marked failed: the same command continues the study with a new trial"
    )
    assert "Traceback" not in stopped.stderr
    assert json.loads((trial_1 / "trial.json").read_text())["state"] == "FAIL"
    assert {trial.number: trial.state.name for trial in study_trials(tmp_path / "stopped")} == {0: "COMPLETE", 1: "FAIL"}

    run_cli(*args)
    trials = study_trials(tmp_path / "stopped")
    assert sum(trial.state.name == "COMPLETE" for trial in trials) == 3 and trials[1].state.name == "FAIL"


def sweep_with_two_training_workers(tmp_path, tiny_bert, sentiment_files, **started) -> tuple[subprocess.Popen, list, list[Path]]:
    """A sweep whose two workers are each training a long trial: (the sweep, its child processes, the trials' logs)."""
    import time

    config = classification_config(tmp_path, tiny_bert, sentiment_files, run_name="parent", max_steps=5000, eval_steps=2500,
                                   logging_steps=5, mixed_precision="no")
    space = tmp_path / "space.yaml"
    space.write_text(SPACE)
    sweep = start_cli("sweep", str(config), "--trials", "2", "--space", str(space), "--pruner", "none", "--workers", "2", **started)
    logs = [tmp_path / "parent" / "trials" / name / "log.jsonl" for name in ("0000", "0001")]
    deadline = time.monotonic() + 300
    while not all(log.is_file() and log.read_text().strip() for log in logs):
        assert sweep.poll() is None and time.monotonic() < deadline, sweep.communicate()[1][-3000:]
        time.sleep(0.05)
    # The workers, the forkserver they are forked from, and the resource tracker.
    return sweep, psutil.Process(sweep.pid).children(recursive=True), logs


def assert_trials_stopped_and_failed(tmp_path, workers, logs) -> None:
    # Every child is gone (or going: the forkserver and the resource tracker leave once their parent has), none training on.
    _, alive = psutil.wait_procs(workers, timeout=60)
    for process in alive:
        process.kill()
    assert not alive, [process.cmdline() for process in alive]
    assert {trial.number: trial.state.name for trial in study_trials(tmp_path / "parent")} == {0: "FAIL", 1: "FAIL"}
    for log in logs:
        assert json.loads((log.parent / "trial.json").read_text())["state"] == "FAIL"
        assert [path.name for path in (log.parent / "checkpoints").iterdir()], "each trial checkpointed where it stopped"


def test_cli_sweep_passes_a_sigterm_on_to_its_workers(tmp_path, tiny_bert, sentiment_files):
    """`kill PID` of a sweep with --workers ended the parent alone: its workers trained on as orphans and nobody
    said how the sweep ended. The parent now hands the signal on; each worker stops its trial at a step boundary."""
    import signal

    sweep, workers, logs = sweep_with_two_training_workers(tmp_path, tiny_bert, sentiment_files)
    sweep.send_signal(signal.SIGTERM)
    _, stderr = sweep.communicate(timeout=300)

    assert sweep.returncode == 128 + signal.SIGTERM, stderr[-3000:]
    assert stderr.count("bertpipe sweep: stopped by SIGTERM at step ") == 1 and "Traceback" not in stderr, stderr[-3000:]
    assert_trials_stopped_and_failed(tmp_path, workers, logs)


def test_cli_sweep_workers_stop_their_trials_when_the_parent_is_killed(tmp_path, tiny_bert, sentiment_files):
    """`kill -9` of the parent (or the OOM killer) passes nothing on: both workers trained on as orphans, and a rerun
    meanwhile counted their trials as running. Each worker now notices and stops its trial as a SIGTERM would."""
    sweep, workers, logs = sweep_with_two_training_workers(tmp_path, tiny_bert, sentiment_files)
    sweep.kill()
    sweep.communicate(timeout=300)
    assert_trials_stopped_and_failed(tmp_path, workers, logs)


def test_cli_sweep_interrupted_says_the_same_command_continues_it(tmp_path, tiny_bert, sentiment_files):
    # Ctrl-C (SIGINT to the whole process group, as a terminal sends it): "interrupted", and not how to go on. The sweep
    # gets SIGINT's default action: started from a shell's background job (`pytest &`), the tests ignore SIGINT, and
    # so did every process they started, the sweep and its workers training to the end.
    import signal

    sweep, workers, logs = sweep_with_two_training_workers(tmp_path, tiny_bert, sentiment_files, new_session=True,
                                                            sigint_default=True)
    os.killpg(sweep.pid, signal.SIGINT)
    _, stderr = sweep.communicate(timeout=300)
    assert sweep.returncode == 130 and "Traceback" not in stderr, stderr[-3000:]
    assert stderr.count("bertpipe sweep: interrupted; its trial is marked failed: the same command continues the study "
                        "with a new trial\n") == 1, stderr[-3000:]
    _, alive = psutil.wait_procs(workers, timeout=60)
    for process in alive:
        process.kill()
    assert not alive and {trial.state.name for trial in study_trials(tmp_path / "parent")} == {"FAIL"}


@pytest.mark.parametrize("extra, needles", [
    (["--timeout", "nan"], ["--timeout must be a positive number of seconds (got nan)"]),
    (["hub.push=true", "hub.repo_id=someone/model"], ["hub.push=true would push every trial to someone/model"]),
    (["--pruner", "median", "train.eval_steps=null"], ["--pruner median stops trials at their evaluations", "train.eval_steps"]),
    # Checked when a trial first reported: the first trial trained before the sweep stopped, leaving its study behind.
    (["train.metric_for_best_model=eval_pearson"], ["train.metric_for_best_model='eval_pearson' is not a metric the classification "
                                                    "task reports with these settings"]),
])
def test_cli_sweep_options_it_would_ignore_or_misapply_are_refused(tmp_path, tiny_bert, sentiment_files, extra, needles):
    # --timeout nan started no trial and exited 0; hub.push made every trial push to one repository, the last to
    # finish winning; --pruner median without evaluations before the end was named in sweep.md and never pruned.
    config, space = sweep_config(tmp_path, tiny_bert, sentiment_files, "refused")
    result = run_cli("sweep", str(config), "--trials", "2", "--space", str(space), *extra, check=False)
    assert result.returncode == 2 and "Traceback" not in result.stderr, result.stderr[-3000:]
    for needle in needles:
        assert needle in result.stderr, result.stderr[-3000:]
    assert not (tmp_path / "refused").exists()


def test_cli_sweep_continued_with_another_job_is_refused_naming_what_differs(tmp_path, tiny_bert, sentiment_files):
    """Only the objective was compared: a rerun with other overrides, or another sweep sharing the storage under the
    same study name, added its trials to the study, and sweep.md named one best among trials of different jobs."""
    config, space = sweep_config(tmp_path, tiny_bert, sentiment_files, "job")
    storage = tmp_path / "shared.journal"
    args = ["sweep", str(config), "--space", str(space), "--storage", str(storage), "train.max_steps=4", "train.eval_steps=null"]
    run_cli(*args, "--trials", "1")
    # Without evaluations before a trial's end there is nothing to prune: the default pruner is none then.
    assert "pruner: none" in (tmp_path / "job" / "sweep.md").read_text()
    before = {path: path.read_bytes() for path in tmp_path.rglob("*") if path.is_file()}

    changed = run_cli(*args[:-2], "train.max_steps=2", "train.eval_steps=null", "--trials", "2", check=False)
    assert changed.returncode == 2 and "Traceback" not in changed.stderr, changed.stderr[-3000:]
    assert "study 'job'" in changed.stderr and "train.max_steps: 4 in the study, 2 now" in changed.stderr
    elsewhere = tmp_path / "elsewhere" / "job"
    moved = run_cli(*args, f"output_dir={elsewhere}", "--trials", "2", check=False)
    assert moved.returncode == 2 and f"output_dir: '{tmp_path / 'job'}' in the study, '{elsewhere}' now" in moved.stderr
    assert {path: path.read_bytes() for path in tmp_path.rglob("*") if path.is_file()} == before

    run_cli(*args, "--trials", "2")  # the same job continues
    from pipelines.sweep import open_storage

    study = optuna.load_study(study_name="job", storage=open_storage(str(storage)))
    assert [trial.state.name for trial in study.trials] == ["COMPLETE", "COMPLETE"]


def test_cli_sweep_continued_with_another_space_is_refused_naming_what_differs(tmp_path, tiny_bert, sentiment_files):
    """A space of another kind for a key ended in Optuna's traceback ("Cannot set different distribution kind to the
    same parameter name", exit 1) after a failed trial was added to the journal; one of other bounds was taken
    without a word, mixing trials of two spaces in sweep.md and best.yaml."""
    config, space = sweep_config(tmp_path, tiny_bert, sentiment_files, "lr")
    space.write_text("train.learning_rate: {log_uniform: [1.0e-4, 1.0e-2]}\n")
    args = ["sweep", str(config), "--space", str(space), "train.max_steps=2", "train.eval_steps=null"]
    run_cli(*args, "--trials", "1")
    before = {path: path.read_bytes() for path in tmp_path.rglob("*") if path.is_file()}
    for other, shown in (("train.learning_rate: {choice: [0.001, 0.01]}\n", "'choice [0.001, 0.01]' now"),
                         ("train.learning_rate: {log_uniform: [0.05, 0.1]}\n", "'log_uniform [0.05, 0.1]' now"),
                         ("train.learning_rate: {log_uniform: [1.0e-4, 1.0e-2]}\ntrain.weight_decay: {uniform: [0, 0.1]}\n",
                          "train.weight_decay: not searched in the study, 'uniform [0, 0.1]' now")):
        space.write_text(other)
        result = run_cli(*args, "--trials", "2", check=False)
        assert result.returncode == 2 and "Traceback" not in result.stderr, result.stderr[-3000:]
        assert "study 'lr'" in result.stderr and "another search space" in result.stderr and shown in result.stderr
        assert {path: path.read_bytes() for path in tmp_path.rglob("*") if path.is_file() and path != space} == {
            path: data for path, data in before.items() if path != space}


def test_cli_sweep_bad_space_is_exit_2_naming_key_and_file(tmp_path, tiny_bert, sentiment_files):
    config, space = sweep_config(tmp_path, tiny_bert, sentiment_files, "bad")
    space.write_text("train.learning_rate: {log_uniform: [1.0e-5, 1.0e-3]}\ntrain.lr_scheduler: {uniform: [0, 1]}\n")
    result = run_cli("sweep", str(config), "--trials", "2", "--space", str(space), check=False)
    assert result.returncode == 2
    assert "'train.lr_scheduler' takes one of 'linear', 'cosine', 'constant'" in result.stderr and str(space) in result.stderr
    assert "Traceback" not in result.stderr
    assert not (tmp_path / "bad").exists(), "nothing is written before the space is valid"


def test_cli_sweep_another_study_never_runs_in_the_first_studys_trial_folders(tmp_path, tiny_bert, sentiment_files):
    config, space = sweep_config(tmp_path, tiny_bert, sentiment_files, "two")
    args = ["sweep", str(config), "--trials", "1", "--space", str(space), "--pruner", "none", "train.max_steps=8"]
    run_cli(*args)
    first = tmp_path / "two" / "trials" / "0000"
    before = {path.name: path.read_bytes() for path in first.iterdir()}
    # Trial numbers restart at 0 in a new study; overwrite=true would let trial 0 replace the first study's trial 0.
    for extra in (["--study", "other"], []):
        if not extra:  # the same study name, its journal gone: trial 0 again
            (tmp_path / "two" / "optuna.journal").unlink()
        result = run_cli(*args, *extra, "overwrite=true", check=False)
        assert result.returncode == 2, result.stderr[-3000:]
        assert str(tmp_path / "two") in result.stderr and "own output_dir" in result.stderr
        assert "Traceback" not in result.stderr
        assert {path.name: path.read_bytes() for path in first.iterdir()} == before
    assert sorted(path.name for path in (tmp_path / "two" / "trials").iterdir()) == ["0000"]


def test_cli_sweep_trial_error_is_one_message_without_traceback(tmp_path, tiny_bert, sentiment_files):
    config, space = sweep_config(tmp_path, tiny_bert, sentiment_files, "bogus")
    result = run_cli("sweep", str(config), "--trials", "2", "--space", str(space), "train.metric_for_best_model=eval_bogus",
                     check=False)
    assert result.returncode == 2
    assert "bertpipe sweep: error: train.metric_for_best_model='eval_bogus' is not a metric the classification task reports" in result.stderr
    # Optuna's own log of the failed trial would repeat the error with its traceback.
    assert "Traceback" not in result.stderr and result.stderr.count("eval_bogus") == 1, result.stderr[-3000:]


def test_cli_sweep_writes_only_into_a_new_or_empty_folder_or_an_earlier_sweeps(tmp_path, tiny_bert, sentiment_files, capsys):
    # The config a run was trained with names that run's folder: a sweep of it wrote trials/, sweep.md,
    # best.yaml and plots into the finished run, and into any other folder over files of the same names.
    from pipelines.cli import main
    from tasks import get_task

    config, space = sweep_config(tmp_path, tiny_bert, sentiment_files, "taken")
    taken = tmp_path / "taken"
    taken.mkdir()
    # A sweep.md of the user's own (notes) was taken for an earlier sweep's report, and replaced.
    for contents, naming in (({"best.yaml": "mine\n"}, "holds no sweep"), ({"sweep.md": "# my notes\n"}, "holds no sweep"),
                             ({"config.yaml": "task: classification\noutput_dir: x\n", "metrics.json": "{}"}, "training run")):
        for name in list(taken.iterdir()):
            name.unlink()
        for name, text in contents.items():
            (taken / name).write_text(text)
        capsys.readouterr()
        assert main(["sweep", str(config), "--trials", "1", "--space", str(space)], get_task=get_task) == 2
        err = capsys.readouterr().err
        assert f"output_dir {taken}" in err and naming in err and "Traceback" not in err, err
        assert {path.name: path.read_text() for path in taken.iterdir()} == contents
    (taken / "metrics.json").unlink()
    (taken / "config.yaml").unlink()
    (taken / "notes.txt").write_text("x")
    capsys.readouterr()
    assert main(["sweep", str(config), "--trials", "1", "--space", str(space), f"output_dir={taken / 'notes.txt'}"], get_task=get_task) == 2
    assert "is a file" in capsys.readouterr().err


def test_cli_sweep_refuses_a_run_setting_in_the_space_before_writing(tmp_path, tiny_bert, sentiment_files):
    # A trial is a new run in its own folder: a space that resumes, overwrites or moves it searches no recipe.
    config, space = sweep_config(tmp_path, tiny_bert, sentiment_files, "runkeys")
    for key, spec in (("train.resume_from_checkpoint", "{choice: [latest]}"), ("overwrite", "{choice: [true, false]}"),
                      ("output_dir", "{choice: [a, b]}")):
        space.write_text(f"train.learning_rate: {{log_uniform: [1.0e-5, 1.0e-3]}}\n{key}: {spec}\n")
        result = run_cli("sweep", str(config), "--trials", "2", "--space", str(space), check=False)
        assert result.returncode == 2, result.stderr[-3000:]
        assert key in result.stderr and str(space) in result.stderr and "Traceback" not in result.stderr, result.stderr
        assert not (tmp_path / "runkeys").exists(), "nothing is written before the space is valid"
    space.write_text(SPACE)
    result = run_cli("sweep", str(config), "--trials", "2", "--space", str(space), "train.resume_from_checkpoint=latest", check=False)
    assert result.returncode == 2 and "train.resume_from_checkpoint=latest" in result.stderr and "Traceback" not in result.stderr
    assert not (tmp_path / "runkeys").exists()


def test_cli_sweep_storage_that_is_no_journal_or_a_cut_short_one_is_refused_unchanged(tmp_path, tiny_bert, sentiment_files):
    """A user's file given as --storage gained a study record after its last line (then the sweep failed); a journal
    whose last record a full disk cut short failed the next run with a JSON traceback, and every run after it too."""
    config, space = sweep_config(tmp_path, tiny_bert, sentiment_files, "journal")
    notes = tmp_path / "notes.txt"
    notes.write_text("single line, no newline")
    args = ["sweep", str(config), "--trials", "1", "--space", str(space), "train.max_steps=2", "train.eval_steps=null"]
    result = run_cli(*args, "--storage", str(notes), check=False)
    assert result.returncode == 2 and "Traceback" not in result.stderr, result.stderr[-3000:]
    assert f"--storage {notes} is a file but not an Optuna journal" in result.stderr
    assert notes.read_text() == "single line, no newline" and not (tmp_path / "journal").exists()

    run_cli(*args)
    journal = tmp_path / "journal" / "optuna.journal"
    whole = journal.read_bytes()
    journal.write_bytes(whole[:-20])  # the last record's end never reached the disk
    cut = journal.read_bytes()
    result = run_cli(*args[:2], "--trials", "2", *args[4:], check=False)
    assert result.returncode == 2 and "Traceback" not in result.stderr, result.stderr[-3000:]
    assert "its last record is cut short" in result.stderr and journal.read_bytes() == cut


def test_cli_sweep_default_objective_is_one_the_task_reports_on_the_data(tmp_path, tiny_bert):
    # A regression reports no accuracy: the default eval_accuracy failed the sweep after its first trial had trained.
    from pipelines.config_loading import load_config
    from pipelines.sweep.run import _objective
    from tasks import get_task
    from tests.conftest import write_jsonl

    rows = [{"sentence": f"film number {index}", "label": index / 4} for index in range(8)]
    train, validation = write_jsonl(tmp_path / "train.jsonl", rows), write_jsonl(tmp_path / "validation.jsonl", rows[:4])
    config = tmp_path / "regression.yaml"
    config.write_text(f"task: classification\noutput_dir: {tmp_path / 'sweep'}\nmodel:\n  name_or_path: {tiny_bert}\n"
                      f"data:\n  files: {{train: {train}, validation: {validation}}}\n  text_column: sentence\n")
    base = load_config(config, [], lambda name: get_task(name).Options)
    assert _objective(base, get_task, str(config)) == "eval_pearson"
    assert not (tmp_path / "sweep").exists()
