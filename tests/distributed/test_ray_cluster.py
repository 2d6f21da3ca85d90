"""A Ray cluster as users run one, on 127.0.0.1: a head with no CPUs and two 1-CPU worker
nodes, each started in its own working directory and ``TMPDIR``; the driver is a
``datamask select`` process in a third directory, given a relative ``--input``.

Local files are still the shared medium here (every node sees /tmp); what is tested is
the scheduling: tasks that fit the nodes, paths that resolve on every node, steps on
both nodes, and the selection of the local pool.
"""

from __future__ import annotations

import json
import os
import shutil
import socket
import subprocess
import sys
import tempfile
from collections.abc import Iterator
from pathlib import Path

import pyarrow.parquet as pq
import pytest

import datamask
from datamask import make_clustered
from datamask.config import SelectSpec
from datamask.distributed import LocalRunner, run_selection
from tests._data import write_corpus_shards

ray = pytest.importorskip("ray")

pytestmark = pytest.mark.slow

#: Ray resolves 127.0.0.1 to the machine's own address unless told not to.
LOOPBACK = {"RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER": "0"}
SRC = str(Path(datamask.__file__).resolve().parents[1])  # this checkout, for every process
FLAGS = dict(
    select_ratio=0.137, n_epochs=20, n_neighbors=16, chunk_size=400, seed=0
)  # about 4 groups of 1,200 rows


def _free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


@pytest.fixture(scope="module")
def cluster() -> Iterator[tuple[str, Path]]:
    from ray.cluster_utils import Cluster

    root = Path(tempfile.mkdtemp(prefix="dmray", dir="/tmp"))  # short: Ray's socket paths
    saved_env, saved_cwd = dict(os.environ), os.getcwd()
    # RAY_TMPDIR: Ray's address file goes to this cluster's folder, not a shared /tmp/ray
    os.environ.update(LOOPBACK, PYTHONPATH=SRC, RAY_TMPDIR=str(root))
    nodes = None
    try:
        nodes = Cluster(
            initialize_head=True,
            head_node_args={
                "num_cpus": 0,
                "node_ip_address": "127.0.0.1",
                "temp_dir": str(root / "ray"),
                "include_dashboard": False,
                "gcs_server_port": _free_port(),  # not 6379, which another suite may hold
            },
        )
        for i in (1, 2):  # each node's processes start in their own folder and TMPDIR
            home = root / f"node{i}"
            (home / "tmp").mkdir(parents=True)
            os.chdir(home)
            os.environ["TMPDIR"] = str(home / "tmp")
            nodes.add_node(num_cpus=1, node_ip_address="127.0.0.1")
        os.chdir(saved_cwd)
        os.environ.clear()
        os.environ.update(saved_env)
        nodes.wait_for_nodes(timeout=60)
        yield nodes.address, root
    finally:
        os.chdir(saved_cwd)
        os.environ.clear()
        os.environ.update(saved_env)
        if nodes is not None:
            nodes.shutdown()
        shutil.rmtree(root, ignore_errors=True)


@pytest.fixture(scope="module")
def local_selection(cluster) -> tuple[Path, list]:
    """Shards in the driver's folder, and what the local pool selects from them."""
    _, root = cluster
    driver = root / "driver"
    write_corpus_shards(driver / "data" / "shards", make_clustered(1200, 16, 6, seed=0), 4)
    out = root / "local"
    run_selection(
        driver / "data" / "shards",
        out,
        SelectSpec.from_mapping(FLAGS),
        runner=LocalRunner(2),
        progress=False,
    )
    return driver, sorted(pq.read_table(out / "selected").column("chunk_id").to_pylist())


@pytest.mark.parametrize("workers", [1, 2])
def test_cluster_run_matches_the_local_pool(workers, cluster, local_selection):
    address, root = cluster
    driver, expected = local_selection
    out = f"out-{workers}"
    flags = [f"--{k.replace('_', '-')}={v}" for k, v in FLAGS.items()]
    cmd = [sys.executable, "-m", "datamask.cli", "select", "--input", "data/shards"]
    cmd += ["--output", out, "--runner", "ray", "--ray-address", address]
    cmd += ["--workers", str(workers), "--no-progress", *flags]
    env = {**os.environ, **LOOPBACK, "PYTHONPATH": SRC}
    done = subprocess.run(
        cmd, cwd=driver, env=env, capture_output=True, text=True, timeout=120, check=False
    )
    assert done.returncode == 0, done.stderr[-3000:]
    got = sorted(pq.read_table(driver / out / "selected").column("chunk_id").to_pylist())
    assert got == expected
    manifest = json.loads((driver / out / "manifest.json").read_text())
    assert manifest["runner"]["cpus_per_task"] == 1  # fits a 1-CPU node, whatever --workers
    # every group step ran this checkout's code on a worker node, and both nodes ran some
    nodes = {g["ray_node"] for g in manifest["groups"]}
    workers_alive = {n["NodeID"] for n in ray_nodes(address) if n["Resources"].get("CPU")}
    assert nodes == workers_alive and len(nodes) == 2


def ray_nodes(address: str) -> list[dict]:
    """The cluster's alive nodes, asked by a short-lived driver (this process stays off Ray)."""
    code = f"import json, ray; ray.init(address={address!r}); print(json.dumps(ray.nodes()))"
    env = {**os.environ, **LOOPBACK, "PYTHONPATH": SRC}
    done = subprocess.run(
        [sys.executable, "-c", code], env=env, capture_output=True, text=True, timeout=60
    )
    assert done.returncode == 0, done.stderr[-2000:]
    return [n for n in json.loads(done.stdout.splitlines()[-1]) if n["Alive"]]
