"""Rows to groups through storage: one gathered object per cluster group (issue 30).

Real parquet shards and the runner's own plan phase (fit, spill, plan from the leaves'
totals, gather steps over buckets of groups) on a local runner; no selection runs here.
"""

from __future__ import annotations

import json
import tracemalloc
from pathlib import Path

import numpy as np
import pyarrow.parquet as pq
import pytest

from datamask import make_clustered
from datamask.config import SelectSpec
from datamask.distributed import LocalRunner, execute
from datamask.distributed.paths import WorkDir
from datamask.distributed.plan import gather
from datamask.distributed.plan.gather import (
    SHARD_COLUMN,
    IndexJob,
    IndexSpills,
    index_spills,
    unit_pieces,
)
from datamask.distributed.plan.partition import ROW_COLUMN, Piece, part_rows, split_across
from datamask.distributed.plan.plan import check_disk, disk_needed, plan_partition
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


def dirs_of(work):
    """The places of a run whose work dir is ``work``."""
    return WorkDir.of(work.parent / "out", work)


def plan(shards, work, **partition):
    columns = dict(id_col="chunk_id", quality_cols=("quality_score",), feature_col="feature_arr")
    settings = SelectSpec.from_mapping(dict(partition="cluster", **columns, **partition))
    infos = inspect_shards(list_shards(shards), columns=settings.read_columns)
    runner = LocalRunner(workers=1)
    try:
        return plan_partition(infos, settings, dirs_of(work), runner, progress=False)[0]
    finally:
        runner.close()


def test_the_spill_markers_are_found_by_the_name_they_are_written_under(tmp_path):
    """The index step lists the spills by their markers' names: every shard number comes
    back, and the other files of the folder (the index, temporaries) are not shards."""
    dirs = WorkDir.of(tmp_path / "out")
    folder = dirs.clusters()
    folder.mkdir(parents=True)
    for shard in (0, 7, 123_456):
        dirs.spill_marker(shard).write_text("{}")
    others = ("offsets.json", "shard-00001.json.tmp", "shard-.json", "shard-\u00b2.json", "x.json")
    for other in others:
        (folder / other).write_text("{}")
    assert gather._spilled_shards(dirs) == [0, 7, 123_456]


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
        assert piece.path == str(dirs_of(tmp_path / "work").group_object(gid))
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
    made = {gid: pq.read_table(dirs_of(work).group_object(gid)) for gid in range(len(first))}
    stamps = {gid: dirs_of(work).group_object(gid).stat().st_mtime_ns for gid in made}
    marker = dirs_of(work).group_object_marker(1)
    assert json.loads(marker.read_text())["n"] == first[1][1][0].n
    # the spills were deleted once every group was gathered
    assert not list((work / "clusters").glob("shard-*.parquet"))
    marker.unlink()  # group 1's object written, its marker lost: it is gathered again,
    again = plan(tmp_path / "in", work, chunk_size=200)  # from the spills made again
    assert again == first
    for gid, rows in made.items():  # the same rows (a group alone flushes its own way)
        assert pq.read_table(dirs_of(work).group_object(gid)).equals(rows)
        redone = dirs_of(work).group_object(gid).stat().st_mtime_ns != stamps[gid]
        assert redone == (gid == 1)


