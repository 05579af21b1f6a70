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
