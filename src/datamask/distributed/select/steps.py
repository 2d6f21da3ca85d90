"""The pure steps of a sharded run: read a group, select it, the central round.

Every step reads only what it is given, writes its files atomically (temporary name, then
``os.replace``) and its completion marker last, and returns its stats; run again with a
marker in place, it returns the marker's stats without recomputing. The executors
(:mod:`..executors`, :mod:`..ray_backend`) only schedule them; the driver
(:mod:`..runner`) orders them into phases. The allocation's steps are in :mod:`..combine.allocate`.

Layout of a group's files (``OUT`` is ``--output``, ``WORK`` the work dir)::

    WORK/groups/NNNNN.parquet         every row of the group: id, logit, probability, rank,
                                      selected (skipped with ``selected_only``)
    WORK/candidates/NNNNN.parquet     budget="global", round 1: the group's candidates
    WORK/graphs/NNNNN.npz             the group's neighbour graph, kept for the exchange round
                                      and the cover (which deletes it): :mod:`.graphs`
    WORK/completions/NNNNN            JSON stats; written last, after the group's files
    OUT/selected/part-NNNNN.parquet   the group's kept ids (budget="group", or allocated)
"""

from __future__ import annotations

import math
import os
import socket
import time
from dataclasses import dataclass
from functools import partial
from pathlib import Path
from typing import Any

import numpy as np
import pyarrow as pa

from ..._memory import peak_rss_mb, release_heap
from ..._validation import check_corpus
from ...config import SelectSpec
from ...data import Corpus, Selection, rank_order
from ...io.parquet import atomic_write_table, features_column, features_matrix, read_table
from ...io.shards import (
    corpus_from_tables,
    read_rows,
)
from ...io.text import lengths_from_arrow
from ...pipeline.step import MODULAR, fit_group, gain_curve
from ...pipeline.writer import selection_table
from ..check.validate import QualityRange
from ..combine.gains import gain_knots, gain_table, gains_in_j_units, group_spec, monotone
from ..engine import Step
from ..executors import group_memory_bytes
from ..paths import WorkDir
from ..plan.partition import (
    Group,
)
from .given import group_floor, kept_counts
from .graphs import keep_graph, saved_graph
from .tokens import TokenPlan, select_tokens, wanted_tokens

__all__ = [
    "candidate_count",
    "gain_table",
    "read_group",
    "GlobalJob",
    "GroupJob",
    "SelectGlobal",
    "SelectGroup",
]


# --- the pure step --------------------------------------------------------------------------
def read_group(
    group: Group, spec: SelectSpec, quality_range: QualityRange | None = None
) -> tuple[Any, pa.Array]:
    """The rows of one group as a Corpus (not yet validated) and its ids as stored.

    ``quality_range`` is the corpus-wide ``(lows, highs)`` of the quality columns that
    the group scales its quality with (default: its own range).
    """
    tables = [
        (
            read_rows(p.path, p.start, p.stop, spec.read_columns),
            f"{p.path} (rows {p.start}-{p.stop})",
        )
        for p in group.pieces
    ]
    corpus, ids = corpus_from_tables(
        tables,
        spec.columns,
        source=f"group {group.gid} ({group.label})",
        quality_range=quality_range or None,
    )
    for name in spec.objective.columns:  # what the terms read (requires_columns)
        corpus.extra[name] = np.concatenate(
            [t.column(name).to_numpy(zero_copy_only=False) for t, _ in tables]
        )
    column = spec.selector.length_col
    if spec.selector.token_budget and column is not None and tables:  # a token budget: each length
        corpus.lengths = np.concatenate(
            [lengths_from_arrow(t.column(column), column, where) for t, where in tables]
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
        "term_labels": sel.meta["term_labels"],
    }


