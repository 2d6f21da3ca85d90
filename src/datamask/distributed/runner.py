"""The driver of a sharded run: five short phases over pure steps, on any executor.

1. **Check.** Footers, then every row of every shard in one streaming pass
   (:mod:`.validate`); the output (and a work dir outside it) is claimed with an exclusive
   lock and its fingerprint, per-shard checksums included, recorded
   (:func:`~.lifecycle.claim`): a shard changed in place is refused on resume.
2. **Plan.** Groups (:mod:`.partition`: k-means clusters by default, or shards, or
   chunks), each one's share of ``k = round(select_ratio * N)`` (or ``--k``) and its seed.
3. **Select.** :func:`~.steps.select_group` on every group without a finished result.
   Under the global budget a group proposes candidates instead of keeping its share.
4. **Combine.** Where the objective allows it, the budget is allocated by the groups'
   gain curves (:mod:`.allocate`: one threshold, no central learner; groups cut off by
   their own candidates propose again); otherwise one more round over the union of the
   candidates (:func:`~.steps.select_global`).
5. **Merge.** The parts are the output dataset; the similarity cap across groups
   (:mod:`.cap`), every row's nearest kept row (:mod:`.cover`, ``OUT/covered/``), keep
   lists for ``apply``, then the manifest.

Layout of a run (``OUT`` is ``--output``, ``WORK`` is ``--work-dir``, default ``OUT/_work``)::

    OUT/selected/part-NNNNN.parquet   the kept ids of group NNNNN (budget group, or gains)
    OUT/selected/part-global.parquet  the central round's selection (id, group, rank, logit)
    OUT/covered/part-NNNNN.parquet    every row of group NNNNN: id, group, selected,
                                      covered_by, covered_sim, covered_exact (:mod:`.cover`)
    OUT/manifest.json                 settings, budget, per-group n / k / seconds / memory
    WORK/settings.json                the settings and input fingerprint this work dir holds
    WORK/groups/, candidates/, completions/   the steps' files (:mod:`.steps`)
    WORK/candidates/NNNNN.want.json   the allocation asked group NNNNN for more candidates
    WORK/completions/global           round 2's stats; written after its parts
    WORK/clusters/...                 the cluster tree (tree.npz) and per-shard spills
    WORK/ids/bucket=B/, ids/done/     id hashes per (shard, bucket); the bucket steps' finds
                                      (:mod:`.validate`)
    WORK/keep/shard=S/, keep/done/    kept rows per (input shard, group) (:mod:`.keeplists`)

Every step writes atomically, its marker last, so a run killed at any point finishes, when
rerun with the same arguments, with the selection an uninterrupted run makes and redoes
only unfinished steps. The executors (:mod:`.executors`, :mod:`.ray_backend`) only schedule.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Iterator
from contextlib import ExitStack
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
from tqdm.auto import tqdm

from .._memory import peak_rss_mb
from .._validation import k_from_ratio
from ..config import SelectSpec
from ..io.atomic import (
    OutputLock,
    atomic_write_json,
    check_no_overlap,
    check_writable,
    clean_stale_temporaries,
)
from ..io.fs import Location, names_in, open_input, storage_path
from ..io.keep import input_names
from ..io.parquet import read_table
from ..io.provenance import record_inputs
from ..io.shards import (
    ShardInfo,
    ShardSource,
    inspect_shards,
    list_shards,
    literal_or_glob,
)
from ..pipeline.given import check_given_terms
from ..pipeline.step import MODULAR
from ..pipeline.writer import run_record
from .allocate import (
    allocate_counts,
    allocates_by_gains,
    compact_marker,
    finish_allocation,
    global_marker,
    knots_of,
    saturated,
    want_path,
    wanted,
    write_allocated,
)
from .cap import cap_across_groups
from .cover import cover_round
from .exchange import exchange_applies, exchange_path, exchange_round
from .executors import LocalRunner, Runner, group_memory_bytes
from .fit import fit_partition
from .given import (
    check_given_selection,
    given_files,
    kept_counts,
    prepare_kept,
    rate_totals,
)
from .keeplists import keep_round
from .lifecycle import claim, fingerprint, read_marker
from .partition import (
    ClusterTree,
    GroupSpec,
    default_clusters,
    make_groups,
    plan_by_chunk,
    plan_by_cluster,
    plan_by_shard,
    sample_plan,
    spill_path,
    spill_shard,
)
from .steps import (
    candidate_count,
    candidates_path,
    completion_path,
    part_path,
    select_global,
    select_group,
)
from .validate import (
    QualityRange,
    check_scans,
    dropped_on_error,
    id_buckets_dir,
    scan_jobs,
    scan_step,
)

__all__ = ["run_selection"]


# --- the driver -----------------------------------------------------------------------------
def _progress_map(
    runner: Runner, fn: Callable[..., Any], jobs: list[tuple], desc: str, progress: bool
) -> Iterator[Any]:
    """``runner.map(fn, jobs)`` under a progress bar counting shards (results as they come)."""
    results = runner.map(fn, jobs)
    return tqdm(results, total=len(jobs), desc=desc, unit="shard", disable=not progress)


def _plan(
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
    if not tree_path.exists():
        # 1-2. A seeded sample (row groups of the shards that have sampled rows), the
        #    centroids and the cuts of clusters too large for one group: one step, on a
        #    worker, on CPU, from the same sample: the partition is the same on any runner.
        wanted = sample_plan(infos, settings.partition.kmeans_sample, settings.selector.seed)
        jobs = [(s, infos[s], rows, settings.columns.feature_col) for s, rows in wanted.items()]
        chunk, seed = settings.partition.chunk_size, settings.selector.seed
        fit = (jobs, n_clusters, n_total, chunk, seed, str(tree_path))
        with tqdm(total=1, desc="k-means fit", disable=not progress) as bar:
            list(runner.map(fit_partition, [fit], whole_machine=True))
            bar.update(1)
    # 3. One streaming pass filing every row under its leaf (resumable per shard).
    jobs = [
        (s, info, str(tree_path), str(folder), settings.read_columns, settings.columns.feature_col)
        for s, info in enumerate(infos)
        if info.num_rows
    ]
    counts = dict(_progress_map(runner, spill_shard, jobs, "assign clusters", progress))
    spills = [(str(spill_path(folder, s)), counts[s]) for s, *_ in jobs]
    tree = ClusterTree.load(tree_path)
    # neighbouring clusters merged up to --chunk-size, unless --n-clusters asked for them
    merge = settings.partition.n_clusters is None
    plan = plan_by_cluster(spills, settings.partition.chunk_size, tree, merge=merge)
    facts = {"n_clusters": len(tree.centroids), "n_leaves": tree.n_leaves}
    return plan, facts


def _width(path: str, feature_col: str) -> int:
    """Embedding width in ``path``: its fixed list size, else the first row's length."""
    with open_input(path) as fh:
        parquet = pq.ParquetFile(fh)
        kind = parquet.schema_arrow.field(feature_col).type
        if pa.types.is_fixed_size_list(kind):
            return int(kind.list_size)
        return len(parquet.read_row_group(0, columns=[feature_col]).column(0)[0])


