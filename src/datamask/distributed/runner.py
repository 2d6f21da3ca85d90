"""Corpus-scale selection: plan groups, select per group, one global round, resume.

Layout of a run (``OUT`` is ``--output``, ``WORK`` is ``--work-dir``, default ``OUT/_work``)::

    OUT/selected/part-global.parquet  budget="global": the selection (id, group, rank, logit)
    OUT/selected/part-NNNNN.parquet   budget="group": selected ids of group NNNNN
    OUT/manifest.json                 settings, budget, per-group n / k / seconds / memory
    WORK/settings.json                the settings and input fingerprint this work dir holds
    WORK/groups/NNNNN.parquet         every row of the group: id, logit, probability, rank,
                                      selected (skipped with ``selected_only``)
    WORK/candidates/NNNNN.parquet     budget="global", round 1: the group's candidates
    WORK/completions/NNNNN            JSON stats; written last, after the group's files
    WORK/completions/global           round 2's stats; written after part-global.parquet
    WORK/clusters/...                 centroids and per-shard cluster spills (by="cluster")

Every group scales its quality by the corpus-wide range of each quality column, found by
the validation pass. With ``budget="global"`` (the default) each group proposes
``ceil(oversample * k * n_g / N)`` candidates and :func:`select_global` selects exactly
``k = round(select_ratio * N)`` from their union; with ``budget="group"`` each group keeps
its apportioned share.

Before any group runs, the output (and a work dir outside it) is claimed with an
exclusive lock, and every row of every shard is checked in one streaming pass
(:mod:`.validate`); its per-shard checksums of the bytes read go into the fingerprint that
``WORK/settings.json`` records, so a shard changed in place is refused on resume.

:func:`select_group` is a pure step: it reads only its group's rows, runs the learner and
writes its files atomically (temporary name, then ``os.replace``), the completion marker
last. A rerun with the same arguments skips every group that has a marker, so a run
killed at any point finishes with the selection an uninterrupted run makes and redoes only
unfinished groups. :class:`LocalRunner` and :class:`~datamask.distributed.ray_backend.RayRunner`
differ only in how they schedule steps.
"""

from __future__ import annotations

import hashlib
import json
import math
import os
import socket
import sys
import time
from collections.abc import Callable, Iterable, Iterator
from contextlib import ExitStack
from dataclasses import replace
from pathlib import Path
from typing import Any, Protocol

import numpy as np
import pyarrow as pa
from tqdm.auto import tqdm

from .._device import set_threads
from .._memory import peak_rss_mb
from .._validation import k_from_ratio
from ..config import SelectSpec
from ..data import Corpus, Selection, rank_order
from ..io.atomic import (
    OutputLock,
    atomic_write,
    atomic_write_json,
    check_no_overlap,
    check_writable,
    clean_stale_temporaries,
)
from ..io.keep import input_names, keep_lists_for_output
from ..io.parquet import atomic_write_table, read_table
from ..io.provenance import record_inputs
from ..io.shards import (
    ShardInfo,
    ShardSource,
    corpus_from_tables,
    inspect_shards,
    list_shards,
    literal_or_glob,
    read_rows,
    scan_shard,
)
from ..pipeline.step import MODULAR, fit_group
from ..pipeline.writer import run_record, selection_table
from .allocate import (
    allocate_counts,
    allocates_by_gains,
    finish_allocation,
    gain_knots,
    gains_in_j_units,
    global_marker,
    group_spec,
    knots_of,
    monotone,
    saturated,
    want_path,
    wanted,
    write_allocated,
)
from .lifecycle import abort_pool, read_marker, worker_init
from .partition import (
    GroupSpec,
    fit_centroids,
    make_groups,
    plan_by_chunk,
    plan_by_cluster,
    plan_by_shard,
    read_sample,
    sample_plan,
    spill_shard,
)
from .validate import QualityRange, check_scans, scan_jobs

__all__ = [
    "read_group",
    "select_group",
    "select_global",
    "candidate_count",
    "LocalRunner",
    "Runner",
    "run_selection",
]


# --- the pure step --------------------------------------------------------------------------
def _group_name(gid: int) -> str:
    return f"{gid:05d}"


