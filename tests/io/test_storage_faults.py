"""Object storage as users meet it (issue 44): transient faults, one run per output, and
refusals that touch nothing. A real S3 API (moto on 127.0.0.1) behind the fault-injecting
proxy of :mod:`tests.io.faultproxy`.

- a sharded select s3 -> s3 under each fault mode and 5 seeds ends with the clean run's
  selection (2 shards x 200 rows), directly or after one rerun that the first run's one
  line asked for; a copy answered ``200 OK`` with an error, where ``apply`` copies;
- two runs on one ``s3://`` output from two fresh working dirs: one finishes, one is
  refused with one line;
- every refusal we can provoke, of every command, leaves the folder tree and the bucket
  byte-identical;
- the pieces: the transient-error classification, the retrying reads, the claim object,
  the (size, checksum) record of an atomic write.
"""

from __future__ import annotations

import io
import os
import subprocess
import sys

import pyarrow.parquet as pq
import pytest

from datamask.cli import main
from tests._data import ROOT
from tests.io._storage_common import (
    BUCKET,
    FAST,
    MAX_FAULTS,
    ONE,
    RATE,
    _keys,
    _selected,
)
from tests.io.faultproxy import FaultProxy

moto_server = pytest.importorskip("moto.server")
boto3 = pytest.importorskip("boto3")


# --- faults ---------------------------------------------------------------------------------
def _run_through(proxy_args: dict, argv: list[str], monkeypatch, capsys) -> FaultProxy:
    """``main(argv)`` against the store behind a fault proxy; a run stopped with the one
    line that asks for a rerun is rerun once. Returns the proxy (its counts)."""
    with FaultProxy(**proxy_args) as proxy:
        monkeypatch.setenv("AWS_ENDPOINT_URL", proxy.url)
        codes = [main(argv)]
        if codes[0] != 0:  # stopped with the one line that asks for a rerun
            err = capsys.readouterr().err.strip()
            assert codes[0] == 1 and len(err.splitlines()) == 1, err
            assert "object storage" in err and "rerun the same command to resume" in err
            codes.append(main(argv))
    assert codes[-1] == 0
    monkeypatch.undo()
    return proxy


@pytest.mark.parametrize("seed", range(5))
@pytest.mark.parametrize("mode", ["throttle", "drop", "outage"])
def test_a_faulty_store_ends_with_the_clean_selection(s3, clean, mode, seed, monkeypatch, capsys):
    client, _, port = s3
    out = f"s3://{BUCKET}/runs/{mode}-{seed}"
    argv = ["select", "--input", f"s3://{BUCKET}/data/", "--output", out, *FAST, *ONE]
    faults = dict(upstream_port=port, mode=mode, rate=RATE[mode], seed=seed, outage_s=1.0)
    proxy = _run_through({**faults, "max_faults": MAX_FAULTS}, argv, monkeypatch, capsys)
    assert proxy.counts[mode] > 0, "no fault was injected"
    assert _selected(client, f"runs/{mode}-{seed}") == clean
    assert not [k for k in _keys(client, f"runs/{mode}-{seed}/") if k.endswith(".claim")]


def test_a_copy_answered_200_with_an_error_ends_with_the_clean_output(
    s3, clean, monkeypatch, capsys
):
    """S3 answers a CopyObject or CompleteMultipartUpload ``200 OK`` with an error body.
    ``select`` writes no such request (its objects are under 5 MiB: one PutObject each,
    checked here on a clean proxy); ``apply`` streams its outputs through a temporary key
    and a copy (one per shard here): the first :data:`MAX_FAULTS` are answered so, and
    it ends with the clean run's rows all the same."""
    client, _, port = s3
    argv = ["select", "--input", f"s3://{BUCKET}/data/", "--output", f"s3://{BUCKET}/puts"]
    args = dict(upstream_port=port, mode="error200", rate=1.0)
    assert _run_through(args, [*argv, *FAST, *ONE], monkeypatch, capsys).counts["eligible"] == 0
    out = f"s3://{BUCKET}/applied"
    argv = ["apply", "--input", f"s3://{BUCKET}/data/", "--selection", f"s3://{BUCKET}/clean",
            "--output", out, "--no-progress"]  # fmt: skip
    counts = _run_through({**args, "max_faults": MAX_FAULTS}, argv, monkeypatch, capsys).counts
    assert counts["error200"] == MAX_FAULTS, counts
    kept = []
    for key in _keys(client, "applied/"):
        if key.endswith(".parquet") and "/." not in key:
            body = client.get_object(Bucket=BUCKET, Key=key)["Body"].read()
            kept += pq.read_table(io.BytesIO(body)).column("chunk_id").to_pylist()
    assert sorted(kept) == clean


def test_an_outage_past_every_retry_is_one_line_exit_1_and_resumes(s3, clean, monkeypatch, capsys):
    """The store stops answering for longer than the retries last: exit 1 naming the store
    (never exit 2, "cannot read ... as parquet"); the rerun finishes the same selection."""
    client, _, port = s3
    out = f"s3://{BUCKET}/runs/down"
    argv = ["select", "--input", f"s3://{BUCKET}/data/", "--output", out, *FAST, *ONE]
    monkeypatch.setenv("DATAMASK_S3_RETRIES", "2")
    with FaultProxy(port, mode="outage", rate=0.05, seed=1, outage_s=30) as proxy:
        monkeypatch.setenv("AWS_ENDPOINT_URL", proxy.url)
        assert main(argv) == 1
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1 and err.startswith("datamask: error: object storage at ")
    assert proxy.url in err and "rerun the same command to resume" in err
    monkeypatch.setenv("AWS_ENDPOINT_URL", f"http://127.0.0.1:{port}")
    assert main(argv) == 0
    assert _selected(client, "runs/down") == clean


def test_two_runs_on_one_output_one_finishes_one_is_refused(s3, clean, tmp_path):
    """Two processes, each with its own working dir and cache (as on two hosts), start the
    same select on one s3:// output: exactly one finishes, the other is refused with one
    line naming the holder; the output is the clean selection."""
    client, env, _ = s3
    procs = []
    for name in ("a", "b"):
        cwd = tmp_path / name
        cwd.mkdir()
        run_env = {**os.environ, **env, "PYTHONPATH": str(ROOT / "src"),
                   "DATAMASK_CACHE": str(cwd / "cache")}  # fmt: skip
        out = f"s3://{BUCKET}/twice"
        cmd = [sys.executable, "-m", "datamask.cli", "select", "--input"]
        argv = [*cmd, f"s3://{BUCKET}/data/", "--output", out, *FAST, *ONE]
        err = subprocess.PIPE
        procs.append(
            subprocess.Popen(
                argv, cwd=cwd, env=run_env, stdout=subprocess.DEVNULL, stderr=err, text=True
            )
        )
    results = [(p.wait(timeout=300), p.stderr.read()) for p in procs]
    codes = sorted(code for code, _ in results)
    assert codes == [0, 2], results
    refused = next(err for code, err in results if code == 2).strip()
    assert len(refused.splitlines()) == 1 and "is being written by another datamask run" in refused
    assert _selected(client, "twice") == clean
    assert ".datamask-claim" not in " ".join(_keys(client, "twice/"))  # released at the end
