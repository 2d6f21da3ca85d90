"""datamask inside a NeMo Curator pipeline: :class:`DatamaskSelectionWorkflow`.

Shaped like Curator's ``SemanticDeduplicationWorkflow``: it reads the parquet files that
Curator's embedding stage and ``ParquetWriter`` write (an id, ``embeddings`` as a list
column, and a quality score such as the FineWeb-Edu classifier's
``fineweb-edu-score-float``), keeps ``round(select_ratio * N)`` of them with datamask's
sharded selection, and writes the ids to drop in the layout Curator's
``TextDuplicatesRemovalWorkflow`` reads::

    from nemo_curator.backends.xenna import XennaExecutor
    from datamask.integrations.curator import DatamaskSelectionWorkflow

    result = DatamaskSelectionWorkflow(
        input_path="embeddings/", output_path="datamask/", id_field="id",
        select_ratio=0.1, seed=0,
    ).run(XennaExecutor())
    result.metadata["ids_to_remove_path"]   # datamask/ids_to_remove/part.<i>.parquet

Every step of the selection (the input check, the plan, the groups, the cover, the keep
lists, the ids to remove) is one of datamask's own sharded steps, run as a task of a
Curator pipeline by the executor given (Xenna, Ray Data or the Ray actor pool): the
phases of :func:`datamask.distributed.run_selection` call :class:`CuratorRunner`, which
runs each batch of steps as one single-stage Curator pipeline. No other scheduler starts.

Curator's executors connect to the Ray cluster named by ``RAY_ADDRESS`` (Curator's
``RayClient`` sets it) and disconnect after every pipeline; a step's result comes back to
the driver as the output task. Install with ``pip install "datamask[curator]"``.
"""

from __future__ import annotations

import os
import shutil
import signal
import socket
import tempfile
import time
from collections.abc import Callable, Iterable, Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

try:
    from nemo_curator.backends.base import BaseExecutor
    from nemo_curator.pipeline import Pipeline
    from nemo_curator.pipeline.workflow import WorkflowBase, WorkflowRunResult
    from nemo_curator.stages.base import ProcessingStage
    from nemo_curator.stages.resources import Resources
    from nemo_curator.tasks import Task
except ImportError as exc:  # pragma: no cover - exercised only without the extra
    raise ImportError(
        "Please install `nemo-curator` to use datamask.integrations.curator "
        '(`pip install "datamask[curator]"`).'
    ) from exc

import pyarrow.compute as pc

from .._device import set_threads
from ..api import select
from ..applying.write import _write_removed_ids
from ..distributed.engine import Step
from ..distributed.executors import available_cpus, check_workers
from ..io.fs import resolve
from ..io.parquet import read_table
from ..settings import BUDGET_KEYS

__all__ = [
    "CuratorRunner",
    "DatamaskSelectionWorkflow",
    "DatamaskStepStage",
    "StepTask",
    "local_ray_cluster",
]

#: Subfolders of ``output_path``: datamask's selection and Curator's ids to remove.
SELECTION_DIR = "selection"
IDS_TO_REMOVE_DIR = "ids_to_remove"


@dataclass
class StepTask(Task[tuple]):
    """One call of a datamask step: ``data`` is ``(index, args)`` going in and
    ``(index, result)`` coming out."""

    @property
    def num_items(self) -> int:
        return 1

    def validate(self) -> bool:
        return isinstance(self.data, tuple) and len(self.data) == 2


class DatamaskStepStage(ProcessingStage[StepTask, StepTask]):
    """A Curator stage that calls one datamask step ``fn(*args)`` per task.

    Parameters
    ----------
    fn : callable
        A pure datamask step (module-level, so it pickles to the workers).
    name : str
        The stage's name in Curator's logs and timings.
    workers : int
        Workers the executor starts for the stage (one CPU each).
    threads : int or None
        torch and BLAS threads each call uses (:func:`datamask._device.set_threads`; None:
        every core of the worker's machine).
    """

    name = "datamask_step"
    resources = Resources(cpus=1.0)

    def __init__(
        self, fn: Callable[..., Any], name: str, workers: int, threads: int | None
    ) -> None:
        self.fn = fn
        self.name = name
        self.workers = workers
        self.threads = threads

    def num_workers(self) -> int | None:
        return self.workers

    def process(self, task: StepTask) -> StepTask:
        index, args = task.data
        set_threads(self.threads)
        return StepTask(dataset_name=task.dataset_name, data=(index, self.fn(*args)))


