"""The k-means fit of ``--partition cluster`` spread over steps, in two levels when C is large.

One fit step (:func:`~.fit.fit_partition`) holds the whole sample and its sample x
clusters similarities; at 10^4-10^5 clusters the sample a good fit needs (``ROWS_PER_
CENTROID`` rows per centroid) no longer fits one step. When the sample is larger than
``--kmeans-step-rows``, the fit runs as steps instead (:func:`fit_spread`), the driver
holding only centroids and counts:

1. **Sample parts.** The seeded sample (:func:`~.partition.sample_plan`) is cut, by shard,
   into parts of about ``step_rows`` rows; one step per part reads its rows and writes them
   to ``WORK/clusters/kmeans/part-PPPPP.f32`` (raw unit float32 rows, marker last).
2. **Lloyd's iterations over the parts.** Each iteration, one step per part re-reads its
   part, assigns every row to the current centroids and returns only the per-centroid
   float64 sums and counts (k x d: small); the driver adds them up in part order (so the
   result does not depend on the runner or the workers), refills empty centroids from a
   seeded reserve of sample rows and normalises. The math runs in torch on the step's
   device (``cuda`` where the step got a GPU, under ``--device auto``), the same code on CPU.
3. **Two levels when C is large** (C > ``TWO_LEVEL_MIN``): step 2 fits ``ceil(sqrt(C))``
   coarse centroids; one step per part then files its rows by coarse cluster
   (``routed-PPPPP.f32``, sorted, and their counts); one step per batch of coarse clusters
   reads each cluster's rows from every part (ranged reads) and fits a fine k-means of its
   share of the C centroids (:func:`~datamask.data.apportion` of the sample), then the
   splits of clusters too large for one group (:func:`~.partition.grow_tree`). With one
   level, the same route-and-split steps split the C clusters.
4. **One tree.** A last step joins the subtrees into one :class:`~.tree.ClusterTree`: the
   coarse clusters are its roots and the fine ones their children, so a spilled row is
   compared with sqrt(C) + C / sqrt(C) centres, not C.

Every step is a pure function of its arguments and files, resumable from its marker.
"""

from __future__ import annotations

import math
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import torch

from ..._device import resolve_device
from ..._memory import peak_rss_mb
from ...io.atomic import atomic_write
from ...io.fs import open_input, open_whole
from ...neighbors import spherical_kmeans
from ..engine import Step
from ..paths import WorkDir
from .partition import KMEANS_ITER, grow_tree, kmeans_generator, read_sample
from .tree import ClusterTree

__all__ = [
    "ROWS_PER_CENTROID",
    "SAMPLE_CAP",
    "SAMPLE_DEFAULT",
    "TWO_LEVEL_MIN",
    "FitPlan",
    "fit_plan",
    "FitSubtrees",
    "JoinSubtrees",
    "LloydPart",
    "PartJob",
    "PartRows",
    "RoutePart",
    "SamplePart",
    "join_subtrees",
]

#: Sample rows when ``--kmeans-sample`` is not given and C is small.
SAMPLE_DEFAULT = 100_000
#: Sample rows per centroid when C asks for more than ``SAMPLE_DEFAULT`` (faiss warns below
#: 39 per centroid; 64 leaves each centroid a mean of tens of rows).
ROWS_PER_CENTROID = 64
#: Most sample rows by default (6 GB at 384-d, spread over the parts).
SAMPLE_CAP = 4_000_000
#: Above this many clusters the spread fit runs in two levels.
TWO_LEVEL_MIN = 1_000
#: Rows a step reads and assigns at a time.
_BLOCK = 65_536


@dataclass(frozen=True)
class FitPlan:
    """How the k-means of a cluster partition is fitted.

    Attributes
    ----------
    n_sample : int
        Sample rows.
    spread : bool
        Fitted by steps over parts of the sample (else one step holds it all).
    levels : int
        1, or 2: ``k1`` coarse centroids, then a fine k-means inside each.
    k1 : int
        Centroids of the first (spread) level: C, or ``ceil(sqrt(C))`` with two levels.
    """

    n_sample: int
    spread: bool
    levels: int
    k1: int