def _select_groups(
    groups: list[GroupSpec],
    settings: SelectSpec,
    work: Path,
    out: Path,
    quality_range: QualityRange,
    propose: bool,
    totals: tuple[int, int] | None,
    runner: Runner,
    stats: dict[int, dict[str, Any]],
    desc: str,
    progress: bool,
    rate: tuple[int, int] | None = None,
) -> int:
    """Run :func:`select_group` for every group without a finished result (a marker for
    its candidate count and its file); fills ``stats``, returns the documents computed."""

    def result_path(gid: int) -> Path:
        return candidates_path(work, gid) if propose else part_path(out, gid)

    # Which groups are done: one listing of the markers and one of the results, then only
    # the markers present are read (not one exists() request per group on object storage).
    markers = names_in(completion_path(work, 0).parent)
    results = names_in(result_path(0).parent)
    pending = []
    for g in groups:
        marker = completion_path(work, g.gid)
        present = marker.name in markers and result_path(g.gid).name in results
        done = read_marker(marker) if present else None
        if done is not None and done.get("k") == g.k:
            stats[g.gid] = compact_marker({**done, "reused": True})
        else:
            if marker.name in markers:  # a marker without its result: redo the group
                marker.unlink(missing_ok=True)
            pending.append(g)
    started = time.perf_counter()
    done_docs = 0
    bar = tqdm(
        total=len(groups),
        initial=len(groups) - len(pending),  # a resumed run starts where the last one stopped
        desc=desc,
        unit="group",
        disable=not progress,
        dynamic_ncols=True,
    )
    try:
        jobs = [
            (g, settings, str(work), str(out), quality_range, propose, totals, rate)
            for g in pending
        ]
        width = _width(pending[0].pieces[0].path, settings.columns.feature_col) if pending else 0
        # given KEPT, every step also reads its kept rows (float32, and a copy for torch)
        kept = kept_counts(work)["n_kept"] if settings.selector.given is not None else 0
        memory = [group_memory_bytes(g.n, width) + 8 * kept * width for g in pending]
        for result in runner.map(select_group, jobs, use_gpu=True, memory=memory):
            stats[result["gid"]] = compact_marker(result)
            done_docs += result["n"]
            elapsed = time.perf_counter() - started
            bar.set_postfix(docs_per_s=f"{done_docs / max(elapsed, 1e-9):,.0f}")
            bar.update(1)
    finally:
        bar.close()
    markers = names_in(completion_path(work, 0).parent)
    missing = [g.gid for g in groups if completion_path(work, g.gid).name not in markers]
    if missing:
        raise RuntimeError(f"groups {missing[:10]} did not complete; rerun to resume.")
    return sum(g.n for g in pending)


