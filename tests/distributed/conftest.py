"""A Ray cluster as users run one, on 127.0.0.1, for the cluster tests.

:func:`start_cluster` starts a ``ray.cluster_utils.Cluster`` (a head with no CPUs and
1-CPU worker nodes, each started in its own working directory with its own ``TMPDIR``,
``HOME`` and ``DATAMASK_CACHE``) from a process of its own, so the pytest process stays off
Ray. Its environment is built here, not inherited: no ``RAY_*`` variable of the pytest
process reaches it (``ray.init`` leaves ``RAY_AUTH_MODE=token`` in its process's
environment, and a node whose ``HOME`` holds no token then never registers: "node timed
out during startup"), no storage credential or endpoint, and one Ray token shared by the
head, the nodes and every driver (:attr:`RayCluster.env`), as a real cluster's nodes share
theirs. A worker node can be removed and added back while a run is going
(:meth:`RayCluster.remove_node`, :meth:`RayCluster.add_node`).
"""

from __future__ import annotations

import json
import os
import secrets
import shutil
import socket
import subprocess
import sys
import tempfile
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path

import pytest

import datamask

#: Ray resolves 127.0.0.1 to the machine's own address unless told not to.
LOOPBACK = {"RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER": "0"}
SRC = str(Path(datamask.__file__).resolve().parents[1])  # this checkout, for every process
#: What only the driver may know about the object storage.
STORAGE_KEYS = (
    "AWS_ACCESS_KEY_ID",
    "AWS_SECRET_ACCESS_KEY",
    "AWS_ENDPOINT_URL",
    "AWS_REGION",
    "AWS_DEFAULT_REGION",
    "AWS_ENDPOINT_URL_S3",
    "DATAMASK_CACHE",
)

# Commands on stdin, one a line: "remove I" / "add I" (worker node I, from 0); each is
# answered "ok" once done. End of input shuts the cluster down.
CLUSTER_SCRIPT = """
import json, os, sys
from ray.cluster_utils import Cluster

root, port, homes = sys.argv[1], int(sys.argv[2]), json.loads(sys.argv[3])
base = dict(os.environ)
nodes = Cluster(initialize_head=True, head_node_args={
    "num_cpus": 0, "node_ip_address": "127.0.0.1", "temp_dir": root + "/ray",
    "include_dashboard": False, "gcs_server_port": port,
    # a killed node refuses its health checks at once: found dead after 3 refusals 1 s
    # apart, not Ray's 5 at 3 s; a slow node still has Ray's 10 s to answer each one
    "_system_config": {"health_check_period_ms": 1000, "health_check_failure_threshold": 3}})

def add(i):  # the node's processes start in its own folder and environment
    home, env = homes[i]
    os.environ.clear(); os.environ.update({**base, **env}); os.chdir(home)
    node = nodes.add_node(num_cpus=1, node_ip_address="127.0.0.1")
    os.environ.clear(); os.environ.update(base); os.chdir(root)
    return node

workers = [add(i) for i in range(len(homes))]
nodes.wait_for_nodes(timeout=60)
print(nodes.address, flush=True)
for line in sys.stdin:
    verb, i = line.split()
    if verb == "remove":
        nodes.remove_node(workers[int(i)], allow_graceful=False)
    else:
        workers[int(i)] = add(int(i))
        nodes.wait_for_nodes(timeout=60)
    print("ok", flush=True)
nodes.shutdown()
"""


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


def own_dirs(home: Path) -> dict[str, str]:
    """A working folder of its own: TMPDIR, HOME and DATAMASK_CACHE inside ``home``."""
    for sub in ("tmp", "home", "cache"):
        (home / sub).mkdir(parents=True, exist_ok=True)
    return {
        "TMPDIR": str(home / "tmp"),
        "HOME": str(home / "home"),
        "DATAMASK_CACHE": str(home / "cache"),
    }