def completion_path(work_dir: str | Path, gid: int) -> Path:
    """The marker a finished group leaves behind."""
    return Path(work_dir) / "completions" / _group_name(gid)


def part_path(out_dir: str | Path, gid: int) -> Path:
    """The selected-ids file of one group in the output dataset."""
    return Path(out_dir) / "selected" / f"part-{_group_name(gid)}.parquet"


def candidates_path(work_dir: str | Path, gid: int) -> Path:
    """Round 1 of a global budget: the candidates one group proposes."""
    return Path(work_dir) / "candidates" / f"{_group_name(gid)}.parquet"


GLOBAL_PART = "part-global.parquet"


def read_group(
    spec: GroupSpec, settings: SelectSpec, quality_range: QualityRange | None = None
) -> tuple[Any, pa.Array]:
    """The rows of one group as a Corpus (not yet validated) and its ids as stored.

    ``quality_range`` is the corpus-wide ``(lows, highs)`` of the quality columns that
    the group scales its quality with (default: its own range).
    """
    tables = [
        (
            read_rows(p.path, p.start, p.stop, settings.read_columns),
            f"{p.path} (rows {p.start}-{p.stop})",
        )
        for p in spec.pieces
    ]
    corpus, ids = corpus_from_tables(
        tables,
        settings.columns,
        source=f"group {spec.gid} ({spec.label})",
        quality_range=quality_range or None,
    )
    for name in settings.objective.columns:  # what the terms read (requires_columns)
        corpus.extra[name] = np.concatenate(
            [t.column(name).to_numpy(zero_copy_only=False) for t, _ in tables]
        )
    return corpus, ids


def candidate_count(n_g: int, n_total: int, k_total: int, oversample: float) -> int:
    """Candidates a group of ``n_g`` rows proposes: ``ceil(oversample * k * n_g / N)``.

    At least 1 and at most ``n_g``; since every group proposes at least its exact quota
    ``k * n_g / N``, the union holds at least ``k`` documents.

    Examples
    --------
    >>> candidate_count(10_000, 1_000_000, 100_000, 2.0)
    2000
    """
    if n_g == 0:
        return 0
    return int(min(n_g, max(1, math.ceil(oversample * k_total * n_g / n_total - 1e-9))))


def _where_it_ran(sel: Selection) -> dict[str, Any]:
    """The stats every step records besides its counts and times: memory, device, process
    and the terms of its selection."""
    return {
        "peak_rss_mb": peak_rss_mb(),
        "gpu_peak_mb": sel.meta["gpu_peak_mb"],
        "device": sel.meta["device"],
        "host": socket.gethostname(),
        "pid": os.getpid(),
        "terms": sel.meta["terms"],
    }


