"""The step contract (:mod:`datamask.distributed.engine`) on a toy step with real files:
the resume rule, largest first, a finish without its marker refused, and what a marker
records of its outputs (size and checksum) checked on resume."""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path

import pytest

from datamask.distributed import LocalRunner, Step, execute, run_steps
from datamask.io.atomic import atomic_write_text


@dataclass(frozen=True, slots=True)
class Job:
    folder: str
    n: int


RAN: list[int] = []


class Square(Step[Job]):
    name = "square"

    def marker(self, job: Job) -> Path:
        return Path(job.folder) / "done" / f"{job.n:03d}.json"

    def outputs(self, job: Job) -> tuple[Path, ...]:
        return (Path(job.folder) / "out" / f"{job.n:03d}.txt",)

    def size(self, job: Job) -> int:
        return job.n

    def run(self, job: Job) -> dict:
        RAN.append(job.n)
        atomic_write_text(str(job.n**2) * job.n, self.outputs(job)[0])
        return {"n": job.n}


def _jobs(tmp_path: Path) -> list[Job]:
    return [Job(str(tmp_path), n) for n in (2, 5, 3)]


def test_every_job_runs_once_largest_first_and_is_reused_after(tmp_path):
    RAN.clear()
    first = run_steps(LocalRunner(), Square(), _jobs(tmp_path), progress=False)
    assert RAN == [5, 3, 2]  # largest first
    assert [r["n"] for r in first] == [2, 5, 3] and not any(r["reused"] for r in first)
    again = run_steps(LocalRunner(), Square(), _jobs(tmp_path), progress=False)
    assert RAN == [5, 3, 2] and all(r["reused"] for r in again)  # nothing ran again
    assert "objects" not in again[0]  # the records stay in the marker


def test_a_marker_records_the_size_and_checksum_of_each_output(tmp_path):
    run_steps(LocalRunner(), Square(), _jobs(tmp_path), progress=False)
    marker = json.loads((tmp_path / "done" / "005.json").read_text())
    record = marker["objects"]["005.txt"]
    assert record["size"] == len("25" * 5) and len(record["blake2b"]) == 32


def test_a_truncated_output_is_computed_again(tmp_path):
    run_steps(LocalRunner(), Square(), _jobs(tmp_path), progress=False)
    RAN.clear()
    (tmp_path / "out" / "005.txt").write_text("2")  # torn: another size than recorded
    again = run_steps(LocalRunner(), Square(), _jobs(tmp_path), progress=False)
    assert RAN == [5] and (tmp_path / "out" / "005.txt").read_text() == "25" * 5
    assert [r["reused"] for r in again] == [True, False, True]


def test_a_foreign_output_of_the_same_size_is_caught_by_the_worker(tmp_path):
    job = Job(str(tmp_path), 3)
    execute(Square(), job)
    RAN.clear()
    (tmp_path / "out" / "003.txt").write_text("xxx")  # same size, other bytes
    assert execute(Square(), job)["reused"] is False and RAN == [3]
    assert (tmp_path / "out" / "003.txt").read_text() == "999"


def test_a_missing_output_drops_its_marker_and_runs_again(tmp_path):
    run_steps(LocalRunner(), Square(), _jobs(tmp_path), progress=False)
    RAN.clear()
    (tmp_path / "out" / "002.txt").unlink()
    run_steps(LocalRunner(), Square(), _jobs(tmp_path), progress=False)
    assert RAN == [2]


def test_a_phase_that_ends_without_its_markers_is_refused(tmp_path):
    class Lost(Square):  # by a bug, what it deletes once done is its own marker
        def release(self, job: Job) -> None:
            self.marker(job).unlink()

    with pytest.raises(RuntimeError, match=r"square step\(s\) returned without their marker"):
        run_steps(LocalRunner(), Lost(), _jobs(tmp_path), progress=False)
