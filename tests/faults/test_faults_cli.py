"""The fault contract as a user meets it: a fresh ``bertpipe`` process, its exit status and stderr.

A handful of cases only (each pays an interpreter start); ``test_faults.py`` holds the catalogue.
"""

from __future__ import annotations

import json
import shutil

from tests.conftest import run_cli
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
