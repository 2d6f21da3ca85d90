"""Facility location's state for the optimisers: the exact covers of the swap rounding,
the greedy's cover, the graph gains on the host, and the one gather they read the graph
with (:mod:`datamask.objectives.facility_location`)."""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import torch

from .base import HostGains

__all__ = ["CoverState", "ExactCover", "graph_top2"]


@dataclass
class ExactCover:
    """The exact best and second-best cover of every document by a selection (all pairs,
    similarities clipped at 0), for the swap rounding: ``owner``/``owner2`` are the kept
    rows giving them, ``n`` where the cover is 0 (no kept row is similar); ``thin``: the
    documents with fewer than two kept rows in their graph list (compared over all pairs)."""

    keep: torch.Tensor
    best: torch.Tensor
    owner: torch.Tensor
    second: torch.Tensor
    owner2: torch.Tensor
    thin: torch.Tensor

    def value(self) -> float:
        return float(self.best.double().mean())


def graph_top2(
    idx: torch.Tensor, sim: torch.Tensor, keep: torch.Tensor, last: ExactCover | None
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """Step 1 of an exact cover: each document's two most similar kept rows in its graph
    list (``vals``, ``rows``; row n at similarity 0) and whether it is thin (fewer than
    two). From the ``last`` cover computed, only the documents whose list holds a row kept
    in one mask and not the other are read again (a bool gather, then O(K) a document):
    the others' lists, hence their top two, are unchanged. A thin document's entries are
    left as they were; step 2 (all pairs) writes them."""
    n, dev = idx.shape[0], keep.device
    m = min(2, idx.shape[1])
    docs = None
    if last is not None:
        docs = torch.nonzero(_gather(last.keep ^ keep, idx).any(1)).squeeze(1)
        if len(docs) > n // 2:  # most lists changed: one pass over all is cheaper
            docs = None
    if docs is None:
        i, s = idx, sim
    else:
        i, s = idx.index_select(0, docs), sim.index_select(0, docs)
    top = (s * _gather(keep.to(s.dtype), i)).topk(m, dim=1)
    v = torch.zeros(len(i), 2, dtype=s.dtype, device=dev)
    r = torch.full((len(i), 2), n, dtype=torch.long, device=dev)
    v[:, :m] = top.values
    r[:, :m] = torch.where(top.values > 0, i.gather(1, top.indices), n)
    if docs is None or last is None:
        return v, r, v[:, 1] <= 0
    vals = torch.stack([last.best, last.second], 1)
    rows = torch.stack([last.owner, last.owner2], 1)
    vals[docs], rows[docs] = v, r
    thin = last.thin.clone()
    thin[docs] = v[:, 1] <= 0
    return vals, rows, thin


@dataclass
class CoverState:
    """Greedy state of facility location: each document's coverage so far, and whether
    gains are counted on the K-NN graph (sparse) or on all pairs (dense)."""

    cover: torch.Tensor
    graph: bool


def _gather(
    values: torch.Tensor, idx: torch.Tensor, out: torch.Tensor | None = None
) -> torch.Tensor:
    """``values[idx]`` for a 1-D ``values`` (no gradient) and an index of any shape: the
    same entries, by ``numpy.take`` on the CPU (2x faster than ``index_select`` on one
    thread for a 56k x 160 graph, 3-5x faster than advanced indexing), by
    ``index_select`` elsewhere. ``out``: a contiguous buffer of ``idx``'s shape to write
    them into (a caller that gathers often: a fresh 36 MB block a pass faulted its pages
    in); on the CPU then numpy's "clip" mode, since its "raise" copies ``out`` through a
    buffer (12 ms against 22 at 56k x 160) and graph indices are rows, in range by
    construction (a given graph is checked when its objective is bound)."""
    if values.device.type == "cpu" and not values.requires_grad:
        if out is None:
            return torch.from_numpy(np.take(values.numpy(), idx.numpy()))
        np.take(values.numpy(), idx.numpy(), out=out.numpy(), mode="clip")
        return out
    if out is None:
        return values.index_select(0, idx.reshape(-1)).view(idx.shape)
    torch.index_select(values, 0, idx.reshape(-1), out=out.view(-1))
    return out


class _GraphGains(HostGains):
    """Facility-location gains on the reverse K-NN graph, in numpy: row j adds
    ``sum_{i lists j} max(0, sim_ij - cover_i) / n`` (summed in float64), and picking it
    raises the cover of the documents that list it."""

    def __init__(self, ptr: list[int], clients: np.ndarray, sims: np.ndarray) -> None:
        self.ptr, self.clients, self.sims = ptr, clients, sims  # ptr: python ints, read only
        self.n = len(ptr) - 1
        self.cover = np.zeros(self.n, dtype=sims.dtype)

    def gain(self, j: int) -> float:
        lo, hi = self.ptr[j], self.ptr[j + 1]
        lift = self.sims[lo:hi] - self.cover[self.clients[lo:hi]]
        return float(lift[lift > 0].sum(dtype=np.float64)) / self.n

    def update(self, j: int) -> None:
        lo, hi = self.ptr[j], self.ptr[j + 1]
        rows = self.clients[lo:hi]
        self.cover[rows] = np.maximum(self.cover[rows], self.sims[lo:hi])
