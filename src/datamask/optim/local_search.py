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

The search reaches each term through its :class:`~datamask.optim.swaps.TermSwaps` adapter
(:func:`~datamask.optim.swaps.swaps_for`): the swap protocol is this optimiser's, not the
terms' contract.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

import numpy as np
import torch

from ..budget import TokenBudget
from ..objectives import Objective
from .swaps import DISF_POOL, TermSwaps, swaps_for

__all__ = ["DISF_POOL", "SwapResult", "graph_objective", "swap_objective", "swap_search"]


def graph_objective(objective: Objective, selected: torch.Tensor) -> float:
    """J with every term's :meth:`~datamask.objectives.Term.graph_value` (facility location
    counted on its K-NN graph: the greedy's objective)."""
    total = 0.0
    for w, term in objective.terms:
        total += w * term.graph_value(selected)
    return total


def swap_objective(objective: Objective, keep: torch.Tensor) -> float:
    """J as the swap search counts it, from every term's swap value
    (:meth:`~datamask.optim.swaps.TermSwaps.value`) of the bool mask ``keep``: the graph
    objective, except a facility term with ``exact_rounding_`` (small select_ratio),
    which counts its exact value."""
    return _value(_adapters(objective), keep)


def _adapters(objective: Objective) -> list[tuple[float, TermSwaps]]:
    """One swap adapter per term of ``objective``, with its weight (made once a search)."""
    return [(w, swaps_for(term)) for w, term in objective.terms]


def _value(terms: list[tuple[float, TermSwaps]], keep: torch.Tensor) -> float:
    total = 0.0
    for w, term in terms:
        total += w * term.value(keep)
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

    def record(self, rnd: int, swaps: int, value: float) -> None:
        """An accepted round: ``swaps`` swaps that raised the objective to ``value``."""
        self.swaps += int(swaps)
        self.history.append({"round": rnd, "swaps": int(swaps), "objective": value})


def _footprints(
    terms: list[tuple[float, TermSwaps]], keep: torch.Tensor, adds: torch.Tensor
) -> list:
    """Per term that has one (facility location), its swap footprint for the candidate
    ``adds`` (see ``FacilitySwaps.footprint``) for :func:`_independent`."""
    out = []
    for w, term in terms:
        footprint = term.footprint(keep, adds) if w != 0 else None
        if footprint is not None:
            out.append(footprint)
    return out


def _scores(
    terms: list[tuple[float, TermSwaps]], keep: torch.Tensor, k: int
) -> tuple[torch.Tensor, torch.Tensor, list, list]:
    """Per row: gain of adding it, loss of dropping it, summed over the terms that score
    every row (``TermSwaps.bounds``); the terms scored on a candidate pool instead
    (``TermSwaps.scores``: DiSF, value-only terms); the terms with a pair correction."""
    n = keep.shape[0]
    dtype = torch.float64
    gain = torch.zeros(n, dtype=dtype, device=keep.device)
    loss = torch.zeros(n, dtype=dtype, device=keep.device)
    pooled, paired = [], []
    for w, term in terms:
        if w == 0:
            continue
        bounds = term.bounds(keep, k)
        if bounds is None:  # O(d^2) or worse a row: scored on the candidates only, below
            pooled.append((w, term))
            continue
        g, l_ = bounds
        gain += w * g
        loss += w * l_
        paired.append((w, term))
    return gain, loss, pooled, paired


