"""Rows to groups through storage: one step per cluster group writes the group as ONE object.

After the spill (:func:`~.partition.spill_shard`: every shard's rows sorted by leaf, and
its per-leaf counts), one :func:`index_spills` step turns the S counts files into one
leaf-major table of offsets and gives the driver the leaves' totals. The driver holds
only those and the plan (:func:`~.partition.plan_by_cluster`: each group's
:data:`~.partition.Unit` s). One :func:`gather_group` step per group then

1. reads the offsets of its leaves in every spill (ranged reads of the table) and from
   them computes the group's row ranges of every spill (a leaf cut in parts: the same
   :func:`~.partition.split_across` as ever), so the driver never holds a piece per
   (shard, cluster);
2. reads those rows, in the order the plan always gave them (by spill, then by row), and
   writes them as one object with, for each row, its input shard and its row there::

       WORK/clusters/groups/group-GGGGG.parquet   the run's columns + __datamask_shard,
                                                  __datamask_row
       WORK/clusters/groups/group-GGGGG.json      marker: rows, pieces read, spills
                                                  opened, seconds

(Under ``clusters/``, beside the spills they come from: ``WORK/groups/`` is the group
steps' per-row results, read as one dataset.) Once every group is gathered,
:func:`release_spills` steps delete the spills (their counts stay for a resume): they
held every row a second time.

Every later step of the group (select, exchange, cover, cap, keep lists) opens that one
object, not S spills; the keep lists take each kept row's shard and row from it, so no
spill or input shard is read again to place them. Atomic, the marker last, resumable:
the driver finds the finished groups with one listing.
"""

from __future__ import annotations

import json
import tempfile
import time
from collections.abc import Sequence
from pathlib import Path

import numpy as np
import pyarrow as pa
from tqdm.auto import tqdm

from .._memory import peak_rss_mb
from ..io.atomic import atomic_write, atomic_write_json
from ..io.fs import names_in, open_input, storage_path
from ..io.parquet import atomic_write_table
from ..io.shards import read_rows
from .executors import Runner
from .partition import ROW_COLUMN, Piece, Unit, coalesce, spill_path, split_across

