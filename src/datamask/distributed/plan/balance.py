"""Balanced splits of an over-size cluster, and merges of small neighbouring ones.

Two pure, deterministic pieces of the cluster plan (:mod:`datamask.distributed.plan.partition`):

- :func:`balanced_offsets`: the capacity-constrained assignment of rows to the centres of
  a k-means fitted again on one cluster, as one offset per centre. A row goes to
  ``argmax_j (x . c_j - b_j)`` (a power diagram of the centres), so the rule fitted on a
  sample files every other row too, the borders stay straight between neighbouring
  centres, and no part holds more than its capacity of the sample's rows.
- :func:`merge_neighbours`: groups merged with their nearest neighbours, the most similar
  pair first (cosine of their size-weighted mean directions), while the merged group fits
  ``max_rows``, so groups come out near the chunk size instead of at a fraction of it.
"""

from __future__ import annotations

import heapq
from collections.abc import Sequence

import numpy as np
import torch

from ...neighbors import assign_clusters, spherical_kmeans

__all__ = [
    "MERGE_NEIGHBORS",
    "assign_with_offsets",
    "balanced_offsets",
    "merge_neighbours",
    "two_means_axis",
]

#: Candidate neighbours per group for :func:`merge_neighbours` (a merged group keeps the
#: union of its members' lists).
MERGE_NEIGHBORS = 8

#: Margin added to an offset raise, larger than float32 rounding of a cosine, so a row
#: evicted on the sample stays evicted when the spill recomputes its scores in other blocks.
_EVICT_EPS = 1e-5


def assign_with_offsets(
    x: torch.Tensor, centres: torch.Tensor, offsets: torch.Tensor
) -> torch.Tensor:
    """Index of ``argmax_j (x . c_j - b_j)`` per row (ties: the lower centre)."""
    return (x @ centres.T - offsets).argmax(1)


def balanced_offsets(
    x: torch.Tensor, centres: torch.Tensor, capacity: int, max_rounds: int | None = None
) -> torch.Tensor:
    """Offsets ``b`` so that :func:`assign_with_offsets` puts at most ``capacity`` rows of
    ``x`` on every centre, each row as near its own centre as the capacities allow.

    An auction: while a centre holds more than ``capacity`` rows, its offset rises by the
    margin of its ``excess``-th least attached row (score at this centre minus the best
    score elsewhere), so exactly the rows that lose least leave, each for its next best
    centre. Offsets only rise, the most over-full centre first, until every centre fits
    (``len(centres) * capacity >= len(x)`` is required) or ``max_rounds`` (default
    ``50 * len(centres)``) is spent; the caller then cuts what is still too large.

    Parameters
    ----------
    x : Tensor of shape (n, d)
        Unit rows.
    centres : Tensor of shape (P, d)
        Unit centres.
    capacity : int
        Most rows per centre.
    max_rounds : int, optional
        Most offset raises.
    """
    n_centres = len(centres)
    if n_centres * capacity < len(x):
        raise ValueError(
            f"capacity must hold every row: {n_centres} centres x {capacity} rows < {len(x)}."
        )
    scores = x @ centres.T
    offsets = torch.zeros(n_centres, dtype=scores.dtype)
    rounds = 50 * n_centres if max_rounds is None else max_rounds
    for _ in range(rounds):
        value = scores - offsets
        label = value.argmax(1)
        counts = torch.bincount(label, minlength=n_centres)
        excess = counts - capacity
        j = int(excess.argmax())
        if int(excess[j]) <= 0:
            break
        mine = value[label == j]
        others = mine.clone()
        others[:, j] = -torch.inf
        margin = torch.sort(mine[:, j] - others.max(1).values).values
        offsets[j] += margin[int(excess[j]) - 1] + _EVICT_EPS
    return offsets


def two_means_axis(x: torch.Tensor, generator: torch.Generator) -> torch.Tensor:
    """Unit direction between the two centroids of a spherical 2-means of ``x`` (zero
    when the rows cannot be told apart)."""
    if len(x) < 2:
        return torch.zeros(x.shape[1])
    a, *rest = spherical_kmeans(x, 2, n_iter=10, sample=None, generator=generator)
    if not rest:
        return torch.zeros(x.shape[1])
    diff = a - rest[0]
    norm = diff.norm()
    return diff / norm if norm > 1e-6 else torch.zeros(x.shape[1])


