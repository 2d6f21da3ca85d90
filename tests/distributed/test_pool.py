"""The local process pool: how its workers start and end (``distributed/lifecycle.py``)."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time

import pytest

from datamask.distributed import LocalRunner
from datamask.distributed.lifecycle import pool_context

pytestmark = pytest.mark.slow  # starts process pools


def _worker_view(name: str) -> tuple[int, str | None, bool]:
    return os.getpid(), os.environ.get(name), "/dm-extra-path" in sys.path


def _worker_slot(pause: float) -> tuple[int, int | None]:
    from datamask import _device

    time.sleep(pause)  # both workers take items
    return os.getpid(), _device._worker_slot


def test_each_worker_has_its_own_slot_and_so_its_own_gpu():
    """The pool numbers its workers 0, 1, ... as they start: on a machine with several
    GPUs, ``device="cuda"`` resolves to GPU ``slot % n_gpus`` in each (``slot_gpu``), so
    the workers spread over the GPUs instead of sharing the first. The driver has none."""
    from datamask import _device

    runner = LocalRunner(2)
    try:
        seen = dict(runner.map(_worker_slot, [(0.2,)] * 6))
    finally:
        runner.close()
    assert sorted(seen.values()) == [0, 1] and os.getpid() not in seen
    assert _device._worker_slot is None
    assert [_device.slot_gpu(slot, 2) for slot in sorted(seen.values())] == [0, 1]


def test_a_later_pool_sees_the_environment_and_path_of_its_start(monkeypatch):
    """A forked worker starts from the forkserver's state (the driver's at its first
    pool); it is given the driver's environment and sys.path as of its own pool's start,
    as a spawned worker would have them."""
    first = LocalRunner(2)
    try:
        assert list(first.map(_worker_view, [("DM_POOL_TEST",)]))[0][1:] == (None, False)
    finally:
        first.close()
    monkeypatch.setenv("DM_POOL_TEST", "later")
    monkeypatch.syspath_prepend("/dm-extra-path")
    second = LocalRunner(2)
    try:
        (pid, value, on_path), *_ = second.map(_worker_view, [("DM_POOL_TEST",)] * 2)
    finally:
        second.close()
    assert pid != os.getpid() and value == "later" and on_path


def test_the_pool_forks_from_a_server_where_there_is_one():
    import multiprocessing

    expected = "forkserver" if "forkserver" in multiprocessing.get_all_start_methods() else "spawn"
    assert pool_context().get_start_method() == expected


MAIN_SCRIPT = """
import os, sys
with open(sys.argv[1], "a") as f:  # module level: runs wherever this module is imported
    f.write(f"{os.getpid()}\\n")

def worker_pid(_):
    return os.getpid()

if __name__ == "__main__":
    from datamask.distributed import LocalRunner
    runner = LocalRunner(2)
    print(sorted(set(runner.map(worker_pid, [(i,) for i in range(8)]))))
    runner.close()
"""


def test_the_server_never_runs_the_callers_main_module(tmp_path):
    """The caller's script is imported by the driver and by each worker (as with spawn),
    never by the forkserver: a script that starts CUDA at module level would leave no
    forked worker able to use the GPU. (Python 3.11's multiprocessing never hands the
    server the main script's path, whatever the preload: the key it reads is not the one
    it writes; this guards a version that does.)"""
    script, ran = tmp_path / "job.py", tmp_path / "ran.txt"
    script.write_text(MAIN_SCRIPT)
    proc = subprocess.run(
        [sys.executable, str(script), str(ran)], capture_output=True, text=True, timeout=120
    )
    assert proc.returncode == 0, proc.stderr
    workers = eval(proc.stdout.strip().splitlines()[-1])  # noqa: S307 (our own list of ints)
    pids = [int(line) for line in ran.read_text().split()]
    # the driver's line first, then one per worker: no line of the server's
    assert sorted(pids[1:]) == workers and len(pids) == 1 + len(workers)


FORKED_CHILD = """
import os
from datamask.distributed import LocalRunner

def worker_pid(_):
    return os.getpid()

def pool_pids():
    runner = LocalRunner(2)
    try:
        return set(runner.map(worker_pid, [(i,) for i in range(4)]))
    finally:
        runner.close()

if __name__ == "__main__":
    pool_pids()  # this process starts its forkserver
    child = os.fork()
    if child == 0:
        os._exit(0 if pool_pids() else 1)
    _, status = os.waitpid(child, 0)
    print(os.waitstatus_to_exitcode(status))
"""


@pytest.mark.skipif(not hasattr(os, "fork"), reason="needs os.fork")
def test_a_forked_child_of_a_driver_starts_its_own_pool(tmp_path):
    """A process made by fork inherits its parent's forkserver, which it cannot use
    (multiprocessing raised ChildProcessError): its pool spawns."""
    script = tmp_path / "job.py"
    script.write_text(FORKED_CHILD)
    proc = subprocess.run([sys.executable, str(script)], capture_output=True, text=True,
                          timeout=120)  # fmt: skip
    assert proc.returncode == 0 and proc.stdout.split() == ["0"], proc.stderr[-2000:]


WORKER_OF = """
import os, sys, time
from datamask.distributed.lifecycle import watch_driver
if sys.argv[2] == "poll":  # no pidfds (macOS, Linux before 5.3)
    del os.pidfd_open
watch_driver(int(sys.argv[1]))
print("watching", flush=True)
time.sleep(120)
"""


@pytest.mark.parametrize("how", ["pidfd", "poll"])
def test_a_worker_ends_when_its_driver_does_even_when_not_its_parent(how):
    """A forked worker's parent is the forkserver, which outlives the driver while any
    worker lives: the worker watches the driver itself and ends with it, at once."""
    driver = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(120)"])
    worker = subprocess.Popen(  # a sibling of the driver, not its child
        [sys.executable, "-c", WORKER_OF, str(driver.pid), how], stdout=subprocess.PIPE, text=True
    )
    try:
        assert worker.stdout.readline().strip() == "watching"
        time.sleep(0.5)
        assert worker.poll() is None  # the driver lives: so does the worker
        driver.send_signal(signal.SIGKILL)
        driver.wait(timeout=10)
        assert worker.wait(timeout=10) == -signal.SIGKILL
    finally:
        for proc in (driver, worker):
            if proc.poll() is None:
                proc.kill()
