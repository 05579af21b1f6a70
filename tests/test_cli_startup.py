"""``bertpipe --help``, ``--version`` and argument/config errors answer at once: nothing they run
imports torch, transformers or datasets (issue 22). Each check runs in a fresh interpreter, where
no earlier test has imported them already."""

from __future__ import annotations

import subprocess
import sys
import textwrap
import time
from importlib.metadata import version

import pytest

from tests.conftest import REPO_ROOT, cli_env

HEAVY = ("torch", "transformers", "datasets")
# Generous: the heavy imports alone take several seconds, these commands a few tenths.
BOUND_S = 3.0


def _heavy_modules_after(argv: list[str]) -> tuple[int, list[str]]:
    """Exit status of ``bertpipe ARGV`` run in-process in a fresh interpreter, and the heavy modules it imported."""
    script = textwrap.dedent(f"""
        import contextlib, io, sys
        from tasks.cli import main
        with contextlib.redirect_stdout(io.StringIO()), contextlib.redirect_stderr(io.StringIO()):
            try:
                status = main({argv!r})
            except SystemExit as exit:
                status = exit.code
        print(status, *[name for name in {HEAVY!r} if name in sys.modules])
    """)
    result = subprocess.run([sys.executable, "-c", script], cwd=REPO_ROOT, env=cli_env(), capture_output=True, text=True, timeout=120)
    assert result.returncode == 0, result.stderr[-2000:]
    status, *heavy = result.stdout.split()
    return int(status), heavy


@pytest.mark.parametrize("argv, status", [
    (["--help"], 0),
    (["--version"], 0),
    (["train", "--help"], 0),
    (["frobnicate"], 2),                                                    # unknown command
    (["predict", "runs/x"], 2),                                             # missing --input/--output
    (["train", "configs/classification/sst2.yaml", "train.lrr=1"], 2),      # a typo in a config key
    (["train", "configs/classification/sst2.yaml", "task=nope"], 2),        # an unknown task
    (["train", "configs/does_not_exist.yaml"], 2),
])
def test_help_version_and_input_errors_import_no_ml_library(argv, status):
    assert _heavy_modules_after(argv) == (status, [])


def test_help_and_version_answer_within_the_bound():
    # A fresh interpreter, as a user's shell starts: run_cli forks from the worker's warm server, and the first
    # command of a worker timed that server's own start (torch's imports), failing the module run alone.
    for argv in (["--help"], ["--version"]):
        start = time.perf_counter()
        result = subprocess.run([sys.executable, "-m", "tasks.cli", *argv], cwd=REPO_ROOT, env=cli_env(), capture_output=True,
                                text=True, timeout=120)
        assert time.perf_counter() - start < BOUND_S and result.returncode == 0, argv
    assert result.stdout.strip() == f"bertpipe {version('bertpipe')}"


@pytest.mark.parametrize("local_rank, shown", [("0", ["warned", "failed"]), ("1", ["failed"])])
def test_cli_warnings_come_from_each_machines_first_process_only(local_rank, shown):
    # Under accelerate launch every process reads the same data: each warning about it came once per process.
    code = ("import logging; from pipelines.cli import configure_logging; configure_logging(); "
            "logging.getLogger('tasks.any').warning('warned'); logging.getLogger('tasks.any').error('failed')")
    result = subprocess.run([sys.executable, "-c", code], cwd=REPO_ROOT, env=cli_env(LOCAL_RANK=local_rank),
                            capture_output=True, text=True, timeout=120)
    assert [word for word in ("warned", "failed") if word in result.stderr] == shown, result.stderr
