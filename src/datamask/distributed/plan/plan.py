"""Phase 2 of a sharded run: the groups, each one's share of the budget, and what the
first round asks of it (:mod:`..runner`). The partition itself is :mod:`.partition`'s; this
module runs its steps (the k-means fit, the spill, the gather) and reads their counts back."""

from __future__ import annotations

import os
import shutil
import time
from dataclasses import replace
from pathlib import Path
from typing import Any

import numpy as np
from tqdm.auto import tqdm

from ..._units import format_bytes
from ..._validation import k_from_ratio
from ...config import SelectSpec
from ...io.atomic import atomic_write_json
from ...io.fs import names_in
from ...io.shards import ShardInfo
from ...pipeline.step import MODULAR
from ..combine.allocate import wanted
from ..combine.gains import allocates_by_gains
from ..context import RunContext
from ..engine import run_steps
from ..executors import Runner
from ..paths import WorkDir
from ..select.steps import candidate_count
from .fit import FitJob, FitPartition, fit_spread, read_sample_parts
from .gather import IndexJob, IndexSpills, ReleaseJob, ReleaseSpills, gather_groups, ungathered
from .kmeans import fit_plan
from .partition import (
    ClusterTree,
    Group,
    SpillJob,
    SpillShard,
    default_clusters,
    make_groups,
    plan_by_chunk,
    plan_by_cluster,
    plan_by_shard,
)

__all__ = [
    "DISK_PER_INPUT_BYTE",
    "budget_k",
    "check_disk",
    "cluster_count",
    "fit_first",
    "check_work_disk",
    "disk_needed",
    "fit_cluster_tree",
    "one_group",
    "plan_groups",
    "plan_partition",
    "spill_jobs",
]

#: A sharded run's peak disk in its work dir, per byte of input parquet, with a 10%
#: margin; measured at 10M x 384 (docs/scale.md, "The 10M run"). With ``--partition
#: cluster`` the spills and the group objects each hold every row (1.16 bytes per input
#: byte) until the last group is gathered and the spills are deleted; candidates, the
#: exchange, the cover's kept rows and the id buckets add 0.6 after that. Keys: the
#: partition, and ``"cluster-gathered"`` once the spills are released (a resumed run).
#: Steps that read the k-means sample of a one-step fit, in parallel: at most
#: SAMPLE_PARTS, of at least SAMPLE_PART_ROWS rows each (a small corpus: one step). The
#: parts, and so a resumed run's markers, depend on the data alone.
SAMPLE_PARTS, SAMPLE_PART_ROWS = 16, 5000

DISK_PER_INPUT_BYTE = {"cluster": 2.6, "cluster-gathered": 1.94, "chunk": 0.7, "shard": 0.7}


def cluster_count(infos: list[ShardInfo], spec: SelectSpec) -> int:
    """The k-means clusters of ``--partition cluster``: ``--n-clusters``, else
    :func:`~.partition.default_clusters` of the corpus."""
    n_total = sum(i.num_rows for i in infos)
    return spec.partition.n_clusters or default_clusters(n_total, spec.partition.chunk_size)


def one_group(infos: list[ShardInfo], spec: SelectSpec) -> bool:
    """Whether ``--partition cluster`` has one group: the corpus fits ``--chunk-size`` and
    ``--n-clusters`` is not given (its default is then one cluster). Then nothing is
    clustered, spilled or gathered (each would write the corpus once more): the group
    reads the shards in order, as one chunk, and selects what one ``select`` of the
    concatenated shards selects."""
    part = spec.partition
    n_total = sum(i.num_rows for i in infos)
    return part.partition == "cluster" and part.n_clusters is None and n_total <= part.chunk_size


def spill_jobs(infos: list[ShardInfo], spec: SelectSpec, dirs: WorkDir) -> list[SpillJob]:
    """One :class:`~.partition.SpillShard` job per non-empty shard, filing its rows by
    the run's tree; once the spills are released (every group gathered), a spill's counts
    alone finish its job."""
    released = dirs.spills_released().exists()
    columns, feature_col = tuple(spec.read_columns), spec.columns.feature_col
    return [
        SpillJob(s, info, dirs, columns, feature_col, released)
        for s, info in enumerate(infos)
        if info.num_rows
    ]