@dataclass(frozen=True, slots=True)
class GroupJob:
    """What a group step reads: the group, the run's spec and places, the corpus-wide
    quality range, and how the group proposes.

    ``propose``: round 1 of a global budget (candidates, not the group's part);
    ``totals``: the corpus' ``(k, N)`` when the budget is allocated by gains;
    ``rate``: the union's ``(k, N)`` given KEPT with a budget per group; ``width`` and
    ``n_kept`` (KEPT's kept rows every step reads) size the job's memory request.
    """

    group: Group
    spec: SelectSpec
    dirs: WorkDir
    quality_range: QualityRange | None = None
    propose: bool = False
    totals: tuple[int, int] | None = None
    rate: tuple[int, int] | None = None
    width: int = 0
    n_kept: int = 0
    tokens: TokenPlan | None = None


class SelectGroup(Step[GroupJob]):
    """Select ``group.k`` documents of one group and write its files.

    Reads only the group's rows (quality scaled by the corpus-wide ``quality_range``), runs
    the method with ``group.seed``, then writes ``WORK/groups/NNNNN.parquet`` (unless
    ``spec.run.selected_only``) and its result; the engine writes the marker
    ``WORK/completions/NNNNN`` last. The result is ``OUT/selected/part-NNNNN.parquet``
    (ids kept); with ``propose`` (round 1 of a global budget) it is
    ``WORK/candidates/NNNNN.parquet`` instead: the ``group.k`` candidates with their rank,
    score, raw quality and embedding (score and rank only for :data:`MODULAR` methods),
    which :class:`SelectGlobal` reads. With ``totals``, the corpus' ``(k, N)``, the group
    proposes for a budget allocated by gains instead (:mod:`datamask.distributed.combine.allocate`):
    it selects at the corpus' exchange rate between quality and coverage and writes its
    candidates in greedy order with their marginal gains in ``J`` units (id, group, rank,
    gain). Given KEPT (``spec.selector.given``) the group's rows get their floors against
    KEPT's kept rows (:func:`~datamask.distributed.select.given.group_floor`) and, with a budget
    per group, the objective runs at the rate of ``rate``, the union's ``(k, N)``
    (:func:`~datamask.distributed.select.given.rate_totals`).

    Stats: ``gid``, ``label``, ``n``, ``k``, ``seconds`` (read, fit, write, total),
    ``docs_per_second``, ``peak_rss_mb``, ``gpu_peak_mb``, ``device``, ``host``, ``pid``,
    ``terms`` (empty: the group is not scored on its own), ``term_labels`` (the terms it
    optimised) and ``reused``.
    """

    name = "select"
    use_gpu = True

    def marker(self, job: GroupJob) -> Path:
        return job.dirs.completion(job.group.gid)

    def outputs(self, job: GroupJob) -> tuple[Path, ...]:
        gid, dirs = job.group.gid, job.dirs
        if job.tokens is not None:  # the fill step (or the central round) writes the part
            offers = () if job.propose else (dirs.offer(gid),)
            return (dirs.candidates(gid), *offers)
        # the ranked rows too where the cap across groups reads them (a marker without them
        # is not reused: the cap would find no ranking to walk)
        rows = (dirs.group_rows(gid),) if job.spec.selector.max_similarity is not None else ()
        return (dirs.candidates(gid) if job.propose else dirs.part(gid), *rows)

    def accepts(self, job: GroupJob, done: dict[str, Any]) -> bool:
        if job.tokens is not None:  # a token budget: done for the same budget (and ask)
            wanted = wanted_tokens(job.dirs, job.group.gid) if job.totals else None
            return done.get("token_plan") == [job.tokens.total, job.tokens.corpus] and (
                done.get("tokens", {}).get("wanted") == wanted
            )
        return done.get("k") == job.group.k  # asked for more candidates since: not done

    def size(self, job: GroupJob) -> int:
        return job.group.n

    def memory(self, job: GroupJob) -> int:
        # given KEPT, every step also reads its kept rows (float32, and a copy for torch)
        return group_memory_bytes(job.group.n, job.width) + 8 * job.n_kept * job.width

    def run(self, job: GroupJob) -> dict[str, Any]:
        group, spec, dirs = job.group, job.spec, job.dirs
        started = time.perf_counter()
        # 1. Read only this group's rows (row groups overlapping each piece).
        corpus, ids = read_group(group, spec, job.quality_range)
        n = corpus.n_docs
        if n:  # unit rows: what the fit selects from and the candidates hold
            corpus = check_corpus(corpus)
        floor = group_floor(corpus, spec, dirs)  # given KEPT: each row's floor
        read_s = time.perf_counter() - started
        if job.tokens is not None:
            propose = None  # proposing: the central round's candidates, with lengths
            if job.propose:
                propose = partial(
                    _propose_candidates,
                    group=group,
                    spec=spec,
                    corpus=corpus,
                    ids=ids,
                    dirs=dirs,
                )
            return select_tokens(job, corpus, ids, started, read_s, _group_stats, propose)

        # 2. Run the method for exactly k (nothing to learn when k is 0 or n): the one
        #    step. Not scored exactly: a group's own J is not the corpus' (an n x k pass
        #    saved). A group proposing again (its curve was kept whole) re-uses the graph
        #    its first proposal saved for the exchange round (building it again was most
        #    of the second proposals' time). Its first K' <= K columns are the graph a new
        #    build would give (ivf and fp32 exact candidates do not depend on K; bf16
        #    exact on CUDA re-ranks more candidates for a larger K: as good or better).
        fit_spec = _group_fit_settings(spec, group.k, n, job.totals, floor, job.rate)
        graph = None
        if job.totals is not None and n:
            graph = saved_graph(dirs.graph(group.gid))
        sel, objective = fit_group(
            corpus, group.k, fit_spec, seed=group.seed, stored_ids=ids, evaluate=False, graph=graph
        )
        if job.totals is not None:  # proposing by gains: the candidates' curve
            gain_curve(corpus, sel, objective, fit_spec, group.seed)
        keep_graph(job, corpus, objective)
        del objective
        fit_s = time.perf_counter() - started - read_s

        # 3. Write the group's files atomically (the engine writes the marker last).
        proposal = _write_group(sel, job, fit_spec, corpus, ids)
        del corpus
        stats = _group_stats(group, sel, n, started, read_s, fit_s)
        stats["graph_reused"] = graph is not None
        if floor is not None:
            stats["floor"] = floor
        stats.update(proposal)  # gain_knots and centroid, proposing by gains
        release_heap()  # the worker's next step starts from what it holds, not its peak
        return stats


