"""The one group step: any method of the registry, exactly k rows, a :class:`Selection`.

A single file is a plan with one group; a sharded corpus is many groups and, with the
global budget, one more round over their candidates. Every one of them runs
:func:`fit_group`, so a method, a term or a setting means the same thing everywhere.
"""

from __future__ import annotations

import time
from typing import Any

import numpy as np
import pyarrow as pa
import torch

from .._device import resolve_device
from .._memory import bound_heap
from .._validation import check_corpus, k_from_ratio
from ..budget import TokenBudget
from ..config import SelectSpec
from ..coverage import Cover, nearest_kept
from ..data import Corpus, Selection, rank_order
from ..greedy.lazy import gain_order
from ..neighbors import sampled_recall
from ..objectives.facility_location import facility_term
from ..selectors import SELECTORS

__all__ = [
    "MODULAR",
    "cover_rows",
    "facility_graph",
    "fit_and_cover",
    "fit_group",
    "gain_curve",
    "graph_summary",
    "modular_scores",
]

#: The methods whose selectors declare ``modular = True`` (a document's score does not
#: depend on the others: a global round merges their scores exactly). Derived from the
#: registry; kept as a name for the sharded runner.
MODULAR = tuple(name for name, cls in SELECTORS.items() if cls.modular)


def modular_scores(corpus: Corpus, ids: pa.Array, spec: SelectSpec) -> np.ndarray:
    """Per-document scores of a modular method, comparable across groups: the selector's
    :meth:`~datamask.base.Selector.comparable_scores` with the run's seed."""
    cls = SELECTORS[spec.selector.method]
    return cls.comparable_scores(corpus, ids, spec.selector.seed)


def graph_summary(objective: Any) -> dict[str, Any] | None:
    """The neighbour graph a bound objective used: its term's
    :meth:`~datamask.objectives.base.Term.graph_summary` (method, K, probes, seconds) with
    recall@K on 200 sampled rows added."""
    term = next(
        (t for _, t in objective.terms if t.has_graph and t.graph_summary() is not None),
        None,
    )
    if term is None:
        return None
    summary = term.graph_summary()
    seconds = summary.pop("seconds")
    summary["recall_sampled"] = sampled_recall(term.features_, term.graph_[0], n_rows=200)
    summary["recall_rows"] = min(200, term.n_docs)
    return {**summary, "seconds": seconds}


def facility_graph(objective: Any) -> tuple[torch.Tensor, torch.Tensor] | None:
    """The (indices, similarities) graph a bound objective's one facility-location term
    built (:func:`~datamask.objectives.facility_location.facility_term`), or None (no such
    term, several, or no graph built)."""
    term = facility_term(objective)
    return None if term is None else term.graph_


def cover_rows(
    corpus: Corpus,
    selected: np.ndarray,
    objective: Any = None,
    floor: tuple[np.ndarray, np.ndarray, bool] | None = None,
    nearest: tuple[torch.Tensor, torch.Tensor] | None = None,
) -> Cover:
    """Every row's nearest kept row (:func:`~datamask.coverage.nearest_kept`): where the
    pass that scored this selection's exact J compared every row with every kept row
    (``nearest``, else the bound ``objective``'s facility-location term's), read from it,
    exact for every row; else from its graph where it has one (exact when that graph
    is), searched for the rest. ``corpus.features`` must be unit rows. ``floor`` is
    ``(best cosine, row, exact)`` to documents kept elsewhere (``--given``): where it is
    higher, the cover names that row (``Cover.external``)."""
    term = None if objective is None else facility_term(objective)
    graph = None if term is None else term.graph_
    kept = np.asarray(selected, dtype=np.int64)
    done = nearest
    if done is None and term is not None:
        done = term.exact_nearest(torch.from_numpy(np.unique(kept)))
    names = ("floor", "floor_index", "floor_exact")
    ext = {} if floor is None else dict(zip(names, floor, strict=True))
    return nearest_kept(
        corpus.features,
        kept,
        graph=None if done is not None else graph,
        graph_exact=graph is not None and term.graph_method_ == "exact",
        nearest=done,
        **ext,
    )