def _allocate(
    groups: list[GroupSpec],
    settings: SelectSpec,
    work: Path,
    out: Path,
    quality_range: QualityRange,
    totals: tuple[int, int],
    runner: Runner,
    stats: dict[int, dict[str, Any]],
    progress: bool,
    k_total: int,
) -> tuple[dict[str, Any], list[GroupSpec]]:
    """Round 2 of a budget allocated by gains (:mod:`.allocate`): the threshold from every
    group's knots, then again for groups whose whole curve was kept (they propose twice as
    many), then every group's kept prefix written as its part; the marker last.
    ``totals``: the ``(k, N)`` of the gains' units (:func:`~.given.rate_totals`);
    ``k_total``: the budget."""
    knots = {g: knots_of(s) for g, s in stats.items()}  # read once, not into the manifest
    centroids = {g: s.pop("centroid", None) for g, s in stats.items()}
    done = read_marker(global_marker(work))
    if done is not None:
        return {**done, "reused": True}, groups
    started = time.perf_counter()
    rounds = 1
    while True:
        counts = allocate_counts(
            [knots[g.gid] for g in groups],
            [g.k for g in groups],
            lambda i, lo, hi: (
                read_table(candidates_path(work, groups[i].gid), columns=["gain"])
                .column(0)
                .to_numpy()[lo:hi]
            ),
            k_total,
        )
        cut_off = saturated(counts, [g.k for g in groups], [g.n for g in groups])
        if not cut_off:
            break
        # Groups cut off by their own candidate count propose again, twice as many.
        for i in cut_off:
            g = groups[i]
            groups[i] = replace(g, k=min(g.n, 2 * g.k))
            atomic_write_json({"candidates": groups[i].k}, want_path(work, g.gid))
            completion_path(work, g.gid).unlink(missing_ok=True)
        again = [groups[i] for i in cut_off]
        fresh: dict[int, dict[str, Any]] = {}
        _select_groups(
            again,
            settings,
            work,
            out,
            quality_range,
            True,
            totals,
            runner,
            fresh,
            f"propose more ({rounds})",
            progress,
        )
        for gid, s in fresh.items():
            knots[gid], centroids[gid] = knots_of(s), s.pop("centroid", None)
            stats[gid] = s
        rounds += 1
    source, exchange_started = candidates_path, time.perf_counter()
    if exchange_applies(settings):  # every group re-prices above its neighbours' cover
        counts = exchange_round(
            groups,
            counts,
            centroids,
            settings,
            work,
            quality_range,
            totals,
            runner,
            progress,
            k_total=k_total,
        )
        source = exchange_path
    exchange_s = time.perf_counter() - exchange_started
    allocate_s = time.perf_counter() - started
    jobs = [
        (
            g.gid,
            int(m),
            settings,
            str(work),
            str(part_path(out, g.gid)),
            str(source(work, g.gid)),
        )
        for g, m in zip(groups, counts, strict=True)
    ]
    written = list(_progress_map(runner, write_allocated, jobs, "write", progress))
    seconds = {
        "allocate": allocate_s - exchange_s,
        "exchange": exchange_s,
        "write": time.perf_counter() - started - allocate_s,
        "total": time.perf_counter() - started,
    }
    n_candidates = sum(g.k for g in groups)
    global_stats = finish_allocation(work, counts, written, n_candidates, rounds, seconds)
    return {**global_stats, "reused": False}, groups


