"""Phases 3 and 4 of a sharded run (:mod:`.runner`): every group selects (or proposes
candidates), then the candidates become one selection of exactly ``k``: allocated by the
groups' gain curves (:mod:`.allocate`, with :mod:`.exchange`'s re-pricing) or by one
central round (:func:`~.steps.select_global`). Each round skips what a killed run finished.
"""

from __future__ import annotations

import time
from dataclasses import replace
from pathlib import Path
from typing import Any

import pyarrow as pa
import pyarrow.parquet as pq
from tqdm.auto import tqdm

from ..config import SelectSpec
from ..io.fs import names_in, open_input
from ..io.parquet import read_table
from .allocate import (
    allocate_counts,
    ask_for_more,
    compact_marker,
    finish_allocation,
    global_marker,
    knots_of,
    saturated,
    write_allocated,
)
from .context import RunContext
from .exchange import exchange_applies, exchange_path, exchange_round
from .executors import Runner, group_memory_bytes, largest_first, progress_map
from .given import kept_counts
from .lifecycle import read_marker
from .partition import GroupSpec
from .steps import (
    candidates_path,
    completion_path,
    part_path,
    select_global,
    select_group,
)
from .validate import QualityRange

__all__ = ["allocate_round", "central_round", "select_round"]


def _width(path: str, feature_col: str) -> int:
    """Embedding width in ``path``: its fixed list size, else the first row's length."""
    with open_input(path) as fh:
        parquet = pq.ParquetFile(fh)
        kind = parquet.schema_arrow.field(feature_col).type
        if pa.types.is_fixed_size_list(kind):
            return int(kind.list_size)
        return len(parquet.read_row_group(0, columns=[feature_col]).column(0)[0])


def select_round(
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
    pending = [pending[i] for i in largest_first([g.n for g in pending])]
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
        places = str(work), str(out)  # one copy of each, not one a job
        jobs = [(g, settings, *places, quality_range, propose, totals, rate) for g in pending]
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


def allocate_round(
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
    counts, rounds = _allocate_until_settled(
        groups,
        knots,
        centroids,
        stats,
        settings,
        work,
        out,
        quality_range,
        totals,
        runner,
        progress,
        k_total,
    )
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
    written = list(progress_map(runner, write_allocated, jobs, "write", progress))
    seconds = {
        "allocate": allocate_s - exchange_s,
        "exchange": exchange_s,
        "write": time.perf_counter() - started - allocate_s,
        "total": time.perf_counter() - started,
    }
    n_candidates = sum(g.k for g in groups)
    global_stats = finish_allocation(work, counts, written, n_candidates, rounds, seconds)
    return {**global_stats, "reused": False}, groups


def _allocate_until_settled(
    groups: list[GroupSpec],
    knots: dict[int, Any],
    centroids: dict[int, Any],
    stats: dict[int, dict[str, Any]],
    settings: SelectSpec,
    work: Path,
    out: Path,
    quality_range: QualityRange,
    totals: tuple[int, int],
    runner: Runner,
    progress: bool,
    k_total: int,
) -> tuple[Any, int]:
    """The threshold from every group's knots, again until no group is cut off by its
    own candidate count (those propose twice as many; ``groups``, ``knots``,
    ``centroids`` and ``stats`` are updated in place). Returns the counts and the rounds."""
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
            ask_for_more(work, g.gid, groups[i].k)
            completion_path(work, g.gid).unlink(missing_ok=True)
        again = [groups[i] for i in cut_off]
        fresh: dict[int, dict[str, Any]] = {}
        select_round(
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
    return counts, rounds


def central_round(
    run: RunContext, groups: list[GroupSpec], k_total: int, quality_range: QualityRange
) -> dict[str, Any]:
    """Phase 4 (central): one selection of exactly ``k`` over the union of the candidates,
    on one worker that may use the whole machine."""
    job = (groups, run.settings, str(run.work), str(run.out), k_total, quality_range)
    with tqdm(total=1, desc="global round", disable=not run.progress) as bar:
        results = run.runner.map(select_global, [job], use_gpu=True, whole_machine=True)
        stats = list(results)[0]
        bar.update(1)
    return stats
