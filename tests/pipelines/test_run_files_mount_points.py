"""``merge --out`` and ``export --out`` replace their folder by renaming a staged one into place. A folder
that cannot be renamed (a mount point, such as a docker volume: EBUSY) ends in exit status 2 and one message
naming ``--out`` and why, with the folder left as it was and nothing staged left beside it."""

from __future__ import annotations

import errno
import logging
import os
import shutil
from pathlib import Path

import pytest

from tasks.cli import main
from tests.conftest import classification_config

PINNED = ["train.mixed_precision='no'", "train.torch_num_threads=1", "train.eval_steps=null", "train.save_steps=null"]


def cli(*args) -> int:
    return main([str(arg) for arg in args])


def error_of(capsys, *args) -> str:
    capsys.readouterr()
    assert cli(*args) == 2
    err = capsys.readouterr().err
    assert "Traceback" not in err, err
    return err[err.index(f"bertpipe {args[0]}: error:"):]  # progress bars may come first


@pytest.fixture(autouse=True)
def _quiet_stale_log_handlers(monkeypatch):
    # A handler that torch or logging.basicConfig bound to an earlier test's captured (now closed) stderr
    # would print logging's own "--- Logging error --- Traceback" into this one's.
    monkeypatch.setattr(logging, "raiseExceptions", False)


@pytest.fixture(scope="module")
def lora_run(tmp_path_factory, tiny_bert, sentiment_files) -> Path:
    root = tmp_path_factory.mktemp("mount-points")
    config = classification_config(root, tiny_bert, sentiment_files, run_name="lora")
    assert cli("train", config, *PINNED, "train.max_steps=2", "model.peft.method=lora", "model.peft.r=4") == 0
    return root / "lora"


def _mount_point(monkeypatch, folder: Path, *, detected: bool) -> None:
    """``folder`` behaves as a mount point: renaming it fails with EBUSY (as the kernel answers), and
    ``os.path.ismount`` says so only when ``detected`` (a bind mount on the same file system it misses)."""
    real_replace, real_ismount = os.replace, os.path.ismount

    def replace(source, destination, *args, **kwargs):
        if os.path.abspath(source) == str(folder):
            raise OSError(errno.EBUSY, os.strerror(errno.EBUSY), str(source), None, str(destination))
        return real_replace(source, destination, *args, **kwargs)

    monkeypatch.setattr(os, "replace", replace)
    monkeypatch.setattr(os.path, "ismount", lambda path: (detected and os.path.abspath(path) == str(folder)) or real_ismount(path))


def _untouched(out: Path, held: set[str]) -> None:
    assert {path.name for path in out.iterdir()} == held
    assert sorted(path.name for path in out.parent.iterdir() if path.name.startswith(".")) == []  # no staging left beside


@pytest.mark.parametrize("detected", [True, False], ids=["detected-up-front", "found-at-the-swap"])
def test_run_files_merge_out_on_a_mount_point_exits_2_naming_out(lora_run, tmp_path, monkeypatch, capsys, detected):
    out = tmp_path / "volume"
    out.mkdir()  # a docker volume: there, and empty
    _mount_point(monkeypatch, out, detected=detected)
    message = error_of(capsys, "merge", lora_run, "--out", out)
    assert f"--out {out} cannot be replaced" in message and ("mount point" if detected else "busy") in message, message
    assert f"--out {out / 'model'}" in message  # the way on
    _untouched(out, set())
    assert not (lora_run / "merged").exists()


