"""Stopping a training run cleanly when its machine is being taken away.

In:  SIGTERM, the signal Slurm, Kubernetes, systemd and ``accelerate launch`` (to each of its processes,
     with 30 s before it kills them) send before they end a job, and SIGUSR1, which Slurm sends ahead of a
     time limit with ``#SBATCH --signal=USR1@120``.
Out: :class:`StopSignals`, installed around the training loop: it notes the signal instead of dying of
     it, and :meth:`StopSignals.agreed` tells the loop, at an optimizer-step boundary, that every process
     has to stop at this same step. The loop then writes a checkpoint and raises
     :class:`~pipelines.errors.RunStopped`; ``train.resume_from_checkpoint=latest`` continues the run to
     the result it would have had uninterrupted.

A second signal while the step finishes stops at once, as Ctrl-C does (the checkpoint being written is
discarded, complete ones are kept). During the final evaluation of a one-process run,
:func:`stopping_at_once` makes the signal end it where it is (:class:`StopNow`): the loop then writes the
last step's checkpoint and stops as above, where dying of the signal lost every step since the last
checkpoint (the whole run when ``train.save_steps`` is unset). Elsewhere outside the loop (loading data,
the final save) the signals keep their usual effect. :func:`passed_on_to` makes a parent
that only waits for its worker processes (``bertpipe sweep --workers K``) hand the signal on to them, and
:func:`ending_with_parent` has a worker signalled when its parent dies without a word (``kill -9``).
"""

from __future__ import annotations

import os
import signal
import threading
from contextlib import contextmanager
from types import FrameType, TracebackType
from typing import Iterator, Sequence

STOP_SIGNALS = (signal.SIGTERM, signal.SIGUSR1)


class StopSignals:
    """A context manager: while it is active, SIGTERM/SIGUSR1 request a stop at the next step boundary."""

    def __init__(self) -> None:
        self.received: signal.Signals | None = None
        self._previous: dict[signal.Signals, object] = {}
        self._group = None
        import torch  # here, not at the top: the CLI installs stopping_at_once before a command has imported torch

        self._flag = torch.zeros((), dtype=torch.int32)

    def __enter__(self) -> "StopSignals":
        # Python runs handlers on the main thread only; a loop on another thread (a caller's own) keeps
        # the process's handlers.
        if threading.current_thread() is threading.main_thread():
            for number in STOP_SIGNALS:
                self._previous[number] = signal.signal(number, self._note)
        import torch.distributed as dist

        if dist.is_available() and dist.is_initialized() and dist.get_world_size() > 1:
            # The flag is agreed over gloo, on the CPU, even when training runs on GPUs with NCCL: reducing a
            # device tensor would make every step wait for the device.
            self._group = None if dist.get_backend() == "gloo" else dist.new_group(backend="gloo")
            self._world = True
        else:
            self._world = False
        return self

    def __exit__(self, kind: type[BaseException] | None, error: BaseException | None, trace: TracebackType | None) -> None:
        for number, handler in self._previous.items():
            signal.signal(number, handler)
        self._previous.clear()

    def _note(self, number: int, frame: FrameType | None) -> None:
        if self.received is not None:
            raise KeyboardInterrupt  # asked twice: stop now, as Ctrl-C does
        self.received = signal.Signals(number)

    def agreed(self) -> signal.Signals | None:
        """The signal to stop for, if any process received one; every process must call this at every
        optimizer step, since with several processes it is a collective and they must all stop at the
        same step (each waits for the others at the checkpoint)."""
        if not self._world:
            return self.received
        import torch.distributed as dist

        self._flag.fill_(0 if self.received is None else int(self.received))
        dist.all_reduce(self._flag, op=dist.ReduceOp.MAX, group=self._group)
        number = int(self._flag.item())
        return signal.Signals(number) if number else None


class StopNow(BaseException):
    """A SIGTERM/SIGUSR1 inside :func:`stopping_at_once`. A BaseException, as KeyboardInterrupt is, so that
    no ``except Exception`` on the way (a library retrying, a boundary renaming errors) swallows it."""

    def __init__(self, number: int) -> None:
        super().__init__(int(number))
        self.signal = signal.Signals(number)


@contextmanager
def stopping_at_once() -> Iterator[None]:
    """While the block runs, SIGTERM/SIGUSR1 raise :class:`StopNow` where the main thread is, for work that
    writes nothing and can be redone (the final evaluation: minutes, longer than a scheduler's grace
    period, with no step boundary to wait for). Off the main thread it changes nothing."""
    if threading.current_thread() is not threading.main_thread():
        yield
        return

    def stop(number: int, frame: FrameType | None) -> None:
        raise StopNow(number)

    with _handling_stop_signals(stop):
        yield


@contextmanager
def passed_on_to(processes: Sequence) -> Iterator[None]:
    """While the block waits for ``processes`` (``multiprocessing.Process``), a SIGTERM/SIGUSR1 to this process
    is sent on to each of them that is alive, instead of ending this one alone: the workers would otherwise
    train on as orphans, and nobody would report how they stopped."""
    def pass_on(number: int, frame: FrameType | None) -> None:
        for process in processes:
            if process.is_alive() and process.pid is not None:
                os.kill(process.pid, number)

    with _handling_stop_signals(pass_on):
        yield


def ending_with_parent(number: int) -> None:
    """Send this process ``number`` once, as soon as its ``multiprocessing`` parent (the process that started it)
    has died. A parent killed outright (``kill -9``, the OOM killer) hands no signal on, and its workers trained on
    as orphans, writing into folders nobody read. A watching thread on the parent's sentinel (a pipe the parent
    holds open while it lives), not Linux's parent-death signal: that one comes again each time another of a dying
    parent's threads inherits the child, and a second SIGTERM means "stop now" (no checkpoint) to a training run.
    Nor the parent's pid: a forkserver's child has the server for its parent in the kernel's sense."""
    import multiprocessing

    parent = multiprocessing.parent_process()

    def watch() -> None:
        parent.join()
        os.kill(os.getpid(), number)

    threading.Thread(target=watch, name="ending-with-parent", daemon=True).start()


@contextmanager
def _handling_stop_signals(handler) -> Iterator[None]:
    """``handler`` for SIGTERM and SIGUSR1 while the block runs; the previous handlers after it."""
    previous = {number: signal.signal(number, handler) for number in STOP_SIGNALS}
    try:
        yield
    finally:
        for number, old in previous.items():
            signal.signal(number, old)