def fit_first(
    infos: list[ShardInfo], spec: SelectSpec, dirs: WorkDir, runner: Runner, progress: bool
) -> dict[str, Any] | None:
    """Before the check pass, for ``--partition cluster``: the tree fitted on the seeded
    sample (which reads only the sampled rows' row groups), so that the check pass files
    every row under its leaf as it reads it (:func:`~..check.validate.scan_step`). Returns the
    fit's facts and seconds for :func:`plan_partition` (None: another partition)."""
    if spec.partition.partition != "cluster" or one_group(infos, spec):
        return None
    clock = time.perf_counter()
    n_clusters = cluster_count(infos, spec)
    kmeans = fit_cluster_tree(infos, spec, n_clusters, dirs, runner, progress)
    return {"kmeans": kmeans, "fit": time.perf_counter() - clock}


def plan_partition(
    infos: list[ShardInfo],
    spec: SelectSpec,
    dirs: WorkDir,
    runner: Runner,
    progress: bool,
    fitted: dict[str, Any] | None = None,
) -> tuple[list[tuple[str, list]], dict[str, Any]]:
    """Group plan for the chosen partition, and facts about it for the manifest.

    ``fitted``: :func:`fit_first`'s facts, when the tree was fitted before the check pass
    and the check pass wrote the spills (then the spill steps here find them done)."""
    if spec.partition.partition == "shard":
        return plan_by_shard(infos), {}
    if spec.partition.partition == "chunk":
        return plan_by_chunk(infos, spec.partition.chunk_size), {}
    if one_group(infos, spec):
        ((_, pieces),) = plan_by_chunk(infos, spec.partition.chunk_size)
        return [("all rows", pieces)], {"n_clusters": 1, "one_group": True}
    clock = time.perf_counter()
    # 1-2. The k-means centroids and the cuts of clusters too large for one group (fitted
    #    before the check pass, which spilled every shard as it read it, in a run).
    if fitted is None:
        fitted = fit_first(infos, spec, dirs, runner, progress)
        assert fitted is not None
        clock = time.perf_counter()
    seconds = {"fit": fitted["fit"]}
    # 3. Every row filed under its leaf (resumable per shard: done by the check pass, or
    #    here by a read of its own); the driver gets only the leaves' totals back.
    released = dirs.spills_released()
    tree = ClusterTree.load(dirs.tree())

    def spill() -> np.ndarray:
        jobs = spill_jobs(infos, spec, dirs)
        run_steps(runner, SpillShard(), jobs, progress=progress)  # counts stay in files
        index = IndexJob(dirs, tree.n_leaves)  # one step: S counts files to one table
        (offsets,) = run_steps(runner, IndexSpills(), [index], progress=False)
        return np.asarray(offsets["per_leaf"], dtype=np.int64)

    per_leaf = spill()
    seconds["spill"] = time.perf_counter() - clock
    spilled = [s for s, info in enumerate(infos) if info.num_rows]
    # 4. The groups from the totals (neighbouring clusters merged up to --chunk-size,
    #    unless --n-clusters asked for them), then one step per group writes its rows as
    #    one object: every later step of the group opens that, not the S spills.
    merge = spec.partition.n_clusters is None
    units = plan_by_cluster(per_leaf, spec.partition.chunk_size, tree, merge=merge)
    if released.exists() and ungathered(len(units), dirs):  # a group's marker was lost
        released.unlink()
        spill()  # the spills again (the same bytes), for the groups still to gather
    chunk, columns = spec.partition.chunk_size, spec.read_columns
    plan, gather_steps = gather_groups(units, chunk, columns, dirs, runner, progress)
    # 5. Every row is in its group's object now: the spills' disk goes back, since
    #    holding both is twice the corpus on disk (DISK_PER_INPUT_BYTE; docs/scale.md,
    #    "The 10M run"); deleted by steps in batches of shards (again on a resume: a spill
    #    redone since is deleted too).
    batches = [ReleaseJob(dirs, tuple(spilled[i : i + 256])) for i in range(0, len(spilled), 256)]
    run_steps(runner, ReleaseSpills(), batches, progress=False)
    if not released.exists():
        atomic_write_json({"shards": len(spilled)}, released)
    seconds["gather"] = time.perf_counter() - clock - seconds["spill"]
    # the phase's parts (a resumed run's fit is 0): docs/scale.md's plan calibrates on them
    facts = {
        "n_clusters": len(tree.centroids),
        "n_leaves": tree.n_leaves,
        "kmeans": fitted["kmeans"],
        "gather_steps": gather_steps,  # buckets of groups, each opening every spill once
        "seconds": seconds,
    }
    return plan, facts


