"""Rows to groups through storage: steps write each cluster group as ONE object.

After the spill (:func:`~.partition.spill_shard`: every shard's rows sorted by leaf, and
its per-leaf counts), one :func:`index_spills` step turns the S counts files into one
leaf-major table of offsets and gives the driver the leaves' totals. The driver holds
only those and the plan (:func:`~.partition.plan_by_cluster`: each group's
:data:`~.partition.Unit` s). One :func:`gather_bucket` step per bucket of groups
(:func:`gather_buckets`: up to :data:`GATHER_BUCKET_GROUPS` groups, at most a worker's
share of the rows; each spill opened once a bucket, not once a group) then, for each of
its groups,

1. reads the offsets of its leaves in every spill (ranged reads of the table) and from
   them computes the group's row ranges of every spill (a leaf cut in parts: the same
   :func:`~.partition.split_across` as ever), so the driver never holds a piece per
   (shard, cluster);
2. reads those rows, in the order the plan always gave them (by spill, then by row), and
   writes them as one object with, for each row, its input shard and its row there::

       WORK/clusters/groups/group-GGGGG.parquet   the run's columns + __datamask_shard,
                                                  __datamask_row
       WORK/clusters/groups/group-GGGGG.json      marker: rows, pieces read, spills
                                                  it has rows in, its bucket, the
                                                  spills the bucket opened, seconds

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
from contextlib import ExitStack
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq

from ..._memory import peak_rss_mb
from ...io.atomic import atomic_write, atomic_write_json
from ...io.dictionary import dictionary_columns
from ...io.fs import names_in, open_input
from ...io.parquet import WORK_COMPRESSION
from ...io.shards import iter_files, read_ranges
from ..engine import Step, run_steps
from ..executors import GROUP_MEMORY_BASE, Runner
from ..paths import WorkDir
from .partition import ROW_COLUMN, Piece, Unit, coalesce, split_across

__all__ = [
    "SHARD_COLUMN",
    "gather_bucket",
    "gather_buckets",
    "gather_groups",
    "gather_summary",
    "IndexJob",
    "IndexSpills",
    "ReleaseJob",
    "ReleaseSpills",
    "GatherBucket",
    "GatherJob",
    "index_spills",
    "release_spills",
    "ungathered",
    "unit_pieces",
]

#: The input shard of each row of a gathered group (its row there is ``ROW_COLUMN``).
SHARD_COLUMN = "__datamask_shard"


def _spilled_shards(dirs: WorkDir) -> list[int]:
    """Shards with a finished spill (their counts file), in shard order: one listing."""
    shards = (WorkDir.spilled_shard(name) for name in names_in(dirs.clusters()))
    return sorted(shard for shard in shards if shard is not None)


#: int64 values an index step holds at once (32 MB), whatever the spills x leaves: the
#: offsets table is built in panels of spills and written in blocks of leaves.
INDEX_BLOCK_VALUES = 1 << 22


@dataclass(frozen=True, slots=True)
class IndexJob:
    dirs: WorkDir
    n_leaves: int
    block_values: int = INDEX_BLOCK_VALUES


class IndexSpills(Step[IndexJob]):
    """:func:`index_spills` as a step; its marker ``clusters/offsets.json`` (the spilled
    shards in order, and each leaf's total rows: all the driver reads of the counts)."""

    name = "index spills"
    unit = "step"

    def marker(self, job: IndexJob) -> Path:
        return job.dirs.spill_index("json")

    def outputs(self, job: IndexJob) -> tuple[Path, ...]:
        return (job.dirs.spill_index("bin"), job.dirs.spill_index("spills.json"))

    def run(self, job: IndexJob) -> dict[str, Any]:
        return index_spills(job.dirs, job.n_leaves, job.block_values)


@dataclass(frozen=True, slots=True)
class ReleaseJob:
    dirs: WorkDir
    shards: tuple[int, ...]


class ReleaseSpills(Step[ReleaseJob]):
    """Delete the spills of ``shards`` once every group is gathered (:func:`release_spills`)."""

    name = "release spills"
    unit = "batch"

    def run(self, job: ReleaseJob) -> None:
        release_spills(job.dirs, job.shards)


def index_spills(
    dirs: WorkDir, n_leaves: int, block_values: int = INDEX_BLOCK_VALUES
) -> dict[str, Any]:
    """One step after the spill: every spilled shard's per-leaf counts as one leaf-major
    table of offsets, so a gather step reads the few rows it needs, not S counts files.

    Writes ``clusters/offsets.bin`` (int64, ``(leaves + 1) x spills``: row ``l`` is where
    leaf ``l`` starts in each spill, row ``leaves`` each spill's rows),
    ``clusters/offsets.spills.json`` (the spilled shards: what a gather step reads besides
    its rows of the table). Returns what :class:`IndexSpills` records as its marker: the
    spilled shards in order, and each leaf's total rows.

    Memory: two blocks of ``block_values`` int64 values and the leaves' totals, not the table (``8 x
    spills x leaves`` bytes: 80 GB at 10^5 x 10^5). Each counts file is read once; panels
    of as many spills as fit in a block are written leaf-major to this process's own
    temporary folder, then read back a block of leaves at a time (ranged reads, one per
    panel) and appended to the table.
    """
    shards = _spilled_shards(dirs)
    per_leaf = np.zeros(n_leaves, dtype=np.int64)
    with (
        tempfile.TemporaryDirectory(prefix="datamask-offsets-") as tmp,
        atomic_write(dirs.spill_index("bin")) as table,
    ):
        width = max(1, block_values // (n_leaves + 1))  # spills per panel
        panels = [
            _write_panel(dirs, shards[i : i + width], n_leaves, Path(tmp), per_leaf)
            for i in range(0, len(shards), width)
        ]
        _append_leaf_blocks(panels, n_leaves + 1, len(shards), block_values, table)
    # what the gathers read
    atomic_write_json({"shards": shards}, dirs.spill_index("spills.json"))
    return {"shards": shards, "leaves": n_leaves, "per_leaf": per_leaf.tolist()}


def _write_panel(
    dirs: WorkDir, shards: Sequence[int], n_leaves: int, tmp: Path, per_leaf: np.ndarray
) -> tuple[Path, int]:
    """The offsets of ``shards``' spills, leaf-major ``(leaves + 1) x len(shards)``, as a
    local file; adds their counts to ``per_leaf``. Returns the file and its width."""
    panel = np.zeros((n_leaves + 1, len(shards)), dtype=np.int64)
    for i, s in enumerate(shards):
        counts = np.asarray(json.loads(dirs.spill_marker(s).read_text())["counts"], dtype=np.int64)
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


def _offset_rows(dirs: WorkDir, leaves: Sequence[int], n_spills: int) -> np.ndarray:
    """Rows ``leaves`` of ``offsets.bin``, shape (spills, len(leaves)): ranged reads."""
    out = np.empty((len(leaves), n_spills), dtype=np.int64)
    with open_input(dirs.spill_index("bin")) as fh:
        for i, leaf in enumerate(leaves):
            fh.seek(8 * leaf * n_spills)
            out[i] = np.frombuffer(fh.read(8 * n_spills), dtype=np.int64)
    return out.T


def unit_pieces(
    dirs: WorkDir, units: Sequence[Unit], max_rows: int
) -> tuple[list[Piece], dict[str, int]]:
    """The spill row ranges of one group, from the offsets :func:`index_spills` wrote.

    Returns the pieces in the group's row order (:func:`~.partition.coalesce`: by spill,
    then by row) and each spill's shard. Reads the spilled shards' list (O(S)) and one
    row of ``offsets.bin`` per cut (``8 x S`` bytes, a ranged read), never the whole
    table. Memory: two offsets per unit per spill.
    """
    # The spilled shards: O(S), not the marker's O(S + C) (the leaves' totals are the
    # driver's); a work dir indexed before this file existed has them in the marker.
    listed = dirs.spill_index("spills.json")
    if not listed.exists():
        listed = dirs.spill_index("json")
    shards = json.loads(listed.read_text())["shards"]
    cuts = sorted({u[0] for u in units} | {u[1] + 1 for u in units})
    at = {leaf: i for i, leaf in enumerate(cuts)}
    offsets = _offset_rows(dirs, cuts, len(shards))
    paths = [str(dirs.spill(s)) for s in shards]
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


#: Groups one gather step writes at most: a step opens each spill once for all of them,
#: so the gather opens S x G / GATHER_BUCKET_GROUPS spills, not S x G (121,000 at 10M,
#: 345 s of the plan phase; 1.3 x 10^10 at 10^10 documents, docs/scale.md). Memory does not
#: grow with it: the rows stream through (:data:`GATHER_BUFFER_BYTES`).
GATHER_BUCKET_GROUPS = 64

#: Bytes of rows a gather step holds before it writes them out, as one row group of each
#: of its groups' objects (or fewer: never more rows than its largest group).
GATHER_BUFFER_BYTES = 256 * 2**20


def gather_buckets(sizes: Sequence[int], todo: Sequence[int], workers: int) -> list[list[int]]:
    """The groups ``todo`` (of ``sizes`` rows each, by gid) in buckets of consecutive
    groups, one gather step each: at most :data:`GATHER_BUCKET_GROUPS` groups and at most
    a ``workers``-th of the rows (so the workers share them; a group above it alone).

    >>> gather_buckets([10, 10, 10, 10], [0, 1, 2, 3], workers=2)
    [[0, 1], [2, 3]]
    >>> gather_buckets([10, 10, 10, 10], [1, 3], workers=1)
    [[1, 3]]
    """
    cap = sum(sizes[g] for g in todo) / max(1, workers)
    buckets: list[list[int]] = []
    held = 0
    for gid in todo:
        if buckets and len(buckets[-1]) < GATHER_BUCKET_GROUPS and held + sizes[gid] <= cap:
            buckets[-1].append(gid)
            held += sizes[gid]
        else:
            buckets.append([gid])
            held = sizes[gid]
    return buckets


def _unified_schema(spills: Sequence[str], columns: Sequence[str]) -> pa.Schema:
    """The schema of a bucket's objects: ``columns`` as every spill stores them, promoted
    as ``concat_tables(promote_options="permissive")`` would (shards may store a quality
    column as float32 in one and float64 in another), and the shard column."""

    def schema(path: str) -> pa.Schema:
        with open_input(path) as fh:
            return pq.read_schema(fh)

    unified = pa.unify_schemas(list(iter_files(schema, spills)), promote_options="permissive")
    fields = [unified.field(c) for c in columns]
    return pa.schema([*fields, pa.field(SHARD_COLUMN, pa.int32())])


def gather_bucket(
    groups: Sequence[tuple[int, Sequence[Unit], int]],
    max_rows: int,
    columns: Sequence[str],
    dirs: WorkDir,
) -> list[tuple[int, int]]:
    """Write each of a bucket's cluster groups, ``(gid, units, rows)``, as one object
    (:meth:`~..paths.WorkDir.group_object`); a pure, resumable step.

    Every spill is opened once for the whole bucket (one footer read, then each group's
    ranges in it), so a bucket of B groups costs S opens, not B x S (plus one schema read
    a spill). The rows stream through: every :data:`GATHER_BUFFER_BYTES`, or as many rows
    as its largest group has, they are written as a row group of each group's object, so
    memory does not grow with B: it is what gathering that largest group alone took.
    (On object storage each object is written to the worker's ``$TMPDIR`` first: the
    bucket's rows, not one group's, on its local disk until they are uploaded.) A group's
    rows come in the order the plan always gave them (by spill, then by row), whatever
    its bucket. The objects are published once all are written, then their markers.
    Returns ``(gid, rows)`` per group. Which groups are done is the driver's to say
    (:func:`gather_groups`: one listing of the markers): a group's marker, not its
    bucket's, is the unit of resume, as buckets are made of the groups still to gather.
    """
    started = time.perf_counter()
    todo = [(gid, n, *unit_pieces(dirs, units, max_rows)) for gid, units, n in groups]
    if not todo:
        return []
    by_spill: dict[str, list[tuple[int, Piece]]] = {}
    for i, (_, _, pieces, _) in enumerate(todo):
        for piece in pieces:
            by_spill.setdefault(piece.path, []).append((i, piece))
    spills = sorted(by_spill)  # a group's pieces are in (spill, row) order already
    if not spills:
        raise RuntimeError(
            f"groups {[g for g, *_ in todo]} have no rows in any spill; were the spills "
            "rewritten during the run?"
        )
    read_columns = [*columns, ROW_COLUMN]
    with ExitStack() as objects:
        tmps = [objects.enter_context(atomic_write(dirs.group_object(gid))) for gid, *_ in todo]
        written = _stream_rows(todo, by_spill, _unified_schema(spills, read_columns), tmps)
        for (gid, n_rows, *_), rows in zip(todo, written, strict=True):
            if rows != n_rows:  # raised inside: no object of the bucket is published
                raise RuntimeError(
                    f"group {gid} gathers {rows} rows from the spills, not the {n_rows} "
                    "planned; were the spills rewritten during the run?"
                )
    bucket = {  # the same in every marker of the bucket
        "bucket": [g for g, *_ in todo],
        "bucket_spills_opened": len(spills),
        "bucket_seconds": time.perf_counter() - started,
        "peak_rss_mb": peak_rss_mb(),
    }
    for gid, n_rows, pieces, _ in todo:
        stats = {
            "gid": gid,
            "n": n_rows,
            "pieces": len(pieces),
            "spills_read": len({p.path for p in pieces}),
            **bucket,
        }
        atomic_write_json(stats, dirs.group_object_marker(gid))
    return [(gid, n_rows) for gid, n_rows, *_ in todo]


def _stream_rows(
    todo: Sequence[tuple[int, int, list[Piece], dict[str, int]]],
    by_spill: dict[str, list[tuple[int, Piece]]],
    schema: pa.Schema,
    tmps: Sequence[Path],
) -> list[int]:
    """Read every spill once (its ranges of every group in ``todo``) and append each
    group's rows to its object ``tmps[i]``, flushing every :data:`GATHER_BUFFER_BYTES` or
    as many rows as the largest group has. Returns the rows written per group."""
    written = [0] * len(todo)
    read_columns = [c for c in schema.names if c != SHARD_COLUMN]
    spills = sorted(by_spill)

    def ranges(path: str) -> list[pa.Table]:
        return read_ranges(path, [(p.start, p.stop) for _, p in by_spill[path]], read_columns)

    with ExitStack() as open_writers:
        writers = [
            open_writers.enter_context(
                pq.ParquetWriter(
                    tmp,
                    schema,
                    compression=WORK_COMPRESSION,
                    write_page_checksum=True,
                    use_dictionary=dictionary_columns(schema),
                )
            )
            for tmp in tmps
        ]
        buffered: list[list[pa.Table]] = [[] for _ in todo]
        held = held_rows = 0
        # never more rows than the bucket's largest group: memory stays what a step
        # gathering that group alone took, whatever the bucket's size
        most_rows = max(n for _, n, *_ in todo)

        def flush() -> None:
            for i, tables in enumerate(buffered):
                if tables:
                    writers[i].write_table(pa.concat_tables(tables).combine_chunks())
                    written[i] += sum(t.num_rows for t in tables)
                    tables.clear()

        # on object storage several spills in flight (each read is round trips)
        for path, tables in zip(spills, iter_files(ranges, spills), strict=True):
            for (i, piece), table in zip(by_spill[path], tables, strict=True):
                shard = pa.array(np.full(table.num_rows, todo[i][3][piece.path], np.int32))
                table = table.append_column(SHARD_COLUMN, shard).cast(schema)
                buffered[i].append(table)
                held += table.nbytes
                held_rows += table.num_rows
            if held >= GATHER_BUFFER_BYTES or held_rows >= most_rows:
                flush()
                held = held_rows = 0
        flush()
    return written


def gather_summary(dirs: WorkDir) -> dict[str, float]:
    """What a run's gather did, from its markers: ``steps`` (buckets; a marker written
    before buckets is a step of its own), ``seconds`` and ``spills_opened`` (summed over
    the steps; a bucket's markers all carry its own) and ``spills_read_mean`` (spills a
    group has rows in, mean over the groups)."""
    folder = dirs.group_objects()
    markers = [
        json.loads((folder / n).read_text())
        for n in sorted(names_in(folder))
        if n.startswith("group-") and n.endswith(".json")
    ]
    steps: dict[tuple[int, ...], tuple[float, int]] = {}
    for m in markers:
        if "bucket" in m:
            steps[tuple(m["bucket"])] = m["bucket_seconds"], m["bucket_spills_opened"]
        else:
            steps[(m["gid"],)] = m["seconds"], m["spills_read"]
    return {
        "steps": len(steps),
        "seconds": sum(secs for secs, _ in steps.values()),
        "spills_opened": sum(opened for _, opened in steps.values()),
        "spills_read_mean": float(np.mean([m["spills_read"] for m in markers])) if markers else 0.0,
    }


def ungathered(n_groups: int, dirs: WorkDir) -> list[int]:
    """The groups of the ``n_groups`` that have no marker yet (one listing)."""
    done = names_in(dirs.group_objects())
    return [gid for gid in range(n_groups) if dirs.group_object_marker(gid).name not in done]


def release_spills(dirs: WorkDir, shards: Sequence[int]) -> None:
    """Delete the spills of ``shards`` once every group is gathered: nothing reads them
    again, and they hold a second copy of every row. Their ``.json`` counts stay; with
    :meth:`~..paths.WorkDir.spills_released` written after these steps, a resumed run
    reuses the spill and gather steps. Idempotent: a missing spill is fine."""
    for s in shards:
        dirs.spill(s).unlink(missing_ok=True)


@dataclass(frozen=True, slots=True)
class GatherJob:
    """A bucket of consecutive cluster groups ``(gid, units, rows)`` to gather."""

    groups: tuple[tuple[int, tuple[Unit, ...], int], ...]
    max_rows: int
    columns: tuple[str, ...]
    dirs: WorkDir


class GatherBucket(Step[GatherJob]):
    """:func:`gather_bucket` as a step: no marker of its own (its groups' markers are
    written by the step, and :func:`gather_groups` lists them to make the buckets)."""

    name = "gather groups"
    unit = "bucket"

    def size(self, job: GatherJob) -> int:
        return sum(n for *_, n in job.groups)

    def memory(self, job: GatherJob) -> int:
        # Ray's memory=: the buffer, its concatenation, the reads in flight
        return GROUP_MEMORY_BASE + 3 * GATHER_BUFFER_BYTES

    def run(self, job: GatherJob) -> list[tuple[int, int]]:
        return gather_bucket(job.groups, job.max_rows, job.columns, job.dirs)


def gather_groups(
    plan: Sequence[tuple[str, list[Unit], int]],
    max_rows: int,
    columns: Sequence[str],
    dirs: WorkDir,
    runner: Runner,
    progress: bool = False,
) -> tuple[list[tuple[str, list[Piece]]], int]:
    """Run :func:`gather_bucket` for every planned group without a marker (one listing),
    in buckets (:func:`gather_buckets`). Returns the plan as the group steps read it (one
    piece, the group's object) and the gather steps run."""
    todo = ungathered(len(plan), dirs)
    buckets = gather_buckets([n for *_, n in plan], todo, runner.workers)
    jobs = [
        GatherJob(
            tuple((g, tuple(plan[g][1]), plan[g][2]) for g in b), max_rows, tuple(columns), dirs
        )
        for b in buckets
    ]
    run_steps(runner, GatherBucket(), jobs, progress=progress)
    read_plan = [
        (label, [Piece(str(dirs.group_object(gid)), 0, n)])
        for gid, (label, _, n) in enumerate(plan)
    ]
    return read_plan, len(buckets)
