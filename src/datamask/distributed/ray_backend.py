"""Run the steps of a sharded selection as Ray tasks, on a local Ray or a cluster.

Ray is imported lazily, so ``import datamask`` never needs it. A local Ray is started on
the first step that needs it: :meth:`RayRunner.validation_runner` hands the validation
pass to a local process pool, so bad input fails before Ray starts; a cluster given by
``address`` is joined before the validation pass, which then runs on it. Each step is one
task, spread over the nodes (``SPREAD``). CPU steps and GPU steps have separate in-flight
limits (:func:`task_limits`): with ``workers`` pinned, ``workers`` of either; else CPU
steps up to the cluster's CPUs and GPU steps up to ``GPUs / gpus_per_task``. What a task
asks for:

- ``num_cpus``: one (``workers`` not pinned), else ``CPUs // workers``, but never more
  than the smallest node with CPUs offers, so every task fits some node (two 1-CPU nodes
  and ``workers=1``: one CPU, not two). torch's thread count is set to match, so tasks do
  not oversubscribe the cores. A GPU step asks one CPU.
- ``memory``: for a group step, its estimate from the group's rows and embedding width
  (:func:`~datamask.distributed.executors.group_memory_bytes`), capped at the largest
  node's memory so a task is never unschedulable.
- ``num_gpus``: when the cluster reports GPUs, GPU steps (groups, the k-means
  iterations) ask ``gpus_per_task`` (default 1, or ``1 / ceil(workers / GPUs)`` with
  ``workers`` pinned: the workers share the GPUs; a group needs about 1 GB), and
  ``device="auto"`` resolves to the GPU Ray assigned (Ray sets ``CUDA_VISIBLE_DEVICES``
  per task).

Ray starts a job's worker processes as its tasks ask for them, and each imports datamask
first (~2.5 s on 2 cores): on starting or joining a local Ray, one no-op task per CPU slot
starts them all at once (:meth:`RayRunner._warm_up`), and the steps run in them. Not on a
cluster (``address``): there, with it, a two-node test cluster once ran every group step on
one node (the steps are meant to spread), so it is left as Ray schedules.

Steps are idempotent, so Ray's retries are safe: a task is retried after a lost worker or
node and after an ``OSError`` (storage hiccups), up to ``MAX_RETRIES`` times.

``ray.init`` (Ray 2.60) writes ``RAY_AUTH_MODE=token`` and two more variables into this
process's environment and leaves them after ``ray.shutdown``; every child process started
afterwards inherits them. A runner that started Ray puts them back as they were on
``close``, so a later cluster whose nodes keep their token elsewhere is not refused.
"""

from __future__ import annotations

import logging
import math
import os
import socket
from collections.abc import Callable, Iterable, Iterator, Sequence
from dataclasses import dataclass
from typing import Any

from ..io.fs import storage_env
from .executors import LocalRunner, _call_with_threads, available_cpus, check_workers

__all__ = [
    "RayRunner",
    "TaskLimits",
    "import_ray",
    "task_limits",
    "CONNECT_TIMEOUT_S",
    "MAX_RETRIES",
]

#: Times Ray runs a task again after its worker died or it raised an ``OSError``.
MAX_RETRIES = 3


def import_ray() -> Any:
    """``import ray``, or an ImportError that says how to install it."""
    try:
        import ray
    except ImportError:
        raise ImportError(
            "Please install `ray` to use RayRunner (`pip install datamask[ray]`)."
        ) from None
    return ray


#: Seconds to wait for a TCP connection to ``--ray-address`` before giving up.
CONNECT_TIMEOUT_S = 5.0


def _check_reachable(address: str, timeout: float = CONNECT_TIMEOUT_S) -> None:
    """Fail fast, in one line, when ``address`` names a host:port that does not answer.

    ``ray.init`` retries an unreachable address for minutes; a plain TCP connect with a
    short timeout says the same in seconds. ``auto`` and ``local`` are left to Ray.
    """
    if address in ("auto", "local"):
        return
    target = address.split("://", 1)[-1].rstrip("/")
    host, sep, port = target.rpartition(":")
    if not sep or not port.isdigit():
        raise ValueError(
            f"--ray-address must be auto, HOST:PORT or ray://HOST:PORT; got {address!r}."
        )
    try:
        socket.create_connection((host.strip("[]"), int(port)), timeout=timeout).close()
    except OSError as exc:
        reason = exc.strerror or type(exc).__name__
        raise ValueError(
            f"cannot reach the Ray cluster at {address!r} within {timeout:g}s ({reason}); "
            "check --ray-address, or leave it out to start a local Ray."
        ) from None


