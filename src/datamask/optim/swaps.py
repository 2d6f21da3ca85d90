"""How the swap search scores each term: the protocol it talks to, and its adapters.

The swap search (:mod:`datamask.optim.local_search`) is the only optimiser that needs a
term's add and drop scores over every row, its pair corrections and its swap footprints,
so it owns those hooks: a term keeps the :class:`~datamask.objectives.Term` contract
(value, batch values, expected value, the greedy trio) and the search reaches it through
a :class:`TermSwaps` adapter. The default adapter works for any term, by differencing its
:meth:`~datamask.objectives.Term.graph_value` (and, for a ``modular`` term, from its
gains); a term with faster rules gets its own adapter with :func:`register_swaps`, as the
built-in terms do below.

One adapter is made per term and per search (:func:`swaps_for`): it may keep what one
call computes for the next (facility location's covering rows, between
:meth:`TermSwaps.bounds` and :meth:`TermSwaps.footprint`).
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Protocol

import torch

from ..objectives import DiSF, FacilityLocation, PairwiseSimilarity, Quality, Term
from ..objectives.cover_state import _gather

__all__ = ["DISF_POOL", "SwapScoring", "TermSwaps", "register_swaps", "swaps_for"]

#: Candidates DiSF scores per round (its O(d^2)-a-row scores run on a pool of the rows the
#: other terms rank best).
DISF_POOL = 8192


class SwapScoring(Protocol):
    """What the swap search asks of one term (every row scored on ``keep``, a bool mask)."""

    def value(self, keep: torch.Tensor) -> float:
        """The value the search maximises for the selection ``keep``."""

    def bounds(self, keep: torch.Tensor, k: int) -> tuple[torch.Tensor, torch.Tensor] | None:
        """Per row (float64, shape (n,)): the gain of adding it and the loss of dropping
        it, each alone; None when the term has no cheap all-rows scores (the search then
        asks :meth:`scores` on a pool of :meth:`pool_size` candidates)."""

    def pair(self, adds: torch.Tensor, drops: torch.Tensor) -> torch.Tensor | None:
        """Exact correction of swapping ``drops[i]`` for ``adds[i]`` beyond the sum of the
        two single-row scores (None: no interaction counted)."""

    def footprint(self, keep: torch.Tensor, adds: torch.Tensor) -> tuple | None:
        """The rows each swap touches (each kept row's drop, each candidate of ``adds``),
        CSR ``(ptr, rows)`` pairs, so that the search can pick swaps that add up (None:
        swaps do not interact)."""

    def replacements(
        self, keep: torch.Tensor
    ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor] | None:
        """Pairs ``(drops, adds, extra)`` whose swap gains ``extra`` beyond the two single
        scores of :meth:`bounds` (the same ``keep``), for the search's replacement round;
        None: no such pairs are offered."""

    def pool_size(self, m: int) -> int:
        """Candidates scored by :meth:`scores` for a search examining ``m`` pairs a round."""

    def scores(
        self, selected: torch.Tensor, adds: torch.Tensor, drops: torch.Tensor
    ) -> tuple[torch.Tensor, torch.Tensor]:
        """The gain if each of ``adds`` were added to ``selected`` alone, and the loss if
        each of ``drops`` (rows of ``selected``) were dropped alone."""


class TermSwaps:
    """The default :class:`SwapScoring` of a term, from its public contract only.

    The value is :meth:`~datamask.objectives.Term.graph_value`; a ``modular`` term scores
    every row from its gains of the empty selection; any other term is scored on a pool
    of 64 candidates, by differencing ``graph_value`` (one call per candidate).
    """

    def __init__(self, term: Term) -> None:
        self.term = term

    def value(self, keep: torch.Tensor) -> float:
        return self.term.graph_value(torch.nonzero(keep).squeeze(1))

    def bounds(self, keep: torch.Tensor, k: int) -> tuple[torch.Tensor, torch.Tensor] | None:
        if not self.term.modular:
            return None
        every = torch.arange(keep.shape[0], device=keep.device)
        g = self.term.gains(self.term.init_state(), every).double()
        return g, g

    def pair(self, adds: torch.Tensor, drops: torch.Tensor) -> torch.Tensor | None:
        return None

    def footprint(self, keep: torch.Tensor, adds: torch.Tensor) -> tuple | None:
        return None

    def replacements(
        self, keep: torch.Tensor
    ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor] | None:
        return None

    def pool_size(self, m: int) -> int:
        return 64

    def scores(
        self, selected: torch.Tensor, adds: torch.Tensor, drops: torch.Tensor
    ) -> tuple[torch.Tensor, torch.Tensor]:
        value = self.term.graph_value
        base = value(selected)
        gain = [value(torch.cat([selected, a.view(1)])) - base for a in adds]
        loss = [base - value(selected[selected != d]) for d in drops]
        dev = selected.device
        return (
            torch.tensor(gain, dtype=torch.float64, device=dev),
            torch.tensor(loss, dtype=torch.float64, device=dev),
        )


#: Term class -> its adapter (looked up along the term's MRO: a subclass inherits it).
SWAPS: dict[type[Term], type[TermSwaps]] = {}


def register_swaps(term_class: type[Term]) -> Callable[[type[TermSwaps]], type[TermSwaps]]:
    """Class decorator: the adapter the swap search uses for ``term_class``."""

    def add(adapter: type[TermSwaps]) -> type[TermSwaps]:
        SWAPS[term_class] = adapter
        return adapter

    return add


def swaps_for(term: Term) -> TermSwaps:
    """A fresh adapter for ``term``: its registered one, else :class:`TermSwaps`."""
    for klass in type(term).__mro__:
        if klass in SWAPS:
            return SWAPS[klass](term)
    return TermSwaps(term)


# --- the built-in terms ------------------------------------------------------------------------
@register_swaps(Quality)
class QualitySwaps(TermSwaps):
    """A row adds (or takes away) ``q / k`` (``l q / T`` under a token budget), in
    float64."""

    def bounds(self, keep: torch.Tensor, k: int) -> tuple[torch.Tensor, torch.Tensor]:
        q = self.term.mass_
        return q, q


@register_swaps(PairwiseSimilarity)
class PairwiseSwaps(TermSwaps):
    """With s the kept rows' sum and c = k (k - 1): adding b changes the term by
    ``-2 <x_b, s> / c``, dropping a by ``(2 <x_a, s> - 2) / c`` (its self product); a swap
    adds the cross term ``+2 <x_b, x_a> / c``, counted in both single scores.

    Under a token budget (weights ``w = l / T``, s the kept rows' sum of ``w x``): adding
    b changes the term by ``-(2 w_b <x_b, s> + w_b^2)``, dropping a by
    ``2 w_a <x_a, s> - w_a^2``, and a swap adds ``+2 w_a w_b <x_a, x_b>``."""

    def bounds(self, keep: torch.Tensor, k: int) -> tuple[torch.Tensor, torch.Tensor]:
        x = self.term.features_
        w = self.term.w_
        if w is not None:
            s = (w[keep, None] * x[keep].to(torch.float64)).sum(0)
            dots = w * (x.to(torch.float64) @ s)
            return -(2.0 * dots + w * w), -(2.0 * dots - w * w)
        self._norm = c = max(k * (k - 1), 1)
        pair_sum = x[torch.nonzero(keep).squeeze(1)].to(torch.float64).sum(0)
        dots = x.to(torch.float64) @ pair_sum
        return (-2.0 * dots) / c, (-2.0 * dots + 2.0) / c

    def pair(self, adds: torch.Tensor, drops: torch.Tensor) -> torch.Tensor:
        x = self.term.features_
        w = self.term.w_
        if w is not None:
            return 2.0 * w[adds] * w[drops] * (x[adds] * x[drops]).sum(1).double()
        return 2.0 / self._norm * (x[adds] * x[drops]).sum(1).double()


@register_swaps(DiSF)
class DiSFSwaps(TermSwaps):
    """Exact single-row changes (:meth:`~datamask.objectives.DiSF.single_changes`, O(d^2) a
    row as matrix products) on a pool of at least :data:`DISF_POOL` candidates."""

    def pool_size(self, m: int) -> int:
        return max(4 * m, DISF_POOL)

    def scores(
        self, selected: torch.Tensor, adds: torch.Tensor, drops: torch.Tensor
    ) -> tuple[torch.Tensor, torch.Tensor]:
        return self.term.single_changes(selected, adds, drops)


def _csr(keys: torch.Tensor, values: torch.Tensor, n: int) -> tuple[torch.Tensor, torch.Tensor]:
    """``values`` grouped by ``keys`` in [0, n): ``(ptr, grouped)``, group j at ptr[j]:ptr[j+1]."""
    order = torch.argsort(keys, stable=True)
    keys, values = keys[order], values[order]
    return torch.searchsorted(keys, torch.arange(n + 1, device=keys.device)), values


@register_swaps(FacilityLocation)
class FacilitySwaps(TermSwaps):
    """Facility location on its K-NN graph, or counted exactly with ``exact_rounding_``
    (small select_ratio: :meth:`~datamask.objectives.FacilityLocation.exact_cover`)."""

    #: The last bounds' gain sums and the cover they were of (one adapter a search).
    _sums: tuple[torch.Tensor | None, torch.Tensor | None] = (None, None)
    #: The last mask valued on the graph, its version and :meth:`_kept_top` of it.
    _top: tuple[torch.Tensor, int, torch.return_types.topk] | None = None
    _buf: torch.Tensor | None = None

    def value(self, keep: torch.Tensor) -> float:
        if not self.term.exact_rounding_:  # graph_value of the mask, without its rows
            return float(self._kept_top(keep).values[:, 0].double().mean())
        return self.term.exact_cover(keep).value()

    def _kept_top(self, keep: torch.Tensor) -> torch.return_types.topk:
        """Each document's two most similar kept neighbours on the graph (``topk``'s
        values and places in its list; a single one on a graph of K = 1), for the mask
        ``keep``: one (n, K) pass a mask, shared by :meth:`value` of an accepted trial and
        the next round's :meth:`bounds` (the pass was 32 ms of a 56k x 160 graph's 43)."""
        if self._top is not None and self._top[0] is keep and self._top[1] == keep._version:
            return self._top[2]
        idx, sim = self.term.knn_graph()
        # (n, K): the kept neighbours' sims, in one buffer for the search (a fresh 36 MB
        # block a pass was a third of its 35 ms at 56k x 160, faulting its pages in)
        if self._buf is None or self._buf.shape != sim.shape or self._buf.dtype != sim.dtype:
            self._buf = torch.empty(sim.shape, dtype=sim.dtype, device=sim.device)
        covered = _gather(keep.to(sim.dtype), idx, out=self._buf).mul_(sim)
        top = covered.topk(min(2, covered.shape[1]), dim=1)
        self._top = (keep, keep._version, top)
        return top

    def bounds(self, keep: torch.Tensor, k: int) -> tuple[torch.Tensor, torch.Tensor]:
        """Gain of adding each row against the current coverage, and loss of dropping each
        kept row: the coverage its clients fall back to (their second-best kept row). The
        exact swap gain of a pair is never below ``gain - loss``.

        On the graph objective both are exact. With ``exact_rounding_`` the coverage and
        the losses are exact on all pairs and the gain of an add counts the documents that
        list it (a lower bound: a document whose cover is below its K-th similarity may
        gain from a row it does not list)."""
        term = self.term
        n = keep.shape[0]
        idx, sim = term.knn_graph()
        drop = torch.zeros(n + 1, dtype=torch.float64, device=keep.device)
        if term.exact_rounding_:
            cover = term.exact_cover(keep, as_base=True)
            best, second, owner = cover.best, cover.second, cover.owner
            self._owners = torch.stack([cover.owner, cover.owner2], 1)  # footprints
        else:
            top = self._kept_top(keep)
            best = top.values[:, 0]
            second = top.values[:, 1] if top.values.shape[1] > 1 else torch.zeros_like(best)
            owner = idx.gather(1, top.indices[:, :1]).squeeze(1)
            owners = idx.gather(1, top.indices)  # best and second-best kept neighbour
            self._owners = torch.where(top.values > 0, owners, n)  # 0: no neighbour
        self._best, self._second = best, second
        drop.index_add_(0, owner, (best - second).to(torch.float64))
        # The gains of adds, from the last round's by the documents whose cover changed.
        sums = term.graph_gain_sums(best, *self._sums)
        self._sums = (sums, best)
        gain = (sums / n).to(best.dtype)
        return gain.to(torch.float64), drop[:n] / n

    def footprint(self, keep: torch.Tensor, adds: torch.Tensor) -> tuple:
        """The documents each kept row covers best or second best, and those each row of
        ``adds`` would gain on (among the documents that list it), both CSR ``(ptr, rows)``
        (after :meth:`bounds` on ``keep``): swaps whose footprints do not meet add up
        (their bounds count only those gains)."""
        n = keep.shape[0]
        owners = self._owners
        real = (owners < n).reshape(-1)  # n: no covering row
        clients = torch.arange(n, device=keep.device).repeat_interleave(owners.shape[1])
        idx, sim = self.term.knn_graph()
        # The listed rows that beat a document's current cover, grouped by row: only these
        # entries are sorted (no reverse graph, which would double the graph's memory).
        candidate = torch.zeros(n, dtype=torch.bool, device=keep.device)
        candidate[adds] = True
        listed = _gather(candidate, idx) & (sim > self._best[:, None])
        doc, pos = torch.nonzero(listed, as_tuple=True)
        return (
            _csr(owners.reshape(-1)[real], clients[real], n),
            _csr(idx[doc, pos], doc, n),
        )

    def replacements(
        self, keep: torch.Tensor
    ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor] | None:
        """With a floor (``--given``) only: every pair of a kept row a and a row b listed by
        a document that a covers best, with what swapping a for b gains beyond
        ``gain_b - loss_a`` (after :meth:`bounds` on ``keep``):
        ``sum_{i: owner_i = a} max(0, s_ib - second_i) - max(0, s_ib - best_i)``, over n.

        ``loss_a`` assumes a's documents fall back to their second-best kept row and
        ``gain_b`` prices b against their best, so a row that would take over a's
        documents (a better replacement of a) gets a bound far below its swap's gain. Above
        a floor most covered documents have one kept row above it (80% on real text, 10%
        kept, against none without a floor), so ``second_i`` is 0 and the bound misses
        every such replacement; without a floor ``second_i`` is near ``best_i`` and the
        search is left as it was. Read from the graph only: a lower bound of the swap's
        gain where a document does not list b."""
        term = self.term
        if term.floor_ is None:
            return None
        n = keep.shape[0]
        idx, sim = term.knn_graph()
        owner = self._owners[:, 0]
        docs = torch.nonzero(owner < n).squeeze(1)  # covered above the floor by a kept row
        cols, s = idx[docs], sim[docs]
        best, second = self._best[docs, None], self._second[docs, None]
        extra = (s - second).clamp_min(0.0) - (s - best).clamp_min(0.0)
        d, r = torch.nonzero((extra > 0) & ~_gather(keep, cols), as_tuple=True)
        key = owner[docs[d]] * n + cols[d, r]
        pairs, where = torch.unique(key, return_inverse=True)
        total = torch.zeros(len(pairs), dtype=torch.float64, device=keep.device)
        total.index_add_(0, where, extra[d, r].double())
        return pairs // n, pairs % n, total / n