def test_run_files_export_out_on_a_mount_point_exits_2_naming_out(lora_run, tmp_path, monkeypatch, capsys):
    pytest.importorskip("onnxruntime")
    run = tmp_path / "run"
    shutil.copytree(lora_run, run)
    assert cli("merge", run) == 0  # export reads a LoRA run's merged/
    out = tmp_path / "volume"
    out.mkdir()
    with monkeypatch.context() as patched:
        _mount_point(patched, out, detected=True)
        # Refused before the export and its parity check run, not after.
        message = error_of(capsys, "export", run, "--out", out, "--parity-samples", "2")
    assert f"--out {out} cannot be replaced (it is a mount point)" in message, message
    _untouched(out, set())

    assert cli("export", run, "--out", out, "--parity-samples", "2") == 0
    before = {path.name: path.read_bytes() for path in out.iterdir()}
    with monkeypatch.context() as patched:
        _mount_point(patched, out, detected=False)
        message = error_of(capsys, "export", run, "--out", out, "--overwrite", "--parity-samples", "2")
    assert f"{out} cannot be replaced" in message and "busy" in message, message
    assert {path.name: path.read_bytes() for path in out.iterdir()} == before
    _untouched(out, set(before))


def test_run_files_a_bind_mount_missed_by_ismount_is_found_in_the_mount_table(tmp_path, monkeypatch):
    # docker -v host_dir:/out binds a folder of the same file system: same device as its parent, so
    # os.path.ismount says False; the kernel's mount table lists it (a space written as \040).
    from pipelines import atomic_writes

    volume = tmp_path / "my volume"
    volume.mkdir()
    escaped = str(volume).replace(" ", "\\040")
    table = tmp_path / "mountinfo"
    table.write_text(f"22 27 0:21 / /proc rw,relatime - proc proc rw\n36 27 8:1 /srv/out {escaped} rw,relatime - ext4 /dev/sda1 rw\n")
    monkeypatch.setattr(atomic_writes, "MOUNT_TABLE", table)
    assert not os.path.ismount(volume)
    with pytest.raises(atomic_writes.OutputDirError, match="it is a mount point"):
        atomic_writes.check_replaceable_folder(volume, "--out")
    (tmp_path / "my").mkdir()  # a prefix of the listed point is not one
    atomic_writes.check_replaceable_folder(tmp_path / "my", "--out")
    monkeypatch.setattr(atomic_writes, "MOUNT_TABLE", tmp_path / "absent")  # not Linux: ismount alone
    atomic_writes.check_replaceable_folder(volume, "--out")


def test_run_files_merge_out_through_a_symlink_fills_the_linked_folder_and_keeps_the_link(lora_run, tmp_path):
    target = tmp_path / "models" / "v3"
    target.mkdir(parents=True)
    link = tmp_path / "latest"
    link.symlink_to(target, target_is_directory=True)
    assert cli("merge", lora_run, "--out", link) == 0
    assert link.is_symlink() and link.resolve() == target.resolve()
    assert (target / "config.json").is_file() and (target / "tokenizer_config.json").is_file()
    # Nothing staged or set aside is left beside the link or the folder it points to.
    assert sorted(path.name for path in tmp_path.iterdir()) == ["latest", "models"]
    assert sorted(path.name for path in target.parent.iterdir()) == ["v3"]


def test_run_files_export_overwrite_through_a_symlink_replaces_the_linked_folder(lora_run, tmp_path):
    pytest.importorskip("onnxruntime")
    run = tmp_path / "run"
    shutil.copytree(lora_run, run)
    assert cli("merge", run) == 0
    target = tmp_path / "exports" / "v1"
    target.mkdir(parents=True)
    link = tmp_path / "current"
    link.symlink_to(target, target_is_directory=True)
    assert cli("export", run, "--out", link, "--parity-samples", "2") == 0
    (target / "stale.txt").write_text("left by the user beside the earlier export")
    assert cli("export", run, "--out", link, "--overwrite", "--parity-samples", "2") == 0
    assert link.is_symlink() and link.resolve() == target.resolve()
    assert not (target / "stale.txt").exists() and any(target.glob("*.onnx"))
    assert sorted(path.name for path in tmp_path.iterdir()) == ["current", "exports", "run"]
    assert sorted(path.name for path in target.parent.iterdir()) == ["v1"]
