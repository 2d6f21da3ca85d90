"""The exchange round of a budget allocated by gains: coverage across group borders.

A group counts coverage only over its own documents, so a document near a border, already
covered by a neighbouring group's kept rows, still pays for rows in its own group: the
groups over-buy coverage and under-buy quality (measured in ``benchmarks/scale/
SHARDED.md``). After the first allocation every group re-prices its candidates once:

1. **Neighbours.** Each group takes up to ``exchange_neighbors`` groups with a lower id,
   the nearest by the mean of their unit embeddings (:func:`exchange_neighbors`). Only
   lower ids: two groups that both counted on the other would both drop their shared
   border (one parallel round of all groups against each other loses J; this
   orientation is a Gauss-Seidel sweep done in parallel).
2. **Floors.** A document's floor is its best cosine to the neighbours' kept documents
   (the first ``m`` rows of their candidates, which carry their embeddings), found by the
   ivf search (:func:`~datamask.neighbors.best_match`, ``method="ivf"``), or on a run's
   GPU by comparing every pair there (exact: blocked products are cheap on it).
3. **Re-price.** On the group's graph (the one its select step saved,
   ``WORK/graphs/NNNNN.npz``, else built again), coverage is counted above the floor
   (:meth:`~datamask.objectives.facility_location.FacilityLocation.raise_floor`) and the
   same candidates are ordered again by lazy greedy, with their gains in ``J`` units.
4. The driver allocates the budget again over the new curves and writes the parts from
   them (:mod:`..runner`).

Under a token budget the same round runs after the price settles
(:func:`~.rounds.allocate_tokens_round`): the neighbours' kept rows are the prefixes the
price kept (not the few rows its fill added), the objective is bound with the group's
proposed tokens, the candidates are ordered by gain per token (the cost-benefit lazy
greedy) and priced again (:func:`~.gains.with_prices`), and one price over the new
candidates keeps the budget.

Files: ``WORK/exchange/NNNNN.parquet`` (the candidates re-ordered, the layout of
``WORK/candidates/``) and its marker ``WORK/exchange/NNNNN.json`` (knots), written last.
"""

from __future__ import annotations

import math
import time
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import pyarrow as pa
import torch

from ..._device import accelerator, resolve_device
from ..._memory import bound_heap, peak_rss_mb, release_heap
from ..._validation import check_corpus
from ...budget import TokenBudget
from ...config import SelectSpec
from ...greedy.lazy import gain_order
from ...io.parquet import atomic_write_table, features_matrix, read_table
from ...neighbors import best_match, ivf_search
from ...objectives.facility_location import FacilityLocation, facility_term
from ...selectors import SELECTORS
from ..check.validate import QualityRange
from ..context import RunContext
from ..engine import Step, run_steps
from ..paths import WorkDir
from ..plan.partition import Group
from ..select.given import group_floor
from ..select.graphs import saved_graph
from ..select.steps import read_group
from .allocate import allocate_counts, knots_of, read_gains
from .gains import (
    gain_knots,
    gain_table,
    gains_in_j_units,
    group_spec,
    monotone,
    with_prices,
)

__all__ = [
    "EXACT_NEIGHBORS_MAX",
    "EXCHANGE_PROBE_FRACTION",
    "exchange_applies",
    "ExchangeGroup",
    "ExchangeJob",
    "exchange_neighbors",
    "exchange_round",
    "exchange_steps",
]


#: Up to this many groups a group's neighbours are exact (every pair of centroids, in
#: blocks: O(G^2 d) on the driver, 2 s at 10^4 groups). Above it our ivf search lists each
#: centroid's ``APPROX_NEIGHBORS_FACTOR * n_neighbors`` nearest, probing
#: ``APPROX_NEIGHBORS_PROBES`` of sqrt(G) lists (O(G^1.5 d)), and keeps the lower ones. On
#: 30,000 clustered 64-d centroids: 93% of the exact neighbours found, 88% of the groups
#: with a full list, 1.7 s against 8.6 s.
EXACT_NEIGHBORS_MAX = 20_000
APPROX_NEIGHBORS_FACTOR = 8
APPROX_NEIGHBORS_PROBES = 8

#: The share of the ivf lists each row's floor search probes (``--given``'s floors probe
#: :data:`~datamask.neighbors.FLOOR_PROBE_FRACTION`, 0.2). The floors were half of the
#: exchange round's cost at 1M (8 neighbours' kept rows, ~53,000, against every row of a
#: 100,000-row group); a floor the search misses is a little low, never too high, and at
#: 0.05 J at 200k stayed where it was (benchmarks/scale/RESULTS.md, "exchange round").
EXCHANGE_PROBE_FRACTION = 0.05


