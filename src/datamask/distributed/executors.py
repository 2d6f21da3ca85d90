"""Executors: how the steps of a sharded run are scheduled, and nothing else.

A :class:`Runner` maps a step over jobs and yields the results as they finish.
:class:`LocalRunner` uses a process pool on this machine (one torch thread per worker),
:class:`~datamask.distributed.ray_backend.RayRunner` a Ray cluster. Neither knows what
a step does; the same steps give the same selection under either.
"""

from __future__ import annotations

import itertools
import os
import sys
from collections.abc import Callable, Iterable, Iterator, Sequence
from typing import Any, Protocol

from .._device import set_threads
from .._memory import bound_heap, release_heap
from .lifecycle import abort_pool, pool_context, worker_init

__all__ = [
    "LocalRunner",
    "Runner",
    "available_cpus",
    "check_workers",
    "group_memory_bytes",
    "largest_first",
]

#: What a group step holds besides its rows: the interpreter, torch, pyarrow (measured:
#: about 450 MB for a 4,000-row 64-d group, ``benchmarks/scale`` at 100k x 64).
GROUP_MEMORY_BASE = 512 * 2**20

#: Bytes a group step holds per embedding value (rows x width), on top of the base: the
#: rows as read and as a unit float32 matrix, the k-NN graph and the learner's state.
#: Measured 1.35 GB for a 97,000 x 384 group at 1M (docs/scale.md): 25 B per value above
#: the base; 32 leaves a margin.
GROUP_BYTES_PER_VALUE = 32

#: Steps a :class:`LocalRunner` keeps submitted per worker: one running, one queued.
IN_FLIGHT_PER_WORKER = 2


def group_memory_bytes(n_rows: int, width: int) -> int:
    """Memory a group step of ``n_rows`` rows of ``width``-d embeddings is expected to
    take, for a scheduler's ``memory=`` request: ``GROUP_MEMORY_BASE +
    GROUP_BYTES_PER_VALUE * n_rows * width``."""
    return int(GROUP_MEMORY_BASE + GROUP_BYTES_PER_VALUE * n_rows * width)


def check_workers(workers: Any) -> int:
    """``workers`` checked to be an int >= 1: the one check every runner makes."""
    if isinstance(workers, bool) or not isinstance(workers, int) or workers < 1:
        raise ValueError(f"workers must be a positive integer; got {workers!r}.")
    return workers


# --- runners ---------------------------------------------------------------------------------
class Runner(Protocol):
    """What :func:`run_selection` needs from a scheduler."""

    name: str
    workers: int

    def map(
        self,
        fn: Callable[..., Any],
        items: Iterable[tuple],
        *,
        use_gpu: bool = False,
        whole_machine: bool = False,
        memory: Sequence[int] | None = None,
    ) -> Iterator[Any]:
        """Call ``fn(*args)`` for every ``args`` in ``items``; yield results as they finish.

        ``whole_machine``: each call may use every core of one machine (the global round,
        a single step, sets its threads accordingly). ``memory``: bytes each item's call
        is expected to take (:func:`group_memory_bytes`), for schedulers that reserve it.
        """
        ...

    def close(self) -> None: ...


def available_cpus() -> int:
    """Cores this process may run on (the affinity mask, not the machine's count)."""
    try:
        return len(os.sched_getaffinity(0))
    except AttributeError:  # not on Linux
        return os.cpu_count() or 1


def _call_with_threads(fn: Callable[..., Any], n_threads: int, *args: Any) -> Any:
    """Step body in a worker: pin torch's and BLAS threads, fix glibc's mmap threshold
    (:func:`~datamask._memory.bound_heap`: without it the k-means fit step's heap kept
    380 MB of freed similarity blocks), run the step, give its free pages back."""
    set_threads(n_threads)
    bound_heap()
    try:
        return fn(*args)
    finally:
        release_heap()


