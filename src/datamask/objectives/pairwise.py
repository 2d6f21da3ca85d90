"""Pairwise similarity: one minus the mean cosine similarity between kept documents."""

from __future__ import annotations

import torch

from .base import Term
from .registry import register_term

__all__ = ["PairwiseSimilarity"]


@register_term("Pair_simi")
class PairwiseSimilarity(Term):
    """``D(S) = 1 - mean_{i != j in S} <x_i, x_j>`` (the reference's ``Pair_simi``).

    With unit rows, ``sum_{i != j} <x_i, x_j> = ||sum_S x||^2 - |S|``, so the value, the
    batched values and the exact expectation under independent keep-probabilities
    (``||X^T p||^2 - sum p^2``) all cost O(n d). Gains and expectations divide by the
    target ``k (k - 1)`` so the term is a plain quadratic in the mask.

    Not declared submodular: it is only when no two documents have a negative cosine, so
    the lazy greedy re-evaluates every gain.

    With ``k = 1`` no pair exists: the term is the constant 1 (every single document is
    as diverse as any other), so its gains and gradient are zero and the other terms
    (quality) decide; the reference divides by ``k (k - 1) = 0`` there.

    Under a token budget T (``TermContext.sizes``, lengths ``l``) it is the mean cosine
    over every pair of kept *tokens*, a token of document i carrying ``x_i``:
    ``D(S) = 1 - ||sum_S l_i x_i||^2 / (sum_S l_i)^2`` (a token paired with itself
    included, so the term does not change when every length is scaled, tokens or
    characters). The tokens of one document are pairs of cosine 1: a long document is
    counted as that much redundancy, and one cut in two halves of its embedding is the
    same multiset of tokens, so cutting changes nothing (docs/method.md "Token budgets").
    With every ``l = 1`` it is ``(1 - 1/k)`` times the document term. Gains and the
    expectation divide by the target ``T^2`` instead (weights ``w = l / T``, ``w_``), the
    expectation exactly: ``1 - (||X^T (p w)||^2 - sum (p w)^2 + sum p w^2)``.
    """

    name = "pairwise"
    takes_sizes = True

    def bind(self, ctx, quality=None, k=None) -> PairwiseSimilarity:  # type: ignore[override]
        super().bind(ctx, quality, k)
        sizes = self.ctx_.sizes
        #: Each row's share of the budget, ``l / T`` (float64), under a token budget; else None.
        self.w_ = None if sizes is None else sizes / float(self.ctx_.budget)
        return self

    def value(self, selected: torch.Tensor) -> float:
        if self.w_ is not None:
            return self._token_value(selected)
        k = len(selected)
        if k < 2:
            return 1.0
        s = self.features_[selected].double().sum(0)
        return float(1.0 - (s @ s - k) / (k * (k - 1)))

    def _token_value(self, selected: torch.Tensor) -> float:
        if len(selected) == 0:
            return 1.0
        w = self.w_[selected]
        s = (w[:, None] * self.features_[selected].double()).sum(0)
        return float(1.0 - (s @ s) / w.sum() ** 2)

    def batch_values(self, batch: torch.Tensor, masks: torch.Tensor) -> torch.Tensor:
        if self.w_ is not None:  # per token of the rows kept in the batch
            weights = masks * self.w_[batch].to(masks.dtype)
            sums = weights @ self.features_[batch]
            kept = weights.sum(1)
            return torch.where(
                kept > 0, 1.0 - (sums * sums).sum(1) / kept.clamp_min(1e-30) ** 2, 1.0
            )
        sums = masks @ self.features_[batch]
        m = masks.sum(1)
        pair_sum = (sums * sums).sum(1) - m
        return 1.0 - pair_sum / (m * (m - 1)).clamp_min(1.0)

    def expected(self, p: torch.Tensor, clients: torch.Tensor | None = None) -> torch.Tensor:
        if self.w_ is not None:
            w = self.w_.to(p.dtype)
            pw = p * w
            s = pw @ self.features_
            return 1.0 - (s @ s - pw @ pw + p @ (w * w))
        s = p @ self.features_
        if self.k_ < 2:  # no pair: the constant 1, still a function of p for autograd
            return 1.0 + 0.0 * (s @ s)
        return 1.0 - (s @ s - p @ p) / (self.k_ * (self.k_ - 1))

    def expected_grad(
        self,
        p: torch.Tensor,
        clients: torch.Tensor | None,
        grad: torch.Tensor,
        weight: float = 1.0,
    ) -> torch.Tensor:
        """``dE/dp = -2 (X X^T p - p) / (k (k - 1))``; zero for ``k < 2``. Under a token
        budget ``dE/dp_i = -(2 w_i <x_i, s> - 2 p_i w_i^2 + w_i^2)``, ``s = X^T (p w)``."""
        if self.w_ is not None:
            w = self.w_.to(p.dtype)
            pw = p * w
            s = pw @ self.features_
            grad.add_(w * (2.0 * (self.features_ @ s) - 2.0 * pw + w), alpha=-weight)
            return 1.0 - (s @ s - pw @ pw + p @ (w * w))
        if self.k_ < 2:
            return p.new_ones(())
        c = self.k_ * (self.k_ - 1)
        s = p @ self.features_
        grad.add_(self.features_ @ s - p, alpha=-2.0 * weight / c)
        return 1.0 - (s @ s - p @ p) / c

    def init_state(self, graph: bool = False) -> torch.Tensor:
        dtype = self.features_.dtype if self.w_ is None else torch.float64
        return torch.zeros(self.features_.shape[1], dtype=dtype, device=self.features_.device)

    def gains(self, state: torch.Tensor, candidates: torch.Tensor) -> torch.Tensor:
        if self.w_ is not None:  # state: sum of w x; adding j adds 2 w_j <x_j, s> + w_j^2
            w = self.w_[candidates]
            dots = self.features_[candidates].double() @ state
            return (-(2.0 * w * dots + w * w)).to(self.features_.dtype)
        return -2.0 * (self.features_[candidates] @ state) / max(self.k_ * (self.k_ - 1), 1)

    def update(self, state: torch.Tensor, j: int) -> torch.Tensor:
        if self.w_ is not None:
            return state + self.w_[j] * self.features_[j].double()
        return state + self.features_[j]
