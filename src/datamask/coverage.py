"""Every row's nearest kept row by cosine: what ``covered_by``, ``covered_sim`` and
``covered_exact`` are written from, on one file, per group and above ``--given``
(:func:`nearest_kept`). The searches it uses are :mod:`datamask.neighbors`'."""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any

import numpy as np
import torch

from .neighbors import (
    COVER_EXACT_PAIRS,
    FLOOR_PROBE_FRACTION,
    best_match,
    block_rows,
    first_identical,
    identical_leads,
)

__all__ = ["Cover", "nearest_kept"]


@dataclass(frozen=True)
class Cover:
    """Each row's nearest kept row (:func:`nearest_kept`).

    Attributes
    ----------
    index : ndarray of int64, shape (n,)
        The nearest kept row: a row of ``features`` (``kept`` given), a row of
        ``kept_features``, or ``floor_index[i]`` where ``external[i]``; -1 where there is
        nothing kept at all.
    sim : ndarray of float32, shape (n,)
        Its cosine (1.0 for a kept row; NaN where ``index`` is -1).
    exact : ndarray of bool, shape (n,)
        True where ``index`` is the exact argmax by construction: read from an exact
        K-NN graph, or found by comparing with every kept row. False where it came from an
        approximate graph or the ivf search (a nearer kept row may exist).
    external : ndarray of bool, shape (n,)
        True where the floor won: ``index`` is then ``floor_index``.
    counts : dict
        Rows resolved by each route: ``kept``, ``graph``, ``exact_search``,
        ``ivf_search``, ``floor``, ``none``.
    """

    index: np.ndarray
    sim: np.ndarray
    exact: np.ndarray
    external: np.ndarray
    counts: dict[str, int]


def nearest_kept(
    features: torch.Tensor | np.ndarray,
    kept: np.ndarray | None = None,
    *,
    kept_features: torch.Tensor | np.ndarray | None = None,
    graph: tuple[torch.Tensor, torch.Tensor] | None = None,
    graph_exact: bool = False,
    floor: np.ndarray | None = None,
    floor_index: np.ndarray | None = None,
    floor_exact: bool | np.ndarray = False,
    exact_pairs: int = COVER_EXACT_PAIRS,
    probe_fraction: float = FLOOR_PROBE_FRACTION,
    generator: torch.Generator | None = None,
    search_device: torch.device | str | None = None,
    nearest: tuple[torch.Tensor, torch.Tensor] | None = None,
) -> Cover:
    """Every row's nearest kept row by cosine (what ``covered_by``, ``covered_sim`` hold).

    The kept rows are rows of ``features`` (``kept``) or a matrix held apart
    (``kept_features``: other groups' kept rows, an existing corpus). Row by row:

    1. A kept row of ``features`` covers itself (sim 1.0).
    2. With ``graph`` (the selection's K-NN graph, sims clipped at 0): the most similar
       listed neighbour that is kept, at a positive similarity.
    3. The rest: compared with every kept row (exact) when ``rows x kept <= exact_pairs``
       or on ``search_device``, else by :func:`ivf_search` (``sqrt(kept)`` lists,
       ``probe_fraction`` of them probed). Given ``nearest``, every row is read from it.
    4. Where ``floor[i]`` (the best cosine to kept rows held elsewhere, e.g. another
       group's) is strictly above the cosine found, the floor wins: ``floor_index[i]``.

    Equal float32 cosines go to the lowest kept row, a found row beats an equal floor; a
    cosine read from the graph is recomputed: every ``sim`` is its pair's cosine.

    Parameters
    ----------
    features : tensor or ndarray of shape (n, d)
        Unit rows to cover.
    kept, kept_features : ndarray of int, or tensor or ndarray of shape (m, d), optional
        Rows of ``features`` that are kept, or unit kept rows held apart (exactly one).
    graph : (indices, sims), optional
        K-NN graph over ``features`` (only with ``kept``), most similar first.
    graph_exact : bool, default=False
        Whether ``graph`` lists the exact K nearest (a listed kept row is then exact).
    floor, floor_index, floor_exact : ndarray of shape (n,), optional
        Best cosine to kept rows elsewhere, its row (any numbering), whether exact (one
        bool for all: default False).
    exact_pairs, probe_fraction : int, float
        Largest ``rows x kept`` compared exactly; lists the ivf search probes.
    generator, search_device : torch.Generator, torch.device or str, optional
        The ivf k-means' draws (default: seeded 0); the device rule 3 compares every pair on.
    nearest : (cosines, positions) tensors of shape (n,), optional
        With ``kept``: each row's most similar kept row over every pair, its position
        among the sorted kept rows, as :func:`best_match` gives it (scoring J finds it).

    Returns
    -------
    Cover

    Examples
    --------
    >>> x = np.array([[1.0, 0.0], [0.8, 0.6], [0.0, 1.0]], dtype=np.float32)
    >>> c = nearest_kept(x, np.array([0, 2]))
    >>> c.index.tolist(), [round(float(s), 2) for s in c.sim]
    ([0, 0, 2], [1.0, 0.8, 1.0])
    """
    _check_kept_args(kept, kept_features, graph is not None or nearest is not None)
    x = _as_tensor(features)
    kept, base = _kept_base(x, kept, kept_features)
    m = base.shape[0]
    found = _Found.empty(x.shape[0])  # index: into base's rows until the end
    if kept is not None and m:
        found.todo[kept] = False
    if nearest is not None and m:  # rule 3, done: every pair compared already
        _from_nearest(found, nearest)
    if graph is not None and m and found.todo.any():  # rule 2
        _from_graph(found, x, base, kept, graph, graph_exact)
    rest = np.flatnonzero(found.todo)
    if m and len(rest):  # rule 3
        _search_rest(found, x, base, rest, exact_pairs, probe_fraction, generator, search_device)
    return _finish(found, kept, m, floor, floor_index, floor_exact)


