"""The one base of bertpipe's user-facing errors, and the wrapper that puts a loader's failure into one.

In:  a failure raised inside a library we call at a boundary (a YAML file, data files, a model or
     tokenizer folder, a checkpoint, the output folder, a predict input).
Out: a :class:`UserError` subclass whose message names that boundary's file and the key that pointed
     to it, with the library's exception kept as ``__cause__`` (the CLI shows its traceback only with
     ``--debug`` or ``BERTPIPE_DEBUG=1``).

The boundaries are few and each wraps every exception, not a list of known ones: a user's data holds
cases nobody listed, and each of them should still end in a message that says where to look.
"""

from __future__ import annotations

import signal
from contextlib import contextmanager
from typing import Any, Callable, Iterator, NoReturn

_MAX_DETAIL = 400


class UserError(Exception):
    """Input (config, data, model, folders) that cannot be used; the message names key, file or row."""


class DataError(UserError, ValueError):
    """Input data that cannot be used as configured; the message names the file/split/column."""


class ModelError(UserError, ValueError):
    """A model or tokenizer that cannot serve the configured task (raised by the loaders and the ONNX runner)."""


class TrainingDiverged(UserError, ArithmeticError):
    """A training loss or weights that are no longer finite numbers: the run cannot give a model."""


class OutputDirError(UserError, RuntimeError):
    """An ``output_dir`` (or ``--output``, ``--out``) that cannot be written, or whose contents a write would lose."""


def describe(error: BaseException) -> str:
    """``Type: message`` of the most specific exception in a chain, on one line.

    Libraries often wrap the useful error (``DatasetGenerationError`` around pandas' "Expected 2 fields
    in line 3"), so the innermost cause is what the user needs to read.
    """
    innermost = error
    while innermost.__cause__ is not None and innermost.__cause__ is not innermost:
        innermost = innermost.__cause__
    text = " ".join(str(innermost).split()) or repr(innermost)
    if len(text) > _MAX_DETAIL:
        text = text[:_MAX_DETAIL] + " ..."
    return f"{type(innermost).__name__}: {text}"


@contextmanager
def failures_named(error_type: type[UserError], where: str) -> Iterator[None]:
    """Re-raise any non-bertpipe exception of the block as ``error_type("<where>: <what failed>")``.

    Our own errors pass through unchanged: they already name their key, file or row.
    """
    try:
        yield
    except UserError:
        raise
    except (KeyboardInterrupt, SystemExit, MemoryError):
        raise
    except Exception as error:
        raise error_type(f"{where}: {describe(error)}") from error



class RunStopped(Exception):
    """Training stopped at a step boundary on a signal (SIGTERM, SIGUSR1), after writing a complete
    checkpoint. Not a fault: the command line reports it in one line, with the way on for its command,
    and the shell's status for that signal (128 + its number), as it does Ctrl-C."""

    def __init__(self, signal_number: int, step: int, total_steps: int, checkpoint: str) -> None:
        # Every field in args, so that a sweep worker process can hand it to its parent (pickle).
        super().__init__(int(signal_number), step, total_steps, str(checkpoint))
        self.signal_number, self.step, self.total_steps, self.checkpoint = int(signal_number), step, total_steps, str(checkpoint)
        self.exit_status = 128 + self.signal_number

    def __str__(self) -> str:
        return (f"stopped by {signal.Signals(self.signal_number).name} at step {self.step} of {self.total_steps}; "
                f"checkpoint {self.checkpoint} is complete")


def run_script(name: str, main: Callable[[], Any]) -> NoReturn:
    """Run a script's ``main`` as the ``bertpipe`` command ends: bad input (a :class:`UserError`, a file that is not
    there, a ``bertpipe`` command it ran that failed, a ``SystemExit`` with a message) ends with exit status 2 and one
    line naming the script, never a traceback; ``main``'s integer result is the exit status."""
    import subprocess
    import sys

    try:
        result = main()
    except UserError as error:
        message = str(error)
    except FileNotFoundError as error:
        message = f"{error.filename or error}: no such file or folder"
    except subprocess.CalledProcessError as error:
        command = error.cmd if isinstance(error.cmd, str) else " ".join(str(part) for part in error.cmd)
        message = f"`{command}` ended with exit status {error.returncode} (its message is above)"
    except SystemExit as error:
        if not isinstance(error.code, str):
            raise  # argparse's own usage errors (2) and plain exits
        message = error.code.removeprefix("error: ")
    else:
        sys.exit(result if isinstance(result, int) else 0)
    print(f"{name}: error: {message}", file=sys.stderr)
    sys.exit(2)
