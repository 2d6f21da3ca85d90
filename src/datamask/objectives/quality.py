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
    """

    name = "quality"
    submodular = True
    modular = True
    takes_floor = True  # a mean over the selection: documents kept before do not enter it

    def value(self, selected: torch.Tensor) -> float:
        return float(self.quality_[selected].mean())

    def batch_values(self, batch: torch.Tensor, masks: torch.Tensor) -> torch.Tensor:
        q = self.quality_[batch]
        return (masks @ q) / masks.sum(1).clamp_min(1.0)

    def expected(self, p: torch.Tensor, clients: torch.Tensor | None = None) -> torch.Tensor:
        return p @ self.quality_ / self.k_

    def expected_grad(
        self,
        p: torch.Tensor,
        clients: torch.Tensor | None,
        grad: torch.Tensor,
        weight: float = 1.0,
    ) -> torch.Tensor:
        """Modular: the gradient is ``q / k`` whatever ``p``."""
        grad.add_(self.quality_, alpha=weight / self.k_)
        return p @ self.quality_ / self.k_

    def init_state(self, graph: bool = False) -> None:
        return None

    def gains(self, state: None, candidates: torch.Tensor) -> torch.Tensor:
        return self.quality_[candidates] / self.k_

    def update(self, state: None, j: int) -> None:
        return None

    def host_gains(self) -> HostGains:
        return _ModularGains((self.quality_.double() / self.k_).cpu().numpy())


class _ModularGains(HostGains):
    """Row j adds ``values[j]``, whatever was picked before."""

    def __init__(self, values: np.ndarray) -> None:
        self.values = values

    def gain(self, j: int) -> float:
        return float(self.values[j])
