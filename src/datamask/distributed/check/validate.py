"""The validation pass of a sharded selection: every input checked before any group runs.

One streaming read of every shard (:func:`scan_step`, a step the runner schedules like
any other, one per :func:`scan_jobs` item) checks each file on its own; :func:`check_scans`
then checks what only the whole corpus shows: one embedding width and one id type across
shards, quality ranges that can be scaled, and ids unique across shards. The same pass
gives the corpus-wide minimum and maximum of every quality column, by which every group
then scales its quality (so a score means the same in every group).

Ids are compared by 64-bit hashes, an all-to-all done by the steps through the work dir,
never by the driver: each scan step files its hashes into ``n_buckets`` buckets (one
small parquet per shard and bucket, ``WORK/ids/bucket=BBBBB/shard-SSSSS.parquet``), then
one :func:`repeats_step` per bucket (about ``BUCKET_ROWS`` ids) finds the repeated hashes
and returns only their count and the first few (shard, row) pairs. The driver reads the
two ids of each pair to confirm a repeat (not a hash collision) and names it. A bucket
step leaves a marker (``WORK/ids/done/bucket=BBBBB.json``) keyed by the shards' checksums,
so a rerun over the same inputs skips it.
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import math
import shutil
from collections.abc import Iterable, Iterator, Sequence
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

import numpy as np
import pyarrow as pa

from ..._validation import check_quality_span
from ...config import SelectSpec
from ...io.fs import Location
from ...io.parquet import atomic_write_table, read_table
from ...io.shards import ShardInfo, ShardScan, read_rows, scan_shard
from ..engine import Step, execute, run_steps
from ..lifecycle import check_previous
from ..paths import WorkDir
from ..plan.partition import SpillJob, SpillShard, spill_table
from ..select.tokens import shard_tokens

__all__ = [
    "scan_jobs",
    "BucketRepeats",
    "RepeatsJob",
    "ScanJob",
    "ScanShard",
    "scan_step",
    "repeats_step",
    "check_scans",
    "dropped_on_error",
    "CHECK_FOLDERS",
    "BUCKET_ROWS",
    "QualityRange",
]

#: Ids per bucket of the uniqueness check (24 bytes each in a bucket step: 192 MB at most).
BUCKET_ROWS = 8_000_000

#: Repeated pairs a bucket step returns (the count covers them all).
REPEATS_SHOWN = 16

_POS_DTYPE = np.dtype([("hash", "<u8"), ("shard", "<i8"), ("row", "<i8")])


def _read_id(info: ShardInfo, row: int, id_col: str) -> Any:
    table = read_rows(info.path, row, row + 1, [id_col], row_group_rows=info.row_group_rows)
    return table.column(id_col)[0].as_py()


def _duplicates_in(entries: np.ndarray, limit: int = REPEATS_SHOWN) -> tuple[int, list[tuple]]:
    """Repeated hashes in one bucket: (count, up to ``limit`` earliest (second, first) pairs)."""
    order = np.lexsort((entries["row"], entries["shard"], entries["hash"]))
    e = entries[order]
    same = np.flatnonzero(e["hash"][1:] == e["hash"][:-1]) + 1
    if not len(same):
        return 0, []
    # The first occurrence of each run of equal hashes.
    starts = np.flatnonzero(np.concatenate([[True], e["hash"][1:] != e["hash"][:-1]]))
    run_start = starts[np.searchsorted(starts, same, side="right") - 1]
    pairs = sorted(
        ((int(e["shard"][j]), int(e["row"][j])), (int(e["shard"][i]), int(e["row"][i])))
        for j, i in zip(same, run_start, strict=True)
    )
    return len(same), pairs[:limit]


# --- the id buckets, through the work dir ---------------------------------------------------
#: What the check pass writes in a work dir it has not claimed: the id buckets, and for
#: ``--partition cluster`` the tree and the spills (:func:`dropped_on_error` removes them).
CHECK_FOLDERS = (WorkDir.id_buckets, WorkDir.clusters)


@contextlib.contextmanager
def dropped_on_error(dirs: WorkDir) -> Iterator[None]:
    """On an error in the ``with`` body, remove what the check pass writes in the work dir
    (:data:`CHECK_FOLDERS`) and every folder above them that the body created (the work
    dir, the output folder): a run refused before it claims its work dir leaves nothing.
    What a run killed before its claim left there is removed on entry: nothing says which
    settings its tree and spills were made with (the check pass makes them again).
    A work dir that already holds a run (its ``settings.json``) is left as it was: the
    checks that refuse a run over it (:func:`~..lifecycle.check_previous`, the scans'
    checksums) come before any write, its tree is fitted and its spills are written (the
    claim comes after the check pass), and its id buckets are that run's."""
    work = dirs.root
    claimed = dirs.settings().exists()
    created = []  # local folders that did not exist before, deepest first
    if not isinstance(work, Location):
        folder = work
        while not folder.exists() and folder != folder.parent:
            created.append(folder)
            folder = folder.parent
    if not claimed:  # what a killed run left before its claim: of unknown settings
        _drop(dirs)
    try:
        yield
    except BaseException:
        if claimed:
            raise
        _drop(dirs)
        for folder in created:
            with contextlib.suppress(OSError):
                folder.rmdir()  # only when empty
        raise


