"""Partition a sharded corpus into selection groups, and share the budget out exactly.

A group is a list of :class:`Piece` s (row ranges of parquet files) that one learner
selects from. Three ways to form groups:

- ``by="shard"``: one group per shard (what the reference does by hand).
- ``by="chunk"``: consecutive runs of ``chunk_size`` rows, crossing shard boundaries.
- ``by="cluster"``: spherical k-means on a seeded sample of embeddings, then one pass
  that files every row under its nearest centroid. The pass writes, per shard, a copy of
  the needed columns sorted by cluster (``clusters/shard-NNNNN.parquet``, one row group
  per cluster), so a group later reads only its own rows. Clusters larger than
  ``chunk_size`` are split into near-equal parts, which bounds a worker's memory.

The global budget ``k_total = round(select_ratio * N)`` is shared by largest-remainder
(Hamilton) apportionment (:func:`datamask.data.apportion`, re-exported here), in exact
integer arithmetic with ties broken by group id, so the group budgets sum to ``k_total``
exactly and do not depend on scheduling.
"""

from __future__ import annotations

import json
import math
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import torch

from .._validation import unit_rows
from ..data import apportion
from ..io.atomic import atomic_write, atomic_write_json
from ..io.parquet import features_from_arrow
from ..io.shards import ShardInfo, read_rows
from ..neighbors import assign_clusters, spherical_kmeans

__all__ = [
    "PARTITIONS",
    "Piece",
    "GroupSpec",
    "apportion",
    "group_seeds",
    "plan_by_shard",
    "plan_by_chunk",
    "split_evenly",
    "make_groups",
    "sample_plan",
    "read_sample",
    "fit_centroids",
    "spill_shard",
    "plan_by_cluster",
]

PARTITIONS = ("shard", "chunk", "cluster")

#: Entropy mixed into the seed for the k-means sample, so it never collides with the
#: per-group seeds spawned from ``seed`` itself.
_KMEANS_STREAM = 0x6B6D65616E73


@dataclass(frozen=True)
class Piece:
    """Rows ``[start, stop)`` of one parquet file."""

    path: str
    start: int
    stop: int

    @property
    def n(self) -> int:
        return self.stop - self.start


@dataclass(frozen=True)
class GroupSpec:
    """One selection group: where its rows are, its budget and its seed.

    Attributes
    ----------
    gid : int
        Group id, 0-based; names its output files (``{gid:05d}``).
    label : str
        Human-readable origin (``"shard 3"``, ``"chunk 12"``, ``"cluster 7 part 1/2"``).
    pieces : tuple of Piece
        Row ranges of parquet files, read in order.
    k : int
        Documents this group keeps (its share of the global budget).
    seed : int
        Learner seed, spawned from the run's seed by group id.
    """

    gid: int
    label: str
    pieces: tuple[Piece, ...]
    k: int
    seed: int

    @property
    def n(self) -> int:
        return sum(p.n for p in self.pieces)


# --- budget and seeds ----------------------------------------------------------------------
def group_seeds(seed: int, n_groups: int) -> list[int]:
    """Per-group learner seeds from ``numpy.random.SeedSequence(seed).spawn(n_groups)``.

    A single group keeps ``seed`` itself, so one group reproduces the single-file
    ``datamask select`` exactly.
    """
    if n_groups == 1:
        return [int(seed)]
    return [int(s.generate_state(1)[0]) for s in np.random.SeedSequence(seed).spawn(n_groups)]


# --- shard and chunk plans -----------------------------------------------------------------
def plan_by_shard(infos: Sequence[ShardInfo]) -> list[tuple[str, list[Piece]]]:
    """One group per non-empty shard."""
    return [
        (f"shard {i}", [Piece(info.path, 0, info.num_rows)])
        for i, info in enumerate(infos)
        if info.num_rows
    ]


