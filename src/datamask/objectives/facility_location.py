"""Facility location: how well the subset covers every document of the corpus."""

from __future__ import annotations

import math
import time
from typing import Any

import torch
import torch.nn.functional as F

from .._validation import Interval, Options, check_count
from ..neighbors import (
    KNN_METHODS,
    best_match,
    block_rows,
    column_lists,
    knn_graph,
    resolve_knn,
)
from .base import HostGains, Term, TermContext
from .cover_state import CoverState, ExactCover, _gather, _GraphGains, graph_top2
from .registry import register_term

__all__ = [
    "FacilityLocation",
    "KEPT_NEIGHBORS",
    "LEARNER_MAX_NEIGHBORS",
    "MAX_NEIGHBORS",
    "MISS_FLOOR",
    "MIN_NEIGHBORS",
    "facility_term",
    "neighbors_for_ratio",
]

#: With ``n_neighbors=None`` K is chosen so that a document expects this many kept
#: neighbours in its list (K * k / n); docs/method.md "The learner and its estimator".
KEPT_NEIGHBORS = 16
#: ... and K is never below this (nor above n) ...
MIN_NEIGHBORS = 64
#: ... nor above this: the graph, its reverse and the swap search's work arrays hold about
#: 40 bytes per entry (N = 50k, K = 1024: 2 GB). Below select_ratio 1/64 fewer than 16
#: kept neighbours are expected; pass ``n_neighbors`` to go higher.
MAX_NEIGHBORS = 1024
#: The learner's cap (``TermContext.max_neighbors``): K does not grow as 1/select_ratio
#: below ratio 0.1. Its swap rounding counts the coverage beyond the K-th neighbour exactly
#: instead (``FacilityLocation.exact_rounding_``), so the graph only steers the gradient
#: steps and bounds the gains of adds; memory stays O(n * 160) at any ratio
#: (benchmarks/realtext/RESULTS.md, speed).
LEARNER_MAX_NEIGHBORS = 160
#: Floor of a neighbour's chance of not being kept in ``FacilityLocation.expected`` (the
#: float32 gap below 1): a keep-probability of exactly 1 would zero every later term and
#: leave the closed-form gradient 0 / 0.
MISS_FLOOR = 2.0**-24


def neighbors_for_ratio(k: int, n: int, cap: int = MAX_NEIGHBORS) -> int:
    """K of the graph for a selection of ``k`` of ``n`` rows:
    ``min(n, cap, max(MIN_NEIGHBORS, ceil(KEPT_NEIGHBORS * n / k)))``."""
    wanted = max(MIN_NEIGHBORS, math.ceil(KEPT_NEIGHBORS * n / max(k, 1)))
    return int(min(n, cap, wanted))


