"""Corpus-scale selection: plan groups, run one learner per group, merge, resume.

Layout of a run (``OUT`` is ``--output``, ``WORK`` is ``--work-dir``, default ``OUT/_work``)::

    OUT/selected/part-NNNNN.parquet   selected ids of group NNNNN (id, group, rank, logit)
    OUT/manifest.json                 settings, per-group n / k / seconds / memory, totals
    WORK/settings.json                the settings and input fingerprint this work dir holds
    WORK/groups/NNNNN.parquet         every row of the group: id, logit, probability, rank,
                                      selected (skipped with ``selected_only``)
    WORK/completions/NNNNN            JSON stats; written last, after the group's files
    WORK/clusters/...                 centroids and per-shard cluster spills (by="cluster")

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
import resource
import socket
import time
from collections.abc import Callable, Iterable, Iterator
from dataclasses import asdict, dataclass, fields
from pathlib import Path
from typing import Any, Protocol

import numpy as np
import pyarrow as pa
from tqdm.auto import tqdm

from .._validation import check_choice, check_positive, check_ratio, k_from_ratio
from ..io.atomic import (
    OutputLock,
    atomic_write,
    atomic_write_json,
    check_no_overlap,
    check_writable,
    clean_stale_temporaries,
)
from ..io.keep import keep_lists_for_output
from ..io.parquet import atomic_write_table
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
from .partition import (
    PARTITIONS,
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
from .validate import check_scans, scan_jobs

__all__ = ["Settings", "read_group", "select_group", "LocalRunner", "Runner", "run_selection"]


@dataclass(frozen=True)
class Settings:
    """Everything that decides a sharded selection (and is fingerprinted for resume).

    The learner fields mean what they mean for :class:`~datamask.optim.MaskLearner` and
    ``datamask select``; the partition fields are described in
    :mod:`datamask.distributed.partition`.

    Parameters
    ----------
    id_col, feature_col : str
        Id column (written back unchanged) and embedding column.
    quality_cols : tuple of str, default=("quality_score",)
        Quality columns, mixed with ``quality_weights`` (default equal).
    partition : {"shard", "chunk", "cluster"}, default="shard"
        How rows are grouped.
    chunk_size : int, default=100_000
        Rows per group for ``chunk``; the largest group for ``cluster``.
    n_clusters : int, optional
        Clusters for ``cluster`` (default ``ceil(N / chunk_size)``).
    kmeans_sample : int, default=100_000
        Rows sampled to fit the centroids.
    selected_only : bool, default=False
        Skip the per-group files holding every row's logit (kept with ``max_similarity``:
        the cross-group pass reads the groups' rankings from them).
    max_similarity : float, optional
        Hard cap on the cosine similarity of any two selected documents, across groups
        (see :mod:`datamask.distributed.cap`). Default: no cap.
    """

    id_col: str = "chunk_id"
    quality_cols: tuple[str, ...] = ("quality_score",)
    quality_weights: tuple[float, ...] | None = None
    feature_col: str = "feature_arr"
    algorithm: tuple[str, ...] = ("Facility",)
    lamb: float = 0.5
    select_ratio: float = 0.3
    n_epochs: int | None = None
    partial: float = 0.1
    n_rollout: int = 128
    max_lr: float | None = None
    min_lr: float | None = None
    init: str = "quality"
    estimator: str = "expected"
    mask_sampler: str = "bernoulli"
    baseline: str = "group"
    refine: str = "swap"
    n_neighbors: int | None = None
    knn: str = "auto"
    seed: int = 0
    device: str = "auto"
    partition: str = "shard"
    chunk_size: int = 100_000
    n_clusters: int | None = None
    kmeans_sample: int = 100_000
    selected_only: bool = False
    max_similarity: float | None = None

    @property
    def columns(self) -> list[str]:
        """Columns read from every shard, each once."""
        return list(dict.fromkeys([self.id_col, *self.quality_cols, self.feature_col]))

    def make_learner(self, k: int, seed: int, device: str | None = None) -> Any:
        """The :class:`~datamask.optim.MaskLearner` for one group, keeping exactly ``k``."""
        from ..objectives import Objective, make_diversity
        from ..optim import MaskLearner

        diversity = [
            make_diversity(a, n_neighbors=self.n_neighbors, knn=self.knn)
            if a == "Facility"
            else make_diversity(a)
            for a in self.algorithm
        ]
        return MaskLearner(
            Objective(diversity, lamb=self.lamb),
            select_ratio=self.select_ratio,
            k=k,
            n_epochs=self.n_epochs,
            partial=self.partial,
            n_rollout=self.n_rollout,
            max_lr=self.max_lr,
            min_lr=self.min_lr,
            init=self.init,
            estimator=self.estimator,
            mask_sampler=self.mask_sampler,
            baseline=self.baseline,
            refine=self.refine,
            seed=seed,
            device=device or self.device,
            progress=False,
            max_similarity=self.max_similarity,
        )

    def check(self) -> Settings:
        """Refuse bad settings before anything is written. Returns self."""
        check_choice("partition", self.partition, PARTITIONS)
        check_positive("chunk_size", self.chunk_size, integer=True)
        if self.n_clusters is not None:
            check_positive("n_clusters", self.n_clusters, integer=True)
        check_positive("kmeans_sample", self.kmeans_sample, integer=True)
        check_ratio("select_ratio", self.select_ratio)
        if not self.quality_cols:
            raise ValueError("quality_cols must name at least one column; got none.")
        if self.quality_weights is not None and len(self.quality_weights) != len(self.quality_cols):
            raise ValueError(
                f"quality_weights must have one weight per quality column "
                f"({len(self.quality_cols)}); got {list(self.quality_weights)}."
            )
        name = str(self.device).lower()
        if not (name in ("auto", "cpu") or name.startswith("cuda")):
            raise ValueError(
                f"device must be 'auto', 'cpu', 'cuda' or 'cuda:N'; got {self.device!r}."
            )
        # The learner validates the rest; calling its check here, on the driver, means a bad
        # value fails at once instead of inside the first group on a remote worker.
        self.make_learner(k=1, seed=0, device="cpu").check_params()
        return self

    @classmethod
    def from_namespace(cls, args: Any) -> Settings:
        """Settings from the ``datamask select`` arguments (absent ones keep defaults)."""
        values: dict[str, Any] = {}
        for f in fields(cls):
            value = getattr(args, f.name, None)
            if value is None:
                continue
            if f.name in ("quality_cols", "algorithm", "quality_weights"):
                value = (value,) if isinstance(value, str) else tuple(value)
            values[f.name] = value
        return cls(**values)


# --- the pure step --------------------------------------------------------------------------
def _group_name(gid: int) -> str:
    return f"{gid:05d}"


def completion_path(work_dir: str | Path, gid: int) -> Path:
    """The marker a finished group leaves behind."""
    return Path(work_dir) / "completions" / _group_name(gid)


def part_path(out_dir: str | Path, gid: int) -> Path:
    """The selected-ids file of one group in the output dataset."""
    return Path(out_dir) / "selected" / f"part-{_group_name(gid)}.parquet"


def _peak_rss_mb() -> float:
    # ru_maxrss is in KiB on Linux. Worker processes are reused across groups, so this is
    # the peak of the whole worker so far: the figure "memory per worker" asks for.
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024.0


def read_group(spec: GroupSpec, settings: Settings) -> tuple[Any, pa.Array]:
    """The rows of one group as a Corpus (not yet validated) and its ids as stored."""
    tables = [
        (
            read_rows(p.path, p.start, p.stop, settings.columns),
            f"{p.path} (rows {p.start}-{p.stop})",
        )
        for p in spec.pieces
    ]
    return corpus_from_tables(
        tables,
        id_col=settings.id_col,
        quality_cols=settings.quality_cols,
        quality_weights=settings.quality_weights,
        feature_col=settings.feature_col,
        source=f"group {spec.gid} ({spec.label})",
    )


def select_group(
    spec: GroupSpec, settings: Settings, work_dir: str | Path, out_dir: str | Path
) -> dict[str, Any]:
    """Select ``spec.k`` documents of one group and write its files; a pure, resumable step.

    Reads only the group's rows, runs the learner with ``spec.seed``, then writes
    ``WORK/groups/NNNNN.parquet`` (unless ``settings.selected_only``),
    ``OUT/selected/part-NNNNN.parquet`` and last the marker ``WORK/completions/NNNNN``.
    When the marker exists already the step returns its stats without recomputing.

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
    corpus, ids = read_group(spec, settings)
    n = corpus.n_docs
    read_s = time.perf_counter() - started

    # 2. Run the learner for exactly k (nothing to learn when k is 0 or n).
    terms: dict[str, float] = {}
    device = "none"
    gpu_peak_mb = None
    if 0 < spec.k < n:
        learner = settings.make_learner(spec.k, spec.seed)
        from .._device import resolve_device

        dev = resolve_device(learner.device)
        if dev.type == "cuda":
            import torch

            torch.cuda.reset_peak_memory_stats(dev)
        learner.fit(corpus)
        if dev.type == "cuda":
            gpu_peak_mb = torch.cuda.max_memory_allocated(dev) / 2**20
        logits = np.asarray(learner.logits_, dtype=np.float32)
        capped = learner.selected_ if settings.max_similarity is not None else None
        scores = np.asarray(learner.scores_, dtype=np.float64)  # the kept rows ranked first
        probabilities = np.asarray(learner.probabilities_, dtype=np.float32)
        terms = {k: float(v) for k, v in learner.terms_.items()}
        device = str(learner.device_)
        del learner
    else:  # k == 0 keeps nothing, k == n keeps all: every logit ties
        fill = 1.0 if spec.k == n else 0.0
        capped = None
        logits = np.zeros(n, dtype=np.float32)
        scores = logits.astype(np.float64)
        probabilities = np.full(n, fill, dtype=np.float32)
    fit_s = time.perf_counter() - started - read_s

    # 3. Rank inside the group (ties by id, as the learner's top-k): rank <= k is kept.
    order = np.lexsort((corpus.ids, -scores))
    rank = np.empty(n, dtype=np.int64)
    rank[order] = np.arange(1, n + 1)
    selected = rank <= spec.k
    if capped is not None:  # the cap skipped rows of the top k for the next compatible ones
        selected = np.zeros(n, dtype=bool)
        selected[capped] = True
    del corpus

    # 4. Write the group's files atomically, then the marker.
    gid_col = pa.array(np.full(n, spec.gid, dtype=np.int32))
    if not settings.selected_only or settings.max_similarity is not None:
        atomic_write_table(
            pa.table(
                {
                    settings.id_col: ids,
                    "group": gid_col,
                    "logit": pa.array(logits),
                    "probability": pa.array(probabilities),
                    "rank": pa.array(rank),
                    "selected": pa.array(selected),
                }
            ),
            Path(work_dir) / "groups" / f"{_group_name(spec.gid)}.parquet",
        )
    keep = np.flatnonzero(selected)
    keep = keep[np.argsort(rank[keep])]
    atomic_write_table(
        pa.table(
            {
                settings.id_col: ids.take(pa.array(keep)),
                "group": gid_col.take(pa.array(keep)),
                "rank": pa.array(rank[keep]),
                "logit": pa.array(logits[keep]),
            }
        ),
        part_path(out_dir, spec.gid),
    )
    total_s = time.perf_counter() - started
    stats = {
        "gid": spec.gid,
        "label": spec.label,
        "n": n,
        "k": int(selected.sum()),
        "seed": spec.seed,
        "seconds": {
            "read": read_s,
            "fit": fit_s,
            "write": total_s - read_s - fit_s,
            "total": total_s,
        },
        "docs_per_second": n / total_s if total_s > 0 else None,
        "peak_rss_mb": _peak_rss_mb(),
        "gpu_peak_mb": gpu_peak_mb,
        "device": device,
        "host": socket.gethostname(),
        "pid": os.getpid(),
        "terms": terms,
    }
    atomic_write_json(stats, marker)
    return {**stats, "reused": False}


