"""Refusals change nothing, and the pieces of the storage layer (retries, claims,
records): against moto on 127.0.0.1 (:mod:`tests.io._storage_common`)."""

from __future__ import annotations

import io
import json
import os
import subprocess
import sys
from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from datamask.cli import main
from datamask.io.atomic import OutputLock, atomic_write
from datamask.io.claim import RemoteClaim
from datamask.io.fs import resolve
from datamask.io.retry import StorageUnavailable, is_transient, retrying
from datamask.io.verify import check_object
from tests._data import write_corpus
from tests.io._storage_common import (
    BUCKET,
    FAST,
    ONE,
    _bucket,
    _keys,
    _tree,
)
from tests.io.faultproxy import FaultProxy

moto_server = pytest.importorskip("moto.server")
boto3 = pytest.importorskip("boto3")


# --- refusals touch nothing -----------------------------------------------------------------
def _earlier_local_run(root: Path) -> list[str]:
    data = root / "data"
    write_corpus(data)
    argv = ["select", "--input", str(data), "--output", str(root / "sel"), *FAST, *ONE]
    assert main(argv) == 0
    return argv


def _other_settings(root, client):
    argv = _earlier_local_run(root)
    return [*argv, "--select-ratio", "0.3"], "holds a run with other settings", None


def _shard_added(root, client):
    argv = _earlier_local_run(root)
    t = pq.read_table(root / "data" / "a" / "part-0.parquet")
    ids = pa.array([f"new{i}" for i in range(t.num_rows)])
    pq.write_table(t.set_column(0, "chunk_id", ids), root / "data" / "b" / "part-9.parquet")
    return argv, "shard(s) added", None


def _lock_held(root, client):
    argv = _earlier_local_run(root)
    return argv, "is being written by another datamask run", OutputLock(root / "sel", folder=True)


def _one_file_overlap(root, client):
    (f,) = write_corpus(root / "data")[:1]
    return ["select", "--input", str(f), "--output", str(f), *FAST], "would destroy", None


def _apply_other_selection(root, client):
    argv = _earlier_local_run(root)
    data, sel = root / "data", root / "sel"
    assert main(["apply", "--input", str(data), "--selection", str(sel), "--output",
                 str(root / "kept"), "--no-progress"]) == 0  # fmt: skip
    assert main([*argv[:4], str(root / "sel2"), *FAST, *ONE, "--seed", "7"]) == 0
    argv = ["apply", "--input", str(data), "--selection", str(root / "sel2"), "--output",
            str(root / "kept"), "--no-progress"]  # fmt: skip
    return argv, "--output", None


def _evaluate_lock_held(root, client):
    (f,) = write_corpus(root / "data")[:1]
    assert main(["select", "--input", str(f), "--output", str(root / "s.parquet"), *FAST]) == 0
    out = root / "s.eval.json"
    argv = ["evaluate", "--input", str(f), "--selection", str(root / "s.parquet"), "--output",
            str(out), "--format", "json"]  # fmt: skip
    return argv, "is being written by another datamask run", OutputLock(out)


def _report_lock_held(root, client):
    (f,) = write_corpus(root / "data")[:1]
    assert main(["select", "--input", str(f), "--output", str(root / "s.parquet"), *FAST]) == 0
    argv = ["report", "--input", str(f), "--selection", str(root / "s.parquet"), "--output",
            str(root / "page"), "--no-progress"]  # fmt: skip
    return argv, "is being written by another datamask run", OutputLock(root / "page/index.html")


def _s3_other_settings(root, client):
    argv = ["select", "--input", f"s3://{BUCKET}/data/", "--output", f"s3://{BUCKET}/clean"]
    return [*argv, *FAST, *ONE, "--select-ratio", "0.3"], "holds a run with other settings", None


def _s3_shard_added(root, client):
    for k in _keys(client, "data/"):
        client.copy_object(Bucket=BUCKET, Key=k.replace("data/", "data2/"),
                           CopySource={"Bucket": BUCKET, "Key": k})  # fmt: skip
    client.copy_object(Bucket=BUCKET, Key="data2/part-00003.parquet",
                       CopySource={"Bucket": BUCKET, "Key": "data/part-00000.parquet"})  # fmt: skip
    argv = ["select", "--input", f"s3://{BUCKET}/data2/", "--output", f"s3://{BUCKET}/clean"]
    return [*argv, *FAST, *ONE], "shard(s)", None


