"""A cluster with no shared filesystem: object storage is the only shared medium.

A ``ray.cluster_utils.Cluster`` on 127.0.0.1 (a head with no CPUs, two 1-CPU worker
nodes), every node started in its own working directory with its own ``TMPDIR``, ``HOME``
and ``DATAMASK_CACHE``, and none of them given the S3 endpoint or credentials: those reach
the workers only through the job's Ray ``runtime_env``. A moto S3 server holds the input,
the work dir and the output. The driver is a ``datamask select`` process in a directory of
its own. (The nodes are processes of one machine, so "no shared filesystem" is what the
run relies on, not what the machine enforces: nothing names a local path to a worker.)
"""

from __future__ import annotations

import json
import re
import secrets
import signal
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from datamask import make_clustered
from datamask.config import SelectSpec
from datamask.distributed import run_selection
from tests._data import write_corpus_shards
from tests._moto import empty_moto_server

pytest.importorskip("ray")
moto_server = pytest.importorskip("moto.server")
boto3 = pytest.importorskip("boto3")

# The cluster is the ``ray_cluster`` fixture of conftest.py (its own process and
# environment). It once failed here after other suites, "node timed out during startup":
# an earlier test's ray.init had left RAY_AUTH_MODE=token in os.environ, and the nodes,
# each with a HOME of its own, had no token. The fixture now builds the cluster's
# environment itself, with one token for every node and driver.
pytestmark = pytest.mark.slow

BUCKET = "dm-cluster"
SECRET = "dm-secret-" + secrets.token_hex(8)  # grepped for in everything the run wrote
FLAGS = dict(select_ratio=0.137, n_epochs=20, n_neighbors=16, chunk_size=400, seed=0)
STORAGE_KEYS = ("AWS_ACCESS_KEY_ID", "AWS_SECRET_ACCESS_KEY", "AWS_ENDPOINT_URL", "AWS_REGION")
MARKERS = ("completions/", "clusters/shard-", "cover/", "exchange/")


@pytest.fixture(scope="module")
def s3() -> Iterator[dict[str, str]]:
    with empty_moto_server() as (host, port):
        env = {
            "AWS_ACCESS_KEY_ID": "dm-key",
            "AWS_SECRET_ACCESS_KEY": SECRET,
            "AWS_REGION": "us-east-1",
            "AWS_ENDPOINT_URL": f"http://{host}:{port}",
        }
        client = boto3.client(
            "s3",
            endpoint_url=env["AWS_ENDPOINT_URL"],
            aws_access_key_id=env["AWS_ACCESS_KEY_ID"],
            aws_secret_access_key=SECRET,
            region_name="us-east-1",
        )
        client.create_bucket(Bucket=BUCKET)
        yield {**env, "client": client}  # type: ignore[dict-item]


@pytest.fixture(scope="module")
def corpus(s3, ray_cluster, local_pool) -> list:
    """Four shards uploaded to s3://BUCKET/in/, and what the local pool selects from the
    same files on local disk with the same seed."""
    root = ray_cluster.root
    local = root / "local-input"
    write_corpus_shards(local, make_clustered(1200, 16, 6, seed=0), 4)
    for f in sorted(local.iterdir()):
        s3["client"].upload_file(str(f), BUCKET, f"in/{f.name}")
    out = root / "local-output"
    run_selection(local, out, SelectSpec.from_mapping(FLAGS), runner=local_pool, progress=False)
    return sorted(pq.read_table(out / "selected").column("chunk_id").to_pylist())


def _select(
    s3, cluster, driver: Path, out: str, workers: int, flags: dict = FLAGS, source: str = "in"
) -> Any:
    """``datamask select`` s3 -> s3 on the cluster, from ``driver`` (its own TMPDIR, HOME
    and cache); the only process given the storage settings."""
    flags = [f"--{k.replace('_', '-')}={v}" for k, v in flags.items()]
    cmd = [sys.executable, "-m", "datamask.cli", "select", "--input", f"s3://{BUCKET}/{source}/"]
    cmd += ["--output", f"s3://{BUCKET}/{out}", "--runner", "ray", "--ray-address"]
    cmd += [cluster.address, "--workers", str(workers), "--no-progress", *flags]
    env = {**cluster.driver_env(driver), **{k: s3[k] for k in STORAGE_KEYS}}
    return subprocess.Popen(
        cmd, cwd=driver, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True
    )


def _finish(proc: subprocess.Popen) -> str:
    stdout, stderr = proc.communicate(timeout=240)
    assert proc.returncode == 0, stderr[-3000:]
    return stdout + stderr


