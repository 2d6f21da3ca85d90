"""Redundancy the way a deduplication user reads it (SemDeDup, NeMo Curator).

    datamask evaluate --input docs.parquet --selection out/sel.parquet --dup-thresholds 0.9 0.95

For each cosine threshold T, over the selected documents and over the whole input:

- ``pairs``: unordered pairs of documents with cosine > T;
- ``documents``: documents with at least one such partner;
- ``groups`` and ``largest_group``: connected components of the graph of those pairs
  (near-duplicate groups, as SemDeDup clusters them) with two or more documents, and the
  size of the largest (0 when there is no pair);
- ``dedup_removes``: ``documents - groups``, what a dedup pass keeping one document per
  group would drop.

The selected set is always searched exactly, in tiles (O(k^2 d), memory one tile). The
whole input is searched exactly up to 100,000 documents (or on CUDA) and on an inverted
file of k-means cells above (``method="ivf"``: it can miss pairs whose rows fall in
different cells, never invents one, so its figures are lower bounds; the result says
``"approximate": true``). Components are kept as a union-find forest of at most N edges,
so memory stays O(N) whatever the number of pairs.
"""

from __future__ import annotations

import time
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np
import torch
from scipy.sparse import coo_matrix
from scipy.sparse.csgraph import connected_components

from .._validation import Interval, Options
from ..near_duplicates import as_float_tensor, resolve_pair_method, similar_pairs
from ..settings import setting_field

__all__ = [
    "DEFAULT_THRESHOLDS",
    "DuplicateSettings",
    "check_thresholds",
    "duplicate_stats",
    "redundancy",
]

#: ``--dup-thresholds`` default.
DEFAULT_THRESHOLDS = (0.9, 0.95, 0.99)


@dataclass(frozen=True)
class DuplicateSettings:
    """The near-duplicate figures' two settings, declared once: ``bench``'s spec shares
    them and ``evaluate`` and ``report`` make their flags from them."""

    dup_thresholds: tuple[float, ...] = setting_field(
        DEFAULT_THRESHOLDS,
        (Interval(float, -1, 1, closed="neither"),),
        "cosine thresholds of the near-duplicate figures (pairs, documents and largest "
        "group above each)",
        many=True,
    )
    dup_search: str = setting_field(
        "auto",
        (Options(str, ("auto", "exact", "ivf")),),
        "pair search over the whole input: exact, or ivf (k-means cells, approximate: lower "
        "bounds); auto = exact up to 100,000 documents or on CUDA",
    )


#: Pending edges before the forest is compressed.
_COMPRESS_EDGES = 1 << 22


def check_thresholds(thresholds: Iterable[float]) -> tuple[float, ...]:
    """Sorted distinct thresholds, each in (-1, 1)."""
    try:
        values = sorted({float(t) for t in thresholds})
    except (TypeError, ValueError):
        raise TypeError(f"dup_thresholds must be numbers; got {thresholds!r}.") from None
    if not values:
        raise ValueError("dup_thresholds must hold at least one threshold; got none.")
    bad = [t for t in values if not -1.0 < t < 1.0]
    if bad:
        raise ValueError(f"dup_thresholds must lie in (-1, 1); got {bad[0]}.")
    return tuple(values)


class _Components:
    """Connected components of a graph given edge block by edge block, in O(n) memory."""

    def __init__(self, n: int) -> None:
        self.n = n
        self._i: list[np.ndarray] = []
        self._j: list[np.ndarray] = []
        self._pending = 0

    def add(self, i: np.ndarray, j: np.ndarray) -> None:
        self._i.append(i)
        self._j.append(j)
        self._pending += len(i)
        if self._pending > _COMPRESS_EDGES:
            self._compress()

    def labels(self) -> np.ndarray:
        i = np.concatenate(self._i) if self._i else np.zeros(0, dtype=np.int64)
        j = np.concatenate(self._j) if self._j else np.zeros(0, dtype=np.int64)
        graph = coo_matrix((np.ones(len(i), dtype=np.int8), (i, j)), shape=(self.n, self.n))
        return connected_components(graph, directed=False)[1]

    def _compress(self) -> None:
        # Replace the edges by a spanning forest: every row linked to its component's first.
        labels = self.labels()
        _, first = np.unique(labels, return_index=True)
        root = first[labels]
        linked = np.flatnonzero(root != np.arange(self.n))
        self._i, self._j, self._pending = [linked], [root[linked]], 0


