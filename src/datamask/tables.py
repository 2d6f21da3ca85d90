"""Select from an in-memory table: a pyarrow Table, a ``datasets.Dataset`` or a DataFrame.

The answer is one row per input row, in the input's order, so it feeds
``Dataset.select`` directly::

    from datamask import select_table
    sel = select_table(ds, preset="fineweb-edu", select_ratio=0.1)
    kept = ds.select(sel.filter(sel["selected"])["row"].to_pylist())
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import numpy as np
import pyarrow as pa

from .data import Corpus
from .greedy import make_selector
from .io.parquet import arrays_from_table, selection_table
from .objectives import Objective, make_diversity
from .presets import resolve_columns

__all__ = ["select_table"]


def _as_arrow(data: Any, columns: Sequence[str] | None) -> pa.Table:
    """``data`` as a pyarrow Table (only ``columns`` when given), respecting row order."""
    if isinstance(data, pa.Table):
        return data if columns is None else data.select(list(columns))
    if isinstance(data, pa.RecordBatch):
        return _as_arrow(pa.Table.from_batches([data]), columns)
    if hasattr(data, "with_format") and hasattr(data, "select_columns"):  # datasets.Dataset
        if columns is not None:
            data = data.select_columns(list(columns))
        # The arrow formatter honours an indices mapping (after .select / .shuffle), which
        # the raw ``.data`` table does not.
        return data.with_format("arrow")[:]
    if hasattr(data, "with_format") and hasattr(data, "iter"):  # datasets.IterableDataset
        raise TypeError(
            "select_table needs all rows at once; got a streaming IterableDataset. "
            "Load it as a Dataset, or write it to parquet and use `datamask select`."
        )
    if hasattr(data, "to_dict") and hasattr(data, "columns"):  # pandas.DataFrame
        frame = data if columns is None else data[list(columns)]
        return pa.Table.from_pandas(frame, preserve_index=False)
    raise TypeError(
        "data must be a pyarrow.Table, a datasets.Dataset or a pandas.DataFrame; "
        f"got {type(data).__name__}."
    )


def _column_names(data: Any) -> list[str]:
    if isinstance(data, pa.Table | pa.RecordBatch):
        return list(data.schema.names)
    names = getattr(data, "column_names", None)
    if names is None:
        names = getattr(data, "columns", None)
    if names is None:
        return list(_as_arrow(data, None).schema.names)
    return [str(c) for c in names]


def select_table(
    data: Any,
    *,
    select_ratio: float = 0.3,
    lamb: float = 0.5,
    method: str = "mask",
    algorithm: str | Sequence[str] = "Facility",
    preset: str | None = None,
    id_col: str | None = None,
    quality_col: str | Sequence[str] | None = None,
    quality_weights: Sequence[float] | None = None,
    feature_col: str | None = None,
    seed: int = 0,
    device: str = "auto",
    max_similarity: float | None = None,
    progress: bool = False,
    **params: Any,
) -> pa.Table:
    """Select ``round(select_ratio * n)`` rows of a table; one answer row per input row.

    Parameters
    ----------
    data : pyarrow.Table, datasets.Dataset or pandas.DataFrame
        Rows with an id column (optional), one or more quality columns and an embedding
        column (list or fixed-size list of floats). Only those columns are read.
    select_ratio : float, default=0.3
        Fraction of rows kept, in (0, 1].
    lamb : float, default=0.5
        Weight of quality against diversity, in [0, 1].
    method : str, default="mask"
        A selector of :data:`datamask.greedy.SELECTORS` (``mask``, ``greedy``, ``topk``, ...).
    algorithm : str or sequence of str, default="Facility"
        Diversity term(s): ``Facility``, ``Pair_simi``, ``DiSF``.
    preset : {"datamask", "fineweb-edu", "curator", "auto"}, optional
        Column names of a known layout (see :mod:`datamask.presets`); None detects them.
    id_col, quality_col, feature_col : str, optional
        Explicit column names (they win over the preset). Without an id column the row
        numbers are the ids.
    quality_weights : sequence of float, optional
        Weights of several quality columns (default equal).
    seed : int, default=0
    device : str, default="auto"
    max_similarity : float, optional
        Hard cap on the cosine similarity of any two selected rows.
    progress : bool, default=False
    **params
        Further selector arguments (``n_epochs``, ``refine``, ...).

    Returns
    -------
    pyarrow.Table
        One row per input row, in input order: the id column (or ``row`` alone),
        ``row`` (int64 position in ``data``), ``selected`` (bool), ``logit``,
        ``probability`` (mask learner only) and ``rank`` (1 = best).
        ``data.select(table.filter(table["selected"])["row"].to_pylist())`` keeps the
        selection.

    Raises
    ------
    ValueError
        For a missing column, null ids or embeddings, or an invalid setting.
    TypeError
        For an unsupported ``data`` type.
    """

    names = _column_names(data)
    qcols = [quality_col] if isinstance(quality_col, str) else quality_col
    id_col, qcols, feature_col = resolve_columns(
        names,
        preset=preset,
        id_col=id_col,
        quality_cols=qcols,
        feature_col=feature_col,
        where="data",
    )
    for name in [c for c in (id_col, *qcols, feature_col) if c is not None]:
        if name not in names:
            raise ValueError(f"column {name!r} not found in data; available columns: {names}.")
    wanted = list(dict.fromkeys([c for c in (id_col, *qcols, feature_col) if c is not None]))
    table = _as_arrow(data, wanted)
    if table.num_rows == 0:
        raise ValueError("data has no rows.")
    rows = np.arange(table.num_rows, dtype=np.int64)
    if id_col is None:
        table = table.append_column("row", pa.array(rows))
    ids, quality, features = arrays_from_table(
        table,
        "data",
        id_col=id_col or "row",
        quality_cols=qcols,
        feature_col=feature_col,
    )
    corpus = Corpus(
        ids=ids.to_numpy(zero_copy_only=False),
        quality=quality,
        features=features,
        quality_names=list(qcols),
        quality_weights=None if quality_weights is None else np.asarray(quality_weights, float),
        source="data",
    )
    algorithms = [algorithm] if isinstance(algorithm, str) else list(algorithm)
    objective = Objective([make_diversity(a) for a in algorithms], lamb=lamb)
    selector = make_selector(
        method,
        objective=objective,
        select_ratio=select_ratio,
        seed=seed,
        device=device,
        progress=progress,
        max_similarity=max_similarity,
        **params,
    ).fit(corpus)
    out = selection_table(
        corpus.ids,
        selector.selected_,
        selector.scores_,
        getattr(selector, "probabilities_", None),
        id_col=id_col or "row",
    )
    if id_col is None:
        return out
    return out.add_column(1, "row", pa.array(rows))
