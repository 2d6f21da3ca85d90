"""One budget across groups by equal marginal gains: the global budget without a central round.

Quality is a mean over the ``k`` kept documents and facility location a mean over the ``N``
documents, so when each document's neighbours sit in its own group, ``J`` over the corpus
is a sum of the groups' shares::

    J(S) = sum_g [ lamb * sum_{j in S_g} q_j / k  +  (1 - lamb) * sum_{i in g} cover(i, S_g) / N ]

A group cannot see ``k`` and ``N`` of the others' choices, but it can price its own:

1. **Propose.** Group ``g`` (``n_g`` rows) selects ``c_g = ceil(oversample * k * n_g / N)``
   candidates with its method and the objective at the *global exchange rate* between
   quality and coverage (:func:`group_lamb`), then orders them by lazy greedy on its graph,
   coverage counted over every document of the group
   (:func:`datamask.greedy.lazy.gain_order`), and writes their marginal gains in ``J``
   units (:func:`gains_in_j_units`): a non-increasing curve of ``c_g`` numbers.
2. **Allocate.** One threshold, the ``k``-th largest gain over every group (ties: the lower
   group, then the earlier pick), gives group ``g`` the ``m_g`` gains above it
   (:func:`allocate`): the allocation that equalises marginal gains, i.e. one Lagrange
   price of the budget shared by every group; optimal for concave gain curves.
3. **Write.** Each group keeps the first ``m_g`` rows of its order.

Only ``c_g`` numbers per group cross groups; no process holds another group's rows. The
objective must be quality plus per-document terms (:attr:`Term.per_document`); other
objectives (pairwise similarity, DiSF, user terms that do not declare it) keep the
central round over the union of the candidates.
"""

from __future__ import annotations

import json
import math
import time
from dataclasses import replace
from pathlib import Path
from typing import Any

import numpy as np
import pyarrow as pa

from .._memory import peak_rss_mb
from ..config import SelectSpec
from ..io.atomic import atomic_write_json
from ..io.parquet import atomic_write_table, read_table
from ..pipeline.step import MODULAR

__all__ = [
    "allocate",
    "allocate_global",
    "allocates_by_gains",
    "gains_in_j_units",
    "group_lamb",
    "group_spec",
]


def allocates_by_gains(settings: SelectSpec) -> bool:
    """Whether a global budget is allocated by the groups' gain curves (no central round):
    every diversity term is a per-document mean, the method is not modular, and no
    similarity cap is set (the cap needs every pair of the selection in one place)."""
    terms = settings.objective.make().diversity
    return (
        settings.selector.method not in MODULAR
        and settings.selector.max_similarity is None
        and all(t.per_document for t in terms)
    )


def group_lamb(lamb: float, c_group: int, n_group: int, k_total: int, n_total: int) -> float:
    """The ``lamb`` at which a group selecting ``c_group`` of its ``n_group`` rows trades
    quality against coverage at the corpus' rate.

    Quality is a mean over the selection and coverage over the documents, so a unit of
    quality is worth ``lamb / k`` and a unit of coverage ``(1 - lamb) / N`` in the corpus'
    ``J``, and ``lamb_g / c_g`` against ``(1 - lamb_g) / n_g`` in the group's. Equal ratios
    give ``lamb_g / (1 - lamb_g) = lamb / (1 - lamb) * (N / k) * (c_g / n_g)``.

    Examples
    --------
    A group proposing twice its proportional share counts quality twice as much:

    >>> round(group_lamb(0.5, 200, 1000, 1000, 10_000), 4)
    0.6667
    >>> group_lamb(0.5, 100, 1000, 1000, 10_000)
    0.5
    """
    if lamb in (0.0, 1.0):
        return float(lamb)
    odds = lamb / (1.0 - lamb) * (n_total / k_total) * (c_group / n_group)
    return odds / (1.0 + odds)


def gains_in_j_units(
    gains: np.ndarray,
    lamb: float,
    lamb_g: float,
    c_group: int,
    n_group: int,
    k_total: int,
    n_total: int,
) -> np.ndarray:
    """A group's marginal gains (its objective at ``lamb_g``, ``c_group`` of ``n_group``)
    expressed in the corpus' ``J``.

    At :func:`group_lamb`'s rate both terms of the group's objective are the corpus' times
    one factor: ``lamb_g / c_g = alpha * lamb / k`` and ``(1 - lamb_g) / n_g = alpha *
    (1 - lamb) / N``.
    """
    if lamb > 0:
        alpha = (lamb_g / c_group) / (lamb / k_total)
    else:
        alpha = ((1.0 - lamb_g) / n_group) / ((1.0 - lamb) / n_total)
    return np.asarray(gains, dtype=np.float64) / alpha