def duplicate_stats(
    n: int,
    pairs: Iterable[tuple[np.ndarray, np.ndarray, np.ndarray]],
    thresholds: Sequence[float],
) -> dict[str, dict[str, int]]:
    """Pair, document and group counts per threshold from a stream of ``(i, j, sim)``.

    ``pairs`` must hold every pair above the lowest threshold once (as
    :func:`~datamask.near_duplicates.similar_pairs` yields them).
    """
    ts = list(thresholds)
    count = [0] * len(ts)
    touched = [np.zeros(n, dtype=bool) for _ in ts]
    comps = [_Components(n) for _ in ts]
    for i, j, s in pairs:
        for t, thr in enumerate(ts):
            keep = s > thr
            if not keep.any():
                continue
            a, b = i[keep], j[keep]
            count[t] += len(a)
            touched[t][a] = True
            touched[t][b] = True
            comps[t].add(a, b)
    out: dict[str, dict[str, int]] = {}
    for t, thr in enumerate(ts):
        sizes = np.bincount(comps[t].labels()) if count[t] else np.zeros(0, dtype=np.int64)
        groups = sizes[sizes >= 2]
        docs = int(touched[t].sum())
        out[f"{thr:g}"] = {
            "pairs": count[t],
            "documents": docs,
            "groups": len(groups),
            "largest_group": int(groups.max()) if len(groups) else 0,
            "dedup_removes": docs - len(groups),
        }
    return out


def redundancy(
    features: torch.Tensor | np.ndarray,
    rows: np.ndarray | None = None,
    *,
    thresholds: Sequence[float] = DEFAULT_THRESHOLDS,
    method: str = "exact",
    n_probe: int = 4,
    device: torch.device | str | None = None,
    closest: int = 0,
    progress: bool = False,
) -> dict[str, Any]:
    """Near-duplicate figures of ``rows`` of ``features`` (all rows when None).

    Parameters
    ----------
    features : tensor or ndarray of shape (n, d)
        Unit embeddings.
    rows : array of int, optional
        The selected rows; None measures the whole input.
    thresholds : sequence of float, default=(0.9, 0.95, 0.99)
        Cosine thresholds (pairs with cosine > T count).
    method : {"exact", "ivf", "auto"}, default="exact"
        Range search (see :func:`datamask.near_duplicates.similar_pairs`); ``auto`` is exact
        up to 100,000 rows or on CUDA.
    n_probe : int, default=4
        Cells each row is filed under (ivf).
    device : torch device or str, optional
        Where to compute (default: where ``features`` lives).
    closest : int, default=0
        Also return the ``closest`` most similar pairs above the lowest threshold, from the
        same search, as ``[(row_a, row_b, cosine), ...]`` (rows of ``features``).
    progress : bool, default=False
        A progress bar over the search (stderr): the pair search is the long loop.

    Returns
    -------
    dict
        ``n`` (rows measured), ``method``, ``approximate``, ``seconds`` and ``thresholds``:
        ``{"0.95": {"pairs", "documents", "groups", "largest_group", "dedup_removes"}}``;
        with ``closest``, also ``closest``.

    Examples
    --------
    >>> import numpy as np
    >>> x = np.eye(3, dtype=np.float32)[[0, 0, 1, 2, 2, 2]]
    >>> r = redundancy(x, thresholds=[0.9])
    >>> r["thresholds"]["0.9"]
    {'pairs': 4, 'documents': 5, 'groups': 2, 'largest_group': 3, 'dedup_removes': 3}
    """
    ts = check_thresholds(thresholds)
    start = time.perf_counter()
    x = as_float_tensor(features, device)
    if rows is not None:
        x = x[torch.as_tensor(np.asarray(rows, dtype=np.int64), device=x.device)]
    n = x.shape[0]
    method = resolve_pair_method(method, n, x.device)
    stream = similar_pairs(x, ts[0], method=method, n_probe=n_probe, progress=progress)
    top = _Closest(closest)
    stats = duplicate_stats(n, top.watch(stream), ts)
    out = {
        "n": n,
        "method": method,
        "approximate": method == "ivf",
        "seconds": time.perf_counter() - start,
        "thresholds": stats,
    }
    if closest:
        picked = top.pairs()
        if rows is not None:
            rows = np.asarray(rows, dtype=np.int64)
            picked = [(int(rows[i]), int(rows[j]), s) for i, j, s in picked]
        out["closest"] = picked
    return out


class _Closest:
    """The ``n`` most similar pairs of a stream of ``(i, j, sim)`` blocks, in O(n) memory."""

    def __init__(self, n: int) -> None:
        self.n = n
        self._i = np.zeros(0, np.int64)
        self._j = np.zeros(0, np.int64)
        self._s = np.zeros(0, np.float64)

    def watch(
        self, pairs: Iterable[tuple[np.ndarray, np.ndarray, np.ndarray]]
    ) -> Iterable[tuple[np.ndarray, np.ndarray, np.ndarray]]:
        for i, j, s in pairs:
            if self.n:
                self._i = np.concatenate([self._i, np.asarray(i, np.int64)])
                self._j = np.concatenate([self._j, np.asarray(j, np.int64)])
                self._s = np.concatenate([self._s, np.asarray(s, np.float64)])
                keep = np.argsort(-self._s, kind="stable")[: self.n]
                self._i, self._j, self._s = self._i[keep], self._j[keep], self._s[keep]
            yield i, j, s

    def pairs(self) -> list[tuple[int, int, float]]:
        return [
            (int(a), int(b), float(c)) for a, b, c in zip(self._i, self._j, self._s, strict=True)
        ]
