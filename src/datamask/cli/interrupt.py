"""Ctrl-C and SIGTERM: end cleanly, exit 130 or 143, and say in one line what is kept.

SIGTERM is turned into :class:`Terminated` (a ``KeyboardInterrupt``), so both signals
unwind the same way: claims released, temporaries removed, a sharded run's workers killed
(:func:`datamask.distributed.lifecycle.abort_pool`). What a rerun reuses is already on
disk (finished groups, applied shards); :func:`interrupted_line` counts it.
"""

from __future__ import annotations

import argparse
import fnmatch
import signal
import threading
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from types import FrameType

from ..applying.core import STATE_DIR
from ..distributed.paths import WorkDir
from ..io.fs import Location, resolve

__all__ = ["Terminated", "exit_status", "interrupted_line", "terminate_on_sigterm"]


class Terminated(KeyboardInterrupt):
    """SIGTERM, raised in the main thread like Ctrl-C's KeyboardInterrupt."""


def _raise_terminated(signum: int, frame: FrameType | None) -> None:
    raise Terminated()


@contextmanager
def terminate_on_sigterm() -> Iterator[None]:
    """While the command runs, SIGTERM unwinds it like Ctrl-C (main thread only; the
    previous handler comes back after)."""
    if threading.current_thread() is not threading.main_thread():
        yield
        return
    previous = signal.signal(signal.SIGTERM, _raise_terminated)
    try:
        yield
    finally:
        signal.signal(signal.SIGTERM, previous)


def exit_status(exc: KeyboardInterrupt) -> int:
    """128 + the signal: 143 for SIGTERM, 130 for SIGINT."""
    return 128 + (signal.SIGTERM if isinstance(exc, Terminated) else signal.SIGINT)


def _place(path: str) -> Path | Location:
    """A local path, or a remote output's :class:`~datamask.io.fs.Location`."""
    loc = resolve(str(path))
    return Path(loc.path) if loc.is_local else loc


def _count(folder: Path | Location, pattern: str) -> int:
    """Files in ``folder`` (below it, for a ``**/`` pattern) matching ``pattern``; 0 where
    it cannot be listed (the line must still be printed)."""
    try:
        if isinstance(folder, Location):
            files = folder.walk() if pattern.startswith("**/") else folder.glob(pattern)
            return sum(1 for f in files if fnmatch.fnmatchcase(f.name, pattern.split("/")[-1]))
        return sum(1 for p in folder.glob(pattern) if p.is_file())
    except (OSError, ValueError):
        return 0


def _is_dir(path: str) -> bool:
    try:
        return _place(path).is_dir()
    except (OSError, ValueError):
        return False


def interrupted_line(args: argparse.Namespace, exc: KeyboardInterrupt) -> str:
    """The one true line about what an interrupted command leaves."""
    how = "terminated (SIGTERM)" if isinstance(exc, Terminated) else "interrupted"
    command = getattr(args, "command", None)
    output = getattr(args, "output", None)
    if command == "apply" and output:
        done = _count(_place(output) / STATE_DIR / "done", "**/*.json")
        if done:
            return (
                f"{how}; {done} finished shard(s) are kept in {output}; rerun the same command "
                "to apply the rest (finished shards are not redone)."
            )
        return f"{how}; no shard had finished, so nothing was written to {output}."
    if command == "select" and output and _is_dir(output):
        dirs = WorkDir.of(output, getattr(args, "work_dir", None))
        work = dirs.root
        # group markers only: not a marker's temporary (".NNNNN....tmp", a group still being
        # written when the signal came), nor the global, given or token-fill markers
        done = _count(dirs.completions(), "[0-9]*")
        if done:
            return (
                f"{how}; {done} finished group(s) are kept in {work}; rerun the same command "
                "to resume (they are not recomputed)."
            )
        return f"{how}; no group had finished; rerun the same command to start again."
    where = f" {output}" if output else ""
    return f"{how}; no output was written (any previous{where} is unchanged)."
