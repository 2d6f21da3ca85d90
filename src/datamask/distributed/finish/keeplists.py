"""The keep lists of a sharded run, written by steps through the work dir: an all-to-all
from groups to input shards that never passes through the driver.

1. One :class:`FileKeptRows` step per group reads the ids the output keeps in it (its
   part, or its rows of the central round's part) and the id column of its rows, and files
   each kept row under the bucket of input shards it came from (:data:`BUCKET_SHARDS`
   consecutive shards a bucket)::

       WORK/keep/bucket=BBBBB/part-GGGGG.parquet   shard (int32), row (int64), id: group
                                                   G's kept rows of bucket B's shards

   ``row`` is the row's position in the input shard: known from the piece where the group
   read that shard itself (``shard`` and ``chunk`` partitions), and read from the group's
   object where it was gathered from the cluster spills (:mod:`..plan.gather` carries every
   row's shard and row), so no spill or input shard is read again.
2. One :class:`BucketKeepLists` step per bucket lists its folder once, reads every
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
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import pyarrow as pa

from ...io.fs import names_in, storage_path
from ...io.keep import (
    IdSet,
    finish_keep_lists,
    input_names,
    keep_file_name,
    keep_index,
    read_selected_ids,
    selection_digest,
    write_keep_list,
)
from ...io.parquet import atomic_write_table, open_parquet, read_table
from ...io.shards import ShardInfo, read_rows
from ..context import RunContext
from ..engine import Step, run_steps
from ..executors import Runner
from ..paths import WorkDir
from ..plan.gather import SHARD_COLUMN
from ..plan.partition import ROW_COLUMN, Group, Piece
from .cover import _kept_ids

__all__ = [
    "BUCKET_SHARDS",
    "BucketKeepLists",
    "FileKeptRows",
    "keep_round",
    "SelectionDigest",
]

#: Consecutive input shards per keep bucket: one object per (group, bucket) it has kept
#: rows in, one keep step per bucket.
BUCKET_SHARDS = 256

#: A group's part of a bucket (temporaries of killed steps do not match).
_PART = re.compile(r"part-(\d{5})\.parquet")


#: The source of a piece that is a gathered group (:mod:`..plan.gather`), not an input shard.
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


@dataclass(frozen=True, slots=True)
class FileJob:
    """One group's kept rows to file: its pieces and, for each, the input shard it is a
    row range of (or :data:`GATHERED`: each row's shard and row are columns of it)."""

    gid: int
    pieces: tuple[Piece, ...]
    sources: tuple[int, ...]
    id_col: str
    dirs: WorkDir
    bucket_shards: int


class FileKeptRows(Step[FileJob]):
    """Step 1, one group: file its kept rows by bucket of input shards. Stats: ``gid``,
    ``kept`` and ``buckets``. Memory: the group's kept ids and one piece's ids."""

    name = "keep: file"

    def marker(self, job: FileJob) -> Path:
        return job.dirs.keep_group_marker(job.gid)

    def size(self, job: FileJob) -> int:
        return sum(p.stop - p.start for p in job.pieces)

    def run(self, job: FileJob) -> dict[str, Any]:
        gid, id_col, dirs = job.gid, job.id_col, job.dirs
        kept = _kept_ids(dirs, gid, id_col)
        lookup = IdSet(kept)
        found = [
            got
            for piece, source in zip(job.pieces, job.sources, strict=True)
            if (got := _kept_in_piece(piece, source, lookup, id_col)) is not None
        ]
        n_found = sum(len(f[0]) for f in found)
        if n_found != len(kept):
            raise RuntimeError(
                f"group {gid}: {len(kept) - n_found} kept ids are not among its rows; "
                "please report this."
            )
        buckets: list[int] = []
        if found:
            shards = np.concatenate([f[0] for f in found])
            rows = np.concatenate([f[1] for f in found]).astype(np.int64)
            ids = pa.concat_arrays([f[2] for f in found])
            order = np.lexsort((rows, shards))  # by shard, then row
            shards, rows, ids = shards[order], rows[order], ids.take(pa.array(order))
            of = shards // job.bucket_shards
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
                atomic_write_table(table, dirs.keep_bucket(bucket, gid))
                buckets.append(bucket)
        return {"gid": gid, "kept": n_found, "buckets": buckets}


@dataclass(frozen=True, slots=True)
class BucketJob:
    """One bucket of input shards (``(shard, path, name, rows)`` each) to write the keep
    lists of, from every group's part in the bucket's folder."""

    bucket: int
    shards: tuple[tuple[int, str, str, int], ...]
    id_col: str
    dirs: WorkDir


class BucketKeepLists(Step[BucketJob]):
    """Step 2, one bucket: the keep list of each of its shards from every group's part in
    the bucket's folder (one listing), sorted by row. Stats: ``kept``, ``[(shard, kept)]``."""

    name = "keep lists"
    unit = "bucket"

    def marker(self, job: BucketJob) -> Path:
        return job.dirs.keep_bucket_marker(job.bucket)

    def outputs(self, job: BucketJob) -> tuple[Path, ...]:
        keep = storage_path(job.dirs.keep_lists())
        return tuple(keep / keep_file_name(name) for _, _, name, _ in job.shards)

    def size(self, job: BucketJob) -> int:
        return sum(rows for *_, rows in job.shards)

    def run(self, job: BucketJob) -> dict[str, Any]:
        folder = job.dirs.keep_buckets(job.bucket)
        parts = sorted(n for n in names_in(folder) if _PART.fullmatch(n))
        tables = [read_table(folder / n) for n in parts]
        id_col = job.id_col
        if tables:
            table = pa.concat_tables(tables).combine_chunks()
            of, rows = table.column("shard").to_numpy(), table.column("row").to_numpy()
            ids = table.column(id_col).combine_chunks()
            order = np.lexsort((rows, of))  # by shard, then row (each row is in one group)
            of, rows, ids = of[order], rows[order], ids.take(pa.array(order))
        else:  # no group kept a row of these shards: the id type from the first's schema
            of, rows = np.zeros(0, np.int32), np.zeros(0, np.int64)
            first = open_parquet(job.shards[0][1], "input shard")  # local or remote
            ids = pa.array([], type=first.schema_arrow.field(id_col).type)
        counts, keep_dir = [], job.dirs.keep_lists()
        for s, path, name, num_rows in job.shards:
            lo, hi = np.searchsorted(of, s, "left"), np.searchsorted(of, s, "right")
            kept_ids = ids.slice(lo, hi - lo)
            write_keep_list(rows[lo:hi], kept_ids, path, num_rows, keep_dir, name, id_col)
            counts.append((s, int(hi - lo)))
        return {"bucket": job.bucket, "kept": counts}


@dataclass(frozen=True, slots=True)
class DigestJob:
    dirs: WorkDir
    id_col: str


class SelectionDigest(Step[DigestJob]):
    """Step 3: the selection id (digest of every selected id's hash) and its size, on a
    worker (8 bytes per selected id there, none on the driver)."""

    name = "keep: digest"
    unit = "step"

    def run(self, job: DigestJob) -> tuple[str, int]:
        ids = read_selected_ids(job.dirs.out, job.id_col)
        return selection_digest(ids), len(ids)


def keep_round(
    groups: Sequence[Group],
    infos: Sequence[ShardInfo],
    id_col: str,
    run: RunContext,
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
    run : RunContext
        Its ``source`` (names are relative to it) and its places (``dirs``).
    runner : Runner
        Where the steps run.
    """
    dirs, per = run.dirs, BUCKET_SHARDS
    names = input_names(run.source, [i.path for i in infos])
    sources = {str(info.path): s for s, info in enumerate(infos)}
    sources.update({str(dirs.group_object(g.gid)): GATHERED for g in groups})
    jobs = [
        FileJob(g.gid, tuple(g.pieces), tuple(sources[p.path] for p in g.pieces), id_col, dirs, per)
        for g in groups
    ]
    run_steps(runner, FileKeptRows(), jobs, progress=progress, keep=lambda _: None)
    shards = [(s, str(i.path), names[s], i.num_rows) for s, i in enumerate(infos)]
    buckets = [
        BucketJob(b // BUCKET_SHARDS, tuple(shards[b : b + BUCKET_SHARDS]), id_col, dirs)
        for b in range(0, len(shards), BUCKET_SHARDS)
    ]
    kept: dict[int, int] = {}
    for done in run_steps(runner, BucketKeepLists(), buckets, progress=progress):
        kept.update((int(s), int(n)) for s, n in done["kept"])
    ((digest, n_selected),) = run_steps(
        runner, SelectionDigest(), [DigestJob(dirs, id_col)], progress=False
    )
    index = keep_index(id_col, digest, n_selected)
    for s, info in enumerate(infos):
        index["files"][names[s]] = {"num_rows": info.num_rows, "kept": kept[s]}
    return finish_keep_lists(index, dirs.keep_lists())