def select_group(
    spec: GroupSpec,
    settings: SelectSpec,
    work_dir: str | Path,
    out_dir: str | Path,
    quality_range: QualityRange | None = None,
    propose: bool = False,
    totals: tuple[int, int] | None = None,
) -> dict[str, Any]:
    """Select ``spec.k`` documents of one group and write its files; a pure, resumable step.

    Reads only the group's rows (quality scaled by the corpus-wide ``quality_range``), runs
    the method with ``spec.seed``, then writes ``WORK/groups/NNNNN.parquet`` (unless
    ``settings.run.selected_only``), its result, and last the marker ``WORK/completions/NNNNN``.
    The result is ``OUT/selected/part-NNNNN.parquet`` (ids kept); with ``propose`` (round 1
    of a global budget) it is ``WORK/candidates/NNNNN.parquet`` instead: the ``spec.k``
    candidates with their rank, score, raw quality and embedding (score and rank only for
    :data:`MODULAR` methods), which :func:`select_global` reads. With ``totals``, the
    corpus' ``(k, N)``, the group proposes for a budget allocated by gains instead
    (:mod:`datamask.distributed.allocate`): it selects at the corpus' exchange rate between
    quality and coverage and writes its candidates in greedy order with their marginal
    gains in ``J`` units (id, group, rank, gain). When the marker exists already the step
    returns its stats without recomputing.

    Returns
    -------
    dict
        Stats of the group: ``gid``, ``label``, ``n``, ``k``, ``seconds`` (read, fit,
        write, total), ``docs_per_second``, ``peak_rss_mb``, ``gpu_peak_mb``, ``device``,
        ``host``, ``pid``, ``terms`` and ``reused``.
    """
    marker = completion_path(work_dir, spec.gid)
    if marker.exists():
        return {**json.loads(marker.read_text()), "reused": True}
    started = time.perf_counter()
    # 1. Read only this group's rows (row groups overlapping each piece).
    corpus, ids = read_group(spec, settings, quality_range)
    n = corpus.n_docs
    read_s = time.perf_counter() - started

    # 2. Run the method for exactly k (nothing to learn when k is 0 or n): the one step.
    #    Proposing for an allocated budget: at the corpus' exchange rate, with the gain curve.
    fit_settings = settings if totals is None else group_spec(settings, spec.k, n, *totals)
    sel = fit_group(
        corpus, spec.k, fit_settings, seed=spec.seed, stored_ids=ids, gain_curve=totals is not None
    )
    fit_s = time.perf_counter() - started - read_s

    # 3. Write the group's files atomically (the writer ranks: kept rows first, then by
    #    score, ties by id), then the marker.
    id_col = settings.columns.id_col
    if not settings.run.selected_only or settings.selector.max_similarity is not None:
        atomic_write_table(
            selection_table(sel, id_col=id_col, stored_ids=ids, group=spec.gid, probability=True),
            Path(work_dir) / "groups" / f"{_group_name(spec.gid)}.parquet",
        )
    knots = None
    if propose and totals is not None:
        order, gains = sel.meta["gain_order"]
        logits = sel.logits if sel.logits is not None else sel.scores  # as the writer's
        lamb, lamb_g = settings.objective.lamb, fit_settings.objective.lamb
        gains = monotone(gains_in_j_units(gains, lamb, lamb_g, spec.k, n, *totals))
        table = pa.table(
            {
                id_col: ids.take(pa.array(order)),
                "group": pa.array(np.full(len(order), spec.gid, dtype=np.int32)),
                "rank": pa.array(np.arange(1, len(order) + 1, dtype=np.int64)),
                "logit": pa.array(np.asarray(logits, np.float32)[order]),
                "gain": pa.array(gains),
            }
        )
        atomic_write_table(table, candidates_path(work_dir, spec.gid))
        knots = [a.tolist() for a in gain_knots(gains)]  # what the allocation reads first
    elif propose:
        extra: dict[str, Any] = {"score": sel.scores}
        if settings.selector.method not in MODULAR:  # what the global round selects from
            for j in range(len(settings.columns.quality_cols)):
                extra[f"quality_{j}"] = corpus.quality[:, j]
            feats = np.ascontiguousarray(corpus.features, dtype=np.float32)
            extra["features"] = pa.FixedSizeListArray.from_arrays(
                pa.array(feats.reshape(-1)), corpus.dim
            )
            for name in settings.objective.columns:  # the terms' columns, for round 2
                extra[f"extra_{name}"] = corpus.extra[name]
        table = selection_table(
            sel, id_col=id_col, stored_ids=ids, group=spec.gid, kept_only=True, extra=extra
        )
        atomic_write_table(table, candidates_path(work_dir, spec.gid))
    else:
        table = selection_table(sel, id_col=id_col, stored_ids=ids, group=spec.gid, kept_only=True)
        atomic_write_table(table, part_path(out_dir, spec.gid))
    del corpus
    total_s = time.perf_counter() - started
    stats = {
        "gid": spec.gid,
        "label": spec.label,
        "n": n,
        "k": len(sel.selected),
        "seed": spec.seed,
        "seconds": {
            "read": read_s,
            "fit": fit_s,
            "write": total_s - read_s - fit_s,
            "total": total_s,
        },
        "docs_per_second": n / total_s if total_s > 0 else None,
        **_where_it_ran(sel),
    }
    if knots is not None:
        stats["gain_knots"] = knots
    atomic_write_json(stats, marker)
    return {**stats, "reused": False}


