"""Ranking selectors: score every document once, on its own, and keep the k best.

Neither looks at the other documents, so both are ``modular`` (a sharded run merges their
scores exactly, :meth:`~datamask.base.Selector.comparable_scores`):

- :class:`TopKQuality`, the quality-only baseline (what FineWeb-Edu-style filtering does);
- :class:`RandomSelector`, a uniform draw keyed by each id and the seed: the floor every
  other method must clear.
"""

from __future__ import annotations

import numpy as np
import pyarrow as pa

from .base import Selector
from .data import Corpus
from .io.shards import _mix, hash_ids
from .objectives import Objective

__all__ = ["RandomSelector", "TopKQuality"]


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
    >>> from datamask.ranking import TopKQuality
    >>> corpus = make_clustered(100, 8, 4, seed=0)
    >>> sel = TopKQuality(select_ratio=0.1, device="cpu").fit(corpus)
    >>> bool(sel.scores_[sel.selected_].min() >= sel.scores_.max() - 1)
    True
    """

    method = "topk"
    modular = True
    takes_tokens = True  # its ranking, walked down under the budget

    @classmethod
    def comparable_scores(cls, corpus: Corpus, ids: pa.Array, seed: int) -> np.ndarray:
        """The combined quality scaled by the corpus-wide range, as float32 (the learner's
        quality term): the global top k of a sharded run is the top k of these."""
        return corpus.normalized_quality().astype(np.float32).astype(np.float64)

    def _select(self, corpus: Corpus, objective: Objective) -> tuple[np.ndarray, np.ndarray]:
        scores = objective.quality_.detach().cpu().numpy().astype(np.float64)  # a sync point
        return self._top_k(scores, corpus.ids), scores


class RandomSelector(Selector):
    """Keep k documents drawn uniformly without replacement (seeded).

    A document's draw depends only on its id and ``seed`` (:meth:`comparable_scores`), so
    one file and the same documents in shards (any partition, ``--budget global``) keep
    the same documents for the same seed, and reordering the rows changes nothing.

    Attributes
    ----------
    selected_ : ndarray of int64, shape (k,)
        Sorted row indices of the kept documents.
    scores_ : ndarray of float64, shape (n_docs,)
        The uniform draws; the kept rows are the k highest.
    terms_ : dict
        Exact objective terms of the selection.
    fit_seconds_ : float
        Wall time of :meth:`fit`.

    Examples
    --------
    >>> from datamask import make_clustered
    >>> from datamask.ranking import RandomSelector
    >>> corpus = make_clustered(100, 8, 4, seed=0)
    >>> a = RandomSelector(select_ratio=0.2, seed=1, device="cpu").fit(corpus)
    >>> b = RandomSelector(select_ratio=0.2, seed=1, device="cpu").fit(corpus)
    >>> bool((a.selected_ == b.selected_).all())
    True
    """

    method = "random"
    modular = True
    takes_tokens = True

    @classmethod
    def comparable_scores(cls, corpus: Corpus, ids: pa.Array, seed: int) -> np.ndarray:
        """A uniform draw in [0, 1) keyed by the id's hash and the run's ``seed``: a document
        draws the same in any partition, so the global top k of a sharded run is a seeded
        uniform k-subset whatever the groups."""
        salt = np.uint64(int(np.random.SeedSequence(seed).generate_state(1, np.uint64)[0]))
        mixed = _mix(hash_ids(ids) ^ salt)
        return (mixed >> np.uint64(11)).astype(np.float64) * 2.0**-53

    def _select(self, corpus: Corpus, objective: Objective) -> tuple[np.ndarray, np.ndarray]:
        # The draw a sharded run merges (keyed by each id and the seed, not by row position),
        # so one file and its shards keep the same documents for the same seed, on any
        # device and in any row order. Under a cap: walk that order, skipping conflicts.
        scores = self.comparable_scores(corpus, _hashable_ids(corpus.ids), self.seed)
        return self._top_k(scores, corpus.ids), scores


def _hashable_ids(ids: np.ndarray) -> pa.Array:
    """``ids`` as the Arrow array :func:`~datamask.io.shards.hash_ids` takes: integers and
    strings as they are (they hash as the same ids read from parquet do), anything else
    (ids built in memory, e.g. floats) by its text."""
    try:
        arrow = pa.array(ids)
    except (pa.ArrowInvalid, pa.ArrowTypeError):  # mixed types
        arrow = pa.array([], pa.null())
    if pa.types.is_integer(arrow.type) or pa.types.is_string(arrow.type):
        return arrow
    return pa.array([str(i) for i in np.asarray(ids).tolist()])
