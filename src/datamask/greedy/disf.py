"""Greedy DiSF: the original batched greedy of "Combatting Dimensional Collapse in LLM
Pre-Training Data via Diversified File Selection" (arXiv 2504.20644), vectorised.

The original (``DISF/select_disf.py`` in MediaBrain-SJTU/DiSF, ``hunger_select``) walks the
files in contiguous batches of ``batch_size`` (512 * scale = 1024) and, inside each batch,
picks ``top_k`` (8 * scale = 16) files: the first at random, then repeatedly the file whose
addition gives the lowest correlation loss ``cal_corre`` of the picked files, which is the
sum of squared off-diagonal entries of the correlation matrix of the standardised features
(unbiased variance plus ``eps = 1e-8``). It computes that loss from scratch for every
candidate, O(i d^2) each at pick i, in a Python loop.

Here every candidate of a pick is scored at once and exactly: with the picked rows'
count, sum ``s`` and second-moment matrix ``S2``, the covariance after adding a
candidate ``x`` is a rank-2 update ``B + a x x^T - b (s x^T + x s^T)`` of a matrix ``B``
shared by all candidates, so the weighted squared Frobenius norm that makes the loss
expands into two (candidates x d) @ (d x d) matrix products and O(d) terms per candidate,
in float64. Differences from the original, all documented here:

- the number picked per batch follows ``select_ratio`` (exactly k in all, spread over the
  batches in proportion to their sizes, largest remainders first) instead of a fixed 16;
  ``select_ratio=1/64`` with n a multiple of 1024 is the original's 16 per 1024;
- the trailing partial batch is kept (the original drops it) with its share of k;
- the random first pick of each batch comes from ``seed`` (the original uses ``random``);
- ties go to the lower row, as the original's strict ``<`` over rows in order does.

``implementation="reference"`` runs the original's per-candidate loop (in float32, as the
original does on its float32 memmap), to time the original on the same batches.
"""

from __future__ import annotations

from typing import Any

import numpy as np
import torch

from .._validation import Interval, Options
from ..base import Selector
from ..data import Corpus, apportion
from ..near_duplicates import SimilarityCap, infeasible_message
from ..objectives import Objective
from ..objectives.disf import correlation_loss, offdiag_correlation, rank_one_offdiag

__all__ = [
    "GreedyDiSF",
    "batch_quotas",
    "candidate_losses",
    "reference_correlation",
]

IMPLEMENTATIONS = ("vectorised", "reference")


def batch_quotas(n_docs: int, k: int, batch_size: int) -> tuple[np.ndarray, np.ndarray]:
    """Contiguous batches of ``batch_size`` rows and how many to pick from each.

    Returns ``(starts, quotas)``: batch b holds rows ``starts[b]:starts[b + 1]`` (the last
    one ends at ``n_docs``); the quotas are proportional to the batch sizes, rounded by
    largest remainder (earlier batch first on ties) with :func:`datamask.data.apportion`,
    in exact integer arithmetic, and sum to exactly ``k``.
    """
    starts = np.arange(0, n_docs, batch_size, dtype=np.int64)
    sizes = np.minimum(starts + batch_size, n_docs) - starts
    return starts, apportion(sizes, k)


