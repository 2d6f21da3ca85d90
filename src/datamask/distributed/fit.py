"""The k-means fit of ``--partition cluster`` as one step on a worker, not on the driver.

The driver only plans which rows of which shard form the seeded sample
(:func:`~.partition.sample_plan`); :func:`fit_partition` reads them, fits the centroids
and the cuts of clusters too large for one group (:func:`~.partition.fit_centroids`,
:func:`~.partition.fit_tree`) and saves the tree. Its memory (the sample, held once, and
k-means' similarities in blocks of 16 MB) is a worker's.
On CPU and with the same sample, so the partition is the same on any runner. A sample
above ``--kmeans-step-rows`` is fitted by steps instead (:mod:`.kmeans`).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np

from .._memory import peak_rss_mb
from .engine import Step
from .partition import fit_centroids, fit_tree, read_sample

__all__ = ["FitJob", "FitPartition", "fit_partition"]


@dataclass(frozen=True)
class FitJob:
    """The seeded sample's reads (:func:`~.partition.read_sample`'s arguments per shard)
    and what the tree is fitted with; the tree is saved to ``tree_path``."""

    reads: tuple[tuple, ...]
    n_clusters: int
    n_total: int
    max_rows: int
    seed: int
    tree_path: str


class FitPartition(Step[FitJob]):
    """:func:`fit_partition` as one step on a worker that may use the whole machine; the
    tree is its output (a fitted tree is not fitted again: :func:`~.plan.fit_cluster_tree`
    checks it before planning the step)."""

    name = "k-means fit"
    unit = "step"
    whole_machine = True

    def run(self, job: FitJob) -> dict[str, Any]:
        return fit_partition(
            job.reads, job.n_clusters, job.n_total, job.max_rows, job.seed, job.tree_path
        )


def fit_partition(
    sample_jobs: Sequence[tuple],
    n_clusters: int,
    n_total: int,
    max_rows: int,
    seed: int,
    tree_path: str,
) -> dict[str, Any]:
    """Read the sample (``sample_jobs``: :func:`~.partition.read_sample`'s arguments per
    shard), fit the tree and save it to ``tree_path``; returns its size and memory."""
    # Filled in shard order, one shard's part at a time: the sample is held once, not
    # twice as when its parts were concatenated (154 MB at 10^5 x 384).
    n_rows = sum(len(job[2]) for job in sample_jobs)
    sample = np.empty((0, 0), dtype=np.float32)
    at = 0
    for job in sorted(sample_jobs, key=lambda job: job[0]):
        _, part = read_sample(*job)
        if not at:  # the width is the first part's
            sample = np.empty((n_rows, part.shape[1]), dtype=np.float32)
        sample[at : at + len(part)] = part
        at += len(part)
    centroids = fit_centroids(sample, n_clusters, seed)
    fit_tree(sample, centroids, n_total, max_rows, seed).save(tree_path)
    return {"sample_rows": len(sample), "peak_rss_mb": peak_rss_mb()}
