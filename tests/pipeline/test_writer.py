"""The selection table the pipeline writes: kept flags, ranks, and its atomic write."""

from __future__ import annotations

import numpy as np
import pyarrow.parquet as pq

from datamask.data import Selection
from datamask.io.parquet import atomic_write_table
from datamask.pipeline import selection_table


def test_selection_table_ranks_and_atomic_write(tmp_path):
    ids = np.array(["c", "a", "b", "d"], dtype=object)
    sel = Selection(
        np.array([0, 2]),
        np.array([3.0, 1.0, 2.0, 0.5]),
        ids=ids,
        probabilities=np.array([0.9, 0.1, 0.6, 0.05]),
    )
    table = selection_table(sel, id_col="chunk_id")
    assert table.column("selected").to_pylist() == [True, False, True, False]
    assert table.column("rank").to_pylist() == [1, 3, 2, 4]
    only = selection_table(sel, id_col="chunk_id", kept_only=True, logit=False)
    assert only.column("chunk_id").to_pylist() == ["c", "b"]
    out = tmp_path / "sub" / "sel.parquet"
    atomic_write_table(table, out)
    assert pq.read_table(out).equals(table)
    assert not (tmp_path / "sub" / "sel.parquet.tmp").exists()
