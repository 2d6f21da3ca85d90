"""Quality: the mean normalised quality score of the subset (a modular term)."""

from __future__ import annotations

import numpy as np
import torch

from .base import HostGains, Term

__all__ = ["Quality"]


class Quality(Term):
    """``Quality(S) = mean_{j in S} q_j`` with q the corpus' combined score scaled to [0, 1].

    The mean is taken over the target size ``k`` in gains and expectations, so the term is
    modular (every row adds ``q_j / k``) and its expectation is exactly ``p @ q / k``.

    Under a token budget T (``TermContext.sizes``) it is the quality per token kept,
    ``sum_{j in S} l_j q_j / T`` with ``l_j`` the document's length: modular again, every
    row adds its ``mass_[j] = l_j q_j / T``, and a document cut in two halves of the same
    quality adds what the whole did (docs/method.md "Token budgets").
    """

    name = "quality"
    submodular = True
    modular = True
    takes_floor = True  # a mean over the selection: documents kept before do not enter it
    takes_sizes = True

    def bind(self, ctx, quality=None, k=None) -> Quality:  # type: ignore[override]
        super().bind(ctx, quality, k)
        sizes, budget = self.ctx_.sizes, self.ctx_.budget
        q = self.quality_.to(torch.float64)
        #: Each row's gain in float64: ``q / k``, or ``l q / T`` under a token budget.
        self.mass_ = q / self.k_ if sizes is None else q * sizes / float(budget)
        self.tokens_ = sizes is not None
        return self

    def value(self, selected: torch.Tensor) -> float:
        if self.tokens_:
            return float(self.mass_[selected].sum())
        return float(self.quality_[selected].mean())

    def batch_values(self, batch: torch.Tensor, masks: torch.Tensor) -> torch.Tensor:
        if self.tokens_:  # per token kept in the batch
            sizes = self.ctx_.sizes[batch].to(masks.dtype)
            q = self.quality_[batch]
            return (masks @ (q * sizes)) / (masks @ sizes).clamp_min(1e-12)
        q = self.quality_[batch]
        return (masks @ q) / masks.sum(1).clamp_min(1.0)

    def expected(self, p: torch.Tensor, clients: torch.Tensor | None = None) -> torch.Tensor:
        if self.tokens_:
            return p.double() @ self.mass_
        return p @ self.quality_ / self.k_

    def expected_grad(
        self,
        p: torch.Tensor,
        clients: torch.Tensor | None,
        grad: torch.Tensor,
        weight: float = 1.0,
    ) -> torch.Tensor:
        """Modular: the gradient is ``q / k`` (``l q / T``) whatever ``p``."""
        if self.tokens_:
            grad.add_(self.mass_.to(grad.dtype), alpha=weight)
            return p.double() @ self.mass_
        grad.add_(self.quality_, alpha=weight / self.k_)
        return p @ self.quality_ / self.k_

    def init_state(self, graph: bool = False) -> None:
        return None

    def gains(self, state: None, candidates: torch.Tensor) -> torch.Tensor:
        if self.tokens_:
            return self.mass_[candidates].to(self.quality_.dtype)
        return self.quality_[candidates] / self.k_

    def update(self, state: None, j: int) -> None:
        return None

    def host_gains(self) -> HostGains:
        return _ModularGains(self.mass_.cpu().numpy())


class _ModularGains(HostGains):
    """Row j adds ``values[j]``, whatever was picked before."""

    def __init__(self, values: np.ndarray) -> None:
        self.values = values

    def gain(self, j: int) -> float:
        return float(self.values[j])
