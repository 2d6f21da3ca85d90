"""The driver's all-to-alls done by steps through the work dir (issue 30): the id check
(one step per hash bucket) and the keep lists (one step per group, then per input shard).
"""

from __future__ import annotations

import json
import os
from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from datamask import make_clustered
from datamask.config import SelectSpec
from datamask.distributed import LocalRunner, run_selection
from datamask.distributed.check import validate
from datamask.distributed.finish import keeplists
from datamask.io.keep import input_names, read_selected_ids, write_keep_lists
from datamask.io.shards import list_shards
from tests._data import write_corpus_shards

FAST = dict(n_epochs=5, select_ratio=0.2, n_neighbors=8)


@pytest.fixture(scope="module")
def shards(tmp_path_factory) -> Path:
    root = tmp_path_factory.mktemp("a2a")
    write_corpus_shards(root / "in", make_clustered(600, 8, 5, seed=3), 4, row_group_size=64)
    return root / "in"


def _with_ids(path: Path, ids: list) -> None:
    table = pq.read_table(path)
    table = table.set_column(table.schema.get_field_index("chunk_id"), "chunk_id", pa.array(ids))
    pq.write_table(table, path, row_group_size=64)


def _ids(path: Path) -> list:
    return pq.read_table(path, columns=["chunk_id"]).column(0).to_pylist()


def _copy(shards: Path, dest: Path) -> Path:
    dest.mkdir(parents=True)
    for f in sorted(shards.glob("*.parquet")):
        (dest / f.name).write_bytes(f.read_bytes())
    return dest


@pytest.mark.parametrize("bucket_rows", [validate.BUCKET_ROWS, 97])  # 1 bucket, 7 buckets
def test_repeated_id_across_two_shards_is_named_by_the_bucket_steps(
    shards, tmp_path, monkeypatch, bucket_rows
):
    monkeypatch.setattr(validate, "BUCKET_ROWS", bucket_rows)
    data = _copy(shards, tmp_path / "in")
    first, last = sorted(data.glob("*.parquet"))[0], sorted(data.glob("*.parquet"))[-1]
    ids = _ids(last)
    ids[20] = _ids(first)[5]
    _with_ids(last, ids)
    settings = SelectSpec.from_mapping(dict(partition="chunk", chunk_size=200, **FAST))
    with pytest.raises(
        ValueError,
        match=r"occurs more than once \(row 5 of .*part-00000.parquet "
        r"and row 20 of .*part-00003.parquet; 1 repeated ids in all\); ids must",
    ):
        run_selection(data, tmp_path / "out", settings, progress=False)
    assert not (tmp_path / "out").exists()  # the buckets went with the refused run


def test_repeated_id_within_one_shard_is_named(shards, tmp_path, monkeypatch):
    monkeypatch.setattr(validate, "BUCKET_ROWS", 97)
    data = _copy(shards, tmp_path / "in")
    path = sorted(data.glob("*.parquet"))[1]
    ids = _ids(path)
    ids[100], ids[120] = ids[3], ids[4]
    _with_ids(path, ids)
    settings = SelectSpec.from_mapping(dict(partition="chunk", chunk_size=200, **FAST))
    with pytest.raises(
        ValueError,
        match=r"occurs more than once \(rows 3 and 100 of "
        r".*part-00001.parquet; 2 repeated ids in all\)",
    ):
        run_selection(data, tmp_path / "out", settings, progress=False)


