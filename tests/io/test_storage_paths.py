"""The storage side of a sharded run, fast: a Location on a non-local pyarrow filesystem
(Arrow's in-memory filesystem, which behaves as object storage does here: no rename, no
local path) written through atomic_write, read through open_input, listed once by
names_in; and storage_path/storage_env as the steps and the Ray runner use them."""

from __future__ import annotations

import json
import tempfile

import numpy as np
import pyarrow as pa
import pyarrow.fs as pafs
import pyarrow.parquet as pq
import pytest

from datamask.io.atomic import atomic_write, atomic_write_json, check_no_overlap
from datamask.io.fs import (
    STORAGE_ENV,
    Location,
    names_in,
    open_input,
    storage_env,
    storage_path,
)
from datamask.io.parquet import atomic_write_table, read_table
from datamask.io.shards import inspect_shards, read_rows


@pytest.fixture
def bucket() -> Location:
    fs = pafs._MockFileSystem()
    for folder in ("groups", "graphs", "completions"):  # object storage needs no folders;
        fs.create_dir(f"bkt/work/{folder}")  # this filesystem does
    return Location("mem://bkt/work", "mem", fs, "bkt/work")


def test_remote_atomic_writes_read_back_and_list_once(bucket, tmp_path, monkeypatch):
    monkeypatch.setattr(tempfile, "tempdir", str(tmp_path))  # the worker's temporaries
    marker = bucket / "completions" / "00000"
    table = pa.table({"id": [1, 2, 3], "x": [0.5, 0.25, 0.125]})
    atomic_write_table(table, bucket / "groups" / "00000.parquet")
    with atomic_write(bucket / "graphs" / "00000.npz") as tmp, open(tmp, "wb") as fh:
        np.savez(fh, indices=np.arange(6, dtype=np.int32).reshape(3, 2))
    atomic_write_json({"gid": 0, "k": 2}, marker)

    assert read_table(bucket / "groups" / "00000.parquet").equals(table)
    with open_input(bucket / "graphs" / "00000.npz") as fh, np.load(fh) as saved:
        assert saved["indices"].tolist() == [[0, 1], [2, 3], [4, 5]]
    assert json.loads(marker.read_text()) == {"gid": 0, "k": 2}
    assert names_in(bucket / "completions") == {"00000"}
    assert names_in(bucket / "missing") == set()
    assert [p.name for p in (bucket / "groups").glob("*.parquet")] == ["00000.parquet"]
    # nothing left behind: no hidden temporary key, no local file
    every = bucket.fs.get_file_info(pafs.FileSelector("bkt", recursive=True))
    assert not [i.path for i in every if i.base_name.startswith(".")]
    assert list(tmp_path.iterdir()) == []
    marker.unlink(missing_ok=True)
    assert not marker.exists() and names_in(bucket / "completions") == set()


def test_a_failed_remote_write_leaves_nothing(bucket, tmp_path, monkeypatch):
    monkeypatch.setattr(tempfile, "tempdir", str(tmp_path))
    target = bucket / "groups" / "00001.parquet"
    with pytest.raises(RuntimeError, match="killed"), atomic_write(target) as tmp:
        pq.write_table(pa.table({"id": [1]}), tmp)
        raise RuntimeError("killed mid-step")
    assert not target.exists() and names_in(bucket / "groups") == set()
    assert list(tmp_path.iterdir()) == []


def test_shards_are_read_by_ranges_on_a_remote_filesystem(bucket):
    table = pa.table({"id": list(range(10)), "v": [float(i) for i in range(10)]})
    with (bucket / "in.parquet").open_atomic() as fh:
        pq.write_table(table, fh, row_group_size=3)
    (info,) = inspect_shards([bucket / "in.parquet"], columns=["id", "v"])
    assert (info.num_rows, info.row_group_rows) == (10, (3, 3, 3, 1))
    assert info.size_bytes == bucket.fs.get_file_info("bkt/work/in.parquet").size
    rows = read_rows(bucket / "in.parquet", 4, 8, ["id"], row_group_rows=info.row_group_rows)
    assert rows.column("id").to_pylist() == [4, 5, 6, 7]
    with pytest.raises(ValueError, match="does not exist"):
        inspect_shards([bucket / "gone.parquet"])


def test_a_uri_given_as_text_is_never_a_local_folder(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    with pytest.raises(TypeError, match="storage_path"), atomic_write("s3://bkt/x.json"):
        pass
    assert list(tmp_path.iterdir()) == []  # no folder named "s3:"
    assert storage_path("rel/dir") == tmp_path / "rel" / "dir"
    assert storage_path("file:///data/x") == storage_path("/data/x")
    loc = storage_path("s3://bkt/run/_work")
    assert (
        isinstance(loc, Location) and str(loc / "completions") == "s3://bkt/run/_work/completions"
    )


def test_overlap_of_remote_places():
    with pytest.raises(ValueError, match="contains the input"):
        check_no_overlap(["s3://bkt/data"], ["s3://bkt/data/a.parquet"])
    check_no_overlap(["s3://bkt/out"], ["s3://bkt/data/a.parquet"])  # apart: fine


def test_storage_env_holds_only_the_storage_settings(monkeypatch):
    for key in STORAGE_ENV:
        monkeypatch.delenv(key, raising=False)
    monkeypatch.setenv("AWS_SECRET_ACCESS_KEY", "s3cr3t")
    monkeypatch.setenv("AWS_ENDPOINT_URL", "http://127.0.0.1:9000")
    monkeypatch.setenv("STORAGE_EMULATOR_HOST", "http://127.0.0.1:9023")  # gs:// endpoint
    monkeypatch.setenv("UNRELATED", "x")
    assert storage_env() == {
        "AWS_SECRET_ACCESS_KEY": "s3cr3t",
        "AWS_ENDPOINT_URL": "http://127.0.0.1:9000",
        "STORAGE_EMULATOR_HOST": "http://127.0.0.1:9023",
    }


def test_remote_footers_are_read_concurrently_in_order_first_error_first(bucket):
    """The driver reads remote shards' footers FOOTER_THREADS at a time (map_files): the
    infos come back in the shards' order, and the first bad shard in that order is the
    one named, as when they were read one after another."""
    from datamask.io.shards import FOOTER_THREADS

    files = []
    for i in range(FOOTER_THREADS + 5):
        with (bucket / f"s-{i:03d}.parquet").open_atomic() as fh:
            pq.write_table(pa.table({"id": list(range(i + 1))}), fh)
        files.append(bucket / f"s-{i:03d}.parquet")
    rows = [i.num_rows for i in inspect_shards(files, columns=["id"])]
    assert rows == list(range(1, FOOTER_THREADS + 6))
    bad = [*files[:3], bucket / "gone-1.parquet", *files[3:], bucket / "gone-2.parquet"]
    with pytest.raises(ValueError, match="gone-1.parquet"):
        inspect_shards(bad)