def _call(fn: Callable[..., Any], n_threads: int, *args: Any) -> Any:
    """Task body: the local pool's (pin torch's intra-op threads to the task's CPUs, bound
    the heap, run the step, trim the heap); a step's stats (a dict, alone or as
    :func:`~.engine.run_steps`' ``(index, stats)``) also say which Ray node ran it
    (``ray_node``)."""
    import ray

    result = _call_with_threads(fn, n_threads, *args)  # as a local pool's step
    stats = result[1] if isinstance(result, tuple) and len(result) == 2 else result
    if isinstance(stats, dict):
        stats["ray_node"] = ray.get_runtime_context().get_node_id()
    return result


def _start_worker() -> int:
    """Task body of the warm-up: nothing but the imports every step's worker pays once
    (``datamask``, torch, pyarrow: ~2.5 s on a 2-core machine) when Ray unpickles this
    function. Returns the worker's process id."""
    return os.getpid()


@dataclass(frozen=True)
class TaskLimits:
    """What a task asks Ray for, and how many are in flight, in CPU and in GPU phases."""

    cpu_tasks: int
    cpus_per_task: int
    gpu_tasks: int
    gpus_per_task: float


def task_limits(
    n_cpus: int,
    node_cpus: Sequence[int],
    n_gpus: int,
    workers: int | None,
    use_gpus: bool,
    gpus_per_task: float | None = None,
) -> TaskLimits:
    """In-flight limits of CPU steps and GPU steps, each from its own resource.

    ``workers`` pinned: ``workers`` steps in flight in every phase, each CPU step with
    ``n_cpus // workers`` CPUs (at most the smallest node's, so every task fits a node)
    and each GPU step with ``gpus_per_task`` (default ``1 / ceil(workers / GPUs)``).
    Not pinned: CPU steps ask one CPU each and run up to the cluster's CPUs at once; GPU
    steps ask ``gpus_per_task`` (default 1) and run up to ``floor(GPUs / gpus_per_task)``
    at once, so a GPU phase no longer sets how many scans or spills run.

    >>> task_limits(64, [16, 16, 16, 16], 4, None, True, 0.25)
    TaskLimits(cpu_tasks=64, cpus_per_task=1, gpu_tasks=16, gpus_per_task=0.25)
    >>> task_limits(64, [16, 16, 16, 16], 4, 8, True)
    TaskLimits(cpu_tasks=8, cpus_per_task=8, gpu_tasks=8, gpus_per_task=0.5)
    """
    if use_gpus and n_gpus < 1:
        raise ValueError("use_gpus=True but the Ray cluster reports no GPUs.")
    smallest = min(node_cpus or [n_cpus]) or 1
    if workers is not None:
        per_gpu = (gpus_per_task or 1 / math.ceil(workers / n_gpus)) if use_gpus else 0.0
        cpus = max(1, min(n_cpus // workers, smallest))
        return TaskLimits(workers, cpus, workers if use_gpus else 0, float(per_gpu))
    if not use_gpus:
        return TaskLimits(max(1, n_cpus), 1, 0, 0.0)
    per_gpu = gpus_per_task or 1.0
    gpu_tasks = max(1, math.floor(n_gpus / per_gpu + 1e-9))
    return TaskLimits(max(1, n_cpus), 1, gpu_tasks, float(per_gpu))


class RayRunner:
    """Schedule steps as Ray tasks.

    Parameters
    ----------
    workers : int, optional
        Tasks in flight at once in every phase, each CPU step with ``CPUs // workers``
        CPUs. Default: separate limits, CPU steps up to the cluster's CPUs (one CPU each)
        and GPU steps up to ``GPUs / gpus_per_task`` (:func:`task_limits`).
    address : str, optional
        Ray cluster address (``"auto"``, ``"ray://head:10001"``, ...). Default: the Ray
        already initialised in this process, else a new local Ray with ``max(workers,
        CPUs)`` CPUs.
    use_gpus : bool, optional
        Ask GPUs for selection tasks. Default: when the cluster has GPUs and ``device``
        is not ``"cpu"``.
    gpus_per_task : float, optional
        GPUs a GPU task asks for, in (0, 1]. Default 1, or ``1 / ceil(workers / GPUs)``
        with ``workers`` pinned: ``workers`` tasks share the cluster's GPUs.
    device : str, default="auto"
        The learner's device setting, used only to decide ``use_gpus``.

    Attributes
    ----------
    n_cpus, n_gpus : int
        Resources of the cluster when the runner started.
    cpus_per_task : int
        CPUs a CPU task asks for: 1, or ``n_cpus // workers`` (pinned), at most the
        smallest node's.
    limits : TaskLimits
        The in-flight limits of CPU and GPU steps (:func:`task_limits`).
    """

    name = "ray"

    def __init__(
        self,
        workers: int | None = None,
        address: str | None = None,
        *,
        use_gpus: bool | None = None,
        gpus_per_task: float | None = None,
        device: str = "auto",
    ) -> None:
        ray = import_ray()
        self._ray = ray
        self._started = False
        if workers is not None:
            check_workers(workers)
        if gpus_per_task is not None and not 0 < gpus_per_task <= 1:
            raise ValueError(f"gpus_per_task must be in (0, 1]; got {gpus_per_task!r}.")
        if address and not ray.is_initialized():
            _check_reachable(address)  # a TCP connect: fails fast without starting anything
        self._requested = workers
        self._address = address
        self._use_gpus_arg = use_gpus
        self._gpus_per_task_arg = gpus_per_task
        self._device = device
        self._connected = False
        self._warming: list[Any] = []
        self._env_before_init: dict[str, str | None] = {}
        if ray.is_initialized():  # a Ray already running in this process: join it now
            self._connect()

    @property
    def workers(self) -> int:
        """Tasks in flight at once (before Ray is up: the request, else this machine's cores)."""
        if self._connected:
            return self._workers

        return self._requested or available_cpus()

    def validation_runner(self) -> Any:
        """Where the validation pass runs: this runner once Ray is up or when a cluster
        address was given (joined here: its nodes read the shards, and an address that
        does not answer fails before any reading), else a local pool."""
        if self._address and not self._connected:
            self._connect()
        if self._connected:
            return self

        return LocalRunner(workers=min(self._requested or available_cpus(), available_cpus()))

    def connect(self) -> RayRunner:
        """Start (or join) Ray now rather than at the first step; returns the runner."""
        if not self._connected:
            self._connect()
        return self

    def _connect(self) -> None:
        ray = self._ray
        address, workers = self._address, self._requested
        if not ray.is_initialized():
            # Ray logs a warning about its token authentication on every start; it is
            # about Ray's own defaults, not this run, so it is silenced (auth is unchanged).
            quiet = logging.getLogger("ray._private.authentication.authentication_token_setup")
            level = quiet.level
            quiet.setLevel(logging.ERROR)
            # Storage credentials, endpoint and region reach the workers as environment
            # variables of this job's runtime_env: never in a task's arguments, a file or
            # a message (a worker node's own environment need not hold them).
            env = storage_env()
            extra: dict[str, Any] = {"runtime_env": {"env_vars": env}} if env else {}
            before = dict(os.environ)
            try:
                if address:
                    ray.init(address=address, logging_level=logging.WARNING, **extra)
                else:
                    cpus = max(workers or 0, os.cpu_count() or 1)
                    ray.init(
                        num_cpus=cpus,
                        include_dashboard=False,
                        logging_level=logging.WARNING,
                        **extra,
                    )
            except (ConnectionError, RuntimeError, TimeoutError) as exc:
                raise ValueError(
                    f"cannot start or join Ray{f' at {address!r}' if address else ''}: "
                    f"{' '.join(str(exc).split())}"
                ) from None
            finally:
                quiet.setLevel(level)
                changed = (before.keys() | os.environ.keys()) - {
                    k for k, v in before.items() if os.environ.get(k) == v
                }
                self._env_before_init = {k: before.get(k) for k in changed}
            self._started = True
        resources = ray.cluster_resources()
        self.n_cpus = int(resources.get("CPU", 1))
        self.n_gpus = int(resources.get("GPU", 0))
        use_gpus = self._use_gpus_arg
        if use_gpus is None:
            use_gpus = self.n_gpus > 0 and str(self._device).lower() != "cpu"
        if use_gpus and self.n_gpus == 0:
            raise ValueError("use_gpus=True but the Ray cluster reports no GPUs.")
        self.use_gpus = use_gpus
        nodes = [n.get("Resources", {}) for n in ray.nodes() if n.get("Alive")]
        node_cpus = [int(r.get("CPU", 0)) for r in nodes if int(r.get("CPU", 0)) > 0]
        limits = task_limits(
            self.n_cpus, node_cpus, self.n_gpus, workers, use_gpus, self._gpus_per_task_arg
        )
        self.limits = limits
        self._workers = limits.cpu_tasks
        self.cpus_per_task = limits.cpus_per_task
        self.gpus_per_task = limits.gpus_per_task
        # the most CPUs one node offers: what a whole-machine step may ask for
        self.node_cpus = max(node_cpus or [self.n_cpus]) or 1
        self.node_memory = max([int(r.get("memory", 0)) for r in nodes] or [0])
        self._connected = True
        if not address:  # a local Ray: one node (a cluster's steps are spread as they come)
            self._warm_up()

    def _warm_up(self) -> None:
        """Start the workers of the first steps now, in parallel, and do not wait for them.

        Ray starts a job's worker processes as its tasks need them, and each imports
        datamask before its first step: the first phases (a lone k-means or index step,
        then a few jobs) started them one after another. One no-op task per CPU slot
        (:func:`_start_worker`) starts them together while the driver goes on; the steps
        then run in those workers. On a 1,200-row run on a local Ray this took 13.7 s down
        to 9.3 s. The tasks' references are kept only so that :meth:`warmed` can name the
        workers."""
        remote = self._ray.remote(_start_worker).options(
            num_cpus=self.cpus_per_task, scheduling_strategy="SPREAD", max_retries=0
        )
        self._warming = [remote.remote() for _ in range(self._workers)]

    def warmed(self) -> list[int]:
        """The process ids of the workers the warm-up started (waits for them)."""
        return [int(pid) for pid in self._ray.get(self._warming)]

    def describe(self) -> dict[str, Any]:
        """Facts for the manifest."""
        if not self._connected:
            return {"runner": self.name, "workers": self.workers, "connected": False}
        return {
            "runner": self.name,
            "workers": self.workers,
            "gpu_workers": self.limits.gpu_tasks,
            "cluster_cpus": self.n_cpus,
            "cluster_gpus": self.n_gpus,
            "gpus_per_task": self.gpus_per_task,
            "cpus_per_task": self.cpus_per_task,
            "node_cpus": self.node_cpus,
        }

    def map(
        self,
        fn: Callable[..., Any],
        items: Iterable[tuple],
        *,
        use_gpu: bool = False,
        whole_machine: bool = False,
        memory: Sequence[int] | None = None,
    ) -> Iterator[Any]:
        """Run ``fn(*args)`` as a task per item; yield as they finish. At most
        ``limits.gpu_tasks`` GPU steps (``use_gpu`` on a runner with GPUs) are in flight,
        else ``limits.cpu_tasks`` (:func:`task_limits`).

        Starts (or joins) Ray on first use. A ``whole_machine`` task asks for every CPU of
        the largest node. ``memory``: bytes each item's task asks Ray for (capped at the
        largest node's memory). A step's exception is raised here as itself (a
        ``ValueError`` naming a corrupt shard stays a ``ValueError``); no further task is
        submitted, and the ones already running are left to finish.
        """
        if not self._connected:
            self._connect()
        ray = self._ray
        gpu = self.gpus_per_task if (use_gpu and self.use_gpus) else 0
        cpus = 1 if gpu else (self.node_cpus if whole_machine else self.cpus_per_task)
        limit = self.limits.gpu_tasks if gpu else self.limits.cpu_tasks
        remote = ray.remote(_call)
        options = {
            "num_cpus": cpus,
            "num_gpus": gpu,
            "max_retries": MAX_RETRIES,
            "retry_exceptions": [OSError],
            "scheduling_strategy": "SPREAD",
        }
        queue = iter(enumerate(items))
        in_flight: list[Any] = []

        def submit() -> bool:
            i, args = next(queue, (None, None))
            if args is None:
                return False
            extra = {}
            if memory is not None:  # what the group needs, at most what the largest node has
                want = int(memory[i])
                extra["memory"] = min(want, self.node_memory) if self.node_memory else want
            task = remote.options(**options, **extra)
            in_flight.append(task.remote(fn, cpus, *args))
            return True

        for _ in range(limit):
            if not submit():
                break
        # On an error, the tasks still in flight are running (at most ``workers`` are
        # submitted) and are left to finish, as the process pool's are: each step writes
        # atomically, its marker last, so a finished one is reused on resume, and ``close``
        # stops those of a Ray this runner started. No ``ray.cancel(force=True)``: in Ray
        # 2.60 a forced cancel racing the task's own completion aborted the driver with a
        # RAY_CHECK failure in TaskManager::CompletePendingTask (once in six suite runs here).
        # On a step's error the siblings in flight are waited for (not their results), so
        # none writes after the caller has cleaned up (a run refused at validation).
        while in_flight:
            done, _ = ray.wait(in_flight, num_returns=1)
            in_flight.remove(done[0])
            try:
                result = ray.get(done[0])
            except ray.exceptions.RayTaskError as exc:
                if in_flight:
                    ray.wait(in_flight, num_returns=len(in_flight))
                cause = getattr(exc, "cause", None)
                raise (cause if isinstance(cause, Exception) else exc) from None
            submit()
            yield result

    def close(self) -> None:
        """Shut Ray down if this runner started or joined it, and put back the environment
        variables ``ray.init`` set in this process (``RAY_AUTH_MODE``, ...)."""
        self._warming = []
        if self._started and self._ray.is_initialized():
            self._ray.shutdown()
        self._started = False
        for key, value in self._env_before_init.items():
            if value is None:
                os.environ.pop(key, None)
            else:
                os.environ[key] = value
        self._env_before_init = {}