@register_term("Facility")
class FacilityLocation(Term):
    """``D(S) = mean_i max(0, max_{j in S} <x_i, x_j>)`` over all n documents i.

    Monotone submodular with ``D({}) = 0`` (similarities below 0 count as 0), the
    reference's ``Facility``. ``value`` and greedy gains are exact (dense, computed in
    blocks). ``expected`` works on a sparse K-nearest-neighbour graph: for document i with
    neighbours sorted by similarity s_1 >= ... >= s_K, the expected coverage under
    independent keep-probabilities is ``sum_r s_r p_r prod_{t<r} (1 - p_t)`` plus
    ``s_K prod_{t<=K} (1 - p_t)``: when no neighbour is kept, the K-th similarity stands
    in for the unseen rest (an upper bound; with K=128 it beat both 0 and 0.5-0.9 s_K on
    the benchmarks, see docs/method.md "Estimators, measured"). When K covers every
    document there is no unseen rest and that term is dropped, so the value is the exact
    expectation.

    Given a floor (``TermContext.floor``: each document's best cosine to documents kept
    before, ``--given``), every part counts coverage above it,
    ``mean_i max(0, max_{j in S} <x_i, x_j> - floor_i)``: the value, the graph (raised as
    :meth:`raise_floor` raises it), the dense and sparse gains, the exact covers of the
    swap rounding and the batch rewards.

    Under a token budget (``TermContext.sizes``) the mean over documents is a mean over
    tokens, ``sum_i w_i max(0, ...) / n`` with ``w_i = l_i / mean(l)`` (``weights_``): a
    document counts by its length, so one cut in two halves with the same embedding is
    covered as the whole was (docs/method.md "Token budgets"). Each row of the graph is
    scaled by its ``w_i`` once (``max(w s) = w max(s)`` for ``w > 0``), so the graph
    objective, its gains, the expectation and the swap covers need nothing more; the
    dense paths multiply by ``w`` where they read raw similarities.

    Greedy gains come in two kinds (:meth:`init_state`): on the graph, the exact gain of
    the graph objective ``mean_i max(0, max_{j in S and N(i)} sim_ij)`` (O(K) per
    candidate, what ``--method greedy`` maximises), or dense, the exact gain of the full
    objective (O(n) per candidate, ``greedy-dense``).

    Parameters
    ----------
    n_neighbors : int, optional
        K of the graph. Default: :func:`neighbors_for_ratio` of the target size, so that
        every document expects ``KEPT_NEIGHBORS`` kept neighbours in its list (up to 1024);
        the learner caps it at ``LEARNER_MAX_NEIGHBORS`` (160) and counts the coverage its
        graph misses exactly in its rounding (``exact_rounding_``).
    knn : {"auto", "exact", "ivf", "faiss"}, default="auto"
        How the graph is built, see :func:`datamask.neighbors.knn_graph`. The ivf k-means
        draws from the context's seeded generator (``TermContext.generator``), so the
        graph depends on the input and the run's seed only.
    n_probe : int, optional
        Probes of the approximate searches (default ``neighbors.default_n_probe``).
    graph : (indices, similarities) tensors, optional
        A prebuilt graph with at least K columns, most similar first (its first K are
        used): benchmarks build it once for several selectors.
    dense_max_bytes : int, default=12 GiB
        Dense greedy gains read rows of the full n x n similarity matrix, built once in
        blocks on first use, while it fits in this many bytes (float32); above it every
        gain is computed from the features (a pass over all n x d values per candidate).

    Attributes
    ----------
    n_neighbors_ : int
        K used (set by :meth:`bind`).
    graph_seconds_ : float
        Time spent building the graph (0 until built, or when it was given).
    graph_method_ : str
        The search that built it (``exact``, ``ivf``, ``faiss`` or ``given``).
    """

    name = "facility"
    submodular = True
    has_graph = True
    per_document = True
    takes_floor = True
    takes_sizes = True
    _parameter_constraints = {
        "n_neighbors": [Interval(int, 0, None, closed="neither"), None],  # "> 0"
        "knn": [Options(str, tuple(KNN_METHODS))],
        "n_probe": [Interval(int, 1, None, closed="left"), None],
        "graph": [tuple, None],
        "dense_max_bytes": [Interval(int, 0, None, closed="left")],
    }

    def __init__(
        self,
        n_neighbors: int | None = None,
        knn: str = "auto",
        n_probe: int | None = None,
        graph: tuple[torch.Tensor, torch.Tensor] | None = None,
        dense_max_bytes: int = 12 * 2**30,
    ) -> None:
        self.n_neighbors = n_neighbors
        self.knn = knn
        self.n_probe = n_probe
        self.graph = graph
        self.dense_max_bytes = dense_max_bytes

    def __repr__(self) -> str:
        return f"FacilityLocation(n_neighbors={self.n_neighbors}, knn={self.knn!r})"

    def bind(
        self,
        ctx: TermContext | torch.Tensor,
        quality: torch.Tensor | None = None,
        k: int | None = None,
    ) -> FacilityLocation:
        super().bind(ctx, quality, k)
        features = self.features_
        n = self.n_docs
        if self.n_neighbors is None:
            cap = self.ctx_.max_neighbors
            self.n_neighbors_ = neighbors_for_ratio(
                self.k_, n, MAX_NEIGHBORS if cap is None else min(cap, MAX_NEIGHBORS)
            )
        else:
            self.n_neighbors_ = min(check_count("n_neighbors", self.n_neighbors), n)
        self.floor_ = self.ctx_.floor  # coverage from documents kept before (--given)
        sizes = self.ctx_.sizes  # a token budget: each document counts by its length
        self.weights_ = None if sizes is None else (sizes / sizes.mean()).to(features.dtype)
        self.graph_floor_: torch.Tensor | None = None  # what the graph is raised by
        self.graph_: tuple[torch.Tensor, torch.Tensor] | None = None
        self.graph_seconds_ = 0.0
        self.graph_method_ = "given" if self.graph is not None else ""
        if self.graph is not None:
            idx, sim = self.graph
            if idx.shape[0] != n or idx.shape[1] < self.n_neighbors_:
                raise ValueError(
                    f"graph must have {n} rows and >= {self.n_neighbors_} columns; "
                    f"got {tuple(idx.shape)}."
                )
            kk = self.n_neighbors_
            if kk and (int(idx[:, :kk].min()) < 0 or int(idx[:, :kk].max()) >= n):
                raise ValueError(
                    f"graph indices must be rows of the corpus, in [0, {n}); got values from "
                    f"{int(idx[:, :kk].min())} to {int(idx[:, :kk].max())}."
                )
            dev = features.device
            sim = sim[:, :kk].to(dev, features.dtype).clamp_min(0)
            self.graph_ = (idx[:, :kk].to(dev), self._weigh(sim))
            self._raise_to_given()
        self.reverse_: tuple[torch.Tensor, torch.Tensor, torch.Tensor] | None = None
        self.dense_: torch.Tensor | None = None
        # Fewer than KEPT_NEIGHBORS kept rows expected in a list: the graph misses much of
        # the coverage, so the swap rounding counts it exactly (ExactCover: from the graph
        # where a list holds two kept rows, over all pairs for the other documents) and
        # uses the graph for the gains of adds.
        kk = self.n_neighbors_
        self.exact_rounding_ = kk < n and kk * self.k_ < KEPT_NEIGHBORS * n
        self._covers: list[ExactCover] = []
        self._nearest: tuple[torch.Tensor, torch.Tensor, torch.Tensor] | None = None
        self._cover_base: ExactCover | None = None
        return self

    def _dense(self) -> torch.Tensor | None:
        """The clipped n x n similarity matrix when it fits ``dense_max_bytes``, else None."""
        n = self.n_docs
        if self.dense_ is None and n * n * 4 <= self.dense_max_bytes:
            x = self.features_
            self.dense_ = torch.empty(n, n, dtype=x.dtype, device=x.device)
            step = block_rows(n)
            for lo in range(0, n, step):
                torch.matmul(x[lo : lo + step], x.T, out=self.dense_[lo : lo + step])
            self.dense_.clamp_(min=0.0)
        return self.dense_

    def knn_graph(
        self, generator: torch.Generator | None = None
    ) -> tuple[torch.Tensor, torch.Tensor]:
        """The (indices, similarities clipped at 0) K-NN graph, built once on first use.

        Its random draws (the ivf k-means) come from ``generator``, by default the bound
        context's: the same seed builds the same graph whatever torch's global state.
        """
        if self.graph_ is None:
            start = time.perf_counter()
            x = self.features_
            self.graph_method_ = resolve_knn(self.knn, self.n_docs, x.device)
            idx, sim = knn_graph(
                x,
                self.n_neighbors_,
                method=self.graph_method_,
                n_probe=self.n_probe,
                generator=self.ctx_.generator if generator is None else generator,
            )
            self.graph_ = (idx, self._weigh(sim.clamp_min_(0.0)))  # its own tensor: in place
            self._raise_to_given()
            self.graph_seconds_ = time.perf_counter() - start
        return self.graph_

    def _weigh(self, sim: torch.Tensor) -> torch.Tensor:
        """``sim`` (rows = documents, the graph's own tensor) scaled in place row by row by
        the token weights; as it is under a document budget."""
        return sim if self.weights_ is None else sim.mul_(self.weights_[:, None])

    def _raise_to_given(self) -> None:
        if self.floor_ is not None:
            self.raise_floor(self.floor_)

    def raise_floor(self, floor: torch.Tensor) -> None:
        """Count coverage on the graph only above a per-document ``floor``: each document's
        similarities become ``max(sim - floor_i, 0)``, since ``max(b, m) - b = max(m - b, 0)``.

        ``floor[i]`` is the coverage document ``i`` already has from rows outside this
        corpus (a sharded run's exchange round: the kept documents of neighbouring
        groups), so the graph objective, its gains and :func:`~datamask.greedy.lazy.
        gain_order` price only what a row adds to it. The exact objective (:meth:`value`)
        is unchanged.
        """
        floor = torch.as_tensor(floor)
        if floor.shape != (self.n_docs,):
            raise ValueError(f"floor must have shape ({self.n_docs},); got {tuple(floor.shape)}.")
        _, sim = self.knn_graph()
        floor = floor.to(sim.device, sim.dtype).clamp_min(0.0)
        # Raised twice (a given floor, then the exchange round's), by the larger of the two:
        # max(0, max(0, s - a) - (b - a)) = max(0, s - b) for b >= a.
        before = self.graph_floor_
        total = floor if before is None else torch.maximum(before, floor)
        step = total if before is None else total - before
        if self.weights_ is not None:  # the rows are w_i s_ij: w_i max(s - b, 0)
            step = step * self.weights_
        sim.sub_(step[:, None]).clamp_min_(0.0)
        self.graph_floor_ = total
        self.reverse_ = None  # rebuilt from the raised graph on first use

    def build_graph(self) -> None:
        self.knn_graph()

    def graph_summary(self) -> dict | None:
        if self.graph_ is None:
            return None
        return {
            "method": self.graph_method_,
            "n_neighbors": int(self.n_neighbors_),
            "n_probe": self.n_probe,
            "seconds": float(self.graph_seconds_),
        }

    def reverse_graph(self) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        """The graph by column, CSR: ``(ptr, clients, sims)``; the documents that list row
        j as a neighbour are ``clients[ptr[j]:ptr[j + 1]]``, at similarity ``sims[...]``."""
        if self.reverse_ is None:
            idx, sim = self.knn_graph()
            ptr, order = column_lists(idx, idx.shape[0])
            self.reverse_ = (ptr, order // idx.shape[1], sim.reshape(-1)[order])
            self._ptr_list = ptr.tolist()  # python ints: slicing one column costs no sync
        return self.reverse_

    def graph_coverage(self, selected: torch.Tensor) -> torch.Tensor:
        """Per-document coverage on the graph: ``max(0, max_{j in S and N(i)} sim_ij)``."""
        idx, sim = self.knn_graph()
        keep = torch.zeros(self.n_docs, dtype=sim.dtype, device=sim.device)
        keep[selected] = 1.0
        return (sim * _gather(keep, idx)).amax(1)

    def graph_value(self, selected: torch.Tensor) -> float:
        """The graph objective of ``selected`` (what ``greedy`` and the local search
        maximise); never above :meth:`value` on an exact graph."""
        return float(self.graph_coverage(selected).double().mean())

    def nearest(self, selected: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """Every document's most similar row of ``selected`` (non-empty) by ``best_match``'s
        exact search: ``(cosine, position in selected)``, copies to the first. Kept for
        :meth:`exact_nearest`: the cover of a selection just scored is read from it."""
        sims, index, _ = best_match(self.features_, self.features_[selected], method="exact")
        self._nearest = (selected.detach().clone(), sims, index)
        return sims, index

    def exact_nearest(self, selected: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor] | None:
        """:meth:`nearest` of ``selected`` if its last call was for these rows, else None."""
        done = self._nearest
        same = done is not None and torch.equal(done[0].cpu(), selected.cpu())
        return (done[1], done[2]) if same else None

    def coverage(self, selected: torch.Tensor) -> torch.Tensor:
        """Per-document ``max(0, max_{j in S} sim)`` over every pair (:meth:`nearest`);
        above the floor when there is one, ``max(0, max_{j in S} sim - floor_i)``."""
        x = self.features_
        if len(selected) == 0:
            return torch.zeros(self.n_docs, dtype=x.dtype, device=x.device)
        cover = self.nearest(selected)[0].clamp_min(0.0)
        if self.floor_ is not None:
            cover = (cover - self.floor_).clamp_min_(0.0)
        return cover if self.weights_ is None else cover * self.weights_

    def value(self, selected: torch.Tensor) -> float:
        return float(self.coverage(selected).double().mean())

    # --- exact coverage of a selection (the swap rounding, optim.swaps) --------------------
    def _top2(self, docs: torch.Tensor, sel: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """The two most similar rows of ``sel`` for each row of ``docs`` (clipped at 0;
        row n where the similarity is 0), in blocks of about 4M similarities."""
        x, n = self.features_, self.n_docs
        vals = torch.zeros(len(docs), 2, dtype=x.dtype, device=x.device)
        rows = torch.full((len(docs), 2), n, dtype=torch.long, device=x.device)
        if len(sel) == 0:
            return vals, rows
        xs, m = x[sel], min(2, len(sel))
        step = block_rows(len(sel), budget=1 << 22, device=x.device)
        for lo in range(0, len(docs), step):
            v, i = (x[docs[lo : lo + step]] @ xs.T).topk(m, dim=1)
            if self.floor_ is not None:  # coverage above what was kept before
                v = v - self.floor_[docs[lo : lo + step], None]
            v = v.clamp_min(0.0)
            if self.weights_ is not None:  # per token: the order in a row is unchanged
                v = v * self.weights_[docs[lo : lo + step], None]
            vals[lo : lo + step, :m] = v
            rows[lo : lo + step, :m] = torch.where(v > 0, sel[i], n)
        return vals, rows

    def exact_cover(self, keep: torch.Tensor, *, as_base: bool = False) -> ExactCover:
        """:class:`ExactCover` of the bool mask ``keep``. ``as_base``: the selection a
        search stands on, from which the next covers are derived (the others are
        forgotten)."""
        cover = self._cover_of(keep)
        if as_base:
            self._cover_base = cover
            self._covers = [cover]
        return cover

    def _cover_of(self, keep: torch.Tensor) -> ExactCover:
        """:class:`ExactCover` of ``keep`` (looked up among the last ones computed first).

        1. From the graph: a document with two kept rows in its list (at similarity > 0)
           has its exact best and second best there, since every row it does not list is
           at most as similar as its K-th neighbour. One pass over the graph.
        2. The other ("thin") documents are compared with the selection over all pairs:
           derived from the base (the selection the search stands on) by its swaps when
           the document was thin there too and lost neither of its two rows (compared
           with the adds only, O(d) per add), else with the whole selection (O(k d)).

        Exact for an exact graph; on an approximate one a thick document's cover is read
        from its (approximate) list. On an exact graph a document whose K-th similarity is
        0 (above its floor: ``--given``'s KEPT covers it at least as well) is not thin: no
        row it does not list covers it, so its list holds its whole cover (on real text
        under ``--given``, ~6,000 of 11,292 documents, every one of the thin ones)."""
        for cover in self._covers:
            if torch.equal(cover.keep, keep):
                return cover
        n, dev = self.n_docs, keep.device
        last = self._covers[-1] if self._covers else None
        idx, sim = self.knn_graph()
        vals, rows, thin = graph_top2(idx, sim, keep, last)  # 1. the graph's top two
        if self.graph_method_ == "exact":  # an unlisted row is no more similar than the K-th
            thin &= sim[:, -1] > 0  # K-th at or below the floor: no unlisted row covers more
        docs = torch.nonzero(thin).squeeze(1)  # 2. the thin documents, over all pairs
        base = self._cover_base
        sel = torch.nonzero(keep).squeeze(1)
        if base is None:
            full, inc = docs, docs[:0]
        else:
            gone = torch.zeros(n + 1, dtype=torch.bool, device=dev)
            gone[torch.nonzero(base.keep & ~keep).squeeze(1)] = True
            same = base.thin[docs] & ~(gone[base.owner[docs]] | gone[base.owner2[docs]])
            full, inc = docs[~same], docs[same]
        if len(full):
            vals[full], rows[full] = self._top2(full, sel)
        if len(inc):
            adds = torch.nonzero(keep & ~base.keep).squeeze(1)
            vals[inc] = torch.stack([base.best[inc], base.second[inc]], 1)
            rows[inc] = torch.stack([base.owner[inc], base.owner2[inc]], 1)
            if len(adds):
                xa = self.features_[adds]
                step = block_rows(len(adds) + 2, budget=1 << 22)
                for lo in range(0, len(inc), step):
                    r = inc[lo : lo + step]
                    s = self.features_[r] @ xa.T
                    if self.floor_ is not None:
                        s = s - self.floor_[r, None]
                    s = s.clamp_min(0.0)
                    if self.weights_ is not None:
                        s = s * self.weights_[r, None]
                    v = torch.cat([vals[r], s], 1)
                    ids = torch.cat([rows[r], adds.expand(len(r), -1)], 1)
                    top_v, top_i = v.topk(2, dim=1)
                    vals[r] = top_v
                    rows[r] = torch.where(top_v > 0, ids.gather(1, top_i), n)
        cover = ExactCover(keep.clone(), vals[:, 0], rows[:, 0], vals[:, 1], rows[:, 1], thin)
        self._covers = [*self._covers[-2:], cover]
        return cover

    def batch_values(self, batch: torch.Tensor, masks: torch.Tensor) -> torch.Tensor:
        xb = self.features_[batch]
        sims = xb @ xb.T  # (b, b): coverage measured inside the batch
        if self.floor_ is not None:
            sims = sims - self.floor_[batch, None]  # row i: document i, above its floor
        sims = sims.clamp_min(0.0)
        b = len(batch)
        chunk = max(1, (1 << 27) // (b * b))  # keep (chunk, b, b) near 128M elements
        if self.weights_ is not None:  # per token of the batch
            sims = sims * self.weights_[batch, None]
        out = [(sims[None] * m[:, None, :]).amax(2).mean(1) for m in masks.split(chunk)]
        return torch.cat(out)

    def _expected_parts(self, p: torch.Tensor, clients: torch.Tensor | None) -> tuple:
        """The pieces of E[cover] per client: ``(idx, sim, pn, miss, none_before, part,
        tail)``, each (c, K) but ``tail`` (c,) or None.

        ``pn``: each neighbour's keep-probability, most similar first; ``miss`` its chance of
        not being kept, ``1 - pn`` floored at ``MISS_FLOOR`` (a neighbour kept for sure
        leaves 6e-8 to the rest instead of 0, so the closed-form gradient divides by no
        zero); ``none_before[r]``: no neighbour before r is kept; ``part[r] = s_r pn_r
        none_before[r]``; ``tail``: no neighbour kept, the K-th similarity standing in for
        the unseen rest (None when K covers every document)."""
        idx, sim = self.knn_graph()
        if clients is not None:  # index_select: a row copy (idx[clients] was 3x slower)
            idx, sim = idx.index_select(0, clients), sim.index_select(0, clients)
        # index_select, not p[idx]: the backward of p[idx] accumulates over threads in no
        # fixed order on CPU.
        pn = p.index_select(0, idx.reshape(-1)).view(idx.shape)
        miss = (1.0 - pn).clamp_min(MISS_FLOOR)
        none_before = torch.cumprod(F.pad(miss[:, :-1], (1, 0), value=1.0), dim=1)
        part = sim * pn * none_before
        tail = None
        if idx.shape[1] < self.n_docs:  # the K-th similarity stands in for the unseen rest
            tail = sim[:, -1] * (none_before[:, -1] * miss[:, -1])
        return idx, sim, pn, miss, none_before, part, tail

    def expected(self, p: torch.Tensor, clients: torch.Tensor | None = None) -> torch.Tensor:
        _, _, _, _, _, part, tail = self._expected_parts(p, clients)
        cover = part.sum(1)
        return (cover if tail is None else cover + tail).mean()

    def expected_grad(
        self,
        p: torch.Tensor,
        clients: torch.Tensor | None,
        grad: torch.Tensor,
        weight: float = 1.0,
    ) -> torch.Tensor:
        """Closed form: with ``after[r]`` the expected cover from neighbour r + 1 on
        (``sum_{t > r} part[t] + tail``, divided by ``miss[r]`` it is the cover that
        neighbour r's absence leaves), ``dE/dpn_r = s_r none_before[r] - after[r] /
        miss[r]``, summed into the rows by one ``index_add_``. 13 tensor ops, no sync."""
        idx, sim, pn, miss, none_before, part, tail = self._expected_parts(p, clients)
        cover = part.sum(1)
        later = part[:, 1:]
        later = F.pad(later, (0, 1)) if tail is None else torch.cat([later, tail[:, None]], 1)
        after = later.flip(1).cumsum(1).flip(1)
        g = torch.addcdiv(sim * none_before, after, miss, value=-1.0)
        grad.index_add_(0, idx.reshape(-1), g.reshape(-1), alpha=weight / idx.shape[0])
        return (cover if tail is None else cover + tail).mean()

    def init_state(self, graph: bool = False) -> CoverState:
        """No coverage yet: zeros on the graph (raised by any floor), the floor itself for
        dense gains, which read the raw similarities."""
        zeros = torch.zeros(self.n_docs, dtype=self.features_.dtype, device=self.features_.device)
        if not graph and self.floor_ is not None:
            return CoverState(self.floor_.clone(), graph)
        return CoverState(zeros, graph)

    def gains(self, state: CoverState, candidates: torch.Tensor) -> torch.Tensor:
        if state.graph:
            return self._graph_gains(state.cover, candidates)
        dense = self._dense()
        out = []
        step = max(1, (1 << 26) // self.n_docs)  # candidates per block
        for lo in range(0, len(candidates), step):
            cand = candidates[lo : lo + step]
            if dense is not None:  # symmetric: row j is column j, and contiguous
                rows = dense[cand]  # (c, n)
            else:
                rows = (self.features_[cand] @ self.features_.T).clamp_min(0.0)
            lift = (rows - state.cover[None, :]).clamp_min(0.0)
            if self.weights_ is not None:  # dense rows are raw similarities
                lift = lift * self.weights_[None, :]
            out.append(lift.sum(1) / self.n_docs)
        return torch.cat(out)

    def graph_gain_sums(
        self,
        cover: torch.Tensor,
        sums: torch.Tensor | None = None,
        was: torch.Tensor | None = None,
    ) -> torch.Tensor:
        """``sum_{i lists j} max(0, sim_ij - cover_i)`` for every row j, in float64 (the
        graph gains times n). Every row: scatter the forward graph, no gathers by column; in
        blocks of rows, so the float64 copy never holds the whole graph.

        Given ``sums`` of the cover ``was``, only the documents whose cover changed are
        read: their old lifts taken out and their new ones put in (O(K) a changed document,
        not O(n K); float64 sums of the same float32 lifts, in another order)."""
        idx, sim = self.knn_graph()
        if sums is not None and was is not None:
            docs = torch.nonzero(cover != was).squeeze(1)
            if len(docs) <= self.n_docs // 4:
                i, s = idx.index_select(0, docs), sim.index_select(0, docs)
                new = (s - cover[docs, None]).clamp_min(0.0).double()
                old = (s - was[docs, None]).clamp_min(0.0).double()
                out = sums.index_add(0, i.reshape(-1), (new - old).reshape(-1))
                return out.clamp_min_(0.0)  # a sum of lifts >= 0: no rounding below it
        out = torch.zeros(self.n_docs, dtype=torch.float64, device=idx.device)
        step = block_rows(idx.shape[1], budget=1 << 20)
        for lo in range(0, self.n_docs, step):
            gain = (sim[lo : lo + step] - cover[lo : lo + step, None]).clamp_min(0.0)
            out.index_add_(0, idx[lo : lo + step].reshape(-1), gain.double().reshape(-1))
        return out

    def _graph_gains(self, cover: torch.Tensor, candidates: torch.Tensor) -> torch.Tensor:
        """``sum_{i lists j} max(0, sim_ij - cover_i) / n`` for every candidate j."""
        if len(candidates) == self.n_docs and bool((candidates[1:] > candidates[:-1]).all()):
            return (self.graph_gain_sums(cover) / self.n_docs).to(cover.dtype)
        ptr, clients, sims = self.reverse_graph()
        if len(candidates) <= 64:  # the lazy greedy's few stale rows: slices, no scatter
            bounds = self._ptr_list
            spans = [(bounds[c], bounds[c + 1]) for c in candidates.tolist()]
            rows = torch.cat([clients[a:b] for a, b in spans])
            vals = (torch.cat([sims[a:b] for a, b in spans]) - cover[rows]).clamp_min(0.0)
            csum = torch.cat([vals.new_zeros(1, dtype=torch.float64), vals.double().cumsum(0)])
            ends = torch.tensor([0] + [b - a for a, b in spans], device=ptr.device).cumsum(0)
            return ((csum[ends[1:]] - csum[ends[:-1]]) / self.n_docs).to(cover.dtype)
        start, count = ptr[candidates], ptr[candidates + 1] - ptr[candidates]
        owner = torch.repeat_interleave(count)  # candidate of each entry (this form is fast)
        offset = torch.cumsum(count, 0) - count  # where each candidate's run starts
        pos = start[owner] + torch.arange(len(owner), device=ptr.device) - offset[owner]
        gain = (sims[pos] - cover[clients[pos]]).clamp_min(0.0)
        out = torch.zeros(len(candidates), dtype=torch.float64, device=ptr.device)
        return (out.index_add_(0, owner, gain.double()) / self.n_docs).to(cover.dtype)

    def update(self, state: CoverState, j: int) -> CoverState:
        if state.graph:
            _, clients, sims = self.reverse_graph()
            lo, hi = self._ptr_list[j], self._ptr_list[j + 1]
            rows, s = clients[lo:hi], sims[lo:hi]
            state.cover[rows] = torch.maximum(state.cover[rows], s)  # in place: O(K), not O(n)
            return state
        dense = self._dense()
        row = dense[j] if dense is not None else (self.features_ @ self.features_[j])
        return CoverState(torch.maximum(state.cover, row.clamp_min(0.0)), False)

    def host_gains(self) -> HostGains:
        """The graph gains on the host (the graph's cover starts at zero; a floor is
        already in the graph's similarities, :meth:`raise_floor`)."""
        _, clients, sims = self.reverse_graph()
        return _GraphGains(self._ptr_list, clients.cpu().numpy(), sims.cpu().numpy())


def facility_term(objective: Any) -> FacilityLocation | None:
    """The objective's one facility-location diversity term, or None (none, or several):
    the term whose graph a sharded run saves and re-uses."""
    terms = [t for t in objective.diversity if isinstance(t, FacilityLocation)]
    return terms[0] if len(terms) == 1 else None