def _write_group(
    sel: Selection, job: GroupJob, fit_spec: SelectSpec, corpus: Corpus, ids: pa.Array
) -> dict[str, Any]:
    """Write a group's files (the writer ranks: kept rows first, then by score, ties by
    id): its ranked rows, then its candidates (``job.propose``) or its part of the result.
    Returns what the stats add (proposing by gains: ``gain_knots`` and ``centroid``; else
    nothing)."""
    group, spec = job.group, job.spec
    id_col = spec.columns.id_col
    if not spec.run.selected_only or spec.selector.max_similarity is not None:
        atomic_write_table(
            selection_table(sel, id_col=id_col, stored_ids=ids, group=group.gid, probability=True),
            job.dirs.group_rows(group.gid),
        )
    if job.propose and job.totals is not None:
        return _propose_by_gains(sel, job, fit_spec, corpus, ids)
    if job.propose:
        _propose_candidates(sel, group, spec, corpus, ids, job.dirs)
    else:
        table = selection_table(sel, id_col=id_col, stored_ids=ids, group=group.gid, kept_only=True)
        atomic_write_table(table, job.dirs.part(group.gid))
    return {}


def _group_fit_settings(
    spec: SelectSpec,
    k: int,
    n: int,
    totals: tuple[int, int] | None,
    floor: dict | None,
    rate: tuple[int, int] | None,
) -> SelectSpec:
    """The spec a group is fitted with. Proposing for an allocated budget: at the corpus'
    exchange rate (``totals``). Given KEPT with a budget per group: at the union's rate
    ``rate`` (as the one-file run). Otherwise the run's."""
    if totals is not None:
        return group_spec(spec, k, n, *totals)
    if floor is not None and rate is not None and n:
        return group_spec(spec, k, n, *rate)
    return spec


