"""The tests' warm ``bertpipe`` (tests/cli_server.py) answers as a fresh interpreter does: the same exit
status, stdout and stderr, in a process of its own with the command's environment and folder."""

from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest

from tests import cli_server
from tests.conftest import REPO_ROOT, cli_env


def fresh(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "tasks.cli", *args], cwd=REPO_ROOT, env=cli_env(), capture_output=True, text=True, timeout=120)


def warm(*args: str, env: dict[str, str] | None = None) -> subprocess.CompletedProcess | None:
    return cli_server.run(list(args), env or cli_env(), REPO_ROOT, 120, server_env=cli_env())


@pytest.fixture(autouse=True)
def server_on(monkeypatch):
    monkeypatch.delenv(cli_server.OFF_VARIABLE, raising=False)


@pytest.mark.parametrize("args", [
    ("--version",),
    ("frobnicate",),                                                        # argparse's error, exit 2
    ("train", "configs/classification/sst2.yaml", "train.lrr=1"),           # bertpipe's own, exit 2
])
def test_cli_server_answers_as_a_fresh_interpreter(args):
    expected, answered = fresh(*args), warm(*args)
    assert (answered.returncode, answered.stdout, answered.stderr) == (expected.returncode, expected.stdout, expected.stderr)


def test_cli_server_leaves_another_environment_to_a_fresh_interpreter():
    # huggingface_hub reads HF_TOKEN and its offline switch at import: a server started without them cannot stand in.
    assert warm("--version", env=cli_env(HF_TOKEN="hf_x")) is None
    assert warm("--version") is not None


def test_cli_server_runs_a_command_in_its_own_value_of_a_variable_read_only_when_it_runs(tmp_path):
    # BERTPIPE_NATIVE_BF16 decides what `auto` precision is: a command told 1 must train in bf16, one told 0 in fp32,
    # whatever the server was started with.
    from tests.conftest import build_tiny_bert, classification_config, sentiment_rows, write_jsonl

    files = {split: write_jsonl(tmp_path / f"{split}.jsonl", sentiment_rows(16, seed)) for split, seed in (("train", 1), ("validation", 2))}
    config = classification_config(tmp_path, build_tiny_bert(tmp_path / "model"), files, max_steps=1, eval_steps=None,
                                   mixed_precision="auto")
    precisions = {}
    for value in ("1", "0"):
        answered = warm("train", str(config), "overwrite=true", env=cli_env(BERTPIPE_NATIVE_BF16=value))
        assert answered is not None and answered.returncode == 0, answered and answered.stderr[-3000:]
        precisions[value] = json.loads((tmp_path / "run" / "metrics.json").read_text())["mixed_precision"]
    assert precisions == {"1": "bf16", "0": "no"}


def test_cli_server_kills_a_command_past_its_timeout_and_answers_the_next():
    warm("--version")
    server = cli_server._servers[os.getpid()]
    # No command outlasts a zero timeout: the child is killed while it still imports the CLI.
    with pytest.raises(subprocess.TimeoutExpired):
        server.run(["--version"], timeout=0.0)
    assert warm("--version").stdout == fresh("--version").stdout


def test_cli_server_is_off_when_asked(monkeypatch):
    monkeypatch.setenv(cli_server.OFF_VARIABLE, "1")
    assert warm("--version") is None
