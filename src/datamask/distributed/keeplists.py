"""The keep lists of a sharded run, written by steps through the work dir: an all-to-all
from groups to input shards that never passes through the driver.

1. One :func:`file_kept_rows` step per group reads the ids the output keeps in it (its
   part, or its rows of the central round's part) and the id column of its rows, and files
   each kept row under the bucket of input shards it came from (:data:`BUCKET_SHARDS`
   consecutive shards a bucket)::

       WORK/keep/bucket=BBBBB/part-GGGGG.parquet   shard (int32), row (int64), id: group
                                                   G's kept rows of bucket B's shards

   ``row`` is the row's position in the input shard: known from the piece where the group
   read that shard itself (``shard`` and ``chunk`` partitions), and read from the group's
   object where it was gathered from the cluster spills (:mod:`.gather` carries every
   row's shard and row), so no spill or input shard is read again.
2. One :func:`write_bucket_keep_lists` step per bucket lists its folder once, reads every
   group's part there and writes the keep list of each of its shards (:mod:`datamask.io.keep`:
   the same file, byte for byte, that the serial writer made from every selected id).
3. One step digests the selection (:func:`~datamask.io.keep.selection_digest`); the
   driver writes ``_index.json`` from the steps' counts.

A group writes at most ``ceil(S / BUCKET_SHARDS)`` objects, not one per input shard it
touches (up to S: a k-means cluster spans every shard), and the driver gets back one count
per group and per shard: never the (group, shard) pairs. Each step leaves a marker
(``WORK/keep/done/``), so a rerun skips finished ones.
"""

from __future__ import annotations

import re
from collections.abc import Iterator, Sequence
from pathlib import Path
from typing import Any

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
from tqdm.auto import tqdm

from ..io.atomic import atomic_write_json
from ..io.fs import names_in, storage_path
from ..io.keep import (
    IdSet,
    finish_keep_lists,
    input_names,
    keep_dir_for,
    keep_file_name,
    keep_index,
    read_selected_ids,
    selection_digest,
    write_keep_list,
)
from ..io.parquet import atomic_write_table, read_table
from ..io.shards import ShardInfo, read_rows
from .cover import _kept_ids
from .executors import Runner
from .gather import SHARD_COLUMN, group_object_path
from .lifecycle import read_marker
from .partition import ROW_COLUMN, Group, Piece

__all__ = [
    "BUCKET_SHARDS",
    "file_kept_rows",
    "keep_bucket_path",
    "keep_round",
    "selection_digest_step",
    "write_bucket_keep_lists",
]

#: Consecutive input shards per keep bucket: one object per (group, bucket) it has kept
#: rows in, one keep step per bucket.
BUCKET_SHARDS = 256

#: A group's part of a bucket (temporaries of killed steps do not match).
_PART = re.compile(r"part-(\d{5})\.parquet")


def keep_bucket_path(work_dir: str | Path, bucket: int, gid: int) -> Path:
    """Group ``gid``'s kept rows of the input shards of bucket ``bucket``."""
    return storage_path(work_dir) / "keep" / f"bucket={bucket:05d}" / f"part-{gid:05d}.parquet"


def _group_marker(work_dir: str | Path, gid: int) -> Path:
    return storage_path(work_dir) / "keep" / "done" / f"part-{gid:05d}.json"


def _bucket_marker(work_dir: str | Path, bucket: int) -> Path:
    return storage_path(work_dir) / "keep" / "done" / f"bucket-{bucket:05d}.json"


#: The source of a piece that is a gathered group (:mod:`.gather`), not an input shard.
GATHERED = -1


def _kept_in_piece(
    piece: Piece, shard: int, lookup: IdSet, id_col: str
) -> tuple[np.ndarray, np.ndarray, pa.Array] | None:
    """``(input shards, rows there, ids)`` of the kept rows among one piece's rows."""
    columns = [id_col] if shard != GATHERED else [id_col, SHARD_COLUMN, ROW_COLUMN]
    table = read_rows(piece.path, piece.start, piece.stop, columns)
    column = table.column(0).combine_chunks()
    at = lookup.positions(column)
    if not len(at):
        return None
    ids = column.take(pa.array(at))
    if shard != GATHERED:
        return np.full(len(at), shard, dtype=np.int32), at + piece.start, ids
    shards = table.column(SHARD_COLUMN).to_numpy()[at].astype(np.int32)
    return shards, table.column(ROW_COLUMN).to_numpy()[at], ids


def file_kept_rows(
    gid: int,
    pieces: Sequence[Piece],
    sources: Sequence[int],
    id_col: str,
    work_dir: str,
    out_dir: str,
    bucket_shards: int = BUCKET_SHARDS,
) -> tuple[int, int]:
    """Step 1, one group: file its kept rows by bucket of input shards.

    ``sources[i]`` is the input shard ``pieces[i]`` is a row range of, or
    :data:`GATHERED` when the piece is the group's gathered object (each row's shard and
    row are columns of it). Returns ``(gid, kept rows)``. Memory: the group's kept ids
    and one piece's ids.
    """
    marker = _group_marker(work_dir, gid)
    done = read_marker(marker)
    if done is not None:
        return gid, int(done["kept"])
    kept = _kept_ids(out_dir, gid, id_col)
    lookup = IdSet(kept)
    found = [
        got
        for piece, source in zip(pieces, sources, strict=True)
        if (got := _kept_in_piece(piece, source, lookup, id_col)) is not None
    ]
    n_found = sum(len(f[0]) for f in found)
    if n_found != len(kept):
        raise RuntimeError(
            f"group {gid}: {len(kept) - n_found} kept ids are not among its rows; please "
            "report this."
        )
    buckets: list[int] = []
    if found:
        shards = np.concatenate([f[0] for f in found])
        rows = np.concatenate([f[1] for f in found]).astype(np.int64)
        ids = pa.concat_arrays([f[2] for f in found])
        order = np.lexsort((rows, shards))  # by shard, then row
        shards, rows, ids = shards[order], rows[order], ids.take(pa.array(order))
        of = shards // bucket_shards
        cuts = np.flatnonzero(np.diff(of)) + 1
        for lo, hi in zip([0, *cuts], [*cuts, len(of)], strict=True):
            bucket = int(of[lo])
            table = pa.table(
                {
                    "shard": pa.array(shards[lo:hi]),
                    "row": pa.array(rows[lo:hi]),
                    id_col: ids.slice(lo, hi - lo),
                }
            )
            atomic_write_table(table, keep_bucket_path(work_dir, bucket, gid))
            buckets.append(bucket)
    atomic_write_json({"gid": gid, "kept": n_found, "buckets": buckets}, marker)
    return gid, n_found