def fit_group(
    corpus: Corpus,
    k: int | None,
    spec: SelectSpec,
    *,
    seed: int | None = None,
    stored_ids: pa.Array | None = None,
    progress: bool = False,
    evaluate: bool = True,
    graph: tuple[torch.Tensor, torch.Tensor] | None = None,
) -> tuple[Selection, Any]:
    """Select exactly ``k`` rows of ``corpus`` (None: ``round(select_ratio * n)``).

    Parameters
    ----------
    corpus : Corpus
        The group's rows, quality already scaled as the run decided.
    k : int or None
        Rows to keep; 0 keeps nothing and ``n`` keeps all (every score then ties).
    spec : SelectSpec
        The method, objective and settings.
    seed : int, optional
        The group's seed (default: the spec's).
    stored_ids : pyarrow.Array, optional
        The ids as stored. When given, modular methods score with
        :func:`modular_scores`, which compare across groups (the sharded runner).
    progress : bool, default=False
        The method's progress bar.
    evaluate : bool, default=True
        Score the selection with the exact objective (``meta["terms"]``, an ``n x k``
        pass); False leaves ``meta["terms"]`` empty (a sharded run's group step).
    graph : (indices, similarities), optional
        A neighbour graph of ``corpus`` already built, most similar first, with at least
        the K the facility-location term asks for (its first K columns are used): a
        sharded group proposing again re-uses the graph its first proposal saved.

    Returns
    -------
    selection : Selection
        ``meta`` holds ``method``, ``terms`` (exact values; empty without ``evaluate``),
        ``term_labels`` (the objective's terms), ``device``, ``gpu_peak_mb``, ``seconds``
        (fit, graph, optimise), ``history``, ``resolved``, ``stats`` (the selector's own
        counts and times) and ``graph`` (None; :func:`graph_summary` fills it).
    objective : Objective or None
        The objective the selector bound (its graph built), for what follows a selection
        (:func:`gain_curve`, :func:`cover_rows`, :func:`graph_summary`); None where no
        selector ran (a modular method's comparable scores, or ``k`` of 0 or ``n``).
    """
    bound_heap()  # a worker runs group after group: keep its heap from ratcheting up
    n = corpus.n_docs
    method = spec.selector.method
    meta: dict[str, Any] = {
        "method": method,
        "terms": {},
        "term_labels": [],
        "device": "none",
        "gpu_peak_mb": None,
        "history": [],
        "resolved": {},
        "stats": {},
        "graph": None,
    }
    if stored_ids is not None and SELECTORS[method].modular:
        corpus = check_corpus(corpus)  # the same checks and scaling as a selector's fit
        k = k_from_ratio(spec.selector.select_ratio, n) if k is None else int(k)
        scores = modular_scores(corpus, stored_ids, spec)
        selected = np.sort(rank_order(scores, corpus.ids)[:k])
        meta["device"] = "cpu"
        logits = scores.astype(np.float32)
        return Selection(selected, scores, meta, ids=corpus.ids, logits=logits), None
    if k is not None and not 0 < k < n:  # nothing to learn: every score ties
        selected = np.arange(n) if k == n else np.zeros(0, dtype=np.int64)
        scores = np.zeros(n)
        logits = scores.astype(np.float32)
        return Selection(selected, scores, meta, ids=corpus.ids, logits=logits), None
    return _fit_selector(corpus, k, spec, seed, progress, evaluate, graph, meta)


