"""A group's prices: its greedy gain curve in the corpus' ``J`` units, by which the driver's
allocation (:mod:`.allocate`) shares one budget.

Quality is a mean over the ``k`` kept documents and facility location a mean over the ``N``
documents; a group running its objective at :func:`group_lamb` of its own ``(c_g, n_g)``
against ``(k, N)`` (:func:`group_spec`) prices both terms at the corpus' rate, times one
factor that :func:`gains_in_j_units` divides out. The group steps (the select step, the
exchange round, the token rounds) write their candidates in pick order with those gains
(:func:`gain_table`) and report :data:`KNOTS` points of the curve (:func:`gain_knots`);
only the driver allocates.
"""

from __future__ import annotations

from dataclasses import replace
from typing import Any

import numpy as np
import pyarrow as pa

from ...config import SelectSpec
from ...io.parquet import features_column
from ...objectives.combined import group_lamb
from ...pipeline.step import MODULAR

__all__ = [
    "KNOTS",
    "allocates_by_gains",
    "gain_knots",
    "gain_table",
    "gains_in_j_units",
    "group_spec",
    "monotone",
    "with_prices",
]


def allocates_by_gains(spec: SelectSpec) -> bool:
    """Whether a global budget is allocated by the groups' gain curves (no central round).

    Only where the decomposition holds: a semantic partition (``partition="cluster"``, so
    a document's neighbours are in its own group; shards of random rows each cover the
    same topics and would price the same coverage several times), every diversity term a
    per-document mean, a method that is not modular, and no similarity cap (the cap needs
    every pair of the selection in one place). Measured in ``benchmarks/scale/SHARDED.md``.
    """
    terms = spec.objective.make().diversity
    return (
        spec.partition.partition == "cluster"
        and spec.selector.method not in MODULAR
        and spec.selector.max_similarity is None
        and all(t.per_document for t in terms)
    )


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
    spec: SelectSpec, c_group: int, n_group: int, k_total: int, n_total: int
) -> SelectSpec:
    """The settings a proposing group runs with: the objective at :func:`group_lamb`."""
    lamb_g = group_lamb(spec.objective.lamb, c_group, n_group, k_total, n_total)
    return replace(spec, objective=replace(spec.objective, lamb=lamb_g))


#: Knots per gain curve a group reports in its completion marker: the allocation reads
#: O(groups x KNOTS) numbers, then only the gains near the threshold.
KNOTS = 32


def monotone(gains: np.ndarray) -> np.ndarray:
    """A greedy gain curve made non-increasing: exact for a submodular objective, and where
    float rounding breaks it by a hair, the running minimum (so every kept set is a prefix)."""
    return np.minimum.accumulate(np.asarray(gains, dtype=np.float64))


def gain_knots(gains: np.ndarray, lo: int = 0, n_knots: int = KNOTS) -> tuple[np.ndarray, ...]:
    """Positions (from ``lo``, first and last included) and values of ``n_knots`` evenly
    spaced points of a non-increasing curve ``gains``: what a group reports of its curve.

    >>> pos, val = gain_knots(np.array([5.0, 4.0, 3.0, 2.0, 1.0]), n_knots=3)
    >>> pos.tolist(), val.tolist()
    ([0, 2, 4], [5.0, 3.0, 1.0])
    """
    c = len(gains)
    if c == 0:
        return np.zeros(0, np.int64), np.zeros(0, np.float64)
    at = np.unique(np.linspace(0, c - 1, min(c, n_knots)).round().astype(np.int64))
    return at + lo, np.asarray(gains, dtype=np.float64)[at]


def gain_table(
    ids: pa.Array,
    order: np.ndarray,
    gid: int,
    logits: Any,
    gains: np.ndarray,
    features: np.ndarray,
    id_col: str,
) -> pa.Table:
    """A group's candidates in pick order: id, group, rank, logit, gain in J units, and the
    embedding (``features``: the group's rows, unit length once ``check_corpus`` has run;
    what the exchange round's neighbours read of the kept prefix)."""
    return pa.table(
        {
            id_col: ids.take(pa.array(order)),
            "group": pa.array(np.full(len(order), gid, dtype=np.int32)),
            "rank": pa.array(np.arange(1, len(order) + 1, dtype=np.int64)),
            "logit": pa.array(np.asarray(logits, np.float32)[order]),
            "gain": pa.array(np.asarray(gains, dtype=np.float64)),
            "features": features_column(features[order]),
        }
    )


def with_prices(table: pa.Table, gains: np.ndarray, lengths: np.ndarray) -> pa.Table:
    """A token budget's candidates (``table``, :func:`gain_table`'s, in pick order) with
    each one's ``length`` (``lengths``, in that order) and ``price``: its gain per token,
    made non-increasing (:func:`monotone`), what the allocation by gains per token reads."""
    lengths = np.asarray(lengths, dtype=np.float64)
    price = monotone(np.asarray(gains, np.float64) / lengths)
    return table.append_column("length", pa.array(lengths)).append_column("price", pa.array(price))
