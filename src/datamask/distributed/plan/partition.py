"""Partition a sharded corpus into selection groups, and share the budget out exactly.

A group is a list of :class:`Piece` s (row ranges of parquet files) that one learner
selects from. Three ways to form groups:

- ``by="shard"``: one group per shard (what the reference does by hand).
- ``by="chunk"``: consecutive runs of ``chunk_size`` rows, crossing shard boundaries.
- ``by="cluster"``: spherical k-means on a seeded sample of embeddings; a cluster whose
  sampled share of the corpus is above ``chunk_size`` is split, on the same sample, by a
  k-means of its own rows and a balanced assignment (a :class:`ClusterTree`); then one
  pass files every row under its leaf. The pass writes, per shard, a copy of the needed
  columns sorted by leaf (``clusters/shard-NNNNN.parquet``, row groups of whole leaves,
  with each row's place in its shard) and the per-leaf counts. The driver plans groups from
  the leaves' totals alone (:func:`plan_by_cluster`): splits the counts do not need are
  undone, a leaf still above ``chunk_size`` (the sample was off) is cut across its own
  axis, never by row order, and small neighbouring units are merged up to
  ``chunk_size``. Then one step per group gathers its rows from the spills into one
  object (:mod:`.gather`), which every later step of the group reads. No group holds
  more than ``chunk_size`` rows, which bounds a worker's memory.

The global budget ``k_total = round(select_ratio * N)`` is shared by largest-remainder
(Hamilton) apportionment (:func:`datamask.data.apportion`, re-exported here), in exact
integer arithmetic with ties broken by group id, so the group budgets sum to ``k_total``
exactly and do not depend on scheduling.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import torch

from ..._validation import unit_rows
from ...data import apportion
from ...io.atomic import atomic_write
from ...io.dictionary import dictionary_columns
from ...io.parquet import WORK_COMPRESSION, features_from_arrow, pack_features
from ...io.shards import ShardInfo, read_rows
from ...neighbors import assign_clusters, spherical_kmeans
from ..engine import Step
from ..paths import WorkDir
from .balance import assign_with_offsets, balanced_offsets, merge_neighbours, two_means_axis
from .tree import ClusterTree

__all__ = [
    "PARTITIONS",
    "Piece",
    "Group",
    "apportion",
    "group_seeds",
    "plan_by_shard",
    "plan_by_chunk",
    "split_across",
    "make_groups",
    "sample_plan",
    "read_sample",
    "fit_centroids",
    "ClusterTree",
    "default_clusters",
    "fit_tree",
    "grow_tree",
    "SpillJob",
    "SpillShard",
    "spill_table",
    "coalesce",
    "part_rows",
    "plan_by_cluster",
    "ROW_COLUMN",
    "Unit",
]

PARTITIONS = ("shard", "chunk", "cluster")

#: Entropy mixed into the seed for the k-means sample, so it never collides with the
#: per-group seeds spawned from ``seed`` itself.
_KMEANS_STREAM = 0x6B6D65616E73
#: Lloyd's iterations of every k-means fit (one step, or spread over steps).
KMEANS_ITER = 20


def kmeans_generator(seed: int, *stream: int) -> torch.Generator:
    """The CPU generator of one k-means draw: ``seed`` with the k-means entropy and
    ``stream`` (none: the centroids; 1: the cuts; 2, c: coarse cluster c's fine fit)."""
    gen = torch.Generator(device="cpu")
    state = np.random.SeedSequence([int(seed), _KMEANS_STREAM, *stream]).generate_state(1)
    gen.manual_seed(int(state[0]))
    return gen


#: Rows a spill's row group holds at least (whole leaves; the last may hold fewer): a 10M
#: run's 10,000-row spill of 610 leaves (packed float32 rows) wrote in 0.080 s as a row
#: group a leaf, 0.024-0.027 s as 10 (about 55 CPU-s of that run's check pass).
#: A gather step reads the row groups its ranges touch, once a spill
#: (:func:`~datamask.io.shards.read_ranges`), so a leaf no longer needs its own.
SPILL_ROW_GROUP_ROWS = 1024

#: A (sub)cluster is cut when the sample says it holds more than this share of
#: ``chunk_size`` rows: the margin keeps a leaf under ``chunk_size`` when the sample's
#: estimate is a little low, and a cut the full counts do not need is undone by the plan.
SPLIT_FILL = 0.9

#: Default k-means clusters per group's worth of rows: finer clusters, merged back with
#: their neighbours up to ``chunk_size`` (:func:`plan_by_cluster`), fill groups closer to it.
OVERCLUSTER = 3


#: Where a spill keeps each row's position in its input shard (the gathered groups carry
#: it on, so the keep lists need no second read of the spills or the shards).
ROW_COLUMN = "__datamask_row"

#: One unit of a cluster group: ``(first leaf, last leaf, part, parts)``: the rows of
#: leaves ``first..last`` of every spill, or part ``part`` of ``parts`` of one leaf cut
#: across its axis (:func:`split_across`).
Unit = tuple[int, int, int, int]


@dataclass(frozen=True, slots=True)
class Piece:
    """Rows ``[start, stop)`` of one parquet file (slots: the driver holds one or more a
    group)."""

    path: str
    start: int
    stop: int

    @property
    def n(self) -> int:
        return self.stop - self.start


@dataclass(frozen=True, slots=True)
class Group:
    """One selection group: where its rows are, its budget and its seed (slots: the
    driver holds G of them).

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


def split_across(pieces: Sequence[Piece], max_rows: int) -> list[list[Piece]]:
    """Cut ``pieces`` into ``ceil(n / max_rows)`` parts whose sizes differ by <= 1, each
    piece at about the same fractions of its own length.

    Every piece holds rows sorted along one direction (a leaf's axis, see
    :meth:`ClusterTree.assign`), so part ``j`` takes the same slab of every piece: the
    rows of each at relative positions near ``[j / P, (j + 1) / P)``. Rows are ranked by
    their relative position ``(2t + 1) / 2 len`` in their piece (ties by piece), and the
    ranking is cut into ``P`` equal runs, so each part is one contiguous range per piece.
    """
    sizes = np.asarray([p.n for p in pieces], dtype=np.int64)
    total = int(sizes.sum())
    n_parts = max(1, math.ceil(total / max_rows))
    which = np.repeat(np.arange(len(pieces)), sizes)
    pos = np.concatenate([np.arange(n) for n in sizes]) if len(sizes) else np.zeros(0, np.int64)
    rank = (2 * pos + 1) / (2 * sizes[which])
    part = np.empty(total, dtype=np.int64)
    part[np.lexsort((which, rank))] = np.arange(total) * n_parts // total
    # rows of one piece are in rank order, so each part is a prefix-to-suffix run of it
    parts: list[list[Piece]] = [[] for _ in range(n_parts)]
    first = np.concatenate([[0], np.cumsum(sizes)])
    for i, p in enumerate(pieces):
        counts = np.bincount(part[first[i] : first[i + 1]], minlength=n_parts)
        start = p.start
        for j in np.flatnonzero(counts):
            parts[j].append(Piece(p.path, start, start + int(counts[j])))
            start += int(counts[j])
    return parts


def make_groups(
    plan: Sequence[tuple[str, Sequence[Piece]]], k_total: int, seed: int
) -> list[Group]:
    """Number the planned groups, give each its budget (:func:`apportion`) and seed."""
    sizes = [sum(p.n for p in pieces) for _, pieces in plan]
    budgets = apportion(sizes, k_total)
    seeds = group_seeds(seed, len(plan))
    return [
        Group(gid, label, tuple(pieces), int(budgets[gid]), seeds[gid])
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
    gen = kmeans_generator(seed)
    x = torch.from_numpy(np.ascontiguousarray(sample, dtype=np.float32))
    cent = spherical_kmeans(x, n_clusters, n_iter=KMEANS_ITER, sample=None, generator=gen)
    return cent.numpy()


def default_clusters(n_total: int, max_rows: int) -> int:
    """k-means clusters when ``--n-clusters`` is not given: one when the corpus fits one
    group, else ``OVERCLUSTER * ceil(N / (SPLIT_FILL * max_rows))``, merged back later."""
    if n_total <= max_rows:
        return 1
    return OVERCLUSTER * math.ceil(n_total / (SPLIT_FILL * max_rows))


def fit_tree(
    sample: np.ndarray, centroids: np.ndarray, n_total: int, max_rows: int, seed: int
) -> ClusterTree:
    """Split every k-means cluster the sample says is above ``SPLIT_FILL * max_rows`` rows.

    A cluster estimated at ``n`` rows (its sampled rows times ``n_total / len(sample)``)
    needs ``P = ceil(n / (SPLIT_FILL * max_rows))`` parts. A spherical k-means with ``P``
    centres is fitted on its sampled rows, and offsets are fitted so that the balanced
    assignment gives no part more than ``ceil(s / P)`` of its ``s`` sampled rows
    (:func:`~.balance.balanced_offsets`): the parts follow the cluster's own geometry,
    never the row order, and come out at ``n / P <= SPLIT_FILL * max_rows`` rows each.
    Every leaf gets an axis (its 2-means direction) for the spill's order. Deterministic
    for ``seed``.

    Parameters
    ----------
    sample : ndarray of shape (s, d)
        Unit rows, the sample the centroids were fitted on.
    centroids : ndarray of shape (C, d)
        From :func:`fit_centroids`.
    n_total : int
        Rows in the corpus.
    max_rows : int
        The largest group (``--chunk-size``).
    seed : int
        The run's seed.
    """
    gen = kmeans_generator(seed, 1)
    x = torch.from_numpy(np.ascontiguousarray(sample, dtype=np.float32))
    cent = torch.from_numpy(np.ascontiguousarray(centroids, dtype=np.float32))
    centre, offset, axis, children = grow_tree(
        x, cent, n_total / max(len(sample), 1), max_rows, gen
    )
    return ClusterTree(
        centroids=cent.numpy(),
        centre=centre,
        offset=offset,
        axis=axis,
        children=children,
        ordered=len(children) > 1 or n_total > max_rows,
    )


def grow_tree(
    x: torch.Tensor, roots: torch.Tensor, scale: float, max_rows: int, gen: torch.Generator
) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
    """:func:`fit_tree`'s splits of the clusters ``roots`` on their sampled rows ``x``.

    ``scale``: corpus rows per sampled row. Returns the nodes' ``(centre, offset, axis,
    children)`` (:class:`ClusterTree`'s arrays; ``roots`` are nodes ``0 .. len(roots)-1``),
    drawing from ``gen`` in cluster order. Also what a spread fit's step runs on the rows
    of each of its clusters (:mod:`.kmeans`).
    """
    top = assign_clusters(x, roots).numpy()
    centre, offset = list(roots), [torch.zeros(())] * len(roots)
    children: list[list[int]] = [[-1, -1] for _ in range(len(roots))]
    rows_of: list[np.ndarray] = [np.flatnonzero(top == c) for c in range(len(roots))]
    for c in range(len(roots)):  # in cluster order, so the generator is drawn in one order
        rows = rows_of[c]
        parts = min(math.ceil(len(rows) * scale / (SPLIT_FILL * max_rows)), len(rows))
        if parts < 2:
            continue
        xs = x[torch.from_numpy(rows)]
        sub = spherical_kmeans(xs, parts, n_iter=20, sample=None, generator=gen)
        off = balanced_offsets(xs, sub, math.ceil(len(rows) / len(sub)))
        label = assign_with_offsets(xs, sub, off).numpy()
        children[c] = [len(centre), len(centre) + len(sub)]
        centre += list(sub)
        offset += list(off)
        children += [[-1, -1] for _ in range(len(sub))]
        rows_of += [rows[label == j] for j in range(len(sub))]
    axis = [two_means_axis(x[torch.from_numpy(r)], gen) for r in rows_of]
    return (
        torch.stack(centre).numpy().astype(np.float32),
        torch.stack(offset).numpy().astype(np.float32),
        torch.stack(axis).numpy().astype(np.float32),
        np.asarray(children, dtype=np.int64),
    )


@dataclass(frozen=True, slots=True)
class SpillJob:
    """One input shard to file under the leaves of the run's tree (``dirs.tree()``);
    ``released``: the spills were deleted once gathered (then the counts alone finish the
    job)."""

    shard: int
    info: ShardInfo
    dirs: WorkDir
    columns: tuple[str, ...]
    feature_col: str
    released: bool = False
    batch_size: int = 65_536


class SpillShard(Step[SpillJob]):
    """File every row of one shard under its leaf of the tree.

    Writes ``clusters/shard-NNNNN.parquet`` (the shard's ``columns`` sorted by leaf, in
    row groups of whole leaves (:func:`spill_row_groups`), and inside a leaf along its
    axis when the tree is ``ordered``;
    plus :data:`ROW_COLUMN`, each row's place in the shard); the engine writes
    ``shard-NNNNN.json`` with the per-leaf row counts last (O(leaves) per shard: the
    driver never reads them, :func:`~.gather.index_spills` does).
    """

    name = "assign clusters"
    unit = "shard"

    def marker(self, job: SpillJob) -> Path:
        return job.dirs.spill_marker(job.shard)

    def outputs(self, job: SpillJob) -> tuple[Path, ...]:
        return () if job.released else (job.dirs.spill(job.shard),)

    def size(self, job: SpillJob) -> int:
        return job.info.num_rows

    def run(self, job: SpillJob) -> dict:
        return _spill(job)


def _spill(job: SpillJob) -> dict:
    """:class:`SpillShard`'s work on its own: one read of the shard, then
    :func:`spill_table`."""
    info = job.info
    table = read_rows(info.path, 0, info.num_rows, job.columns, row_group_rows=info.row_group_rows)
    return spill_table(job, table)


def spill_table(job: SpillJob, table: pa.Table) -> dict:
    """File the rows of ``table`` (the shard's ``job.columns``, in the shard's order)
    under their leaves and write the spill; returns the marker's stats (the shard, its
    counts). The check pass calls it on the rows it has just read (:mod:`..check.validate`), so
    a shard is read once; :class:`SpillShard` on its own read."""
    info, feature_col, batch_size = job.info, job.feature_col, job.batch_size
    out = job.dirs.spill(job.shard)
    tree = ClusterTree.load(job.dirs.tree())
    # The leaves come from the embedding column, then the rows are reordered by leaf.
    # Memory is one shard, whatever the size of the corpus.
    feats = features_from_arrow(table.column(feature_col), info.path, feature_col)
    labels, projections = [], []
    for lo in range(0, len(feats), batch_size):
        x = unit_rows(feats[lo : lo + batch_size], info.path, lo).astype(np.float32)
        leaf, projection = tree.assign(torch.from_numpy(x))
        labels.append(leaf)
        projections.append(projection)
    table = pack_features(table, feature_col, feats)  # raw float32 rows from here on
    del feats
    label = np.concatenate(labels) if labels else np.zeros(0, np.int64)
    counts = np.bincount(label, minlength=tree.n_leaves)
    if tree.ordered:  # by leaf, then along the leaf's axis (ties: input order)
        order = np.lexsort((-np.concatenate(projections), label))
    else:
        order = np.argsort(label, kind="stable")
    table = table.take(pa.array(order)).append_column(ROW_COLUMN, pa.array(order, pa.int64()))
    with (
        atomic_write(out) as tmp,
        pq.ParquetWriter(
            tmp,
            table.schema,
            compression=WORK_COMPRESSION,
            write_page_checksum=True,
            use_dictionary=dictionary_columns(table.schema),
        ) as writer,
    ):
        for start, stop in spill_row_groups(counts):
            writer.write_table(table.slice(start, stop - start))
    return {"shard": info.path, "counts": counts.tolist()}


def spill_row_groups(counts: np.ndarray) -> list[tuple[int, int]]:
    """The row groups of a spill, ``[start, stop)`` rows of its leaf-sorted rows: runs of
    whole leaves (``counts``: rows per leaf), each closed once it holds
    :data:`SPILL_ROW_GROUP_ROWS` rows; the last holds the rest.

    >>> spill_row_groups(np.array([600, 0, 500, 2000, 10]))
    [(0, 1100), (1100, 3100), (3100, 3110)]
    """
    ends = np.cumsum(counts[counts > 0]).tolist()
    groups, start = [], 0
    for end in ends:
        if end - start >= SPILL_ROW_GROUP_ROWS or end == ends[-1]:
            groups.append((start, end))
            start = end
    return groups


def part_rows(n: int, n_parts: int) -> list[int]:
    """Rows in each of the ``n_parts`` parts :func:`split_across` cuts ``n`` rows into:
    row ``i`` of the ranking goes to part ``i * n_parts // n``."""
    return [-(-(j + 1) * n // n_parts) - -(-j * n // n_parts) for j in range(n_parts)]


def plan_by_cluster(
    per_leaf: np.ndarray,
    max_rows: int,
    tree: ClusterTree,
    merge: bool = True,
) -> list[tuple[str, list[Unit], int]]:
    """Groups from the per-leaf row totals: subtrees of at most ``max_rows`` rows, and then
    small neighbouring ones merged. The driver's part: ``O(leaves + groups)`` numbers.

    Walks every k-means cluster of ``tree`` from its root: a node whose leaves hold at
    most ``max_rows`` rows in all is one unit (so a split the sample asked for and the
    counts do not need is undone), else each of its children is planned the same way. A
    leaf still above ``max_rows`` (the sample was off) is cut across its axis into
    ``ceil(n / max_rows)`` parts (:func:`split_across`, done by the gather step, which
    knows each shard's rows). Empty nodes make no unit. With ``merge``, units are then
    merged with their nearest neighbours (by centre) while the merge fits ``max_rows``
    (:func:`~.balance.merge_neighbours`), so groups come out near ``max_rows``. Without
    ``merge``, the coarse clusters of a two-level tree are never units: every k-means
    cluster is its own group (or its parts).

    Parameters
    ----------
    per_leaf : ndarray of int
        Rows in each leaf of ``tree``, summed over every spilled shard.
    max_rows : int
        The largest group.
    tree : ClusterTree
        The tree the spills were filed by.
    merge : bool, default=True
        Merge neighbouring units (off: every cluster, or each of its parts, is a group).

    Returns
    -------
    list of (label, units, n)
        Per group: its label, its :data:`Unit` s in order and its rows.
    """
    first_last = tree.leaf_range()
    leaf_sums = np.concatenate([[0], np.cumsum(np.asarray(per_leaf, dtype=np.int64))])
    units: list[tuple[int, Unit, int]] = []  # (node, unit, rows)
    for c in range(len(tree.centroids)):
        stack = [c]
        while stack:
            v = stack.pop()
            a, b = (int(i) for i in first_last[v])
            n = int(leaf_sums[b + 1] - leaf_sums[a])
            first, stop = (int(i) for i in tree.children[v])
            if n == 0:
                continue
            coarse = tree.levels == 2 and v < len(tree.centroids) and first >= 0
            if n <= max_rows and not (coarse and not merge):
                units.append((v, (a, b, 0, 1), n))
            elif first >= 0:
                stack += range(stop - 1, first - 1, -1)
            else:  # a leaf the sample put under max_rows: cut across its axis
                parts = math.ceil(n / max_rows)
                units += [(v, (a, b, j, parts), m) for j, m in enumerate(part_rows(n, parts))]
    labels = _unit_labels([v for v, _, _ in units], tree)
    sizes = [m for _, _, m in units]
    merged = (
        merge_neighbours(sizes, tree.centre[[v for v, _, _ in units]], max_rows)
        if merge
        else [[u] for u in range(len(units))]
    )
    return [
        (
            " + ".join(labels[u] for u in group),
            [units[u][1] for u in group],
            sum(sizes[u] for u in group),
        )
        for group in merged
    ]


def _unit_labels(nodes: Sequence[int], tree: ClusterTree) -> list[str]:
    """``"cluster 3"``, or ``"cluster 3 part 2/4"`` for a part (a child, or a cut of one)."""
    root = np.arange(len(tree.children))
    for v in range(len(tree.children)):
        first, stop = tree.children[v]
        if first >= 0:
            root[first:stop] = root[v]
    per_root = np.bincount(root[list(nodes)], minlength=len(tree.centroids))
    seen = np.zeros(len(tree.centroids), dtype=np.int64)
    out = []
    for v in nodes:
        c = int(root[v])
        seen[c] += 1
        whole = per_root[c] == 1
        out.append(f"cluster {c}" if whole else f"cluster {c} part {seen[c]}/{per_root[c]}")
    return out


def coalesce(pieces: Sequence[Piece]) -> list[Piece]:
    """``pieces`` by file and start, runs that touch joined into one piece."""
    out: list[Piece] = []
    for p in sorted(pieces, key=lambda p: (p.path, p.start)):
        if out and out[-1].path == p.path and out[-1].stop == p.start:
            out[-1] = Piece(p.path, out[-1].start, p.stop)
        else:
            out.append(p)
    return out
