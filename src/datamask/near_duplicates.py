"""Near-duplicate pairs (cosine above a threshold) and the hard similarity cap.

One range search serves the redundancy report (:mod:`datamask.evaluation.redundancy`) and the
``max_similarity`` cap of every selector:

- :func:`similar_pairs` streams the pairs ``i < j`` with ``cos(x_i, x_j) > threshold``,
  exactly (tiles of the upper triangle, O(n^2 d), memory one tile) or approximately on an
  inverted file of k-means cells (``method="ivf"``, O(n^1.5 d n_probe)).
- :class:`SimilarityCap` keeps a set of rows no two of which are more similar than the
  threshold: :meth:`~SimilarityCap.admit` one candidate (greedy selectors skip the ones it
  refuses), or :meth:`~SimilarityCap.walk` down a ranking, keeping every row compatible
  with those kept before it (top-k, random, the learner's final rounding, the cross-group
  pass of the sharded runner).
- :func:`max_pair_similarity` / :func:`verify_cap` check a finished selection exactly.

Cosines are float32 dot products of unit rows; "above" is strict (``> threshold``) here and
in the report, so a selection passes the cap exactly when the report counts 0 pairs above it.
"""

from __future__ import annotations

import math
from collections.abc import Iterator, Sequence

import numpy as np
import torch
from tqdm.auto import tqdm

from ._device import resolve_device
from .data import rank_order
from .neighbors import assign_clusters, column_lists, spherical_kmeans

__all__ = [
    "SimilarityCap",
    "as_float_tensor",
    "capped_top_k",
    "check_max_similarity",
    "infeasible_message",
    "max_pair_similarity",
    "similar_pairs",
    "verify_cap",
]

#: Elements of one similarity tile (float32: 64 MiB).
TILE_ELEMENTS = 1 << 24

PAIR_METHODS = ("auto", "exact", "ivf")

#: ``method="auto"`` searches exactly up to this many rows on CPU (about a minute at d=384).
EXACT_MAX_ROWS = 100_000


def check_max_similarity(value: float | None) -> float | None:
    """``None`` (no cap) or a cosine threshold in (-1, 1]."""
    if value is None:
        return None
    if isinstance(value, bool) or not isinstance(value, int | float | np.integer | np.floating):
        raise TypeError(f"max_similarity must be a number; got {value!r}.")
    v = float(value)
    if not (math.isfinite(v) and -1.0 < v <= 1.0):
        raise ValueError(f"max_similarity must be in (-1, 1]; got {value}.")
    return v


def as_float_tensor(
    features: torch.Tensor | np.ndarray, device: torch.device | str | None = None
) -> torch.Tensor:
    """``features`` as a float32 tensor on ``device`` (default: where it lives, or CPU)."""
    if not torch.is_tensor(features):
        arr = np.asarray(features)
        features = torch.from_numpy(arr if arr.flags.writeable else arr.copy())
    x = features if device is None else features.to(resolve_device(device))  # "auto" too
    return x.float()


def _upper_tiles(
    x: torch.Tensor, rows: int | None = None
) -> Iterator[tuple[int, int, torch.Tensor]]:
    """``(r0, c0, sims)`` over the tiles of ``x @ x.T`` on or above the diagonal.

    Entries on or below the diagonal of a diagonal tile are set to -inf, so every unordered
    pair ``i < j`` appears exactly once.
    """
    n = x.shape[0]
    step = rows or max(1, min(n, int(math.sqrt(TILE_ELEMENTS))))
    for r0 in range(0, n, step):
        xr = x[r0 : r0 + step]
        for c0 in range(r0, n, step):
            sims = xr @ x[c0 : c0 + step].T
            if c0 == r0:
                sims = sims.triu(diagonal=1) + torch.full_like(sims, -torch.inf).tril()
            yield r0, c0, sims


def _exact_pairs(
    x: torch.Tensor, threshold: float, progress: bool = False
) -> Iterator[tuple[np.ndarray, np.ndarray, np.ndarray]]:
    n = x.shape[0]
    blocks = math.ceil(n / max(1, min(n, int(math.sqrt(TILE_ELEMENTS))))) if n else 0
    total = blocks * (blocks + 1) // 2
    with tqdm(total=total, desc="pairs", unit="tile", leave=False, disable=not progress) as bar:
        for r0, c0, sims in _upper_tiles(x):
            bar.update()
            i, j = torch.nonzero(sims > threshold, as_tuple=True)
            if len(i):
                s = sims[i, j]
                yield (i + r0).cpu().numpy(), (j + c0).cpu().numpy(), s.cpu().numpy()


