"""The fault contract as a user meets it: a fresh ``bertpipe`` process, its exit status and stderr.

A handful of cases only (each pays an interpreter start); ``test_faults.py`` holds the catalogue.
The cases at the end run in this process: the command-line ends of predict and evaluate (what they
may write, what they check first, what a full disk tells the user).
"""

from __future__ import annotations

import errno
import json
import os
import shutil

from tests.conftest import run_cli, sentiment_rows, write_jsonl
from tests.faults.conftest import bertpipe_in_process


def test_faults_cli_corrupt_model_config_is_one_message_and_debug_shows_the_cause(tmp_path, finished_run, tiny_bert):
    model = shutil.copytree(tiny_bert, tmp_path / "model")
    (model / "config.json").write_text('{"model_type": "bert", "hidden_size": ')
    args = ("train", str(finished_run[0]), f"output_dir={tmp_path / 'new'}", f"model.name_or_path={model}")

    result = run_cli(*args, check=False)
    assert result.returncode == 2
    assert "Traceback" not in result.stderr
    message = result.stderr.strip().splitlines()
    assert message[-2].startswith("bertpipe train: error: ") and str(model) in message[-2], result.stderr[-2000:]
    assert "--debug" in message[-1]

    shown = run_cli(*args, "--debug", check=False)
    assert shown.returncode == 2
    assert "Traceback" in shown.stderr and "JSONDecodeError" in shown.stderr  # the library's own error, as the cause
    assert shown.stderr.strip().splitlines()[-1].startswith("bertpipe train: error: ")


def test_faults_debug_variable_shows_the_traceback(capsys, monkeypatch, tmp_path, finished_run):
    monkeypatch.setenv("BERTPIPE_DEBUG", "1")
    status, stderr = bertpipe_in_process(capsys, "train", finished_run[0], f"output_dir={tmp_path / 'new'}",
                                         f"data.files.train={tmp_path / 'typo.jsonl'}")
    assert status == 2 and "Traceback" in stderr and "DataError" in stderr
    assert stderr.strip().splitlines()[-1].startswith("bertpipe train: error: data.files.train")


def test_faults_cli_config_that_is_a_folder(tmp_path):
    result = run_cli("train", str(tmp_path), check=False)
    assert result.returncode == 2 and "Traceback" not in result.stderr
    assert f"config file {tmp_path} is a folder" in result.stderr


def test_faults_cli_predict_blank_txt_lines_are_skipped_and_said(tmp_path, finished_run):
    inputs = tmp_path / "inputs.txt"
    inputs.write_text("good film\n\nbad film\n")
    output = tmp_path / "predictions.jsonl"
    result = run_cli("predict", str(finished_run[1]), "--input", str(inputs), "--output", str(output))
    assert "skipped 1 blank line(s) (line 2)" in result.stderr
    assert "wrote 2 predictions" in result.stdout
    assert [json.loads(line)["text"] for line in output.read_text().splitlines()] == ["good film", "bad film"]


# ----- predict and evaluate, in this process --------------------------------------------------------
def test_faults_cli_predict_output_inside_the_runs_subfolders_is_refused(refused, run_copy, tmp_path):
    # Only the run folder's own files were guarded: a checkpoint's weights were replaced by predictions,
    # and the resume or merge that reads them back failed long after.
    inputs = write_jsonl(tmp_path / "inputs.jsonl", [{"sentence": "good film"}])
    checkpoint = run_copy / "checkpoints" / "step-00000004"
    for target in (checkpoint / "model.safetensors", checkpoint / "trainer_state.json"):
        refused("predict", run_copy, "--input", inputs, "--output", target, needles=["--output", str(target), "file of the run"])


def test_faults_cli_evaluate_examples_longer_than_the_positions_name_max_seq_length(refused, run_copy, tmp_path):
    # predict and train check the tokenised lengths; evaluate ran into the position table mid-forward
    # (a RuntimeError traceback) when an override let longer examples through.
    long = write_jsonl(tmp_path / "long.jsonl", [{"sentence": "good film " * 60, "label": "positive"}, {"sentence": "bad", "label": "negative"}])
    refused("evaluate", run_copy, "data.max_seq_length=999", f"data.files.validation={long}",
            needles=["split 'validation'", str(long), "set data.max_seq_length to at most 64"])
    assert not (run_copy / "eval_validation.json").exists()


def test_faults_cli_evaluate_and_predict_refuse_settings_the_run_was_trained_with(refused, run_copy, tmp_path):
    # Ignored, each gave the run's own numbers with exit status 0: classification.problem_type=regression evaluated
    # the classifier as before, model.name_or_path pointed at nothing that was read.
    inputs = write_jsonl(tmp_path / "inputs.jsonl", [{"sentence": "good film"}])
    for override, needle in (("classification.problem_type=regression", "classification.problem_type='regression'"),
                             (f"model.name_or_path={tmp_path}", "model.name_or_path="),
                             ("train.learning_rate=0.5", "train.learning_rate=0.5"),
                             ("train.mixed_precision=bf16", "--precision")):
        for command in (["evaluate", run_copy], ["predict", run_copy, "--input", inputs, "--output", tmp_path / "o.jsonl"]):
            refused(*command, override, needles=[needle, "a finished run trained with", "would be ignored"])
    assert not (run_copy / "eval_validation.json").exists() and not (tmp_path / "o.jsonl").exists()


