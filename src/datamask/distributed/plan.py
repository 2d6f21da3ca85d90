"""Phase 2 of a sharded run: the groups, each one's share of the budget, and what the
first round asks of it (:mod:`.runner`). The partition itself is :mod:`.partition`'s; this
module runs its steps (the k-means fit, the spill, the gather) and reads their counts back."""

from __future__ import annotations

import time
from dataclasses import replace
from pathlib import Path
from typing import Any

import numpy as np
from tqdm.auto import tqdm

from .._validation import k_from_ratio
from ..config import SelectSpec
from ..io.fs import names_in
from ..io.shards import ShardInfo
from ..pipeline.step import MODULAR
from .allocate import allocates_by_gains, want_path, wanted
from .context import RunContext
from .executors import Runner, progress_map
from .fit import fit_partition
from .gather import gather_groups, index_spills
from .kmeans import fit_plan, fit_spread
from .partition import (
    ClusterTree,
    GroupSpec,
    default_clusters,
    make_groups,
    plan_by_chunk,
    plan_by_cluster,
    plan_by_shard,
    sample_plan,
    spill_shard,
)
from .steps import candidate_count

__all__ = ["budget_k", "fit_cluster_tree", "plan_groups", "plan_partition"]


def plan_partition(
    infos: list[ShardInfo], settings: SelectSpec, work: Path, runner: Runner, progress: bool
) -> tuple[list[tuple[str, list]], dict[str, Any]]:
    """Group plan for the chosen partition, and facts about it for the manifest."""
    if settings.partition.partition == "shard":
        return plan_by_shard(infos), {}
    if settings.partition.partition == "chunk":
        return plan_by_chunk(infos, settings.partition.chunk_size), {}
    n_total = sum(i.num_rows for i in infos)
    n_clusters = settings.partition.n_clusters or default_clusters(
        n_total, settings.partition.chunk_size
    )
    folder = work / "clusters"
    tree_path = folder / "tree.npz"
    clock = time.perf_counter()
    # 1-2. The k-means centroids and the cuts of clusters too large for one group.
    kmeans = fit_cluster_tree(infos, settings, n_clusters, folder, runner, progress)
    seconds = {"fit": time.perf_counter() - clock}
    # 3. One streaming pass filing every row under its leaf (resumable per shard); the
    #    driver gets only the leaves' totals back.
    jobs = [
        (s, info, str(tree_path), str(folder), settings.read_columns, settings.columns.feature_col)
        for s, info in enumerate(infos)
        if info.num_rows
    ]
    for _ in progress_map(runner, spill_shard, jobs, "assign clusters", progress):
        pass  # each spill's counts stay in its own file
    tree = ClusterTree.load(tree_path)
    index = (str(folder), tree.n_leaves)  # one step: S counts files to one table of offsets
    per_leaf = np.asarray(next(iter(runner.map(index_spills, [index]))), dtype=np.int64)
    seconds["spill"] = time.perf_counter() - clock - seconds["fit"]
    # 4. The groups from the totals (neighbouring clusters merged up to --chunk-size,
    #    unless --n-clusters asked for them), then one step per group writes its rows as
    #    one object: every later step of the group opens that, not the S spills.
    merge = settings.partition.n_clusters is None
    units = plan_by_cluster(per_leaf, settings.partition.chunk_size, tree, merge=merge)
    chunk, columns = settings.partition.chunk_size, settings.read_columns
    plan = gather_groups(units, chunk, columns, folder, work, runner, progress)
    seconds["gather"] = time.perf_counter() - clock - seconds["fit"] - seconds["spill"]
    # the phase's parts (a resumed run's fit is 0): PLAN.md's model calibrates on them
    facts = {
        "n_clusters": len(tree.centroids),
        "n_leaves": tree.n_leaves,
        "kmeans": kmeans,
        "seconds": seconds,
    }
    return plan, facts