def _summary(stats: list[dict[str, Any]]) -> dict[str, Any]:
    secs = np.asarray([s["seconds"]["total"] for s in stats], dtype=np.float64)
    rss = [s["peak_rss_mb"] for s in stats if s.get("peak_rss_mb") is not None]
    gpu = [s["gpu_peak_mb"] for s in stats if s.get("gpu_peak_mb") is not None]
    return {
        "group_seconds": {
            "min": float(secs.min()),
            "median": float(np.median(secs)),
            "mean": float(secs.mean()),
            "max": float(secs.max()),
            "sum": float(secs.sum()),
        },
        "peak_rss_mb_per_worker": max(rss) if rss else None,
        "gpu_peak_mb_per_worker": max(gpu) if gpu else None,
        "workers_seen": len({(s["host"], s["pid"]) for s in stats}),
        "devices": sorted({s["device"] for s in stats}),
    }


def run_selection(
    source: ShardSource,
    output: str | Path,
    settings: SelectSpec | None = None,
    *,
    runner: Runner | None = None,
    work_dir: str | Path | None = None,
    progress: bool = True,
    given: tuple[Any, Any] | None = None,
) -> dict[str, Any]:
    """Select ``round(select_ratio * N)`` (or ``k``) documents from a sharded corpus,
    resumably; given documents already kept (``settings.selector.given``), from the input
    only, counting coverage above them (:mod:`.given`).

    Parameters
    ----------
    source : str, Path, list of paths or pyarrow.dataset.FileSystemDataset
        Parquet shards (see :func:`datamask.io.shards.list_shards`).
    output : str or Path
        Output folder: ``selected/part-*.parquet`` and ``manifest.json``.
    settings : SelectSpec, optional
        Learner and partition settings (default ``SelectSpec()``).
    runner : Runner, optional
        Scheduler; default :class:`LocalRunner`.
    work_dir : str or Path, optional
        Where per-group results and completion markers go (default ``output/_work``).
    progress : bool, default=True
        Progress bars over shards and groups.
    given : (str, str or None), optional
        Where the steps read ``--given`` and ``--given-selection`` (default: the
        settings' ``given`` and ``given_selection``).

    Returns
    -------
    dict
        The manifest also written to ``output/manifest.json``.

    Raises
    ------
    ValueError
        Bad settings, no shards, a missing or corrupt shard (named), or a work dir that
        holds a run with other settings. Nothing is written for a group that fails.
    """
    started = time.perf_counter()
    settings = (settings or SelectSpec()).check()
    runner = runner or LocalRunner()
    # Absolute paths: steps run in other processes, on other nodes of a cluster, in other
    # working directories; a relative path would resolve there against another folder.
    # s3:// and gs:// stay URIs, read and written in place by the steps (nothing of the
    # input or the work dir is copied to the driver).
    out = storage_path(output)
    if out.is_file():
        raise ValueError(
            f"--output {str(out)!r} is a file; sharded selection writes a folder "
            "(selected/ parts and manifest.json)."
        )
    work = storage_path(work_dir) if work_dir is not None else out / "_work"
    if isinstance(work, Path):
        check_writable(work, folder=True)

    # Output and work dir never overlap the input: not the input folder itself, and no
    # input shard inside them (folders inside the input folder are skipped when listing).
    if isinstance(source, str | Path) and literal_or_glob(str(source)) == "literal":
        check_no_overlap([out, work], [source])
    files = [storage_path(f) for f in list_shards(source, exclude=[out, work])]
    check_no_overlap([out, work], files)
    if given is not None and given[0] is not None:  # --given is read, never written
        check_no_overlap([out, work], [g for g in given if g])
    # Claim the output (and a work dir outside it) before any computation: a second run
    # writing the same folder is refused here, and an unwritable folder fails here.
    with ExitStack() as claims:  # released in reverse; on an error, made folders go too
        # (object storage has no lock: one run writes a remote output at a time, docs/remote.md)
        if isinstance(out, Path):
            claims.enter_context(OutputLock(out, folder=True))
        if isinstance(work, Path) and not _inside(work, out):
            claims.enter_context(OutputLock(work, folder=True))
        if given is None:
            given = (settings.selector.given, settings.selector.given_selection)
        run = _Run(source, files, out, work, settings, runner, progress, given)
        return _run_claimed(run, started)


