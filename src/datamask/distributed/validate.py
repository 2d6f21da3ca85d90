"""The validation pass of a sharded selection: every input checked before any group runs.

One streaming read of every shard (:func:`~datamask.io.shards.scan_shard`, a step the
runner schedules like any other, one per :func:`scan_jobs` item) checks each file on its
own; :func:`check_scans` then checks
what only the whole corpus shows: one embedding width and one id type across shards,
quality ranges that can be scaled, and ids unique across shards. The same pass gives the
corpus-wide minimum and maximum of every quality column, by which every group then scales
its quality (so a score means the same in every group). Ids are compared by
64-bit hashes spread over ``n_buckets`` buckets (on disk when there is more than one), so
the driver holds at most one bucket, about ``BUCKET_ROWS`` ids, whatever the corpus
size; a repeated hash is confirmed by reading the two ids themselves.
"""

from __future__ import annotations

import math
import tempfile
from collections.abc import Iterable, Sequence
from dataclasses import replace
from pathlib import Path
from typing import Any

import numpy as np

from .._validation import check_quality_span
from ..io.shards import ShardInfo, ShardScan, read_rows

__all__ = ["scan_jobs", "check_scans", "BUCKET_ROWS", "QualityRange"]

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


class _IdBuckets:
    """Id hashes of every shard, filed by bucket: in memory for one bucket, else on disk."""

    def __init__(self, n_buckets: int, folder: str) -> None:
        self.n_buckets = n_buckets
        self.files = [Path(folder) / f"bucket-{b:05d}.bin" for b in range(n_buckets)]
        self.memory: list[np.ndarray] = []

    def add(self, scan: ShardScan) -> None:
        """File one shard's hashes (then the caller drops them)."""
        h = scan.id_hashes
        entries = np.empty(len(h), dtype=_POS_DTYPE)
        entries["hash"], entries["row"], entries["shard"] = h["hash"], h["row"], scan.index
        if self.n_buckets == 1:
            self.memory.append(entries)
            return
        bounds = np.concatenate([[0], np.cumsum(scan.bucket_counts)])
        for b in np.flatnonzero(np.diff(bounds)):
            with open(self.files[b], "ab") as fh:
                entries[int(bounds[b]) : int(bounds[b + 1])].tofile(fh)

    def duplicates(self) -> tuple[int, list[tuple]]:
        """Repeated hashes over all buckets: count and the earliest candidate pairs."""
        if self.n_buckets == 1:
            parts = self.memory or [np.zeros(0, _POS_DTYPE)]
            return _duplicates_in(np.concatenate(parts))
        total, candidates = 0, []
        for f in self.files:  # one bucket in memory at a time
            if f.exists():
                count, pairs = _duplicates_in(np.fromfile(f, dtype=_POS_DTYPE))
                total += count
                candidates.extend(pairs)
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


def scan_jobs(infos: Sequence[ShardInfo], settings: Any) -> list[tuple]:
    """Arguments of one :func:`~datamask.io.shards.scan_shard` step per non-empty shard."""
    n_buckets = _n_buckets(infos)
    columns = settings.columns
    return [(s, info.path, columns, n_buckets) for s, info in enumerate(infos) if info.num_rows]


QualityRange = tuple[tuple[float, ...], tuple[float, ...]]


def check_scans(
    scans: Iterable[ShardScan],
    infos: Sequence[ShardInfo],
    settings: Any,
    n_input: int | None = None,
) -> tuple[dict[str, str], QualityRange]:
    """What only the whole corpus shows.

    Returns ``{path: content checksum}`` and the corpus-wide ``(lows, highs)`` of the
    quality columns, one value per column.

    Parameters
    ----------
    scans : iterable of ShardScan
        The results of the :func:`scan_jobs` steps, in any order; consumed one at a time
        (each one's id hashes are filed and dropped).
    infos : sequence of ShardInfo
        The shards, in the run's order; given KEPT, the input's then ``--given``'s (one
        width, one id type, no id in both, and one quality range over all of them).
    settings : SelectSpec
        Columns checked (``id_col``, ``quality_cols``).
    n_input : int, optional
        How many of ``infos`` are the input's (the rest are ``--given``'s), for the
        messages.

    Raises
    ------
    ValueError
        The first problem found, naming the file(s) and row(s).
    """
    with tempfile.TemporaryDirectory(prefix="datamask-ids-") as folder:
        buckets = _IdBuckets(_n_buckets(infos), folder)
        kept = []
        for scan in scans:
            buckets.add(scan)
            kept.append(replace(scan, id_hashes=None))
        ordered = sorted(kept, key=lambda sc: sc.index)
        return _check_corpus_wide(ordered, buckets, infos, settings, n_input)


def _check_corpus_wide(
    scans: list[ShardScan],
    buckets: _IdBuckets,
    infos: Sequence[ShardInfo],
    settings: Any,
    n_input: int | None = None,
) -> tuple[dict[str, str], QualityRange]:
    if not scans:
        return {}, ((), ())
    ref = scans[0]
    for sc in scans[1:]:
        if sc.width != ref.width:
            raise ValueError(
                f"embedding width {sc.width} in {sc.path} does not match {ref.width} in "
                f"{ref.path}; every shard must hold embeddings of one model."
            )
        if sc.id_type != ref.id_type:
            raise ValueError(
                f"column {settings.columns.id_col!r} is {sc.id_type} in {sc.path} but "
                f"{ref.id_type} in {ref.path}; store ids with one type in every shard."
            )
    lows, highs = [], []
    for j, name in enumerate(settings.columns.quality_cols):
        lo = min(sc.quality_min[j] for sc in scans)
        hi = max(sc.quality_max[j] for sc in scans)
        where = "the input shards" if n_input is None else "the input and --given shards"
        check_quality_span(np.asarray([lo, hi]), name, where)
        lows.append(float(lo))
        highs.append(float(hi))
    _raise_first_duplicate(*buckets.duplicates(), infos, settings.columns.id_col, n_input)
    return {sc.path: sc.checksum for sc in scans}, (tuple(lows), tuple(highs))