def _s3_claim_held(root, client):
    held = {"run_id": "0123abcd", "host": "elsewhere", "pid": 4242, "started": "then"}
    client.put_object(Bucket=BUCKET, Key="clean/.datamask-claim", Body=json.dumps(held).encode())
    argv = ["select", "--input", f"s3://{BUCKET}/data/", "--output", f"s3://{BUCKET}/clean"]
    return [*argv, *FAST, *ONE], "pid 4242 on elsewhere", None


def _s3_one_file_claim_held(root, client):
    held = {"run_id": "0123abcd", "host": "elsewhere", "pid": 4242, "started": "then"}
    client.put_object(Bucket=BUCKET, Key="one/.s.parquet.claim", Body=json.dumps(held).encode())
    argv = ["select", "--input", f"s3://{BUCKET}/data/part-00000.parquet", "--output",
            f"s3://{BUCKET}/one/s.parquet", *FAST]  # fmt: skip
    return argv, "pid 4242 on elsewhere", None


def _s3_apply_claim_held(root, client):
    held = {"run_id": "0123abcd", "host": "elsewhere", "pid": 4242, "started": "then"}
    client.put_object(Bucket=BUCKET, Key="kept/.datamask-claim", Body=json.dumps(held).encode())
    argv = ["apply", "--input", f"s3://{BUCKET}/data/", "--selection", f"s3://{BUCKET}/clean",
            "--output", f"s3://{BUCKET}/kept", "--no-progress"]  # fmt: skip
    return argv, "pid 4242 on elsewhere", None


TOKENS = ["--select-token-ratio", "0.1", "--length-col", "n_chars", "--method", "greedy",
          "--n-neighbors", "8", "--no-progress"]  # fmt: skip


def _bad_length_shards(folder: Path) -> list[Path]:
    """:func:`write_corpus`'s shards with an ``n_chars`` column, 0 in the last shard's
    row 7: found by the count of tokens, after every row was scanned."""
    files = sorted(write_corpus(folder))
    for s, f in enumerate(files):
        t = pq.read_table(f)
        n_chars = np.arange(1, t.num_rows + 1) * 10
        if s == len(files) - 1:
            n_chars[7] = 0
        pq.write_table(t.append_column("n_chars", pa.array(n_chars)), f)
    return files


def _token_bad_length(root, client):
    _bad_length_shards(root / "tokdata")
    argv = ["select", "--input", str(root / "tokdata"), "--output", str(root / "tsel")]
    return [*argv, *ONE, *TOKENS], "not numbers > 0", None


REFUSALS = {
    "select-sharded-other-settings": _other_settings,
    "select-sharded-shard-added": _shard_added,
    "select-sharded-lock-held": _lock_held,
    "select-one-file-output-is-input": _one_file_overlap,
    "apply-other-selection": _apply_other_selection,
    "evaluate-lock-held": _evaluate_lock_held,
    "report-lock-held": _report_lock_held,
    "s3-select-sharded-other-settings": _s3_other_settings,
    "s3-select-sharded-shard-added": _s3_shard_added,
    "s3-select-sharded-claim-held": _s3_claim_held,
    "s3-select-one-file-claim-held": _s3_one_file_claim_held,
    "s3-apply-claim-held": _s3_apply_claim_held,
    "select-sharded-token-bad-length": _token_bad_length,
}


@pytest.mark.parametrize("case", list(REFUSALS))
def test_a_refusal_changes_nothing(s3, clean, case, tmp_path, monkeypatch, capsys):
    client, _, _ = s3
    monkeypatch.chdir(tmp_path)
    argv, message, held = REFUSALS[case](tmp_path, client)
    capsys.readouterr()
    before, bucket = _tree(tmp_path), _bucket(client)
    try:
        code = main(argv)
    finally:
        if held is not None:
            held.release()
    err = capsys.readouterr().err.strip()
    assert code == 2 and len(err.splitlines()) == 1 and message in err, err
    if held is not None:  # the holder's lock file went with it, as it does at its end
        before = {k: v for k, v in before.items() if not k.endswith(".lock")}
    assert _tree(tmp_path) == before
    assert _bucket(client) == bucket
    for key in [k for k in _keys(client) if k.endswith((".datamask-claim", ".claim"))]:
        client.delete_object(Bucket=BUCKET, Key=key)  # the planted claims, for the next case