def _independent(
    adds: torch.Tensor,
    drops: torch.Tensor,
    footprints: list,
    n: int,
    *,
    disjoint: bool = False,
) -> list[int]:
    """The pairs, in order, whose swaps do not interact on facility location: no two adds
    gain on a common document (the gain would be counted twice) and no two drops are the
    best and second-best cover of a common document (its fallback would be gone). Swaps
    chosen so add up: the objective rises by at least the sum of their bounds.
    ``disjoint``: stricter, for replacement pairs (whose add gains on its drop's
    documents): no document in two pairs' footprints, no row in two pairs.

    One pass over the pairs in numpy on the host: on CUDA a pair's few tensor ops were
    each a kernel launch and two a sync (4.3 s of a 1M-row group's 34 s on an H200)."""
    if not footprints:
        return list(range(len(adds)))
    host = [
        tuple(t.cpu().numpy() for t in (ptr, covered, gptr, gained))
        for (ptr, covered), (gptr, gained) in footprints
    ]
    added = np.zeros(n, dtype=bool)
    dropped = added if disjoint else np.zeros(n, dtype=bool)  # one set: no document shared
    used = np.zeros(n, dtype=bool)
    chosen = []
    for p, (b, a) in enumerate(zip(adds.tolist(), drops.tolist(), strict=True)):
        ra = [gained[gptr[b] : gptr[b + 1]] for _, _, gptr, gained in host]
        rd = [covered[ptr[a] : ptr[a + 1]] for ptr, covered, _, _ in host]
        ra, rd = (np.concatenate(r) if len(r) > 1 else r[0] for r in (ra, rd))
        if added[ra].any() or dropped[rd].any() or (disjoint and (used[a] or used[b])):
            continue
        used[a] = used[b] = True
        added[ra] = True
        dropped[rd] = True
        chosen.append(p)
    return chosen


def _apply(
    terms: list[tuple[float, TermSwaps]],
    keep: torch.Tensor,
    adds: torch.Tensor,
    drops: torch.Tensor,
) -> tuple[torch.Tensor, float]:
    """The mask with ``drops`` swapped for ``adds``, and its graph objective."""
    trial = keep.clone()
    trial[drops] = False
    trial[adds] = True
    return trial, _value(terms, trial)