# --- runners ---------------------------------------------------------------------------------
class Runner(Protocol):
    """What :func:`run_selection` needs from a scheduler."""

    name: str
    workers: int

    def map(
        self, fn: Callable[..., Any], items: Iterable[tuple], *, use_gpu: bool = False
    ) -> Iterator[Any]:
        """Call ``fn(*args)`` for every ``args`` in ``items``; yield results as they finish."""
        ...

    def close(self) -> None: ...


class LocalRunner:
    """Run every step in this process, one after another (no Ray needed).

    Examples
    --------
    >>> runner = LocalRunner()
    >>> list(runner.map(max, [(1, 2), (5, 3)]))
    [2, 5]
    """

    name = "local"
    workers = 1

    def map(
        self, fn: Callable[..., Any], items: Iterable[tuple], *, use_gpu: bool = False
    ) -> Iterator[Any]:
        for args in items:
            yield fn(*args)

    def close(self) -> None:
        """Nothing to release."""

    def describe(self) -> dict[str, Any]:
        return {"runner": self.name, "workers": 1}


# --- claiming a work dir ------------------------------------------------------------------
def _fingerprint(
    settings: Settings, infos: list[ShardInfo], checksums: dict[str, str]
) -> dict[str, Any]:
    """Settings and, per shard, path, rows, size and the checksum of the bytes read."""
    record = {
        "settings": asdict(settings),
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
    infos: list[ShardInfo], settings: Settings, work: Path, runner: Runner, progress: bool
) -> tuple[list[tuple[str, list]], dict[str, Any]]:
    """Group plan for the chosen partition, and facts about it for the manifest."""
    if settings.partition == "shard":
        return plan_by_shard(infos), {}
    if settings.partition == "chunk":
        return plan_by_chunk(infos, settings.chunk_size), {}
    n_total = sum(i.num_rows for i in infos)
    n_clusters = settings.n_clusters or math.ceil(n_total / settings.chunk_size)
    folder = work / "clusters"
    cent_path = folder / "centroids.npy"
    if not cent_path.exists():
        # 1. Seeded sample, read row group by row group in every shard that has sampled rows.
        wanted = sample_plan(infos, settings.kmeans_sample, settings.seed)
        jobs = [(s, infos[s], rows, settings.feature_col) for s, rows in wanted.items()]
        parts = dict(_progress_map(runner, read_sample, jobs, "k-means sample", progress))
        sample = np.concatenate([parts[s] for s in sorted(parts)])
        del parts
        # 2. Centroids on the driver, on CPU: the partition is the same on any cluster.
        centroids = fit_centroids(sample, n_clusters, settings.seed)
        del sample
        with atomic_write(cent_path) as tmp, open(tmp, "wb") as fh:
            np.save(fh, centroids)
    # 3. One streaming pass filing every row under its nearest centroid (resumable per shard).
    jobs = [
        (s, info, str(cent_path), str(folder), settings.columns, settings.feature_col)
        for s, info in enumerate(infos)
        if info.num_rows
    ]
    counts = dict(_progress_map(runner, spill_shard, jobs, "assign clusters", progress))
    spills = [(str(folder / f"shard-{s:05d}.parquet"), counts[s]) for s, *_ in jobs]
    n_used = len(np.load(cent_path))
    return plan_by_cluster(spills, settings.chunk_size), {"n_clusters": n_used}


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
    settings: Settings | None = None,
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
    settings : Settings, optional
        Learner and partition settings (default ``Settings()``).
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
    settings = (settings or Settings()).check()
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
    locks = [OutputLock(out, folder=True)]
    if not work.resolve().is_relative_to(out.resolve()):
        locks.append(OutputLock(work, folder=True))
    try:
        manifest = _run_claimed(source, files, out, work, settings, runner, progress, started)
    except BaseException:
        for lock in reversed(locks):
            lock.release(remove_created=True)
        raise
    for lock in reversed(locks):
        lock.release()
    return manifest


