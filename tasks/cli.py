"""Entry point of the ``bertpipe`` command: the task-agnostic CLI wired to this task registry.

The registry is handed over as a function that imports a task only when a command needs it, so
that ``--help``, ``--version`` and argument errors answer without loading torch.
"""

from __future__ import annotations

import sys

from pipelines.cli import main as pipelines_main
from tasks import get_task


def main(argv: list[str] | None = None) -> int:
    return pipelines_main(argv, get_task=get_task)


if __name__ == "__main__":
    sys.exit(main())