class LocalRunner:
    """Run steps on this machine: in this process, or in a pool of ``workers`` processes.

    The pool is the standard library's :class:`concurrent.futures.ProcessPoolExecutor`,
    its workers forked by a forkserver that imported datamask once per process (``spawn``
    where there is no forkserver: :func:`~.lifecycle.pool_context`), started on first use
    and kept until :meth:`close`. Each step pins torch to ``cores // workers`` threads, so the
    workers do not oversubscribe the cores; a ``whole_machine`` step gets every core. On a
    machine with several GPUs the workers spread over them, worker ``i`` on GPU
    ``i % n_gpus`` for ``device="cuda"`` or ``"auto"`` (:func:`~datamask._device.slot_gpu`).
    Steps are pure, so results do not depend on ``workers``.

    Parameters
    ----------
    workers : int, default=1
        Steps run at once. 1 runs them one after another in this process.

    Examples
    --------
    >>> runner = LocalRunner()
    >>> list(runner.map(max, [(1, 2), (5, 3)]))
    [2, 5]
    """

    name = "local"

    def __init__(self, workers: int = 1) -> None:
        self.workers = check_workers(workers)
        self._pool: Any = None

    def map(
        self,
        fn: Callable[..., Any],
        items: Iterable[tuple],
        *,
        use_gpu: bool = False,
        whole_machine: bool = False,
        memory: Sequence[int] | None = None,
    ) -> Iterator[Any]:
        # one machine: memory is not reserved, the workers share it
        if self.workers == 1:
            for args in items:
                yield fn(*args)
            return
        from concurrent.futures import FIRST_COMPLETED, wait

        if self._pool is None:
            from concurrent.futures import ProcessPoolExecutor

            context = pool_context()
            self._pool = ProcessPoolExecutor(
                self.workers,
                mp_context=context,
                # workers die with this process, each with its slot: its GPU (lifecycle.py)
                initializer=worker_init,
                initargs=(os.getpid(), dict(os.environ), context.Value("i", 0)),
            )
        cores = available_cpus()
        threads = cores if whole_machine else max(1, cores // self.workers)
        # At most IN_FLIGHT_PER_WORKER steps per worker submitted at once, the next as one
        # finishes: the driver holds O(workers) futures and pickled arguments, not O(jobs).
        jobs = iter(items)
        window = IN_FLIGHT_PER_WORKER * self.workers
        pending = {
            self._pool.submit(_call_with_threads, fn, threads, *args)
            for args in itertools.islice(jobs, window)
        }
        try:
            while pending:
                done, pending = wait(pending, return_when=FIRST_COMPLETED)
                for args in itertools.islice(jobs, len(done)):  # keep the workers busy
                    pending.add(self._pool.submit(_call_with_threads, fn, threads, *args))
                for future in done:
                    yield future.result()  # a step's exception is raised here as itself
        except KeyboardInterrupt:  # Ctrl-C or SIGTERM: kill the workers, do not wait
            abort_pool(self._pool)
            self._pool = None
            raise
        finally:
            # Steps not started are cancelled; those running are waited for, so a step's
            # error (or an early stop) never leaves siblings writing after the caller has
            # cleaned up (Ctrl-C killed the pool above and left nothing pending).
            running = [future for future in pending if not future.cancel()]
            if running and self._pool is not None:
                wait(running)

    def close(self, wait: bool = True) -> None:
        """Shut the worker pool down (a no-op in-process); when called while Ctrl-C or
        SIGTERM unwinds, kill the workers instead of waiting for their groups. With
        ``wait=False`` the pool's processes end in the background: a worker still
        starting (the first pool's forkserver imports datamask, ~2.4 s on 2 cores) is not
        waited for."""
        if self._pool is not None:
            if isinstance(sys.exc_info()[1], KeyboardInterrupt):
                abort_pool(self._pool)
            else:
                self._pool.shutdown(wait=wait, cancel_futures=True)
            self._pool = None

    def describe(self) -> dict[str, Any]:
        return {"runner": self.name, "workers": self.workers}


def largest_first(sizes: Sequence[int]) -> list[int]:
    """The order to submit steps of these sizes in: largest first, ties by position.

    A pool starts steps in the order given, so the longest go first and the short ones
    fill the gaps at the end (LPT scheduling): one long group submitted last would
    otherwise run alone while every other worker idles. Results are keyed by group,
    never by position, so the order changes no selection.

    >>> largest_first([5, 9, 5, 7])
    [1, 3, 0, 2]
    """
    return sorted(range(len(sizes)), key=lambda i: (-sizes[i], i))
