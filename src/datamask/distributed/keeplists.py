"""The keep lists of a sharded run, written by steps through the work dir: an all-to-all
from groups to input shards that never passes through the driver.

1. One :func:`file_kept_rows` step per group reads the ids the output keeps in it (its
   part, or its rows of the central round's part) and the id column of its rows, and files
   each kept row under the input shard it came from::

       WORK/keep/shard=SSSSS/part-GGGGG.parquet   row (int64), id: group G's kept rows of
                                                  input shard S

   ``row`` is the row's position in the input shard: known from the piece where the group
   read that shard itself (``shard`` and ``chunk`` partitions), and read from the group's
   object where it was gathered from the cluster spills (:mod:`.gather` carries every
   row's shard and row), so no spill or input shard is read again.
2. One :func:`write_shard_keep_list` step per input shard reads its bucket and writes the
   shard's keep list (:mod:`datamask.io.keep`: the same file, byte for byte, that the
   serial writer made from every selected id).
3. One step digests the selection (:func:`~datamask.io.keep.selection_digest`); the
   driver writes ``_index.json`` from the steps' counts.

The driver sees only paths, group ids and counts. Each step leaves a marker
(``WORK/keep/done/``), so a rerun skips finished ones.
"""

from __future__ import annotations

from collections.abc import Iterator, Sequence
from pathlib import Path
from typing import Any

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
from tqdm.auto import tqdm

from ..io.atomic import atomic_write_json
from ..io.fs import storage_path
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
from .partition import ROW_COLUMN, GroupSpec, Piece

__all__ = [
    "file_kept_rows",
    "keep_bucket_path",
    "keep_round",
    "selection_digest_step",
    "write_shard_keep_list",
]


def keep_bucket_path(work_dir: str | Path, shard: int, gid: int) -> Path:
    """Group ``gid``'s kept rows of input shard ``shard``."""
    return storage_path(work_dir) / "keep" / f"shard={shard:05d}" / f"part-{gid:05d}.parquet"


def _group_marker(work_dir: str | Path, gid: int) -> Path:
    return storage_path(work_dir) / "keep" / "done" / f"part-{gid:05d}.json"


def _shard_marker(work_dir: str | Path, shard: int) -> Path:
    return storage_path(work_dir) / "keep" / "done" / f"shard-{shard:05d}.json"


#: The source of a piece that is a gathered group (:mod:`.gather`), not an input shard.
GATHERED = -1


def _kept_in_piece(
    piece: Piece, shard: int, lookup: IdSet, id_col: str
) -> list[tuple[int, np.ndarray, pa.Array]]:
    """``(input shard, rows there, ids)`` of the kept rows among one piece's rows."""
    columns = [id_col] if shard != GATHERED else [id_col, SHARD_COLUMN, ROW_COLUMN]
    table = read_rows(piece.path, piece.start, piece.stop, columns)
    column = table.column(0).combine_chunks()
    at = lookup.positions(column)
    if not len(at):
        return []
    ids = column.take(pa.array(at))
    if shard != GATHERED:
        return [(shard, at + piece.start, ids)]
    shards = table.column(SHARD_COLUMN).to_numpy()[at]
    rows = table.column(ROW_COLUMN).to_numpy()[at]
    return [
        (int(s), rows[shards == s], ids.filter(pa.array(shards == s))) for s in np.unique(shards)
    ]


def file_kept_rows(
    gid: int,
    pieces: Sequence[Piece],
    sources: Sequence[int],
    id_col: str,
    work_dir: str,
    out_dir: str,
) -> tuple[int, list[list[int]]]:
    """Step 1, one group: file its kept rows by input shard.

    ``sources[i]`` is the input shard ``pieces[i]`` is a row range of, or
    :data:`GATHERED` when the piece is the group's gathered object (each row's shard and
    row are columns of it). Returns ``(gid, [[shard, kept rows], ...])``. Memory: the
    group's kept ids and one piece's ids.
    """
    marker = _group_marker(work_dir, gid)
    done = read_marker(marker)
    if done is not None:
        return gid, done["counts"]
    kept = _kept_ids(out_dir, gid, id_col)
    lookup = IdSet(kept)
    rows: dict[int, list[np.ndarray]] = {}
    ids: dict[int, list[pa.Array]] = {}
    for piece, source in zip(pieces, sources, strict=True):
        for shard, at, found in _kept_in_piece(piece, source, lookup, id_col):
            rows.setdefault(shard, []).append(at)
            ids.setdefault(shard, []).append(found)
    counts = [[s, int(sum(len(r) for r in rows[s]))] for s in sorted(rows)]
    if sum(n for _, n in counts) != len(kept):
        raise RuntimeError(
            f"group {gid}: {len(kept) - sum(n for _, n in counts)} kept ids are not among "
            "its rows; please report this."
        )
    for s, _ in counts:
        table = pa.table(
            {
                "row": pa.array(np.concatenate(rows[s]).astype(np.int64)),
                id_col: pa.concat_arrays(ids[s]),
            }
        )
        atomic_write_table(table, keep_bucket_path(work_dir, s, gid))
    atomic_write_json({"gid": gid, "counts": counts}, marker)
    return gid, counts


