"""Reading a selection back: a ``datamask select`` output, a parquet of ids or a text file
of ids, as rows of the corpus it was made from (``datamask evaluate``)."""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path
from typing import Any

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq

from .fs import expect_file

__all__ = ["SELECTION_FILES", "read_selection", "read_selection_ids", "rows_from_ids"]

#: What a one-file selection argument accepts, as refusals say it.
SELECTION_FILES = (
    "one selection file: the parquet `datamask select` writes for one input file, a "
    "parquet of ids, or a text file of ids (one per line)"
)


def rows_from_ids(data_ids: np.ndarray, chosen: Sequence[Any], where: str) -> np.ndarray:
    """Row indices of the ids ``chosen`` in ``data_ids`` (compared as strings)."""
    keys = np.asarray([str(v) for v in data_ids], dtype=object)
    index: dict[str, int] = {}
    for i, key in enumerate(keys):
        if index.setdefault(key, i) != i:
            raise ValueError(f"id {key!r} occurs more than once in the data; ids must be unique.")
    rows, missing, seen = [], [], set()
    for value in chosen:
        key = str(value)
        if key in seen:
            raise ValueError(f"id {key!r} is listed twice in {where}.")
        seen.add(key)
        row = index.get(key)
        if row is None:
            missing.append(key)
        else:
            rows.append(row)
    if missing:
        raise ValueError(
            f"{len(missing)} id{'s' if len(missing) != 1 else ''} in {where} "
            f"{'are' if len(missing) != 1 else 'is'} not in the data (first: {missing[0]!r}); "
            "was the selection made from another file, or with another --id-col?"
        )
    if not rows:
        raise ValueError(f"{where} selects no documents.")
    return np.asarray(rows, dtype=np.int64)


def read_selection_ids(
    path: str | Path, *, id_col: str = "chunk_id", what: str = "selection"
) -> pa.Array:
    """The ids a selection file keeps, as stored (strings for a text file).

    Accepts the output of ``datamask select`` (parquet with the id column and a boolean
    ``selected`` column: the ids where it is true), a parquet of ids only (every id listed
    is kept; a single-column file may name its column anything), or a text file with one
    id per line. A folder is refused, named a folder (``what`` names the argument).
    """
    p = Path(path)
    where = str(p)
    expect_file(p, what=what, accepted=SELECTION_FILES)
    if p.suffix.lower() in (".txt", ".ids", ".csv", ".tsv"):
        chosen = [line.strip() for line in p.read_text().splitlines() if line.strip()]
        if chosen and p.suffix.lower() in (".csv", ".tsv") and chosen[0] == id_col:
            chosen = chosen[1:]  # header line
        return pa.array(chosen, type=pa.string())
    try:
        table = pq.read_table(p)
    except Exception as exc:  # pyarrow raises several types for a bad file
        raise ValueError(f"cannot read selection {where!r} as parquet: {exc}") from None
    names = table.column_names
    if id_col in names:
        ids_col = table.column(id_col)
    elif len(names) == 1:
        ids_col = table.column(names[0])
    else:
        raise ValueError(
            f"column {id_col!r} not found in {where}; available columns: {names}. "
            "Pass the id column with --id-col."
        )
    if ids_col.null_count:
        raise ValueError(f"selection {where} has {ids_col.null_count} null ids.")
    ids = ids_col.combine_chunks()
    if "selected" in names:
        flags = table.column("selected")
        if not pa.types.is_boolean(flags.type):
            raise ValueError(f"column 'selected' in {where} must be boolean; got {flags.type}.")
        if flags.null_count:
            raise ValueError(f"column 'selected' in {where} has {flags.null_count} nulls.")
        ids = ids.filter(flags.combine_chunks())
    return ids


def read_selection(
    path: str | Path, data_ids: np.ndarray, *, id_col: str = "chunk_id"
) -> np.ndarray:
    """Rows of the data kept by the selection file ``path`` (any form
    :func:`read_selection_ids` reads)."""
    ids = read_selection_ids(path, id_col=id_col).to_pylist()
    return rows_from_ids(data_ids, ids, str(path))