def _drop(dirs: WorkDir) -> None:
    """Remove :data:`CHECK_FOLDERS` from an unclaimed work dir."""
    for folder in CHECK_FOLDERS:
        place = folder(dirs)
        if isinstance(place, Location):
            with contextlib.suppress(OSError):
                place.fs.delete_dir(place.path)
        else:
            shutil.rmtree(place, ignore_errors=True)


@dataclass(frozen=True, slots=True)
class ScanJob:
    """One shard to scan: its place in the run, its path and rows, the columns, the id
    buckets' count, the run's places, and the checksum an earlier run recorded for it
    (``""``: none), taken over ``fingerprint`` (the columns the run's provenance records).
    ``spill``: the shard's spill, written from the rows the scan reads (``--partition
    cluster``, the tree fitted); ``length_col``: the lengths to sum under a token budget."""

    index: int
    path: str
    rows: int
    columns: Any
    n_buckets: int
    dirs: WorkDir
    expect: str = ""
    spill: SpillJob | None = None
    length_col: str | None = None
    fingerprint: tuple[str, ...] = ()


class ScanShard(Step[ScanJob]):
    """Every row of one shard read once (:func:`scan_step`): checked, its id hashes filed,
    and with them its spill and its tokens. No marker: the scan's checksum is the run's
    fingerprint, taken again on every run (the spill keeps its own, :class:`SpillShard`'s,
    and is not written again once there)."""

    name = "check inputs"
    unit = "shard"

    def size(self, job: ScanJob) -> int:
        return job.rows

    def run(self, job: ScanJob) -> ShardScan:
        return scan_step(job)


@dataclass(frozen=True, slots=True)
class RepeatsJob:
    """One bucket of the uniqueness check over ``shards``, for the inputs digest ``inputs``."""

    bucket: int
    dirs: WorkDir
    shards: tuple[int, ...]
    inputs: str


class BucketRepeats(Step[RepeatsJob]):
    """One bucket of the uniqueness check (:func:`repeats_step`); its marker holds the
    count and a few pairs, for the inputs it was computed from (another run's inputs:
    computed again)."""

    name = "check ids"
    unit = "bucket"

    def marker(self, job: RepeatsJob) -> Path:
        return job.dirs.bucket_marker(job.bucket)

    def accepts(self, job: RepeatsJob, done: dict[str, Any]) -> bool:
        return done.get("inputs") == job.inputs

    def run(self, job: RepeatsJob) -> dict[str, Any]:
        return repeats_step(job.bucket, job.dirs, np.asarray(job.shards), job.inputs)