def _objects(client, prefix: str) -> dict[str, tuple[str, float]]:
    """Every object under ``prefix``: its ETag and modification time."""
    found = {}
    for page in client.get_paginator("list_objects_v2").paginate(Bucket=BUCKET, Prefix=prefix):
        for obj in page.get("Contents", []):
            if not obj["Key"].endswith("/"):  # pyarrow's empty "folder/" objects
                found[obj["Key"]] = (obj["ETag"], obj["LastModified"].timestamp())
    return found


def _read_json(client, key: str) -> Any:
    return json.loads(client.get_object(Bucket=BUCKET, Key=key)["Body"].read())


def _asked_for_more(client, marker: str, old: dict | None) -> bool:
    """Whether ``marker`` was rewritten by the allocation's next round: its group was asked
    for more candidates (``candidates/NNNNN.want.json``) and the new marker has that k."""
    if old is None:
        return False
    gid = marker.rsplit("/", 1)[-1]
    want = marker.replace(f"completions/{gid}", f"candidates/{gid}.want.json")
    try:
        wanted = _read_json(client, want)["candidates"]
    except client.exceptions.NoSuchKey:
        return False
    return old["k"] < wanted == _read_json(client, marker)["k"]


def _selection(client, out: str) -> list:
    keys = [k for k in _objects(client, f"{out}/selected/") if k.endswith(".parquet")]
    ids = []
    for key in keys:
        body = client.get_object(Bucket=BUCKET, Key=key)["Body"].read()
        ids += pq.read_table(pa.BufferReader(body)).column("chunk_id").to_pylist()
    return sorted(ids)


def _local_data_files(folder: Path) -> list[str]:
    return [
        str(p)
        for p in folder.rglob("*")
        if p.is_file() and p.suffix.lower() in (".parquet", ".npz", ".npy", ".pq")
    ]


#: The spread k-means fit by steps (sample parts, Lloyd sums, routed rows, subtrees: all
#: objects under the S3 work dir): 1,200 sampled rows in 4 parts.
SPREAD = {**FLAGS, "kmeans_step_rows": 300}


@pytest.mark.parametrize("workers, spread", [(1, False), (2, True)], ids=["1", "2-spread"])
def test_s3_only_cluster_matches_the_local_pool(
    workers, spread, s3, ray_cluster, corpus, local_pool
):
    """The selection on nodes that share nothing but the bucket is the local pool's, both
    nodes ran steps, and nothing reached the driver's disk or the logs. With 2 workers the
    k-means is the spread fit (its steps on the nodes too: one run checks both)."""
    client = s3["client"]
    driver = ray_cluster.root / f"driver-{workers}"
    expected = corpus
    if spread:  # the local pool's spread fit on the same files
        out = ray_cluster.root / "local-spread"
        spec = SelectSpec.from_mapping(SPREAD)
        run_selection(
            ray_cluster.root / "local-input", out, spec, runner=local_pool, progress=False
        )
        expected = sorted(pq.read_table(out / "selected").column("chunk_id").to_pylist())
    flags = SPREAD if spread else FLAGS
    logs = _finish(_select(s3, ray_cluster, driver, f"out-{workers}", workers, flags))
    assert _selection(client, f"out-{workers}") == expected
    manifest = _read_json(client, f"out-{workers}/manifest.json")
    assert manifest["complete"] and manifest["work_dir"] == f"s3://{BUCKET}/out-{workers}/_work"
    assert manifest["partition"]["kmeans"]["spread"] is spread
    if spread:
        assert manifest["partition"]["kmeans"]["parts"] == 4
    # both worker nodes ran group steps (each step's stats name its Ray node)
    assert {g["ray_node"] for g in manifest["groups"]} == {n["NodeID"] for n in ray_cluster.nodes()}
    # the driver's disk (cwd, TMPDIR, HOME, cache) holds no data file
    assert _local_data_files(driver) == []
    # the secret is in no object the run wrote, no file on the driver, no log line
    for key in _objects(client, f"out-{workers}/"):
        assert SECRET.encode() not in client.get_object(Bucket=BUCKET, Key=key)["Body"].read()
    for path in driver.rglob("*"):
        assert not path.is_file() or SECRET.encode() not in path.read_bytes(), path
    assert SECRET not in logs and s3["AWS_ENDPOINT_URL"] not in logs