def _fit_selector(
    corpus: Corpus,
    k: int | None,
    spec: SelectSpec,
    seed: int | None,
    progress: bool,
    evaluate: bool,
    graph: tuple[torch.Tensor, torch.Tensor] | None,
    meta: dict[str, Any],
) -> tuple[Selection, Any]:
    """:func:`fit_group` where a selector runs: fit it, and its selection with ``meta``."""
    selector = spec.make_selector(k=k, seed=seed, progress=progress)
    term = facility_term(selector.objective) if graph is not None else None
    if term is not None:  # built before (a group proposing again): not built twice
        term.graph = graph
    dev = resolve_device(selector.device)
    if dev.type == "cuda":
        torch.cuda.reset_peak_memory_stats(dev)
    selector.fit(corpus, evaluate=evaluate)
    if dev.type == "cuda":
        meta["gpu_peak_mb"] = torch.cuda.max_memory_allocated(dev) / 2**20
    result = selector.selection()
    meta.update(
        terms={key: float(v) for key, v in selector.terms_.items()},
        term_labels=list(selector.objective_.labels),  # what it optimised, scored or not
        device=str(selector.device_),
        seconds={
            key: getattr(selector, f"{key}_seconds_")
            for key in ("fit", "graph", "optimise", "evaluate")
        },
        history=selector.history_,
        resolved=selector.resolved_params(),
        stats=selector.fit_stats(),  # the selector's own counts and times (bench's columns)
    )
    selection = Selection(
        np.asarray(result.selected, dtype=np.int64),
        np.asarray(result.scores, dtype=np.float64),
        {**result.meta, **meta},
        ids=corpus.ids,
        logits=None if result.logits is None else np.asarray(result.logits, np.float32),
        probabilities=None
        if result.probabilities is None
        else np.asarray(result.probabilities, np.float32),
    )
    return selection, selector.objective_


def fit_and_cover(
    corpus: Corpus,
    k: int | None,
    spec: SelectSpec,
    *,
    cover: bool,
    floor: tuple[np.ndarray, np.ndarray, bool] | None = None,
    **fit: Any,
) -> tuple[Selection, Any]:
    """:func:`fit_group` of one table (``fit``: its keywords), then, with ``cover``, every
    row's nearest kept row on the selection's own graph (:func:`cover_rows`, above
    ``floor``: documents kept elsewhere, ``--given``) as ``meta["cover"]``, which the
    writer writes as ``covered_by``/``covered_sim``/``covered_exact``, and its time as
    ``meta["seconds"]["cover"]``. Returns what :func:`fit_group` returns."""
    if cover:  # checked once, here: the fit reads these unit rows and the cover too
        corpus = check_corpus(corpus)  # a copy; the caller's corpus is unchanged
    selection, objective = fit_group(corpus, k, spec, **fit)
    if cover:
        started = time.perf_counter()
        selection.meta["cover"] = cover_rows(corpus, selection.selected, objective, floor)
        selection.meta.setdefault("seconds", {})["cover"] = time.perf_counter() - started
    return selection, objective


def gain_curve(
    corpus: Corpus,
    selection: Selection,
    objective: Any,
    spec: SelectSpec,
    seed: int | None = None,
) -> None:
    """Order the selected rows by lazy greedy on the objective :func:`fit_group` bound
    (coverage over every row; :func:`~datamask.greedy.lazy.gain_order`), per token under
    a token budget: ``selection.meta["gain_order"]`` is ``(rows in pick order, marginal
    gains)``, what a sharded run allocates its budget with (its graph, which the exchange
    round re-uses, is :func:`facility_graph` of ``objective``). Where no selector ran
    (``objective`` None: ``k`` of 0 or ``n``), the objective is bound here, as the
    selector would have bound it."""
    started = time.perf_counter()
    meta, bound = selection.meta, objective
    if bound is None:  # every row kept, or none: the order still prices them
        budget = None
        if spec.selector.token_budget and corpus.lengths is not None:  # per token, as fitted
            sizes = np.asarray(corpus.lengths, dtype=np.float64)
            budget = TokenBudget(sizes, float(spec.selector.budget_tokens or sizes.sum()))
        bound = spec.objective.make().bind(
            check_corpus(corpus),
            len(selection.selected),
            resolve_device(spec.selector.device),
            seed=spec.selector.seed if seed is None else seed,
            budget=budget,
        )
    sizes = None if bound.budget_ is None else bound.budget_.sizes  # the token budget's
    meta["gain_order"] = gain_order(bound, selection.selected, sizes=sizes)
    if objective is not None:  # a selector ran: its time
        meta["seconds"]["gain_order"] = time.perf_counter() - started