def group_spec(
    settings: SelectSpec, c_group: int, n_group: int, k_total: int, n_total: int
) -> SelectSpec:
    """The settings a proposing group runs with: the objective at :func:`group_lamb`."""
    lamb_g = group_lamb(settings.objective.lamb, c_group, n_group, k_total, n_total)
    return replace(settings, objective=replace(settings.objective, lamb=lamb_g))


def allocate(gains: list[np.ndarray], k_total: int) -> tuple[np.ndarray, float, list[np.ndarray]]:
    """How many of each group's ordered candidates to keep: the ``k_total`` largest gains
    over all groups (ties: the lower group, then the earlier pick).

    Returns ``(counts, threshold, ranks)``: ``counts[g]`` the rows group ``g`` keeps,
    ``threshold`` the smallest gain kept, and ``ranks[g]`` the global ranks (1 = the
    largest gain) of the group's kept rows, for its first ``counts[g]`` rows in order.
    Each group keeps a prefix of its order: its gains do not increase (a greedy order of
    a submodular objective), and where rounding breaks that by a hair, the count still
    says how many to keep.

    Examples
    --------
    >>> counts, t, ranks = allocate([np.array([0.5, 0.2, 0.1]), np.array([0.4, 0.3])], 3)
    >>> counts.tolist(), t, [r.tolist() for r in ranks]
    ([1, 2], 0.3, [[1], [2, 3]])
    """
    sizes = [len(g) for g in gains]
    total = sum(sizes)
    if not 0 <= k_total <= total:
        raise ValueError(f"k_total must be in [0, {total}] (the candidates); got {k_total}.")
    values = np.concatenate([np.asarray(g, dtype=np.float64) for g in gains] or [np.zeros(0)])
    group = np.repeat(np.arange(len(gains)), sizes)
    position = np.concatenate([np.arange(s) for s in sizes] or [np.zeros(0, np.int64)])
    chosen = np.lexsort((position, group, -values))[:k_total]
    counts = np.bincount(group[chosen], minlength=len(gains)).astype(np.int64)
    rank = np.arange(1, k_total + 1, dtype=np.int64)
    ranks = [np.sort(rank[group[chosen] == g]) for g in range(len(gains))]
    threshold = float(values[chosen[-1]]) if k_total else math.inf
    return counts, threshold, ranks


def allocate_global(
    groups: list[Any],
    settings: SelectSpec,
    work_dir: str | Path,
    out_dir: str | Path,
    k_total: int,
    part_path: Any,
    candidates_path: Any,
) -> dict[str, Any]:
    """Steps 2 and 3: the threshold over every group's gain curve, then each group's kept
    prefix written as ``OUT/selected/part-NNNNN.parquet``, then the marker
    ``WORK/completions/global``. Reads one column of each candidates file for the
    threshold and one group's candidates at a time for the parts; resumable like a group.
    """
    marker = Path(work_dir) / "completions" / "global"
    if marker.exists():
        return {**json.loads(marker.read_text()), "reused": True}
    started = time.perf_counter()
    gains = [
        read_table(candidates_path(work_dir, g.gid), columns=["gain"]).column(0).to_numpy()
        for g in groups
    ]
    counts, threshold, ranks = allocate(gains, k_total)
    n_candidates = int(sum(len(g) for g in gains))
    estimate = float(sum(g[: int(m)].sum() for g, m in zip(gains, counts, strict=True)))
    del gains
    allocate_s = time.perf_counter() - started
    id_col = settings.columns.id_col
    for g, m, rank in zip(groups, counts, ranks, strict=True):
        table = read_table(candidates_path(work_dir, g.gid)).slice(0, int(m))
        part = pa.table(  # the columns of every selected part
            {
                id_col: table.column(id_col),
                "group": table.column("group"),
                "rank": pa.array(rank),
                "logit": table.column("logit"),
            }
        )
        atomic_write_table(part, part_path(out_dir, g.gid))
    total_s = time.perf_counter() - started
    stats = {
        "mode": "allocate",
        "n_candidates": n_candidates,
        "k": int(counts.sum()),
        "threshold": threshold,
        "kept_per_group": counts.tolist(),
        # J of the selection as the groups priced it: every document covered within its
        # own group, on the graph; the exact J over the corpus is what `evaluate` computes.
        "terms": {"J_groups": estimate},
        "seconds": {"allocate": allocate_s, "write": total_s - allocate_s, "total": total_s},
        "peak_rss_mb": peak_rss_mb(),
    }
    atomic_write_json(stats, marker)
    return {**stats, "reused": False}
