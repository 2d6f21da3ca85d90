"""The selection objective: quality and diversity terms mixed by weight."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import numpy as np
import torch

from ..data import Corpus
from .base import Term
from .disf import DiSF
from .facility_location import FacilityLocation
from .pairwise import PairwiseSimilarity
from .quality import Quality

__all__ = ["Objective", "ALGORITHMS", "make_diversity"]

#: The reference's ``--algorithm`` names and the term each one selects.
ALGORITHMS: dict[str, type[Term]] = {
    "Facility": FacilityLocation,
    "Pair_simi": PairwiseSimilarity,
    "DiSF": DiSF,
}


def make_diversity(algorithm: str, **kwargs: Any) -> Term:
    """The diversity term for a reference ``--algorithm`` name."""
    if algorithm not in ALGORITHMS:
        raise ValueError(f"algorithm must be one of {list(ALGORITHMS)}; got {algorithm!r}.")
    cls = ALGORITHMS[algorithm]
    return cls(**kwargs) if cls is FacilityLocation else cls()


class Objective:
    """``J(S) = lamb * Quality(S) + (1 - lamb) * sum_t w_t D_t(S)``.

    Scales: quality scores are min-max scaled per column to [0, 1] and averaged over S;
    facility location is a mean cosine similarity in [0, 1]; pairwise is
    ``1 - mean pairwise cosine`` (about [0, 1] for real embeddings); DiSF is
    ``1 - mean squared off-diagonal correlation`` in [0, 1]. Every term is "higher is
    better" and none needs rescaling by the data, so ``lamb`` means the same on any corpus.

    Parameters
    ----------
    diversity : Term or sequence of Term
        One or more diversity terms.
    lamb : float, default=0.5
        Weight of the quality term, in [0, 1].
    weights : sequence of float, optional
        Relative weights of the diversity terms (default equal), normalised to sum to 1.
    """

    def __init__(
        self,
        diversity: Term | Sequence[Term],
        lamb: float = 0.5,
        weights: Sequence[float] | None = None,
    ) -> None:
        from .._validation import check_ratio

        self.diversity = [diversity] if isinstance(diversity, Term) else list(diversity)
        if not self.diversity:
            raise ValueError("diversity must hold at least one term; got none.")
        self.lamb = check_ratio("lamb", lamb, low_open=False, high_open=False)
        w = np.ones(len(self.diversity)) if weights is None else np.asarray(weights, float)
        if w.shape != (len(self.diversity),) or (w < 0).any() or w.sum() <= 0:
            raise ValueError(f"weights must be one non-negative number per term; got {weights}.")
        self.quality = Quality()
        self.terms: list[tuple[float, Term]] = [(self.lamb, self.quality)] + [
            ((1.0 - self.lamb) * wi / w.sum(), t) for wi, t in zip(w, self.diversity, strict=True)
        ]

    def __repr__(self) -> str:
        return f"Objective(diversity={self.diversity}, lamb={self.lamb})"

    def bind(self, corpus: Corpus, k: int, device: torch.device | str = "cpu") -> Objective:
        """Move the corpus to ``device`` and attach it to every term. Returns self."""
        self.device_ = torch.device(device)
        self.k_ = int(k)
        self.features_ = torch.as_tensor(corpus.features, device=self.device_)
        self.quality_ = torch.as_tensor(
            corpus.normalized_quality(), dtype=torch.float32, device=self.device_
        )
        for _, term in self.terms:
            term.bind(self.features_, self.quality_, self.k_)
        return self

    # --- values ------------------------------------------------------------------------------
    def term_values(self, selected: np.ndarray | torch.Tensor) -> dict[str, float]:
        """Each term's exact value and the total ``J`` for the rows ``selected``."""
        sel = torch.as_tensor(np.asarray(selected), dtype=torch.long, device=self.device_)
        values = [t.value(sel) for _, t in self.terms]
        out = dict(zip(self.labels, values, strict=True))
        out["J"] = sum(w * v for (w, _), v in zip(self.terms, values, strict=True))
        return out

    @property
    def labels(self) -> list[str]:
        """One unique key per term: its ``name``, then ``name_2``, ``name_3``, ... for repeats
        (two terms of one class must not share a key, or one would hide the other)."""
        seen: dict[str, int] = {}
        labels = []
        for _, term in self.terms:
            seen[term.name] = seen.get(term.name, 0) + 1
            labels.append(term.name if seen[term.name] == 1 else f"{term.name}_{seen[term.name]}")
        return labels

    def value(self, selected: np.ndarray | torch.Tensor) -> float:
        return self.term_values(selected)["J"]

    def batch_values(self, batch: torch.Tensor, masks: torch.Tensor) -> torch.Tensor:
        """``J`` of each of G masks (shape (G, b)) restricted to the rows ``batch``."""
        return sum(w * t.batch_values(batch, masks) for w, t in self.terms)

    def expected(self, p: torch.Tensor, clients: torch.Tensor | None = None) -> torch.Tensor:
        """Differentiable E[J] under independent keep-probabilities ``p``."""
        return sum(w * t.expected(p, clients) for w, t in self.terms)

    # --- neighbour graphs -----------------------------------------------------------------
    def build_graphs(self) -> None:
        """Build the K-NN graph of every term that has one (timed in its ``graph_seconds_``)."""
        for _, term in self.terms:
            if isinstance(term, FacilityLocation):
                term.knn_graph()

    def graph_info(self) -> dict[str, Any]:
        """Seconds spent building neighbour graphs, how, and their K (empty when none)."""
        terms = [
            t for _, t in self.terms if isinstance(t, FacilityLocation) and t.graph_ is not None
        ]
        return {
            "graph_seconds": float(sum(t.graph_seconds_ for t in terms)),
            "graph_method": ",".join(t.graph_method_ for t in terms),
            "n_neighbors": [int(t.n_neighbors_) for t in terms],
        }

    # --- greedy ------------------------------------------------------------------------------
    def init_state(self, graph: bool = False) -> list[Any]:
        """Greedy state of every term; ``graph``: facility gains on the K-NN graph."""
        return [t.init_state(graph) for _, t in self.terms]

    def gains(self, state: list[Any], candidates: torch.Tensor) -> torch.Tensor:
        return sum(w * t.gains(s, candidates) for (w, t), s in zip(self.terms, state, strict=True))

    def update(self, state: list[Any], j: int) -> list[Any]:
        return [t.update(s, j) for (_, t), s in zip(self.terms, state, strict=True)]
