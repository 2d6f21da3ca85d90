"""The cluster tree of ``--partition cluster``: k-means clusters, each too large one split
again by a balanced k-means, and the routing of rows to its leaves (:class:`ClusterTree`).

Fitted by :func:`~.partition.fit_tree` on one worker, saved once as ``WORK/clusters/tree.npz``
and read by every spill step (:func:`~.partition.spill_shard`) and by the plan.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

import numpy as np
import torch

from ...io.atomic import atomic_write
from ...io.fs import open_whole, storage_path
from ...neighbors import assign_clusters
from .balance import assign_with_offsets

__all__ = ["ClusterTree"]


@dataclass(frozen=True)
class ClusterTree:
    """k-means clusters, each too large one split again by a balanced k-means.

    Nodes ``0 .. C-1`` are the k-means clusters (their centroids in ``centroids``); a
    cluster the sample says is too large has children: the centres of a k-means fitted on
    its own rows, with offsets that balance them (:func:`~.balance.balanced_offsets`). A
    row at an inner node ``v`` goes to the child ``u`` in ``children[v, 0] ..
    children[v, 1] - 1`` with the largest ``x . centre[u] - offset[u]``. Leaves
    (``children[v] == -1``) are numbered ``0 .. L-1`` depth first (``leaf[v]``), so the
    leaves under any node are one contiguous run ``leaf_range[v]``; a leaf's ``axis``
    (its own 2-means direction) orders its rows in the spill, so a leaf the full counts
    find too large can still be cut geometrically.

    Attributes
    ----------
    centroids : ndarray of shape (C, d)
        Unit k-means centroids.
    centre : ndarray of shape (M, d)
        Unit centre per node (the centroid for ``0 .. C-1``).
    offset : ndarray of shape (M,)
        Offset of a child in its parent's balanced assignment (0 for the clusters).
    axis : ndarray of shape (M, d)
        Unit direction per node (zero where the sample could not tell one).
    children : ndarray of shape (M, 2)
        ``[first, stop)`` of a node's children (consecutive ids), ``-1`` for a leaf.
    ordered : bool
        Whether spills sort a leaf's rows along its axis (not when the whole corpus is
        one group: its rows keep the input order, as a single-file selection reads them).
    levels : int, default=1
        2 when nodes ``0 .. C1-1`` are coarse clusters whose children are the k-means
        clusters (a two-level fit, :mod:`.kmeans`), so a plan that keeps every k-means
        cluster its own group looks below them.
    """

    centroids: np.ndarray
    centre: np.ndarray
    offset: np.ndarray
    axis: np.ndarray
    children: np.ndarray
    ordered: bool
    levels: int = 1

    @property
    def leaf(self) -> np.ndarray:
        """Leaf number per node, depth first; ``-1`` for inner nodes."""
        out = np.full(len(self.children), -1, dtype=np.int64)
        for i, v in enumerate(self._depth_first_leaves()):
            out[v] = i
        return out

    @property
    def n_leaves(self) -> int:
        return int((self.children[:, 0] < 0).sum())

    def _depth_first_leaves(self) -> list[int]:
        leaves: list[int] = []
        stack = list(range(len(self.centroids)))[::-1]
        while stack:
            v = stack.pop()
            first, stop = (int(i) for i in self.children[v])
            if first < 0:
                leaves.append(v)
            else:
                stack += range(stop - 1, first - 1, -1)
        return leaves

    def leaf_range(self) -> np.ndarray:
        """``[first, last]`` leaf number under every node, shape (M, 2)."""
        leaf = self.leaf
        out = np.stack([leaf, leaf], axis=1)
        for v in range(len(self.children) - 1, -1, -1):  # children have larger ids
            first, stop = self.children[v]
            if first >= 0:
                out[v] = (out[first, 0], out[stop - 1, 1])
        return out

    def assign(self, x: torch.Tensor) -> tuple[np.ndarray, np.ndarray]:
        """Leaf number and projection on the leaf's axis of every unit row of ``x``."""
        return self._route(x, torch.from_numpy(self.leaf))

    def _route(self, x: torch.Tensor, number: torch.Tensor) -> tuple[np.ndarray, np.ndarray]:
        """``number`` of every row's leaf node, and its projection on that node's axis."""
        node = assign_clusters(x, torch.from_numpy(self.centroids))
        centre, offset = torch.from_numpy(self.centre), torch.from_numpy(self.offset)
        children = self.children
        while True:
            inner = np.unique(node[torch.from_numpy(children[node.numpy(), 0] >= 0)].numpy())
            if not len(inner):
                break
            for v in inner:  # few inner nodes, each with its own centres
                rows = torch.nonzero(node == int(v)).flatten()
                kids = torch.arange(int(children[v, 0]), int(children[v, 1]))
                node[rows] = kids[assign_with_offsets(x[rows], centre[kids], offset[kids])]
        projection = (x * torch.from_numpy(self.axis)[node]).sum(1)
        return number[node].numpy(), projection.numpy()

    def save(self, path: str | Path) -> None:
        """Write the tree as one ``.npz``, atomically."""
        with atomic_write(storage_path(path)) as tmp, open(tmp, "wb") as fh:
            np.savez(
                fh,
                centroids=self.centroids,
                centre=self.centre,
                offset=self.offset,
                axis=self.axis,
                children=self.children,
                ordered=np.asarray(self.ordered),
                **({"levels": np.asarray(self.levels)} if self.levels != 1 else {}),
            )

    @classmethod
    def load(cls, path: str | Path) -> ClusterTree:
        with open_whole(path) as fh, np.load(fh) as f:
            if "centre" not in f:  # hyperplane cuts, before the balanced splits
                raise ValueError(f"{path} is a cluster tree of an older datamask: remove it.")
            arrays = [f[name] for name in ("centroids", "centre", "offset", "axis", "children")]
            levels = int(f["levels"]) if "levels" in f else 1
            return cls(*arrays, ordered=bool(f["ordered"]), levels=levels)