def _check_kept_args(kept: Any, kept_features: Any, rows_named: bool) -> None:
    """:func:`nearest_kept`'s kept set given once; a graph or ``nearest`` (``rows_named``)
    names rows of ``features``, so only with ``kept``."""
    if (kept is None) == (kept_features is None):
        raise ValueError("give exactly one of kept (rows of features) and kept_features.")
    if rows_named and kept is None:
        raise ValueError("graph and nearest name rows of features; they need kept.")


def _finish(
    found: _Found,
    kept: np.ndarray | None,
    m: int,
    floor: np.ndarray | None,
    floor_index: np.ndarray | None,
    floor_exact: bool | np.ndarray,
) -> Cover:
    """Rules 1 and 4 of :func:`nearest_kept` over what the searches found, indices into
    rows of ``features``; a row nothing covers gets index -1 and a NaN cosine."""
    index, sim, exact, counts = found.index, found.sim, found.exact, found.counts
    n = len(index)
    if kept is not None and m:  # rule 1
        index[kept] = np.arange(m)
        sim[kept] = 1.0
        exact[kept] = True
        counts["kept"] = m
    if kept is not None:  # into rows of features
        index = np.where(index >= 0, kept[np.maximum(index, 0)] if m else -1, -1)
    external = np.zeros(n, dtype=bool)
    if floor is not None:  # rule 4
        floor = np.asarray(floor, dtype=np.float32)
        if floor.shape != (n,) or floor_index is None or np.shape(floor_index) != (n,):
            raise ValueError(f"floor and floor_index must have shape ({n},).")
        external = floor > sim
        if kept is not None and m:
            external[kept] = False
        index = np.where(external, np.asarray(floor_index, dtype=np.int64), index)
        sim = np.where(external, floor, sim).astype(np.float32)
        exact = np.where(external, floor_exact, exact)
        counts["floor"] = int(external.sum())
    none = index < 0
    sim[none] = np.nan
    exact[none] = True
    counts["none"] = int(none.sum())
    return Cover(index, sim, exact, external, counts)


@dataclass
class _Found:
    """What :func:`nearest_kept` has found so far, per row: the kept row (into the kept
    matrix), its cosine, whether it is exact, and which rows are still to resolve."""

    index: np.ndarray
    sim: np.ndarray
    exact: np.ndarray
    todo: np.ndarray
    counts: dict[str, int]

    @classmethod
    def empty(cls, n: int) -> _Found:
        return cls(
            np.full(n, -1, dtype=np.int64),
            np.full(n, -np.inf, dtype=np.float32),
            np.zeros(n, dtype=bool),
            np.ones(n, dtype=bool),
            dict.fromkeys(("kept", "graph", "exact_search", "ivf_search", "floor", "none"), 0),
        )


def _kept_base(
    x: torch.Tensor,
    kept: np.ndarray | None,
    kept_features: torch.Tensor | np.ndarray | None,
) -> tuple[np.ndarray | None, torch.Tensor]:
    """The kept rows (sorted: ties go to the lowest row) and the matrix of kept features."""
    if kept is not None:
        kept = np.unique(np.asarray(kept, dtype=np.int64))
        return kept, (x[torch.from_numpy(kept)] if len(kept) else x[:0])
    base = _as_tensor(kept_features).to(x.dtype)  # type: ignore[arg-type]
    if base.ndim != 2 or (len(base) and base.shape[1] != x.shape[1]):
        raise ValueError(
            f"kept_features must have shape (m, {x.shape[1]}); got {tuple(base.shape)}."
        )
    return None, base


