"""Naive greedy: every pick re-scores every remaining document (the textbook algorithm).

O(k n) marginal gains, each O(n d) for facility location, so only for small corpora; it is
the yardstick the lazy and stochastic variants are tested against.
"""

from __future__ import annotations

import numpy as np
import torch

from ..base import Selector
from ..data import Corpus
from ..objectives import Objective
from ._trace import GreedyTrace, pick_order_scores

__all__ = ["NaiveGreedy"]


class NaiveGreedy(Selector):
    """Greedy maximisation of the objective, re-evaluating all gains at every pick.

    Each pick adds the remaining row with the largest exact marginal gain
    (``objective.gains``), ties broken by the lower row index. Parameters are those of
    :class:`~datamask.base.Selector`.

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
    fit_seconds_ : float
        Wall time of :meth:`fit`.

    Examples
    --------
    >>> from datamask import make_clustered
    >>> from datamask.greedy import NaiveGreedy
    >>> corpus = make_clustered(200, 8, 4, seed=0)
    >>> sel = NaiveGreedy(select_ratio=0.05, device="cpu").fit(corpus)
    >>> len(sel.selected_)
    10
    """

    method = "naive-greedy"

    def _select(self, corpus: Corpus, objective: Objective) -> tuple[np.ndarray, np.ndarray]:
        n, k = corpus.n_docs, self.k_
        state = objective.init_state()
        remaining = torch.arange(n, device=self.device_)
        self._trace = trace = GreedyTrace(k, self._start)
        with self._bar(k) as bar:
            for _ in range(k):
                gains = objective.gains(state, remaining)
                best = int(torch.argmax(gains))  # sync point: once per pick; first max wins
                j = int(remaining[best])
                trace.add(j, float(gains[best]))
                state = objective.update(state, j)
                remaining = torch.cat([remaining[:best], remaining[best + 1 :]])
                bar.update()
        self.order_ = np.asarray(trace.order, dtype=np.int64)
        return self.order_, pick_order_scores(self.order_, n)
