"""How a sharded run's processes live and end, and what it trusts of an earlier run.

Kept apart from :mod:`.runner` so the scheduling code stays about scheduling:

- :func:`read_marker`: a completion marker of an earlier run, or None when it is missing
  or unreadable (the group is then computed again, with a warning naming the file).
- :func:`worker_init`: the process pool's initializer. On Linux a worker gets SIGKILL
  when its driver dies (``prctl(PR_SET_PDEATHSIG)``, :func:`die_with_parent`), whatever
  killed the driver (SIGTERM, ``kill -9``, the OOM killer), so no worker outlives it
  holding its stdout (``datamask select ... | tee log`` returns). Workers ignore SIGINT:
  Ctrl-C reaches the whole process group, and the driver alone decides what happens.
- :func:`abort_pool`: what the driver does when interrupted: kill the workers at once
  (a group's files are written to temporaries and renamed, its marker last, so a killed
  group leaves nothing a rerun reuses; its temporaries are removed by the rerun) instead
  of waiting minutes for the groups in flight.
"""

from __future__ import annotations

import contextlib
import ctypes
import json
import os
import signal
import sys
import threading
import warnings
from pathlib import Path
from typing import Any

from tqdm.std import tqdm  # the base class: every tqdm subclass shares its lock

__all__ = ["abort_pool", "die_with_parent", "read_marker", "worker_init"]

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


def worker_init(parent_pid: int) -> None:
    """Initializer of the local process pool (see the module docstring)."""
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    # tqdm's default lock is a multiprocessing RLock, a named semaphore registered with the
    # driver's resource tracker; a worker killed by abort_pool never unregisters it and the
    # tracker prints a warning at exit. A worker's bars need only a thread lock.
    tqdm.set_lock(threading.RLock())
    die_with_parent(parent_pid)


def abort_pool(pool: Any) -> None:
    """Kill a :class:`~concurrent.futures.ProcessPoolExecutor`'s workers and drop it."""
    procs = list((getattr(pool, "_processes", None) or {}).values())  # the stdlib's record
    for proc in procs:
        with contextlib.suppress(OSError, ValueError, AttributeError):
            proc.kill()
    for proc in procs:
        with contextlib.suppress(OSError, ValueError, AttributeError, AssertionError):
            proc.join(timeout=5)
    # With its workers gone the pool's manager thread sees a broken pool and ends at once;
    # waiting for it releases the queues' semaphores (no resource_tracker warning).
    pool.shutdown(wait=True, cancel_futures=True)
