"""How a sharded run's processes live and end, and what it trusts of an earlier run.

Kept apart from :mod:`.runner` so the scheduling code stays about scheduling:

- :func:`read_marker`: a completion marker of an earlier run, or None when it is missing
  or unreadable (the group is then computed again, with a warning naming the file).
- :func:`pool_context`: how the pool's workers start: forked from a forkserver that
  imported datamask once (where the platform has one), else spawned.
- :func:`worker_init`: the process pool's initializer. It gives a worker the driver's
  environment as of the pool's start (a forked worker has its server's) and its slot in
  the pool, which spreads the workers over the machine's GPUs
  (:func:`~datamask._device.set_worker_slot`). A worker ends
  at once when its driver dies (:func:`watch_driver`, a thread waiting on the driver's
  pidfd; on Linux also ``prctl(PR_SET_PDEATHSIG)`` against its parent,
  :func:`die_with_parent`), whatever killed the driver (SIGTERM, ``kill -9``, the OOM
  killer), so no worker outlives it holding its stdout (``datamask select ... | tee log``
  returns). Workers ignore SIGINT: Ctrl-C reaches the whole process group, and the
  driver alone decides what happens.
- :func:`abort_pool`: what the driver does when interrupted: kill the workers at once
  (a group's files are written to temporaries and renamed, its marker last, so a killed
  group leaves nothing a rerun reuses; its temporaries are removed by the rerun) instead
  of waiting minutes for the groups in flight.
- :func:`fingerprint` and :func:`claim`: the settings and the checksums of the inputs a
  work dir holds; a rerun with other settings or changed shards is refused, naming what
  changed, and a rerun with the same ones resumes. :func:`check_previous` makes the same
  comparison before the validation pass writes anything, so a refused run leaves the
  earlier run's files as they were.
"""

from __future__ import annotations

import contextlib
import ctypes
import hashlib
import json
import multiprocessing
import os
import select
import signal
import sys
import tempfile
import threading
import warnings
from pathlib import Path
from typing import Any

from tqdm.std import tqdm  # the base class: every tqdm subclass shares its lock

from .._device import set_worker_slot
from ..config import SelectSpec
from ..io.atomic import _pid_alive, atomic_write_json
from ..io.fs import storage_path
from ..io.shards import ShardInfo
from .paths import WorkDir