def fit_plan(n_clusters: int, n_total: int, kmeans_sample: int | None, step_rows: int) -> FitPlan:
    """The sample size and the shape of the fit for ``n_clusters`` centroids.

    ``kmeans_sample`` given: that many rows; else ``SAMPLE_DEFAULT``, or
    ``ROWS_PER_CENTROID * C`` when that is more (at most ``SAMPLE_CAP``); never more than
    the corpus. Spread when the sample is above ``step_rows``; two levels when also C >
    ``TWO_LEVEL_MIN``.

    >>> fit_plan(100, 10**6, None, 100_000)
    FitPlan(n_sample=100000, spread=False, levels=1, k1=100)
    >>> fit_plan(10_000, 10**6, None, 100_000)
    FitPlan(n_sample=640000, spread=True, levels=2, k1=100)
    """
    if kmeans_sample is None:
        kmeans_sample = max(SAMPLE_DEFAULT, min(ROWS_PER_CENTROID * n_clusters, SAMPLE_CAP))
    n_sample = min(kmeans_sample, n_total)
    spread = n_sample > step_rows
    two = spread and n_clusters > TWO_LEVEL_MIN
    k1 = math.ceil(math.sqrt(n_clusters)) if two else n_clusters
    return FitPlan(n_sample, spread, 2 if two else 1, min(k1, n_sample))


# --- raw float32 rows on storage: one object per part, ranged reads ------------------------
def _write_rows(x: np.ndarray, path: Path) -> None:
    with atomic_write(path) as tmp, open(tmp, "wb") as fh:
        fh.write(np.ascontiguousarray(x, dtype=np.float32).tobytes())


def _read_rows(path: Path, dim: int, start: int, stop: int) -> np.ndarray:
    """Rows ``[start, stop)`` of a raw float32 object of ``dim`` columns: one ranged read."""
    with open_input(path) as fh:
        fh.seek(4 * dim * start)
        data = fh.read(4 * dim * (stop - start))
    return np.frombuffer(data, dtype=np.float32).reshape(stop - start, dim)


def _blocks(path: Path, dim: int, n: int) -> Iterator[np.ndarray]:
    for lo in range(0, n, _BLOCK):
        yield _read_rows(path, dim, lo, min(n, lo + _BLOCK))


def read_part(dirs: WorkDir, part: int, dim: int, rows: int) -> np.ndarray:
    """The ``rows`` x ``dim`` float32 rows of one sample part :class:`SamplePart` wrote."""
    return _read_rows(dirs.kmeans_rows("part", part), dim, 0, rows)


# --- steps ---------------------------------------------------------------------------------
@dataclass(frozen=True, slots=True, eq=False)
class PartJob:
    """One part of the k-means sample (in ``dirs.kmeans()``): its number, and what the
    step that reads or routes it needs (the sample's read jobs, the rows, centroids...)."""

    dirs: WorkDir
    part: int
    n: int = 0
    dim: int = 0
    reads: tuple = ()  # SamplePart: read_sample's arguments, in shard order
    rows: np.ndarray | None = None  # PartRows: sorted rows to read
    centroids: np.ndarray | None = None  # LloydPart, RoutePart
    device: str = "cpu"


class SamplePart(Step[PartJob]):
    """Read one part of the sample and write it as ``part-PPPPP.f32``; marker last."""

    name = "k-means: sample"
    unit = "part"

    def marker(self, job: PartJob) -> Path:
        return job.dirs.kmeans_marker("part", job.part)

    def outputs(self, job: PartJob) -> tuple[Path, ...]:
        return (job.dirs.kmeans_rows("part", job.part),)

    def run(self, job: PartJob) -> dict[str, Any]:
        x = np.concatenate([read_sample(*read)[1] for read in job.reads])
        _write_rows(x, job.dirs.kmeans_rows("part", job.part))
        rss = peak_rss_mb()
        return {"part": job.part, "rows": len(x), "dim": int(x.shape[1]), "peak_rss_mb": rss}


class PartRows(Step[PartJob]):
    """Rows ``job.rows`` (sorted) of one part: the initial centroids and their reserve."""

    name = "k-means: initial"
    unit = "part"

    def run(self, job: PartJob) -> tuple[int, np.ndarray]:
        path = job.dirs.kmeans_rows("part", job.part)
        assert job.rows is not None
        rows = [_read_rows(path, job.dim, int(r), int(r) + 1)[0] for r in job.rows]
        return job.part, np.stack(rows)


class LloydPart(Step[PartJob]):
    """One Lloyd step on one part: ``(part, sums, counts, sum of similarities)``, the sums
    of its rows per nearest centroid in float64 (k x d), on ``job.device``."""

    name = "k-means: lloyd"
    unit = "part"
    use_gpu = True

    def run(self, job: PartJob) -> tuple[int, np.ndarray, np.ndarray, float]:
        dev = resolve_device(job.device)
        cent = torch.from_numpy(np.ascontiguousarray(job.centroids, dtype=np.float32)).to(dev)
        sums = torch.zeros(cent.shape, dtype=torch.float64, device=dev)
        counts = torch.zeros(len(cent), dtype=torch.int64, device=dev)
        total = 0.0
        for block in _blocks(job.dirs.kmeans_rows("part", job.part), job.dim, job.n):
            x = torch.from_numpy(block.copy()).to(dev)
            sims, label = _nearest(x, cent)
            sums.index_add_(0, label, x.double())
            counts += torch.bincount(label, minlength=len(cent))
            total += float(sims.double().sum())
        return job.part, sums.cpu().numpy(), counts.cpu().numpy(), total