def _propose_by_gains(
    sel: Selection, job: GroupJob, fit_spec: SelectSpec, corpus: Corpus, ids: pa.Array
) -> dict[str, Any]:
    """Write the group's candidates in greedy order with their marginal gains in ``J``
    units (its graph, for the exchange round: :func:`.graphs.keep_graph`). Returns what
    the stats add: ``gain_knots`` (what the allocation reads first) and ``centroid``."""
    group, spec, dirs = job.group, job.spec, job.dirs
    assert job.totals is not None  # proposing by gains
    n = corpus.n_docs
    order, gains = sel.meta["gain_order"]
    logits = sel.logits if sel.logits is not None else sel.scores  # as the writer's
    lamb, lamb_g = spec.objective.lamb, fit_spec.objective.lamb
    gains = monotone(gains_in_j_units(gains, lamb, lamb_g, group.k, n, *job.totals))
    id_col = spec.columns.id_col
    # corpus.features are unit rows: checked after the read
    table = gain_table(ids, order, group.gid, logits, gains, corpus.features, id_col)
    atomic_write_table(table, dirs.candidates(group.gid))
    return {
        "gain_knots": [a.tolist() for a in gain_knots(gains)],
        "centroid": corpus.features.mean(0).tolist(),  # where the exchange round looks
    }


def _propose_candidates(
    sel: Selection,
    group: Group,
    spec: SelectSpec,
    corpus: Corpus,
    ids: pa.Array,
    dirs: WorkDir,
) -> None:
    """Round 1 of a global budget: write the ``group.k`` candidates with their score (and,
    for a method that is not modular, raw quality, embedding and the terms' columns, what
    :func:`select_global` selects from)."""
    extra: dict[str, Any] = {"score": sel.scores}
    if spec.selector.method not in MODULAR:
        for j in range(len(spec.columns.quality_cols)):
            extra[f"quality_{j}"] = corpus.quality[:, j]
        extra["features"] = features_column(corpus.features)
        for name in spec.objective.columns:  # the terms' columns, for round 2
            extra[f"extra_{name}"] = corpus.extra[name]
        if corpus.lengths is not None:  # a token budget: the central round's lengths
            extra["length"] = corpus.lengths
    table = selection_table(
        sel,
        id_col=spec.columns.id_col,
        stored_ids=ids,
        group=group.gid,
        kept_only=True,
        extra=extra,
    )
    atomic_write_table(table, dirs.candidates(group.gid))


def _group_stats(
    group: Group, sel: Selection, n: int, started: float, read_s: float, fit_s: float
) -> dict[str, Any]:
    """A group's stats: ids, counts, seconds per phase, throughput and where it ran."""
    total_s = time.perf_counter() - started
    return {
        "gid": group.gid,
        "label": group.label,
        "n": n,
        "k": len(sel.selected),
        "seed": group.seed,
        "seconds": {
            "read": read_s,
            "fit": fit_s,
            "write": total_s - read_s - fit_s,
            "total": total_s,
            # inside the fit: the graph, the method, the gain curve (proposing by gains)
            **{
                f"fit_{key}": sel.meta.get("seconds", {}).get(key)
                for key in ("graph", "optimise", "gain_order")
            },
        },
        "docs_per_second": n / total_s if total_s > 0 else None,
        **_where_it_ran(sel),
    }


@dataclass(frozen=True, slots=True)
class GlobalJob:
    """Round 2 of a global budget: every group's candidates, the budget, the places."""

    groups: tuple[Group, ...]
    spec: SelectSpec
    dirs: WorkDir
    k_total: int
    quality_range: QualityRange


