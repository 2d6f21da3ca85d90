"""One step contract for every step of a sharded run, and the one place that runs them.

A step (after datatrove's ``PipelineStep`` and its executor's ``completions/``) is a
:class:`Step` subclass with a frozen job dataclass: ``run(job)`` reads what the job names,
writes its files atomically and returns its stats; ``marker(job)`` is where the engine
records that the job finished, and ``outputs(job)`` the files that must be there with
it. :func:`run_steps` alone decides what is done:

1. one listing of the markers' folder (and one of each output folder), not one request a
   job; a job whose marker and outputs are present, its outputs of the sizes its marker
   recorded, and whose marker the step :meth:`~Step.accepts`, is reused, its stats read
   from the marker;
2. the others run on the runner, largest first (:func:`~.executors.largest_first`), under
   one progress bar that starts where a killed run stopped;
3. each job, in its worker, checks again (:func:`execute`: a second run or a retried task
   finds the marker; there every output is read and checked against its record), runs,
   and writes the marker last (:func:`finish`) with the size and checksum of each output
   as it was published (:func:`~datamask.io.integrity.recording`: taken from the local
   temporary, no request);
4. a phase that ends with a job unmarked is refused: ``RuntimeError`` naming the jobs.

Steps without a marker (a cheap read, a digest) run every time; the engine still
schedules, orders and counts them. Results come back in the jobs' order.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any, ClassVar, Generic, TypeVar

from tqdm.auto import tqdm

from ..io.atomic import atomic_write_json
from ..io.fs import sizes_in
from ..io.integrity import recording
from ..io.verify import check_object
from .executors import Runner, largest_first
from .lifecycle import read_marker
from .paths import Place

__all__ = ["Step", "amend", "execute", "finish", "finished", "run_steps", "unfinished"]

JobT = TypeVar("JobT")


class Step(Generic[JobT]):
    """A kind of step: its name, how its jobs are scheduled, its marker and ``run``.

    Subclasses are stateless (an instance is pickled to every worker with each job):
    everything a job needs is in the job, a frozen dataclass.
    """

    #: What the progress bar says, and what errors call the step.
    name: ClassVar[str] = "step"
    #: What one job is (``group``, ``shard``, ``bucket``...), for the progress bar.
    unit: ClassVar[str] = "group"
    #: Whether a job may run on a GPU (the runner gives it one where it has them).
    use_gpu: ClassVar[bool] = False
    #: Whether a job may use every core of one machine (a lone central step).
    whole_machine: ClassVar[bool] = False

    def marker(self, job: JobT) -> Place | None:
        """Where a finished job's stats are recorded; None: the step is not resumable
        (it runs every time)."""
        return None

    def outputs(self, job: JobT) -> Sequence[Place]:
        """Files a finished job leaves besides its marker (all must be present)."""
        return ()

    def accepts(self, job: JobT, done: dict[str, Any]) -> bool:
        """Whether a marker's stats ``done`` finish this very job (a group asked for more
        candidates since, say, is not finished by its first marker)."""
        return True

    def size(self, job: JobT) -> int:
        """The job's rows, for the order (largest first) and the bar's rows/s."""
        return 0

    def memory(self, job: JobT) -> int | None:
        """Bytes the job is expected to hold, for schedulers that reserve memory."""
        return None

    def run(self, job: JobT) -> Any:
        """Do the job: read, compute, write its outputs atomically; return its stats."""
        raise NotImplementedError

    def release(self, job: JobT) -> None:
        """After the marker (or on finding it): delete what only this job needed."""


def finished(step: Step[JobT], job: JobT) -> dict[str, Any] | None:
    """The stats of ``job`` if it is finished (marker readable, outputs present, accepted);
    None otherwise. The resume rule, for one job, as a worker checks it."""
    marker = step.marker(job)
    if marker is None:
        return None
    done = read_marker(marker)
    if done is None or not step.accepts(job, done):
        return None
    records = done.pop(OBJECTS, {})
    for place in step.outputs(job):
        try:
            check_object(place, records[place.name])
        except (KeyError, ValueError):  # missing, torn, foreign, or never recorded
            return None
    return done


def finish(step: Step[JobT], job: JobT, stats: Any, book: dict[str, Any]) -> Any:
    """Record that ``job`` finished: its stats as its marker, written last, with what each
    of its outputs was when published (``book``: :func:`~datamask.io.integrity.recording`)."""
    marker = step.marker(job)
    if marker is None:
        return stats
    records = {o.name: book[str(o)] for o in step.outputs(job) if str(o) in book}
    atomic_write_json({**stats, OBJECTS: records}, marker)
    return {**stats, "reused": False}


def amend(marker: Place, book: dict[str, Any]) -> None:
    """A later phase rewrote outputs of a finished job (the similarity cap rewrites a
    group's part): record what it published (``book``: a
    :func:`~datamask.io.integrity.recording`) in that job's marker, so a resume still
    finds the job finished."""
    done = read_marker(marker)
    if done is None:
        return
    records = done.setdefault(OBJECTS, {})
    for target, record in book.items():
        name = target.rstrip("/").rsplit("/", 1)[-1]
        if name in records:
            records[name] = record
    atomic_write_json(done, marker)


def execute(step: Step[JobT], job: JobT, run: Callable[[JobT], Any] | None = None) -> Any:
    """One job, in a worker, under the resume rule: reused if finished, else run and
    marked. Steps call nothing else to be resumable.

    ``run``: how to do the job instead of ``step.run``, with what the caller holds
    already (the check pass spills the rows it has just read, :mod:`.check.validate`); the
    same outputs and marker, under the same rule."""
    done = finished(step, job)
    if done is None:
        with recording(step.outputs(job)) as book:  # only what the marker will keep
            stats = (run or step.run)(job)
        done = finish(step, job, stats, book)
    else:
        done = {**done, "reused": True}
    step.release(job)
    return done


def _execute_at(step: Step[JobT], index: int, job: JobT) -> tuple[int, Any]:
    return index, execute(step, job)


#: The key of a marker's records of its outputs (name -> size and checksum).
OBJECTS = "objects"


@dataclass
class _Listings:
    """Folder listings taken once per phase: which markers and outputs exist, and their
    sizes."""

    sizes: dict[str, dict[str, int]] = field(default_factory=dict)

    def size(self, place: Place) -> int | None:
        folder = str(place.parent)
        if folder not in self.sizes:
            self.sizes[folder] = sizes_in(place.parent)
        return self.sizes[folder].get(place.name)

    def has(self, place: Place) -> bool:
        return self.size(place) is not None


def _reusable(step: Step[JobT], job: JobT, listings: _Listings) -> dict[str, Any] | None:
    """The driver's view of :func:`finished`: presence from the listings, then one read
    of the marker (a marker without its outputs, or not accepted, is dropped: its job is
    run again, and a later crash cannot leave it looking finished)."""
    marker = step.marker(job)
    if marker is None or not listings.has(marker):
        return None
    done = read_marker(marker)
    if done is not None and step.accepts(job, done):
        records = done.pop(OBJECTS, {})
        sizes = [(listings.size(o), records.get(o.name, {}).get("size")) for o in step.outputs(job)]
        if all(there is not None and wrote in (None, there) for there, wrote in sizes):
            return {**done, "reused": True}
    marker.unlink(missing_ok=True)
    return None


def unfinished(step: Step[JobT], jobs: Sequence[JobT]) -> list[int]:
    """Which of ``jobs`` :func:`run_steps` would run (the driver's view: one listing, then
    the markers), for a phase that does some of a step's jobs inside another step (the
    check pass writes the spills, :mod:`.check.validate`, each job under :func:`execute`)."""
    listings = _Listings()
    return [i for i, job in enumerate(jobs) if _reusable(step, job, listings) is None]


def run_steps(
    runner: Runner,
    step: Step[JobT],
    jobs: Sequence[JobT],
    *,
    progress: bool,
    desc: str | None = None,
    keep: Callable[[Any], Any] | None = None,
) -> list[Any]:
    """Run ``step`` on every job that is not finished; return every job's stats, in the
    jobs' order (reused ones from their markers).

    ``keep``: what the driver keeps of each job's stats as it arrives (default: all of
    it); at 10^5 groups a marker's few KB each would be the driver's largest term.
    """
    keep = keep or (lambda stats: stats)
    listings = _Listings()
    results: list[Any] = [None] * len(jobs)
    pending = []
    for i, job in enumerate(jobs):
        done = _reusable(step, job, listings)
        if done is None:
            pending.append(i)
        else:
            results[i] = keep(done)
    del listings  # the folders' names: O(jobs) strings, not held while the steps run
    pending = [pending[j] for j in largest_first([step.size(jobs[i]) for i in pending])]
    memory = [step.memory(jobs[i]) for i in pending]
    bar = tqdm(
        total=len(jobs),
        initial=len(jobs) - len(pending),  # a resumed run starts where the last one stopped
        desc=desc or step.name,
        unit=step.unit,
        disable=not progress,
        dynamic_ncols=True,
    )
    started, rows = time.perf_counter(), 0
    try:
        items = ((step, i, jobs[i]) for i in pending)
        for i, stats in runner.map(
            _execute_at,
            items,
            use_gpu=step.use_gpu,
            whole_machine=step.whole_machine,
            memory=None if any(m is None for m in memory) else memory,
        ):
            results[i] = keep(stats)  # the records stay in the marker (finish)
            rows += step.size(jobs[i])
            if rows:
                rate = rows / max(time.perf_counter() - started, 1e-9)
                bar.set_postfix(docs_per_s=f"{rate:,.0f}")
            bar.update(1)
    finally:
        bar.close()
    _check_marked(step, jobs, pending)
    return results


def _check_marked(step: Step[JobT], jobs: Sequence[JobT], ran: list[int]) -> None:
    """Refuse a phase whose jobs returned without their markers (one listing again)."""
    listings = _Listings()
    missing = [i for i in ran if (m := step.marker(jobs[i])) is not None and not listings.has(m)]
    if missing:
        raise RuntimeError(
            f"{len(missing)} {step.name} step(s) returned without their marker (first: "
            f"{step.marker(jobs[missing[0]])}); rerun the same command to resume."
        )