__all__ = [
    "SHARD_COLUMN",
    "gather_group",
    "gather_groups",
    "group_object_path",
    "index_spills",
    "release_spills",
    "ungathered",
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


#: int64 values an index step holds at once (32 MB), whatever the spills x leaves: the
#: offsets table is built in panels of spills and written in blocks of leaves.
INDEX_BLOCK_VALUES = 1 << 22


def index_spills(
    clusters_dir: str, n_leaves: int, block_values: int = INDEX_BLOCK_VALUES
) -> list[int]:
    """One step after the spill: every spilled shard's per-leaf counts as one leaf-major
    table of offsets, so a gather step reads the few rows it needs, not S counts files.

    Writes ``clusters/offsets.bin`` (int64, ``(leaves + 1) x spills``: row ``l`` is where
    leaf ``l`` starts in each spill, row ``leaves`` each spill's rows),
    ``clusters/offsets.spills.json`` (the spilled shards: what a gather step reads besides
    its rows of the table) and then the marker
    ``clusters/offsets.json`` (the spilled shards in order, and each leaf's total rows),
    which a rerun returns without redoing the work. Returns the leaves' totals: all the
    driver needs of the counts.

    Memory: two blocks of ``block_values`` int64 values and the leaves' totals, not the table (``8 x
    spills x leaves`` bytes: 80 GB at 10^5 x 10^5). Each counts file is read once; panels
    of as many spills as fit in a block are written leaf-major to this process's own
    temporary folder, then read back a block of leaves at a time (ranged reads, one per
    panel) and appended to the table.
    """
    folder = storage_path(clusters_dir)
    marker = folder / "offsets.json"
    if marker.exists():
        return json.loads(marker.read_text())["per_leaf"]
    shards = _spilled_shards(folder)
    per_leaf = np.zeros(n_leaves, dtype=np.int64)
    with (
        tempfile.TemporaryDirectory(prefix="datamask-offsets-") as tmp,
        atomic_write(folder / "offsets.bin") as table,
    ):
        width = max(1, block_values // (n_leaves + 1))  # spills per panel
        panels = [
            _write_panel(folder, shards[i : i + width], n_leaves, Path(tmp), per_leaf)
            for i in range(0, len(shards), width)
        ]
        _append_leaf_blocks(panels, n_leaves + 1, len(shards), block_values, table)
    atomic_write_json({"shards": shards}, _spills_path(folder))  # what the gathers read
    per_leaf_list = per_leaf.tolist()
    atomic_write_json({"shards": shards, "leaves": n_leaves, "per_leaf": per_leaf_list}, marker)
    return per_leaf_list


def _spills_path(folder: Path) -> Path:
    return folder / "offsets.spills.json"


def _write_panel(
    folder: Path, shards: Sequence[int], n_leaves: int, tmp: Path, per_leaf: np.ndarray
) -> tuple[Path, int]:
    """The offsets of ``shards``' spills, leaf-major ``(leaves + 1) x len(shards)``, as a
    local file; adds their counts to ``per_leaf``. Returns the file and its width."""
    panel = np.zeros((n_leaves + 1, len(shards)), dtype=np.int64)
    for i, s in enumerate(shards):
        counts = np.asarray(
            json.loads((folder / f"shard-{s:05d}.json").read_text())["counts"], dtype=np.int64
        )
        if len(counts) != n_leaves:
            raise RuntimeError(
                f"the spill of shard {s} counts {len(counts)} leaves, not the tree's "
                f"{n_leaves}; was the work dir written by another run?"
            )
        np.cumsum(counts, out=panel[1:, i])
        per_leaf += counts
    path = tmp / f"panel-{shards[0]:05d}.bin"
    panel.tofile(path)
    return path, len(shards)


def _append_leaf_blocks(
    panels: Sequence[tuple[Path, int]], n_rows: int, n_spills: int, block_values: int, out: Path
) -> None:
    """Write the table to ``out``: blocks of whole rows (leaves), each gathered from every
    panel with one ranged read, so no more than ``block_values`` values are held."""
    rows = max(1, block_values // max(1, n_spills))
    with open(out, "wb") as fh:
        for lo in range(0, n_rows, rows):
            hi = min(n_rows, lo + rows)
            parts = []
            for path, width in panels:
                with open(path, "rb") as panel:
                    panel.seek(8 * lo * width)
                    part = np.fromfile(panel, dtype=np.int64, count=(hi - lo) * width)
                parts.append(part.reshape(hi - lo, width))
            if parts:  # no spill: an empty table
                fh.write(np.hstack(parts).tobytes())


def _offset_rows(folder: Path, leaves: Sequence[int], n_spills: int) -> np.ndarray:
    """Rows ``leaves`` of ``offsets.bin``, shape (spills, len(leaves)): ranged reads."""
    out = np.empty((len(leaves), n_spills), dtype=np.int64)
    with open_input(folder / "offsets.bin") as fh:
        for i, leaf in enumerate(leaves):
            fh.seek(8 * leaf * n_spills)
            out[i] = np.frombuffer(fh.read(8 * n_spills), dtype=np.int64)
    return out.T


def unit_pieces(
    clusters_dir: str, units: Sequence[Unit], max_rows: int
) -> tuple[list[Piece], dict[str, int]]:
    """The spill row ranges of one group, from the offsets :func:`index_spills` wrote.

    Returns the pieces in the group's row order (:func:`~.partition.coalesce`: by spill,
    then by row) and each spill's shard. Reads the spilled shards' list (O(S)) and one
    row of ``offsets.bin`` per cut (``8 x S`` bytes, a ranged read), never the whole
    table. Memory: two offsets per unit per spill.
    """
    folder = storage_path(clusters_dir)
    # The spilled shards: O(S), not the marker's O(S + C) (the leaves' totals are the
    # driver's); a work dir indexed before this file existed has them in the marker.
    listed = _spills_path(folder) if _spills_path(folder).exists() else folder / "offsets.json"
    shards = json.loads(listed.read_text())["shards"]
    cuts = sorted({u[0] for u in units} | {u[1] + 1 for u in units})
    at = {leaf: i for i, leaf in enumerate(cuts)}
    offsets = _offset_rows(folder, cuts, len(shards))
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


def ungathered(n_groups: int, work_dir: str | Path) -> list[int]:
    """The groups of the ``n_groups`` that have no marker yet (one listing)."""
    done = names_in(_marker(work_dir, 0).parent)
    return [gid for gid in range(n_groups) if _marker(work_dir, gid).name not in done]


def release_spills(clusters_dir: str, shards: Sequence[int]) -> None:
    """Delete the spills of ``shards`` once every group is gathered: nothing reads them
    again, and they hold a second copy of every row. Their ``.json`` counts stay; with
    :func:`~.partition.spills_released_path` written after these steps, a resumed run
    reuses the spill and gather steps. Idempotent: a missing spill is fine."""
    folder = storage_path(clusters_dir)
    for s in shards:
        spill_path(folder, s).unlink(missing_ok=True)


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
    todo = ungathered(len(plan), work_dir)
    shared = list(columns), str(clusters_dir), str(work_dir)  # one copy, not one a job
    jobs = ((gid, plan[gid][1], plan[gid][2], max_rows, *shared) for gid in todo)
    steps = runner.map(gather_group, jobs)  # jobs made as the runner submits them
    for _ in tqdm(steps, total=len(todo), desc="gather groups", unit="group", disable=not progress):
        pass
    return [
        (label, [Piece(str(group_object_path(work_dir, gid)), 0, n)])
        for gid, (label, _, n) in enumerate(plan)
    ]