def swap_search(
    objective: Objective,
    selected: torch.Tensor,
    *,
    max_rounds: int = 200,
    batch: int | None = None,
    tol: float = 1e-12,
    budget: TokenBudget | None = None,
) -> SwapResult:
    """Improve ``selected`` (k rows) by batches of 1-for-1 swaps on :func:`swap_objective`
    (under a token ``budget``, swaps that fit it, and fills: :class:`_Fits`).

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
    budget : TokenBudget, optional
        Keep the selection's tokens within it.

    Returns
    -------
    SwapResult
        ``value >= start``: the search never lowers :func:`swap_objective` (the graph
        objective, with facility location counted exactly at small select_ratio).
    """
    dev = objective.device_
    n = objective.features_.shape[0]
    sel = selected.to(dev).long()
    k = len(sel)
    keep = torch.zeros(n, dtype=torch.bool, device=dev)
    keep[sel] = True
    terms = _adapters(objective)
    current = start = _value(terms, keep)
    m = min(k, 1024) if batch is None else int(batch)
    result = SwapResult(selected=sel, start=start, value=start)
    scores = None
    fits = None if budget is None else _Fits(budget, dev)
    for rnd in range(max_rounds):
        result.rounds = rnd + 1
        if scores is None:
            scores = _scores(terms, keep, k)
        m_eff = min(m, k, n - k)
        if m_eff < 1:
            break
        adds, drops, bound = _candidate_pairs(scores, keep, k, m_eff, fits and fits.sizes)
        good = torch.nonzero(bound > tol).squeeze(1)
        if fits is not None:
            good = fits.within(keep, adds, drops, good)
        value = current
        if len(good):
            good, trial, value = _try_swaps(terms, keep, adds, drops, good, current + tol, fits)
        if value > current + tol:
            if fits is not None:  # the tokens the swaps freed, filled (J never falls)
                trial, value = _fill(terms, trial, value, scores[0], fits)
                k = int(trial.sum())
            keep, current, scores = trial, value, None
            result.record(rnd, len(good), value)
            m = min(2 * m, k)
        elif len(good) > 1:  # interacting swaps of pairwise similarity or DiSF: fewer at once
            m = max(1, min(m, len(good)) // 2)
        else:  # no positive bound, or a lone one that did not rise (rounding noise): stop,
            # unless a replacement rises (offered above a floor only, `_replacement_round`;
            # its 1-for-1 swaps are not priced in tokens, so not under a token budget)
            found = None if fits else _replacement_round(terms, keep, scores, current + tol)
            if found is None:
                break
            (keep, current, swapped), scores = found, None
            result.record(rnd, swapped, current)
    result.selected = torch.nonzero(keep).squeeze(1)
    result.value = current
    return result


def _candidate_pairs(
    scores: tuple, keep: torch.Tensor, k: int, m_eff: int, sizes: torch.Tensor | None = None
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """The ``m_eff`` best rows to add and to drop, paired best with best, and each pair's
    bound on the gain of its swap (with the exact cross term of paired terms). With
    ``sizes`` (a token budget) the best are by gain and loss per token."""
    gain, loss, pooled, paired = scores
    n = len(keep)  # k rows of it kept (a swap keeps the count)
    add_score = gain.masked_fill(keep, -torch.inf)
    drop_score = -loss.masked_fill(~keep, torch.inf)
    if pooled:  # DiSF, value-only terms: on a pool of the candidates the others rank best
        pool = max(t.pool_size(m_eff) for _, t in pooled)
        add_pool = add_score.topk(min(pool, n - k)).indices
        drop_pool = drop_score.topk(min(pool, k)).indices
        rows = torch.nonzero(keep).squeeze(1)
        add_score = torch.full_like(gain, -torch.inf)
        drop_score = torch.full_like(loss, -torch.inf)
        add_score[add_pool] = gain[add_pool]
        drop_score[drop_pool] = -loss[drop_pool]
        for w, term in pooled:
            g, l_ = term.scores(rows, add_pool, drop_pool)
            add_score[add_pool] += w * g
            drop_score[drop_pool] -= w * l_
    if sizes is None:
        adds = add_score.topk(m_eff).indices
        drops = drop_score.topk(m_eff).indices
    else:
        adds = (add_score / sizes).topk(m_eff).indices
        drops = (drop_score / sizes).topk(m_eff).indices
    bound = add_score[adds] + drop_score[drops]
    for w, term in paired:  # exact cross term of each pair (pairwise similarity)
        cross = term.pair(adds, drops)
        if cross is not None:
            bound = bound + w * cross
    return adds, drops, bound


def _try_swaps(
    terms: list,
    keep: torch.Tensor,
    adds: torch.Tensor,
    drops: torch.Tensor,
    good: torch.Tensor,
    above: float,
    fits: _Fits | None = None,
) -> tuple[torch.Tensor, torch.Tensor, float]:
    """Every positive pair at once; if that does not rise above ``above``, the
    non-interacting ones (that still fit the token budget, with ``fits``). The pairs
    tried, the trial keep mask and its value."""
    trial, value = _apply(terms, keep, adds[good], drops[good])
    if not value > above and len(good) > 1:
        fp = _footprints(terms, keep, adds[good])
        pick = _independent(adds[good], drops[good], fp, len(keep))
        if len(pick) < len(good):
            good = good[torch.as_tensor(pick, dtype=torch.long, device=good.device)]
            if fits is not None:
                good = fits.within(keep, adds, drops, good)
            trial, value = _apply(terms, keep, adds[good], drops[good])
    return good, trial, value


class _Fits:
    """The token budget as the swap search reads it: the sizes on the device, and which
    swaps of a batch fit. Under a budget the candidates are ranked per token (the best gain
    per token to add, the least loss per token to drop), a batch keeps the swaps that fit
    (:meth:`within`) and the tokens it frees are filled (:func:`_fill`): the count kept may
    change, the tokens stay within the budget."""

    def __init__(self, budget: TokenBudget, device: torch.device) -> None:
        self.budget = budget
        self.sizes = torch.as_tensor(budget.sizes, dtype=torch.float64, device=device)

    def slack(self, keep: torch.Tensor) -> float:
        return self.budget.total - float(self.sizes[keep].sum())

    def within(
        self, keep: torch.Tensor, adds: torch.Tensor, drops: torch.Tensor, good: torch.Tensor
    ) -> torch.Tensor:
        """The pairs of ``good`` that keep the tokens within the budget applied together:
        every pair that frees tokens, then, in order, each pair that takes some while the
        tokens left (freed ones included) hold it."""
        change = (self.sizes[adds[good]] - self.sizes[drops[good]]).cpu().numpy()
        frees = change <= 0
        left = self.slack(keep) - float(change[frees].sum())
        chosen = frees.copy()
        for i in np.flatnonzero(~frees).tolist():
            if change[i] <= left:
                chosen[i] = True
                left -= change[i]
        return good[torch.as_tensor(np.flatnonzero(chosen), dtype=torch.long, device=good.device)]


def _fill(
    terms: list, keep: torch.Tensor, value: float, gain: torch.Tensor, fits: _Fits
) -> tuple[torch.Tensor, float]:
    """``keep`` (of objective ``value``) with the rows of positive ``gain`` added, best
    gain per token first, each that fits the tokens left (the objective is monotone: an
    add never lowers it); and its value, computed again only when a row was added."""
    left = fits.slack(keep)
    per_token = (gain / fits.sizes).masked_fill(keep | (gain <= 0), -torch.inf)
    order = torch.argsort(per_token, descending=True, stable=True)
    order = order[: int(torch.isfinite(per_token).sum())].cpu().numpy()
    rows = fits.budget.fill(order, left=left) if len(order) else order
    if len(rows) == 0:
        return keep, value
    trial = keep.clone()
    trial[torch.as_tensor(rows, dtype=torch.long, device=keep.device)] = True
    return trial, _value(terms, trial)


def _replacement_round(
    terms: list[tuple[float, TermSwaps]], keep: torch.Tensor, scores: tuple, above: float
) -> tuple[torch.Tensor, float, int] | None:
    """Swaps of a kept row for a row that takes over its documents, which the separable
    bound ``gain_b - loss_a`` of :func:`_candidate_pairs` prices far too low above a floor
    (:meth:`~datamask.optim.swaps.FacilitySwaps.replacements`). Every pair with a positive
    gain (its bound plus the pair's extra), best first, those that share no document or
    row applied at once, else the best alone. None when no term offers pairs (no floor:
    the search is unchanged), when a term is scored on a pool (DiSF), or when nothing
    rises above ``above``; else the new mask, its value and the swaps made."""
    gain, loss, pooled, _ = scores
    offered = [(w, t.replacements(keep)) for w, t in terms if w != 0]
    offered = [(w, found) for w, found in offered if found is not None]
    if pooled or not offered:
        return None
    n = len(keep)
    key = torch.cat([a * n + b for _, (a, b, _) in offered])
    extra = torch.cat([w * e for w, (_, _, e) in offered])
    pairs, where = torch.unique(key, return_inverse=True)
    total = torch.zeros(len(pairs), dtype=torch.float64, device=keep.device)
    total.index_add_(0, where, extra)
    drops, adds = pairs // n, pairs % n
    value = gain[adds] - loss[drops] + total
    order = torch.argsort(value, descending=True, stable=True)
    order = order[value[order] > 0]
    if len(order) == 0:
        return None
    adds, drops = adds[order], drops[order]
    pick = _independent(adds, drops, _footprints(terms, keep, adds), n, disjoint=True)
    for chosen in (torch.as_tensor(pick, dtype=torch.long, device=keep.device), order[:1] * 0):
        trial, value_now = _apply(terms, keep, adds[chosen], drops[chosen])
        if value_now > above:
            return trial, value_now, len(chosen)
    return None
