"""A warm ``bertpipe`` for the tests: one server per pytest worker imports the ML libraries once and forks
a fresh child for each command, so a CLI test pays a fork (milliseconds) instead of an interpreter start
and the torch/transformers/datasets imports (4-5 s on 2 cores, ~110 times a suite).

In:  :func:`run` — a command's arguments, its environment, its working folder and a timeout; :func:`start` the
     same without the timeout, for a command the test signals while it runs. Either may name a ``script`` (the
     source of a ``python -c SCRIPT ARGS``, which patches something and calls the CLI) instead of ``-m tasks.cli``,
     a new session (``start_new_session``) and, for :func:`start`, Ctrl-C's default action (a terminal's child).
Out: from :func:`run`, a ``subprocess.CompletedProcess`` as ``python -m tasks.cli ARGS`` would give it (exit
     status, stdout, stderr), or ``subprocess.TimeoutExpired``; from :func:`start`, a :class:`ServedProcess`,
     the part of ``subprocess.Popen`` the tests use (``pid``, ``poll``, ``wait``, ``communicate``,
     ``send_signal``, ``kill``, ``returncode``). ``None`` when the server cannot run this command as a fresh
     interpreter would, and the caller starts one.

The child is a real process that runs ``tasks.cli`` as ``__main__`` with its own working folder,
environment, standard streams and exit status, so what a test checks is what a user gets. What it shares
with the server is only what importing the libraries did, which a fresh interpreter does the same way, with
one condition: some libraries read environment variables once, at import (huggingface_hub's offline switch,
torch's thread settings). The server therefore runs only commands whose environment is the one it was
started with, up to the variables read only when a command runs (``CALL_TIME_VARIABLES``);
any other (``env=cli_env(HF_ENDPOINT=...)``) goes to a fresh interpreter. Nothing computes in the
server before it forks (an OpenMP pool does not survive a fork), and it has no threads but the idle ones
numpy's OpenBLAS and pyarrow's jemalloc start, both of which handle fork themselves.

``BERTPIPE_TEST_FRESH_INTERPRETERS=1`` turns the server off: every command then starts its own interpreter.
"""

from __future__ import annotations

import atexit
import json
import os
import signal
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
# Read when a command runs, never at import: by bertpipe (pipelines.runtime.native_bf16) and by huggingface_hub's
# get_token() on each call (utils/_auth.py). The child takes the command's value with its environment, so a
# command that differs from the server only here is served.
CALL_TIME_VARIABLES = frozenset({"BERTPIPE_NATIVE_BF16", "HF_TOKEN"})


# ---- the server (``python -m tests.cli_server``) ----

def _run_child(request: dict) -> None:
    """In the forked child: become ``python -m tasks.cli ARGS`` (``python -c SCRIPT ARGS``) in the request's folder,
    environment and session."""
    import atexit as child_atexit
    import runpy
    import traceback

    status, ended_by = 1, None
    try:
        if request["new_session"]:
            os.setsid()
        if request["sigint_default"]:
            # What Python installs at start when SIGINT is not ignored; the server's is when pytest runs in a
            # shell's background (`pytest &`), and a fork keeps it.
            signal.signal(signal.SIGINT, signal.default_int_handler)
        os.chdir(request["cwd"])
        os.environ.clear()
        os.environ.update(request["env"])
        for fd, path, flags in ((0, os.devnull, os.O_RDONLY), (1, request["stdout"], os.O_WRONLY), (2, request["stderr"], os.O_WRONLY)):
            opened = os.open(path, flags)
            os.dup2(opened, fd)
            os.close(opened)
        try:
            if request["script"] is None:
                sys.argv = [str(Path(request["cwd"]) / "tasks" / "cli.py"), *request["args"]]
                runpy.run_module("tasks.cli", run_name="__main__", alter_sys=True)
            else:
                sys.argv = ["-c", *request["args"]]
                exec(compile(request["script"], "<string>", "exec"), {"__name__": "__main__", "__builtins__": __builtins__})
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
        except KeyboardInterrupt:  # the interpreter ends itself by SIGINT then: the caller sees -2 (130 in a shell)
            traceback.print_exc()
            ended_by = signal.SIGINT
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
        if ended_by is not None:
            signal.signal(ended_by, signal.SIG_DFL)
            os.kill(os.getpid(), ended_by)
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
    started: dict[int, int | None] = {}  # a command started in the background: its exit status once it has ended
    for line in sys.stdin:
        request = json.loads(line)
        if "poll" in request:
            print(json.dumps({"returncode": _poll(started, request["poll"])}), file=answers, flush=True)
            continue
        sys.stdout.flush()
        sys.stderr.flush()
        pid = os.fork()
        if pid == 0:
            answers.close()
            _run_child(request)
        if request["timeout"] is None:
            started[pid] = None
            print(json.dumps({"pid": pid}), file=answers, flush=True)
            continue
        returncode, timed_out = _wait(pid, request["timeout"])
        print(json.dumps({"returncode": returncode, "timed_out": timed_out}), file=answers, flush=True)
    for pid in started:  # the tests are over: nothing they started outlives them
        if _poll(started, pid) is None:
            os.kill(pid, signal.SIGKILL)
            os.waitpid(pid, 0)


