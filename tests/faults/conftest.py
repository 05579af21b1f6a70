"""The fault catalogue's fixtures: one finished tiny run per worker, copied per test, and the checks
every case makes (exit status 2, one message naming file/key/row, no traceback, nothing changed)."""

from __future__ import annotations

import hashlib
import logging
import re
import shutil
import sys
from pathlib import Path

import pytest

from tests.conftest import classification_config, run_cli

FINISHED_RUN_TRAIN = dict(max_steps=4, save_steps=2, eval_steps=None, logging_steps=2, mixed_precision="no")


@pytest.fixture(scope="session")
def finished_run(tmp_path_factory, tiny_bert, sentiment_files) -> tuple[Path, Path]:
    """(config file, run directory) of a finished 4-step run with checkpoints at steps 2 and 4."""
    folder = tmp_path_factory.mktemp("faults-finished")
    config = classification_config(folder, tiny_bert, sentiment_files, run_name="run", **FINISHED_RUN_TRAIN)
    run_cli("train", str(config))
    return config, folder / "run"


@pytest.fixture
def run_copy(finished_run, tmp_path) -> Path:
    """A private copy of the finished run, free to be damaged by the test."""
    return Path(shutil.copytree(finished_run[1], tmp_path / "run"))


def tree_hashes(*roots: Path) -> dict[str, str]:
    """sha256 of every file under ``roots``, by path."""
    hashes = {}
    for root in roots:
        for path in sorted(Path(root).rglob("*")):
            if path.is_file():
                hashes[str(path)] = hashlib.sha256(path.read_bytes()).hexdigest()
    return hashes


def bertpipe_in_process(capsys, *args: str) -> tuple[int, str]:
    """``bertpipe ARGS`` in this process (no interpreter start): exit status and stderr."""
    from accelerate.state import AcceleratorState, GradientState

    from tasks.cli import main

    capsys.readouterr()
    # Logging handlers (main()'s, datasets' and transformers' own) hold the stderr of the test that
    # created them, a capture stream closed since: point them at this test's.
    loggers = [logging.root, *(item for item in logging.Logger.manager.loggerDict.values() if isinstance(item, logging.Logger))]
    for handler in {h for item in loggers for h in item.handlers if type(h) is logging.StreamHandler}:
        handler.stream = sys.stderr  # not setStream(), which flushes the closed stream first
    try:
        status = main([str(arg) for arg in args])
    finally:
        # A later call may build an Accelerator with other settings; Accelerate keeps one per process.
        AcceleratorState._reset_state(reset_partial_state=True)
        GradientState._reset_state()
    return status, capsys.readouterr().err


@pytest.fixture
def refused(capsys, tmp_path, finished_run, tiny_bert, sentiment_files):
    """``refused(*args, needles=[...])``: the command exits 2 with one message holding every needle, no
    traceback, and every file that existed before (test folder, finished run, model, data) unchanged."""

    def check(*args: str, needles: list[str], roots: tuple[Path, ...] = ()) -> str:
        watched = (tmp_path, finished_run[1], tiny_bert, *{Path(p).parent for p in sentiment_files.values()}, *roots)
        before = tree_hashes(*watched)
        status, stderr = bertpipe_in_process(capsys, *args)
        assert status == 2, stderr[-3000:]
        assert "Traceback" not in stderr, stderr[-3000:]
        starts = [match.start() for match in re.finditer(r"^bertpipe \S+: error: ", stderr, flags=re.MULTILINE)]
        assert len(starts) == 1, f"expected one error message:\n{stderr[-3000:]}"
        message = stderr[starts[0]:]
        for needle in needles:
            assert str(needle) in message, f"{needle!r} not in: {message}"
        after = tree_hashes(*watched)
        changed = [path for path, digest in before.items() if after.get(path) != digest]
        assert not changed, f"files changed or deleted: {changed}"
        return message

    return check