def test_a_bucket_opens_each_spill_once_and_writes_what_a_step_a_group_writes(
    tmp_path, monkeypatch
):
    """One worker: every group in one bucket, whose step reads each of the 3 spills once
    for all the groups. Buckets of one group, and a buffer of 1 byte (a row group per
    spill read), write the same rows in the same order: a group's rows do not depend on
    its bucket or on how often the buffer is written out."""
    corpus = make_clustered(900, 16, 4, seed=2)
    write_corpus_shards(tmp_path / "in", corpus, 3)
    together = plan(tmp_path / "in", tmp_path / "a", chunk_size=200)
    gids = list(range(len(together)))
    assert len(gids) > 2
    for gid in gids:
        marker = json.loads(dirs_of(tmp_path / "a").group_object_marker(gid).read_text())
        assert marker["bucket"] == gids
        assert marker["bucket_spills_opened"] == 3 == marker["spills_read"]
    summary = gather.gather_summary(dirs_of(tmp_path / "a"))
    assert (summary["steps"], summary["spills_opened"]) == (1, 3)
    monkeypatch.setattr(gather, "GATHER_BUCKET_GROUPS", 1)
    monkeypatch.setattr(gather, "GATHER_BUFFER_BYTES", 1)
    apart = plan(tmp_path / "in", tmp_path / "b", chunk_size=200)
    assert [(label, [p.n for p in ps]) for label, ps in apart] == [
        (label, [p.n for p in ps]) for label, ps in together
    ]
    for gid in gids:
        marker = json.loads(dirs_of(tmp_path / "b").group_object_marker(gid).read_text())
        assert marker["bucket"] == [gid]
        a = dirs_of(tmp_path / "a").group_object(gid)
        b = dirs_of(tmp_path / "b").group_object(gid)
        assert pq.read_table(a).equals(pq.read_table(b))
    summary = gather.gather_summary(dirs_of(tmp_path / "b"))
    assert (summary["steps"], summary["spills_opened"]) == (len(gids), 3 * len(gids))


def test_buckets_hold_consecutive_groups_up_to_a_workers_share_of_the_rows(monkeypatch):
    sizes = [100, 300, 50, 50, 400, 10]
    for workers in (1, 2, 3, 8):
        buckets = gather.gather_buckets(sizes, range(6), workers)
        assert [g for b in buckets for g in b] == list(range(6))
        for b in buckets:
            assert len(b) == 1 or sum(sizes[g] for g in b) <= sum(sizes) / workers
    assert gather.gather_buckets(sizes, [4, 5], 1) == [[4, 5]]
    monkeypatch.setattr(gather, "GATHER_BUCKET_GROUPS", 2)
    assert gather.gather_buckets(sizes, range(6), 1) == [[0, 1], [2, 3], [4, 5]]


def write_counts(folder, counts):
    """The spill steps' per-shard counts files (``shard-SSSSS.json``), as they write them."""
    folder.mkdir(parents=True, exist_ok=True)
    for s, c in enumerate(counts):
        (folder / f"shard-{s:05d}.json").write_text(json.dumps({"counts": c.tolist()}))


def expected_offsets(counts):
    """The whole table, leaf-major ``(leaves + 1) x spills``, built at once."""
    table = np.zeros((counts.shape[1] + 1, counts.shape[0]), dtype=np.int64)
    table[1:] = np.cumsum(counts, axis=1).T
    return table


@pytest.mark.parametrize("block_values", [1, 16, 300, 1 << 22])
def test_offsets_built_in_blocks_are_the_whole_table(tmp_path, block_values):
    """Panels of a few spills, blocks of a few leaves (down to one value at a time): the
    same bytes as the table built at once, and the same leaf totals."""
    counts = np.random.default_rng(3).integers(0, 9, size=(7, 50))
    dirs = dirs_of(tmp_path)
    write_counts(dirs.clusters(), counts)
    job = IndexJob(dirs, 50, block_values=block_values)
    per_leaf = execute(IndexSpills(), job)["per_leaf"]  # with its marker
    assert per_leaf == counts.sum(axis=0).tolist()
    assert dirs.spill_index("bin").read_bytes() == expected_offsets(counts).tobytes()
    assert json.loads(dirs.spill_index("json").read_text())["shards"] == list(range(7))