class CuratorRunner:
    """datamask's :class:`~datamask.distributed.executors.Runner`, scheduled by a Curator
    executor: each :meth:`map` is one Curator pipeline of one :class:`DatamaskStepStage`.

    Parameters
    ----------
    executor : nemo_curator.backends.base.BaseExecutor
        XennaExecutor, RayDataExecutor or RayActorPoolExecutor.
    workers : int, optional
        Steps run at once, one CPU each (default: the CPUs available to this process, as
        ``datamask select`` runs its local pool; give the cluster's CPUs on a cluster).

    Notes
    -----
    A ``whole_machine`` step (the central round) asks one CPU of Curator and sets its
    threads to the cores of the machine it lands on. ``memory`` estimates are not passed
    on: Curator's ``Resources`` reserve CPUs and GPUs only.
    """

    name = "curator"

    def __init__(self, executor: BaseExecutor, workers: int | None = None) -> None:
        if not isinstance(executor, BaseExecutor):
            raise TypeError(
                "executor must be a Curator executor (nemo_curator.backends: XennaExecutor, "
                f"RayDataExecutor, RayActorPoolExecutor); got {type(executor).__name__}."
            )
        self.executor = executor
        self.workers = check_workers(workers) if workers is not None else available_cpus()
        #: Per map call: the step's name, tasks, and seconds (pipeline start to results).
        self.calls: list[dict[str, Any]] = []

    def map(
        self,
        fn: Callable[..., Any],
        items: Iterable[tuple],
        *,
        use_gpu: bool = False,
        whole_machine: bool = False,
        memory: Sequence[int] | None = None,
    ) -> Iterator[Any]:
        jobs = list(items)
        if not jobs:
            return
        started = time.perf_counter()
        first = jobs[0][0] if isinstance(jobs[0], tuple) and jobs[0] else None
        # an engine step (run_steps maps (step, index, job)): its class names it
        step = type(first).__name__ if isinstance(first, Step) else getattr(fn, "__name__", "step")
        threads = None if whole_machine else 1  # None: every core of the worker's machine
        stage = DatamaskStepStage(fn, f"datamask_{step}", min(self.workers, len(jobs)), threads)
        pipeline = Pipeline(name=f"datamask_{step}", description=f"datamask step {step}")
        pipeline.add_stage(stage)
        tasks = [StepTask(dataset_name="datamask", data=(i, args)) for i, args in enumerate(jobs)]
        out = pipeline.run(self.executor, initial_tasks=tasks) or []
        results = dict(task.data for task in out)
        if sorted(results) != list(range(len(jobs))):
            raise RuntimeError(
                f"the Curator executor returned {len(results)} of {len(jobs)} results of step "
                f"{step!r}; please report this."
            )
        seconds = time.perf_counter() - started
        self.calls.append({"step": step, "tasks": len(jobs), "seconds": seconds})
        for i in range(len(jobs)):
            yield results[i]

    def close(self) -> None:
        """Nothing to release: each pipeline run connects to Ray and disconnects."""

    def describe(self) -> dict[str, Any]:
        return {
            "runner": self.name,
            "executor": type(self.executor).__name__,
            "workers": self.workers,
        }


def _removal_ids_step(covered: str, id_col: str, target: str) -> int:
    """Write the dropped ids of one covered part (``OUT/covered/part-NNNNN.parquet``) in
    Curator's removal layout, with ``datamask apply --removed-format curator``'s writer."""
    table = read_table(resolve(covered), columns=[id_col, "selected"])
    dropped = table.filter(pc.invert(table.column("selected"))).column(id_col)
    _write_removed_ids([dropped], resolve(target), id_col, "curator", dropped.type)
    return len(dropped)