def write_bucket_keep_lists(
    bucket: int,
    shards: Sequence[tuple[int, str, str, int]],
    id_col: str,
    work_dir: str,
    keep_dir: str,
) -> list[tuple[int, int]]:
    """Step 2, one bucket: the keep list of each of its ``shards`` (``(shard, path, name,
    rows)``) from every group's part in the bucket's folder (one listing), sorted by row.
    Returns ``[(shard, kept), ...]``."""
    marker = _bucket_marker(work_dir, bucket)
    done = read_marker(marker)
    keep = storage_path(keep_dir)
    if done is not None and all((keep / keep_file_name(name)).exists() for _, _, name, _ in shards):
        return [(int(s), int(n)) for s, n in done["kept"]]
    folder = keep_bucket_path(work_dir, bucket, 0).parent
    parts = sorted(n for n in names_in(folder) if _PART.fullmatch(n))
    tables = [read_table(folder / n) for n in parts]
    if tables:
        table = pa.concat_tables(tables).combine_chunks()
        of, rows = table.column("shard").to_numpy(), table.column("row").to_numpy()
        ids = table.column(id_col).combine_chunks()
        order = np.lexsort((rows, of))  # by shard, then row (each row is in one group)
        of, rows, ids = of[order], rows[order], ids.take(pa.array(order))
    else:  # no group kept a row of these shards: the id type from the first one's schema
        of, rows = np.zeros(0, np.int32), np.zeros(0, np.int64)
        ids = pa.array([], type=pq.read_schema(shards[0][1]).field(id_col).type)
    counts = []
    for s, path, name, num_rows in shards:
        lo, hi = np.searchsorted(of, s, "left"), np.searchsorted(of, s, "right")
        write_keep_list(rows[lo:hi], ids.slice(lo, hi - lo), path, num_rows, keep_dir, name, id_col)
        counts.append((s, int(hi - lo)))
    atomic_write_json({"bucket": bucket, "kept": counts}, marker)
    return counts


def selection_digest_step(out_dir: str, id_col: str) -> tuple[str, int]:
    """Step 3: the selection id (digest of every selected id's hash) and its size, on a
    worker (8 bytes per selected id there, none on the driver)."""
    ids = read_selected_ids(out_dir, id_col)
    return selection_digest(ids), len(ids)


def _bar(results: Iterator[Any], total: int, desc: str, progress: bool) -> Any:
    return tqdm(results, total=total, desc=desc, unit="step", disable=not progress)


def keep_round(
    groups: Sequence[Group],
    infos: Sequence[ShardInfo],
    id_col: str,
    run: Any,
    runner: Runner,
    progress: bool = False,
) -> dict[str, Any]:
    """The keep lists of a finished sharded run (``OUT/keep/``); returns ``_index.json``.

    Parameters
    ----------
    groups : sequence of Group
        The run's groups, their final parts written.
    infos : sequence of ShardInfo
        The input shards, in the run's order.
    id_col : str
        The id column.
    run : the runner's run
        Its ``source`` (names are relative to it), ``work`` and ``out`` folders.
    runner : Runner
        Where the steps run.
    """
    work, out = storage_path(run.work), storage_path(run.out)
    names = input_names(run.source, [i.path for i in infos])
    sources = {str(info.path): s for s, info in enumerate(infos)}
    sources.update({str(group_object_path(work, g.gid)): GATHERED for g in groups})
    places = str(work), str(out), BUCKET_SHARDS  # one copy of each, not one a job
    jobs = [(g.gid, g.pieces, [sources[p.path] for p in g.pieces], id_col, *places) for g in groups]
    for _ in _bar(runner.map(file_kept_rows, jobs), len(jobs), "keep: file", progress):
        pass  # each group's rows are in its buckets; its count in its marker
    keep_dir = keep_dir_for(str(out), folder=True)
    shards = [(s, str(i.path), names[s], i.num_rows) for s, i in enumerate(infos)]
    jobs = [
        (b // BUCKET_SHARDS, shards[b : b + BUCKET_SHARDS], id_col, str(work), keep_dir)
        for b in range(0, len(shards), BUCKET_SHARDS)
    ]
    kept: dict[int, int] = {}
    for counts in _bar(
        runner.map(write_bucket_keep_lists, jobs), len(jobs), "keep lists", progress
    ):
        kept.update(counts)
    digest, n_selected = next(iter(runner.map(selection_digest_step, [(str(out), id_col)])))
    index = keep_index(id_col, digest, n_selected)
    for s, info in enumerate(infos):
        index["files"][names[s]] = {"num_rows": info.num_rows, "kept": kept[s]}
    return finish_keep_lists(index, keep_dir)
