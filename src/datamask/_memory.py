"""Resident memory of this process, measured one way per question asked.

Two figures, two questions:

- :func:`measure_peak_rss` asks "how much did *this call* add?" (``bench``'s ``peak_mb``).
  Right before the call it resets the kernel's peak-RSS counter (``echo 5 >
  /proc/self/clear_refs``, Linux) and reads the current RSS; after it, it reads the peak
  (``VmHWM`` in ``/proc/self/status``). The figure is that peak minus the RSS before: what
  the call added on top of what was already loaded. Where ``clear_refs`` is unavailable a
  thread samples RSS every 2 ms instead (``memory_method`` says which).
- :func:`peak_rss_mb` asks "how large did this process ever get?" (the sharded runner's
  ``peak_rss_mb`` per worker and ``driver_peak_rss_mb``): ``getrusage(RUSAGE_SELF)``'s
  ``ru_maxrss``, the lifetime peak. Worker processes are reused across groups, so this is
  the peak of the whole worker so far: the figure "memory per worker" asks for. It is
  never reset (``ru_maxrss`` cannot be), so it cannot answer the first question.

:func:`rss_mb` is the current RSS. ``tracemalloc`` is not used: it cannot see torch's
allocations. GPU memory is torch's own ``max_memory_allocated``, read by the callers.
"""

from __future__ import annotations

import ctypes
import ctypes.util
import os
import resource
import sys
import threading
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from typing import Any

__all__ = [
    "MMAP_THRESHOLD",
    "bound_heap",
    "cpu_seconds",
    "heap_for_repeats",
    "load_average",
    "measure_peak_rss",
    "available_bytes",
    "peak_rss_mb",
    "release_heap",
    "rss_mb",
]

_MIB = 1024.0 * 1024.0


def _rss_bytes() -> int:
    with open("/proc/self/statm") as f:
        return int(f.read().split()[1]) * os.sysconf("SC_PAGE_SIZE")


def _hwm_bytes() -> int:
    with open("/proc/self/status") as f:
        for line in f:
            if line.startswith("VmHWM:"):
                return int(line.split()[1]) * 1024
    raise OSError("VmHWM not found in /proc/self/status")


def rss_mb() -> float:
    """Current resident memory of this process in MiB (NaN where /proc is unavailable)."""
    try:
        return _rss_bytes() / _MIB
    except OSError:
        return float("nan")


def peak_rss_mb() -> float:
    """Peak resident memory of this process over its lifetime, in MiB (``ru_maxrss``)."""
    peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    # ru_maxrss is in KiB on Linux, in bytes on macOS.
    return peak / _MIB if sys.platform == "darwin" else peak / 1024.0


#: glibc's malloc raises its mmap threshold each time a large block is freed (up to 32 MB);
#: blocks below it then come from the heap, whose holes it does not give back, so a worker
#: that runs one group after another carries the earlier groups' heap into the next step
#: (a 97k-row step after an 86k-row one: 5.0 GB, against 1.35 GB in a fresh process). A
#: threshold fixed at 4 MB keeps a step near its fresh-process peak for about 4% more time
#: (docs/scale.md, "Memory").
MMAP_THRESHOLD = 4 << 20
_M_MMAP_THRESHOLD = -3  # mallopt's parameter numbers (malloc.h)
_M_TRIM_THRESHOLD = -1
#: glibc's own trim threshold (128 KiB), which a fixed mmap threshold leaves in place.
_DEFAULT_TRIM_THRESHOLD = 128 << 10
#: The largest mmap threshold glibc accepts on 64-bit (HEAP_MAX_SIZE / 2), the one its own
#: dynamic threshold stops at: what :func:`heap_for_repeats` raises the bound to.
_REPEAT_MMAP_THRESHOLD = 32 << 20
_bounded = False  # whether bound_heap fixed the threshold in this process


def _libc() -> Any:
    name = ctypes.util.find_library("c")
    try:
        return ctypes.CDLL(name) if name else None
    except OSError:
        return None


_LIBC = _libc() if sys.platform.startswith("linux") else None


