"""A warm ``bertpipe`` for the tests: one server per pytest worker imports the ML libraries once and forks
a fresh child for each command, so a CLI test pays a fork (milliseconds) instead of an interpreter start
and the torch/transformers/datasets imports (4-5 s on 2 cores, ~110 times a suite).

In:  :func:`run` — a command's arguments, its environment, its working folder and a timeout.
Out: a ``subprocess.CompletedProcess`` as ``python -m tasks.cli ARGS`` would give it (exit status, stdout,
     stderr), or ``subprocess.TimeoutExpired``; ``None`` when the server cannot run this command as a fresh
     interpreter would, and the caller starts one.

The child is a real process that runs ``tasks.cli`` as ``__main__`` with its own working folder,
environment, standard streams and exit status, so what a test checks is what a user gets. What it shares
with the server is only what importing the libraries did, which a fresh interpreter does the same way, with
one condition: some libraries read environment variables once, at import (huggingface_hub's offline switch,
torch's thread settings). The server therefore runs only commands whose environment is the one it was
started with, up to the variables only bertpipe reads, and only when a command runs (``CALL_TIME_VARIABLES``);
any other (``env=cli_env(HF_TOKEN=...)``) goes to a fresh interpreter. Nothing computes in the
server before it forks (an OpenMP pool does not survive a fork), and it has no threads but the idle ones
numpy's OpenBLAS and pyarrow's jemalloc start, both of which handle fork themselves.

``BERTPIPE_TEST_FRESH_INTERPRETERS=1`` turns the server off: every command then starts its own interpreter.
"""

from __future__ import annotations

import atexit
import json
import os
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path

OFF_VARIABLE = "BERTPIPE_TEST_FRESH_INTERPRETERS"
# What every command imports before it does anything; not tasks.cli itself, which the child runs as __main__
# (imported already, runpy warns on stderr).
WARM_MODULES = ("torch", "transformers", "datasets", "accelerate", "evaluate", "peft", "sklearn", "tasks", "pipelines.cli")
POLL_S = 0.02
# Read by bertpipe when a command runs (pipelines.runtime.native_bf16), never by a library at import: the child
# takes the command's value with its environment, so a command that differs from the server only here is served.
CALL_TIME_VARIABLES = frozenset({"BERTPIPE_NATIVE_BF16"})


# ---- the server (``python -m tests.cli_server``) ----

def _run_child(request: dict) -> None:
    """In the forked child: become ``python -m tasks.cli ARGS`` in the request's folder and environment."""
    import atexit as child_atexit
    import runpy
    import traceback

    status = 1
    try:
        os.chdir(request["cwd"])
        os.environ.clear()
        os.environ.update(request["env"])
        for fd, path, flags in ((0, os.devnull, os.O_RDONLY), (1, request["stdout"], os.O_WRONLY), (2, request["stderr"], os.O_WRONLY)):
            opened = os.open(path, flags)
            os.dup2(opened, fd)
            os.close(opened)
        sys.argv = [str(Path(request["cwd"]) / "tasks" / "cli.py"), *request["args"]]
        try:
            runpy.run_module("tasks.cli", run_name="__main__", alter_sys=True)
            status = 0
        except SystemExit as exit_:
            # As the interpreter treats it: None is success, an int the status, anything else a message.
            if exit_.code is None:
                status = 0
            elif isinstance(exit_.code, int):
                status = exit_.code
            else:
                print(exit_.code, file=sys.stderr)
                status = 1
        except BaseException:  # noqa: BLE001 - what the interpreter does with an uncaught exception
            traceback.print_exc()
            status = 1
        child_atexit._run_exitfuncs()
    finally:
        for stream in (sys.stdout, sys.stderr):
            try:
                stream.flush()
            except Exception:  # noqa: BLE001 - a closed stream; the status still goes out
                pass
        os._exit(status & 0xFF)


def _wait(pid: int, timeout: float) -> tuple[int, bool]:
    """(exit status as ``subprocess`` reports it, whether the timeout killed the child)."""
    deadline = time.monotonic() + timeout
    while True:
        done, wait_status = os.waitpid(pid, os.WNOHANG)
        if done:
            return os.waitstatus_to_exitcode(wait_status), False
        if time.monotonic() > deadline:
            os.kill(pid, 9)
            _, wait_status = os.waitpid(pid, 0)
            return os.waitstatus_to_exitcode(wait_status), True
        time.sleep(POLL_S)