def select_global(
    groups: list[GroupSpec],
    settings: SelectSpec,
    work_dir: str | Path,
    out_dir: str | Path,
    k_total: int,
    quality_range: QualityRange,
) -> dict[str, Any]:
    """Round 2 of a global budget: exactly ``k_total`` documents from the groups' candidates.

    :data:`MODULAR` methods merge the candidates' scores: the ``k_total`` best (ties by id)
    are exactly the global top k (each group proposed ``min(n_g, k_total)``). Every other
    method runs once more, with the run's seed, on the union of the candidates (quality
    scaled by the corpus-wide range), as in GreeDi (Mirzasoleiman et al. 2013). Writes
    ``OUT/selected/part-global.parquet`` (id, group, rank, logit) and then the marker
    ``WORK/completions/global``; a pure, resumable step like :func:`select_group`.
    """
    marker = Path(work_dir) / "completions" / "global"
    final = Path(out_dir) / "selected" / GLOBAL_PART
    if marker.exists() and final.exists():
        return {**json.loads(marker.read_text()), "reused": True}
    started = time.perf_counter()
    tables = [read_table(candidates_path(work_dir, g.gid)) for g in groups]
    table = pa.concat_tables([t for t in tables if t.num_rows] or tables[:1])
    del tables
    ids = table.column(settings.columns.id_col).combine_chunks()
    ids_np = ids.to_numpy(zero_copy_only=False)
    n = table.num_rows
    read_s = time.perf_counter() - started
    if settings.selector.method in MODULAR:  # an exact merge of comparable scores
        scores = table.column("score").to_numpy()
        sel = Selection(np.sort(rank_order(scores, ids_np)[:k_total]), scores, ids=ids_np)
        sel.meta.update(terms={}, device="none", gpu_peak_mb=None)
    else:
        width = table.schema.field("features").type.list_size
        flat = table.column("features").combine_chunks().values.to_numpy()
        corpus = Corpus(
            ids=ids_np,
            quality=np.stack(
                [table.column(f"quality_{j}").to_numpy() for j in range(len(quality_range[0]))],
                axis=1,
            ),
            features=flat.reshape(n, width),
            quality_names=list(settings.columns.quality_cols),
            quality_weights=None
            if settings.columns.quality_weights is None
            else np.asarray(settings.columns.quality_weights, float),
            source="the candidates of every group",
            quality_range=(np.asarray(quality_range[0]), np.asarray(quality_range[1])),
            extra={
                name: table.column(f"extra_{name}").to_numpy(zero_copy_only=False)
                for name in settings.objective.columns
            },
        )
        table = table.drop_columns(["features"])
        sel = fit_group(corpus, k_total, settings, seed=int(settings.selector.seed))
        del corpus
    fit_s = time.perf_counter() - started - read_s
    out = selection_table(
        sel,
        id_col=settings.columns.id_col,
        stored_ids=ids,
        group=table.column("group").combine_chunks(),
        kept_only=True,
    )
    atomic_write_table(out, final)
    total_s = time.perf_counter() - started
    stats = {
        "n_candidates": n,
        "k": len(sel.selected),
        "seconds": {"read": read_s, "fit": fit_s, "total": total_s},
        **_where_it_ran(sel),
    }
    atomic_write_json(stats, marker)
    return {**stats, "reused": False}


# --- runners ---------------------------------------------------------------------------------
class Runner(Protocol):
    """What :func:`run_selection` needs from a scheduler."""

    name: str
    workers: int

    def map(
        self,
        fn: Callable[..., Any],
        items: Iterable[tuple],
        *,
        use_gpu: bool = False,
        whole_machine: bool = False,
    ) -> Iterator[Any]:
        """Call ``fn(*args)`` for every ``args`` in ``items``; yield results as they finish.

        ``whole_machine``: each call may use every core of one machine (the global round,
        a single step, sets its threads accordingly).
        """
        ...

    def close(self) -> None: ...


def available_cpus() -> int:
    """Cores this process may run on (the affinity mask, not the machine's count)."""
    try:
        return len(os.sched_getaffinity(0))
    except AttributeError:  # not on Linux
        return os.cpu_count() or 1