@dataclass
class RayCluster:
    """A running cluster: its address, its folder, and the environment of its processes."""

    address: str
    root: Path
    env: dict[str, str]
    proc: subprocess.Popen = field(repr=False)

    def driver_env(self, folder: Path) -> dict[str, str]:
        """The environment of a driver run from ``folder``: the cluster's (its token, no
        storage settings), with a TMPDIR, HOME and cache of its own in ``folder``."""
        return {**self.env, **own_dirs(folder)}

    def _command(self, line: str) -> None:
        assert self.proc.stdin is not None and self.proc.stdout is not None
        self.proc.stdin.write(line + "\n")
        self.proc.stdin.flush()
        assert self.proc.stdout.readline().strip() == "ok", f"cluster command {line!r} failed"

    def remove_node(self, i: int) -> None:
        """Kill worker node ``i`` (its raylet, object store and workers) without warning."""
        self._command(f"remove {i}")

    def add_node(self, i: int) -> None:
        """Start worker node ``i`` again, in its own folder, and wait until it registered."""
        self._command(f"add {i}")

    def running_steps(self, i: int) -> list[int]:
        """Processes of worker node ``i`` running a task now: Ray titles a busy worker
        ``ray::<task>`` and an idle one ``ray::IDLE``; the node's own TMPDIR tells its
        processes from the other nodes'."""
        tmp = f"TMPDIR={self.root / f'node{i}' / 'tmp'}".encode()
        busy = []
        for proc in Path("/proc").iterdir():
            try:
                title = (proc / "cmdline").read_bytes().split(b"\0")[0]
                if title.startswith(b"ray::_call") and tmp in (proc / "environ").read_bytes():
                    busy.append(int(proc.name))
            except (OSError, ValueError):  # not a process, or it ended meanwhile
                continue
        return busy

    def nodes(self) -> list[dict]:
        """The cluster's alive nodes with CPUs, asked by a short-lived driver."""
        code = "import json, ray, sys; ray.init(sys.argv[1]); print(json.dumps(ray.nodes()))"
        env = self.driver_env(self.root / "probe")
        done = subprocess.run(
            [sys.executable, "-c", code, self.address],
            env=env, capture_output=True, text=True, timeout=60,
        )  # fmt: skip
        assert done.returncode == 0, done.stderr[-2000:]
        found = json.loads(done.stdout.splitlines()[-1])
        return [n for n in found if n["Alive"] and n["Resources"].get("CPU")]

    def close(self) -> None:
        assert self.proc.stdin is not None
        self.proc.stdin.close()
        try:
            self.proc.wait(timeout=120)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.proc.wait()


def start_cluster(root: Path, n_workers: int = 2) -> RayCluster:
    """A 0-CPU head and ``n_workers`` 1-CPU nodes under ``root`` (keep it short: Ray's
    socket paths); each node in ``root/nodeI`` with its own TMPDIR, HOME and cache."""
    env = {
        k: v for k, v in os.environ.items() if not k.startswith("RAY_") and k not in STORAGE_KEYS
    }
    # RAY_TMPDIR: Ray's address file goes to this cluster's folder, not a shared /tmp/ray
    env.update(LOOPBACK, PYTHONPATH=SRC, RAY_TMPDIR=str(root))
    env.update(RAY_AUTH_MODE="token", RAY_AUTH_TOKEN=secrets.token_hex(32))
    homes = [(str(root / f"node{i}"), own_dirs(root / f"node{i}")) for i in range(n_workers)]
    proc = subprocess.Popen(
        [sys.executable, "-c", CLUSTER_SCRIPT, str(root), str(free_port()), json.dumps(homes)],
        env=env, cwd=root, stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True,
    )  # fmt: skip
    assert proc.stdout is not None
    address = proc.stdout.readline().strip()
    if not address:
        proc.wait(timeout=60)
        raise AssertionError("the cluster did not start (its output is above)")
    return RayCluster(address=address, root=root, env=env, proc=proc)


@pytest.fixture(scope="module")
def ray_cluster() -> Iterator[RayCluster]:
    """Two 1-CPU worker nodes and a 0-CPU head, for the tests of one module."""
    pytest.importorskip("ray")
    root = Path(tempfile.mkdtemp(prefix="dmc", dir="/tmp"))  # short: Ray's socket paths
    cluster = None
    try:
        cluster = start_cluster(root)
        yield cluster
    finally:
        if cluster is not None:
            cluster.close()
        shutil.rmtree(root, ignore_errors=True)
