"""The validation pass of a sharded selection: every input checked before any group runs.

One streaming read of every shard (:func:`~datamask.io.shards.scan_shard`, a step the
runner schedules like any other) checks each file on its own; this module then checks
what only the whole corpus shows: one embedding width and one id type across shards,
quality ranges that can be scaled, and ids unique across shards. Ids are compared by
64-bit hashes spread over ``n_buckets`` buckets (on disk when there is more than one), so
the driver holds at most one bucket, about ``BUCKET_ROWS`` ids, whatever the corpus
size; a repeated hash is confirmed by reading the two ids themselves.
"""

from __future__ import annotations

import math
import tempfile
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import numpy as np
from tqdm.auto import tqdm

from .._validation import check_quality_span
from ..io.shards import ShardInfo, ShardScan, read_rows, scan_shard

__all__ = ["validate_inputs", "BUCKET_ROWS"]

#: Ids per bucket of the uniqueness check (16 bytes each: 128 MB at most in memory).
BUCKET_ROWS = 8_000_000

_POS_DTYPE = np.dtype([("hash", "<u8"), ("shard", "<i8"), ("row", "<i8")])


def _read_id(info: ShardInfo, row: int, id_col: str) -> Any:
    table = read_rows(info.path, row, row + 1, [id_col], row_group_rows=info.row_group_rows)
    return table.column(id_col)[0].as_py()


def _duplicates_in(entries: np.ndarray, limit: int = 16) -> tuple[int, list[tuple]]:
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


def _check_unique(
    scans: Sequence[ShardScan], infos: Sequence[ShardInfo], n_buckets: int, id_col: str
) -> None:
    total = 0
    candidates: list[tuple] = []

    def bucket_entries(parts: list[np.ndarray]) -> np.ndarray:
        return np.concatenate(parts) if parts else np.zeros(0, _POS_DTYPE)

    def positions(scan: ShardScan, lo: int, hi: int) -> np.ndarray:
        block = scan.id_hashes[lo:hi]
        out = np.empty(len(block), dtype=_POS_DTYPE)
        out["hash"], out["row"], out["shard"] = block["hash"], block["row"], scan.index
        return out

    if n_buckets == 1:
        count, pairs = _duplicates_in(
            bucket_entries([positions(s, 0, len(s.id_hashes)) for s in scans])
        )
        total, candidates = count, pairs
    else:
        with tempfile.TemporaryDirectory(prefix="datamask-ids-") as folder:
            files = [Path(folder) / f"bucket-{b:05d}.bin" for b in range(n_buckets)]
            for scan in scans:  # one shard's hashes in memory at a time
                bounds = np.concatenate([[0], np.cumsum(scan.bucket_counts)])
                for b in range(n_buckets):
                    if bounds[b + 1] > bounds[b]:
                        with open(files[b], "ab") as fh:
                            positions(scan, int(bounds[b]), int(bounds[b + 1])).tofile(fh)
            for f in files:
                if f.exists():
                    count, pairs = _duplicates_in(np.fromfile(f, dtype=_POS_DTYPE))
                    total += count
                    candidates.extend(pairs)
    for (s2, r2), (s1, r1) in sorted(candidates):
        first, again = _read_id(infos[s1], r1, id_col), _read_id(infos[s2], r2, id_col)
        if first == again:  # not a hash collision
            where = (
                f"rows {r1} and {r2} of {infos[s1].path}"
                if s1 == s2
                else f"row {r1} of {infos[s1].path} and row {r2} of {infos[s2].path}"
            )
            raise ValueError(
                f"{id_col} {again!r} occurs more than once ({where}; {total} repeated ids "
                "in all); ids must be unique across shards."
            )


def validate_inputs(
    infos: Sequence[ShardInfo], settings: Any, runner: Any, *, progress: bool = True
) -> dict[str, str]:
    """Check every row of every shard; return ``{path: content checksum}``.

    Parameters
    ----------
    infos : sequence of ShardInfo
        The shards, in the run's order.
    settings : Settings
        Columns to check (``id_col``, ``quality_cols``, ``feature_col``).
    runner : Runner
        Schedules one :func:`~datamask.io.shards.scan_shard` per shard.

    Raises
    ------
    ValueError
        The first problem found, naming the file(s) and row(s).
    """
    n_total = sum(i.num_rows for i in infos)
    n_buckets = max(1, math.ceil(n_total / BUCKET_ROWS))
    jobs = [
        (s, info.path, settings.id_col, tuple(settings.quality_cols), settings.feature_col)
        + (n_buckets,)
        for s, info in enumerate(infos)
        if info.num_rows
    ]
    scans = sorted(
        tqdm(
            runner.map(scan_shard, jobs),
            total=len(jobs),
            desc="check inputs",
            unit="shard",
            disable=not progress,
        ),
        key=lambda sc: sc.index,
    )
    if not scans:
        return {}
    ref = scans[0]
    for sc in scans[1:]:
        if sc.width != ref.width:
            raise ValueError(
                f"embedding width {sc.width} in {sc.path} does not match {ref.width} in "
                f"{ref.path}; every shard must hold embeddings of one model."
            )
        if sc.id_type != ref.id_type:
            raise ValueError(
                f"column {settings.id_col!r} is {sc.id_type} in {sc.path} but {ref.id_type} "
                f"in {ref.path}; store ids with one type in every shard."
            )
    for j, name in enumerate(settings.quality_cols):
        lo = min(sc.quality_min[j] for sc in scans)
        hi = max(sc.quality_max[j] for sc in scans)
        check_quality_span(np.asarray([lo, hi]), name, "the input shards")
    _check_unique(scans, infos, n_buckets, settings.id_col)
    return {sc.path: sc.checksum for sc in scans}