def _inside(work: Path | Location, out: Path | Location) -> bool:
    """Whether the work dir lies inside the output (then the output's claim covers it)."""
    if isinstance(work, Path) and isinstance(out, Path):
        return work.resolve().is_relative_to(out.resolve())
    return str(work).startswith(str(out).rstrip("/") + "/")


@dataclass
class _Run:
    """What every phase of one claimed run reads: its input, places, settings and runner."""

    source: ShardSource
    files: list[Path | Location]
    out: Path | Location
    work: Path | Location
    settings: SelectSpec
    runner: Runner
    progress: bool
    given: tuple[Any, Any] = (None, None)  # --given and --given-selection, as steps read them


def _check_inputs(
    run: _Run,
) -> tuple[list[ShardInfo], list[ShardInfo], dict[str, str], QualityRange]:
    """Phase 1: footers (row counts, columns), then every row of every shard, and of
    ``--given``'s with them (one width, one id type, no id in both, one quality range);
    nothing is written for a run whose input is bad, and no group starts before all are
    checked. Returns the input's shards, ``--given``'s, the checksums and the range."""
    infos = inspect_shards(run.files, columns=run.settings.read_columns)
    if sum(i.num_rows for i in infos) == 0:
        raise ValueError(f"the {len(infos)} input shard(s) hold no rows.")
    docs: list[ShardInfo] = []
    if run.given[0] is not None:
        check_given_terms(run.settings.objective)
        docs = inspect_shards(given_files(run.given[0]), columns=run.settings.columns.read)
    # The validation pass runs before any cluster is started: a RayRunner not yet
    # connected hands it to a local pool, so bad input fails before Ray starts.
    checker = getattr(run.runner, "validation_runner", lambda: run.runner)()
    ids_dir = id_buckets_dir(run.work)  # written by the scans, read by the bucket steps
    try:
        jobs = scan_jobs(infos + docs, run.settings, ids_dir)
        scans = list(_progress_map(checker, scan_step, jobs, "check inputs", run.progress))
        checksums, quality_range = check_scans(
            scans, infos + docs, run.settings, checker, ids_dir, len(infos) if docs else None
        )
        if run.given[1] is not None:  # every id of --given-selection is in --given
            list(checker.map(check_given_selection, [(run.given, run.settings.columns)]))
    finally:
        if checker is not run.runner:
            checker.close()
    return infos, docs, checksums, quality_range


def _plan_groups(
    run: _Run, infos: list[ShardInfo], k_total: int
) -> tuple[list[GroupSpec], dict[int, int], dict[str, Any], str]:
    """Phase 2: the groups, each one's share of the budget, and what round 1 asks of it.

    Returns ``(groups, shares, facts, combine)``: ``combine`` is how the groups' results
    become one selection: ``"group"`` (each keeps its share; also a global budget over one
    group), ``"gains"`` (:mod:`.allocate`) or ``"central"`` (one more round over the union
    of the candidates, GreeDi). Under a global budget a group's ``k`` is the candidates it
    proposes (more where an earlier allocation asked for more).
    """
    settings = run.settings
    n_total = sum(i.num_rows for i in infos)
    plan, facts = _plan(infos, settings, run.work, run.runner, run.progress)
    groups = make_groups(plan, k_total, settings.selector.seed)
    if sum(g.k for g in groups) != k_total:  # apportion guarantees it; check before writing
        raise RuntimeError("group budgets do not add up to the global k; please report this.")
    shares = {g.gid: g.k for g in groups}
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


def _central_round(
    run: _Run, groups: list[GroupSpec], k_total: int, quality_range: QualityRange
) -> dict[str, Any]:
    """Phase 4 (central): one selection of exactly ``k`` over the union of the candidates,
    on one worker that may use the whole machine."""
    job = (groups, run.settings, str(run.work), str(run.out), k_total, quality_range)
    with tqdm(total=1, desc="global round", disable=not run.progress) as bar:
        results = run.runner.map(select_global, [job], use_gpu=True, whole_machine=True)
        stats = list(results)[0]
        bar.update(1)
    return stats