def scan_step(job: ScanJob) -> ShardScan:
    """:func:`~datamask.io.shards.scan_shard`, then its id hashes filed by bucket: one
    parquet (``hash`` uint64, ``row`` int64) per bucket, empty ones too, so a bucket step
    reads exactly one file per scanned shard; then, from the same rows, the shard's spill
    (``job.spill``: :func:`~..plan.partition.spill_table` under :class:`SpillShard`'s marker,
    unless that is there) and its tokens (``job.length_col``:
    :func:`~..select.tokens.shard_tokens`). Returns the scan without its hashes.

    ``job.expect``: the checksum the work dir's earlier run recorded for this shard;
    another one is refused before anything is written (the earlier run's buckets and
    spills stay as they were).
    """
    spill, length_col = job.spill, job.length_col
    extra = [*(spill.columns if spill else ()), *([length_col] if length_col else [])]
    batches: list[pa.RecordBatch] = []  # only the columns the spill and the count need

    def visit(batch: pa.RecordBatch) -> None:
        batches.append(batch.select(list(dict.fromkeys(extra))))

    scan = scan_shard(
        job.index,
        job.path,
        job.columns,
        job.n_buckets,
        extra=extra,
        visit=visit if extra else None,
        fingerprint=job.fingerprint,
    )
    if job.expect and scan.checksum != job.expect:
        raise ValueError(
            f"{job.dirs.root} holds a run with other settings (input shards "
            f"changed: content of {Path(str(job.path)).name} changed); rerun with the same "
            "arguments to resume, or choose another --output/--work-dir."
        )
    table = pa.Table.from_batches(batches) if batches else None  # the batches' buffers
    tokens = None
    if length_col is not None and table is not None:
        tokens = shard_tokens(table.column(length_col), length_col, job.path)
    h = scan.id_hashes
    bounds = np.concatenate([[0], np.cumsum(scan.bucket_counts)]).astype(np.int64)
    for b in range(job.n_buckets):
        part = h[int(bounds[b]) : int(bounds[b + 1])]
        ids = pa.table({"hash": pa.array(part["hash"]), "row": pa.array(part["row"])})
        atomic_write_table(ids, job.dirs.id_bucket(b, job.index))
    if spill is not None and table is not None:
        rows = table.select(list(spill.columns)).combine_chunks()
        del table
        execute(SpillShard(), spill, run=lambda j: spill_table(j, rows))
    return replace(scan, id_hashes=None, tokens=tokens)


def repeats_step(bucket: int, dirs: WorkDir, shards: np.ndarray, inputs: str) -> dict[str, Any]:
    """One bucket of the uniqueness check: read its file of every shard in ``shards``,
    find the repeated hashes (for the inputs digest ``inputs``).

    Returns ``{bucket, inputs, repeated, pairs}``: how many rows repeat an earlier row's
    hash, and up to ``REPEATS_SHOWN`` earliest ``[[shard, row], [first shard, first row]]``
    pairs (what :class:`BucketRepeats` marks the bucket done with). Memory: 24 bytes per
    id of the bucket.
    """
    parts = []
    for s in shards:
        table = read_table(dirs.id_bucket(bucket, int(s)))
        entries = np.empty(table.num_rows, dtype=_POS_DTYPE)
        entries["hash"] = table.column("hash").to_numpy()
        entries["row"] = table.column("row").to_numpy()
        entries["shard"] = int(s)
        parts.append(entries)
    del table
    found = np.concatenate(parts) if parts else np.zeros(0, _POS_DTYPE)
    del parts
    count, pairs = _duplicates_in(found)
    shown = [[list(a), list(b)] for a, b in pairs]
    return {"bucket": bucket, "inputs": inputs, "repeated": count, "pairs": shown}


def _inputs_digest(scans: Sequence[ShardScan], n_buckets: int) -> str:
    """What a bucket marker was computed from: the shards scanned and their checksums."""
    record = [n_buckets] + [[sc.index, sc.path, sc.checksum] for sc in scans]
    return hashlib.sha256(json.dumps(record).encode()).hexdigest()[:16]


def _id_repeats(
    scans: Sequence[ShardScan], n_buckets: int, dirs: WorkDir, runner: Any
) -> tuple[int, list[tuple]]:
    """Every bucket's repeats, from its marker or from one :func:`repeats_step` per bucket
    on ``runner``: the total count and the candidate pairs (a few per bucket)."""
    inputs = _inputs_digest(scans, n_buckets)
    shards = tuple(sc.index for sc in scans)
    jobs = [RepeatsJob(b, dirs, shards, inputs) for b in range(n_buckets)]
    found = run_steps(runner, BucketRepeats(), jobs, progress=False)
    total = sum(f["repeated"] for f in found)
    candidates = [(tuple(x), tuple(y)) for f in found for x, y in f["pairs"]]
    return total, candidates


def _raise_first_duplicate(
    total: int,
    candidates: list[tuple],
    infos: Sequence[ShardInfo],
    id_col: str,
    n_input: int | None = None,
) -> None:
    for (s2, r2), (s1, r1) in sorted(candidates):
        first, again = _read_id(infos[s1], r1, id_col), _read_id(infos[s2], r2, id_col)
        if first == again:  # not a hash collision
            where = (
                f"rows {r1} and {r2} of {infos[s1].path}"
                if s1 == s2
                else f"row {r1} of {infos[s1].path} and row {r2} of {infos[s2].path}"
            )
            if n_input is not None and max(s1, s2) >= n_input:  # a shard of --given
                rule = (
                    "ids must be unique across --given and --input: drop the documents "
                    "already kept from the input."
                )
            else:
                rule = "ids must be unique across shards."
            raise ValueError(
                f"{id_col} {again!r} occurs more than once ({where}; {total} repeated ids "
                f"in all); {rule}"
            )