def plan_by_chunk(infos: Sequence[ShardInfo], chunk_size: int) -> list[tuple[str, list[Piece]]]:
    """Consecutive runs of ``chunk_size`` rows over the shards in order (the last is shorter)."""
    groups: list[tuple[str, list[Piece]]] = []
    current: list[Piece] = []
    room = chunk_size
    for info in infos:
        start = 0
        while start < info.num_rows:
            take = min(room, info.num_rows - start)
            current.append(Piece(info.path, start, start + take))
            start += take
            room -= take
            if room == 0:
                groups.append((f"chunk {len(groups)}", current))
                current, room = [], chunk_size
    if current:
        groups.append((f"chunk {len(groups)}", current))
    return groups


def split_evenly(pieces: Sequence[Piece], n_parts: int) -> list[list[Piece]]:
    """Cut the concatenation of ``pieces`` into ``n_parts`` runs whose sizes differ by <= 1."""
    starts = np.concatenate([[0], np.cumsum([p.n for p in pieces])])
    total = int(starts[-1])
    parts: list[list[Piece]] = []
    for j in range(n_parts):
        lo, hi = total * j // n_parts, total * (j + 1) // n_parts
        part = []
        for p, p_lo in zip(pieces, starts[:-1], strict=True):
            a, b = max(lo, int(p_lo)), min(hi, int(p_lo) + p.n)
            if a < b:
                part.append(Piece(p.path, p.start + a - int(p_lo), p.start + b - int(p_lo)))
        parts.append(part)
    return parts


def make_groups(
    plan: Sequence[tuple[str, Sequence[Piece]]], k_total: int, seed: int
) -> list[GroupSpec]:
    """Number the planned groups, give each its budget (:func:`apportion`) and seed."""
    sizes = [sum(p.n for p in pieces) for _, pieces in plan]
    budgets = apportion(sizes, k_total)
    seeds = group_seeds(seed, len(plan))
    return [
        GroupSpec(gid, label, tuple(pieces), int(budgets[gid]), seeds[gid])
        for gid, (label, pieces) in enumerate(plan)
    ]


# --- cluster plan --------------------------------------------------------------------------
def sample_plan(infos: Sequence[ShardInfo], n_sample: int, seed: int) -> dict[int, np.ndarray]:
    """Which rows of which shard go into the k-means sample: ``{shard index: sorted rows}``.

    ``n_sample`` rows drawn uniformly without replacement over the whole corpus, from a
    generator seeded by ``seed`` alone.
    """
    counts = np.asarray([info.num_rows for info in infos], dtype=np.int64)
    starts = np.concatenate([[0], np.cumsum(counts)])
    total = int(starts[-1])
    rng = np.random.default_rng(np.random.SeedSequence([int(seed), _KMEANS_STREAM]))
    rows = np.sort(rng.choice(total, size=min(n_sample, total), replace=False))
    shard = np.searchsorted(starts, rows, side="right") - 1
    return {int(s): rows[shard == s] - starts[s] for s in np.unique(shard)}


def read_sample(
    shard_index: int, info: ShardInfo, rows: np.ndarray, feature_col: str
) -> tuple[int, np.ndarray]:
    """The unit embeddings of ``rows`` of one shard, read one row group at a time.

    Returns ``(shard_index, features)`` so results can be put back in shard order.
    """
    starts = info.row_group_starts()
    rg_of_row = np.searchsorted(starts, rows, side="right") - 1
    out = []
    for rg in np.unique(rg_of_row):
        lo, hi = int(starts[rg]), int(starts[rg + 1])
        table = read_rows(info.path, lo, hi, [feature_col], row_group_rows=info.row_group_rows)
        feats = features_from_arrow(table.column(feature_col), info.path, feature_col)
        take = rows[rg_of_row == rg] - lo
        out.append(unit_rows(feats[take], info.path, lo))
    return shard_index, np.concatenate(out).astype(np.float32, copy=False)


