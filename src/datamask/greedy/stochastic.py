"""Stochastic greedy ("lazier than lazy greedy", Mirzasoleiman et al., AAAI 2015).

Each pick looks only at a random sample of ``ceil((n / k) log(1 / eps))`` remaining rows
and takes the best of them; in expectation this reaches ``1 - 1/e - eps`` of the optimum
for monotone submodular objectives with O(n log(1 / eps)) gain evaluations in all.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from functools import partial
from typing import Any

import numpy as np
import torch

from .._validation import Interval
from ..base import Selector
from ..data import Corpus
from ..near_duplicates import SimilarityCap
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
    takes_tokens = True
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

    def _sample(self, pool: torch.Tensor, s: int) -> torch.Tensor:
        """A uniform sample of ``s`` rows of ``pool`` without replacement (all of them if
        ``s`` covers it), sorted so that the first maximum is the lowest row."""
        if s >= len(pool):
            return pool
        pos = torch.randperm(len(pool), generator=self._torch_gen, device=pool.device)[:s]
        return pool[pos.sort().values]

    def _lazy_best(
        self,
        cand: torch.Tensor,
        keys: torch.Tensor,
        fresh: torch.Tensor,
        t: int,
        score: Callable[[torch.Tensor], torch.Tensor],
    ) -> int:
        """The sample's row of largest key, by lazy evaluation: ``keys`` are stale bounds
        (``+inf`` until first seen) and ``fresh[j] == t`` marks one computed for pick
        ``t``. While the top is stale, ``score`` re-keys the stale rows among the top
        ``batch_size`` (and every row never seen); the first maximum is the lowest row."""
        while True:
            local = keys[cand]
            j = int(cand[torch.argmax(local)])  # sync point: once per check
            if int(fresh[j]) == t:
                return j
            top = cand[torch.topk(local, min(self.batch_size, len(cand))).indices]
            never = cand[torch.isinf(local)]  # first sight: evaluate them all
            stale = torch.unique(torch.cat([top[fresh[top] != t], never]))
            if len(stale) == 0:
                stale = torch.tensor([j], device=cand.device)
            keys[stale] = score(stale)
            fresh[stale] = t
            self.n_evaluations_ += len(stale)

    def _select(self, corpus: Corpus, objective: Objective) -> tuple[np.ndarray, np.ndarray]:
        if self.budget_ is not None:
            return self._select_tokens(corpus, objective)
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
                cand = self._sample(pool, s)
                # 2. Its exact argmax: evaluate everything, or lazily from the bounds.
                if not lazy:
                    gains = objective.gains(state, cand)
                    self.n_evaluations_ += len(cand)
                    best = int(torch.argmax(gains))  # sync point: once per pick
                    j, gain = int(cand[best]), float(gains[best])
                else:
                    j = self._lazy_best(cand, bounds, fresh, t, partial(objective.gains, state))
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

    def _select_tokens(self, corpus: Corpus, objective: Objective) -> tuple[np.ndarray, np.ndarray]:
        """Under a token budget: every pick draws a uniform sample of ``sample_size_`` rows
        among those not picked that still fit the tokens left, and takes its best by gain
        per token (the cost-benefit rule of :class:`~datamask.greedy.LazyGreedy`); a second
        run takes the best by plain gain from the same generator state, and the better of
        the two on the objective is kept (the lazy greedy's guard; ``per_token_`` says
        which). Each run ends when no row fits. ``sample_size_`` is Mirzasoleiman et al.'s
        with k the count the budget is expected to keep."""
        self.sample_size_ = self.sample or sample_size(corpus.n_docs, self.k_, self.eps)
        self.n_evaluations_ = 0
        start = self._torch_gen.get_state()
        runs = []
        for per_token in (True, False):
            self._torch_gen.set_state(start)  # both runs from the same draws' state
            if self.max_similarity is not None:
                self._cap = SimilarityCap(objective.features_, self.max_similarity)
            trace = self._token_run(objective, per_token)
            rows = torch.as_tensor(trace.order, dtype=torch.long, device=self.device_)
            runs.append((objective.value(rows), per_token, trace))
        _, self.per_token_, self._trace = max(runs, key=lambda r: (r[0], r[1]))
        self.order_ = np.asarray(self._trace.order, dtype=np.int64)
        return self.order_, pick_order_scores(self.order_, corpus.n_docs)

    def _token_run(self, objective: Objective, per_token: bool) -> GreedyTrace:
        """One stochastic greedy run under the token budget, keyed by gain per token or by
        gain; lazily from stored keys (``+inf`` until first seen) when the objective is
        submodular, as the document budget's run."""
        dev, s = self.device_, self.sample_size_
        sizes = torch.as_tensor(self.budget_.sizes, dtype=torch.float64, device=dev)
        cost = sizes if per_token else torch.ones_like(sizes)
        n, lazy = len(sizes), is_submodular(objective)
        state = objective.init_state()
        trace = GreedyTrace(self.k_, self._start)
        keys = torch.full((n,), torch.inf, dtype=torch.float64, device=dev)  # bounds / cost
        fresh = torch.full((n,), -1, dtype=torch.long, device=dev)
        pool, left, t = torch.arange(n, device=dev), self.budget_.total, 0

        def key(rows: torch.Tensor) -> torch.Tensor:  # gain per unit of cost, now
            return objective.gains(state, rows).double() / cost[rows]

        with self._bar(self.k_, desc=f"{self.method} per token" if per_token else None) as bar:
            while True:
                pool = pool[sizes[pool] <= left]  # a row that no longer fits never fits again
                if len(pool) == 0:
                    break
                # 1. A uniform sample of the rows that fit, sorted: ties to the lower row.
                cand = self._sample(pool, s)
                # 2. Its exact argmax by key: evaluate everything, or lazily from the keys.
                if not lazy:
                    keys[cand] = objective.gains(state, cand).double() / cost[cand]
                    self.n_evaluations_ += len(cand)
                    j = int(cand[torch.argmax(keys[cand])])  # sync point: once per pick
                else:
                    j = self._lazy_best(cand, keys, fresh, t, key)
                pool = pool[pool != j]
                if self._capped(j):  # conflicts with a kept row: out of the pool
                    continue
                trace.add(j, float(keys[j] * cost[j]))
                state = objective.update(state, j)
                left -= float(sizes[j])
                t += 1
                bar.update()
        return trace

    def fit_stats(self) -> dict[str, Any]:
        """The base's, with the sample size and the gains computed."""
        own = {"n_evaluations": self.n_evaluations_, "sample_size": self.sample_size_}
        return {**super().fit_stats(), **own}