# --- the pieces -----------------------------------------------------------------------------
def test_transient_errors_are_told_from_bad_input():
    seen = [  # texts pyarrow raised behind the proxy
        "AWS Error NETWORK_CONNECTION during HeadObject operation: curlCode: 52, Server "
        "returned nothing (no headers, no data)",
        "AWS Error INTERNAL_FAILURE during GetObject operation: Failed to flush response "
        "stream (eof: 0, bad: 1)",
        "AWS Error SLOW_DOWN during PutObject operation: Please reduce your request rate.",
    ]
    assert all(is_transient(OSError(t)) for t in seen)
    assert is_transient(ConnectionResetError()) and is_transient(StorageUnavailable("x"))
    assert not is_transient(OSError("Parquet magic bytes not found in footer"))
    assert not is_transient(FileNotFoundError("no such key"))
    assert not is_transient(ValueError("Server returned nothing"))


def test_retrying_gives_up_with_one_line(monkeypatch):
    monkeypatch.setenv("DATAMASK_S3_RETRIES", "3")
    calls = []

    def flaky():
        calls.append(1)
        raise OSError("AWS Error SLOW_DOWN during GetObject operation")

    with pytest.raises(StorageUnavailable, match="rerun the same command to resume"):
        retrying(flaky, "reading 's3://b/k'")
    assert len(calls) == 3
    calls.clear()
    with pytest.raises(OSError, match="magic bytes"):
        retrying(lambda: calls.append(1) or (_ for _ in ()).throw(OSError("magic bytes")), "x")
    assert len(calls) == 1  # not transient: never retried


def test_throttled_small_ranged_reads_are_retried(s3, monkeypatch):
    """A 503 SlowDown on a ranged read smaller than the error body fails inside the AWS SDK
    ("Failed to flush response stream") and was not retried: np.load of an .npz then died
    with BadZipFile. Through Location.open_input_file it reads the arrays."""
    client, _, port = s3
    buf = io.BytesIO()
    np.savez(buf, a=np.arange(5000), b=np.ones((50, 16)))
    client.put_object(Bucket=BUCKET, Key="npz/t.npz", Body=buf.getvalue())
    with FaultProxy(port, mode="throttle", rate=0.2, seed=2) as proxy:
        monkeypatch.setenv("AWS_ENDPOINT_URL", proxy.url)
        loc = resolve(f"s3://{BUCKET}/npz/t.npz")
        for _ in range(3):
            with loc.open_input_file() as fh, np.load(fh) as f:
                assert int(f["a"].sum()) == 4999 * 5000 // 2 and f["b"].shape == (50, 16)
    assert proxy.counts["throttle"] >= 2


def test_a_dead_claim_of_this_host_is_taken_over_and_a_live_one_refused(s3, monkeypatch):
    client, _, _ = s3
    out = resolve(f"s3://{BUCKET}/claimed")
    dead = subprocess.run([sys.executable, "-c", "import os; print(os.getpid())"],
                          capture_output=True, text=True, check=True)  # fmt: skip
    import socket

    stale = {"run_id": "dead", "host": socket.gethostname(), "pid": int(dead.stdout)}
    client.put_object(Bucket=BUCKET, Key="claimed/.datamask-claim", Body=json.dumps(stale).encode())
    with RemoteClaim(out, folder=True) as claim:  # the killed run's claim is taken over
        body = json.loads(_bucket(client)["claimed/.datamask-claim"])
        assert body["run_id"] == claim.record["run_id"] and body["pid"] == os.getpid()
        monkeypatch.setenv("DATAMASK_CACHE", str(Path(os.environ["DATAMASK_CACHE"]) / "other"))
        with pytest.raises(ValueError, match=r"another datamask run \(pid \d+ on .*delete s3://"):
            RemoteClaim(out, folder=True)  # live: refused, whoever asks
    assert "claimed/.datamask-claim" not in _keys(client, "claimed/")


def test_an_atomic_write_records_what_it_published(s3, tmp_path):
    client, _, _ = s3
    for target in (tmp_path / "x.bin", resolve(f"s3://{BUCKET}/rec/x.bin")):
        record: dict = {}
        with atomic_write(target, record=record) as tmp:
            tmp.write_bytes(b"abc" * 1000)
        assert record["size"] == 3000 and len(record["blake2b"]) == 32
        check_object(target, record)
        with pytest.raises(ValueError, match="holds 3000 bytes, not the 2999 written"):
            check_object(target, {**record, "size": 2999})
        with pytest.raises(ValueError, match="checksum differs"):
            check_object(target, {**record, "blake2b": "0" * 32})
    with pytest.raises(ValueError, match="is missing"):
        check_object(tmp_path / "gone.bin", record)
