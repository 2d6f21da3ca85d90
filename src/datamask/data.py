"""Core containers: a corpus to select from and the selection made from it."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np

__all__ = ["Corpus", "Selection", "apportion", "rank_order", "top_k_rows"]


@dataclass
class Corpus:
    """Documents to select from, held column-wise.

    Parameters
    ----------
    ids : ndarray of shape (n_docs,)
        Document ids, carried through unchanged to the output.
    quality : ndarray of shape (n_docs, n_scores), float64
        Raw quality scores, one column per score.
    features : ndarray of shape (n_docs, dim), float32
        Embeddings; :func:`datamask.check_corpus` returns a copy with them
        L2-normalised row-wise.
    quality_names : list of str
        Name of each quality column.
    quality_weights : ndarray of shape (n_scores,)
        Weight of each quality column in the combined score, summing to 1.
    source : str, default="<memory>"
        Where the rows came from, for error messages and reports.
    extra : dict
        Optional per-row columns kept for reports (e.g. ``n_chars``).
    quality_range : tuple of two ndarrays of shape (n_scores,), optional
        ``(low, high)`` of each quality column over a larger corpus this one is part of
        (a sharded run passes the corpus-wide range, so every group scales alike).
        Default: the range of these rows.
    floor : ndarray of shape (n_docs,), optional
        Coverage each document already has from documents kept before, outside this
        corpus: its best cosine to them, clipped at 0 (``datamask select --given``,
        :mod:`datamask.pipeline.given`). Facility location then counts only what a
        selection adds above it. Default: none.
    lengths : ndarray of shape (n_docs,), optional
        Each document's length in tokens (or characters, or bytes), for a token budget
        (:mod:`datamask.budget`, ``--length-col``). Default: none (document budgets).
    id_name : str, default="id"
        The id column's name, for error messages (``--id-col``).
    """

    ids: np.ndarray
    quality: np.ndarray
    features: np.ndarray
    quality_names: list[str] = field(default_factory=lambda: ["quality_score"])
    quality_weights: np.ndarray | None = None
    source: str = "<memory>"
    extra: dict[str, np.ndarray] = field(default_factory=dict)
    quality_range: tuple[np.ndarray, np.ndarray] | None = None
    floor: np.ndarray | None = None
    lengths: np.ndarray | None = None
    id_name: str = "id"

    def __post_init__(self) -> None:
        self.quality = np.asarray(self.quality, dtype=np.float64)
        if self.quality.ndim == 1:
            self.quality = self.quality[:, None]
        if self.quality_weights is None:
            n = self.quality.shape[1]
            self.quality_weights = np.full(n, 1.0 / n)

    @property
    def n_docs(self) -> int:
        return int(self.features.shape[0])

    @property
    def dim(self) -> int:
        return int(self.features.shape[1])

    def take(self, rows: Sequence[int] | np.ndarray) -> Corpus:
        """The corpus of ``rows`` (row numbers, in the order given): ids, quality,
        embeddings, the per-row ``extra`` columns, ``floor`` and ``lengths`` taken; the
        quality range kept as this corpus's, so the rows' normalised quality is unchanged."""
        rows = np.asarray(rows, dtype=np.int64)
        lo_hi = self.quality_range
        if lo_hi is None:
            lo_hi = (self.quality.min(axis=0), self.quality.max(axis=0)) if self.n_docs else None
        return Corpus(
            ids=np.asarray(self.ids)[rows],
            quality=self.quality[rows],
            features=self.features[rows],
            quality_names=list(self.quality_names),
            quality_weights=np.asarray(self.quality_weights).copy(),
            source=self.source,
            extra={name: np.asarray(col)[rows] for name, col in self.extra.items()},
            quality_range=lo_hi,
            floor=None if self.floor is None else self.floor[rows],
            lengths=None if self.lengths is None else np.asarray(self.lengths)[rows],
        )

    def normalized_quality(self) -> np.ndarray:
        """Combined quality in [0, 1]: each column min-max scaled, then weighted.

        A constant column contributes 0.5 to every document, so it never favours one.
        With ``quality_range`` set, the columns are scaled by that range instead of the
        rows' own.
        """
        if self.quality_range is None:
            lo, hi = self.quality.min(axis=0), self.quality.max(axis=0)
        else:
            lo = np.asarray(self.quality_range[0], dtype=np.float64)
            hi = np.asarray(self.quality_range[1], dtype=np.float64)
        span = hi - lo
        scaled = np.where(span > 0, (self.quality - lo) / np.where(span > 0, span, 1.0), 0.5)
        return scaled @ np.asarray(self.quality_weights, dtype=np.float64)


@dataclass
class Selection:
    """The outcome of a selector on a corpus: what every method returns and the writer writes.

    Attributes
    ----------
    selected : ndarray of int64, shape (k,)
        Sorted row indices of the kept documents.
    scores : ndarray of float64, shape (n_docs,)
        Per-document score the selector ranked by (final logit for the learner,
        pick order for greedy); higher is better.
    meta : dict
        Method name, timings, device, objective terms and what the method resolved.
    ids : ndarray, shape (n_docs,), optional
        The corpus' ids (ties in the ranking go to the smaller id).
    logits, probabilities : ndarray of float32, shape (n_docs,), optional
        The learner's final keep-logits and keep-probabilities (None for other methods).
    """

    selected: np.ndarray
    scores: np.ndarray
    meta: dict[str, Any] = field(default_factory=dict)
    ids: np.ndarray | None = None
    logits: np.ndarray | None = None
    probabilities: np.ndarray | None = None

    @property
    def n_docs(self) -> int:
        return len(self.scores)

    def mask(self, n_docs: int | None = None) -> np.ndarray:
        """Boolean keep-mask over the rows."""
        out = np.zeros(self.n_docs if n_docs is None else n_docs, dtype=bool)
        out[self.selected] = True
        return out

    def rank(self) -> np.ndarray:
        """1-based rank of every row: kept rows first, then by score, ties by id (the one
        ranking, :func:`rank_order`). Under a ``max_similarity`` cap the kept rows need not
        be the best scores, so they are put first explicitly."""
        ids = self.ids if self.ids is not None else np.arange(self.n_docs)
        order = rank_order(self.scores, ids, first=self.mask())
        rank = np.empty(self.n_docs, dtype=np.int64)
        rank[order] = np.arange(1, self.n_docs + 1)
        return rank


def rank_order(scores: np.ndarray, ids: np.ndarray, first: np.ndarray | None = None) -> np.ndarray:
    """Row indices, best first: score descending, ties broken by ascending id.

    The one ranking of datamask: the learner's top-k, the output's ``rank`` column, the
    cap's walk and the sharded runner all read it. ``first`` (bool, optional) puts those
    rows ahead of every other row, each part in the same order.

    Examples
    --------
    >>> rank_order(np.array([0.5, 0.9, 0.5]), np.array(["c", "a", "b"])).tolist()
    [1, 2, 0]
    >>> rank_order(np.array([0.5, 0.9, 0.5]), np.array(["c", "a", "b"]),
    ...            first=np.array([True, False, False])).tolist()
    [0, 1, 2]
    """
    keys = (ids, -np.asarray(scores, dtype=np.float64))
    if first is not None:
        keys = (*keys, ~np.asarray(first, dtype=bool))
    return np.lexsort(keys)


def top_k_rows(scores: np.ndarray, ids: np.ndarray, k: int) -> np.ndarray:
    """Sorted row indices of the ``k`` highest scores, ties broken by ascending id.

    The first ``k`` rows of :func:`rank_order`, sorted.

    Examples
    --------
    >>> top_k_rows(np.array([1.0, 1.0, 1.0, 1.0]), np.array(["d", "a", "b", "c"]), 2).tolist()
    [1, 2]
    """
    return np.sort(rank_order(scores, ids)[:k])


def apportion(sizes: Sequence[int], k_total: int) -> np.ndarray:
    """Share ``k_total`` among groups in proportion to ``sizes`` (Hamilton's method).

    Each group gets the floor of its exact quota ``k_total * n_g / N``; the seats left
    over go to the largest remainders, ties to the lower group id. Integer arithmetic
    throughout, so the result is exact and the same on every machine. The one
    largest-remainder rounding of datamask: the sharded runner's group budgets and the
    DiSF greedy's per-batch quotas both read it.

    Parameters
    ----------
    sizes : sequence of int
        Rows per group (all >= 0, sum > 0).
    k_total : int
        Documents to keep overall, ``0 <= k_total <= sum(sizes)``.

    Returns
    -------
    ndarray of int64, shape (n_groups,)
        Budgets with ``sum == k_total`` and ``0 <= k_g <= sizes[g]``.

    Examples
    --------
    Quotas 1.5, 0.9 and 0.6 floor to 1, 0, 0; the two seats left go to the largest
    remainders, 0.9 and 0.6:

    >>> apportion([5, 3, 2], 3).tolist()
    [1, 1, 1]
    """
    n = [int(s) for s in sizes]
    total = sum(n)
    if total <= 0 or any(s < 0 for s in n):
        raise ValueError(f"group sizes must be >= 0 with a positive sum; got {sizes}.")
    if not 0 <= k_total <= total:
        raise ValueError(f"k_total must be in [0, {total}]; got {k_total}.")
    floors = [k_total * s // total for s in n]
    remainders = [k_total * s % total for s in n]
    left = k_total - sum(floors)
    for g in sorted(range(len(n)), key=lambda g: (-remainders[g], g))[:left]:
        floors[g] += 1
    return np.asarray(floors, dtype=np.int64)
