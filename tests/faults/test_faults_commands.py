"""Faults of the commands beyond train/evaluate/predict (distill, publish, export, sweep): exit status 2,
one message naming the key or file, and nothing that existed before changed."""

from __future__ import annotations

import shutil

import pytest

from tests.faults.conftest import bertpipe_in_process


def test_faults_distill_overwrite_never_deletes_the_teacher_inside_output_dir(refused, finished_run, run_copy, tiny_bert):
    # With distill.init=model no model key names the teacher: overwrite=true replaced the folder that
    # held it, and the teacher run was deleted once the student had finished.
    teacher = shutil.copytree(finished_run[1], run_copy / "teacher")
    refused("distill", teacher, finished_run[0], f"output_dir={run_copy}", "overwrite=true", "distill.init=model",
            f"model.name_or_path={tiny_bert}", "train.max_steps=2",
            needles=["overwrite=true would delete", f"distill.teacher={teacher}"], roots=(run_copy,))


def test_faults_publish_out_without_dry_run_is_refused_before_any_upload(refused, run_copy, tmp_path, monkeypatch):
    # --out alone was ignored: a user asking for the files in a folder got them uploaded instead.
    from pipelines import publish

    uploads = []

    def upload_would_start() -> None:
        uploads.append(True)
        raise publish.PublishError("an upload started")

    monkeypatch.setattr(publish, "_check_can_push", upload_would_start)
    out = tmp_path / "look here"
    refused("publish", run_copy, "--repo-id", "someone/tiny", "--out", out, needles=[f"--out {out}", "--dry-run"])
    assert not uploads and not out.exists()


@pytest.mark.parametrize("out_existed", [False, True], ids=["new-out", "empty-out"])
def test_faults_publish_dry_run_full_disk_leaves_no_half_written_out(refused, capsys, run_copy, tmp_path, monkeypatch, out_existed):
    # A full disk mid-copy left a half-filled --out: the files list was never printed, and the rerun
    # after freeing space refused the folder as not empty. An --out made empty beforehand stays, empty.
    import errno
    import os

    from pipelines import publish

    real_copy = shutil.copy2
    copied = []

    def disk_full_at_the_second_file(source, destination, *args, **kwargs):
        if copied:
            raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC), str(destination))
        copied.append(real_copy(source, destination, *args, **kwargs))

    monkeypatch.setattr(publish.shutil, "copy2", disk_full_at_the_second_file)
    out = tmp_path / "upload"
    if out_existed:
        out.mkdir()
    refused("publish", run_copy, "--repo-id", "someone/tiny", "--dry-run", "--out", out,
            needles=["No space left on device", "run the command again"])
    assert copied and (list(out.iterdir()) == [] if out_existed else not out.exists())
    assert [path.name for path in tmp_path.iterdir() if path.name.endswith(".partial")] == []
    monkeypatch.undo()
    status, _ = bertpipe_in_process(capsys, "publish", run_copy, "--repo-id", "someone/tiny", "--dry-run", "--out", out)
    assert status == 0 and (out / "README.md").is_file()



def test_faults_benchmark_predict_without_repeats_is_refused(refused, run_copy, tmp_path):
    inputs = tmp_path / "inputs.txt"
    inputs.write_text("a good film\n")
    out = tmp_path / "bench"
    refused("benchmark", run_copy, "--predict", inputs, "--seeds", "0", "--output-dir", out, needles=["--seeds 0", "at least 1"])
    assert not out.exists()


@pytest.mark.parametrize("options, needles", [
    (["--predict", "INPUTS", "--to-accuracy"], ["--to-accuracy cannot be combined with --predict"]),
    (["--predict", "INPUTS", "--settings", "bertpipe", "--metric", "f1"], ["--settings, --metric cannot be combined with --predict"]),
    (["--to-accuracy", "--settings", "trainer_best"], ["--settings cannot be combined with --to-accuracy", "trainer_default"]),
])
def test_faults_benchmark_options_its_mode_ignores_are_refused(refused, finished_run, tmp_path, options, needles):
    # Accepted and silently ignored: --predict ran with --to-accuracy asked, --to-accuracy ran every seed with
    # --settings trainer_best asked, and the result answered another question than the one asked.
    inputs = tmp_path / "inputs.txt"
    inputs.write_text("a good film\n")
    options = [str(inputs) if option == "INPUTS" else option for option in options]
    config_or_run = finished_run[1] if "--predict" in options else finished_run[0]
    refused("benchmark", config_or_run, *options, "--output-dir", tmp_path / "bench", needles=needles)
    assert not (tmp_path / "bench").exists()


