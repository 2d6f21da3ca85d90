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
from ...objectives.facility_location import facility_term
from ...pipeline.step import facility_graph

__all__ = ["keep_graph", "save_graph", "saved_graph"]


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


def keep_graph(job: Any, corpus: Corpus, objective: Any) -> None:
    """Save the group's graph (``WORK/graphs/NNNNN.npz``) for the steps after the group's
    own that read it, where one will: the exchange round (a group allocated by gains, with
    ``--exchange-neighbors`` above 0), and the group's cover step,
    which reads each row's nearest kept row of the group from it and searches only the
    rows whose neighbours hold none, instead of every row against the group's kept rows (a
    1M-row group on an H200: a cover of 21.9 s). The cover does not read it with
    ``--given``, nor runs with ``selected_only``. Nothing is saved where no selector ran
    (``objective`` None: the group keeps none of its rows or all of them, and built no
    graph). Stored as the cosines (clipped at 0): a token budget's weights are not in it."""
    spec = job.spec
    by_gains = job.propose and job.totals is not None  # a document or a token budget
    exchange = by_gains and spec.partition.exchange_neighbors > 0
    cover = not spec.run.selected_only and spec.selector.given is None
    graph = None if objective is None or not corpus.n_docs else facility_graph(objective)
    if graph is None or not (exchange or cover):
        return
    idx, sim = graph
    weights = facility_term(objective).weights_
    if weights is not None:  # a token budget: the rows are w_i max(s, 0); stored as s,
        # which binding weighs again (not twice)
        sim = sim / weights.to(sim)[:, None]
    if corpus.floor is not None:  # given KEPT: the graph was raised by the floor in place;
        # store max(sim, floor), which the exchange round, binding it with the same floor,
        # raises back to max(0, sim - floor) (not twice)
        sim = sim + torch.from_numpy(corpus.floor).to(sim)[:, None]
    save_graph((idx, sim), job.dirs.graph(job.group.gid))