def _run_claimed(
    source: ShardSource,
    files: list[Path],
    out: Path,
    work: Path,
    settings: Settings,
    runner: Runner,
    progress: bool,
    started: float,
) -> dict[str, Any]:
    """:func:`run_selection` once the output is claimed."""
    # Footers first (row counts, columns), then every row of every shard: nothing is
    # written for a run whose input is bad, and no group starts before all are checked.
    infos = inspect_shards(files, columns=settings.columns)
    n_total = sum(i.num_rows for i in infos)
    if n_total == 0:
        raise ValueError(f"the {len(infos)} input shard(s) hold no rows.")
    k_total = k_from_ratio(settings.select_ratio, n_total)
    scans = _progress_map(runner, scan_shard, scan_jobs(infos, settings), "check inputs", progress)
    checksums = check_scans(scans, infos, settings)
    record = _fingerprint(settings, infos, checksums)
    resumed = _claim(work, out, record)

    plan, plan_facts = _plan(infos, settings, work, runner, progress)
    groups = make_groups(plan, k_total, settings.seed)
    if sum(g.k for g in groups) != k_total:  # apportion guarantees it; check before writing
        raise RuntimeError("group budgets do not add up to the global k; please report this.")
    plan_s = time.perf_counter() - started

    stats: dict[int, dict[str, Any]] = {}
    pending = []
    for g in groups:
        marker = completion_path(work, g.gid)
        if marker.exists() and part_path(out, g.gid).exists():
            stats[g.gid] = {**json.loads(marker.read_text()), "reused": True}
        else:
            marker.unlink(missing_ok=True)  # a marker without its part: redo the group
            pending.append(g)
    n_pending_docs = sum(g.n for g in pending)
    select_started = time.perf_counter()
    done_docs = 0
    bar = tqdm(
        total=len(groups),
        initial=len(groups) - len(pending),  # a resumed run starts where the last one stopped
        desc="select groups",
        unit="group",
        disable=not progress,
        dynamic_ncols=True,
    )
    try:
        jobs = [(g, settings, str(work), str(out)) for g in pending]
        for result in runner.map(select_group, jobs, use_gpu=True):
            stats[result["gid"]] = result
            done_docs += result["n"]
            elapsed = time.perf_counter() - select_started
            bar.set_postfix(docs_per_s=f"{done_docs / max(elapsed, 1e-9):,.0f}")
            bar.update(1)
    finally:
        bar.close()
    select_s = time.perf_counter() - select_started

    # Merge: the output dataset is the set of parts; drop stray temporaries of killed runs.
    clean_stale_temporaries(out / "selected")
    missing = [g.gid for g in groups if not completion_path(work, g.gid).exists()]
    if missing:
        raise RuntimeError(f"groups {missing[:10]} did not complete; rerun to resume.")
    ordered = [stats[g.gid] for g in groups]
    cap_facts = None
    if settings.max_similarity is not None:  # the cap must hold across groups too
        from .cap import cap_across_groups

        cap_facts = cap_across_groups(groups, settings, work, out, progress=progress)
    # Per-input-file keep lists for `datamask apply` (OUT/keep/), from the final parts.
    keep = keep_lists_for_output(out, source, files, id_col=settings.id_col, progress=progress)
    total_s = time.perf_counter() - started
    computed = [s for s in ordered if not s["reused"]]
    manifest = {
        **record,
        "complete": True,
        "input": {"source": str(source), "n_shards": len(infos), "n_docs": n_total},
        "partition": {
            "by": settings.partition,
            "n_groups": len(groups),
            "chunk_size": settings.chunk_size,
            **plan_facts,
        },
        "runner": getattr(runner, "describe", lambda: {"runner": runner.name})(),
        "work_dir": str(work),
        "output": {"selected": str(out / "selected"), "parts": len(groups), "k": k_total},
        "totals": {
            "n_docs": n_total,
            "k": int(sum(s["k"] for s in ordered)),
            "n_groups": len(groups),
            "groups_computed": len(computed),
            "groups_reused": len(groups) - len(computed),
            "resumed": resumed,
            "seconds": {"plan": plan_s, "select": select_s, "total": total_s},
            "docs_per_second": n_total / total_s,
            "select_docs_per_second": n_pending_docs / select_s if n_pending_docs else None,
            "driver_peak_rss_mb": _peak_rss_mb(),
        },
        "max_similarity": cap_facts,
        "selection_digest": keep["selection"],
        "summary": _summary(ordered),
        "summary_computed": _summary(computed) if computed else None,
        "groups": ordered,
    }
    atomic_write_json(manifest, out / "manifest.json")
    return manifest
