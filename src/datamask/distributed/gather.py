"""Rows to groups through storage: one step per cluster group writes the group as ONE object.

After the spill (:func:`~.partition.spill_shard`: every shard's rows sorted by leaf, and
its per-leaf counts), the driver holds only the leaves' totals and the plan
(:func:`~.partition.plan_by_cluster`: each group's :data:`~.partition.Unit` s). One
:func:`gather_group` step per group then

1. lists the spilled shards (one listing) and reads their per-leaf counts, and from them
   computes the group's row ranges of every spill (a leaf cut in parts: the same
   :func:`~.partition.split_across` as ever), so the driver never holds a piece per
   (shard, cluster);
2. reads those rows, in the order the plan always gave them (by spill, then by row), and
   writes them as one object with, for each row, its input shard and its row there::

       WORK/clusters/groups/group-GGGGG.parquet   the run's columns + __datamask_shard,
                                                  __datamask_row
       WORK/clusters/groups/group-GGGGG.json      marker: rows, pieces read, spills
                                                  opened, seconds

(Under ``clusters/``, beside the spills they come from: ``WORK/groups/`` is the group
steps' per-row results, read as one dataset.)

Every later step of the group (select, exchange, cover, cap, keep lists) opens that one
object, not S spills; the keep lists take each kept row's shard and row from it, so no
spill or input shard is read again to place them. Atomic, the marker last, resumable:
the driver finds the finished groups with one listing.
"""

from __future__ import annotations

import json
import time
from collections.abc import Sequence
from pathlib import Path

import numpy as np
import pyarrow as pa
from tqdm.auto import tqdm

from .._memory import peak_rss_mb
from ..io.atomic import atomic_write_json
from ..io.fs import names_in, storage_path
from ..io.parquet import atomic_write_table
from ..io.shards import read_rows
from .executors import Runner
from .partition import ROW_COLUMN, Piece, Unit, coalesce, spill_path, split_across

__all__ = [
    "SHARD_COLUMN",
    "gather_group",
    "gather_groups",
    "group_object_path",
    "unit_pieces",
]

#: The input shard of each row of a gathered group (its row there is ``ROW_COLUMN``).
SHARD_COLUMN = "__datamask_shard"


def group_object_path(work_dir: str | Path, gid: int) -> Path:
    """The one object a cluster group's steps read."""
    return storage_path(work_dir) / "clusters" / "groups" / f"group-{gid:05d}.parquet"


def _marker(work_dir: str | Path, gid: int) -> Path:
    return storage_path(work_dir) / "clusters" / "groups" / f"group-{gid:05d}.json"


def _spilled_shards(folder: Path) -> list[int]:
    """Shards with a finished spill (their counts file), in shard order: one listing."""
    names = names_in(folder)
    return sorted(
        int(n[len("shard-") : -len(".json")])
        for n in names
        if n.startswith("shard-") and n.endswith(".json")
    )


def unit_pieces(
    clusters_dir: str, units: Sequence[Unit], max_rows: int
) -> tuple[list[Piece], dict[str, int]]:
    """The spill row ranges of one group, from the per-shard counts files.

    Returns the pieces in the group's row order (:func:`~.partition.coalesce`: by spill,
    then by row) and each spill's shard. Memory: two offsets per unit per shard.
    """
    folder = storage_path(clusters_dir)
    shards = _spilled_shards(folder)
    cuts = sorted({u[0] for u in units} | {u[1] + 1 for u in units})
    at = {leaf: i for i, leaf in enumerate(cuts)}
    offsets = np.zeros((len(shards), len(cuts)), dtype=np.int64)
    for i, s in enumerate(shards):
        counts = json.loads((folder / f"shard-{s:05d}.json").read_text())["counts"]
        offsets[i] = np.concatenate([[0], np.cumsum(counts, dtype=np.int64)])[cuts]
    paths = [str(spill_path(folder, s)) for s in shards]
    pieces: list[Piece] = []
    for first, last, part, parts in units:
        lo, hi = offsets[:, at[first]], offsets[:, at[last + 1]]
        mine = [Piece(paths[i], int(lo[i]), int(hi[i])) for i in np.flatnonzero(hi > lo)]
        if parts > 1:  # a leaf cut across its axis: the same slab of every spill
            cut = split_across(mine, max_rows)
            if len(cut) != parts:
                raise RuntimeError(
                    f"leaf {first} cuts into {len(cut)} parts, not the {parts} planned; "
                    "were the spills rewritten during the run?"
                )
            mine = cut[part]
        pieces += mine
    return coalesce(pieces), dict(zip(paths, shards, strict=True))


def gather_group(
    gid: int,
    units: Sequence[Unit],
    n_rows: int,
    max_rows: int,
    columns: Sequence[str],
    clusters_dir: str,
    work_dir: str,
) -> tuple[int, int]:
    """Write one cluster group as one object (:func:`group_object_path`); a pure,
    resumable step. Returns ``(gid, rows)``; with its marker in place, does nothing."""
    marker = _marker(work_dir, gid)
    if marker.exists():
        return gid, int(json.loads(marker.read_text())["n"])
    started = time.perf_counter()
    pieces, shard_of = unit_pieces(clusters_dir, units, max_rows)
    tables = [read_rows(p.path, p.start, p.stop, [*columns, ROW_COLUMN]) for p in pieces]
    table = pa.concat_tables(tables, promote_options="permissive").combine_chunks()
    if table.num_rows != n_rows:
        raise RuntimeError(
            f"group {gid} gathers {table.num_rows} rows from the spills, not the {n_rows} "
            "planned; were the spills rewritten during the run?"
        )
    shard = np.repeat([shard_of[p.path] for p in pieces], [p.n for p in pieces])
    table = table.append_column(SHARD_COLUMN, pa.array(shard.astype(np.int32)))
    atomic_write_table(table, group_object_path(work_dir, gid))
    stats = {
        "gid": gid,
        "n": n_rows,
        "pieces": len(pieces),
        "spills_read": len({p.path for p in pieces}),
        "seconds": time.perf_counter() - started,
        "peak_rss_mb": peak_rss_mb(),
    }
    atomic_write_json(stats, marker)
    return gid, n_rows


def gather_groups(
    plan: Sequence[tuple[str, list[Unit], int]],
    max_rows: int,
    columns: Sequence[str],
    clusters_dir: str | Path,
    work_dir: str | Path,
    runner: Runner,
    progress: bool = False,
) -> list[tuple[str, list[Piece]]]:
    """Run :func:`gather_group` for every planned group without a marker (one listing),
    and return the plan as the group steps read it: one piece, the group's object."""
    done = names_in(_marker(work_dir, 0).parent)
    jobs = [
        (gid, units, n, max_rows, list(columns), str(clusters_dir), str(work_dir))
        for gid, (_, units, n) in enumerate(plan)
        if _marker(work_dir, gid).name not in done
    ]
    steps = runner.map(gather_group, jobs)
    for _ in tqdm(steps, total=len(jobs), desc="gather groups", unit="group", disable=not progress):
        pass
    return [
        (label, [Piece(str(group_object_path(work_dir, gid)), 0, n)])
        for gid, (label, _, n) in enumerate(plan)
    ]
