"""The one writer: a :class:`~datamask.data.Selection` as a table, and the run's record.

Every table a selection is written as comes from :func:`selection_table`, which owns the
ranking (:meth:`Selection.rank`) and the column order: the id as stored, then ``group``
(sharded runs), ``selected``, ``logit``, ``probability``, ``rank``, and where the
selection found every row's nearest kept row (``meta["cover"]``) ``covered_by``,
``covered_sim`` and ``covered_exact`` (:func:`cover_columns`). ``kept_only`` writes the
kept rows alone, best first (id, group, rank, logit). :func:`run_record` is the part
every summary and manifest shares: settings, method, counts, terms, versions.
"""

from __future__ import annotations

import platform
from typing import Any

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from .._version import __version__
from ..config import SelectSpec
from ..coverage import Cover
from ..data import Selection
from ..settings import warn_ignored_settings

__all__ = [
    "COVER_COLUMNS",
    "cover_columns",
    "cover_summary",
    "run_record",
    "selection_table",
    "versions",
]

#: The traceability columns every selection output carries (docs/incremental.md).
COVER_COLUMNS = ("covered_by", "covered_sim", "covered_exact")


def cover_columns(
    cover: Cover, kept_ids: pa.Array, external_ids: pa.Array | None = None
) -> dict[str, pa.Array]:
    """``covered_by`` (the nearest kept row's id, typed as ``kept_ids``; null where
    nothing is kept), ``covered_sim`` (float32 cosine) and ``covered_exact`` (bool) of a
    :class:`~datamask.coverage.Cover` whose ``index`` points into ``kept_ids``, or into
    ``external_ids`` where ``cover.external`` (the floor won)."""
    index = np.asarray(cover.index, dtype=np.int64)
    external = np.asarray(cover.external, dtype=bool)
    if external_ids is None and external.any():
        raise ValueError("the cover names rows held elsewhere; give their external_ids.")
    by = pa.nulls(len(index), type=kept_ids.type)
    for source, rows in ((kept_ids, ~external & (index >= 0)), (external_ids, external)):
        if rows.any():
            taken = source.take(pa.array(np.where(rows, index, 0))).cast(kept_ids.type)
            by = pc.if_else(pa.array(rows), taken, by)
    return {
        "covered_by": by,
        "covered_sim": pa.array(np.asarray(cover.sim, dtype=np.float32)),
        "covered_exact": pa.array(np.asarray(cover.exact, dtype=bool)),
    }


def cover_summary(cover: Cover, seconds: float | None = None) -> dict[str, Any]:
    """What a summary or manifest says of the cover: rows per route, how many are exact."""
    return {
        "columns": list(COVER_COLUMNS),
        "rows": len(cover.index),
        "exact": int(np.count_nonzero(cover.exact)),
        "approximate": int(len(cover.exact) - np.count_nonzero(cover.exact)),
        "routes": dict(cover.counts),
        "seconds": seconds,
    }


def selection_table(
    selection: Selection,
    *,
    id_col: str,
    stored_ids: pa.Array | None = None,
    group: int | pa.Array | None = None,
    kept_only: bool = False,
    logit: bool = True,
    probability: bool | None = None,
    extra: dict[str, Any] | None = None,
    cover_external_ids: pa.Array | None = None,
) -> pa.Table:
    """The rows of a selection as a table.

    Parameters
    ----------
    selection : Selection
    id_col : str
        Name of the id column.
    stored_ids : pyarrow.Array, optional
        The ids as read (written back unchanged); default ``selection.ids``.
    group : int or pyarrow.Array, optional
        Adds a ``group`` column: this group's number, or one per row (sharded runs).
    kept_only : bool, default=False
        Only the kept rows, best first.
    logit : bool, default=True
        The ``logit`` column: the learner's final logits, else the method's scores (the
        ``rank`` column is the order either way).
    probability : bool, optional
        The ``probability`` column: the learner's keep-probabilities, else the keep-mask.
        Default: when the method has probabilities.
    extra : dict, optional
        More columns over every row, taken like the others (``kept_only`` picks rows).
    cover_external_ids : pyarrow.Array, optional
        The ids of the rows a cover's floor names (``--given``: KEPT's corpus), for
        :func:`cover_columns`.
    """
    ids = stored_ids if stored_ids is not None else pa.array(selection.ids)
    mask = selection.mask()
    rank = selection.rank()
    logits = selection.logits if selection.logits is not None else selection.scores
    probabilities = selection.probabilities
    if probability is None:
        probability = probabilities is not None
    if probabilities is None:
        probabilities = mask.astype(np.float32)
    if kept_only:
        rows = np.flatnonzero(mask)
        rows = rows[np.argsort(rank[rows])]
    else:
        rows = None
    take = (lambda a: a) if rows is None else (lambda a: a[rows])
    cols: dict[str, Any] = {id_col: ids if rows is None else ids.take(pa.array(rows))}
    if isinstance(group, pa.Array | pa.ChunkedArray):
        cols["group"] = _take(group, rows) if rows is not None else group
    elif group is not None:
        cols["group"] = pa.array(np.full(len(take(mask)), group, dtype=np.int32))
    if kept_only:
        cols["rank"] = pa.array(take(rank))
        if logit:
            cols["logit"] = pa.array(take(np.asarray(logits, dtype=np.float32)))
    else:
        cols["selected"] = pa.array(mask)
        if logit:
            cols["logit"] = pa.array(np.asarray(logits, dtype=np.float32))
        if probability:
            cols["probability"] = pa.array(np.asarray(probabilities, dtype=np.float32))
        cols["rank"] = pa.array(rank)
    cover = None if kept_only else selection.meta.get("cover")  # kept rows cover themselves
    for name, values in {
        **(cover_columns(cover, ids, cover_external_ids) if cover is not None else {}),
        **(extra or {}),
    }.items():
        cols[name] = values if rows is None else _take(values, rows)
    return pa.table(cols)


def _take(values: Any, rows: np.ndarray) -> Any:
    if isinstance(values, pa.Array | pa.ChunkedArray):
        return values.take(pa.array(rows))
    return pa.array(np.asarray(values)[rows])


def versions() -> dict[str, str]:
    """Versions of datamask and the libraries that decide its numbers."""
    import pyarrow
    import torch

    return {
        "datamask": __version__,
        "torch": torch.__version__,
        "numpy": np.__version__,
        "pyarrow": pyarrow.__version__,
        "python": platform.python_version(),
    }


def run_record(
    spec: SelectSpec, *, n_docs: int, k: int, terms: dict[str, float] | None, sharded: bool
) -> dict[str, Any]:
    """The keys every summary (one file) and manifest (shards) starts with.

    ``settings`` holds what the run read: a setting given that this run ignores
    (:meth:`~datamask.config.SelectSpec.ignored`) is not recorded as used; it is listed
    under ``ignored_settings`` with why (a key present only when there is one)."""
    settings = spec.flat()
    ignored = spec.ignored(sharded)
    record: dict[str, Any] = {
        "n_docs": int(n_docs),
        "k": int(k),
        "method": spec.selector.method,
        "terms": {key: float(v) for key, v in (terms or {}).items()},
        "settings": {key: v for key, v in settings.items() if key not in ignored},
    }
    if ignored:
        record["ignored_settings"] = {
            key: {"value": settings[key], "why": why} for key, why in ignored.items()
        }
    record["versions"] = versions()
    return record


def warn_ignored(spec: SelectSpec, sharded: bool) -> None:
    """Warn, once at the door, of each setting given that this run does not read."""
    warn_ignored_settings(spec.ignored(sharded), spec.flat(), stacklevel=4)