def _budget(settings: SelectSpec, n_total: int) -> int:
    """``k``: the settings' own, else ``round(select_ratio * N)``."""
    k = settings.selector.k
    if k is None:
        return k_from_ratio(settings.selector.select_ratio, n_total)
    if k > n_total:
        raise ValueError(
            f"k must be at most the {n_total} documents of the input shards; got k={k}."
        )
    return k


def _run_claimed(run: _Run, started: float) -> dict[str, Any]:
    """:func:`run_selection` once the output is claimed: five phases."""
    source, out, work = run.source, run.out, run.work
    settings, runner, progress = run.settings, run.runner, run.progress
    # 1. Check every row (and --given's), then claim the work dir for these inputs and
    #    settings (--given's files in the fingerprint too: changed, a resume is refused).
    with dropped_on_error(id_buckets_dir(work)):  # a run refused here leaves nothing
        infos, docs, checksums, quality_range = _check_inputs(run)
        n_total = sum(i.num_rows for i in infos)
        k_total = _budget(settings, n_total)
        record = fingerprint(settings, infos + docs, checksums)
        resumed = claim(work, out, record)
    #    Given KEPT: its kept rows written once for the groups.
    kept = None
    if docs:
        with tqdm(total=1, desc="given: kept rows", disable=not progress) as bar:
            kept = list(runner.map(prepare_kept, [(settings, str(work), run.given)]))[0]
            bar.update(1)
    rate = rate_totals(k_total, n_total, kept)
    # 2. Plan the groups.
    groups, shares, plan_facts, combine = _plan_groups(run, infos, k_total)
    two_rounds = combine != "group"
    totals = rate if combine == "gains" else None
    plan_s = time.perf_counter() - started

    # 3. Select every group, or let it propose candidates (round 1).
    stats: dict[int, dict[str, Any]] = {}
    select_started = time.perf_counter()
    desc = "propose candidates" if two_rounds else "select groups"
    n_pending_docs = _select_groups(
        groups,
        settings,
        work,
        out,
        quality_range,
        two_rounds,
        totals,
        runner,
        stats,
        desc,
        progress,
        rate,
    )
    select_s = time.perf_counter() - select_started

    # 4. Combine (round 2): allocate the budget by gains, or the central round.
    global_started = time.perf_counter()
    global_stats = None
    if combine == "gains":
        global_stats, groups = _allocate(
            groups, settings, work, out, quality_range, totals, runner, stats, progress, k_total
        )
    elif combine == "central":
        global_stats = _central_round(run, groups, k_total, quality_range)
    global_s = time.perf_counter() - global_started if two_rounds else 0.0

    # 5. Merge: the parts are the output dataset (stray temporaries of killed runs go),
    #    the similarity cap across groups, keep lists for `apply`, and the manifest.
    clean_stale_temporaries(out / "selected")
    ordered = [{**stats[g.gid], "share": shares[g.gid]} for g in groups]
    cap_facts = None
    if settings.selector.max_similarity is not None and not two_rounds:
        cap_facts = cap_across_groups(groups, settings, work, out, progress=progress)
    elif global_stats is not None and settings.selector.max_similarity is not None:
        cap_facts = {"applied_in": "global round", "threshold": settings.selector.max_similarity}
    k_selected = global_stats["k"] if global_stats else int(sum(s["k"] for s in ordered))
    if k_selected != k_total:  # every path guarantees it; check before marking complete
        raise RuntimeError(f"selected {k_selected} documents, not {k_total}; please report this.")
    # 6. Cover: every row's nearest kept row, written by the groups (OUT/covered/).
    cover_facts = None
    if not settings.run.selected_only:
        clean_stale_temporaries(out / "covered")
        cover_facts = cover_round(groups, settings, work, out, quality_range, runner, progress)
    keep = keep_round(groups, infos, settings.columns.id_col, run, runner, progress)
    total_s = time.perf_counter() - started
    computed = [s for s in ordered if not s["reused"]]
    allocating = combine == "gains"
    manifest = {
        **run_record(
            settings,
            n_docs=n_total,
            k=k_selected,
            terms=global_stats["terms"] if global_stats else None,
            sharded=True,
        ),
        **record,
        "complete": True,
        "input": {"source": str(source), "n_shards": len(infos), "n_docs": n_total},
        "partition": {
            "by": settings.partition.partition,
            "n_groups": len(groups),
            "chunk_size": settings.partition.chunk_size,
            **plan_facts,
        },
        "runner": getattr(runner, "describe", lambda: {"runner": runner.name})(),
        "work_dir": str(work),
        "budget": {
            "mode": "global" if two_rounds else "group",
            "allocation": "gains" if allocating else ("central round" if two_rounds else None),
            "method": settings.selector.method,
            "oversample": settings.partition.oversample if two_rounds else None,
            "candidates": global_stats["n_candidates"] if global_stats else None,
            "quality_range": {
                name: [quality_range[0][j], quality_range[1][j]]
                for j, name in enumerate(settings.columns.quality_cols)
            },
            "global_round": global_stats,
        },
        "output": {
            "selected": str(out / "selected"),
            "parts": 1 if two_rounds and not allocating else len(groups),
            "k": k_total,
            "covered": None if cover_facts is None else cover_facts["dataset"],
        },
        "totals": {
            "n_docs": n_total,
            "k": k_selected,
            "n_groups": len(groups),
            "groups_computed": len(computed),
            "groups_reused": len(groups) - len(computed),
            "resumed": resumed,
            "seconds": {
                "plan": plan_s,
                "select": select_s,
                "global": global_s,
                "cover": None if cover_facts is None else cover_facts["seconds"]["total"],
                "total": total_s,
            },
            "docs_per_second": n_total / total_s,
            "select_docs_per_second": n_pending_docs / select_s if n_pending_docs else None,
            "driver_peak_rss_mb": peak_rss_mb(),
        },
        "max_similarity": cap_facts,
        "cover": cover_facts,
        "selection_digest": keep["selection"],
        "provenance": record_inputs(  # what `apply` and `evaluate` check their input against
            [i.path for i in infos],
            input_names(source, [i.path for i in infos]),
            settings.read_columns,
            id_col=settings.columns.id_col,
            checksums=checksums,
        ),
        "summary": {
            **_summary(ordered),
            "peak_rss_mb_global_round": global_stats["peak_rss_mb"] if global_stats else None,
        },
        "summary_computed": _summary(computed) if computed else None,
        "groups": ordered,
    }
    if kept is not None:
        manifest["given"] = _given_block(run, kept, ordered, n_total, rate, quality_range)
        manifest["terms_union"] = None  # not computed in a sharded run: the block says why
        manifest["provenance"]["given"] = record_inputs(
            [i.path for i in docs],
            input_names(run.given[0], [i.path for i in docs]),
            settings.columns.read,
            id_col=settings.columns.id_col,
            checksums=checksums,
        )
    atomic_write_json(manifest, out / "manifest.json")
    return manifest