def fit_centroids(sample: np.ndarray, n_clusters: int, seed: int) -> np.ndarray:
    """Unit centroids, shape (min(n_clusters, len(sample)), d), by spherical k-means on CPU.

    Always on CPU so the partition is the same wherever the driver runs.
    """
    gen = torch.Generator(device="cpu")
    gen.manual_seed(int(np.random.SeedSequence([int(seed), _KMEANS_STREAM]).generate_state(1)[0]))
    x = torch.from_numpy(np.ascontiguousarray(sample, dtype=np.float32))
    cent = spherical_kmeans(x, n_clusters, n_iter=20, sample=None, generator=gen)
    return cent.numpy()


def spill_shard(
    shard_index: int,
    info: ShardInfo,
    centroids_path: str,
    clusters_dir: str,
    columns: Sequence[str],
    feature_col: str,
    batch_size: int = 65_536,
) -> tuple[int, list[int]]:
    """File every row of one shard under its nearest centroid; a pure, resumable step.

    Writes ``clusters_dir/shard-NNNNN.parquet`` (the shard's ``columns`` sorted by cluster,
    stably, one row group per cluster) and then ``shard-NNNNN.json`` with the per-cluster
    row counts; when that JSON exists already, it is returned without redoing the work.

    Returns
    -------
    (shard_index, counts) : tuple of int and list of int
        Rows of this shard in each cluster.
    """
    folder = Path(clusters_dir)
    done = folder / f"shard-{shard_index:05d}.json"
    if done.exists():
        return shard_index, json.loads(done.read_text())["counts"]
    centroids = torch.from_numpy(np.load(centroids_path))
    # One read of the shard: the labels come from its embedding column, then the rows are
    # reordered by label. Memory is one shard, whatever the size of the corpus.
    table = read_rows(info.path, 0, info.num_rows, columns, row_group_rows=info.row_group_rows)
    feats = features_from_arrow(table.column(feature_col), info.path, feature_col)
    labels = [
        assign_clusters(
            torch.from_numpy(
                unit_rows(feats[lo : lo + batch_size], info.path, lo).astype(np.float32)
            ),
            centroids,
        )
        for lo in range(0, len(feats), batch_size)
    ]
    del feats
    label = torch.cat(labels).numpy() if labels else np.zeros(0, np.int64)
    counts = np.bincount(label, minlength=len(centroids))
    table = table.take(pa.array(np.argsort(label, kind="stable")))
    out = folder / f"shard-{shard_index:05d}.parquet"
    with (
        atomic_write(out) as tmp,
        pq.ParquetWriter(tmp, table.schema, compression="zstd", write_page_checksum=True) as writer,
    ):
        offset = 0
        for c in np.flatnonzero(counts):
            writer.write_table(table.slice(offset, int(counts[c])))
            offset += int(counts[c])
    atomic_write_json({"shard": info.path, "counts": counts.tolist()}, done)
    return shard_index, counts.tolist()


def plan_by_cluster(
    spills: Sequence[tuple[str, Sequence[int]]], max_rows: int
) -> list[tuple[str, list[Piece]]]:
    """Groups from the spilled shards: one per non-empty cluster, split above ``max_rows``.

    Parameters
    ----------
    spills : sequence of (path, counts)
        Each spilled shard file and its per-cluster row counts, in shard order.
    max_rows : int
        A cluster with more rows is cut into ``ceil(n / max_rows)`` near-equal parts.
    """
    n_clusters = max((len(c) for _, c in spills), default=0)
    offsets = [np.concatenate([[0], np.cumsum(c)]) for _, c in spills]
    plan: list[tuple[str, list[Piece]]] = []
    for c in range(n_clusters):
        pieces = [
            Piece(path, int(off[c]), int(off[c + 1]))
            for (path, _), off in zip(spills, offsets, strict=True)
            if off[c + 1] > off[c]
        ]
        n = sum(p.n for p in pieces)
        if n == 0:
            continue
        n_parts = math.ceil(n / max_rows)
        if n_parts == 1:
            plan.append((f"cluster {c}", pieces))
            continue
        for j, part in enumerate(split_evenly(pieces, n_parts)):
            plan.append((f"cluster {c} part {j + 1}/{n_parts}", part))
    return plan
