"""Top-k quality: the quality-only baseline (what FineWeb-Edu-style filtering does)."""

from __future__ import annotations

import numpy as np
import pyarrow as pa

from ..base import Selector
from ..data import Corpus
from ..objectives import Objective
from ._trace import to_numpy

__all__ = ["TopKQuality"]


class TopKQuality(Selector):
    """Keep the k documents with the highest combined quality score, ignoring diversity.

    The score is the objective's normalised quality (each quality column min-max scaled,
    then weighted); ties are broken by ascending id, as the learner breaks them. The
    objective only scores the result.

    Attributes
    ----------
    selected_ : ndarray of int64, shape (k,)
        Sorted row indices of the kept documents.
    scores_ : ndarray of float64, shape (n_docs,)
        The normalised quality of every document.
    terms_ : dict
        Exact objective terms of the selection.
    fit_seconds_ : float
        Wall time of :meth:`fit`.

    Examples
    --------
    >>> from datamask import make_clustered
    >>> from datamask.greedy import TopKQuality
    >>> corpus = make_clustered(100, 8, 4, seed=0)
    >>> sel = TopKQuality(select_ratio=0.1, device="cpu").fit(corpus)
    >>> bool(sel.scores_[sel.selected_].min() >= sel.scores_.max() - 1)
    True
    """

    method = "topk"
    modular = True

    @classmethod
    def comparable_scores(cls, corpus: Corpus, ids: pa.Array, seed: int) -> np.ndarray:
        """The combined quality scaled by the corpus-wide range, as float32 (the learner's
        quality term): the global top k of a sharded run is the top k of these."""
        return corpus.normalized_quality().astype(np.float32).astype(np.float64)

    def _select(self, corpus: Corpus, objective: Objective) -> tuple[np.ndarray, np.ndarray]:
        scores = to_numpy(objective.quality_).astype(np.float64)
        return self._top_k(scores, corpus.ids), scores