def _given_block(
    run: _Run,
    kept: dict[str, Any],
    ordered: list[dict[str, Any]],
    n_total: int,
    rate: tuple[int, int],
    quality_range: QualityRange,
) -> dict[str, Any]:
    """The manifest's ``given``, as the one-file summary's: KEPT, its counts, the quality
    scale and the floors (mean over the input, methods, from the groups' stats)."""
    floors = [s["floor"] for s in ordered if s.get("floor")]
    return {
        "source": str(run.settings.selector.given),
        "selection": run.settings.selector.given_selection,
        "n_docs": kept["n_docs"],
        "n_kept": kept["n_kept"],
        "quality_scale": "min-max over --given and --input together",
        "quality_range": [list(quality_range[0]), list(quality_range[1])],
        "floor": {
            "method": sorted({f["method"] for f in floors}),
            "mean": sum(f["sum"] for f in floors) / n_total,
            "seconds": sum(f["seconds"] for f in floors),
        },
        "rate_totals": {"k": rate[0], "n_docs": rate[1]},
        "kept_rows": {"seconds": kept["seconds"], "peak_rss_mb": kept.get("peak_rss_mb")},
        "terms_union": (
            "not computed in a sharded run: it needs every row of --given and of the input "
            "against KEPT ∪ S; score it with datamask evaluate --given"
        ),
    }
