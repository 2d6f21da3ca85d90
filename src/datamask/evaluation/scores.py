"""Score any selection: the objective, every term, and diagnostics, as a dict and a table.

    datamask evaluate --input docs.parquet --selection out/selection.parquet

Every number is exact (dense, computed in blocks): facility location is O(N k d), the
nearest-neighbour similarity inside the subset O(k^2 d), DiSF O(k d^2); fine to N = 50k
on a CPU.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import numpy as np
import pyarrow as pa
import torch

from .._device import resolve_device
from .._validation import check_corpus
from ..budget import LENGTH_COLUMNS, TokenBudget
from ..data import Corpus
from ..io.selection import read_selection, rows_from_ids
from ..io.text import lengths_from_arrow
from ..neighbors import block_rows
from ..objectives import (
    FacilityLocation,
    Objective,
    PairwiseSimilarity,
    TermContext,
)
from ..objectives.combined import DEFAULT_ALGORITHM, resolve_objective
from ..objectives.disf import correlation_loss
from .redundancy import DEFAULT_THRESHOLDS, check_thresholds, redundancy

__all__ = [
    "evaluate_selection",
    "facility_coverage",
    "format_report",
    "length_stats",
    "mean_nn_similarity",
    "mean_pairwise_similarity",
    "read_selection",
    "rows_from_ids",
]


_QUANTILES = (0.0, 0.1, 0.25, 0.5, 0.75, 0.9, 1.0)


# --- metrics --------------------------------------------------------------------------------
def _bound(term_cls: type, x: torch.Tensor, k: int):
    return term_cls().bind(TermContext.create(x, None, k))


def facility_coverage(x: torch.Tensor, selected: torch.Tensor) -> float:
    """``mean_i max(0, max_{j in S} <x_i, x_j>)`` over every row i of ``x`` (unit rows):
    the value of :class:`~datamask.objectives.FacilityLocation` (exact, dense)."""
    return _bound(FacilityLocation, x, len(selected)).value(selected)


def mean_pairwise_similarity(x: torch.Tensor, selected: torch.Tensor) -> float:
    """Mean cosine similarity over ordered pairs ``i != j`` of the selected (unit) rows:
    one minus the value of :class:`~datamask.objectives.PairwiseSimilarity`."""
    k = len(selected)
    if k < 2:
        return float("nan")
    return 1.0 - _bound(PairwiseSimilarity, x, k).value(selected)


def mean_nn_similarity(x: torch.Tensor, selected: torch.Tensor) -> float:
    """Mean over selected rows of the cosine similarity to their nearest *other* selected row.

    High values mean near-duplicates inside the subset (what SemDeDup removes).
    """
    k = len(selected)
    if k < 2:
        return float("nan")
    xs = x[selected]
    step = block_rows(k)
    total = 0.0
    for lo in range(0, k, step):
        sims = xs[lo : lo + step] @ xs.T
        rows = torch.arange(sims.shape[0], device=sims.device)
        sims[rows, lo + rows] = -torch.inf  # not itself
        total += float(sims.amax(1).double().sum())
    return total / k


def length_stats(lengths: np.ndarray) -> dict[str, float]:
    """Mean, std and quantiles (p0, p10, p25, p50, p75, p90, p100) of document lengths."""
    v = np.asarray(lengths, dtype=np.float64)
    out = {"mean": float(v.mean()), "std": float(v.std())}
    for q, value in zip(_QUANTILES, np.quantile(v, _QUANTILES), strict=True):
        out[f"p{round(q * 100)}"] = float(value)
    return out


def _lengths(corpus: Corpus, length_col: str | None) -> tuple[str, np.ndarray] | None:
    """``(name, lengths)`` of the column ``length_col`` (refused when it was not read), else
    of the first of :data:`LENGTH_COLUMNS` read; None when none is."""
    if length_col and length_col not in corpus.extra:
        raise ValueError(f"length column {length_col!r} was not read from {corpus.source}.")
    names = [length_col] if length_col else list(LENGTH_COLUMNS)
    for name in names:
        if name in corpus.extra:
            col = corpus.extra[name]
            if col.dtype.kind in "iuf":
                return name, col.astype(np.float64)
            # texts (or UTF-8 bytes) by their length in characters; other types refused
            return f"len({name})", lengths_from_arrow(pa.array(col), name, str(corpus.source))
    return None


# --- the report -----------------------------------------------------------------------------
def evaluate_selection(
    corpus: Corpus,
    selected: np.ndarray,
    *,
    objective: Objective | None = None,
    algorithm: str | Sequence[str] | None = None,
    lamb: float | None = None,
    length_col: str | None = None,
    device: str = "cpu",
    dup_thresholds: Sequence[float] = DEFAULT_THRESHOLDS,
    dup_search: str = "auto",
    dup_all: bool = True,
    progress: bool = False,
    budget_tokens: float | None = None,
) -> dict[str, Any]:
    """Score the rows ``selected`` of ``corpus``.

    Parameters
    ----------
    corpus : Corpus
        The documents the selection was made from.
    selected : array of int
        Row indices of the kept documents (any order, no repeats).
    objective : Objective, optional
        Objective to report; default ``Objective([make_term(a) for a in algorithm],
        lamb)``. It is bound with ``k = len(selected)``.
    algorithm : str or sequence of str, optional
        Diversity term(s) of the default objective (registered names; default Facility).
    lamb : float, optional
        Quality weight of the default objective (default 0.5); not with ``objective``.
    length_col : str, optional
        Column of ``corpus.extra`` holding lengths (numbers) or texts; default the first of
        ``n_chars, length, n_tokens, text`` present. No length section when none is.
    device : str, default="cpu"
        Where the metrics are computed.
    dup_thresholds : sequence of float, default=(0.9, 0.95, 0.99)
        Cosine thresholds of the near-duplicate figures (:mod:`datamask.evaluation.redundancy`).
    dup_search : {"auto", "exact", "ivf"}, default="auto"
        Pair search over the whole input (the selection is always searched exactly).
    dup_all : bool, default=True
        Also measure the whole input (``redundancy["all"]``; None when False).
    progress : bool, default=False
        A progress bar (stderr) over the whole input's pair search, the long loop.
    budget_tokens : float, optional
        The token budget the selection was made under: terms and J per token, as its run
        reports them (``objective["per"]``); the ``metrics`` stay per document.

    Returns
    -------
    dict
        ``n_docs, k, select_ratio``; ``objective`` (its settings, every term and ``J``);
        ``metrics`` (quality mean, facility coverage of the whole set, mean pairwise
        similarity, DiSF correlation loss, mean nearest-neighbour similarity inside the
        subset), each with the whole corpus' value where it is cheap (``*_all``);
        ``quality_columns`` (raw means); ``length`` (or None; ``tokens``: sums); ``redundancy``
        (``selected`` and ``all``: pairs, documents, groups, largest group per threshold).
    """
    thresholds = check_thresholds(dup_thresholds)
    corpus = check_corpus(corpus)
    rows = _checked_rows(selected, corpus.n_docs)
    n, k, dev = corpus.n_docs, len(rows), resolve_device(device)
    lengths = _lengths(corpus, length_col)  # read once: the budget's and the section's
    objective, scored = _scored(
        corpus, rows, dev, objective, algorithm, lamb, lengths, budget_tokens
    )
    mask = np.zeros(n, dtype=bool)
    mask[rows] = True
    return {
        "source": corpus.source,
        "n_docs": n,
        "k": k,
        "select_ratio": k / n,
        "objective": scored,
        "metrics": _metrics(objective, rows, dev),
        "quality_columns": _quality_columns(corpus, mask),
        "length": _length_section(lengths, mask),
        "redundancy": _redundancy(
            objective.features_, rows, thresholds, dup_search, dup_all, progress
        ),
    }


def _scored(
    corpus: Corpus,
    rows: np.ndarray,
    dev: torch.device,
    objective: Objective | None,
    algorithm: str | Sequence[str] | None,
    lamb: float | None,
    lengths: tuple[str, np.ndarray] | None,
    budget_tokens: float | None,
) -> tuple[Objective, dict[str, Any]]:
    """The objective bound to ``corpus`` and the report's ``objective``: its settings, its
    terms over ``rows`` and ``J``; per token under a token budget (the objective the
    selection was made under; ``lengths``: :func:`_lengths`' answer)."""
    objective, settings = _objective_settings(objective, algorithm, lamb)
    budget = _token_budget(lengths, str(corpus.source), budget_tokens)
    if budget is not None:
        settings.update(per="token", budget_tokens=budget.total)
    objective.bind(corpus, len(rows), dev, budget=budget)
    terms = {name: float(v) for name, v in objective.term_values(rows).items()}
    return objective, {**settings, "terms": terms, "J": terms["J"]}


def _redundancy(
    x: torch.Tensor,
    rows: np.ndarray,
    thresholds: tuple[float, ...],
    dup_search: str,
    dup_all: bool,
    progress: bool,
) -> dict[str, Any]:
    """The near-duplicates of the selection (exact) and of the whole input (``dup_search``,
    the evaluation's long loop: the one with a progress bar)."""
    selected = redundancy(x, rows, thresholds=thresholds, method="exact")
    if not dup_all:
        return {"selected": selected, "all": None}
    every = redundancy(x, thresholds=thresholds, method=dup_search, progress=progress)
    return {"selected": selected, "all": every}


def _token_budget(
    lengths: tuple[str, np.ndarray] | None, source: str, total: float | None
) -> TokenBudget | None:
    """The token budget the objective is bound with (``lengths``: :func:`_lengths`'
    answer), or None for a document budget."""
    if total is None:
        return None
    if lengths is None:
        raise ValueError(
            f"a token budget's J counts each document by its length; no length column "
            f"({', '.join(LENGTH_COLUMNS)}) was read from {source}."
        )
    return TokenBudget(lengths[1], float(total))


def _checked_rows(selected: np.ndarray, n: int) -> np.ndarray:
    """``selected`` as int64 rows: at least one, each in ``[0, n)``, none repeated."""
    rows = np.asarray(selected, dtype=np.int64)
    if rows.ndim != 1 or len(rows) == 0:
        raise ValueError(f"selection must hold at least one row; got {len(rows)}.")
    if rows.min() < 0 or rows.max() >= n:
        raise ValueError(f"selected rows must lie in [0, {n}); got {rows.min()}..{rows.max()}.")
    if len(np.unique(rows)) != len(rows):
        raise ValueError("selected rows must not repeat.")
    return rows


def _objective_settings(
    objective: Objective | None, algorithm: str | Sequence[str] | None, lamb: float | None
) -> tuple[Objective, dict[str, Any]]:
    """The objective scored with (``objective``, else one of ``algorithm`` and ``lamb``)
    and the settings the report names it by."""
    if objective is None:
        names = [algorithm] if isinstance(algorithm, str) else list(algorithm or [])
        objective = resolve_objective(None, names or None, lamb)
        names = names or [DEFAULT_ALGORITHM]
        return objective, {"algorithm": names, "lamb": float(objective.lamb)}
    objective = resolve_objective(objective, algorithm, lamb)
    return objective, {"objective": repr(objective), "lamb": objective.lamb}


def _metrics(objective: Objective, rows: np.ndarray, dev: torch.device) -> dict[str, float]:
    """The diagnostics of the kept rows of the bound ``objective`` (and of every row where
    it is cheap: ``*_all``)."""
    x = objective.features_
    k = len(rows)
    sel = torch.as_tensor(rows, device=dev)
    every = torch.arange(x.shape[0], device=dev)
    q = objective.quality_.double()
    return {
        "quality_mean": float(q[sel].mean()),
        "quality_mean_all": float(q.mean()),
        "facility_coverage": facility_coverage(x, sel),
        "mean_pairwise_similarity": mean_pairwise_similarity(x, sel),
        "mean_pairwise_similarity_all": mean_pairwise_similarity(x, every),
        "disf_loss": correlation_loss(x[sel]) if k >= 2 else float("nan"),
        "disf_loss_all": correlation_loss(x),
        "mean_nn_similarity": mean_nn_similarity(x, sel),
    }


def _quality_columns(corpus: Corpus, mask: np.ndarray) -> dict[str, dict[str, float]]:
    """Each raw quality column's mean over the kept rows and over all."""
    return {
        name: {
            "selected": float(corpus.quality[mask, j].mean()),
            "all": float(corpus.quality[:, j].mean()),
        }
        for j, name in enumerate(corpus.quality_names)
    }


def _length_section(
    lengths: tuple[str, np.ndarray] | None, mask: np.ndarray
) -> dict[str, Any] | None:
    """The length distribution of the kept rows and of all (``lengths``: :func:`_lengths`'
    answer; None: no length column read)."""
    if lengths is not None:
        name, values = lengths
        return {
            "column": name,
            "selected": length_stats(values[mask]),
            "all": length_stats(values),
            # the kept tokens beside the kept documents (a token budget's figure)
            "tokens": {"kept": float(values[mask].sum()), "all": float(values.sum())},
        }
    return None


def redundancy_rows(dup: dict[str, Any]) -> list[tuple[str, str, str]]:
    """Table rows of the near-duplicate figures: (label, selection, all documents).

    Figures of an approximate (ivf) search of the whole input are lower bounds: ``>=``.
    """
    every = dup.get("all")
    mark = ">=" if every is not None and every["approximate"] else ""
    rows = [
        (
            "near-duplicate search",
            dup["selected"]["method"],
            "" if every is None else every["method"] + (" (approx.)" if mark else ""),
        )
    ]
    for t, sel in dup["selected"]["thresholds"].items():
        whole = every["thresholds"][t] if every is not None else None
        for key, label in (
            ("pairs", f"pairs cos > {t}"),
            ("documents", f"docs in pairs cos > {t}"),
            ("largest_group", f"largest group cos > {t}"),
        ):
            rows.append((label, f"{sel[key]}", f"{mark}{whole[key]}" if whole else ""))
    return rows


def format_report(report: dict[str, Any]) -> str:
    """The report as an aligned text table (selection vs the whole corpus)."""
    m = report["metrics"]
    rows: list[tuple[str, str, str]] = [
        ("documents", f"{report['k']}", f"{report['n_docs']}"),
    ]
    per = " per token" if report["objective"].get("per") == "token" else ""
    for name, value in report["objective"]["terms"].items():
        label = f"objective J{per}" if name == "J" else f"term {name}{per}"
        rows.append((label, f"{value:.4f}", ""))
    rows += [
        ("quality mean (normalised)", f"{m['quality_mean']:.4f}", f"{m['quality_mean_all']:.4f}"),
        ("facility coverage", f"{m['facility_coverage']:.4f}", "1.0000"),
        (
            "mean pairwise similarity",
            f"{m['mean_pairwise_similarity']:.4f}",
            f"{m['mean_pairwise_similarity_all']:.4f}",
        ),
        ("DiSF correlation loss", f"{m['disf_loss']:.2f}", f"{m['disf_loss_all']:.2f}"),
        ("mean NN similarity in subset", f"{m['mean_nn_similarity']:.4f}", ""),
    ]
    rows += redundancy_rows(report["redundancy"])
    for name, v in report["quality_columns"].items():
        rows.append((f"{name} mean (raw)", f"{v['selected']:.4f}", f"{v['all']:.4f}"))
    if report["length"] is not None:
        col = report["length"]["column"]
        sel, every = report["length"]["selected"], report["length"]["all"]
        for key in ("mean", "p10", "p50", "p90"):
            rows.append((f"{col} {key}", f"{sel[key]:.0f}", f"{every[key]:.0f}"))
        tokens = report["length"].get("tokens")
        if tokens is not None:  # the kept tokens beside the kept documents
            rows.append((f"{col} kept (sum)", f"{tokens['kept']:,.0f}", f"{tokens['all']:,.0f}"))
            if tokens.get("budget") is not None:
                rows.append(("token budget", f"{tokens['budget']:,.0f}", ""))
    given = report.get("given")
    if given is not None:  # evaluate --given: J given KEPT and J of the union
        for part, label in (("terms", "given KEPT"), ("terms_union", "KEPT + selection")):
            for name, value in given[part].items():
                rows.append((f"{label}: {'J' if name == 'J' else name}", f"{value:.4f}", ""))
    header = ("metric", "selection", "all documents")
    widths = [max(len(r[i]) for r in [header, *rows]) for i in range(3)]
    lines = [
        "  ".join(
            h.ljust(w) if i == 0 else h.rjust(w)
            for i, (h, w) in enumerate(zip(header, widths, strict=True))
        ),
        "  ".join("-" * w for w in widths),
    ]
    for r in rows:
        lines.append(
            "  ".join(
                c.ljust(w) if i == 0 else c.rjust(w)
                for i, (c, w) in enumerate(zip(r, widths, strict=True))
            )
        )
    return "\n".join(lines)


# --- reading a selection --------------------------------------------------------------------
