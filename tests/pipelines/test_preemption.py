"""StopSignals: a scheduler's signal becomes a stop at the next step boundary; a second one stops at once."""

from __future__ import annotations

import os
import pickle
import signal
import threading

import pytest

from pipelines.errors import RunStopped
from pipelines.preemption import StopSignals


@pytest.mark.parametrize("number", [signal.SIGTERM, signal.SIGUSR1])
def test_preemption_a_signal_is_noted_for_the_step_boundary_and_the_handlers_are_restored(number):
    before = signal.getsignal(number)
    with StopSignals() as stop:
        assert stop.agreed() is None
        os.kill(os.getpid(), number)  # the handler runs before the next line: the process is not ended
        assert stop.agreed() == number
    assert signal.getsignal(number) is before


def test_preemption_a_second_signal_stops_at_once_as_ctrl_c_does():
    before = signal.getsignal(signal.SIGTERM)
    with pytest.raises(KeyboardInterrupt):
        with StopSignals():
            os.kill(os.getpid(), signal.SIGTERM)
            os.kill(os.getpid(), signal.SIGTERM)
    assert signal.getsignal(signal.SIGTERM) is before


def test_preemption_off_the_main_thread_leaves_the_process_handlers_alone():
    before = signal.getsignal(signal.SIGTERM)
    seen = []

    def loop():
        with StopSignals() as stop:
            seen.append((signal.getsignal(signal.SIGTERM), stop.agreed()))

    worker = threading.Thread(target=loop)
    worker.start()
    worker.join()
    assert seen == [(before, None)]


def test_preemption_the_stop_crosses_a_process_boundary_whole():
    """A sweep worker process hands its exception to the parent by pickle; the parent reports it."""
    stopped = pickle.loads(pickle.dumps(RunStopped(signal.SIGUSR1, 3, 24, "run/checkpoints/step-00000003")))
    assert str(stopped) == "stopped by SIGUSR1 at step 3 of 24; checkpoint run/checkpoints/step-00000003 is complete"
    assert stopped.exit_status == 128 + signal.SIGUSR1