def test_killed_driver_resumes_from_s3_on_a_fresh_host(s3, ray_cluster, corpus):
    """``kill -9`` of the driver once some steps have their markers; a rerun from another
    folder with an empty cache redoes none of those steps and selects the same."""
    root = ray_cluster.root
    client = s3["client"]
    proc = _select(s3, ray_cluster, root / "driver-killed", "out-kill", 2)
    deadline = time.monotonic() + 180
    while not any("/completions/" in k for k in _objects(client, "out-kill/_work/")):
        assert proc.poll() is None, proc.communicate()[1][-3000:]
        assert time.monotonic() < deadline, "no group finished in time"
        time.sleep(0.2)
    proc.send_signal(signal.SIGKILL)
    proc.communicate()
    time.sleep(3)  # steps in flight when the driver died end (or are ended by Ray)
    before = {
        k: v for k, v in _objects(client, "out-kill/_work/").items() if any(m in k for m in MARKERS)
    }
    assert before, "the kill came before any marker"
    steps = {k: _read_json(client, k) for k in before if "/completions/" in k}
    _finish(_select(s3, ray_cluster, root / "driver-fresh", "out-kill", 2))
    manifest = _read_json(client, "out-kill/manifest.json")
    assert manifest["totals"]["resumed"] and manifest["totals"]["groups_reused"] >= 1
    after = _objects(client, "out-kill/_work/")
    rewritten = sorted(k for k, v in before.items() if after.get(k) != v)
    # A group cut off by its own candidate count proposes again, twice as many: a new step
    # (another k) under the same marker name, which an uninterrupted run takes as well.
    redone = [k for k in rewritten if not _asked_for_more(client, k, steps.get(k))]
    assert redone == [], f"{len(redone)} marked steps were redone: {redone[:5]}"
    assert _selection(client, "out-kill") == corpus
    assert _local_data_files(root / "driver-fresh") == []


#: The marker of one step of each phase: the assignment of a shard's rows to the clusters
#: (the shuffle), and a group's selection.
PHASES = {"assign": r"/clusters/shard-\d+\.json$", "select": r"/completions/\d+$"}


def _markers(client, out: str, phase: str) -> set[str]:
    return {k for k in _objects(client, f"{out}/_work/") if re.search(PHASES[phase], k)}


@pytest.mark.skipif(not Path("/proc/self/environ").exists(), reason="reads /proc")
@pytest.mark.parametrize("phase", sorted(PHASES))
def test_a_worker_node_lost_mid_phase_and_added_back(phase, s3, ray_cluster, corpus):
    """Once the phase's first step has its marker, worker node 0 is killed (its raylet,
    object store and workers, without warning) while it runs a step, and started again:
    Ray runs the lost steps again (``max_retries``), the same command completes without a
    rerun, and it selects what the local pool does."""
    client = s3["client"]
    out = f"out-lost-{phase}"
    proc = _select(s3, ray_cluster, ray_cluster.root / f"driver-{out}", out, 2)
    deadline = time.monotonic() + 120
    while not _markers(client, out, phase) or not ray_cluster.running_steps(0):
        assert proc.poll() is None, proc.communicate()[1][-3000:]
        assert time.monotonic() < deadline, f"no {phase} step ran on node 0 in time"
        time.sleep(0.02)
    seen = _markers(client, out, phase)
    ray_cluster.remove_node(0)
    ray_cluster.add_node(0)
    logs = _finish(proc)
    assert _selection(client, out) == corpus
    # the node was lost while the phase still had steps to run
    assert len(seen) < len(_markers(client, out, phase)), logs[-2000:]


TOKEN_FLAGS = dict(select_token_ratio=0.1, length_col="n_chars", method="greedy",
                   n_neighbors=16, chunk_size=300, seed=0)  # fmt: skip


def test_a_token_budget_on_the_cluster_selects_what_the_pool_does(s3, ray_cluster, local_pool):
    """A token budget allocated by gains per token on nodes that share only S3: the local
    pool's selection, within one document of the budget."""
    client, root = s3["client"], ray_cluster.root
    local = root / "tok-input"
    rng = np.random.default_rng(2)
    lengths: dict[str, int] = {}
    for f in write_corpus_shards(local, make_clustered(800, 16, 6, seed=2), 4):
        table = pq.read_table(f)
        n_chars = rng.integers(20, 400, table.num_rows)
        pq.write_table(table.append_column("n_chars", pa.array(n_chars)), f)
        lengths |= dict(zip(table.column("chunk_id").to_pylist(), n_chars.tolist(), strict=True))
        client.upload_file(str(f), BUCKET, f"tok-in/{f.name}")
    spec = SelectSpec.from_mapping(TOKEN_FLAGS)
    run_selection(local, root / "tok-local", spec, runner=local_pool, progress=False)
    pool = sorted(pq.read_table(root / "tok-local" / "selected").column("chunk_id").to_pylist())
    driver = root / "driver-tokens"
    _finish(_select(s3, ray_cluster, driver, "out-tok", 2, TOKEN_FLAGS, source="tok-in"))
    assert _selection(client, "out-tok") == pool
    manifest = _read_json(client, "out-tok/manifest.json")
    assert manifest["budget"]["allocation"] == "gains" and manifest["totals"]["n_groups"] > 1
    total, used = 0.1 * sum(lengths.values()), sum(lengths[i] for i in pool)
    assert total - max(lengths.values()) <= used <= total
    assert manifest["tokens"]["kept"] == pytest.approx(used)
