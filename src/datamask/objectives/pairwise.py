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
    """

    name = "pairwise"

    def value(self, selected: torch.Tensor) -> float:
        k = len(selected)
        if k < 2:
            return 1.0
        s = self.features_[selected].double().sum(0)
        return float(1.0 - (s @ s - k) / (k * (k - 1)))

    def batch_values(self, batch: torch.Tensor, masks: torch.Tensor) -> torch.Tensor:
        sums = masks @ self.features_[batch]
        m = masks.sum(1)
        pair_sum = (sums * sums).sum(1) - m
        return 1.0 - pair_sum / (m * (m - 1)).clamp_min(1.0)

    def expected(self, p: torch.Tensor, clients: torch.Tensor | None = None) -> torch.Tensor:
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
        """``dE/dp = -2 (X X^T p - p) / (k (k - 1))``; zero for ``k < 2``."""
        if self.k_ < 2:
            return p.new_ones(())
        c = self.k_ * (self.k_ - 1)
        s = p @ self.features_
        grad.add_(self.features_ @ s - p, alpha=-2.0 * weight / c)
        return 1.0 - (s @ s - p @ p) / c

    def init_state(self, graph: bool = False) -> torch.Tensor:
        return torch.zeros(
            self.features_.shape[1], dtype=self.features_.dtype, device=self.features_.device
        )

    def gains(self, state: torch.Tensor, candidates: torch.Tensor) -> torch.Tensor:
        return -2.0 * (self.features_[candidates] @ state) / max(self.k_ * (self.k_ - 1), 1)

    def update(self, state: torch.Tensor, j: int) -> torch.Tensor:
        return state + self.features_[j]
