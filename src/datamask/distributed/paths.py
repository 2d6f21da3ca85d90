"""Where a sharded run keeps each group's files: one definition per path, read by every
step that writes or reads them (the group step, the token rounds, the cap, the cover)."""

from __future__ import annotations

from pathlib import Path

from ..io.fs import storage_path

__all__ = [
    "candidates_path",
    "completion_path",
    "global_marker",
    "graph_path",
    "part_path",
    "want_path",
]


def _group_name(gid: int) -> str:
    return f"{gid:05d}"


def completion_path(work_dir: str | Path, gid: int) -> Path:
    """The marker a finished group leaves behind."""
    return storage_path(work_dir) / "completions" / _group_name(gid)


def part_path(out_dir: str | Path, gid: int) -> Path:
    """The selected-ids file of one group in the output dataset."""
    return storage_path(out_dir) / "selected" / f"part-{_group_name(gid)}.parquet"


def candidates_path(work_dir: str | Path, gid: int) -> Path:
    """Round 1 of a global budget: the candidates one group proposes."""
    return storage_path(work_dir) / "candidates" / f"{_group_name(gid)}.parquet"


def graph_path(work_dir: str | Path, gid: int) -> Path:
    """A group's neighbour graph (``indices`` int32, ``sims`` float32, shape (n, K)), saved
    by its select step for the exchange round, which would otherwise build it again."""
    return storage_path(work_dir) / "graphs" / f"{_group_name(gid)}.npz"


def want_path(work_dir: str | Path, gid: int) -> Path:
    """Where the driver records that a group must propose more candidates."""
    return storage_path(work_dir) / "candidates" / f"{gid:05d}.want.json"


def global_marker(work_dir: str | Path) -> Path:
    """Round 2's completion marker, whichever way it combined the groups."""
    return storage_path(work_dir) / "completions" / "global"