def _nearest(x: np.ndarray | torch.Tensor, cent: torch.Tensor) -> tuple[torch.Tensor, ...]:
    """Similarity to, and index of, each row's nearest centroid (first on ties), on the
    centroids' device."""
    if isinstance(x, np.ndarray):
        x = torch.from_numpy(x.copy())
    sims, label = (x.to(cent.device) @ cent.T).max(1)
    return sims, label


class RoutePart(Step[PartJob]):
    """File one part's rows by nearest centroid: ``routed-PPPPP.f32`` (sorted by centroid,
    input order within one); its counts per centroid are the marker."""

    name = "k-means: route"
    unit = "part"
    use_gpu = True

    def marker(self, job: PartJob) -> Path:
        return job.dirs.kmeans_marker("routed", job.part)

    def outputs(self, job: PartJob) -> tuple[Path, ...]:
        return (job.dirs.kmeans_rows("routed", job.part),)

    def run(self, job: PartJob) -> dict[str, Any]:
        dirs, n = job.dirs, job.n
        dev = resolve_device(job.device)
        cent = torch.from_numpy(np.ascontiguousarray(job.centroids, dtype=np.float32)).to(dev)
        x = _read_rows(dirs.kmeans_rows("part", job.part), job.dim, 0, n)
        blocks = range(0, n, _BLOCK)
        labels = [_nearest(x[lo : lo + _BLOCK], cent)[1].cpu().numpy() for lo in blocks]
        label = np.concatenate(labels) if labels else np.zeros(0, np.int64)
        _write_rows(x[np.argsort(label, kind="stable")], dirs.kmeans_rows("routed", job.part))
        return {"part": job.part, "counts": np.bincount(label, minlength=len(cent)).tolist()}


@dataclass(frozen=True, slots=True, eq=False)
class SubtreeJob:
    """One batch of consecutive clusters to grow subtrees for (see :class:`FitSubtrees`)."""

    dirs: WorkDir
    batch: int
    clusters: tuple[int, ...]
    offsets: np.ndarray
    fine: tuple[int, ...]
    centroids: np.ndarray
    dim: int
    scale: float
    max_rows: int
    seed: int


class FitSubtrees(Step[SubtreeJob]):
    """The subtree of each cluster of one batch, from its rows in every routed part.

    ``offsets[i]``: where cluster ``clusters[i]`` starts and stops in each routed part,
    shape (len(clusters), 2, parts); the clusters are consecutive, so each part is read
    once, over the batch's range. A cluster given ``fine[i] >= 2`` centroids is first
    cut by a fine k-means of its rows (its roots), else its root is its own centroid
    (``centroids[i]``); then :func:`~.partition.grow_tree` splits what is too large.
    Each cluster draws from its own seeded generator, so the batches do not matter.
    Writes ``subtrees-BBBBB.npz``; stats: its rows.
    """

    name = "k-means: subtrees"
    unit = "batch"

    def marker(self, job: SubtreeJob) -> Path:
        return job.dirs.kmeans_marker("subtrees", job.batch)

    def outputs(self, job: SubtreeJob) -> tuple[Path, ...]:
        return (job.dirs.subtrees(job.batch),)

    def run(self, job: SubtreeJob) -> dict[str, Any]:
        return _fit_subtrees(job)


def _fit_subtrees(job: SubtreeJob) -> dict[str, Any]:
    """:class:`FitSubtrees`' work."""
    dirs, batch, clusters, offsets = job.dirs, job.batch, job.clusters, job.offsets
    fine, centroids, dim, seed = job.fine, job.centroids, job.dim, job.seed
    scale, max_rows = job.scale, job.max_rows
    out = dirs.subtrees(batch)
    arrays: dict[str, list[np.ndarray]] = {k: [] for k in ("centre", "offset", "axis", "children")}
    sizes, rows = [], 0
    # the batch's clusters are consecutive: one ranged read of each routed part
    lo, hi = offsets[0, 0], offsets[-1, 1]
    held = [
        _read_rows(dirs.kmeans_rows("routed", p), dim, int(lo[p]), int(hi[p]))
        for p in range(offsets.shape[2])
    ]
    for i, c in enumerate(clusters):
        pieces = [held[p][int(a - lo[p]) : int(b - lo[p])] for p, (a, b) in enumerate(offsets[i].T)]
        x = torch.from_numpy(np.concatenate(pieces) if pieces else np.zeros((0, dim), np.float32))
        gen = kmeans_generator(seed, 2, int(c))
        roots = torch.from_numpy(np.ascontiguousarray(centroids[i : i + 1], dtype=np.float32))
        if fine[i] >= 2 and len(x) >= 2:
            roots = _spherical(x, int(fine[i]), gen)
        tree = grow_tree(x, roots, scale, max_rows, gen) if len(x) else _leaf(roots)
        for key, value in zip(arrays, tree, strict=True):
            arrays[key].append(value)
        sizes.append([len(roots), len(tree[0])])
        rows += len(x)
    with atomic_write(out) as tmp, open(tmp, "wb") as fh:
        np.savez(
            fh,
            sizes=np.asarray(sizes, np.int64),
            **{k: np.concatenate(v) for k, v in arrays.items()},
        )
    return {"batch": batch, "rows": rows, "peak_rss_mb": peak_rss_mb()}


