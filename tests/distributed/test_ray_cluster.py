"""A Ray cluster as users run one, on 127.0.0.1: a head with no CPUs and two 1-CPU worker
nodes, each started in its own working directory, ``TMPDIR`` and ``HOME`` (the
``ray_cluster`` fixture of ``conftest.py``); the driver is a ``datamask select`` process in
a third directory, given a relative ``--input``.

Local files are still the shared medium here (every node sees /tmp); what is tested is
the scheduling: tasks that fit the nodes, paths that resolve on every node, steps on
both nodes, and the selection of the local pool.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pyarrow.parquet as pq
import pytest

from datamask import make_clustered
from datamask.config import SelectSpec
from datamask.distributed import LocalRunner, RayRunner, run_selection
from tests._data import write_corpus_shards

ray = pytest.importorskip("ray")

pytestmark = pytest.mark.slow

FLAGS = dict(
    select_ratio=0.137, n_epochs=20, n_neighbors=16, chunk_size=400, seed=0
)  # about 4 groups of 1,200 rows


@pytest.fixture(scope="module")
def local_selection(ray_cluster) -> tuple[Path, list]:
    """Shards in the driver's folder, and what the local pool selects from them."""
    driver = ray_cluster.root / "driver"
    write_corpus_shards(driver / "data" / "shards", make_clustered(1200, 16, 6, seed=0), 4)
    out = ray_cluster.root / "local"
    run_selection(
        driver / "data" / "shards",
        out,
        SelectSpec.from_mapping(FLAGS),
        runner=LocalRunner(2),
        progress=False,
    )
    return driver, sorted(pq.read_table(out / "selected").column("chunk_id").to_pylist())


@pytest.mark.parametrize("workers", [1, 2])
def test_cluster_run_matches_the_local_pool(workers, ray_cluster, local_selection):
    driver, expected = local_selection
    out = f"out-{workers}"
    flags = [f"--{k.replace('_', '-')}={v}" for k, v in FLAGS.items()]
    cmd = [sys.executable, "-m", "datamask.cli", "select", "--input", "data/shards"]
    cmd += ["--output", out, "--runner", "ray", "--ray-address", ray_cluster.address]
    cmd += ["--workers", str(workers), "--no-progress", *flags]
    done = subprocess.run(
        cmd, cwd=driver, env=ray_cluster.driver_env(driver / f"home-{workers}"),
        capture_output=True, text=True, timeout=120, check=False,
    )  # fmt: skip
    assert done.returncode == 0, done.stderr[-3000:]
    got = sorted(pq.read_table(driver / out / "selected").column("chunk_id").to_pylist())
    assert got == expected
    manifest = json.loads((driver / out / "manifest.json").read_text())
    assert manifest["runner"]["cpus_per_task"] == 1  # fits a 1-CPU node, whatever --workers
    # every group step ran this checkout's code on a worker node, and both nodes ran some
    nodes = {g["ray_node"] for g in manifest["groups"]}
    assert nodes == {n["NodeID"] for n in ray_cluster.nodes()} and len(nodes) == 2


def test_a_runner_that_started_ray_puts_the_environment_back(monkeypatch):
    """``ray.init`` leaves ``RAY_AUTH_MODE=token`` (Ray 2.60) in ``os.environ``; a cluster
    started afterwards from this process inherited it, and its nodes, each with a HOME
    of its own and so no token, never registered. ``close`` puts it back."""
    if ray.is_initialized():
        pytest.skip("a Ray is already running in this process")
    monkeypatch.delenv("RAY_AUTH_MODE", raising=False)
    before = dict(os.environ)
    runner = RayRunner(workers=1).connect()
    try:
        assert runner.n_cpus >= 1 and ray.is_initialized()
    finally:
        runner.close()
    assert not ray.is_initialized()
    assert dict(os.environ) == before