__all__ = [
    "abort_pool",
    "check_previous",
    "claim",
    "die_with_parent",
    "fingerprint",
    "pool_context",
    "read_marker",
    "watch_driver",
    "worker_init",
]

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
    no-op). ``parent_pid``: the driver's pid, to catch a driver that died before the call
    (the parent itself, or, for a worker forked by a forkserver, the server's client)."""
    if not sys.platform.startswith("linux"):
        return
    try:
        libc = ctypes.CDLL(None, use_errno=True)
        libc.prctl(_PR_SET_PDEATHSIG, signal.SIGKILL, 0, 0, 0)
    except (OSError, AttributeError):  # no prctl: workers end when their pipe closes
        return
    if parent_pid is not None and os.getppid() != parent_pid and not _pid_alive(parent_pid):
        os._exit(1)  # the driver died before prctl took effect


def watch_driver(pid: int, poll_seconds: float = 0.5) -> threading.Thread | None:
    """End this process (SIGKILL) as soon as process ``pid`` ends: a daemon thread that
    waits on its pidfd (Linux 5.3+), else polls it every ``poll_seconds`` (POSIX; None
    elsewhere, where no thread is started).

    A worker forked by a forkserver is its server's child, not the driver's, and the
    server outlives the driver while any worker holds its "alive" pipe (every worker
    does: multiprocessing passes it), so ``PR_SET_PDEATHSIG`` alone never fires: the
    workers of a killed driver would wait on their call queue forever."""

    if os.name != "posix":  # on Windows os.kill(pid, 0) would end the driver itself
        return None

    def wait_and_die() -> None:
        try:
            fd = os.pidfd_open(pid)
        except (AttributeError, OSError):  # no pidfds (not Linux, old kernel): poll
            while _pid_alive(pid):
                threading.Event().wait(poll_seconds)
        else:
            select.select([fd], [], [])  # readable once the process has ended
        os.kill(os.getpid(), signal.SIGKILL)

    watcher = threading.Thread(target=wait_and_die, name="datamask-watch-driver", daemon=True)
    watcher.start()
    return watcher


#: What the local pool's forkserver imports before it forks a worker: the steps. A
#: spawned worker imported them itself: 2.4-5 s of CPU per worker for every pool (two
#: interpreters importing torch on 2 cores); forked, a pool after the first starts in
#: ~0.15 s. Not the caller's ``__main__`` (multiprocessing's default): a script that asks
#: ``torch.cuda.is_available()`` at module level would start CUDA in the server, and no
#: worker forked from it could use the GPU. Each worker imports ``__main__`` itself after
#: the fork, as a spawned one does.
POOL_PRELOAD = ("datamask.distributed",)


_forked = False  # set in a child made by fork: see pool_context


def _mark_forked() -> None:
    global _forked
    _forked = True


if hasattr(os, "register_at_fork"):
    os.register_at_fork(after_in_child=_mark_forked)


def pool_context() -> multiprocessing.context.BaseContext:
    """The start method of the local process pool: ``forkserver`` where the platform has
    it (Linux, macOS), its server importing :data:`POOL_PRELOAD` once per driver process,
    else ``spawn``. Never ``fork``: the driver's threads (torch's, pyarrow's, tqdm's) may
    hold locks at the fork; the server forks from a process that ran none of them.

    The preload list is the process's forkserver setting
    (:func:`multiprocessing.set_forkserver_preload`); it counts only before the server
    starts, so a server started earlier (by the caller) is used as it is. A process made
    by ``fork`` (``os.fork``, multiprocessing's ``fork`` start method) spawns: it inherits
    its parent's server, which it cannot use (``ChildProcessError`` from multiprocessing
    when the parent had started one)."""
    if _forked or "forkserver" not in multiprocessing.get_all_start_methods():
        return multiprocessing.get_context("spawn")
    context = multiprocessing.get_context("forkserver")
    context.set_forkserver_preload(list(POOL_PRELOAD))
    return context


def worker_init(parent_pid: int, environ: dict[str, str] | None = None, slots: Any = None) -> None:
    """Initializer of the local process pool (see the module docstring): ``environ`` is
    the driver's ``os.environ`` at the pool's start (a worker forked by the forkserver has
    the server's, from the driver's first pool; multiprocessing itself gives it the
    driver's ``sys.path``, ``sys.argv`` and working directory); ``slots`` a shared counter
    (``multiprocessing.Value``) that numbers the workers 0, 1, ... as they start."""
    if environ is not None:
        os.environ.clear()
        os.environ.update(environ)
        tempfile.tempdir = None  # found again from TMPDIR (the preload may have asked)
    if slots is not None:
        with slots.get_lock():
            set_worker_slot(slots.value)
            slots.value += 1
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    # tqdm's default lock is a multiprocessing RLock, a named semaphore registered with the
    # driver's resource tracker; a worker killed by abort_pool never unregisters it and the
    # tracker prints a warning at exit. A worker's bars need only a thread lock.
    tqdm.set_lock(threading.RLock())
    die_with_parent(parent_pid)
    watch_driver(parent_pid)


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


# --- claiming a work dir ------------------------------------------------------------------
def fingerprint(
    spec: SelectSpec, infos: list[ShardInfo], checksums: dict[str, str]
) -> dict[str, Any]:
    """SelectSpec and, per shard, path, rows, size and the checksum of the bytes read."""
    record = {
        "settings": spec.fingerprint(),
        "shards": [
            [
                str(storage_path(i.path).resolve()),
                i.num_rows,
                i.size_bytes,
                checksums.get(i.path, ""),
            ]
            for i in infos
        ],
    }
    blob = json.dumps(record, sort_keys=True, default=str).encode()
    return {**record, "settings_hash": hashlib.sha256(blob).hexdigest()[:16]}


def differences(prev: dict[str, Any], now: dict[str, Any]) -> str:
    changed = [
        f"{key} {prev.get('settings', {}).get(key)!r} -> {value!r}"
        for key, value in now["settings"].items()
        if json.loads(json.dumps(prev.get("settings", {}).get(key)))
        != json.loads(json.dumps(value))
    ]
    before = {row[0]: row[1:] for row in prev.get("shards") or []}
    after = {row[0]: list(row[1:]) for row in json.loads(json.dumps(now["shards"]))}
    if before != after:
        edited = sorted(p for p in set(before) & set(after) if before[p] != after[p])
        added, gone = sorted(set(after) - set(before)), sorted(set(before) - set(after))
        what = [f"content of {Path(p).name} changed" for p in edited[:3]]
        what += [f"{len(added)} shard(s) added"] if added else []
        what += [f"{len(gone)} shard(s) removed"] if gone else []
        changed.append("input shards changed: " + ", ".join(what))
    return "; ".join(changed) or "unknown differences"


def _previous(dirs: WorkDir) -> dict[str, Any] | None:
    """The record the work dir's ``settings.json`` holds (None when absent or unreadable:
    then :func:`claim` words the problem)."""
    try:
        prev = json.loads(dirs.settings().read_text())
    except (FileNotFoundError, ValueError):
        return None
    return prev if isinstance(prev, dict) else None


def check_previous(dirs: WorkDir, spec: SelectSpec, infos: list[ShardInfo]) -> dict[str, str]:
    """Refuse, before the validation pass writes anything, a run the earlier run recorded
    in the work dir would refuse at :func:`claim`: other settings, or shards added, removed or
    of another size or row count (their checksums are known only after the scans; the scan
    step compares them before it writes: :func:`datamask.distributed.check.validate.scan_step`).
    Returns the earlier run's ``{path: checksum}`` (empty when there is none)."""
    prev = _previous(dirs)
    if prev is None:
        return {}
    sums = {row[0]: row[3] for row in prev.get("shards") or [] if len(row) > 3}
    now = fingerprint(spec, infos, {})
    now["shards"] = [[*row[:3], sums.get(row[0], "")] for row in now["shards"]]
    same_settings = json.loads(json.dumps(prev.get("settings"), default=str)) == json.loads(
        json.dumps(now["settings"], default=str)
    )
    same_shards = [r[:3] for r in prev.get("shards") or []] == [
        list(r[:3]) for r in json.loads(json.dumps(now["shards"], default=str))
    ]
    if not (same_settings and same_shards):
        raise ValueError(refusal(dirs.root, prev, now))
    return {i.path: sums.get(row[0], "") for i, row in zip(infos, now["shards"], strict=True)}


def refusal(folder: Path, prev: dict[str, Any], now: dict[str, Any]) -> str:
    """The one line refusing a run over a folder holding another run."""
    return (
        f"{folder} holds a run with other settings ({differences(prev, now)}); "
        "rerun with the same arguments to resume, or choose another --output/--work-dir."
    )


def claim(dirs: WorkDir, record: dict[str, Any]) -> bool:
    """Check the work dir and the output hold nothing or this same run; record it. Returns
    resumed."""
    resumed = False
    for path in (dirs.settings(), dirs.manifest()):
        if not path.exists():
            continue
        try:
            prev = json.loads(path.read_text())
        except (OSError, json.JSONDecodeError):
            raise ValueError(
                f"{path} is not readable JSON; delete {path.parent} or choose another folder."
            ) from None
        if prev.get("settings_hash") != record["settings_hash"]:
            raise ValueError(refusal(path.parent, prev, record))
        resumed = True
    selected = dirs.selected()
    if not resumed and selected.is_dir() and any(selected.glob("part-*.parquet")):
        raise ValueError(
            f"{selected} already holds selected parts from another run; "
            "choose another --output or delete it."
        )
    atomic_write_json(record, dirs.settings())
    if not dirs.manifest().exists():
        atomic_write_json({**record, "complete": False}, dirs.manifest())
    return resumed