def test_the_index_step_never_holds_the_whole_table(tmp_path):
    """200 spills x 4,000 leaves: a 6.4 MB table; the step's Python heap (numpy included)
    peaks at a small fraction of it: blocks and O(leaves) totals, not O(S x C) (issue 30:
    80 GB at 10^10)."""
    counts = np.random.default_rng(4).integers(0, 50, size=(200, 4000))
    dirs = dirs_of(tmp_path)
    write_counts(dirs.clusters(), counts)
    whole = expected_offsets(counts)
    tracemalloc.start()
    try:
        index_spills(dirs, 4000, block_values=4096)
        _, peak = tracemalloc.get_traced_memory()
    finally:
        tracemalloc.stop()
    assert dirs.spill_index("bin").read_bytes() == whole.tobytes()
    assert peak < whole.nbytes / 8, (peak, whole.nbytes)


def _bytes_read() -> int:
    """Bytes this process has read through read() calls so far (Linux: /proc/self/io)."""
    line = next(x for x in Path("/proc/self/io").read_text().splitlines() if x.startswith("rchar"))
    return int(line.split()[1])


@pytest.mark.skipif(not Path("/proc/self/io").exists(), reason="needs Linux's /proc/self/io")
def test_a_gather_step_reads_only_its_leaves_rows_of_the_offsets(tmp_path):
    """A group of two units (4 leaves) among 5,000 leaves x 40 spills: its pieces are
    right, and reading them takes the list of spilled shards and one row (S int64, one
    8 KB buffer) per cut, not the 1.6 MB table nor the leaves' totals, measured by the
    kernel's count of bytes read."""
    counts = np.random.default_rng(5).integers(0, 9, size=(40, 5000))
    dirs = dirs_of(tmp_path)
    write_counts(dirs.clusters(), counts)
    index_spills(dirs, 5000)
    units = [(10, 12, 0, 1), (4000, 4000, 0, 1)]  # cuts: leaves 10, 13, 4000, 4001
    unit_pieces(dirs, units, max_rows=10**6)  # imports warm
    before = _bytes_read()
    pieces, shard_of = unit_pieces(dirs, units, max_rows=10**6)
    read = _bytes_read() - before
    table = expected_offsets(counts)
    want = [
        (s, int(table[a, s]), int(table[b + 1, s]))
        for s in range(40)
        for a, b, _, _ in units
        if table[b + 1, s] > table[a, s]
    ]
    assert [(shard_of[p.path], p.start, p.stop) for p in pieces] == sorted(want)
    listed = dirs.spill_index("spills.json").stat().st_size  # the 40 spilled shards
    table_bytes = dirs.spill_index("bin").stat().st_size
    assert read <= listed + 4 * max(8192, 8 * 40) + 4096, (read, listed)
    assert read < table_bytes / 40, (read, table_bytes)


def test_disk_estimate_falls_once_the_spills_are_released(tmp_path):
    """The door's disk estimate: 2.6x the input with the spills to come, 1.94x once they
    are released, less what the work dir holds; and a disk too small is refused."""
    corpus = make_clustered(900, 16, 4, seed=1)
    write_corpus_shards(tmp_path / "in", corpus, 3)
    infos = inspect_shards(list_shards(tmp_path / "in"))
    size = sum(i.size_bytes for i in infos)
    work = tmp_path / "work"
    assert disk_needed(infos, "cluster", dirs_of(work)) == (int(2.6 * size), 2.6)
    assert disk_needed(infos, "chunk", dirs_of(work)) == (int(0.7 * size), 0.7)
    plan(tmp_path / "in", work, chunk_size=200)
    held = sum(p.stat().st_size for p in work.rglob("*") if p.is_file())
    assert held > size  # the group objects: every row again
    needed, factor = disk_needed(infos, "cluster", dirs_of(work))
    assert factor == 1.94 and needed == max(0, int(1.94 * size) - held)
    check_disk(10**9, 10**9, 2.6, size, str(work))  # exactly enough: runs
    with pytest.raises(OSError, match=r"has 500 MB free.*about 1\.0 GB more.*nothing was"):
        check_disk(10**9, 5 * 10**8, 2.6, size, str(work))