def _spherical(x: torch.Tensor, k: int, gen: torch.Generator) -> torch.Tensor:
    return spherical_kmeans(x, k, n_iter=KMEANS_ITER, sample=None, generator=gen)


def _leaf(roots: torch.Tensor) -> tuple[np.ndarray, ...]:
    """A cluster the sample left empty: its root, a leaf with no axis."""
    n, d = roots.shape
    return (
        roots.numpy().astype(np.float32),
        np.zeros(n, np.float32),
        np.zeros((n, d), np.float32),
        np.full((n, 2), -1, np.int64),
    )


@dataclass(frozen=True, slots=True, eq=False)
class JoinJob:
    """The batches' subtrees to join into the run's tree (``dirs.tree()``)."""

    dirs: WorkDir
    n_batches: int
    centroids: np.ndarray
    ordered: bool
    levels: int


class JoinSubtrees(Step[JoinJob]):
    """One tree from the batches' subtrees (:func:`join_subtrees`)."""

    name = "k-means: join"
    unit = "step"

    def run(self, job: JoinJob) -> dict[str, Any]:
        return join_subtrees(job.dirs, job.n_batches, job.centroids, job.ordered, job.levels)


def join_subtrees(
    dirs: WorkDir,
    n_batches: int,
    centroids: np.ndarray,
    ordered: bool,
    levels: int,
) -> dict[str, Any]:
    """One tree from the batches' subtrees; saved to ``dirs.tree()``.

    The first-level clusters are nodes ``0 .. k1-1``. A cluster with one root keeps its
    node (the root's children become its own); one with several roots (a fine k-means)
    gets them as its children. Children keep consecutive ids above their parent's.
    """
    k1, dim = centroids.shape
    centre = [centroids.astype(np.float32)]
    offset = [np.zeros(k1, np.float32)]
    axis = [np.zeros((k1, dim), np.float32)]
    children = [np.full((k1, 2), -1, np.int64)]
    top, base = 0, k1
    for b in range(n_batches):
        with open_whole(dirs.subtrees(b)) as fh, np.load(fh) as f:
            sub = {k: f[k] for k in ("sizes", "centre", "offset", "axis", "children")}
        start = 0
        for n_roots, n_nodes in sub["sizes"]:
            own = int(n_roots == 1)  # the root is the cluster's own node; the rest follow
            new = base + np.arange(n_nodes - own)
            if own:
                new = np.concatenate([[top], new])
            kids = _remap_children(sub["children"][start : start + n_nodes], new)
            rest = slice(start + own, start + n_nodes)
            if own:
                axis[0][top] = sub["axis"][start]
                children[0][top] = kids[0]
            else:  # the fine roots become the cluster's children
                children[0][top] = (base, base + n_roots)
            centre.append(sub["centre"][rest])
            offset.append(sub["offset"][rest])
            axis.append(sub["axis"][rest])
            children.append(kids[own:])
            base += n_nodes - own
            top += 1
            start += n_nodes
    if top != k1:
        raise RuntimeError(f"the subtrees hold {top} clusters, not {k1}; please report this.")
    tree = ClusterTree(
        centroids=centroids.astype(np.float32),
        centre=np.concatenate(centre),
        offset=np.concatenate(offset),
        axis=np.concatenate(axis),
        children=np.concatenate(children),
        ordered=ordered or base > 1,
        levels=levels,
    )
    tree.save(dirs.tree())
    return {"nodes": len(tree.children), "leaves": tree.n_leaves, "peak_rss_mb": peak_rss_mb()}


def _remap_children(children: np.ndarray, new: np.ndarray) -> np.ndarray:
    """``[first, stop)`` of each node's children, renumbered by ``new`` (local -> global)."""
    out = np.full_like(children, -1)
    inner = children[:, 0] >= 0
    out[inner, 0] = new[children[inner, 0]]
    out[inner, 1] = new[children[inner, 1] - 1] + 1
    return out
