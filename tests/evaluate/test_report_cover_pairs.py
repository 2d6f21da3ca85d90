"""The pairs ``report`` shows beside a selection (dropped documents and the kept ones that
cover them), streamed from a sharded run's ``covered/`` dataset: the same as from the whole
table at once, whatever the files and batches."""

from __future__ import annotations

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq

from datamask.evaluation.browse import COVER_HIGH, COVER_LOW, _cover_pairs


def _whole(table: pa.Table) -> tuple[list, list, np.ndarray]:
    """The pairs from the whole table at once (ties by row order)."""
    t = table.filter(pa.compute.invert(table.column("selected")))
    sims = t.column("covered_sim").to_numpy()
    order = np.argsort(-sims, kind="stable")
    rows = np.concatenate([order[:COVER_HIGH], order[COVER_HIGH:][::-1][:COVER_LOW][::-1]])
    return t.column("id").take(rows).to_pylist(), t.column("by").take(rows).to_pylist(), sims[rows]


def test_streamed_pairs_equal_the_whole_tables(tmp_path):
    rng = np.random.default_rng(0)
    n = 5000
    sims = rng.choice(np.linspace(0.1, 0.9, 40), n).astype(np.float32)  # many ties
    table = pa.table(
        {
            "id": [f"d{i}" for i in range(n)],
            "selected": rng.random(n) < 0.1,
            "covered_by": [f"k{i % 97}" for i in range(n)],
            "covered_sim": sims,
        }
    )
    (tmp_path / "run" / "covered").mkdir(parents=True)
    for part, (lo, hi) in enumerate([(0, 1200), (1200, 3100), (3100, n)]):
        pq.write_table(
            table.slice(lo, hi - lo),
            tmp_path / "run" / "covered" / f"part-{part:05d}.parquet",
            row_group_size=300,  # several batches a file
        )
    ids, by, got = _cover_pairs(str(tmp_path / "run"), "id")
    want_ids, want_by, want = _whole(table.rename_columns(["id", "selected", "by", "covered_sim"]))
    assert ids.to_pylist() == want_ids and by.to_pylist() == want_by
    np.testing.assert_array_equal(got, want)
    assert _cover_pairs(str(tmp_path), "id") is None  # a folder without covered/
