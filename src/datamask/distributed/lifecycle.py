"""How a sharded run's processes live and end, and what it trusts of an earlier run.

Kept apart from :mod:`.runner` so the scheduling code stays about scheduling:

- :func:`read_marker`: a completion marker of an earlier run, or None when it is missing
  or unreadable (the group is then computed again, with a warning naming the file).
- :func:`die_with_parent`: the process pool's initializer; on Linux a worker gets
  SIGKILL when its driver dies (``prctl(PR_SET_PDEATHSIG)``), whatever killed the driver
  (SIGTERM, ``kill -9``, the OOM killer), so no worker outlives it holding its stdout.
"""

from __future__ import annotations

import ctypes
import json
import os
import signal
import sys
import warnings
from pathlib import Path
from typing import Any

__all__ = ["die_with_parent", "read_marker"]

_PR_SET_PDEATHSIG = 1


def read_marker(path: Path) -> dict[str, Any] | None:
    """The JSON stats of a completion marker; None when absent or not readable JSON."""
    try:
        text = path.read_text()
    except FileNotFoundError:
        return None
    try:
        stats = json.loads(text)
    except ValueError as exc:
        warnings.warn(
            f"completion marker {path} is not readable JSON ({exc}); its group is computed again.",
            stacklevel=2,
        )
        path.unlink(missing_ok=True)
        return None
    return stats if isinstance(stats, dict) else None


def die_with_parent(parent_pid: int | None = None) -> None:
    """Ask the kernel to SIGKILL this process when its parent exits (Linux; elsewhere a
    no-op). ``parent_pid``: the driver's pid, to catch a driver that died before the call."""
    if not sys.platform.startswith("linux"):
        return
    try:
        libc = ctypes.CDLL(None, use_errno=True)
        libc.prctl(_PR_SET_PDEATHSIG, signal.SIGKILL, 0, 0, 0)
    except (OSError, AttributeError):  # no prctl: workers end when their pipe closes
        return
    if parent_pid is not None and os.getppid() != parent_pid:
        os._exit(1)  # the driver died before prctl took effect
