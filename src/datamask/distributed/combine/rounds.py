"""Phases 3 and 4 of a sharded run (:mod:`..runner`): every group selects (or proposes
candidates), then the candidates become one selection of exactly ``k``: allocated by the
groups' gain curves (:mod:`.allocate`, with :mod:`.exchange`'s re-pricing) or by one
central round (:class:`~..select.steps.SelectGlobal`). Each round skips what a killed run finished
(:func:`~..engine.run_steps`).
"""

from __future__ import annotations

import time
from dataclasses import dataclass, replace
from typing import Any

import numpy as np
import pyarrow.parquet as pq

from ...io.fs import open_input
from ...io.parquet import feature_width, read_table
from ..check.validate import QualityRange
from ..context import RunContext
from ..engine import run_steps
from ..paths import WorkDir
from ..plan.partition import Group
from ..select.given import kept_counts
from ..select.steps import (
    GlobalJob,
    GroupJob,
    SelectGlobal,
    SelectGroup,
)
from ..select.tokens import TokenPlan, allocate_tokens, ask_for_tokens
from .allocate import (
    AllocatedJob,
    WriteAllocated,
    allocate_counts,
    ask_for_more,
    compact_marker,
    finish_allocation,
    knots_of,
    read_gains,
    reused_allocation,
    saturated,
)
from .exchange import exchange_applies, exchange_round, exchange_steps

__all__ = ["allocate_round", "allocate_tokens_round", "central_round", "select_round"]


def _width(path: str, feature_col: str) -> int:
    """Embedding width in ``path``: its fixed list size, else the first row's length."""
    with open_input(path) as fh:
        parquet = pq.ParquetFile(fh)
        width = feature_width(parquet.schema_arrow.field(feature_col))
        if width is not None:
            return width
        return len(parquet.read_row_group(0, columns=[feature_col]).column(0)[0])


def select_round(
    run: RunContext,
    groups: list[Group],
    quality_range: QualityRange,
    stats: dict[int, dict[str, Any]],
    *,
    propose: bool,
    totals: tuple[int, int] | None = None,
    rate: tuple[int, int] | None = None,
    desc: str = "select groups",
    tokens: TokenPlan | None = None,
) -> int:
    """Run :class:`~..select.steps.SelectGroup` for every group without a finished result; fills
    ``stats`` (by gid), returns the documents computed (not reused)."""
    spec, dirs = run.spec, run.dirs
    todo = [g for g in groups if g.n]
    width = _width(todo[0].pieces[0].path, spec.columns.feature_col) if todo else 0
    n_kept = kept_counts(dirs)["n_kept"] if spec.selector.given is not None else 0
    jobs = [
        GroupJob(g, spec, dirs, quality_range, propose, totals, rate, width, n_kept, tokens)
        for g in groups
    ]
    results = run_steps(
        run.runner, SelectGroup(), jobs, progress=run.progress, desc=desc, keep=compact_marker
    )
    for result in results:
        stats[result["gid"]] = result
    return sum(r["n"] for r in results if not r["reused"])


def allocate_round(
    run: RunContext,
    groups: list[Group],
    quality_range: QualityRange,
    totals: tuple[int, int],
    stats: dict[int, dict[str, Any]],
    k_total: int,
) -> tuple[dict[str, Any], list[Group]]:
    """Round 2 of a budget allocated by gains (:mod:`.allocate`): the threshold from every
    group's knots, then again for groups whose whole curve was kept (they propose twice as
    many), then every group's kept prefix written as its part; the marker last.
    ``totals``: the ``(k, N)`` of the gains' units (:func:`~..select.given.rate_totals`);
    ``k_total``: the budget."""
    dirs = run.dirs
    curves = _Curves(
        {g: knots_of(s) for g, s in stats.items()},  # read once, not into the manifest
        {g: s.pop("centroid", None) for g, s in stats.items()},
        stats,
    )
    done = reused_allocation(dirs, groups)
    if done is not None:
        return {**done, "reused": True}, groups
    started = time.perf_counter()
    counts, rounds = _allocate_until_settled(run, groups, curves, quality_range, totals, k_total)
    source, exchange_started = WorkDir.candidates, time.perf_counter()
    if exchange_applies(run.spec):  # every group re-prices above its neighbours' cover
        counts = exchange_round(
            run, groups, counts, curves.centroids, quality_range, totals, k_total
        )
        source = WorkDir.exchange
    exchange_s = time.perf_counter() - exchange_started
    allocate_s = time.perf_counter() - started
    jobs = [
        AllocatedJob(g.gid, int(m), run.spec, str(dirs.part(g.gid)), str(source(dirs, g.gid)))
        for g, m in zip(groups, counts, strict=True)
    ]
    written = run_steps(run.runner, WriteAllocated(), jobs, progress=run.progress)
    seconds = {
        "allocate": allocate_s - exchange_s,
        "exchange": exchange_s,
        "write": time.perf_counter() - started - allocate_s,
        "total": time.perf_counter() - started,
    }
    n_candidates = sum(g.k for g in groups)
    global_stats = finish_allocation(dirs, counts, written, n_candidates, rounds, seconds)
    return {**global_stats, "reused": False}, groups