def test_a_rerun_skips_marked_bucket_steps_but_not_on_changed_input(shards, tmp_path, monkeypatch):
    monkeypatch.setattr(validate, "BUCKET_ROWS", 97)
    data = _copy(shards, tmp_path / "in")
    settings = SelectSpec.from_mapping(dict(partition="chunk", chunk_size=200, **FAST))
    out = tmp_path / "out"
    run_selection(data, out, settings, progress=False)
    markers = sorted((out / "_work" / "ids" / "done").glob("bucket=*.json"))
    assert len(markers) == 7  # 600 ids / 97 per bucket
    stamps = {m: m.stat().st_mtime_ns for m in markers}
    run_selection(data, out, settings, progress=False)  # a rerun: every bucket step skipped
    assert {m: m.stat().st_mtime_ns for m in markers} == stamps
    # A shard changed since: the work dir holds a run of other inputs, refused before any
    # step writes (issue 44: a refusal changes nothing), its bucket markers untouched.
    path = sorted(data.glob("*.parquet"))[2]
    ids = _ids(path)
    ids[7] = ids[8]
    _with_ids(path, ids)
    with pytest.raises(ValueError, match=r"other settings \(input shards changed: content of"):
        run_selection(data, out, settings, progress=False)
    assert {m: m.stat().st_mtime_ns for m in markers} == stamps
    # in a fresh output the scan finds the repeat and names it
    with pytest.raises(ValueError, match=r"occurs more than once \(rows 7 and 8 of"):
        run_selection(data, tmp_path / "fresh", settings, progress=False)


@pytest.mark.parametrize(
    "partition, budget",
    [("cluster", "group"), ("cluster", "global"), ("chunk", "group"), ("shard", "global")],
)
def test_keep_lists_from_steps_are_byte_identical_to_the_serial_writer(
    shards, tmp_path, partition, budget
):
    settings = SelectSpec.from_mapping(
        dict(partition=partition, budget=budget, chunk_size=200, n_clusters=3, **FAST)
    )
    out = tmp_path / "out"
    manifest = run_selection(shards, out, settings, progress=False)
    files = [os.path.abspath(f) for f in list_shards(shards)]
    serial = tmp_path / "serial"
    index = write_keep_lists(
        files,
        input_names(shards, files),
        read_selected_ids(out, "chunk_id"),
        serial,
        id_col="chunk_id",
    )
    assert index["n_selected"] == manifest["totals"]["k"] > 0
    assert manifest["selection_digest"] == index["selection"]
    made = sorted(p.name for p in (out / "keep").iterdir())
    assert made == sorted(p.name for p in serial.iterdir()) and len(made) == 5
    for name in made:
        assert (out / "keep" / name).read_bytes() == (serial / name).read_bytes(), name
    # the buckets: group G's kept rows of a bucket of input shards, every row known (a
    # cluster group's object carries each row's shard and row), so no shard is read again
    buckets = sorted((out / "_work" / "keep").glob("bucket=*/part-*.parquet"))
    table = pa.concat_tables([pq.read_table(b) for b in buckets])
    assert table.num_rows == index["n_selected"]
    assert (table.column("row").to_numpy() >= 0).all()
    assert set(table.column("shard").to_numpy()) <= set(range(len(files)))