def exchange_neighbors(
    centroids: np.ndarray | Sequence[np.ndarray], n_neighbors: int, *, lower_only: bool = True
) -> list[list[int]]:
    """For every group, up to ``n_neighbors`` groups of lower index (any other index with
    ``lower_only=False``: the cover step's), nearest first by the cosine of their
    centroids (rows of ``centroids``, or one array per group); exact up to
    :data:`EXACT_NEIGHBORS_MAX` groups, approximate above (a group may then get fewer).

    >>> c = np.array([[1.0, 0.0], [0.9, 0.1], [0.0, 1.0], [0.8, 0.2]])
    >>> exchange_neighbors(c, 2)
    [[], [0], [1, 0], [1, 0]]
    >>> exchange_neighbors(c, 2, lower_only=False)
    [[1, 3], [0, 3], [3, 1], [1, 0]]
    """
    c = np.array(centroids, dtype=np.float32)  # our own copy, scaled in place
    norms = np.linalg.norm(c, axis=1, keepdims=True)
    c /= np.where(norms > 0, norms, 1.0)  # a zero centroid is nobody's neighbour
    if n_neighbors < 1:
        return [[] for _ in range(len(c))]
    if len(c) > EXACT_NEIGHBORS_MAX:
        x = torch.from_numpy(c)
        idx, sims = ivf_search(
            x,
            x,
            min(len(c), APPROX_NEIGHBORS_FACTOR * n_neighbors + 1),
            n_probe=APPROX_NEIGHBORS_PROBES,
            n_lists=int(math.sqrt(len(c))),
        )
        near, ok = idx.numpy(), sims.numpy() > -1.0
        own = np.arange(len(c))[:, None]
        ok &= (near < own) if lower_only else (near != own)  # no padding, never itself
        # most similar first, as the search sorts them; row by row, not as Python lists of
        # every candidate (those took 440 MB at 10^5 groups)
        return [row[keep][:n_neighbors].tolist() for row, keep in zip(near, ok, strict=True)]
    out = []
    step = max(1, (1 << 24) // max(len(c), 1))
    for lo in range(0, len(c), step):
        sims = c[lo : lo + step] @ c.T
        for r, row in enumerate(sims):
            g = lo + r
            others = np.arange(g) if lower_only else np.delete(np.arange(len(c)), g)
            near = row[others]
            take = min(n_neighbors, len(others))
            if take == 0:
                out.append([])
                continue
            best = np.argpartition(-near, take - 1)[:take]
            out.append([int(others[h]) for h in best[np.argsort(-near[best], kind="stable")]])
    return out


def _floors(
    x: torch.Tensor, kept: list[np.ndarray], device: torch.device | None = None
) -> torch.Tensor:
    """Each row's best cosine (clipped at 0) to any row of ``kept``: on the host by the ivf
    search (:data:`EXCHANGE_PROBE_FRACTION` of its lists probed; a floor the search misses
    is a little low, so the group buys a little more coverage than it needs, never less),
    or, given a ``device`` (the run's GPU), every pair compared there (exact)."""
    blocks = [b for b in kept if len(b)]
    if not blocks:
        return torch.zeros(x.shape[0], dtype=x.dtype)
    base = torch.from_numpy(np.concatenate(blocks).astype(np.float32, copy=False))
    if device is not None:
        sims, _, _ = best_match(x.to(device), base.to(device), method="exact")
        return sims.cpu().clamp_min_(0.0)
    sims, _, _ = best_match(x, base, method="ivf", probe_fraction=EXCHANGE_PROBE_FRACTION)
    return sims.clamp_min_(0.0)


@dataclass(frozen=True, slots=True)
class ExchangeJob:
    """One group's exchange: its neighbours ``(gid, m)`` (a neighbouring group and how
    many of its candidates the first allocation kept), the run's spec and work dir, the
    corpus-wide quality range and the ``(k, N)`` of the rate (``(T, L)`` in tokens);
    ``budget_tokens``: under a token budget, the tokens the group proposed."""

    group: Group
    neighbors: tuple[tuple[int, int], ...]
    spec: SelectSpec
    dirs: WorkDir
    quality_range: QualityRange
    totals: tuple[float, float]
    budget_tokens: float | None = None


class ExchangeGroup(Step[ExchangeJob]):
    """Re-price one group's candidates above the coverage its lower neighbours' kept rows
    give (steps 2-3 of the module's docstring). Writes ``WORK/exchange/NNNNN.parquet``;
    the engine writes its marker (with the curve's knots) last. The group's saved graph
    stays for the cover step, which reads the group's own nearest kept rows from it and
    deletes it (:class:`~..finish.cover.CoverGroup`); without a cover (``selected_only``) it is
    deleted once marked (:meth:`release`)."""

    name = "exchange"

    def marker(self, job: ExchangeJob) -> Path:
        return job.dirs.exchange_marker(job.group.gid)

    def outputs(self, job: ExchangeJob) -> tuple[Path, ...]:
        return (job.dirs.exchange(job.group.gid),)

    def size(self, job: ExchangeJob) -> int:
        return job.group.n

    def release(self, job: ExchangeJob) -> None:
        if job.spec.run.selected_only:  # no cover step reads it: disk goes back now
            job.dirs.graph(job.group.gid).unlink(missing_ok=True)

    def run(self, job: ExchangeJob) -> dict[str, Any]:
        bound_heap()
        started = time.perf_counter()
        gid = job.group.gid
        own = read_table(job.dirs.candidates(gid))
        if not job.neighbors or own.num_rows == 0:  # nothing to re-price: the order stands
            atomic_write_table(own, job.dirs.exchange(gid))
            gains = own.column("gain").to_numpy()
            stats = {"gid": gid, "floors": 0, "seconds": {"total": 0.0}}
        else:
            gains, stats = _reprice(own, job, started)
        stats.update(
            gain_knots=[a.tolist() for a in gain_knots(np.asarray(gains, dtype=np.float64))],
            candidates=int(own.num_rows),
            peak_rss_mb=peak_rss_mb(),
        )
        release_heap()
        return stats


def _reprice(own: pa.Table, job: ExchangeJob, started: float) -> tuple[np.ndarray, dict[str, Any]]:
    """:class:`ExchangeGroup`'s work: re-price the candidates ``own`` (a table) above the
    floors of the neighbours' kept rows and write them to the group's exchange file. Returns
    the gains (in ``J`` units, monotone) and the stats (floors, graph, seconds since
    ``started``)."""
    group, neighbors, spec, dirs = job.group, job.neighbors, job.spec, job.dirs
    totals = job.totals
    out = dirs.exchange(group.gid)
    id_col = spec.columns.id_col
    # 1. The group's rows, and its candidates' positions among them.
    corpus, ids = read_group(group, spec, job.quality_range)
    corpus = check_corpus(corpus)
    group_floor(corpus, spec, dirs)  # given KEPT: raise_floor keeps the larger
    n = corpus.n_docs
    row_of = {v: i for i, v in enumerate(ids.to_pylist())}
    rows = np.asarray([row_of[v] for v in own.column(id_col).to_pylist()], dtype=np.int64)
    read_s = time.perf_counter() - started
    # 2. Floors from the neighbours' kept prefixes (their unit embeddings).
    kept = []
    for gid, m in neighbors:
        if m > 0:
            t = read_table(dirs.candidates(gid), columns=["features"]).slice(0, m)
            kept.append(features_matrix(t.column(0)))
    x = torch.from_numpy(corpus.features)  # unit rows: the checked corpus
    floor = _floors(x, kept, accelerator(spec.selector.device))
    floors_s = time.perf_counter() - started - read_s
    # 3. The group's objective at the rate it proposed with, coverage above the floor.
    objective, lamb_g, c, size, sizes, saved = _group_objective(job, corpus, len(rows))
    for _, term in objective.terms:
        if isinstance(term, FacilityLocation):
            term.raise_floor(floor)  # builds the graph first
    graph_s = time.perf_counter() - started - read_s - floors_s
    order, raw = gain_order(objective, rows, sizes=sizes)  # per token: cost-benefit
    order_s = time.perf_counter() - started - read_s - floors_s - graph_s
    gains = gains_in_j_units(raw, spec.objective.lamb, lamb_g, c, size, *totals)
    if sizes is None:  # per token the prices are made non-increasing (with_prices)
        gains = monotone(gains)
    logits = np.zeros(n, np.float32)
    logits[rows] = own.column("logit").to_numpy()
    table = gain_table(ids, order, group.gid, logits, gains, corpus.features, id_col)
    atomic_write_table(table if sizes is None else with_prices(table, gains, sizes[order]), out)
    stats = {
        "gid": group.gid,
        "floors": int((floor > 0).sum()),
        "mean_floor": float(floor.double().mean()),
        "graph": "saved" if saved is not None and saved.graph_method_ == "given" else "built",
        "seconds": {
            "read": read_s,
            "floors": floors_s,
            "graph": graph_s,
            "order": order_s,
            "total": time.perf_counter() - started,
        },
    }
    return gains, stats


def _group_objective(
    job: ExchangeJob, corpus: Any, n_candidates: int
) -> tuple[Any, float, float, float, np.ndarray | None, Any]:
    """The group's objective bound as its select step bound it, with its saved graph:
    ``(objective, group lamb, c, n, sizes, facility term)``, ``c`` and ``n`` what its gains
    were put in ``J`` units with (candidates and rows; under a token budget the tokens it
    proposed and its tokens, ``sizes`` its lengths, gains per token)."""
    spec, group = job.spec, job.group
    budget, sizes, k = None, None, n_candidates
    c, size = n_candidates, corpus.n_docs
    if job.budget_tokens is not None:
        sizes = np.asarray(corpus.lengths, dtype=np.float64)
        c, size = float(job.budget_tokens), float(sizes.sum())
        budget = TokenBudget(sizes, c)
        k = budget.expected_count()
    fit = group_spec(spec, c, size, *job.totals)
    objective = fit.objective.make()
    saved = facility_term(objective)
    if saved is not None:  # the graph the group's learner used, when its step saved it
        saved.graph = saved_graph(job.dirs.graph(group.gid))
    objective = objective.bind(  # bound as the group's selector bound it
        corpus,
        k,
        resolve_device(spec.selector.device),
        seed=group.seed,
        max_neighbors=SELECTORS[spec.selector.method].max_neighbors,
        budget=budget,
    )
    return objective, fit.objective.lamb, c, size, sizes, saved


def exchange_round(
    run: RunContext,
    groups: list[Group],
    counts: np.ndarray,
    centroids: dict[int, Any],
    quality_range: QualityRange,
    totals: tuple[int, int],
    k_total: int,
) -> np.ndarray:
    """The exchange round (:mod:`.exchange`): every group re-orders its candidates above
    the cover of its nearest lower groups' kept rows, then the budget ``k_total`` is
    allocated again. ``totals`` is the ``(k, N)`` of the rate
    (:func:`~..select.given.rate_totals`)."""
    done = exchange_steps(run, groups, counts, centroids, quality_range, totals)
    return allocate_counts(
        [knots_of(done[g.gid]) for g in groups],
        [g.k for g in groups],
        lambda i, lo, hi: read_gains(run.dirs.exchange(groups[i].gid), lo, hi),
        k_total,
    )


def exchange_steps(
    run: RunContext,
    groups: list[Group],
    counts: np.ndarray,
    centroids: dict[int, Any],
    quality_range: QualityRange,
    totals: tuple[float, float],
    budgets: dict[int, float] | None = None,
) -> dict[int, dict[str, Any]]:
    """Every group's :class:`ExchangeGroup` step (its neighbours: the nearest lower groups
    by ``centroids``, with the ``counts`` of candidates the allocation kept of them); under
    a token budget ``budgets`` holds the tokens each group proposed. Returns the steps'
    stats by gid; the re-ordered candidates are in ``WORK/exchange/``."""
    near = exchange_neighbors(  # it stacks them into its own copy: no second one here
        [centroids[g.gid] for g in groups], run.spec.partition.exchange_neighbors
    )
    jobs = [
        ExchangeJob(
            g,
            tuple((groups[h].gid, int(counts[h])) for h in near[i]),
            run.spec,
            run.dirs,
            quality_range,
            totals,
            None if budgets is None else float(budgets[g.gid]),
        )
        for i, g in enumerate(groups)
    ]
    results = run_steps(run.runner, ExchangeGroup(), jobs, progress=run.progress)
    return {r["gid"]: r for r in results}


def exchange_applies(spec: SelectSpec) -> bool:
    """Whether the exchange round runs: a global budget allocated by gains whose diversity
    is facility location (the only term with a floor), and ``exchange_neighbors > 0``."""
    terms = spec.objective.make().diversity
    return (
        spec.partition.exchange_neighbors > 0
        and bool(terms)
        and all(isinstance(t, FacilityLocation) for t in terms)
    )