def bound_heap() -> bool:
    """Fix glibc's mmap threshold at :data:`MMAP_THRESHOLD` in this process, so that the
    heap of a long-lived worker does not grow step after step; idempotent. Returns whether
    it was set (False off glibc)."""
    global _bounded
    mallopt = getattr(_LIBC, "mallopt", None)
    _bounded = bool(mallopt and mallopt(_M_MMAP_THRESHOLD, MMAP_THRESHOLD))
    return _bounded


@contextmanager
def heap_for_repeats() -> Iterator[None]:
    """Lift :func:`bound_heap`'s bound while a loop allocates the same blocks step after
    step (the learner's epochs), then put it back and trim the heap.

    Under the bound every temporary above 4 MB is a fresh mmap, whose pages the kernel
    faults in again at each step: on 50k clustered documents at 10% the learner's 100
    epochs took 3.55 s against 1.26 s (``benchmarks/learner_ops/RESULTS.md``). Inside,
    blocks up to 32 MB come from the heap, which the loop's next step reuses, and the
    heap is not trimmed between steps; on exit the bound and glibc's trim threshold are
    restored and the free pages given back (``malloc_trim``), so what follows the loop
    starts from what it holds, as under the bound. A no-op where the bound is not set
    (glibc's dynamic threshold already reuses the heap) and off glibc.
    """
    mallopt = getattr(_LIBC, "mallopt", None)
    if not (_bounded and mallopt):
        yield
        return
    mallopt(_M_TRIM_THRESHOLD, 2 * _REPEAT_MMAP_THRESHOLD)
    mallopt(_M_MMAP_THRESHOLD, _REPEAT_MMAP_THRESHOLD)
    try:
        yield
    finally:
        mallopt(_M_MMAP_THRESHOLD, MMAP_THRESHOLD)
        mallopt(_M_TRIM_THRESHOLD, _DEFAULT_TRIM_THRESHOLD)
        release_heap()


def release_heap() -> None:
    """Give the heap's free pages back to the system (glibc ``malloc_trim``); a no-op
    elsewhere. Called after each step of a sharded run."""
    trim = getattr(_LIBC, "malloc_trim", None)
    if trim is not None:
        trim(0)


def measure_peak_rss(fn: Callable[[], Any]) -> tuple[Any, dict[str, Any]]:
    """Run ``fn()`` and measure the peak resident memory it added, in MiB.

    Returns ``(fn's result, {"peak_mb", "rss_before_mb", "memory_method"})``; see the module
    docstring for the method. Off Linux the numbers are NaN.
    """
    try:
        before = _rss_bytes()
    except OSError:
        return fn(), {
            "peak_mb": float("nan"),
            "rss_before_mb": float("nan"),
            "memory_method": "unavailable",
        }
    try:
        with open("/proc/self/clear_refs", "w") as f:
            f.write("5")  # reset the peak-RSS counter (VmHWM) to the current RSS
        _hwm_bytes()
        method = "clear_refs+VmHWM"
    except OSError:
        method = "rss-sampling-2ms"
    peak = [before]
    stop = threading.Event()

    def sample() -> None:
        while not stop.wait(0.002):
            peak[0] = max(peak[0], _rss_bytes())

    sampler = None
    if method == "rss-sampling-2ms":
        sampler = threading.Thread(target=sample, daemon=True)
        sampler.start()
    try:
        result = fn()
    finally:
        if sampler is not None:
            stop.set()
            sampler.join()
    top = max(peak[0], _rss_bytes()) if sampler is not None else _hwm_bytes()
    return result, {
        "peak_mb": max(0.0, (top - before) / _MIB),
        "rss_before_mb": before / _MIB,
        "memory_method": method,
    }


def cpu_seconds() -> float:
    """User + system CPU time of this process, every thread included."""
    ru = resource.getrusage(resource.RUSAGE_SELF)
    return ru.ru_utime + ru.ru_stime


def available_bytes() -> int | None:
    """Memory the machine can still give (``MemAvailable``); None where /proc is not."""
    try:
        with open("/proc/meminfo") as f:
            for line in f:
                if line.startswith("MemAvailable:"):
                    return int(line.split()[1]) * 1024
    except OSError:
        pass
    return None


def load_average() -> float:
    """The 1-minute load average (other work on the machine slows every timing)."""
    return float(os.getloadavg()[0]) if hasattr(os, "getloadavg") else float("nan")