def disk_needed(infos: list[ShardInfo], partition: str, dirs: WorkDir) -> tuple[int, float]:
    """Bytes the run may still write to its local work dir at its peak (what is there
    already counts as written), and the factor of the input's bytes it used."""
    key = partition
    if partition == "cluster" and dirs.spills_released().exists():
        key = "cluster-gathered"
    factor = DISK_PER_INPUT_BYTE[key]
    written = sum(
        os.path.getsize(os.path.join(root, name))
        for root, _, names in os.walk(dirs.root)
        for name in names
        if os.path.isfile(os.path.join(root, name))
    )
    return max(0, int(factor * sum(i.size_bytes for i in infos)) - written), factor


def check_disk(needed: int, free: int, factor: float, input_bytes: int, where: str) -> None:
    """Refuse a run whose work dir's disk cannot hold what it will write (the 10M run
    filled its disk 91 minutes in); before any step writes."""
    if free >= needed:
        return
    raise OSError(
        f"the work dir {where!r} has {format_bytes(free)} free, and this sharded run will "
        f"write about {format_bytes(needed)} more there at its peak ({factor}x the input's "
        f"{format_bytes(input_bytes)}, less what the work dir holds already; "
        "plan.DISK_PER_INPUT_BYTE). Free some disk or give a work dir on a larger disk "
        "(--work-dir, or an s3:// or gs:// URI); nothing was written."
    )


def check_work_disk(infos: list[ShardInfo], spec: SelectSpec, dirs: WorkDir) -> None:
    """:func:`check_disk` for a local work dir (object storage is not checked)."""
    partition = "chunk" if one_group(infos, spec) else spec.partition.partition
    needed, factor = disk_needed(infos, partition, dirs)
    work = dirs.root
    assert isinstance(work, Path)  # the caller checks
    existing = next(p for p in (work, *work.parents) if p.exists())
    free = shutil.disk_usage(existing).free
    check_disk(needed, free, factor, sum(i.size_bytes for i in infos), str(work))


