"""The contract every objective term honours.

A term scores a subset S of the corpus, higher is better, on a scale near [0, 1] so that
terms can be mixed by weights (see :mod:`datamask.objectives.combined`). Optimisers reach
terms only through these methods:

- ``value(selected)``: exact value on the whole corpus (evaluation, reports).
- ``batch_values(batch, masks)``: the value of each of G masks over a batch of rows, as one
  tensor op (the reference's REINFORCE rewards).
- ``expected(p, clients)``: a differentiable value of E[term] when each row is kept
  independently with probability ``p`` (the learner's exact-gradient estimator).
- ``init_state(graph) / gains(state, candidates) / update(state, j)``: marginal gains for
  the greedy baselines (``update`` may change ``state`` in place).
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from typing import Any, ClassVar

import torch

__all__ = ["Term"]


class Term(ABC):
    """One objective term. Subclasses set ``name`` and implement the methods below."""

    name: ClassVar[str]

    def bind(self, features: torch.Tensor, quality: torch.Tensor, k: int) -> Term:
        """Attach the corpus (features on the compute device, normalised quality in [0, 1])
        and the target subset size ``k``. Returns self."""
        self.features_ = features
        self.quality_ = quality
        self.k_ = int(k)
        return self

    @property
    def n_docs(self) -> int:
        return int(self.features_.shape[0])

    @abstractmethod
    def value(self, selected: torch.Tensor) -> float:
        """Exact value of the term for the rows ``selected`` (int64 indices)."""

    @abstractmethod
    def batch_values(self, batch: torch.Tensor, masks: torch.Tensor) -> torch.Tensor:
        """Values of G masks restricted to ``batch``.

        Parameters
        ----------
        batch : int64 tensor of shape (b,)
            Rows of the corpus in this batch.
        masks : float tensor of shape (G, b)
            1 where the row is kept in that rollout.

        Returns
        -------
        float tensor of shape (G,)
        """

    def expected(self, p: torch.Tensor, clients: torch.Tensor | None = None) -> torch.Tensor:
        """Differentiable E[term] under independent keep-probabilities ``p`` (shape (n_docs,)).

        ``clients`` optionally restricts a coverage-type term to a random subset of the rows it
        averages over (an unbiased stochastic estimate).
        """
        raise NotImplementedError(f"{type(self).__name__} has no expected-value estimator.")

    # --- greedy marginal gains -------------------------------------------------------------
    @abstractmethod
    def init_state(self, graph: bool = False) -> Any:
        """State of the empty selection. ``graph``: gains of a coverage term are counted on
        its K-nearest-neighbour graph instead of all pairs (other terms ignore it)."""

    @abstractmethod
    def gains(self, state: Any, candidates: torch.Tensor) -> torch.Tensor:
        """Increase of the term if each candidate row were added (shape (c,))."""

    @abstractmethod
    def update(self, state: Any, j: int) -> Any:
        """Add row ``j`` to the selection; returns the new state."""

    def __repr__(self) -> str:
        return f"{type(self).__name__}()"