def _ivf_pairs(
    x: torch.Tensor,
    threshold: float,
    n_probe: int,
    generator: torch.Generator | None,
    progress: bool = False,
) -> Iterator[tuple[np.ndarray, np.ndarray, np.ndarray]]:
    """Pairs above ``threshold`` among rows that share a k-means cell (approximate).

    Every row is filed under its ``n_probe`` nearest of about sqrt(n) cells and queried in
    its nearest one (its home). A pair is found when either row's home is among the other's
    probes; it is reported once: by the lower row when both sides find it.
    """
    n = x.shape[0]
    n_cells = max(1, int(math.sqrt(n)))
    if generator is None:  # the same input gives the same cells, never torch's global RNG
        generator = torch.Generator(device=x.device).manual_seed(0)
    cent = spherical_kmeans(
        x, n_cells, n_iter=6, sample=min(n, 20 * n_cells + 10_000), generator=generator
    )
    probes = assign_clusters(x, cent, top=min(n_probe, len(cent)))
    probes = probes if probes.ndim == 2 else probes[:, None]
    home = probes[:, 0]
    ptr, owners = column_lists(probes, len(cent))  # each cell's rows, in row order
    owners.div_(probes.shape[1], rounding_mode="floor")
    bounds = ptr.tolist()
    cells = torch.arange(len(cent) + 1, device=x.device)
    q_order = torch.argsort(home, stable=True)
    q_bounds = torch.searchsorted(home[q_order], cells).tolist()
    for c in tqdm(range(len(cent)), desc="pairs", unit="cell", leave=False, disable=not progress):
        queries = q_order[q_bounds[c] : q_bounds[c + 1]]
        members = owners[bounds[c] : bounds[c + 1]]
        if len(queries) == 0 or len(members) < 2:
            continue
        xm = x[members]
        step = max(1, TILE_ELEMENTS // len(members))
        for lo in range(0, len(queries), step):
            q = queries[lo : lo + step]
            sims = x[q] @ xm.T
            a, b = torch.nonzero(sims > threshold, as_tuple=True)
            i, j = q[a], members[b]
            s = sims[a, b]
            keep = i != j
            i, j, s = i[keep], j[keep], s[keep]
            # Found from j's side too when j's home is one of i's probes: keep it once.
            both = (probes[i] == home[j][:, None]).any(1)
            keep = ~both | (i < j)
            i, j, s = i[keep], j[keep], s[keep]
            if len(i):
                lo_, hi_ = torch.minimum(i, j), torch.maximum(i, j)
                yield lo_.cpu().numpy(), hi_.cpu().numpy(), s.cpu().numpy()


def resolve_pair_method(method: str, n: int, device: torch.device) -> str:
    """``auto`` -> exact on CUDA or up to :data:`EXACT_MAX_ROWS` rows, else ivf."""
    if method not in PAIR_METHODS:
        raise ValueError(f"method must be one of {list(PAIR_METHODS)}; got {method!r}.")
    if method == "auto":
        return "exact" if (device.type == "cuda" or n <= EXACT_MAX_ROWS) else "ivf"
    return method


def similar_pairs(
    features: torch.Tensor | np.ndarray,
    threshold: float,
    *,
    method: str = "exact",
    n_probe: int = 4,
    generator: torch.Generator | None = None,
    device: torch.device | str | None = None,
    progress: bool = False,
) -> Iterator[tuple[np.ndarray, np.ndarray, np.ndarray]]:
    """Stream the pairs of rows whose cosine similarity is above ``threshold``.

    Parameters
    ----------
    features : tensor or ndarray of shape (n, d)
        Unit rows.
    threshold : float
        Pairs with ``cos > threshold`` are reported.
    method : {"exact", "ivf", "auto"}, default="exact"
        ``exact`` compares every pair, tile by tile (memory: one tile of 2^24 entries).
        ``ivf`` compares only rows that share a k-means cell (see :func:`_ivf_pairs`): it
        can miss pairs, never invents one. ``auto``: see :func:`resolve_pair_method`.
    n_probe : int, default=4
        Cells each row is filed under (ivf).
    generator : torch.Generator, optional
        Draws of the ivf k-means (default: seeded with 0).
    device : torch device or str, optional
        Where to compute (default: where ``features`` lives).
    progress : bool, default=False
        A progress bar (stderr) over the tiles (exact) or the cells (ivf).

    Yields
    ------
    i, j, sim : ndarray
        Row pairs with ``i < j`` (each unordered pair once) and their cosine, in blocks.

    Examples
    --------
    >>> import numpy as np
    >>> x = np.array([[1, 0], [1, 0.01], [0, 1]], dtype=np.float32)
    >>> x /= np.linalg.norm(x, axis=1, keepdims=True)
    >>> [(int(i), int(j)) for a, b, _ in similar_pairs(x, 0.9) for i, j in zip(a, b)]
    [(0, 1)]
    """
    x = as_float_tensor(features, device)
    method = resolve_pair_method(method, x.shape[0], x.device)
    if method == "exact":
        return _exact_pairs(x, float(threshold), progress)
    return _ivf_pairs(x, float(threshold), n_probe, generator, progress)


def max_pair_similarity(
    features: torch.Tensor | np.ndarray, rows: Sequence[int] | np.ndarray | None = None
) -> float:
    """The largest cosine between two distinct rows (of ``rows``, when given); exact, tiled.

    Returns -inf for fewer than two rows.
    """
    x = as_float_tensor(features)
    if rows is not None:
        x = x[torch.as_tensor(np.asarray(rows, dtype=np.int64), device=x.device)]
    best = -math.inf
    for _, _, sims in _upper_tiles(x):
        best = max(best, float(sims.max()))  # sync point: once per tile
    return best


def verify_cap(
    features: torch.Tensor | np.ndarray,
    rows: Sequence[int] | np.ndarray | None,
    threshold: float,
) -> float:
    """Check exactly that no two of ``rows`` (all rows when None) have cosine > ``threshold``.

    Returns the largest cosine found.

    Raises RuntimeError (an internal error: the selectors guarantee it) when the check fails.
    """
    top = max_pair_similarity(features, rows)
    if top > threshold:
        raise RuntimeError(
            f"selection breaks max_similarity={threshold}: two selected documents have "
            f"cosine {top:.6f}; please report this."
        )
    return top


def infeasible_message(threshold: float, kept: int, k: int, n: int, what: str) -> str:
    """The one-line error when the cap leaves fewer than ``k`` compatible documents."""
    ratio = math.floor(10_000 * (kept + 0.49) / n) / 10_000 if n else 0.0
    return (
        f"max_similarity={threshold} admits only {kept} of the k={k} documents asked for: "
        f"no further document of the {n} has every cosine <= {threshold} to those kept "
        f"(walking {what}); raise max_similarity, or lower select_ratio to {ratio:g} or less."
    )


class SimilarityCap:
    """A growing set of kept rows, no two with cosine above ``threshold``.

    Parameters
    ----------
    features : tensor or ndarray of shape (n, d)
        Unit rows of every candidate.
    threshold : float
        The cap: a candidate conflicts with the kept set when its cosine to a kept row is
        ``> threshold``.
    capacity : int, optional
        Expected number of kept rows (storage is preallocated and grows when exceeded).

    Attributes
    ----------
    kept : list of int
        Rows kept, in the order they were admitted.
    n_refused : int
        Candidates refused for a conflict so far.

    Examples
    --------
    >>> import numpy as np
    >>> x = np.array([[1, 0], [0.999, 0.045], [0, 1]], dtype=np.float32)
    >>> cap = SimilarityCap(x / np.linalg.norm(x, axis=1, keepdims=True), 0.95)
    >>> cap.walk(np.array([0, 1, 2]), k=2).tolist()
    [0, 2]
    """

    def __init__(
        self,
        features: torch.Tensor | np.ndarray,
        threshold: float,
        *,
        capacity: int | None = None,
    ) -> None:
        self.x = as_float_tensor(features)
        self.threshold = float(threshold)
        self.kept: list[int] = []
        self.n_refused = 0
        cap = max(16, capacity or 1024)
        self._store = torch.empty(cap, self.x.shape[1], dtype=self.x.dtype, device=self.x.device)

    def __len__(self) -> int:
        return len(self.kept)

    def rebind(self, features: torch.Tensor | np.ndarray) -> None:
        """Take candidates from ``features`` from now on; the kept set stays.

        Rows kept later index the new features (the sharded runner's cross-group pass
        binds each group's rows in turn).
        """
        self.x = as_float_tensor(features, self._store.device)

    def kept_features(self) -> torch.Tensor:
        """Features of the kept rows, in the order they were kept."""
        return self._store[: len(self.kept)]

    def _append(self, rows: torch.Tensor) -> None:
        need = len(self.kept) + len(rows)
        if need > len(self._store):
            grown = torch.empty(
                max(need, 2 * len(self._store)),
                self.x.shape[1],
                dtype=self.x.dtype,
                device=self.x.device,
            )
            grown[: len(self.kept)] = self._store[: len(self.kept)]
            self._store = grown
        self._store[len(self.kept) : need] = self.x[rows]
        self.kept.extend(int(r) for r in rows.tolist())

    def conflicts(self, rows: Sequence[int] | np.ndarray | torch.Tensor) -> np.ndarray:
        """For each candidate row: does it have cosine > threshold to a kept row?"""
        r = torch.as_tensor(np.asarray(rows, dtype=np.int64), device=self.x.device).reshape(-1)
        bad = torch.zeros(len(r), dtype=torch.bool, device=self.x.device)
        m = len(self.kept)
        if m == 0 or len(r) == 0:
            return bad.cpu().numpy()
        xc = self.x[r]
        step = max(1, TILE_ELEMENTS // max(len(r), 1))
        for lo in range(0, m, step):
            bad |= (xc @ self._store[lo : min(m, lo + step)].T).amax(1) > self.threshold
        return bad.cpu().numpy()

    def admit(self, row: int) -> bool:
        """Keep ``row`` unless it conflicts with a kept row. Returns whether it was kept."""
        if self.conflicts([row])[0]:
            self.n_refused += 1
            return False
        self._append(torch.as_tensor([int(row)], device=self.x.device))
        return True

    def walk(self, order: Sequence[int] | np.ndarray, k: int, *, block: int = 2048) -> np.ndarray:
        """Walk down ``order`` keeping each row compatible with every row kept before it.

        Stops once ``k`` rows are kept in all (rows kept before the walk count); returns
        the rows this walk kept, in order (fewer than needed when ``order`` runs out).
        Candidates are checked a block at a time: against the kept set with one matrix
        product, and against the earlier candidates of their block in order.
        """
        order = np.asarray(order, dtype=np.int64)
        taken: list[np.ndarray] = []
        pos = 0
        while len(self.kept) < k and pos < len(order):
            need = k - len(self.kept)
            size = min(block, max(64, need + need // 8))
            cand = order[pos : pos + size]
            pos += len(cand)
            bad = self.conflicts(cand)
            c = torch.as_tensor(cand, device=self.x.device)
            xc = self.x[c]
            inner = (xc @ xc.T).triu(diagonal=1) > self.threshold
            a, b = (t.cpu().numpy() for t in torch.nonzero(inner, as_tuple=True))
            # Row-major order: every pair (a', a) with a' < a is settled before a's pairs.
            for first, second in zip(a.tolist(), b.tolist(), strict=True):
                if not bad[first]:
                    bad[second] = True
            ok = np.flatnonzero(~bad)[:need]
            self.n_refused += int(bad[: (ok[-1] + 1) if len(ok) else len(bad)].sum())
            if len(ok):
                self._append(c[torch.as_tensor(ok, device=self.x.device)])
                taken.append(cand[ok])
        return np.concatenate(taken) if taken else np.zeros(0, dtype=np.int64)


def capped_top_k(
    scores: np.ndarray,
    ids: np.ndarray,
    k: int,
    features: torch.Tensor | np.ndarray,
    threshold: float,
    *,
    what: str = "the ranking",
) -> np.ndarray:
    """Sorted rows of the ``k`` best scores (ties by id) with no pair above ``threshold``.

    Walks the ranking and keeps every row compatible with the better-ranked rows kept
    (a conflict keeps the higher-scored row and takes the next compatible one instead).
    Raises ValueError with :func:`infeasible_message` when the ranking runs out first.
    """
    order = rank_order(scores, ids)
    cap = SimilarityCap(features, threshold, capacity=k)
    kept = cap.walk(order, k)
    if len(kept) < k:
        raise ValueError(infeasible_message(threshold, len(kept), k, len(order), what))
    return np.sort(kept)
