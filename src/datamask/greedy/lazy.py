"""Lazy greedy (Minoux's accelerated greedy) with batched re-evaluation of stale gains.

The benchmark's yardstick: on the sparse K-nearest-neighbour graph of facility location
(``greedy``, the greedy a user of apricot or faiss would run) or on all pairs
(``greedy-dense``, O(n^2) memory). Either returns exactly the naive greedy selection of its
objective, in the same order, for a fraction of the gain evaluations.
"""

from __future__ import annotations

import time

import numpy as np
import torch

from .._validation import Interval, check_positive
from ..data import Corpus
from ..objectives import Objective
from ._base import BaseSelector, GreedyTrace, pick_order_scores

__all__ = ["DenseGreedy", "LazyGreedy", "is_submodular"]


def is_submodular(objective: Objective) -> bool:
    """Whether every term of ``objective`` declares ``submodular = True`` (stale gains are
    bounds). A new term gets lazy evaluation by declaring it.

    Quality and facility location do. Pairwise similarity is submodular only when no two
    documents have a negative cosine, and DiSF is not submodular at all: both do not.
    """
    return all(term.submodular for _, term in objective.terms)


class LazyGreedy(BaseSelector):
    """Lazy greedy maximisation of the objective, exactly equal to naive greedy.

    Facility location is counted on its K-nearest-neighbour graph (the learner's graph,
    same K): the greedy maximises the graph objective exactly, and the selection is then
    scored with the exact objective like every selector's. Pair_simi and DiSF need no
    graph. :class:`DenseGreedy` counts facility location on all pairs.

    1. All initial gains are computed in one vectorised call of ``objective.gains``.
    2. Every pick: the row with the highest stored gain is taken if that gain was computed
       for the current selection; otherwise the ``batch_size`` best stale rows are
       re-evaluated in one tensor op and the check repeats. For a submodular objective a
       stale gain is an upper bound on the true one, so the row taken is the true argmax
       (ties: the lower row index, as in naive greedy).

    When a term does not declare ``submodular`` (pairwise similarity, DiSF), stale gains
    are not bounds; every pick then re-evaluates all remaining rows (``lazy_ = False``),
    which is still exact greedy.

    Parameters
    ----------
    graph : bool, default=True
        Facility-location gains on the K-NN graph (False: on all pairs, O(n^2)).
    batch_size : int, default=4
        Stale rows re-evaluated together. One evaluation streams the whole corpus, so a
        few extra candidates per pass are nearly free while a second pass is not.
    **kwargs
        ``objective, algorithm, lamb, select_ratio, k, seed, device, progress`` as in
        :class:`~datamask.greedy._base.BaseSelector`.

    Attributes
    ----------
    selected_ : ndarray of int64, shape (k,)
        Sorted row indices of the picked documents.
    order_ : ndarray of int64, shape (k,)
        The same rows in pick order.
    scores_ : ndarray of float64, shape (n_docs,)
        ``-t`` for the t-th pick, ``-n_docs`` for rows never picked.
    terms_ : dict
        Exact objective terms of the selection.
    history_ : list of dict
        Running objective (J of the picks so far) every ~k/50 picks, with its time.
    n_evaluations_ : int
        Marginal gains computed, the initial n included.
    initial_seconds_ : float
        Time spent on the initial gains (the graph build excluded).
    graph_seconds_ : float
        Time spent building the neighbour graph (0 for ``greedy-dense``).
    lazy_ : bool
        Whether stale gains were used as bounds (see above).
    fit_seconds_ : float
        Wall time of :meth:`fit`.

    Examples
    --------
    >>> from datamask import make_clustered
    >>> from datamask.greedy import LazyGreedy
    >>> corpus = make_clustered(500, 16, 5, seed=0)
    >>> sel = LazyGreedy(select_ratio=0.1, device="cpu").fit(corpus)
    >>> len(sel.selected_), sel.n_evaluations_ < 500 * 50
    (50, True)
    """

    method = "greedy"
    _parameter_constraints = {"batch_size": [Interval(int, 1, None, closed="left")]}

    def __init__(
        self,
        objective: Objective | None = None,
        *,
        graph: bool = True,
        batch_size: int = 4,
        **kwargs,
    ) -> None:
        super().__init__(objective, **kwargs)
        self.graph = graph
        self.batch_size = batch_size

    def _check_params(self) -> None:
        check_positive("batch_size", self.batch_size, integer=True)

    def _select(self, corpus: Corpus, objective: Objective) -> tuple[np.ndarray, np.ndarray]:
        n, k = corpus.n_docs, self.k_
        self.lazy_ = is_submodular(objective)
        state = objective.init_state(graph=self.graph)
        if self.graph:
            objective.build_graphs()
        self._trace = trace = GreedyTrace(k, self._start)
        # 1. Exact gains of every row for the empty selection, one vectorised call.
        #    In ~50 slices under a bar: at N=200k without a cached dense matrix this pass alone
        #    takes minutes.
        t0 = time.perf_counter()
        rows = torch.arange(n, device=self.device_)
        parts = []
        with self._bar(n, desc=f"{self.method} initial gains", unit="doc") as bar:
            for part in rows.split(max(1, -(-n // 50))):
                parts.append(objective.gains(state, part))
                bar.update(len(part))
        bounds = torch.cat(parts)
        self.initial_seconds_ = time.perf_counter() - t0
        self.n_evaluations_ = n
        # fresh[i] == t: bounds[i] is the exact gain of row i for the selection at pick t.
        fresh = torch.zeros(n, dtype=torch.long, device=self.device_)
        taken = torch.zeros(n, dtype=torch.bool, device=self.device_)
        with self._bar(k) as bar:
            for t in range(k):
                if t > 0 and not self.lazy_:  # no bounds: re-evaluate every remaining row
                    rest = torch.nonzero(~taken).squeeze(1)
                    bounds[rest] = objective.gains(state, rest)
                    fresh[rest] = t
                    self.n_evaluations_ += len(rest)
                m = min(self.batch_size, n)
                while True:
                    self._check_left(t, n)
                    # torch.argmax returns the first maximum: ties go to the lower index.
                    j = int(torch.argmax(bounds))  # sync point: once per check
                    if int(fresh[j]) == t:
                        if not self._capped(j):
                            break
                        taken[j], bounds[j] = True, -torch.inf  # conflicts with a kept row
                        continue
                    # 2. Re-evaluate the best stale rows together (taken rows hold -inf).
                    top = torch.topk(bounds, min(m, n - t)).indices
                    stale = top[(fresh[top] != t) & ~taken[top]]
                    if len(stale) == 0:  # j tied with m fresh rows topk preferred
                        stale = torch.tensor([j], device=self.device_)
                    bounds[stale] = objective.gains(state, stale)
                    fresh[stale] = t
                    self.n_evaluations_ += len(stale)
                    m = min(2 * m, n)  # many stale leaders: widen the next pass
                trace.add(j, float(bounds[j]))
                state = objective.update(state, j)
                taken[j] = True
                bounds[j] = -torch.inf
                bar.update()
        self.order_ = np.asarray(trace.order, dtype=np.int64)
        return self.order_, pick_order_scores(self.order_, n)


class DenseGreedy(LazyGreedy):
    """:class:`LazyGreedy` with facility location counted on all pairs (``greedy-dense``).

    Exact greedy on the full objective; the n x n similarity matrix is held while it fits
    ``FacilityLocation.dense_max_bytes`` (N=50k: 10 GB), else rebuilt row by row per gain.

    Examples
    --------
    >>> from datamask import make_clustered
    >>> from datamask.greedy import DenseGreedy
    >>> sel = DenseGreedy(select_ratio=0.1, device="cpu").fit(make_clustered(300, 8, 4))
    >>> len(sel.selected_), sel.graph_seconds_
    (30, 0.0)
    """

    method = "greedy-dense"

    def __init__(self, objective: Objective | None = None, *, batch_size: int = 4, **kwargs):
        super().__init__(objective, graph=False, batch_size=batch_size, **kwargs)