def _poll(started: dict[int, int | None], pid: int) -> int | None:
    """The exit status of a command started in the background once it has ended (the same when asked again)."""
    if started[pid] is None:
        done, wait_status = os.waitpid(pid, os.WNOHANG)
        if done:
            started[pid] = os.waitstatus_to_exitcode(wait_status)
    return started[pid]


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

    def ask(self, request: dict) -> dict:
        """One request, its answer; a run's answer comes when the command has ended."""
        self.process.stdin.write(json.dumps(request) + "\n")
        self.process.stdin.flush()
        answer = self.process.stdout.readline()
        if not answer:
            raise RuntimeError(f"the test CLI server ended (exit status {self.process.wait()})")
        return json.loads(answer)

    def request(self, args: list[str], env: dict[str, str] | None, folder: Path, timeout: float | None, *,
                script: str | None = None, new_session: bool = False, sigint_default: bool = False) -> dict:
        stdout, stderr = folder / "stdout", folder / "stderr"
        stdout.touch(), stderr.touch()
        return dict(args=args, env=env or self.env, cwd=str(self.cwd), stdout=str(stdout), stderr=str(stderr), timeout=timeout,
                    script=script, new_session=new_session, sigint_default=sigint_default)

    def run(self, args: list[str], timeout: float, env: dict[str, str] | None = None, *, script: str | None = None,
            new_session: bool = False) -> subprocess.CompletedProcess:
        with tempfile.TemporaryDirectory(prefix="bertpipe-cli-") as folder, self.lock:
            answer = self.ask(self.request(args, env, Path(folder), timeout, script=script, new_session=new_session))
            out, err = _outputs(Path(folder))
        argv = command(args, script)
        if answer["timed_out"]:
            raise subprocess.TimeoutExpired(argv, timeout, output=out, stderr=err)
        return subprocess.CompletedProcess(argv, answer["returncode"], out, err)

    def close(self) -> None:
        if self.process.poll() is None:
            self.process.stdin.close()
            try:
                self.process.wait(timeout=10)
            except subprocess.TimeoutExpired:
                self.process.kill()


def command(args: list[str], script: str | None = None) -> list[str]:
    """The fresh interpreter's command line for the same command."""
    return [sys.executable, *(["-m", "tasks.cli"] if script is None else ["-c", script]), *args]


def _outputs(folder: Path) -> tuple[str, str]:
    return tuple(path.read_text(encoding="utf-8", errors="replace") for path in (folder / "stdout", folder / "stderr"))


class ServedProcess:
    """A command started in the background by the server: what a test does with a ``subprocess.Popen`` of it.

    Its output is read once it has ended (``communicate``), as the tests do; signals go to its pid directly."""

    def __init__(self, server: _Server, args: list[str], env: dict[str, str], script: str | None, new_session: bool,
                 sigint_default: bool):
        self.server, self.args = server, command(args, script)
        self.folder = tempfile.TemporaryDirectory(prefix="bertpipe-cli-")
        with server.lock:
            answer = server.ask(server.request(args, env, Path(self.folder.name), None, script=script, new_session=new_session,
                                               sigint_default=sigint_default))
        self.pid: int = answer["pid"]
        self.returncode: int | None = None
        self.output: tuple[str, str] | None = None

    def poll(self) -> int | None:
        if self.returncode is None:
            with self.server.lock:
                self.returncode = self.server.ask({"poll": self.pid})["returncode"]
        return self.returncode

    def wait(self, timeout: float | None = None) -> int:
        deadline = None if timeout is None else time.monotonic() + timeout
        while self.poll() is None:
            if deadline is not None and time.monotonic() > deadline:
                raise subprocess.TimeoutExpired(self.args, timeout)
            time.sleep(POLL_S)
        return self.returncode

    def communicate(self, timeout: float | None = None) -> tuple[str, str]:
        self.wait(timeout)
        if self.output is None:
            self.output = _outputs(Path(self.folder.name))
            self.folder.cleanup()
        return self.output

    def send_signal(self, number: int) -> None:
        if self.poll() is None:  # as Popen: never a signal to a pid that may since belong to another process
            os.kill(self.pid, number)

    def kill(self) -> None:
        self.send_signal(signal.SIGKILL)


_servers: dict[int, _Server] = {}


def _server_for(env: dict[str, str], cwd: Path, server_env: dict[str, str]) -> _Server | None:
    if os.environ.get(OFF_VARIABLE) == "1":
        return None
    server = _servers.get(os.getpid())
    if server is None:
        server = _servers[os.getpid()] = _Server(dict(server_env), Path(cwd))
        atexit.register(server.close)
    if not server.serves(env) or Path(cwd) != server.cwd:
        return None
    return server


def run(args: list[str], env: dict[str, str], cwd: Path, timeout: float, *, server_env: dict[str, str], script: str | None = None,
        new_session: bool = False) -> subprocess.CompletedProcess | None:
    """``python -m tasks.cli ARGS`` (or ``python -c SCRIPT ARGS``) as a fork of this worker's server, which runs in
    ``server_env``; None when a fresh interpreter must run it (the server is off, ``env`` differs from the
    server's beyond ``CALL_TIME_VARIABLES``, or ``cwd`` is not the server's)."""
    server = _server_for(env, cwd, server_env)
    if server is None:
        return None
    return server.run([str(arg) for arg in args], timeout, env, script=script, new_session=new_session)


def start(args: list[str], env: dict[str, str], cwd: Path, *, server_env: dict[str, str], script: str | None = None,
          new_session: bool = False, sigint_default: bool = False) -> ServedProcess | None:
    """As :func:`run`, but returns as soon as the command has started; None when a fresh interpreter must run it."""
    server = _server_for(env, cwd, server_env)
    if server is None:
        return None
    return ServedProcess(server, [str(arg) for arg in args], env, script, new_session, sigint_default)


if __name__ == "__main__":
    serve()