@dataclass
class DatamaskSelectionWorkflow(WorkflowBase):
    """Keep the best ``select_ratio`` of a Curator-embedded corpus; write the ids to drop.

    Parameters
    ----------
    input_path : str or list of str
        Parquet shards (folder, glob, list; local or ``s3://``/``gs://``) as Curator's
        ``ParquetWriter`` wrote them.
    output_path : str
        Writes ``selection/`` (datamask's sharded select output: ``selected/``,
        ``covered/``, ``keep/``, ``manifest.json``) and ``ids_to_remove/part.<i>.parquet``
        (one sorted ``id`` column: ``TextDuplicatesRemovalWorkflow(ids_to_remove_path=...,
        duplicate_id_field="id")``).
    id_field : str, default="id"
        The documents' id column (Curator's ``_curator_dedup_id`` works too).
    embedding_field : str, default="embeddings"
        Curator's embedding column (list of floats, as its embedders write it).
    quality_fields : str or list of str, optional
        Quality column(s). Default: the ``curator`` preset's first present of
        ``fineweb-edu-score-float``, ``fineweb-edu-score``, ``quality_score``, ``score``.
    select_ratio, k, select_token_ratio, budget_tokens : optional
        Keep ``round(select_ratio * N)`` documents, or ``k``, or a share of the tokens, or
        ``budget_tokens`` tokens (docs/method.md "Token budgets"); one of them.
    length_field : str, optional
        The column of each document's length for a token budget (token counts, or the
        ``text`` column counted in characters; default: the first of n_chars, length,
        n_tokens, text present).
    lamb : float, optional
        Weight of the diversity term (datamask's default when None).
    method : str, optional
        datamask's algorithm (``mask``, ``lazy``, ``topk``, ...; default ``mask``).
    seed : int, default=0
        Same seed, same files: the selection of ``datamask select`` on those files.
    workers : int, optional
        Steps at once (see :class:`CuratorRunner`).
    select_kwargs : dict
        Any other setting of ``datamask select`` by its key (``partition``,
        ``n_epochs``, ...).
    progress : bool, default=False
        datamask's progress bars (Curator logs each pipeline anyway).

    Examples
    --------
    >>> wf = DatamaskSelectionWorkflow("emb/", "out/", select_ratio=0.1)
    >>> wf.ids_to_remove_path.endswith("ids_to_remove")
    True
    """

    input_path: str | list[str]
    output_path: str
    id_field: str = "id"
    embedding_field: str = "embeddings"
    quality_fields: str | list[str] | None = None
    select_ratio: float | None = None
    k: int | None = None
    select_token_ratio: float | None = None
    budget_tokens: float | None = None
    length_field: str | None = None
    lamb: float | None = None
    method: str | None = None
    seed: int = 0
    workers: int | None = None
    select_kwargs: dict[str, Any] = field(default_factory=dict)
    progress: bool = False

    def __post_init__(self) -> None:
        given = {key: getattr(self, key) for key in BUDGET_KEYS}
        if sum(v is not None for v in given.values()) != 1:
            got = ", ".join(f"{key}={value!r}" for key, value in given.items())
            raise ValueError(f"give one of {', '.join(BUDGET_KEYS)}; got {got}.")
        self.selection_path = os.path.join(self.output_path, SELECTION_DIR)
        self.ids_to_remove_path = os.path.join(self.output_path, IDS_TO_REMOVE_DIR)

    def select_settings(self) -> dict[str, Any]:
        """The ``datamask select`` settings this workflow runs (the CLI's keys)."""
        settings: dict[str, Any] = {
            "preset": "curator",
            "id_col": self.id_field,
            "feature_col": self.embedding_field,
            "seed": self.seed,
            "progress": self.progress,
            **self.select_kwargs,
        }
        if self.quality_fields is not None:
            fields = self.quality_fields
            settings["quality_col"] = [fields] if isinstance(fields, str) else list(fields)
        for key in (*BUDGET_KEYS, "lamb", "method"):
            if getattr(self, key) is not None:
                settings[key] = getattr(self, key)
        if self.length_field is not None:
            settings["length_col"] = self.length_field
        return settings

    def run(self, executor: BaseExecutor | None = None) -> WorkflowRunResult:
        """Select, then write the ids to remove; every step through ``executor``.

        Parameters
        ----------
        executor : BaseExecutor, optional
            Default ``XennaExecutor()``, as Curator's ``Pipeline.run``.

        Returns
        -------
        WorkflowRunResult
            ``metadata``: ``selection_path``, ``ids_to_remove_path``, ``n_documents``,
            ``n_selected``, ``n_removed``, ``seconds`` (per phase), ``executor``,
            ``pipelines`` (one entry per Curator pipeline run: step, tasks, seconds).
        """
        if executor is None:
            from nemo_curator.backends.xenna import XennaExecutor

            executor = XennaExecutor()
        started = time.perf_counter()
        runner = CuratorRunner(executor, workers=self.workers)
        result = WorkflowRunResult(workflow_name="datamask_selection")
        manifest = select(
            self.input_path, self.selection_path, scheduler=runner, **self.select_settings()
        )
        select_s = time.perf_counter() - started
        removal_started = time.perf_counter()
        n_removed = self._write_ids_to_remove(runner)
        seconds = {
            **{f"select.{k}": v for k, v in manifest["totals"]["seconds"].items()},
            "select": select_s,
            "ids_to_remove": time.perf_counter() - removal_started,
            "total": time.perf_counter() - started,
        }
        result.extend_metadata(
            {
                "selection_path": self.selection_path,
                "ids_to_remove_path": self.ids_to_remove_path,
                "n_documents": manifest["totals"]["n_docs"],
                "n_selected": manifest["totals"]["k"],
                "n_removed": n_removed,
                "seconds": seconds,
                "executor": type(executor).__name__,
                "pipelines": runner.calls,
            }
        )
        return result

    def _write_ids_to_remove(self, runner: CuratorRunner) -> int:
        """One step per covered part: its dropped ids as ``part.<g>.parquet`` (local or
        object storage, as the selection)."""
        parts = resolve(self.selection_path).join("covered").glob("part-*.parquet")
        out = resolve(self.ids_to_remove_path)
        for stale in out.glob("part.*.parquet") if out.is_dir() else []:
            stale.delete()  # a rerun with fewer groups leaves no stale part
        jobs = [
            (p.uri, self.id_field, out.join(f"part.{g}.parquet").uri) for g, p in enumerate(parts)
        ]
        return sum(runner.map(_removal_ids_step, jobs))


