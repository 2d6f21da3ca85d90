"""Device choice and seeded generators, in one place."""

from __future__ import annotations

import logging
import os
import re

import numpy as np
import torch

from ._validation import check_count

logger = logging.getLogger("datamask")

__all__ = [
    "accelerator",
    "available_cores",
    "check_device_name",
    "make_generators",
    "resolve_device",
    "seed_streams",
    "resolve_threads",
    "set_threads",
    "set_worker_slot",
    "slot_gpu",
]


_CUDA_NAME = re.compile(r"cuda(:\d+)?")


def _name_list(names: tuple[str, ...]) -> str:
    quoted = [f"'{n}'" for n in names]
    return ", ".join(quoted[:-1]) + " or " + quoted[-1]


def check_device_name(device: str | torch.device, *, also: tuple[str, ...] = ()) -> str:
    """Check a device name without touching CUDA; return it stripped and lower-cased.

    Accepts ``"auto"``, ``"cpu"``, ``"cuda"`` and ``"cuda:N"`` (and the names in ``also``,
    e.g. ``("mps",)`` for sentence-transformers). Whether the device exists on this machine
    is :func:`resolve_device`'s business: this check is for a driver that hands the name to
    workers elsewhere (the sharded runner), so a typo fails at once, before any work.

    Examples
    --------
    >>> check_device_name(" CUDA:1 ")
    'cuda:1'
    >>> check_device_name("tpu")
    Traceback (most recent call last):
    ...
    ValueError: device must be 'auto', 'cpu', 'cuda' or 'cuda:N'; got 'tpu'.
    """
    if isinstance(device, torch.device):
        device = str(device)
    name = str(device).strip().lower()
    if name in ("auto", "cpu", *also) or _CUDA_NAME.fullmatch(name):
        return name
    allowed = _name_list(("auto", "cpu", "cuda", "cuda:N", *also))
    raise ValueError(f"device must be {allowed}; got {device!r}.")


#: This process's place in a local process pool (:func:`set_worker_slot`), or None.
_worker_slot: int | None = None


def set_worker_slot(slot: int) -> None:
    """Record this process as worker ``slot`` (0, 1, ...) of a local process pool
    (:func:`~datamask.distributed.lifecycle.worker_init`), so that ``"cuda"`` and
    ``"auto"`` resolve to GPU ``slot_gpu(slot, count)`` here: the pool's workers spread over
    a machine's GPUs instead of all sharing the first."""
    global _worker_slot
    _worker_slot = int(slot)


def slot_gpu(slot: int | None, count: int) -> int:
    """The GPU a pool worker in ``slot`` uses among ``count`` (round robin; GPU 0 outside
    a pool or with one GPU).

    >>> [slot_gpu(s, 4) for s in range(6)], slot_gpu(None, 4), slot_gpu(5, 1)
    ([0, 1, 2, 3, 0, 1], 0, 0)
    """
    return 0 if slot is None or count <= 1 else slot % count


def resolve_device(device: str | torch.device = "auto") -> torch.device:
    """``"auto"`` -> cuda when available, else cpu; ``"cuda:N"`` checked to exist.

    The one device resolver of datamask: the learner, the selectors, evaluation and
    :mod:`datamask.embedding` (which passes ``str()`` of the result to sentence-transformers)
    all call it. Names are checked by :func:`check_device_name` first. In a worker of a
    local process pool on a machine with several GPUs, ``"cuda"`` and ``"auto"`` name the
    worker's own GPU (:func:`slot_gpu`), made the process's current device; ``"cuda:N"``
    stays GPU N.
    """
    if isinstance(device, torch.device):
        return device
    name = check_device_name(device)
    if name in ("auto", "cuda") and _worker_slot is not None and torch.cuda.is_available():
        index = slot_gpu(_worker_slot, torch.cuda.device_count())
        torch.cuda.set_device(index)  # what an unindexed "cuda" tensor lands on, here too
        return torch.device("cuda", index)
    if name == "auto":
        chosen = torch.device("cuda" if torch.cuda.is_available() else "cpu")
        logger.info("device=auto -> %s (cuda available: %s)", chosen, torch.cuda.is_available())
        return chosen
    if name == "cpu":
        return torch.device("cpu")
    if not torch.cuda.is_available():
        raise ValueError(f"device {device!r} was asked for but CUDA is not available here.")
    dev = torch.device(name)
    if dev.index is not None and dev.index >= torch.cuda.device_count():
        raise ValueError(
            f"device {device!r} does not exist; this machine has "
            f"{torch.cuda.device_count()} CUDA device(s)."
        )
    return dev


def accelerator(device: str | torch.device = "auto") -> torch.device | None:
    """``device`` resolved (:func:`resolve_device`) where it is a GPU, else None: where the
    searches that are cheap on a GPU (every pair, blocked) run exact instead of the host's
    ivf search (the exchange round's floors, the cover's)."""
    resolved = resolve_device(device)
    return None if resolved.type == "cpu" else resolved


def seed_streams(seed: int, n: int) -> list[np.random.SeedSequence]:
    """The first ``n`` children spawned from ``numpy.random.SeedSequence(seed)``: a run's
    independent random streams. Stream 0 is the selector's own (the learner's batches, a
    greedy's samples, the random draw); stream ``1 + i`` is term ``i`` of the objective
    (:meth:`~datamask.objectives.Objective.bind`). A child depends only on ``seed`` and its
    index, not on ``n``, so the selector's stream is the same whatever the objective.

    >>> a, b = seed_streams(0, 2)
    >>> a.spawn_key, b.spawn_key, bool((a.generate_state(2) != b.generate_state(2)).any())
    ((0,), (1,), True)
    """
    return np.random.SeedSequence(int(seed)).spawn(n)


def make_generators(
    stream: np.random.SeedSequence, device: torch.device
) -> tuple[torch.Generator, np.random.Generator]:
    """One torch generator on ``device`` and one numpy generator from one random stream
    (a :func:`seed_streams` child): its two children, so the two never share a state."""
    copy = np.random.SeedSequence(stream.entropy, spawn_key=stream.spawn_key)  # spawn mutates
    torch_stream, numpy_stream = copy.spawn(2)
    gen = torch.Generator(device=device)
    gen.manual_seed(int(torch_stream.generate_state(1, np.uint64)[0]))
    return gen, np.random.default_rng(numpy_stream)


def available_cores() -> int:
    """CPU cores this process may run on (its affinity mask, not the machine's count)."""
    try:
        return len(os.sched_getaffinity(0))
    except AttributeError:  # not Linux
        return os.cpu_count() or 1


def resolve_threads(threads: int | None = None) -> int:
    """The thread count to use: ``threads`` when given (>= 1), else :func:`available_cores`."""
    if threads is None:
        return available_cores()
    return check_count("threads", threads)


def set_threads(threads: int | None = None) -> int:
    """Cap torch's and numpy's (BLAS/OpenMP) thread pools at ``threads``. Returns the count.

    The default is the cores available to the process: torch's own default can exceed
    them (it counts the machine's cores), and on a loaded machine oversubscribed threads
    spin against each other (measured: ``select`` on the demo took 118 s instead of 3.7 s).
    The one place every path (select, bench, evaluate, sharded workers) sets threads.
    """
    n = resolve_threads(threads)
    torch.set_num_threads(n)
    try:
        from threadpoolctl import threadpool_limits

        threadpool_limits(limits=n)
    except ImportError:  # numpy's BLAS keeps its own default
        logger.info("threadpoolctl not installed: numpy's thread pool is left as it is")
    return n