def serve() -> None:
    """Import the libraries, then fork one child per request line on stdin; answer each on the original stdout."""
    import importlib

    for name in WARM_MODULES:
        importlib.import_module(name)
    answers = os.fdopen(os.dup(1), "w")
    # Whatever the server itself would print must not reach the answer channel.
    quiet = os.open(os.devnull, os.O_WRONLY)
    os.dup2(quiet, 1)
    os.close(quiet)
    print(json.dumps({"ready": True}), file=answers, flush=True)
    for line in sys.stdin:
        request = json.loads(line)
        sys.stdout.flush()
        sys.stderr.flush()
        pid = os.fork()
        if pid == 0:
            answers.close()
            _run_child(request)
        returncode, timed_out = _wait(pid, request["timeout"])
        print(json.dumps({"returncode": returncode, "timed_out": timed_out}), file=answers, flush=True)


# ---- the client (the pytest worker) ----

class _Server:
    def __init__(self, env: dict[str, str], cwd: Path):
        self.env, self.cwd = env, cwd
        self.process = subprocess.Popen(
            [sys.executable, "-m", "tests.cli_server"], cwd=cwd, env=env, stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True,
        )
        ready = self.process.stdout.readline()
        if not ready:
            raise RuntimeError(f"the test CLI server did not start (exit status {self.process.wait()})")
        self.lock = threading.Lock()

    def serves(self, env: dict[str, str]) -> bool:
        def imported_with(variables: dict[str, str]) -> dict[str, str]:
            return {key: value for key, value in variables.items() if key not in CALL_TIME_VARIABLES}

        return imported_with(env) == imported_with(self.env)

    def run(self, args: list[str], timeout: float, env: dict[str, str] | None = None) -> subprocess.CompletedProcess:
        with tempfile.TemporaryDirectory(prefix="bertpipe-cli-") as folder, self.lock:
            stdout, stderr = Path(folder) / "stdout", Path(folder) / "stderr"
            stdout.touch(), stderr.touch()
            request = dict(args=args, env=env or self.env, cwd=str(self.cwd), stdout=str(stdout), stderr=str(stderr), timeout=timeout)
            self.process.stdin.write(json.dumps(request) + "\n")
            self.process.stdin.flush()
            answer = self.process.stdout.readline()
            if not answer:
                raise RuntimeError(f"the test CLI server ended (exit status {self.process.wait()})")
            answer = json.loads(answer)
            out, err = (path.read_text(encoding="utf-8", errors="replace") for path in (stdout, stderr))
        command = [sys.executable, "-m", "tasks.cli", *args]
        if answer["timed_out"]:
            raise subprocess.TimeoutExpired(command, timeout, output=out, stderr=err)
        return subprocess.CompletedProcess(command, answer["returncode"], out, err)

    def close(self) -> None:
        if self.process.poll() is None:
            self.process.stdin.close()
            try:
                self.process.wait(timeout=10)
            except subprocess.TimeoutExpired:
                self.process.kill()


_servers: dict[int, _Server] = {}


def run(args: list[str], env: dict[str, str], cwd: Path, timeout: float, *, server_env: dict[str, str]) -> subprocess.CompletedProcess | None:
    """``python -m tasks.cli ARGS`` as a fork of this worker's server, which runs in ``server_env``; None when
    a fresh interpreter must run it (the server is off, ``env`` differs from the server's beyond
    ``CALL_TIME_VARIABLES``, or ``cwd`` is not the server's)."""
    if os.environ.get(OFF_VARIABLE) == "1":
        return None
    server = _servers.get(os.getpid())
    if server is None:
        server = _servers[os.getpid()] = _Server(dict(server_env), Path(cwd))
        atexit.register(server.close)
    if not server.serves(env) or Path(cwd) != server.cwd:
        return None
    return server.run([str(arg) for arg in args], timeout, env)


if __name__ == "__main__":
    serve()