def fit_cluster_tree(
    infos: list[ShardInfo],
    spec: SelectSpec,
    n_clusters: int,
    dirs: WorkDir,
    runner: Runner,
    progress: bool = False,
) -> dict[str, Any]:
    """Fit the cluster tree of ``--partition cluster`` to ``dirs.tree()`` (unless it is
    there): in one step, or spread over steps (:mod:`.kmeans`) when the sample is above
    ``--kmeans-step-rows``. Returns facts about the fit for the manifest."""
    n_total = sum(i.num_rows for i in infos)
    tree_path = dirs.tree()
    part = spec.partition
    fit = fit_plan(n_clusters, n_total, part.kmeans_sample, part.kmeans_step_rows)
    kmeans: dict[str, Any] = {"spread": fit.spread, "levels": fit.levels}
    if tree_path.exists():
        return kmeans
    if fit.spread:
        # A sample of ROWS_PER_CENTROID rows per centroid, more than one step holds:
        # fitted by steps over its parts, only sums travelling (kmeans.py).
        with tqdm(total=1, desc="k-means fit (spread)", disable=not progress) as bar:
            kmeans = fit_spread(infos, fit, n_clusters, spec, dirs, runner)
            bar.update(1)
        return kmeans
    # A seeded sample, read by steps in parallel (a row sample touches most row groups: one
    # reader took 12-16 s of a 1M run's plan), then the centroids and the cuts of clusters
    # too large for one group: one step, on a worker, on CPU, from the same sample: the
    # partition is the same on any runner.
    part_rows = max(SAMPLE_PART_ROWS, -(-fit.n_sample // SAMPLE_PARTS))
    parts = read_sample_parts(infos, fit.n_sample, part_rows, spec, dirs, runner)
    rows, dims = tuple(int(p["rows"]) for p in parts), {int(p["dim"]) for p in parts}
    if len(dims) > 1:  # the check pass then names the shard (runner._fit_first)
        raise ValueError(f"the k-means sample holds embeddings of widths {sorted(dims)}.")
    dim = dims.pop()
    seed = spec.selector.seed
    job = FitJob(dirs, rows, dim, n_clusters, n_total, part.chunk_size, seed)
    (stats,) = run_steps(runner, FitPartition(), [job], progress=progress)
    peak = max([stats["peak_rss_mb"] or 0, *[p.get("peak_rss_mb") or 0 for p in parts]])
    kmeans.update(sample_rows=stats["sample_rows"], step_peak_rss_mb=peak)
    return kmeans


def plan_groups(
    run: RunContext, infos: list[ShardInfo], k_total: int, fitted: dict[str, Any] | None = None
) -> tuple[list[Group], list[int], dict[str, Any], str]:
    """Phase 2: the groups, each one's share of the budget, and what round 1 asks of it.

    Returns ``(groups, shares, facts, combine)``: ``combine`` is how the groups' results
    become one selection: ``"group"`` (each keeps its share; also a global budget over one
    group), ``"gains"`` (:mod:`..combine.allocate`) or ``"central"`` (one more round over the union
    of the candidates, GreeDi). Under a global budget a group's ``k`` is the candidates it
    proposes (more where an earlier allocation asked for more). ``fitted``: the check
    pass's fit (:func:`fit_first`).
    """
    spec = run.spec
    n_total = sum(i.num_rows for i in infos)
    plan, facts = plan_partition(infos, spec, run.dirs, run.runner, run.progress, fitted)
    groups = make_groups(plan, k_total, spec.selector.seed)
    if sum(g.k for g in groups) != k_total:  # apportion guarantees it; check before writing
        raise RuntimeError("group budgets do not add up to the global k; please report this.")
    shares = [g.k for g in groups]  # by gid (0, 1, ...): one int each, not a dict entry
    if spec.partition.budget == "group" or len(groups) == 1:
        return groups, shares, facts, "group"
    combine = "gains" if allocates_by_gains(spec) else "central"
    if spec.selector.method in MODULAR:  # every row is scored; the merge is exact
        return [replace(g, k=min(g.n, k_total)) for g in groups], shares, facts, combine
    oversample = spec.partition.oversample
    proposed = [replace(g, k=candidate_count(g.n, n_total, k_total, oversample)) for g in groups]
    if combine == "gains":
        asked = names_in(run.dirs.proposals())  # one listing, not one GET a group
        proposed = [
            replace(g, k=wanted(run.dirs, g.gid, g.k)) if run.dirs.want(g.gid).name in asked else g
            for g in proposed
        ]
    return proposed, shares, facts, combine


def budget_k(spec: SelectSpec, n_total: int) -> int:
    """``k``: the settings' own, else ``round(select_ratio * N)``."""
    k = spec.selector.k
    if k is None:
        return k_from_ratio(spec.selector.select_ratio, n_total)
    if k > n_total:
        raise ValueError(
            f"k must be at most the {n_total} documents of the input shards; got k={k}."
        )
    return k