@dataclass
class _Curves:
    """What the allocation holds per group: its knots, its centroid and its stats (by
    gid; a group proposing again replaces its three)."""

    knots: dict[int, Any]
    centroids: dict[int, Any]
    stats: dict[int, dict[str, Any]]


def _allocate_until_settled(
    run: RunContext,
    groups: list[Group],
    curves: _Curves,
    quality_range: QualityRange,
    totals: tuple[int, int],
    k_total: int,
) -> tuple[Any, int]:
    """The threshold from every group's knots, again until no group is cut off by its
    own candidate count (those propose twice as many; ``groups`` and ``curves`` are
    updated in place). Returns the counts and the rounds."""
    dirs, rounds = run.dirs, 1
    while True:
        counts = allocate_counts(
            [curves.knots[g.gid] for g in groups],
            [g.k for g in groups],
            lambda i, lo, hi: read_gains(dirs.candidates(groups[i].gid), lo, hi),
            k_total,
        )
        cut_off = saturated(counts, [g.k for g in groups], [g.n for g in groups])
        if not cut_off:
            break
        # Groups cut off by their own candidate count propose again, twice as many (the
        # engine redoes a group whose marker holds another k).
        for i in cut_off:
            g = groups[i]
            groups[i] = replace(g, k=min(g.n, 2 * g.k))
            ask_for_more(dirs, g.gid, groups[i].k)
        fresh: dict[int, dict[str, Any]] = {}
        again = [groups[i] for i in cut_off]
        desc = f"propose more ({rounds})"
        select_round(run, again, quality_range, fresh, propose=True, totals=totals, desc=desc)
        for gid, s in fresh.items():
            curves.knots[gid], curves.centroids[gid] = knots_of(s), s.pop("centroid", None)
            s["earlier"] = earlier_proposals(curves.stats[gid])
            curves.stats[gid] = s
        rounds += 1
    return counts, rounds


def earlier_proposals(stats: dict[str, Any]) -> list[dict[str, Any]]:
    """What a group's stats keep of the proposals before its latest (``k`` and
    ``seconds`` each), oldest first: the manifest's group seconds count every proposal.

    >>> earlier_proposals({"k": 4, "seconds": {"total": 2.0}, "earlier": [{"k": 2}]})
    [{'k': 2}, {'k': 4, 'seconds': {'total': 2.0}}]
    """
    return [*stats.get("earlier", ()), {"k": stats["k"], "seconds": stats["seconds"]}]


def central_round(
    run: RunContext, groups: list[Group], k_total: int, quality_range: QualityRange
) -> dict[str, Any]:
    """Phase 4 (central): one selection of exactly ``k`` over the union of the candidates,
    on one worker that may use the whole machine."""
    job = GlobalJob(tuple(groups), run.spec, run.dirs, k_total, quality_range)
    return run_steps(run.runner, SelectGlobal(), [job], progress=run.progress)[0]


