"""A group's neighbour graph on disk (``WORK/graphs/NNNNN.npz``): written by the group's
select step, read by the exchange round and by the group's cover step, its last reader,
which deletes it."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import numpy as np
import torch

from ...data import Corpus
from ...io.atomic import atomic_write
from ...io.fs import open_whole
from ...pipeline.step import facility_graph

__all__ = ["keep_for_cover", "save_graph", "saved_graph"]


def saved_graph(path: Path) -> tuple[torch.Tensor, torch.Tensor] | None:
    """The graph :func:`save_graph` wrote to ``path``, if it is there."""
    try:
        with open_whole(path) as fh, np.load(fh) as saved:
            return torch.from_numpy(saved["indices"]).long(), torch.from_numpy(saved["sims"])
    except FileNotFoundError:
        return None


def save_graph(graph: tuple[Any, Any], path: Path) -> None:
    """Write a (indices, sims) graph to ``path`` atomically (uncompressed npz)."""
    idx, sim = graph
    with atomic_write(path) as tmp, open(tmp, "wb") as f:
        np.savez(
            f,
            indices=idx.cpu().numpy().astype(np.int32),
            sims=sim.cpu().numpy().astype(np.float32, copy=False),
        )


def keep_for_cover(job: Any, corpus: Corpus, objective: Any) -> None:
    """Save the group's graph for its cover step, which then reads each row's nearest kept
    row of the group from it and searches only the rows whose neighbours hold none,
    instead of every row against the group's kept rows (a 1M-row group on an H200: a cover
    of 21.9 s). For every group whose graph no other step saves: one group, ``--budget
    group``, the central round's proposals, token budgets; a group allocated by gains
    under a document budget saves it itself, for the exchange round too
    (:func:`~.steps._propose_by_gains`). Not with ``--given`` (the cover does not read the
    graph then), nor without a cover (``selected_only``), nor where no selector ran
    (``objective`` None: the group keeps none of its rows or all of them, and built no
    graph)."""
    spec = job.spec
    if spec.run.selected_only or spec.selector.given is not None:
        return
    if job.tokens is None and job.propose and job.totals is not None:
        return  # allocated by gains: its select step saves the graph with its candidates
    graph = None if objective is None or not corpus.n_docs else facility_graph(objective)
    if graph is not None:
        save_graph(graph, job.dirs.graph(job.group.gid))