def candidate_losses(
    count: int,
    total: torch.Tensor,
    second: torch.Tensor,
    cand: torch.Tensor,
    eps: float = 1e-8,
) -> torch.Tensor:
    """The original's correlation loss of (picked rows + x) for every candidate row x.

    :func:`~datamask.objectives.disf.offdiag_correlation` with ``eps_mode="add"`` (what
    :func:`reference_correlation` computes) expanded as a rank-two update of the moments,
    so that every candidate costs O(d^2) without its own d x d matrix.

    Parameters
    ----------
    count : int
        Rows picked so far (>= 1).
    total : tensor (d,)
        Sum of the picked rows.
    second : tensor (d, d)
        Sum of the outer products of the picked rows.
    cand : tensor (c, d)
        Candidate rows, in the dtype of ``total``.
    eps : float, default=1e-8
        Added to the unbiased variance before standardising, as in the original.

    Returns
    -------
    tensor (c,)
        Sum of squared off-diagonal correlations (the original's ``cal_corre`` times 1e4).
    """
    m = count + 1
    alpha, beta = (m - 1) / m**2, 1.0 / m**2
    # Covariance (biased) after adding x: B + alpha x x^T - beta (s x^T + x s^T).
    b = second / m - torch.outer(total, total) / m**2
    # The original divides the unbiased covariance by sqrt(var_u + eps) per column; in
    # biased terms that is var_b + eps (m - 1) / m.
    eps_b = eps * (m - 1) / m
    var = b.diagonal()[None] + alpha * cand * cand - 2.0 * beta * total[None] * cand  # (c, d)
    w = 1.0 / (var + eps_b)
    y, t = w * cand, w * total[None]
    # sum_ab w_a w_b C_ab^2 with C = B + P, P the rank-2 part, expanded term by term.
    full = ((w @ (b * b)) * w).sum(1)
    yb = y @ b
    full += 2.0 * alpha * (yb * y).sum(1) - 4.0 * beta * (yb * t).sum(1)
    a1, a2, a3 = (y * cand).sum(1), (t * total[None]).sum(1), (t * cand).sum(1)
    full += alpha**2 * a1**2 + 2.0 * beta**2 * (a1 * a2 + a3**2) - 4.0 * alpha * beta * a1 * a3
    diag = ((w * var) ** 2).sum(1)
    return full - diag


def reference_correlation(feat: torch.Tensor, eps: float = 1e-8) -> torch.Tensor:
    """The original's ``cal_corre`` (times 1e4): squared off-diagonal correlations, summed."""
    m = feat.shape[0]
    z = feat - feat.mean(dim=0, keepdim=True)
    # The original standardises by sqrt(unbiased variance + eps), then divides z^T z by
    # m - 1: the unbiased covariance with eps added to its variances.
    return offdiag_correlation(z.T @ z / (m - 1), eps=eps, eps_mode="add")


def _moments_of(
    weight: float, total: torch.Tensor, second: torch.Tensor
) -> tuple[torch.Tensor, torch.Tensor]:
    """Mean and biased covariance of rows of ``weight`` in all, from their weighted sum
    ``total`` and weighted second moment ``second``."""
    mean = total / weight
    return mean, second / weight - torch.outer(mean, mean)


def _moments(x: torch.Tensor, weights: torch.Tensor) -> tuple[float, torch.Tensor, torch.Tensor]:
    """``(weight, mean, covariance)`` of the rows ``x`` weighted by ``weights``."""
    weight = float(weights.sum())
    wx = weights[:, None] * x
    return weight, *_moments_of(weight, wx.sum(0), wx.T @ x)


