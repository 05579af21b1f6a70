"""The tests' warm ``bertpipe`` (tests/cli_server.py) answers as a fresh interpreter does: the same exit
status, stdout and stderr, in a process of its own with the command's environment and folder."""

from __future__ import annotations

import json
import os
import signal
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
    # huggingface_hub reads its endpoint and offline switch at import: a server started without them cannot stand in.
    assert warm("--version", env=cli_env(HF_ENDPOINT="http://127.0.0.1:9")) is None
    assert warm("--version", env=cli_env(HF_HUB_OFFLINE="0")) is None
    assert warm("--version") is not None


def test_cli_server_serves_a_token_the_hub_library_reads_when_it_runs():
    # HF_TOKEN is read by huggingface_hub's get_token() on each call: the command sees its own, the server has none.
    answered = cli_server.run([], cli_env(HF_TOKEN="hf_command"), REPO_ROOT, 120, server_env=cli_env(),
                              script="from huggingface_hub import get_token\nprint(get_token())")
    assert answered is not None and (answered.returncode, answered.stdout) == (0, "hf_command\n"), answered and answered.stderr


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


# Prints its arguments, how it was started, then a line on stderr, and ends with status 3.
ARGUMENTS_AND_STATUS = """
import os, sys
print(sys.argv, os.getcwd(), os.environ.get("HF_HUB_OFFLINE"), os.getpgrp() == os.getpid())
print("on stderr", file=sys.stderr)
sys.exit(3)
"""


def test_cli_server_runs_a_script_as_python_c_does():
    args = ("train", "a b", "--flag")
    expected = subprocess.run([sys.executable, "-c", ARGUMENTS_AND_STATUS, *args], cwd=REPO_ROOT, env=cli_env(), capture_output=True,
                              text=True, timeout=120)
    answered = cli_server.run(list(args), cli_env(), REPO_ROOT, 120, server_env=cli_env(), script=ARGUMENTS_AND_STATUS)
    assert (answered.returncode, answered.stdout, answered.stderr) == (expected.returncode, expected.stdout, expected.stderr) == (
        3, f"['-c', 'train', 'a b', '--flag'] {REPO_ROOT} 1 False\n", "on stderr\n")
    in_a_session = cli_server.run([], cli_env(), REPO_ROOT, 120, server_env=cli_env(), script=ARGUMENTS_AND_STATUS, new_session=True)
    assert in_a_session.stdout.endswith(" True\n")


# Says it is ready in the file it is given, then waits for a signal.
# It prints, then says it is ready, the file whole at once (renamed into place): the test signals once the file
# exists, and signalled before the line or inside the write, the fresh or the served interpreter lost one of them at
# random and the two results differed by it.
WAITS_FOR_A_SIGNAL = """
import pathlib, signal, sys, time
print("waiting", flush=True)
ready = pathlib.Path(sys.argv[1])
ready.with_name(ready.name + ".part").write_text(str(signal.getsignal(signal.SIGINT) is signal.default_int_handler))
ready.with_name(ready.name + ".part").rename(ready)
time.sleep(120)
"""


@pytest.mark.parametrize("number, sigint_default, expected", [
    (signal.SIGKILL, False, -signal.SIGKILL),
    (signal.SIGTERM, False, -signal.SIGTERM),
    (signal.SIGINT, True, -signal.SIGINT),  # KeyboardInterrupt uncaught: the interpreter ends itself by SIGINT
])
def test_cli_server_started_command_ends_by_a_signal_as_a_fresh_interpreter_does(tmp_path, number, sigint_default, expected):
    import time

    def signalled(process, ready) -> tuple[int, str, str, bool]:
        deadline = time.monotonic() + 60
        while not ready.is_file():
            assert process.poll() is None and time.monotonic() < deadline, process.communicate()
            time.sleep(0.01)
        assert process.poll() is None
        process.send_signal(number)
        out, err = process.communicate(timeout=60)
        return process.returncode, out, ready.read_text(), "KeyboardInterrupt" in err

    fresh_ready, warm_ready = tmp_path / "fresh", tmp_path / "warm"
    restore_sigint = (lambda: signal.signal(signal.SIGINT, signal.SIG_DFL)) if sigint_default else None
    fresh_process = subprocess.Popen([sys.executable, "-c", WAITS_FOR_A_SIGNAL, str(fresh_ready)], cwd=REPO_ROOT, env=cli_env(),
                                     stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, preexec_fn=restore_sigint)
    warm_process = cli_server.start([str(warm_ready)], cli_env(), REPO_ROOT, server_env=cli_env(), script=WAITS_FOR_A_SIGNAL,
                                    sigint_default=sigint_default)
    assert isinstance(warm_process, cli_server.ServedProcess)
    assert signalled(warm_process, warm_ready) == signalled(fresh_process, fresh_ready)
    assert warm_process.returncode == expected and warm_process.poll() == expected
    warm_process.kill()  # ended already: nothing is sent to a pid that may be another process's by now