def test_faults_benchmark_metric_only_bertpipe_reports_is_refused_before_any_run(refused, finished_run, tmp_path):
    # Checked against the first run's metrics alone: bertpipe reports eval_runtime, the Trainer does not, so
    # --metric runtime passed and every setting and seed ran before the table refused it.
    refused("benchmark", finished_run[0], "train.max_steps=1", "--metric", "runtime", "--seeds", "1",
            "--output-dir", tmp_path / "bench", needles=["metric 'runtime' is not among the task's metrics", "'accuracy'"])
    assert not (tmp_path / "bench").exists()


def test_faults_benchmark_output_dir_that_holds_something_else_is_refused(refused, finished_run, run_copy, tmp_path):
    # Written into without a question: a finished run's folder got runs/ and benchmark.md beside its model.
    for extra in ([], ["--overwrite"]):
        refused("benchmark", finished_run[0], "--output-dir", run_copy, *extra,
                needles=[f"--output-dir {run_copy} is not empty and holds no earlier benchmark"], roots=(run_copy,))


def test_faults_benchmark_predict_over_an_earlier_benchmark_holding_its_input_is_refused(refused, run_copy, tmp_path):
    # The predictions were written into --output-dir as pipeline.jsonl: an input of that name was replaced.
    bench = tmp_path / "bench"
    bench.mkdir()
    (bench / "predict_benchmark.json").write_text("{}")
    inputs = bench / "pipeline.jsonl"
    inputs.write_text('{"sentence": "a good film"}\n')
    refused("benchmark", run_copy, "--predict", inputs, "--output-dir", bench,
            needles=[f"--output-dir {bench} holds an earlier benchmark (predict_benchmark.json); pass --overwrite"], roots=(bench,))
    refused("benchmark", run_copy, "--predict", inputs, "--output-dir", bench, "--overwrite",
            needles=[f"--predict {inputs} lies inside it"], roots=(bench,))
    assert sorted(path.name for path in bench.iterdir()) == ["pipeline.jsonl", "predict_benchmark.json"]


def _export_dir(run, folder):
    """What marks an export directory (the checks below refuse before loading it)."""
    folder.mkdir()
    (folder / "model.onnx").write_bytes(b"onnx")
    shutil.copy(run / "config.yaml", folder / "config.yaml")
    (folder / "export.json").write_text('{"precision": "int8"}')
    return folder


def test_faults_evaluate_and_predict_an_export_in_another_precision_is_refused(refused, run_copy, tmp_path):
    # The export ran as exported (int8 or fp32) while eval_<split>.json said inference_precision: bf16.
    export = _export_dir(run_copy, tmp_path / "export")
    inputs = tmp_path / "inputs.txt"
    inputs.write_text("a good film\n")
    refused("evaluate", export, "--precision", "bf16", needles=["--precision bf16", str(export), "ONNX export"])
    refused("predict", export, "--input", inputs, "--output", tmp_path / "p.jsonl", "--precision", "auto",
            needles=["--precision auto", "ONNX export"])
    assert not (tmp_path / "p.jsonl").exists()


def test_faults_benchmark_predict_on_an_onnx_export_is_refused(refused, run_copy, tmp_path):
    # pipeline() cannot load an export (no torch weights): the child process failed with a ValueError traceback.
    export = _export_dir(run_copy, tmp_path / "export")
    inputs = tmp_path / "inputs.txt"
    inputs.write_text("a good film\n")
    refused("benchmark", export, "--predict", inputs, "--seeds", "1", "--output-dir", tmp_path / "bench",
            needles=[str(export), "ONNX export", "pipeline()"])
    assert not (tmp_path / "bench").exists()


def test_faults_publish_refuses_truncated_weights(refused, run_copy, tmp_path):
    # Copied as they were, truncated weights became a model on the Hub that no one could load.
    weights = run_copy / "model.safetensors"
    weights.write_bytes(weights.read_bytes()[: weights.stat().st_size // 2])
    out = tmp_path / "upload"
    refused("publish", run_copy, "--repo-id", "someone/tiny", "--dry-run", "--out", out, needles=[str(weights), "does not load"])
    assert not out.exists()