def _free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


def _end_leftovers(root: str) -> None:
    """Kill the Ray workers of the cluster under ``root`` that outlived its shutdown.

    A Ray worker whose node is gone returns from its main thread, and Python then waits for
    the worker's non-daemon threads: Xenna's ``NodeResourceMonitor`` (and at times a
    ``StageWorker``) runs one that never stops, so its process would poll forever after
    the cluster ended. Ray titles its workers ``ray::...``; the cluster's carry its
    ``RAY_TMPDIR``. Linux (``/proc``); elsewhere a no-op.
    """
    mark = f"RAY_TMPDIR={root}".encode()
    table = Path("/proc")
    if not table.is_dir():
        return
    for proc in table.iterdir():
        try:
            if not proc.name.isdigit() or int(proc.name) == os.getpid():
                continue
            title = (proc / "cmdline").read_bytes().split(b"\0")[0]
            if title.startswith(b"ray::") and mark in (proc / "environ").read_bytes().split(b"\0"):
                os.kill(int(proc.name), signal.SIGKILL)
        except (OSError, ValueError):  # ended meanwhile, or not ours to read
            continue


@contextmanager
def local_ray_cluster(num_cpus: int = 2, *, dashboard: bool = True) -> Iterator[str]:
    """A one-node Ray cluster for this process's Curator executors; stopped on exit.

    What Curator's ``RayClient`` does (a head node in its own process, ``RAY_ADDRESS``
    set), with ports and a temp folder of its own, so that several run on one host.
    Xenna needs the dashboard (its actor state API).

    Yields
    ------
    str
        The cluster's address, also in ``os.environ["RAY_ADDRESS"]`` until exit.
    """
    from ray.cluster_utils import Cluster

    root = tempfile.mkdtemp(prefix="dmcur", dir="/tmp")  # short: Ray's socket paths
    saved = {k: os.environ.get(k) for k in ("RAY_ADDRESS", "RAY_TMPDIR")}
    os.environ["RAY_TMPDIR"] = root  # the address file goes here, not to a shared /tmp/ray
    head: dict[str, Any] = {
        "num_cpus": num_cpus,
        "temp_dir": os.path.join(root, "ray"),
        "include_dashboard": dashboard,
        "gcs_server_port": _free_port(),
    }
    if dashboard:
        head["dashboard_port"] = _free_port()
    nodes = None
    try:
        nodes = Cluster(initialize_head=True, head_node_args=head)
        os.environ["RAY_ADDRESS"] = nodes.address
        yield nodes.address
    finally:
        try:
            if nodes is not None:
                nodes.shutdown()
        finally:  # a shutdown that failed too leaves no worker, variable or folder behind
            _end_leftovers(root)
            for key, value in saved.items():
                if value is None:
                    os.environ.pop(key, None)
                else:
                    os.environ[key] = value
            shutil.rmtree(root, ignore_errors=True)