def _call_with_threads(fn: Callable[..., Any], n_threads: int, *args: Any) -> Any:
    """Step body in a worker: pin torch's and BLAS threads, then run the step."""
    set_threads(n_threads)
    return fn(*args)


class LocalRunner:
    """Run steps on this machine: in this process, or in a pool of ``workers`` processes.

    The pool is the standard library's :class:`concurrent.futures.ProcessPoolExecutor`
    with the ``spawn`` start method (safe with torch's threads), started on first use and
    kept until :meth:`close`. Each step pins torch to ``cores // workers`` threads, so the
    workers do not oversubscribe the cores; a ``whole_machine`` step gets every core.
    Steps are pure, so results do not depend on ``workers``.

    Parameters
    ----------
    workers : int, default=1
        Steps run at once. 1 runs them one after another in this process.

    Examples
    --------
    >>> runner = LocalRunner()
    >>> list(runner.map(max, [(1, 2), (5, 3)]))
    [2, 5]
    """

    name = "local"

    def __init__(self, workers: int = 1) -> None:
        if isinstance(workers, bool) or not isinstance(workers, int) or workers < 1:
            raise ValueError(f"workers must be a positive integer; got {workers!r}.")
        self.workers = workers
        self._pool: Any = None

    def map(
        self,
        fn: Callable[..., Any],
        items: Iterable[tuple],
        *,
        use_gpu: bool = False,
        whole_machine: bool = False,
    ) -> Iterator[Any]:
        jobs = list(items)
        if self.workers == 1:
            for args in jobs:
                yield fn(*args)
            return
        from concurrent.futures import FIRST_COMPLETED, wait

        if self._pool is None:
            import multiprocessing
            from concurrent.futures import ProcessPoolExecutor

            self._pool = ProcessPoolExecutor(
                self.workers,
                mp_context=multiprocessing.get_context("spawn"),
                initializer=worker_init,  # workers die with this process (lifecycle.py)
                initargs=(os.getpid(),),
            )
        cores = available_cpus()
        threads = cores if whole_machine else max(1, cores // self.workers)
        pending = {self._pool.submit(_call_with_threads, fn, threads, *args) for args in jobs}
        try:
            while pending:
                done, pending = wait(pending, return_when=FIRST_COMPLETED)
                for future in done:
                    yield future.result()  # a step's exception is raised here as itself
        except KeyboardInterrupt:  # Ctrl-C or SIGTERM: kill the workers, do not wait
            abort_pool(self._pool)
            self._pool = None
            raise
        finally:
            for future in pending:
                future.cancel()

    def close(self) -> None:
        """Shut the worker pool down (a no-op in-process); when called while Ctrl-C or
        SIGTERM unwinds, kill the workers instead of waiting for their groups."""
        if self._pool is not None:
            if isinstance(sys.exc_info()[1], KeyboardInterrupt):
                abort_pool(self._pool)
            else:
                self._pool.shutdown(wait=True, cancel_futures=True)
            self._pool = None

    def describe(self) -> dict[str, Any]:
        return {"runner": self.name, "workers": self.workers}


# --- claiming a work dir ------------------------------------------------------------------
def _fingerprint(
    settings: SelectSpec, infos: list[ShardInfo], checksums: dict[str, str]
) -> dict[str, Any]:
    """SelectSpec and, per shard, path, rows, size and the checksum of the bytes read."""
    record = {
        "settings": settings.fingerprint(),
        "shards": [
            [str(Path(i.path).resolve()), i.num_rows, i.size_bytes, checksums.get(i.path, "")]
            for i in infos
        ],
    }
    blob = json.dumps(record, sort_keys=True, default=str).encode()
    return {**record, "settings_hash": hashlib.sha256(blob).hexdigest()[:16]}


def _differences(prev: dict[str, Any], now: dict[str, Any]) -> str:
    changed = [
        f"{key} {prev.get('settings', {}).get(key)!r} -> {value!r}"
        for key, value in now["settings"].items()
        if json.loads(json.dumps(prev.get("settings", {}).get(key)))
        != json.loads(json.dumps(value))
    ]
    before = {row[0]: row[1:] for row in prev.get("shards") or []}
    after = {row[0]: list(row[1:]) for row in json.loads(json.dumps(now["shards"]))}
    if before != after:
        edited = sorted(p for p in set(before) & set(after) if before[p] != after[p])
        added, gone = sorted(set(after) - set(before)), sorted(set(before) - set(after))
        what = [f"content of {Path(p).name} changed" for p in edited[:3]]
        what += [f"{len(added)} shard(s) added"] if added else []
        what += [f"{len(gone)} shard(s) removed"] if gone else []
        changed.append("input shards changed: " + ", ".join(what))
    return "; ".join(changed) or "unknown differences"


def _claim(work: Path, out: Path, record: dict[str, Any]) -> bool:
    """Check ``work`` and ``out`` hold nothing or this same run; record it. Returns resumed."""
    resumed = False
    for path in (work / "settings.json", out / "manifest.json"):
        if not path.exists():
            continue
        try:
            prev = json.loads(path.read_text())
        except (OSError, json.JSONDecodeError):
            raise ValueError(
                f"{path} is not readable JSON; delete {path.parent} or choose another folder."
            ) from None
        if prev.get("settings_hash") != record["settings_hash"]:
            raise ValueError(
                f"{path.parent} holds a run with other settings ({_differences(prev, record)}); "
                "rerun with the same arguments to resume, or choose another --output/--work-dir."
            )
        resumed = True
    selected = out / "selected"
    if not resumed and selected.is_dir() and any(selected.glob("part-*.parquet")):
        raise ValueError(
            f"{selected} already holds selected parts from another run; "
            "choose another --output or delete it."
        )
    atomic_write_json(record, work / "settings.json")
    if not (out / "manifest.json").exists():
        atomic_write_json({**record, "complete": False}, out / "manifest.json")
    return resumed


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
    n_clusters = settings.partition.n_clusters or math.ceil(n_total / settings.partition.chunk_size)
    folder = work / "clusters"
    cent_path = folder / "centroids.npy"
    if not cent_path.exists():
        # 1. Seeded sample, read row group by row group in every shard that has sampled rows.
        wanted = sample_plan(infos, settings.partition.kmeans_sample, settings.selector.seed)
        jobs = [(s, infos[s], rows, settings.columns.feature_col) for s, rows in wanted.items()]
        parts = dict(_progress_map(runner, read_sample, jobs, "k-means sample", progress))
        sample = np.concatenate([parts[s] for s in sorted(parts)])
        del parts
        # 2. Centroids on the driver, on CPU: the partition is the same on any cluster.
        centroids = fit_centroids(sample, n_clusters, settings.selector.seed)
        del sample
        with atomic_write(cent_path) as tmp, open(tmp, "wb") as fh:
            np.save(fh, centroids)
    # 3. One streaming pass filing every row under its nearest centroid (resumable per shard).
    jobs = [
        (s, info, str(cent_path), str(folder), settings.read_columns, settings.columns.feature_col)
        for s, info in enumerate(infos)
        if info.num_rows
    ]
    counts = dict(_progress_map(runner, spill_shard, jobs, "assign clusters", progress))
    spills = [(str(folder / f"shard-{s:05d}.parquet"), counts[s]) for s, *_ in jobs]
    n_used = len(np.load(cent_path))
    return plan_by_cluster(spills, settings.partition.chunk_size), {"n_clusters": n_used}


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
) -> int:
    """Run :func:`select_group` for every group without a finished result (a marker for
    its candidate count and its file); fills ``stats``, returns the documents computed."""

    def result_path(gid: int) -> Path:
        return candidates_path(work, gid) if propose else part_path(out, gid)

    pending = []
    for g in groups:
        marker = completion_path(work, g.gid)
        done = read_marker(marker) if result_path(g.gid).exists() else None
        if done is not None and done.get("k") == g.k:
            stats[g.gid] = {**done, "reused": True}
        else:
            marker.unlink(missing_ok=True)  # a marker without its result: redo the group
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
        jobs = [(g, settings, str(work), str(out), quality_range, propose, totals) for g in pending]
        for result in runner.map(select_group, jobs, use_gpu=True):
            stats[result["gid"]] = result
            done_docs += result["n"]
            elapsed = time.perf_counter() - started
            bar.set_postfix(docs_per_s=f"{done_docs / max(elapsed, 1e-9):,.0f}")
            bar.update(1)
    finally:
        bar.close()
    missing = [g.gid for g in groups if not completion_path(work, g.gid).exists()]
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
) -> tuple[dict[str, Any], list[GroupSpec]]:
    """Round 2 of a budget allocated by gains (:mod:`.allocate`): the threshold from every
    group's knots, then again for groups whose whole curve was kept (they propose twice as
    many), then every group's kept prefix written as its part; the marker last."""
    knots = {g: knots_of(s) for g, s in stats.items()}  # read once, not into the manifest
    done = read_marker(global_marker(work))
    if done is not None:
        return {**done, "reused": True}, groups
    k_total = totals[0]
    started = time.perf_counter()
    rounds = 1
    while True:
        counts = allocate_counts(
            [knots[g.gid] for g in groups],
            [g.k for g in groups],
            lambda i, lo, hi: read_table(candidates_path(work, groups[i].gid), columns=["gain"])
            .column(0)
            .to_numpy()[lo:hi],
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
            again, settings, work, out, quality_range, True, totals, runner, fresh,
            f"propose more ({rounds})", progress,
        )
        for gid, s in fresh.items():
            knots[gid] = knots_of(s)
            stats[gid] = s
        rounds += 1
    allocate_s = time.perf_counter() - started
    jobs = [
        (
            g.gid,
            int(m),
            settings,
            str(work),
            str(part_path(out, g.gid)),
            str(candidates_path(work, g.gid)),
        )
        for g, m in zip(groups, counts, strict=True)
    ]
    written = list(_progress_map(runner, write_allocated, jobs, "write", progress))
    seconds = {
        "allocate": allocate_s,
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
) -> dict[str, Any]:
    """Select ``round(select_ratio * N)`` documents from a sharded corpus, resumably.

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
    out = Path(output)
    if out.exists() and not out.is_dir():
        raise ValueError(
            f"--output {str(out)!r} is a file; sharded selection writes a folder "
            "(selected/ parts and manifest.json)."
        )
    work = Path(work_dir) if work_dir is not None else out / "_work"
    check_writable(work, folder=True)

    # Output and work dir never overlap the input: not the input folder itself, and no
    # input shard inside them (folders inside the input folder are skipped when listing).
    if isinstance(source, str | Path) and literal_or_glob(str(source)) == "literal":
        check_no_overlap([out, work], [source])
    files = list_shards(source, exclude=[out, work])
    check_no_overlap([out, work], files)
    # Claim the output (and a work dir outside it) before any computation: a second run
    # writing the same folder is refused here, and an unwritable folder fails here.
    with ExitStack() as claims:  # released in reverse; on an error, made folders go too
        claims.enter_context(OutputLock(out, folder=True))
        if not work.resolve().is_relative_to(out.resolve()):
            claims.enter_context(OutputLock(work, folder=True))
        return _run_claimed(source, files, out, work, settings, runner, progress, started)


def _run_claimed(
    source: ShardSource,
    files: list[Path],
    out: Path,
    work: Path,
    settings: SelectSpec,
    runner: Runner,
    progress: bool,
    started: float,
) -> dict[str, Any]:
    """:func:`run_selection` once the output is claimed."""
    # Footers first (row counts, columns), then every row of every shard: nothing is
    # written for a run whose input is bad, and no group starts before all are checked.
    infos = inspect_shards(files, columns=settings.read_columns)
    n_total = sum(i.num_rows for i in infos)
    if n_total == 0:
        raise ValueError(f"the {len(infos)} input shard(s) hold no rows.")
    k_total = k_from_ratio(settings.selector.select_ratio, n_total)
    # The validation pass runs before any cluster is started: a RayRunner not yet
    # connected hands it to a local pool, so bad input fails before Ray starts.
    checker = getattr(runner, "validation_runner", lambda: runner)()
    try:
        scans = _progress_map(
            checker, scan_shard, scan_jobs(infos, settings), "check inputs", progress
        )
        checksums, quality_range = check_scans(scans, infos, settings)
    finally:
        if checker is not runner:
            checker.close()
    record = _fingerprint(settings, infos, checksums)
    resumed = _claim(work, out, record)

    plan, plan_facts = _plan(infos, settings, work, runner, progress)
    groups = make_groups(plan, k_total, settings.selector.seed)
    if sum(g.k for g in groups) != k_total:  # apportion guarantees it; check before writing
        raise RuntimeError("group budgets do not add up to the global k; please report this.")
    # A global budget with one group is that group's own selection: no second round.
    two_rounds = settings.partition.budget == "global" and len(groups) > 1
    # ... allocated by the groups' gain curves where the objective allows it, else a
    # central round over the union of the candidates (GreeDi).
    allocating = two_rounds and allocates_by_gains(settings)
    totals = (k_total, n_total) if allocating else None
    shares = {g.gid: g.k for g in groups}
    if two_rounds:  # round 1: every group proposes candidates instead of keeping its share
        groups = [
            replace(
                g,
                k=min(g.n, k_total)
                if settings.selector.method in MODULAR
                else candidate_count(g.n, n_total, k_total, settings.partition.oversample),
            )
            for g in groups
        ]
    if allocating:  # ... or more, where an earlier allocation asked for more
        groups = [replace(g, k=wanted(work, g.gid, g.k)) for g in groups]
    plan_s = time.perf_counter() - started

    stats: dict[int, dict[str, Any]] = {}
    select_started = time.perf_counter()
    desc = "propose candidates" if two_rounds else "select groups"
    n_pending_docs = _select_groups(
        groups, settings, work, out, quality_range, two_rounds, totals, runner, stats, desc,
        progress,
    )
    select_s = time.perf_counter() - select_started

    global_stats = None
    global_s = 0.0
    if allocating:  # round 2: one threshold over the gain curves; each group keeps a prefix
        global_started = time.perf_counter()
        global_stats, groups = _allocate(
            groups, settings, work, out, quality_range, totals, runner, stats, progress
        )
        global_s = time.perf_counter() - global_started
    elif two_rounds:  # round 2: one selection over the union of the candidates
        global_started = time.perf_counter()
        job = (groups, settings, str(work), str(out), k_total, quality_range)
        with tqdm(total=1, desc="global round", disable=not progress) as gbar:
            results = runner.map(select_global, [job], use_gpu=True, whole_machine=True)
            global_stats = list(results)[0]
            gbar.update(1)
        global_s = time.perf_counter() - global_started
    # Merge: the output dataset is the set of parts; drop stray temporaries of killed runs.
    clean_stale_temporaries(out / "selected")
    ordered = [{**stats[g.gid], "share": shares[g.gid]} for g in groups]
    cap_facts = None
    if settings.selector.max_similarity is not None and not two_rounds:  # the cap across groups
        from .cap import cap_across_groups

        cap_facts = cap_across_groups(groups, settings, work, out, progress=progress)
    elif global_stats is not None and settings.selector.max_similarity is not None:
        cap_facts = {"applied_in": "global round", "threshold": settings.selector.max_similarity}
    k_selected = global_stats["k"] if global_stats else int(sum(s["k"] for s in ordered))
    if k_selected != k_total:  # every path guarantees it; check before marking complete
        raise RuntimeError(f"selected {k_selected} documents, not {k_total}; please report this.")
    # Per-input-file keep lists for `datamask apply` (OUT/keep/), from the final parts.
    keep = keep_lists_for_output(
        out, source, files, id_col=settings.columns.id_col, progress=progress
    )
    total_s = time.perf_counter() - started
    computed = [s for s in ordered if not s["reused"]]
    manifest = {
        **run_record(
            settings,
            n_docs=n_total,
            k=k_selected,
            terms=global_stats["terms"] if global_stats else None,
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
                "total": total_s,
            },
            "docs_per_second": n_total / total_s,
            "select_docs_per_second": n_pending_docs / select_s if n_pending_docs else None,
            "driver_peak_rss_mb": peak_rss_mb(),
        },
        "max_similarity": cap_facts,
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
    atomic_write_json(manifest, out / "manifest.json")
    return manifest