def test_keep_lists_through_many_buckets_are_the_same_bytes(shards, tmp_path, monkeypatch):
    """Buckets of 2 shards (the driver's constant goes to the group steps in their jobs):
    a group's kept rows land in several bucket objects, and the keep lists and the index
    are the bytes of a run with one bucket."""
    settings = SelectSpec.from_mapping(dict(partition="cluster", n_clusters=3, **FAST))
    run_selection(shards, tmp_path / "one", settings, progress=False)
    monkeypatch.setattr(keeplists, "BUCKET_SHARDS", 2)
    run_selection(shards, tmp_path / "many", settings, progress=False)
    one, many = tmp_path / "one" / "keep", tmp_path / "many" / "keep"
    assert sorted(p.name for p in one.iterdir()) == sorted(p.name for p in many.iterdir())
    for p in one.iterdir():
        assert p.read_bytes() == (many / p.name).read_bytes(), p.name
    work = tmp_path / "many" / "_work" / "keep"
    n_shards = len(list_shards(shards))
    assert len(list(work.glob("bucket=*"))) == -(-n_shards // 2)
    assert len(list((work / "done").glob("bucket-*.json"))) == -(-n_shards // 2)
    assert max(len(json.loads(m.read_text())["buckets"]) for m in work.glob("done/part-*")) > 1


def test_keep_steps_are_skipped_on_a_rerun(shards, tmp_path):
    settings = SelectSpec.from_mapping(dict(partition="chunk", chunk_size=200, **FAST))
    out = tmp_path / "out"
    run_selection(shards, out, settings, progress=False)
    done = sorted((out / "_work" / "keep" / "done").glob("*.json"))
    assert len(done) == 3 + 1  # 3 groups, 1 bucket of the 4 input shards
    stamps = [m.stat().st_mtime_ns for m in done]
    lists = {p: p.read_bytes() for p in (out / "keep").iterdir()}
    run_selection(shards, out, settings, runner=LocalRunner(), progress=False)
    assert [m.stat().st_mtime_ns for m in done] == stamps
    assert {p: p.read_bytes() for p in (out / "keep").iterdir()} == lists
    parts = sorted(p for p in lists if p.suffix == ".parquet")
    assert len(read_selected_ids(out, "chunk_id")) == sum(
        pq.read_metadata(p).num_rows for p in parts
    )
    assert np.all(np.diff(pq.read_table(parts[0]).column("row").to_numpy()) > 0)


@pytest.mark.slow
def test_on_ray_the_bucket_and_keep_steps_match_the_local_pool(shards, tmp_path, monkeypatch):
    pytest.importorskip("ray")
    from datamask.distributed import RayRunner

    monkeypatch.setattr(validate, "BUCKET_ROWS", 97)  # (read by the driver: 7 buckets)
    runner = RayRunner(workers=2)  # starts Ray; close() stops it and restores os.environ
    try:
        settings = SelectSpec.from_mapping(dict(partition="cluster", n_clusters=3, **FAST))
        run_selection(shards, tmp_path / "local", settings, progress=False)
        run_selection(shards, tmp_path / "ray", settings, runner=runner, progress=False)
        local, on_ray = tmp_path / "local" / "keep", tmp_path / "ray" / "keep"
        assert sorted(p.name for p in local.iterdir()) == sorted(p.name for p in on_ray.iterdir())
        for p in local.iterdir():
            assert p.read_bytes() == (on_ray / p.name).read_bytes(), p.name
        assert len(list((tmp_path / "ray" / "_work" / "ids" / "done").iterdir())) == 7
        data = _copy(shards, tmp_path / "in")
        last = sorted(data.glob("*.parquet"))[-1]
        ids = _ids(last)
        ids[1] = _ids(sorted(data.glob("*.parquet"))[0])[2]
        _with_ids(last, ids)
        with pytest.raises(ValueError, match=r"occurs more than once \(row 2 of .*part-00000"):
            run_selection(data, tmp_path / "bad", settings, runner=runner, progress=False)
    finally:
        runner.close()


def test_a_bucket_no_group_kept_a_row_of_gets_empty_keep_lists(tmp_path, monkeypatch):
    """Buckets of 1 shard, and a shard whose rows all score lowest under topk: its bucket
    has no group part, so its keep list is empty, with the id type read from the shard's
    footer (through io.parquet.open_parquet, local or remote)."""
    corpus = make_clustered(300, 8, 3, seed=2)
    files = write_corpus_shards(tmp_path / "in", corpus, 3)
    low = pq.read_table(files[2])
    low = low.set_column(low.schema.get_field_index("quality_score"), "quality_score",
                         pa.array(np.full(low.num_rows, -5.0)))  # fmt: skip
    pq.write_table(low, files[2])
    monkeypatch.setattr(keeplists, "BUCKET_SHARDS", 1)
    settings = SelectSpec.from_mapping(dict(method="topk", select_ratio=0.2))
    run_selection(tmp_path / "in", tmp_path / "out", settings, progress=False)
    index = json.loads((tmp_path / "out" / "keep" / "_index.json").read_text())
    assert index["files"][files[2].name]["kept"] == 0
    empty = pq.read_table(tmp_path / "out" / "keep" / files[2].name)
    assert (
        empty.num_rows == 0
        and empty.schema.field("chunk_id").type == low.schema.field("chunk_id").type
    )