def allocate_tokens_round(
    run: RunContext,
    groups: list[Group],
    quality_range: QualityRange,
    stats: dict[int, dict[str, Any]],
    plan: TokenPlan,
    totals: tuple[float, float],
) -> dict[str, Any]:
    """Round 2 of a token budget allocated by gains per token (:mod:`..select.tokens`): one price
    over every group's candidates (:func:`~..select.tokens.allocate_tokens`), again after groups
    whose every candidate was kept propose twice their tokens; then, as under a document
    budget, the exchange round (every group re-prices its candidates above its lower
    neighbours' kept rows, :mod:`.exchange`) and the price again; every group's kept prefix
    written as its part; the marker last (its ``tokens_kept``)."""
    dirs = run.dirs
    done = reused_allocation(dirs, groups)
    if done is not None:
        return {**done, "reused": True}
    started = time.perf_counter()
    (counts, filled, kept, prices), rounds = _settle_tokens(
        run, groups, quality_range, stats, plan, totals
    )
    source, exchange_started = WorkDir.candidates, time.perf_counter()
    if exchange_applies(run.spec):  # coverage across borders, priced per token
        centroids = _centroids(groups, stats)
        budgets = {g.gid: float(stats[g.gid]["tokens"]["budget"]) for g in groups}
        exchange_steps(run, groups, counts, centroids, quality_range, totals, budgets)
        source = WorkDir.exchange
        counts, filled, kept, prices = _priced_allocation(dirs, groups, plan, source)
    exchange_s = time.perf_counter() - exchange_started
    allocate_s = time.perf_counter() - started
    jobs = [
        AllocatedJob(
            g.gid,
            int(m),
            run.spec,
            str(dirs.part(g.gid)),
            str(source(dirs, g.gid)),
            tuple(int(p) for p in f),
        )
        for g, m, f in zip(groups, counts, filled, strict=True)
    ]
    written = run_steps(run.runner, WriteAllocated(), jobs, progress=run.progress)
    seconds = {
        "allocate": allocate_s - exchange_s,
        "exchange": exchange_s,
        "write": time.perf_counter() - started - allocate_s,
        "total": time.perf_counter() - started,
    }
    n_candidates = sum(len(p) for p in prices)
    extra = {
        "tokens_kept": kept,
        "price": _last_price(prices, counts),
        "filled": int(sum(len(f) for f in filled)),
    }
    kept_per_group = counts + np.asarray([len(f) for f in filled], dtype=np.int64)
    global_stats = finish_allocation(
        dirs, kept_per_group, written, n_candidates, rounds, seconds, extra
    )
    return {**global_stats, "reused": False}


def _priced_allocation(
    dirs: WorkDir, groups: list[Group], plan: TokenPlan, source: Any
) -> tuple[np.ndarray, list[np.ndarray], float, list[np.ndarray]]:
    """:func:`~..select.tokens.allocate_tokens` over the groups' priced candidates in
    ``source`` (``WorkDir.candidates`` or ``WorkDir.exchange``): the kept prefixes, the
    filled positions, the tokens kept, and the prices read."""
    tables = [read_table(source(dirs, g.gid), columns=["price", "length"]) for g in groups]
    prices = [t.column("price").to_numpy() for t in tables]
    lengths = [t.column("length").to_numpy() for t in tables]
    counts, filled, kept = allocate_tokens(prices, lengths, plan.total)
    return counts, filled, kept, prices


def _settle_tokens(
    run: RunContext,
    groups: list[Group],
    quality_range: QualityRange,
    stats: dict[int, dict[str, Any]],
    plan: TokenPlan,
    totals: tuple[float, float],
) -> tuple[tuple[np.ndarray, list[np.ndarray], float, list[np.ndarray]], int]:
    """The price over the groups' candidates, until no group is cut off by its own
    candidates (each such group proposes twice its tokens: ``stats`` updated in place).
    Returns the allocation (:func:`_priced_allocation`) and the rounds."""
    rounds = 1
    while True:
        allocation = _priced_allocation(run.dirs, groups, plan, WorkDir.candidates)
        counts, filled, _, prices = allocation
        cut_off = [
            i
            for i, (g, m, f, p) in enumerate(zip(groups, counts, filled, prices, strict=True))
            if 0 < len(p) == m + len(f) < g.n
        ]
        if not cut_off:
            return allocation, rounds
        for i in cut_off:  # its curve may go on above the price: twice its tokens
            gid = groups[i].gid
            ask_for_tokens(run.dirs, gid, 2.0 * stats[gid]["tokens"]["budget"])
        fresh: dict[int, dict[str, Any]] = {}
        again = [groups[i] for i in cut_off]
        desc = f"propose more ({rounds})"
        select_round(
            run, again, quality_range, fresh, propose=True, totals=totals, desc=desc, tokens=plan
        )
        for gid, s in fresh.items():
            s["earlier"] = earlier_proposals(stats[gid])
        stats.update(fresh)
        rounds += 1


def _centroids(groups: list[Group], stats: dict[int, dict[str, Any]]) -> dict[int, np.ndarray]:
    """Each group's centroid from its select step's stats; zeros (nobody's neighbour, and
    without neighbours) for a group that had no rows or a marker without one."""
    found = {g.gid: stats[g.gid].get("centroid") for g in groups}
    width = next((len(c) for c in found.values() if c is not None), 1)
    return {
        gid: np.zeros(width, np.float32) if c is None else np.asarray(c, np.float32)
        for gid, c in found.items()
    }


def _last_price(prices: list[Any], counts: Any) -> float | None:
    """The lowest price of the kept prefixes: the allocation's threshold."""
    kept = [float(p[m - 1]) for p, m in zip(prices, counts, strict=True) if m]
    return min(kept) if kept else None
