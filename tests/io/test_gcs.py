"""``gs://`` against a real GCS JSON API: the ``gcp-storage-emulator`` package's server on
127.0.0.1, started by the fixture in a process of its own; datamask reaches it through
``STORAGE_EMULATOR_HOST`` (docs/scale.md), as a cluster's workers would.

The emulator is run with a thread per connection: its own single-threaded server serves
one connection at a time, and pyarrow's GCS client keeps connections open, so a second
connection waits for ever. Requests are still handled one at a time (a lock): its
in-memory store is not thread-safe (two workers' uploads at once lost a resumable upload
session, a 404 on the next chunk). In the test's own process the server hangs on the
first ranged read, hence a process of its own.
"""

from __future__ import annotations

import os
import subprocess
import sys
import textwrap
from collections.abc import Iterator

import pyarrow.fs as pafs
import pyarrow.parquet as pq
import pytest

from datamask import make_clustered
from tests._data import write_corpus_shards

pytest.importorskip("gcp_storage_emulator")
pytestmark = pytest.mark.slow  # starts a storage server

BUCKET = "dm-gcs"
SERVER = textwrap.dedent(
    """
    import sys, threading, time
    from http.server import ThreadingHTTPServer
    import gcp_storage_emulator.server as gs
    gs.server.HTTPServer = ThreadingHTTPServer  # one thread per connection
    one_at_a_time = threading.Lock()  # its in-memory store is not thread-safe

    def serialised(handle):
        def run(self):
            with one_at_a_time:
                handle(self)
        return run

    for verb in ("GET", "POST", "PUT", "DELETE", "PATCH"):
        name = "do_" + verb
        setattr(gs.RequestHandler, name, serialised(getattr(gs.RequestHandler, name)))
    srv = gs.create_server("127.0.0.1", 0, in_memory=True, default_bucket=sys.argv[1])
    srv.start()
    print(srv._api._httpd.server_address[1], flush=True)
    while True:
        time.sleep(3600)
    """
)


@pytest.fixture(scope="module")
def gcs() -> Iterator[str]:
    """The emulator's endpoint (``http://127.0.0.1:PORT``), set as STORAGE_EMULATOR_HOST."""
    proc = subprocess.Popen(
        [sys.executable, "-c", SERVER, BUCKET], stdout=subprocess.PIPE, stderr=subprocess.DEVNULL,
        text=True,
    )  # fmt: skip
    try:
        endpoint = f"http://127.0.0.1:{int(proc.stdout.readline())}"
        with pytest.MonkeyPatch.context() as mp:
            mp.setenv("STORAGE_EMULATOR_HOST", endpoint)
            yield endpoint
    finally:
        proc.kill()
        proc.wait()


def _emulator(endpoint: str) -> pafs.GcsFileSystem:
    """A client of the emulator of the test's own (not datamask's), to put and read objects."""
    host = endpoint.removeprefix("http://")
    return pafs.GcsFileSystem(anonymous=True, scheme="http", endpoint_override=host)


def test_sharded_select_gs_to_gs_in_place_matches_local(gcs, tmp_path, monkeypatch):
    """A sharded select with input, work dir and output on gs:// selects what the same run
    on local files selects, with nothing staged on this host."""
    import datamask

    local = tmp_path / "in"
    write_corpus_shards(local, make_clustered(400, 8, 4, seed=0), 3)
    fs = _emulator(gcs)
    for f in sorted(local.iterdir()):
        pafs.copy_files(str(f), f"{BUCKET}/in/{f.name}", destination_filesystem=fs)
    settings = dict(select_ratio=0.1, n_epochs=10, n_neighbors=8, chunk_size=150, seed=0,
                    progress=False, runner="local", workers=2)  # fmt: skip
    expected = datamask.select(local, tmp_path / "out", **settings)
    driver = tmp_path / "driver"
    driver.mkdir()
    monkeypatch.chdir(driver)
    monkeypatch.setenv("DATAMASK_CACHE", str(tmp_path / "cache"))
    manifest = datamask.select(f"gs://{BUCKET}/in/", f"gs://{BUCKET}/out", **settings)
    assert manifest["work_dir"] == f"gs://{BUCKET}/out/_work"
    parts = fs.get_file_info(pafs.FileSelector(f"{BUCKET}/out/selected"))
    ids = []
    for info in parts:
        with fs.open_input_file(info.path) as fh:
            ids += pq.read_table(fh).column("chunk_id").to_pylist()
    want = pq.read_table(tmp_path / "out" / "selected").column("chunk_id").to_pylist()
    assert sorted(ids) == sorted(want) and len(ids) == expected["totals"]["k"] == 40
    assert manifest["selection_digest"] == expected["selection_digest"]
    assert [p for p in tmp_path.joinpath("driver").rglob("*") if p.is_file()] == []
    assert not (tmp_path / "cache").exists()


def test_a_missing_gs_bucket_is_one_line(gcs, tmp_path):
    import datamask

    with pytest.raises(ValueError, match=r"bucket 'no-such-bucket' of --input .* does not exist"):
        datamask.select("gs://no-such-bucket/in/", tmp_path / "out", k=3, progress=False)
    assert not (tmp_path / "out").exists()
    assert os.environ["STORAGE_EMULATOR_HOST"] == gcs
