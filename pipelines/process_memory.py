"""This process's peak memory, without importing torch (the edge benchmark measures onnxruntime children with it).

In:  nothing; reads ``/proc/self/status`` where there is one.
Out: :func:`peak_rss_mb`, the peak resident set size of this process so far, in MB (2^20 bytes).
"""

from __future__ import annotations

import resource
import sys
from pathlib import Path

PROCESS_STATUS = Path("/proc/self/status")


def peak_rss_mb() -> float:
    """Linux's ``VmHWM``, the high-water mark of this process's own memory. ``getrusage``'s ``ru_maxrss`` is kept
    across ``exec``, so a spawned benchmark run reported its parent's peak whenever that was higher: every row of
    a small benchmark read the parent's 714 MB. Where there is no ``/proc``, ``ru_maxrss`` (macOS counts bytes)."""
    try:
        for line in PROCESS_STATUS.read_text(encoding="ascii", errors="replace").splitlines():
            if line.startswith("VmHWM:"):
                return int(line.split()[1]) / 1024  # kB
    except (OSError, ValueError, IndexError):
        pass
    peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    return peak / 2**20 if sys.platform == "darwin" else peak / 1024