def _from_graph(
    found: _Found,
    x: torch.Tensor,
    base: torch.Tensor,
    kept: np.ndarray,
    graph: tuple[torch.Tensor, torch.Tensor],
    graph_exact: bool,
) -> None:
    """Rule 2: each row's most similar listed neighbour that is kept, at a positive
    similarity; the pair's cosine recomputed."""
    n, m = x.shape[0], base.shape[0]
    pos = torch.full((n,), -1, dtype=torch.long)  # a row's place among the kept, or -1
    pos[torch.from_numpy(kept)] = torch.arange(m)
    g_idx, g_sim = graph
    truncated = g_idx.shape[1] < n  # the graph does not list every row
    # Row blocks of about 2^20 graph entries: the (rows, K) copies and the pairs' rows
    # stay a few MB (whole-graph temporaries added 200 MB of peak at 56k x K=160).
    step = block_rows(g_idx.shape[1], budget=1 << 20)
    leads = None  # base's copies, hashed once (per block, it cost 56 s at 1M x 100k kept)
    for lo in range(0, n, step):
        at = pos[g_idx[lo : lo + step].cpu()]
        s = g_sim[lo : lo + step].cpu().float().masked_fill(at < 0, -math.inf)
        s = s.masked_fill(s <= 0, -math.inf)  # clipped: the true cosine is unknown
        best = s.max(1).values
        tie = torch.where(s == best[:, None], at, m).min(1).values  # lowest kept row
        ok = torch.isfinite(best).numpy() & found.todo[lo : lo + step]
        if truncated:  # the best ties the list's last entry: equal rows may lie past it
            last = g_sim[lo : lo + step, -1].cpu().float()
            ok &= (best > last).numpy()
        rows = np.flatnonzero(ok) + lo
        if not len(rows):
            continue
        leads = identical_leads(base) if leads is None else leads
        found.index[rows] = first_identical(base, tie[torch.from_numpy(ok)], leads).numpy()
        # the cosine of the pair named, not the graph's (clipped) copy
        r = torch.from_numpy(rows)
        pair = (x[r] * base[torch.from_numpy(found.index[rows])]).sum(1)
        found.sim[rows] = pair.float().numpy()
        found.exact[rows] = graph_exact
        found.todo[rows] = False
        found.counts["graph"] += len(rows)


def _from_nearest(found: _Found, nearest: tuple[torch.Tensor, torch.Tensor]) -> None:
    """Rule 3 read from every row's exact nearest kept row, found already (copies of one
    vector to the first, as :func:`~datamask.neighbors.best_match` gives them)."""
    sims, index = (t.detach().cpu() for t in nearest)
    rest = np.flatnonzero(found.todo)
    at = torch.from_numpy(rest)
    found.index[rest] = index[at].numpy()
    found.sim[rest] = sims[at].float().numpy()
    found.exact[rest] = True
    found.todo[rest] = False
    found.counts["exact_search"] += len(rest)


def _search_rest(
    found: _Found,
    x: torch.Tensor,
    base: torch.Tensor,
    rest: np.ndarray,
    exact_pairs: int,
    probe_fraction: float,
    generator: torch.Generator | None,
    device: torch.device | str | None = None,
) -> None:
    """Rule 3: the rows left compared with every kept row (exact: few pairs, or on
    ``device``, where the search runs) or found by ivf."""
    # every row left (a search against rows held apart): the rows themselves, not a copy
    q = x if len(rest) == x.shape[0] else x[torch.from_numpy(rest)]
    how = "exact" if len(rest) * base.shape[0] <= exact_pairs else "ivf"
    if device is not None:
        q, base, how = q.to(device), base.to(device), "exact"
    s, i, _ = best_match(q, base, method=how, probe_fraction=probe_fraction, generator=generator)
    found.counts[f"{how}_search"] += len(rest)
    if how == "exact":
        found.exact[rest] = True
    else:
        padded = i < 0  # empty probed lists: compare those rows with every kept row
        if bool(padded.any()):
            s[padded], i[padded], _ = best_match(q[padded], base, method="exact")
    found.index[rest], found.sim[rest] = i.cpu().numpy(), s.float().cpu().numpy()


def _as_tensor(a: torch.Tensor | np.ndarray) -> torch.Tensor:
    """A tensor over ``a``'s memory; a copy only of a read-only array (arrow's buffers)."""
    if isinstance(a, np.ndarray) and not a.flags.writeable:
        a = a.copy()
    return torch.as_tensor(a)
