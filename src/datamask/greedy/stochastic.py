"""Stochastic greedy ("lazier than lazy greedy", Mirzasoleiman et al., AAAI 2015).

Each pick looks only at a random sample of ``ceil((n / k) log(1 / eps))`` remaining rows
and takes the best of them; in expectation this reaches ``1 - 1/e - eps`` of the optimum
for monotone submodular objectives with O(n log(1 / eps)) gain evaluations in all.
"""

from __future__ import annotations

import math
from typing import Any

import numpy as np
import torch

from .._validation import Interval
from ..base import Selector
from ..data import Corpus
from ..objectives import Objective
from ._trace import GreedyTrace, pick_order_scores
from .lazy import is_submodular

__all__ = ["StochasticGreedy", "sample_size"]


def sample_size(n_docs: int, k: int, eps: float) -> int:
    """Mirzasoleiman et al.'s sample size ``ceil((n / k) log(1 / eps))``, at least 1."""
    return max(1, math.ceil(n_docs / k * math.log(1.0 / eps)))


class StochasticGreedy(Selector):
    """Greedy over a random sample of the remaining rows at every pick.

    The best row of each sample is found lazily when the objective is submodular: stored
    gains (``+inf`` until a row is first evaluated) bound the true ones, so only the
    sampled rows whose bound could beat the best exact gain are re-evaluated, in batches of
    ``batch_size``. The pick is the exact argmax over the sample either way (ties: the
    lower row index), so with a sample as large as the remaining set this is greedy.

    Parameters
    ----------
    eps : float, default=0.1
        Approximation slack in (0, 1); the sample holds ``ceil((n / k) log(1 / eps))`` rows.
    sample : int, optional
        Use this sample size instead of the one from ``eps``.
    batch_size : int, default=16
        Stale sampled rows re-evaluated together.
    **kwargs
        ``objective, algorithm, lamb, select_ratio, k, seed, device, progress`` as in
        :class:`~datamask.base.Selector`.

    Attributes
    ----------
    selected_, order_, scores_, terms_, history_, fit_seconds_
        As in :class:`~datamask.greedy.LazyGreedy`.
    sample_size_ : int
        Rows drawn per pick (fewer once fewer remain).
    n_evaluations_ : int
        Marginal gains computed.

    Examples
    --------
    >>> from datamask import make_clustered
    >>> from datamask.greedy import StochasticGreedy
    >>> corpus = make_clustered(500, 16, 5, seed=0)
    >>> sel = StochasticGreedy(select_ratio=0.1, eps=0.1, device="cpu").fit(corpus)
    >>> len(sel.selected_), sel.sample_size_
    (50, 24)
    """

    method = "stochastic-greedy"
    _parameter_constraints = {
        "eps": [Interval(float, 0, 1, closed="neither")],
        "sample": [Interval(int, 0, None, closed="neither"), None],
        "batch_size": [Interval(int, 0, None, closed="neither")],
    }

    def __init__(
        self,
        objective: Objective | None = None,
        *,
        eps: float = 0.1,
        sample: int | None = None,
        batch_size: int = 16,
        **kwargs,
    ) -> None:
        super().__init__(objective, **kwargs)
        self.eps = eps
        self.sample = sample
        self.batch_size = batch_size

    def _select(self, corpus: Corpus, objective: Objective) -> tuple[np.ndarray, np.ndarray]:
        n, k = corpus.n_docs, self.k_
        dev = self.device_
        self.sample_size_ = s = self.sample or sample_size(n, k, self.eps)
        lazy = is_submodular(objective)
        state = objective.init_state()
        self._trace = trace = GreedyTrace(k, self._start)
        bounds = torch.full((n,), torch.inf, device=dev)
        fresh = torch.full((n,), -1, dtype=torch.long, device=dev)
        pool = torch.arange(n, device=dev)  # rows not yet picked
        self.n_evaluations_ = 0
        t = 0
        with self._bar(k) as bar:
            while t < k:
                self._check_left(t, n)
                # 1. A uniform sample without replacement of the remaining rows, sorted so
                #    that the first maximum is the lowest row index.
                if s >= len(pool):
                    cand = pool
                else:
                    pos = torch.randperm(len(pool), generator=self._torch_gen, device=dev)[:s]
                    cand = pool[pos.sort().values]
                # 2. Its exact argmax: evaluate everything, or lazily from the bounds.
                if not lazy:
                    gains = objective.gains(state, cand)
                    self.n_evaluations_ += len(cand)
                    best = int(torch.argmax(gains))  # sync point: once per pick
                    j, gain = int(cand[best]), float(gains[best])
                else:
                    while True:
                        local = bounds[cand]
                        best = int(torch.argmax(local))  # sync point: once per check
                        j = int(cand[best])
                        if int(fresh[j]) == t:
                            break
                        top = cand[torch.topk(local, min(self.batch_size, len(cand))).indices]
                        never = cand[torch.isinf(local)]  # first sight: evaluate them all
                        stale = torch.unique(torch.cat([top[fresh[top] != t], never]))
                        if len(stale) == 0:
                            stale = torch.tensor([j], device=dev)
                        bounds[stale] = objective.gains(state, stale)
                        fresh[stale] = t
                        self.n_evaluations_ += len(stale)
                    gain = float(bounds[j])
                if self._capped(j):  # conflicts with a kept row: out of the pool, pick again
                    pool = pool[pool != j]
                    continue
                trace.add(j, gain)
                state = objective.update(state, j)
                pool = pool[pool != j]
                t += 1
                bar.update()
        self.order_ = np.asarray(trace.order, dtype=np.int64)
        return self.order_, pick_order_scores(self.order_, n)

    def fit_stats(self) -> dict[str, Any]:
        """The base's, with the sample size and the gains computed."""
        own = {"n_evaluations": self.n_evaluations_, "sample_size": self.sample_size_}
        return {**super().fit_stats(), **own}