class GreedyDiSF(Selector):
    """The original greedy DiSF, batch by batch, with every candidate scored at once.

    The selection criterion is always the DiSF correlation loss (no quality term, as in
    the original); ``objective`` (default ``Objective(DiSF(), lamb)``) only scores the
    result in ``terms_``. See the module docstring for the algorithm and every difference
    from the original.

    Parameters
    ----------
    batch_size : int, default=1024
        Rows per contiguous batch (the original's 512 * scale).
    implementation : {"vectorised", "reference"}, default="vectorised"
        Score all candidates of a pick with the exact rank-2 update in float64, or run the
        original's per-candidate loop (slow; for timing the original).
    eps : float, default=1e-8
        Added to the unbiased variance before standardising, as in the original.
    **kwargs
        ``objective, algorithm (default "DiSF"), lamb, select_ratio, k, seed, device,
        progress`` as in :class:`~datamask.base.Selector`.

    Attributes
    ----------
    selected_ : ndarray of int64, shape (k,)
        Sorted row indices of the picked documents.
    order_ : ndarray of int64, shape (k,)
        Picks, batch after batch, each batch in pick order.
    scores_ : ndarray of float64, shape (n_docs,)
        ``-t`` for the t-th pick of its batch, ``-n_docs`` for rows never picked.
    batch_starts_, quotas_ : ndarray of int64
        First row of each batch and the number picked from it.
    disf_loss_ : float
        Correlation loss of the whole selection.
    batch_loss_ : float
        Mean correlation loss of the picks inside each batch (batches with >= 2 picks).
    terms_, fit_seconds_
        As in the other selectors.

    Examples
    --------
    >>> from datamask import make_clustered
    >>> from datamask.greedy import GreedyDiSF
    >>> corpus = make_clustered(300, 8, 4, seed=0)
    >>> sel = GreedyDiSF(select_ratio=0.1, batch_size=100, device="cpu").fit(corpus)
    >>> sel.quotas_.tolist()
    [10, 10, 10]
    """

    method = "disf-greedy"
    default_algorithm = "DiSF"
    _parameter_constraints = {
        "batch_size": [Interval(int, 0, None, closed="neither")],
        "implementation": [Options(str, IMPLEMENTATIONS)],
        "eps": [Interval(float, 0, None, closed="neither")],
    }

    def __init__(
        self,
        objective: Objective | None = None,
        *,
        batch_size: int = 1024,
        implementation: str = "vectorised",
        eps: float = 1e-8,
        **kwargs,
    ) -> None:
        super().__init__(objective, **kwargs)
        self.batch_size = batch_size
        self.implementation = implementation
        self.eps = eps

    takes_tokens = True

    def _check_param_rules(self) -> None:
        if self.implementation == "reference" and self.max_similarity is not None:
            raise ValueError("max_similarity needs implementation='vectorised'; got 'reference'.")
        if self.implementation == "reference" and (
            self.budget_tokens is not None or self.select_token_ratio is not None
        ):
            raise ValueError(
                "a token budget (--budget-tokens / --select-token-ratio) needs "
                "implementation='vectorised'; got 'reference' (the original's loop counts "
                "documents)."
            )

    def _select(self, corpus: Corpus, objective: Objective) -> tuple[np.ndarray, np.ndarray]:
        if self.budget_ is not None:
            return self._select_tokens(corpus, objective)
        n = corpus.n_docs
        starts, quotas = batch_quotas(n, self.k_, self.batch_size)
        self.batch_starts_, self.quotas_ = starts, quotas
        pick = (
            self._pick_vectorised if self.implementation == "vectorised" else (self._pick_reference)
        )
        order: list[np.ndarray] = []
        scores = np.full(n, -float(n))
        losses = []
        short = 0  # picks the cap refused to earlier batches, carried to the next
        with self._bar(self.k_) as bar:
            for lo, q in zip(starts, quotas, strict=True):
                hi = min(lo + self.batch_size, n)
                want = int(q) + short
                q = min(want, hi - lo)
                if q == 0:
                    continue
                first = int(self._np_rng.integers(hi - lo))  # the original: random first pick
                self._offset = int(lo)
                local = pick(objective.features_[lo:hi], int(q), first)
                short = want - len(local)
                rows = lo + local
                order.append(rows)
                scores[rows] = -np.arange(len(rows), dtype=np.float64)
                if len(rows) >= 2:
                    losses.append(correlation_loss(objective.features_[torch.as_tensor(rows)]))
                bar.update(len(rows))
        if short:  # the cap left batches short: fill from every unpicked row, in row order
            rest = np.setdiff1d(np.arange(n), np.concatenate(order) if order else [])
            extra = self._cap.walk(rest, self.k_)
            if len(extra) < short:
                raise ValueError(
                    infeasible_message(
                        self.max_similarity, len(self._cap), self.k_, n, "disf-greedy's candidates"
                    )
                )
            order.append(extra)
            scores[extra] = 0.5 - n  # kept, after every batch's own picks
        self.order_ = np.concatenate(order).astype(np.int64)
        self.disf_loss_ = correlation_loss(objective.features_[torch.as_tensor(self.order_)])
        self.batch_loss_ = float(np.mean(losses)) if losses else 0.0
        return self.order_, scores

    def _select_tokens(self, corpus: Corpus, objective: Objective) -> tuple[np.ndarray, np.ndarray]:
        """Under a token budget: the same contiguous batches, each given the budget's share
        of its tokens (``quotas_``, in tokens) plus what the batches before it left; inside
        a batch the random first pick (the first row from it on that fits), then the
        cost-benefit rule of :meth:`_pick_tokens` until no row fits. The tokens the last
        batch leaves are filled from every unpicked row in row order, each that fits, so
        the kept tokens end within one document of T. As the lazy greedy's guard, the run
        is made again with the plain rule (the lowest loss after, whatever the tokens)
        from the same draws, and the selection whose picked tokens have the lower
        correlation loss is kept (``per_token_`` says which)."""
        n, budget = corpus.n_docs, self.budget_
        starts = np.arange(0, n, self.batch_size, dtype=np.int64)
        ends = np.minimum(starts + self.batch_size, n)
        tokens = np.concatenate([[0.0], np.cumsum(budget.sizes)])
        due = budget.total * tokens[ends] / tokens[-1]  # the budget's share up to each end
        self.batch_starts_, self.quotas_ = starts, np.diff(np.concatenate([[0.0], due]))
        x = objective.features_.double()
        draws = self._np_rng.bit_generator.state
        runs = []
        for per_token in (True, False):
            self._np_rng.bit_generator.state = draws  # both runs from the same first picks
            if self.max_similarity is not None:
                self._cap = SimilarityCap(objective.features_, self.max_similarity)
            order, scores, losses = self._token_run(x, ends, due, per_token)
            weights = torch.as_tensor(budget.sizes[order], device=x.device)
            cov = _moments(x[order], weights)[2]
            loss = float(offdiag_correlation(cov, eps=self.eps, eps_mode="add"))
            runs.append((-loss, per_token, order, scores, losses))
        _, self.per_token_, self.order_, scores, losses = max(runs, key=lambda r: (r[0], r[1]))
        self.disf_loss_ = correlation_loss(objective.features_[torch.as_tensor(self.order_)])
        self.batch_loss_ = float(np.mean(losses)) if losses else 0.0
        return self.order_, scores

    def _token_run(
        self, x: torch.Tensor, ends: np.ndarray, due: np.ndarray, per_token: bool
    ) -> tuple[np.ndarray, np.ndarray, list[float]]:
        """One run over the batches ending at ``ends``, the budget's share up to each end
        ``due``; returns the pick order (the fill last), the scores and the correlation
        loss of each batch's picks (batches with >= 2, as ``batch_loss_`` averages)."""
        n, budget = len(x), self.budget_
        order: list[np.ndarray] = []
        scores = np.full(n, -float(n))
        used, lo, losses = 0.0, 0, []
        with self._bar(self.k_, desc=f"{self.method} per token" if per_token else None) as bar:
            for hi, upto in zip(ends.tolist(), due.tolist(), strict=True):
                first = int(self._np_rng.integers(hi - lo))  # the original: random first pick
                left = min(upto, budget.total) - used  # its share and what earlier ones left
                rows = lo + self._pick_tokens(x[lo:hi], lo, left, first, per_token)
                order.append(rows)
                scores[rows] = -np.arange(len(rows), dtype=np.float64)
                if len(rows) >= 2:
                    losses.append(correlation_loss(x[torch.as_tensor(rows)]))
                used += budget.tokens(rows)
                bar.update(len(rows))
                lo = hi
        picked = np.concatenate(order)
        admit = None if self._cap is None else self._cap.admit  # it holds every pick
        rest = np.setdiff1d(np.arange(n), picked)
        extra = budget.fill(rest, admit, left=budget.total - used)
        scores[extra] = 0.5 - n  # kept, after every batch's own picks
        return np.concatenate([picked, extra]).astype(np.int64), scores, losses

    def _pick_tokens(
        self, x: torch.Tensor, lo: int, left: float, first: int, per_token: bool = True
    ) -> np.ndarray:
        """Rows of the batch ``x`` (float64; its first row is row ``lo``) picked by the
        cost-benefit DiSF rule within ``left`` tokens, in pick order (batch-local indices).

        The loss is the original's of the picked *tokens*: each row weighs its length in
        the mean and the biased covariance, ``eps`` added to the variances (the original's
        unbiased correction counts rows, which lengths in characters are not). A candidate
        x of l tokens turns the picked covariance C (W tokens, mean m) into
        ``a C + b u u^T``, ``u = x - m``, ``a = W / (W + l)``, ``b = W l / (W + l)^2``,
        scored for every candidate at once by
        :func:`~datamask.objectives.disf.rank_one_offdiag`. The pick maximises
        ``(loss before - loss after) / l``: with a fixed count the original's argmin of
        the loss after, per token of the budget it spends. ``per_token=False``: the plain
        rule, the lowest loss after (the guard's run)."""
        sizes = torch.as_tensor(self.budget_.sizes[lo : lo + len(x)], device=x.device)
        avail = sizes <= left
        # The first pick: the first row from the random one on that fits (and the cap admits).
        first = next(
            (
                r
                for r in np.roll(np.arange(len(x)), -first)
                if bool(avail[r]) and not self._capped(lo + r)
            ),
            None,
        )
        if first is None:
            return np.zeros(0, dtype=np.int64)
        picks = [first]
        weight = float(sizes[first])
        total, second = weight * x[first], weight * torch.outer(x[first], x[first])
        left -= weight
        avail[first] = False
        while True:
            avail &= sizes <= left
            rest = torch.nonzero(avail).squeeze(1)
            if len(rest) == 0:
                break
            mean, cov = _moments_of(weight, total, second)
            before = offdiag_correlation(cov, eps=self.eps, eps_mode="add")
            a = weight / (weight + sizes[rest])
            b = a * sizes[rest] / (weight + sizes[rest])
            after = rank_one_offdiag(
                cov, cov * cov, x[rest] - mean, a, b, eps=self.eps, eps_mode="add"
            )
            key = (before - after) / sizes[rest] if per_token else -after
            best = int(torch.argmax(key))  # sync point: once per pick; first max wins
            while self._capped(lo + int(rest[best])):  # conflicts with a kept row: drop it
                avail[rest[best]] = False
                key[best] = -torch.inf
                if bool(torch.isneginf(key).all()):
                    return np.asarray(picks, dtype=np.int64)
                best = int(torch.argmax(key))
            j = int(rest[best])
            picks.append(j)
            avail[j] = False
            w = float(sizes[j])
            weight, left = weight + w, left - w
            total += w * x[j]
            second += w * torch.outer(x[j], x[j])
        return np.asarray(picks, dtype=np.int64)

    def fit_stats(self) -> dict[str, Any]:
        """The base's, with the correlation loss of the selection and within the batches."""
        own = {"disf_loss": self.disf_loss_, "batch_loss": self.batch_loss_}
        return {**super().fit_stats(), **own}

    def _pick_vectorised(self, xb: torch.Tensor, q: int, first: int) -> np.ndarray:
        """Rows of the batch ``xb`` picked greedily, in pick order (batch-local indices)."""
        x = xb.double()
        avail = torch.ones(len(x), dtype=torch.bool, device=x.device)
        # Under the cap, the first pick is the first compatible row from the random one on.
        first = next(
            (r for r in np.roll(np.arange(len(x)), -first) if not self._capped(self._offset + r)),
            None,
        )
        if first is None:
            return np.zeros(0, dtype=np.int64)
        picks = [first]
        avail[first] = False
        total, second = x[first].clone(), torch.outer(x[first], x[first])
        for count in range(1, q):
            rest = torch.nonzero(avail).squeeze(1)
            loss = candidate_losses(count, total, second, x[rest], self.eps)
            j = int(rest[torch.argmin(loss)])  # sync point: once per pick; first min wins
            while self._capped(self._offset + j):  # conflicts with a kept row: drop it
                avail[j] = False
                loss[rest == j] = torch.inf
                if not bool(avail.any()):
                    return np.asarray(picks, dtype=np.int64)
                j = int(rest[torch.argmin(loss)])
            picks.append(j)
            avail[j] = False
            total += x[j]
            second += torch.outer(x[j], x[j])
        return np.asarray(picks, dtype=np.int64)

    def _pick_reference(self, xb: torch.Tensor, q: int, first: int) -> np.ndarray:
        """The original's loop: the loss of (picked + candidate) recomputed per candidate."""
        x = xb.float()
        picks = [first]
        chosen = set(picks)
        for _ in range(1, q):
            best, best_j = float("inf"), -1
            sel = x[picks]
            for j in range(len(x)):
                if j in chosen:
                    continue
                corre = float(reference_correlation(torch.cat((sel, x[j : j + 1]))))
                if corre < best:
                    best, best_j = corre, j
            picks.append(best_j)
            chosen.add(best_j)
        return np.asarray(picks, dtype=np.int64)