def fit_cluster_tree(
    infos: list[ShardInfo],
    settings: SelectSpec,
    n_clusters: int,
    folder: Path,
    runner: Runner,
    progress: bool = False,
) -> dict[str, Any]:
    """Fit the cluster tree of ``--partition cluster`` to ``folder / "tree.npz"`` (unless it
    is there): in one step, or spread over steps (:mod:`.kmeans`) when the sample is above
    ``--kmeans-step-rows``. Returns facts about the fit for the manifest."""
    n_total = sum(i.num_rows for i in infos)
    tree_path = folder / "tree.npz"
    part = settings.partition
    fit = fit_plan(n_clusters, n_total, part.kmeans_sample, part.kmeans_step_rows)
    kmeans: dict[str, Any] = {"spread": fit.spread, "levels": fit.levels}
    if tree_path.exists():
        return kmeans
    if fit.spread:
        # A sample of ROWS_PER_CENTROID rows per centroid, more than one step holds:
        # fitted by steps over its parts, only sums travelling (kmeans.py).
        with tqdm(total=1, desc="k-means fit (spread)", disable=not progress) as bar:
            kmeans = fit_spread(infos, fit, n_clusters, settings, folder, runner)
            bar.update(1)
        return kmeans
    # A seeded sample (row groups of the shards that have sampled rows), the centroids and
    # the cuts of clusters too large for one group: one step, on a worker, on CPU, from the
    # same sample: the partition is the same on any runner.
    wanted = sample_plan(infos, fit.n_sample, settings.selector.seed)
    jobs = [(s, infos[s], rows, settings.columns.feature_col) for s, rows in wanted.items()]
    job = (jobs, n_clusters, n_total, part.chunk_size, settings.selector.seed, str(tree_path))
    with tqdm(total=1, desc="k-means fit", disable=not progress) as bar:
        (stats,) = runner.map(fit_partition, [job], whole_machine=True)
        bar.update(1)
    kmeans.update(sample_rows=stats["sample_rows"], step_peak_rss_mb=stats["peak_rss_mb"])
    return kmeans


def plan_groups(
    run: RunContext, infos: list[ShardInfo], k_total: int
) -> tuple[list[GroupSpec], list[int], dict[str, Any], str]:
    """Phase 2: the groups, each one's share of the budget, and what round 1 asks of it.

    Returns ``(groups, shares, facts, combine)``: ``combine`` is how the groups' results
    become one selection: ``"group"`` (each keeps its share; also a global budget over one
    group), ``"gains"`` (:mod:`.allocate`) or ``"central"`` (one more round over the union
    of the candidates, GreeDi). Under a global budget a group's ``k`` is the candidates it
    proposes (more where an earlier allocation asked for more).
    """
    settings = run.settings
    n_total = sum(i.num_rows for i in infos)
    plan, facts = plan_partition(infos, settings, run.work, run.runner, run.progress)
    groups = make_groups(plan, k_total, settings.selector.seed)
    if sum(g.k for g in groups) != k_total:  # apportion guarantees it; check before writing
        raise RuntimeError("group budgets do not add up to the global k; please report this.")
    shares = [g.k for g in groups]  # by gid (0, 1, ...): one int each, not a dict entry
    if settings.partition.budget == "group" or len(groups) == 1:
        return groups, shares, facts, "group"
    combine = "gains" if allocates_by_gains(settings) else "central"
    if settings.selector.method in MODULAR:  # every row is scored; the merge is exact
        return [replace(g, k=min(g.n, k_total)) for g in groups], shares, facts, combine
    oversample = settings.partition.oversample
    proposed = [replace(g, k=candidate_count(g.n, n_total, k_total, oversample)) for g in groups]
    if combine == "gains":
        asked = names_in(want_path(run.work, 0).parent)  # one listing, not one GET a group
        proposed = [
            replace(g, k=wanted(run.work, g.gid, g.k))
            if want_path(run.work, g.gid).name in asked
            else g
            for g in proposed
        ]
    return proposed, shares, facts, combine


def budget_k(settings: SelectSpec, n_total: int) -> int:
    """``k``: the settings' own, else ``round(select_ratio * N)``."""
    k = settings.selector.k
    if k is None:
        return k_from_ratio(settings.selector.select_ratio, n_total)
    if k > n_total:
        raise ValueError(
            f"k must be at most the {n_total} documents of the input shards; got k={k}."
        )
    return k