def write_shard_keep_list(
    shard: int,
    path: str,
    name: str,
    num_rows: int,
    gids: Sequence[int],
    id_col: str,
    work_dir: str,
    keep_dir: str,
) -> tuple[int, int]:
    """Step 2, one input shard: its keep list from the groups' buckets ``gids``, sorted
    by row (every group filed its rows' places in the shard). Returns ``(shard, kept)``.
    """
    marker = _shard_marker(work_dir, shard)
    done = read_marker(marker)
    if done is not None and (storage_path(keep_dir) / keep_file_name(name)).exists():
        return shard, int(done["kept"])
    tables = [read_table(keep_bucket_path(work_dir, shard, g)) for g in gids]
    if not tables:
        id_type = pq.read_schema(path).field(id_col).type
        rows, ids = np.zeros(0, np.int64), pa.array([], type=id_type)
    else:
        bucket = pa.concat_tables(tables).combine_chunks()
        rows = bucket.column("row").to_numpy()
        ids = bucket.column(id_col).combine_chunks()
        order = np.argsort(rows, kind="stable")
        rows, ids = rows[order], ids.take(pa.array(order))
    write_keep_list(rows, ids, path, num_rows, keep_dir, name, id_col)
    atomic_write_json({"shard": shard, "kept": len(rows)}, marker)
    return shard, len(rows)


def selection_digest_step(out_dir: str, id_col: str) -> tuple[str, int]:
    """Step 3: the selection id (digest of every selected id's hash) and its size, on a
    worker (8 bytes per selected id there, none on the driver)."""
    ids = read_selected_ids(out_dir, id_col)
    return selection_digest(ids), len(ids)


def _bar(results: Iterator[Any], total: int, desc: str, progress: bool) -> Any:
    return tqdm(results, total=total, desc=desc, unit="step", disable=not progress)


def keep_round(
    groups: Sequence[GroupSpec],
    infos: Sequence[ShardInfo],
    id_col: str,
    run: Any,
    runner: Runner,
    progress: bool = False,
) -> dict[str, Any]:
    """The keep lists of a finished sharded run (``OUT/keep/``); returns ``_index.json``.

    Parameters
    ----------
    groups : sequence of GroupSpec
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
    places = str(work), str(out)  # one copy of each, not one a job
    jobs = [(g.gid, g.pieces, [sources[p.path] for p in g.pieces], id_col, *places) for g in groups]
    by_shard: dict[int, list[int]] = {}
    for gid, counts in _bar(runner.map(file_kept_rows, jobs), len(jobs), "keep: file", progress):
        for s, _ in counts:
            by_shard.setdefault(s, []).append(gid)
    keep_dir = keep_dir_for(str(out), folder=True)
    jobs = [
        (s, str(i.path), names[s], i.num_rows, sorted(by_shard.get(s, ())), id_col, str(work))
        + (keep_dir,)
        for s, i in enumerate(infos)
    ]
    kept = dict(_bar(runner.map(write_shard_keep_list, jobs), len(jobs), "keep lists", progress))
    digest, n_selected = next(iter(runner.map(selection_digest_step, [(str(out), id_col)])))
    index = keep_index(id_col, digest, n_selected)
    for s, info in enumerate(infos):
        index["files"][names[s]] = {"num_rows": info.num_rows, "kept": kept[s]}
    return finish_keep_lists(index, keep_dir)
