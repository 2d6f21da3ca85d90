"""The k-means fit of ``--partition cluster``: one step on a worker, or spread over the
steps of :mod:`.kmeans` with the driver holding plans and sums, never rows.

The driver only plans which rows of which shard form the seeded sample
(:func:`~.partition.sample_plan`); :func:`read_sample_parts` reads them by steps, and
:func:`fit_partition` fits the centroids
and the cuts of clusters too large for one group (:func:`~.partition.fit_centroids`,
:func:`~.partition.fit_tree`) and saves the tree. Its memory (the sample, held once, and
k-means' similarities in blocks of 16 MB) is a worker's.
On CPU and with the same sample, so the partition is the same on any runner. A sample
above ``--kmeans-step-rows`` is fitted by steps instead (:func:`fit_spread`).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np

from ..._memory import peak_rss_mb
from ...config import SelectSpec
from ...data import apportion
from ...io.shards import ShardInfo
from ..engine import Step, run_steps
from ..executors import Runner
from ..paths import WorkDir
from .kmeans import (
    FitPlan,
    FitSubtrees,
    JoinJob,
    JoinSubtrees,
    LloydPart,
    PartJob,
    PartRows,
    RoutePart,
    SamplePart,
    SubtreeJob,
    read_part,
)
from .partition import (
    _KMEANS_STREAM,
    KMEANS_ITER,
    fit_centroids,
    fit_tree,
    sample_plan,
)

__all__ = [
    "FitJob",
    "FitPartition",
    "fit_partition",
    "fit_spread",
    "read_sample_parts",
]


@dataclass(frozen=True, slots=True)
class FitJob:
    """The seeded sample as the parts :class:`~.kmeans.SamplePart` steps wrote to
    ``dirs.kmeans()`` (rows of each, of ``dim`` columns), and what the tree is fitted
    with; the tree is saved to ``dirs.tree()``."""

    dirs: WorkDir
    part_rows: tuple[int, ...]
    dim: int
    n_clusters: int
    n_total: int
    max_rows: int
    seed: int


class FitPartition(Step[FitJob]):
    """The tree fitted on the sample's parts, as one step on a worker that may use the
    whole machine; the tree is its output (a fitted tree is not fitted again:
    :func:`~.plan.fit_cluster_tree` checks it before planning the step)."""

    name = "k-means fit"
    unit = "step"
    whole_machine = True

    def run(self, job: FitJob) -> dict[str, Any]:
        return fit_partition(job)


def fit_partition(job: FitJob) -> dict[str, Any]:
    """Read the sample's parts, fit the tree (the centroids and the cuts of clusters too
    large for one group) and save it to ``job.dirs.tree()``; returns its size and memory."""
    # Filled part by part: the sample is held once, not twice as when its parts were
    # concatenated (154 MB at 10^5 x 384).
    sample = np.empty((sum(job.part_rows), job.dim), dtype=np.float32)
    at = 0
    for part, rows in enumerate(job.part_rows):
        sample[at : at + rows] = read_part(job.dirs, part, job.dim, rows)
        at += rows
    centroids = fit_centroids(sample, job.n_clusters, job.seed)
    fit_tree(sample, centroids, job.n_total, job.max_rows, job.seed).save(job.dirs.tree())
    return {"sample_rows": len(sample), "peak_rss_mb": peak_rss_mb()}


def read_sample_parts(
    infos: Sequence[ShardInfo],
    n_sample: int,
    part_rows: int,
    spec: SelectSpec,
    dirs: WorkDir,
    runner: Runner,
) -> list[dict[str, Any]]:
    """The seeded sample (:func:`~.partition.sample_plan`) read by steps in parallel, in
    parts of ``part_rows`` rows in (shard, row) order, each written to ``dirs.kmeans()`` by a
    :class:`~.kmeans.SamplePart` step; returns each part's stats (rows, dim, memory).
    The parts hold the rows one read would, in its order: the fit is the same."""
    wanted = sample_plan(infos, n_sample, spec.selector.seed)
    parts = _cut_parts(wanted, infos, part_rows, spec)
    jobs = [PartJob(dirs, p, reads=tuple(reads)) for p, reads in enumerate(parts)]
    return run_steps(runner, SamplePart(), jobs, progress=False)


# --- spread over steps: the driver's part, plans and sums, never rows --------------------
def fit_spread(
    infos: Sequence[ShardInfo],
    plan: FitPlan,
    n_clusters: int,
    spec: SelectSpec,
    dirs: WorkDir,
    runner: Runner,
) -> dict[str, Any]:
    """Fit the tree of a cluster partition by steps (see the module), save it to
    ``dirs.tree()``; returns facts for the manifest. ``spec``: the run's
    :class:`~datamask.config.SelectSpec`."""
    seed, step_rows = spec.selector.seed, spec.partition.kmeans_step_rows
    stats = read_sample_parts(infos, plan.n_sample, step_rows, spec, dirs, runner)
    n, dim = [st["rows"] for st in stats], int(stats[0]["dim"])
    cent, reserve = _initial(dirs, n, dim, plan.k1, seed, runner)
    device = spec.selector.device
    iterations, used, moved = 0, 0, True
    while moved and iterations < KMEANS_ITER:  # until no centroid moves, at most that
        new, used = _lloyd_round(dirs, n, dim, cent, reserve, used, device, runner)
        moved = not np.array_equal(new, cent)
        cent, iterations = new, iterations + 1
    jobs = [PartJob(dirs, p, n[p], dim, centroids=cent, device=device) for p in range(len(n))]
    routed = run_steps(runner, RoutePart(), jobs, progress=False)
    counts = np.asarray([r["counts"] for r in routed], dtype=np.int64)  # parts x k1
    per = counts.sum(axis=0)
    fine = _fine_counts(per, n_clusters) if plan.levels == 2 else np.ones(plan.k1, np.int64)
    starts = np.concatenate([np.zeros((len(n), 1), np.int64), np.cumsum(counts, axis=1)], 1)
    batches = _batches(per, step_rows)
    scale = sum(i.num_rows for i in infos) / plan.n_sample
    max_rows = spec.partition.chunk_size
    jobs = [
        SubtreeJob(
            dirs,
            b,
            tuple(c.tolist()),
            np.stack([starts[:, c].T, starts[:, c + 1].T], 1),
            tuple(fine[c].tolist()),
            cent[c],
            dim,
            scale,
            max_rows,
            seed,
        )
        for b, c in enumerate(batches)
    ]
    fitted = run_steps(runner, FitSubtrees(), jobs, progress=False)
    n_total = sum(i.num_rows for i in infos)
    join = JoinJob(dirs, len(batches), cent, n_total > max_rows, plan.levels)
    (joined,) = run_steps(runner, JoinSubtrees(), [join], progress=False)
    peaks = [st.get("peak_rss_mb") or 0 for st in [*stats, *fitted, joined]]
    return {
        "spread": True,
        "levels": plan.levels,
        "k1": plan.k1,
        "sample_rows": plan.n_sample,
        "parts": len(n),
        "iterations": iterations,
        "subtree_steps": len(batches),
        "step_peak_rss_mb": max(peaks),
    }


def _cut_parts(
    wanted: dict[int, np.ndarray], infos: Sequence[ShardInfo], step_rows: int, spec: SelectSpec
) -> list[list[tuple]]:
    """The sample, in (shard, row) order, cut into runs of ``step_rows`` rows: each part's
    :func:`~.partition.read_sample` jobs. Depends on the sample and ``step_rows`` only."""
    col = spec.columns.feature_col
    parts: list[list[tuple]] = [[]]
    room = step_rows
    for s in sorted(wanted):
        rows = wanted[s]
        while len(rows):
            if room == 0:
                parts.append([])
                room = step_rows
            take = rows[:room]
            parts[-1].append((s, infos[s], take, col))
            room -= len(take)
            rows = rows[len(take) :]
    return parts


def _initial(
    dirs: WorkDir, n: Sequence[int], dim: int, k: int, seed: int, runner: Runner
) -> tuple[np.ndarray, np.ndarray]:
    """``k`` seeded sample rows as the first centroids, and ``k`` more as the reserve that
    refills empty ones: read by one step per part that holds any."""
    total = int(sum(n))
    rng = np.random.default_rng(np.random.SeedSequence([int(seed), _KMEANS_STREAM, 3]))
    pick = rng.choice(total, size=min(total, 2 * k), replace=False)
    bounds = np.concatenate([[0], np.cumsum(n)])
    part = np.searchsorted(bounds, pick, side="right") - 1
    jobs = [
        PartJob(dirs, int(p), dim=dim, rows=np.sort(pick[part == p] - bounds[p]))
        for p in np.unique(part)
    ]
    got = dict(run_steps(runner, PartRows(), jobs, progress=False))
    rows = np.empty((len(pick), dim), np.float32)
    for p, x in got.items():
        mine = np.flatnonzero(part == p)
        rows[mine[np.argsort(pick[mine], kind="stable")]] = x
    return rows[:k].copy(), rows[k:].copy()


def _lloyd_round(
    dirs: WorkDir,
    n: Sequence[int],
    dim: int,
    cent: np.ndarray,
    reserve: np.ndarray,
    used: int,
    device: str,
    runner: Runner,
) -> tuple[np.ndarray, int]:
    """One Lloyd iteration over every part; the sums are added in part order (float64),
    so the result is the same whatever order the steps finish in."""
    sums = np.zeros(cent.shape, np.float64)
    counts = np.zeros(len(cent), np.int64)
    pending: dict[int, tuple[np.ndarray, np.ndarray]] = {}
    nxt = 0
    jobs = [PartJob(dirs, p, n[p], dim, centroids=cent, device=device) for p in range(len(n))]
    for part, s, c, _ in run_steps(runner, LloydPart(), jobs, progress=False):
        pending[part] = (s, c)
        while nxt in pending:  # only the parts that finished early wait here
            s, c = pending.pop(nxt)
            sums += s
            counts += c
            nxt += 1
    for j in np.flatnonzero(counts == 0):  # empty: the next reserve row, else unchanged
        sums[j] = reserve[used] if used < len(reserve) else cent[j]
        used += used < len(reserve)
    norm = np.linalg.norm(sums, axis=1, keepdims=True)
    return (sums / np.maximum(norm, 1e-12)).astype(np.float32), used


def _fine_counts(per: np.ndarray, n_clusters: int) -> np.ndarray:
    """Fine centroids per coarse cluster: one each that holds sample rows, the rest of
    ``n_clusters`` shared by sample rows (:func:`~datamask.data.apportion`), never more
    than its rows."""
    fine = (per > 0).astype(np.int64)
    extra = n_clusters - int(fine.sum())
    if extra > 0:
        fine[per > 0] += apportion(per[per > 0].tolist(), extra)
    return np.minimum(fine, per)


def _batches(per: np.ndarray, step_rows: int) -> list[np.ndarray]:
    """Consecutive clusters whose sample rows add up to at most ``step_rows`` (at least
    one cluster each): one subtree step per batch."""
    out: list[list[int]] = [[]]
    room = step_rows
    for c, m in enumerate(per.tolist()):
        if out[-1] and m > room:
            out.append([])
            room = step_rows
        out[-1].append(c)
        room -= m
    return [np.asarray(b, dtype=np.int64) for b in out]