def _with_own_data(run_dir, tmp_path, sentiment_files) -> dict:
    """Point the run's saved config at copies of its data files (under tmp_path/data), which the test may lose."""
    folder = tmp_path / "data"
    folder.mkdir()
    config = (run_dir / "config.yaml").read_text()
    copies = {}
    for split, path in sentiment_files.items():
        copies[split] = shutil.copy(path, folder / path.name)
        config = config.replace(f"{split}: {path}\n", f"{split}: {copies[split]}\n")
    (run_dir / "config.yaml").write_text(config)
    return copies


def test_faults_cli_evaluate_needs_only_the_eval_split_file(capsys, run_copy, tmp_path, sentiment_files):
    # Every file of data.files was read: after the train file was deleted (or on another machine), evaluate
    # was refused with "data.files.train: file ... does not exist", though a finished run needs no train split.
    data = _with_own_data(run_copy, tmp_path, sentiment_files)
    test = write_jsonl(tmp_path / "test.jsonl", sentiment_rows(11, seed=5))
    results = {}
    for train_present in (True, False):
        if not train_present:
            os.remove(data["train"])
        for split, overrides in (("validation", ()), ("test", (f"data.files.test={test}", "data.eval_split=test"))):
            status, stderr = bertpipe_in_process(capsys, "evaluate", run_copy, *overrides)
            assert status == 0, stderr[-3000:]
            metrics = json.loads((run_copy / f"eval_{split}.json").read_text())
            results[train_present, split] = {key: value for key, value in metrics.items() if key != "eval_runtime"}
    assert results[True, "test"]["eval_samples"] == 11
    for split in ("validation", "test"):
        assert results[False, split] == results[True, split]


def test_faults_cli_predict_output_naming_a_data_file_of_the_run_is_refused(refused, run_copy, tmp_path, sentiment_files):
    # Only the --input and the run's own files were guarded: `--output train.jsonl` beside the data replaced
    # the user's training file with predictions, without a word.
    data = _with_own_data(run_copy, tmp_path, sentiment_files)
    inputs = write_jsonl(tmp_path / "inputs.jsonl", [{"sentence": "good film"}])
    for split, target in data.items():
        refused("predict", run_copy, "--input", inputs, "--output", target, needles=["--output", str(target), f"data.files.{split}"])
    os.remove(data["train"])  # a data file gone since training is not written either: a retrain would read predictions
    refused("predict", run_copy, "--input", inputs, "--output", data["train"], needles=["--output", "data.files.train"])
    assert not os.path.exists(data["train"])


def _disk_full(path) -> OSError:
    return OSError(errno.ENOSPC, os.strerror(errno.ENOSPC), str(path))


def test_faults_cli_full_disk_in_predict_and_evaluate_says_to_run_again_and_leaves_no_partial(capsys, run_copy, tmp_path, monkeypatch):
    from pipelines import atomic_writes, evaluation

    inputs = write_jsonl(tmp_path / "inputs.jsonl", [{"sentence": "good film"}, {"sentence": "bad film"}])
    output = tmp_path / "predictions.jsonl"
    output.write_text("earlier predictions\n")

    def open_on_a_full_disk(path, *args, **kwargs):
        open(path, *args, **kwargs).close()  # the file is created; the write is what the disk refuses
        raise _disk_full(path)

    monkeypatch.setattr(atomic_writes, "open", open_on_a_full_disk, raising=False)
    status, stderr = bertpipe_in_process(capsys, "predict", run_copy, "--input", inputs, "--output", output)
    assert status == 2 and "Traceback" not in stderr, stderr[-3000:]
    message = stderr[stderr.index("bertpipe predict: error: "):]
    assert str(output) in message and "No space left on device" in message and "free space, then run the command again" in message
    assert output.read_text() == "earlier predictions\n"
    assert sorted(path.name for path in tmp_path.iterdir() if path.name.startswith("predictions")) == ["predictions.jsonl"]

    def write_json_on_a_full_disk(path, payload):
        raise _disk_full(path)

    monkeypatch.setattr(evaluation, "write_json", write_json_on_a_full_disk)
    status, stderr = bertpipe_in_process(capsys, "evaluate", run_copy)
    assert status == 2 and "Traceback" not in stderr, stderr[-3000:]
    message = stderr[stderr.index("bertpipe evaluate: error: "):]
    # evaluate has nothing to resume: the training hint sent the user to a command that refuses a finished run.
    assert "No space left on device" in message and "free space, then run the command again" in message
    assert "resume_from_checkpoint" not in message
