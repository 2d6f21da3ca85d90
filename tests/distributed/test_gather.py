"""Rows to groups through storage: one gathered object per cluster group (issue 30).

Real parquet shards and the runner's own plan phase (fit, spill, plan from the leaves'
totals, one gather step per group) on a local runner; no selection runs here.
"""

from __future__ import annotations

import json

import numpy as np
import pyarrow.parquet as pq
import pytest

from datamask import make_clustered
from datamask.config import SelectSpec
from datamask.distributed import LocalRunner
from datamask.distributed.gather import SHARD_COLUMN, group_object_path
from datamask.distributed.partition import ROW_COLUMN, Piece, part_rows, split_across
from datamask.distributed.plan import plan_partition
from datamask.io.shards import inspect_shards, list_shards
from tests._data import write_corpus_shards


@pytest.mark.parametrize("n, parts", [(7, 3), (1000, 7), (5, 5), (12, 1)])
def test_part_rows_are_the_sizes_split_across_cuts(n, parts):
    """The driver sizes a cut leaf's parts without its pieces; the step cuts the pieces."""
    rng = np.random.default_rng(n)
    cuts = np.sort(rng.choice(np.arange(1, n), size=min(3, n - 1), replace=False))
    bounds = [0, *cuts.tolist(), n]
    pieces = [
        Piece(f"s{i}", 0, b - a)
        for i, (a, b) in enumerate(zip(bounds[:-1], bounds[1:], strict=True))
    ]
    max_rows = -(-n // parts)  # ceil: split_across makes ceil(n / max_rows) parts
    made = split_across(pieces, max_rows)
    assert [sum(p.n for p in part) for part in made] == part_rows(n, len(made))
    assert sum(part_rows(n, parts)) == n


def plan(shards, work, **partition):
    columns = dict(id_col="chunk_id", quality_cols=("quality_score",), feature_col="feature_arr")
    settings = SelectSpec.from_mapping(dict(partition="cluster", **columns, **partition))
    infos = inspect_shards(list_shards(shards), columns=settings.read_columns)
    runner = LocalRunner(workers=1)
    try:
        return plan_partition(infos, settings, work, runner, progress=False)[0]
    finally:
        runner.close()


def test_every_group_is_one_object_that_knows_each_rows_shard_and_row(tmp_path):
    """Clusters split (a 40-row sample: leaves too large, cut across their axis): every group is ONE
    object of exactly its planned rows, and each row's (shard, row) points at that same
    row of the input shard; together the groups hold every row once."""
    corpus = make_clustered(1200, 16, 5, seed=0)
    files = write_corpus_shards(tmp_path / "in", corpus, 4)
    groups = plan(
        tmp_path / "in", tmp_path / "work", n_clusters=2, chunk_size=150, kmeans_sample=40
    )
    inputs = [pq.read_table(f, columns=["chunk_id"]).column(0).to_pylist() for f in files]
    seen: list[str] = []
    for gid, (label, pieces) in enumerate(groups):
        assert len(pieces) == 1, label
        (piece,) = pieces
        assert piece.path == str(group_object_path(tmp_path / "work", gid))
        table = pq.read_table(piece.path)
        assert table.num_rows == piece.n <= 150
        ids = table.column("chunk_id").to_pylist()
        shard = table.column(SHARD_COLUMN).to_pylist()
        row = table.column(ROW_COLUMN).to_pylist()
        assert ids == [inputs[s][r] for s, r in zip(shard, row, strict=True)]
        seen += ids
    assert sorted(seen) == sorted(i for shard in inputs for i in shard)
    assert any("part" in label for label, _ in groups)  # cuts were gathered too


def test_gather_resumes_only_the_groups_without_a_marker(tmp_path):
    corpus = make_clustered(900, 16, 4, seed=1)
    write_corpus_shards(tmp_path / "in", corpus, 3)
    work = tmp_path / "work"
    first = plan(tmp_path / "in", work, chunk_size=200)
    assert len(first) > 2
    made = {gid: group_object_path(work, gid).read_bytes() for gid in range(len(first))}
    stamps = {gid: group_object_path(work, gid).stat().st_mtime_ns for gid in made}
    marker = group_object_path(work, 1).with_suffix(".json")
    assert json.loads(marker.read_text())["n"] == first[1][1][0].n
    marker.unlink()  # group 1's object written, its marker lost: it is gathered again
    again = plan(tmp_path / "in", work, chunk_size=200)
    assert again == first
    for gid, data in made.items():
        assert group_object_path(work, gid).read_bytes() == data
        redone = group_object_path(work, gid).stat().st_mtime_ns != stamps[gid]
        assert redone == (gid == 1)