class SelectGlobal(Step[GlobalJob]):
    """Round 2 of a global budget: exactly ``k_total`` documents from the groups' candidates.

    :data:`MODULAR` methods merge the candidates' scores: the ``k_total`` best (ties by id)
    are exactly the global top k (each group proposed ``min(n_g, k_total)``). Every other
    method runs once more, with the run's seed, on the union of the candidates (quality
    scaled by the corpus-wide range), as in GreeDi (Mirzasoleiman et al. 2013). Writes
    ``OUT/selected/part-global.parquet`` (id, group, rank, logit); the engine writes the
    marker ``WORK/completions/global`` last.
    """

    name = "global round"
    unit = "round"
    use_gpu = True
    whole_machine = True

    def marker(self, job: GlobalJob) -> Path:
        return job.dirs.global_marker()

    def outputs(self, job: GlobalJob) -> tuple[Path, ...]:
        return (job.dirs.global_part(),)

    def run(self, job: GlobalJob) -> dict[str, Any]:
        return _select_global(job.groups, job.spec, job.dirs, job.k_total, job.quality_range)


def _select_global(
    groups: tuple[Group, ...],
    spec: SelectSpec,
    dirs: WorkDir,
    k_total: int,
    quality_range: QualityRange,
) -> dict[str, Any]:
    final = dirs.global_part()
    started = time.perf_counter()
    tables = [read_table(dirs.candidates(g.gid)) for g in groups]
    table = pa.concat_tables([t for t in tables if t.num_rows] or tables[:1])
    del tables
    ids = table.column(spec.columns.id_col).combine_chunks()
    ids_np = ids.to_numpy(zero_copy_only=False)
    n = table.num_rows
    lengths = table.column("length").to_numpy() if "length" in table.column_names else None
    read_s = time.perf_counter() - started
    if spec.selector.method in MODULAR:  # an exact merge of comparable scores
        scores = table.column("score").to_numpy()
        sel = Selection(np.sort(rank_order(scores, ids_np)[:k_total]), scores, ids=ids_np)
        sel.meta.update(terms={}, term_labels=[], device="none", gpu_peak_mb=None)
    else:
        corpus = Corpus(
            ids=ids_np,
            quality=np.stack(
                [table.column(f"quality_{j}").to_numpy() for j in range(len(quality_range[0]))],
                axis=1,
            ),
            features=features_matrix(table.column("features")),
            quality_names=list(spec.columns.quality_cols),
            quality_weights=None
            if spec.columns.quality_weights is None
            else np.asarray(spec.columns.quality_weights, float),
            source="the candidates of every group",
            id_name=spec.columns.id_col,
            quality_range=(np.asarray(quality_range[0]), np.asarray(quality_range[1])),
            extra={
                name: table.column(f"extra_{name}").to_numpy(zero_copy_only=False)
                for name in spec.objective.columns
            },
            lengths=lengths,
        )
        table = table.drop_columns(["features"])
        fit_spec = spec
        if group_floor(corpus, spec, dirs) is not None:  # given KEPT
            # the candidates stand for the new documents, as in the one-file run (a token
            # budget: T of the candidates' tokens, KEPT's in tokens)
            counts = kept_counts(dirs)
            k_c, n_c, kept, docs = k_total, n, counts["n_kept"], counts["n_docs"]
            if lengths is not None:
                k_c, n_c = spec.selector.budget_tokens, float(lengths.sum())
                kept, docs = counts["tokens_kept"], counts["tokens_docs"]
            fit_spec = group_spec(spec, k_c, n_c, kept + k_c, docs + n_c)
        sel, _ = fit_group(corpus, k_total, fit_spec, seed=int(spec.selector.seed))
        del corpus
    fit_s = time.perf_counter() - started - read_s
    out = selection_table(
        sel,
        id_col=spec.columns.id_col,
        stored_ids=ids,
        group=table.column("group").combine_chunks(),
        kept_only=True,
    )
    atomic_write_table(out, final)
    total_s = time.perf_counter() - started
    stats = {} if lengths is None else {"tokens_kept": float(lengths[sel.selected].sum())}
    return {
        **stats,
        "n_candidates": n,
        "k": len(sel.selected),
        "seconds": {"read": read_s, "fit": fit_s, "total": total_s},
        **_where_it_ran(sel),
    }