def _n_buckets(infos: Sequence[ShardInfo]) -> int:
    return max(1, math.ceil(sum(i.num_rows for i in infos) / BUCKET_ROWS))


def scan_jobs(
    infos: Sequence[ShardInfo],
    spec: SelectSpec,
    dirs: WorkDir,
    n_input: int | None = None,
) -> list[ScanJob]:
    """One :class:`ScanShard` job per non-empty shard (its id hashes go to
    ``dirs.id_buckets()``). A work dir holding an earlier run with other settings or shards is
    refused here, before any scan writes (:func:`~..lifecycle.check_previous`).

    ``n_input``: how many of ``infos`` are the input's (the rest are ``--given``'s), whose
    tokens are counted under a token budget. A job spills nothing until given its
    :class:`~..plan.partition.SpillJob` (``dataclasses.replace(job, spill=...)``)."""
    sums = check_previous(dirs, spec, list(infos))
    n_buckets = _n_buckets(infos)
    columns = spec.columns
    n_input = len(infos) if n_input is None else n_input
    length_col = spec.selector.length_col if spec.selector.token_budget else None
    # what the manifest's provenance records: every column the run reads of an input shard
    # (lengths and the terms' columns too), the checked ones of --given's
    of_input, of_given = tuple(spec.read_columns), tuple(columns.read)
    return [
        ScanJob(
            s,
            info.path,
            info.num_rows,
            columns,
            n_buckets,
            dirs,
            sums.get(info.path, ""),
            length_col=length_col if s < n_input else None,
            fingerprint=of_input if s < n_input else of_given,
        )
        for s, info in enumerate(infos)
        if info.num_rows
    ]


QualityRange = tuple[tuple[float, ...], tuple[float, ...]]


def check_scans(
    scans: Iterable[ShardScan],
    infos: Sequence[ShardInfo],
    spec: SelectSpec,
    runner: Any,
    dirs: WorkDir,
    n_input: int | None = None,
) -> tuple[dict[str, str], QualityRange]:
    """What only the whole corpus shows.

    Returns ``{path: content checksum}`` and the corpus-wide ``(lows, highs)`` of the
    quality columns, one value per column.

    Parameters
    ----------
    scans : iterable of ShardScan
        The results of the :func:`scan_jobs` steps, in any order (their id hashes are in
        ``dirs.id_buckets()``).
    infos : sequence of ShardInfo
        The shards, in the run's order; given KEPT, the input's then ``--given``'s (one
        width, one id type, no id in both, and one quality range over all of them).
    spec : SelectSpec
        Columns checked (``id_col``, ``quality_cols``).
    runner : Runner
        Where the bucket steps (:func:`repeats_step`) run.
    dirs : WorkDir
        The run's places (the scan steps wrote the id buckets in ``WORK/ids``).
    n_input : int, optional
        How many of ``infos`` are the input's (the rest are ``--given``'s), for the
        messages.

    Raises
    ------
    ValueError
        The first problem found, naming the file(s) and row(s).
    """
    ordered = sorted(scans, key=lambda sc: sc.index)
    if not ordered:
        return {}, ((), ())
    ref = ordered[0]
    for sc in ordered[1:]:
        if sc.width != ref.width:
            raise ValueError(
                f"embedding width {sc.width} in {sc.path} does not match {ref.width} in "
                f"{ref.path}; every shard must hold embeddings of one model."
            )
        if sc.id_type != ref.id_type:
            raise ValueError(
                f"column {spec.columns.id_col!r} is {sc.id_type} in {sc.path} but "
                f"{ref.id_type} in {ref.path}; store ids with one type in every shard."
            )
    lows, highs = [], []
    for j, name in enumerate(spec.columns.quality_cols):
        lo = min(sc.quality_min[j] for sc in ordered)
        hi = max(sc.quality_max[j] for sc in ordered)
        where = "the input shards" if n_input is None else "the input and --given shards"
        check_quality_span(np.asarray([lo, hi]), name, where)
        lows.append(float(lo))
        highs.append(float(hi))
    repeats = _id_repeats(ordered, _n_buckets(infos), dirs, runner)
    _raise_first_duplicate(*repeats, infos, spec.columns.id_col, n_input)
    return {sc.path: sc.checksum for sc in ordered}, (tuple(lows), tuple(highs))