def merge_neighbours(
    sizes: Sequence[int],
    centres: np.ndarray,
    max_rows: int,
    n_neighbors: int = MERGE_NEIGHBORS,
) -> list[list[int]]:
    """Merge groups with their nearest neighbours while the merge fits ``max_rows``.

    Agglomerative, the most similar pair first: among every pair of candidate neighbours
    whose sizes fit ``max_rows`` together, the pair with the largest cosine of their
    size-weighted mean directions (ties: the lower indices) merges, and the merged group's
    pairs are priced again; until no pair fits. Candidates are each group's
    ``n_neighbors`` nearest by centre (both ways), and a merged group has the union of its
    members'.
    Merging the nearest first removes the borders that share the most neighbours.
    Deterministic.

    Parameters
    ----------
    sizes : sequence of int
        Rows per group.
    centres : ndarray of shape (G, d)
        A unit direction per group.
    max_rows : int
        The largest merged group.
    n_neighbors : int
        Candidates per group.

    Returns
    -------
    list of list of int
        The merged groups, each a sorted list of input indices, ordered by their first.

    >>> merge_neighbours([3, 2, 4], np.array([[1.0, 0.0], [0.0, 1.0], [0.9, 0.1]]), 7)
    [[0, 2], [1]]
    >>> merge_neighbours([3, 2, 4], np.array([[1.0, 0.0], [0.0, 1.0], [0.9, 0.1]]), 6)
    [[0], [1, 2]]
    """
    n = len(sizes)
    if n == 0:
        return []
    c = torch.from_numpy(np.ascontiguousarray(centres, dtype=np.float32))
    near = assign_clusters(c, c, top=min(n, n_neighbors + 1)).reshape(n, -1).numpy()
    candidates: list[set[int]] = [set() for _ in range(n)]
    for i, row in enumerate(near):  # symmetric, so a merge sees every pair it changes
        for j in map(int, row):
            if j != i:
                candidates[i].add(j)
                candidates[j].add(i)
    state = _Merges(sizes, centres, candidates)
    state.closest_first(max_rows)
    return [state.members[g] for g in range(n) if state.owner[g] == g]


class _Merges:
    """Groups under merging: union-find owners, sizes, summed directions, candidates."""

    def __init__(self, sizes: Sequence[int], centres: np.ndarray, candidates: list[set[int]]):
        n = len(sizes)
        self.size = [int(s) for s in sizes]
        self.total = [np.asarray(centres[i], np.float64) * max(self.size[i], 1) for i in range(n)]
        self.members = [[i] for i in range(n)]
        self.candidates = candidates
        self.owner = list(range(n))

    def find(self, i: int) -> int:
        while self.owner[i] != i:
            self.owner[i] = self.owner[self.owner[i]]
            i = self.owner[i]
        return i

    def fitting(self, g: int, max_rows: int) -> list[int]:
        """Open groups among ``g``'s candidates that fit with it, by index."""
        options = sorted({self.find(h) for h in self.candidates[g]} - {g})
        return [h for h in options if self.size[g] + self.size[h] <= max_rows]

    def similarity(self, g: int, h: int) -> float:
        a, b = self.total[g], self.total[h]
        return float(a @ b) / float(np.linalg.norm(a) * np.linalg.norm(b) or 1.0)

    def merge(self, g: int, h: int) -> int:
        keep, gone = min(g, h), max(g, h)
        self.owner[gone] = keep
        self.size[keep] += self.size[gone]
        self.total[keep] = self.total[keep] + self.total[gone]
        self.members[keep] = sorted(self.members[keep] + self.members[gone])
        self.candidates[keep] |= self.candidates[gone]
        return keep

    def closest_first(self, max_rows: int) -> None:
        heap = [
            (-self.similarity(g, h), g, h, self.size[g], self.size[h])
            for g in range(len(self.size))
            for h in self.fitting(g, max_rows)
            if g < h  # candidates are symmetric: every pair once
        ]
        heapq.heapify(heap)
        while heap:
            _, g, h, sg, sh = heapq.heappop(heap)
            alive = self.owner[g] == g and self.owner[h] == h
            if not alive or (sg, sh) != (self.size[g], self.size[h]):
                continue  # stale pair
            keep = self.merge(g, h)
            for o in self.fitting(keep, max_rows):
                a, b = min(keep, o), max(keep, o)
                heapq.heappush(heap, (-self.similarity(a, b), a, b, self.size[a], self.size[b]))
