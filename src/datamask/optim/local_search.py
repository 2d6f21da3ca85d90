"""Swap local search on the graph objective, seeded by a selection (the learner's rounding).

The learner's top-k of the logits is a rounding of a relaxed solution; this module improves
it on the objective the greedy yardstick maximises (facility location on the K-nearest-
neighbour graph, quality, pairwise similarity and DiSF exactly). Each round is a few
vectorised passes over the graph (and, for DiSF, matrix products over the ``DISF_POOL``
best candidates of the other terms):

1. for every kept row a, the loss of dropping it (``l_a``): the coverage its clients fall
   back to (their second-best kept neighbour), the quality, pairwise and DiSF terms it
   carries;
2. for every other row b, the gain of adding it (``g_b``), against the current coverage;
3. the best M drops are paired with the best M adds, in order; a pair with
   ``g_b - l_a > 0`` is an improving swap on its own for facility location, quality and
   pairwise similarity (the exact swap gain is never lower for facility location, the
   pairwise cross term is added exactly); for DiSF it is a first-order estimate;
4. the positive pairs are applied together and the exact graph objective is recomputed;
   the batch is kept only if the objective rose, else M is halved and the round repeats.

So the graph objective never decreases, and the search stops when no single swap of the
M best candidates has a positive bound, or after ``max_rounds``.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

import torch

from ..objectives import DiSF, FacilityLocation, Objective, PairwiseSimilarity, Quality

__all__ = ["DISF_POOL", "SwapResult", "graph_objective", "swap_search"]

#: DiSF's swap scores cost O(d^2) a row; they are computed for at least this many add and
#: drop candidates (those the other terms rank best), every row below that size.
DISF_POOL = 8192


def graph_objective(objective: Objective, selected: torch.Tensor) -> float:
    """J with facility location counted on its K-NN graph (the greedy's objective)."""
    total = 0.0
    for w, term in objective.terms:
        if isinstance(term, FacilityLocation):
            total += w * term.graph_value(selected)
        else:
            total += w * term.value(selected)
    return total


@dataclass
class SwapResult:
    """What :func:`swap_search` did: the final rows, the objective before and after."""

    selected: torch.Tensor
    start: float
    value: float
    rounds: int = 0
    swaps: int = 0
    history: list[dict[str, Any]] = field(default_factory=list)


def _csr(
    keys: torch.Tensor, values: torch.Tensor, n: int, *, presorted: bool = False
) -> tuple[torch.Tensor, torch.Tensor]:
    """``values`` grouped by ``keys`` in [0, n): ``(ptr, grouped)``, group j at ptr[j]:ptr[j+1]."""
    if not presorted:
        order = torch.argsort(keys, stable=True)
        keys, values = keys[order], values[order]
    return torch.searchsorted(keys, torch.arange(n + 1, device=keys.device)), values


def _footprints(objective: Objective, keep: torch.Tensor, tops: list) -> list:
    """Per facility term: the documents each kept row covers best or second best, and the
    documents each other row would gain on (both CSR), for :func:`_independent`. ``tops``:
    each term's two best kept similarities per document (from :func:`_scores`)."""
    n = keep.shape[0]
    out = []
    terms = [t for w, t in objective.terms if isinstance(t, FacilityLocation) and w != 0]
    for term, top in zip(terms, tops, strict=True):
        idx, _ = term.knn_graph()
        owners = idx.gather(1, top.indices)  # best and second-best kept neighbour
        real = (top.values > 0).reshape(-1)  # a zero similarity is no neighbour
        clients = torch.arange(n, device=keep.device).repeat_interleave(owners.shape[1])
        rptr, rclients, rsims = term.reverse_graph()
        gains_here = rsims > top.values[:, 0][rclients]  # beats the current cover
        cols = term.reverse_cols_
        out.append(
            (
                _csr(owners.reshape(-1)[real], clients[real], n),
                _csr(cols[gains_here], rclients[gains_here], n, presorted=True),
            )
        )
    return out


def _scores(
    objective: Objective, keep: torch.Tensor, k: int
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor | None, float, list]:
    """Per row: gain of adding it, loss of dropping it; the pairwise sum and its weight;
    per facility term, the two best kept similarities of every document."""
    n = keep.shape[0]
    dtype = torch.float64
    gain = torch.zeros(n, dtype=dtype, device=keep.device)
    loss = torch.zeros(n, dtype=dtype, device=keep.device)
    pair_sum, pair_w = None, 0.0
    tops = []
    sel = torch.nonzero(keep).squeeze(1)
    for w, term in objective.terms:
        if w == 0:
            continue
        if isinstance(term, Quality):
            q = term.quality_.to(dtype) / k
            gain += w * q
            loss += w * q
        elif isinstance(term, FacilityLocation):
            idx, sim = term.knn_graph()
            covered = sim * keep[idx].to(sim.dtype)  # (n, K): kept neighbours' similarity
            top = covered.topk(min(2, covered.shape[1]), dim=1)
            tops.append(top)
            best = top.values[:, 0]
            second = top.values[:, 1] if top.values.shape[1] > 1 else torch.zeros_like(best)
            owner = idx.gather(1, top.indices[:, :1]).squeeze(1)
            drop = torch.zeros(n, dtype=dtype, device=keep.device)
            drop.index_add_(0, owner, (best - second).to(dtype))
            loss += w * drop / n
            every = torch.arange(n, device=keep.device)
            gain += w * term._graph_gains(best, every).to(dtype)
        elif isinstance(term, PairwiseSimilarity):
            x = term.features_
            c = max(k * (k - 1), 1)
            pair_sum = x[sel].to(dtype).sum(0)
            pair_w = w / c
            dots = x.to(dtype) @ pair_sum
            gain += w * (-2.0 * dots) / c
            loss += w * (-2.0 * dots + 2.0) / c
        elif isinstance(term, DiSF):  # O(d^2) a row: scored on the candidates only, below
            pass
        else:
            raise TypeError(f"swap_search does not know the term {type(term).__name__}.")
    return gain, loss, pair_sum, pair_w, tops


def _independent(adds: torch.Tensor, drops: torch.Tensor, footprints: list, n: int) -> list[int]:
    """The pairs, in order, whose swaps do not interact on facility location: no two adds
    gain on a common document (the gain would be counted twice) and no two drops are the
    best and second-best cover of a common document (its fallback would be gone). Swaps
    chosen so add up: the objective rises by at least the sum of their bounds."""
    if not footprints:
        return list(range(len(adds)))
    added = torch.zeros(n, dtype=torch.bool, device=adds.device)
    dropped = torch.zeros(n, dtype=torch.bool, device=adds.device)
    chosen = []
    for p, (b, a) in enumerate(zip(adds.tolist(), drops.tolist(), strict=True)):
        add_rows, drop_rows = [], []
        for (ptr, covered), (gptr, gained) in footprints:
            add_rows.append(gained[gptr[b] : gptr[b + 1]])
            drop_rows.append(covered[ptr[a] : ptr[a + 1]])
        ra, rd = torch.cat(add_rows), torch.cat(drop_rows)
        if bool(added[ra].any()) or bool(dropped[rd].any()):
            continue
        added[ra] = True
        dropped[rd] = True
        chosen.append(p)
    return chosen


def _apply(
    objective: Objective, keep: torch.Tensor, adds: torch.Tensor, drops: torch.Tensor
) -> tuple[torch.Tensor, float]:
    """The mask with ``drops`` swapped for ``adds``, and its graph objective."""
    trial = keep.clone()
    trial[drops] = False
    trial[adds] = True
    return trial, graph_objective(objective, torch.nonzero(trial).squeeze(1))


def swap_search(
    objective: Objective,
    selected: torch.Tensor,
    *,
    max_rounds: int = 200,
    batch: int | None = None,
    tol: float = 1e-12,
) -> SwapResult:
    """Improve ``selected`` (k rows) by batches of 1-for-1 swaps on the graph objective.

    Parameters
    ----------
    objective : Objective
        A bound objective (its facility terms' graphs are built on first use).
    selected : int64 tensor of shape (k,)
        The starting rows.
    max_rounds : int, default=200
        Rounds of the search (each a few O(n K) passes), accepted or not.
    batch : int, optional
        Candidate pairs examined in the first round (default min(k, 1024)); doubled after
        an accepted round, halved after a rejected one.
    tol : float, default=1e-12
        A swap or a batch must raise the objective by more than this.

    Returns
    -------
    SwapResult
        ``value >= start``: the search never lowers the graph objective.
    """
    dev = objective.device_
    n = objective.features_.shape[0]
    sel = selected.to(dev).long()
    k = len(sel)
    keep = torch.zeros(n, dtype=torch.bool, device=dev)
    keep[sel] = True
    current = start = graph_objective(objective, sel)
    m = min(k, 1024) if batch is None else int(batch)
    result = SwapResult(selected=sel, start=start, value=start)
    disf = [(w, t) for w, t in objective.terms if isinstance(t, DiSF) and w != 0]
    scores = None
    for rnd in range(max_rounds):
        result.rounds = rnd + 1
        if scores is None:
            scores = _scores(objective, keep, k)
        gain, loss, pair_sum, pair_w, tops = scores
        m_eff = min(m, k, n - k)
        if m_eff < 1:
            break
        add_score = gain.masked_fill(keep, -torch.inf)
        drop_score = -loss.masked_fill(~keep, torch.inf)
        if disf:  # DiSF on a pool of the candidates the other terms rank best
            pool = max(4 * m_eff, DISF_POOL)
            add_pool = add_score.topk(min(pool, n - k)).indices
            drop_pool = drop_score.topk(min(pool, k)).indices
            rows = torch.nonzero(keep).squeeze(1)
            add_score = torch.full_like(gain, -torch.inf)
            drop_score = torch.full_like(loss, -torch.inf)
            add_score[add_pool] = gain[add_pool]
            drop_score[drop_pool] = -loss[drop_pool]
            for w, term in disf:
                g, l_ = term.swap_scores(rows, add_pool, drop_pool)
                add_score[add_pool] += w * g
                drop_score[drop_pool] -= w * l_
        adds = add_score.topk(m_eff).indices
        drops = drop_score.topk(m_eff).indices
        bound = add_score[adds] + drop_score[drops]
        if pair_sum is not None:  # exact pairwise cross term of each pair
            x = objective.features_
            bound = bound + 2.0 * pair_w * (x[adds] * x[drops]).sum(1).double()
        good = torch.nonzero(bound > tol).squeeze(1)
        if len(good) == 0:
            break
        # Every positive pair at once; if that does not rise, the non-interacting ones.
        trial, value = _apply(objective, keep, adds[good], drops[good])
        if not value > current + tol and len(good) > 1:
            pick = _independent(adds[good], drops[good], _footprints(objective, keep, tops), n)
            if len(pick) < len(good):
                good = good[torch.as_tensor(pick, dtype=torch.long, device=good.device)]
                trial, value = _apply(objective, keep, adds[good], drops[good])
        if value > current + tol:
            keep, current, scores = trial, value, None
            result.swaps += len(good)
            result.history.append({"round": rnd, "swaps": int(len(good)), "objective": value})
            m = min(2 * m, k)
        elif len(good) == 1:  # a lone positive bound that did not rise: rounding noise
            break
        else:  # interacting swaps of pairwise similarity or DiSF: fewer at once
            m = max(1, min(m, len(good)) // 2)
    result.selected = torch.nonzero(keep).squeeze(1)
    result.value = current
    return result
