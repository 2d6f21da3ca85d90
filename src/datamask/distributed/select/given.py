"""A sharded run given documents already kept (``datamask select --given KEPT``).

The one-file rules (:mod:`datamask.pipeline.given`) carried over to the groups:

- **Checked with the input.** Every parquet file of ``--given`` is scanned in the run's
  validation pass (:func:`given_files`, then the scans of :mod:`..check.validate`): one
  embedding width and one id type over the input and ``--given``, no id in both, and the
  quality range taken over both (one min-max scale, by which every group scales).
- **Written once.** :class:`PrepareKept`, one step, reads ``--given`` (and
  ``--given-selection``) and writes the kept rows' ids and unit embeddings to
  ``WORK/given/kept.parquet``, its marker last (the counts the rate needs). The driver
  holds only those counts.
- **Read by every group.** Each group step reads that file and sets its rows' floors,
  their best cosine to KEPT (:func:`group_floor`, :func:`~datamask.pipeline.given.
  given_floor`): ``n_kept x dim`` float32 in each step's memory besides its own rows.
  The exchange round's step does the same and raises the floor further by the
  neighbours' kept rows (:meth:`~datamask.objectives.FacilityLocation.raise_floor`); the
  cover step adds KEPT's rows to the rows a document may be covered by.
- **The rate.** Groups trade quality against coverage at the union's rate, quality a mean
  over ``n_kept + k`` and coverage over ``n_docs + N`` (:func:`rate_totals`), so the
  gains of every group are in the union's ``J`` units and the allocation compares them.
  Under a token budget all four are tokens (:func:`token_rate_totals`; KEPT's lengths
  read by :class:`PrepareKept` from the same length column).
"""

from __future__ import annotations

import json
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import pyarrow as pa
import torch

from ..._memory import peak_rss_mb
from ..._validation import check_corpus
from ...columns import Columns
from ...config import SelectSpec
from ...data import Corpus
from ...io.datasets import input_files
from ...io.fs import Location, storage_path
from ...io.listing import expand
from ...io.parquet import atomic_write_table, features_column, features_matrix, read_table
from ...io.selection import read_selection_ids, rows_from_ids
from ...io.shards import PARQUET_SUFFIXES
from ...pipeline.given import given_floor, read_given
from ..engine import Step
from ..paths import WorkDir

__all__ = [
    "CheckGivenSelection",
    "GivenJob",
    "PrepareKept",
    "check_given_selection",
    "given_files",
    "group_floor",
    "kept_counts",
    "kept_table",
    "rate_totals",
    "token_rate_totals",
]


def given_files(given: str) -> list[str]:
    """The parquet files of ``--given`` (a file, a folder or glob of shards, a URI), in a
    fixed order; a ``save_to_disk`` folder is refused (a sharded run scans parquet). A
    remote one is listed where it lies (read in place by the steps), named ``--given``."""
    place = storage_path(str(given))
    if isinstance(place, Location):
        return [f.uri for f in expand(place, what="--given", suffixes=PARQUET_SUFFIXES)]
    kind, files = input_files(str(given))
    if kind == "arrow":
        raise ValueError(
            f"--given {given!r} is a save_to_disk folder; a sharded run reads --given as "
            "parquet: write it as parquet shards first (Dataset.to_parquet)."
        )
    if not files:
        raise ValueError(f"--given {given!r} holds no parquet files.")
    return [str(f) for f in files]


def check_given_selection(given: tuple[Any, Any], columns: Columns) -> int:
    """Refuse a ``--given-selection`` id that is not in ``--given``, before anything is
    written; a step of the validation pass. Reads ``--given``'s id column only (and the
    selection's ids). Returns the number of kept rows (all of ``--given`` without one)."""
    files = given_files(given[0])
    ids = np.concatenate(
        [
            read_table(f, columns=[columns.id_col]).column(0).to_numpy(zero_copy_only=False)
            for f in files
        ]
    )
    if given[1] is None:
        return len(ids)
    chosen = read_selection_ids(
        given[1], id_col=columns.id_col, what="--given-selection", folder=True
    ).to_pylist()
    return len(rows_from_ids(ids, chosen, f"--given-selection {given[1]}"))


@dataclass(frozen=True, slots=True)
class GivenJob:
    """Where the run's ``--given`` and ``--given-selection`` are, and its work dir."""

    spec: SelectSpec
    dirs: WorkDir
    given: tuple[Any, Any]


class CheckGivenSelection(Step[GivenJob]):
    """A step of the validation pass: :func:`check_given_selection`."""

    name = "check --given-selection"
    unit = "step"

    def run(self, job: GivenJob) -> int:
        return check_given_selection(job.given, job.spec.columns)


class PrepareKept(Step[GivenJob]):
    """Write KEPT's kept rows (id, unit embedding) to the work dir; the engine writes
    the marker last. Holds all of ``--given`` once (``n_docs x dim`` floats), in this one
    step. Stats: ``n_docs``, ``n_kept``, the files read and the seconds."""

    name = "given: kept rows"
    unit = "step"

    def marker(self, job: GivenJob) -> Path:
        return job.dirs.given_marker()

    def outputs(self, job: GivenJob) -> tuple[Path, ...]:
        return (job.dirs.given_kept(),)

    def run(self, job: GivenJob) -> dict[str, Any]:
        started = time.perf_counter()
        cols, sel = job.spec.columns, job.spec.selector
        lengths = (sel.length_col or "") if sel.token_budget else None  # "": the first one
        kept = read_given(job.given[0], cols, selection=job.given[1], lengths=lengths)
        docs = check_corpus(kept.corpus)  # unit rows, as the groups' rows are when compared
        ids = pa.array(np.asarray(docs.ids)[kept.rows])
        features = features_column(docs.features[kept.rows])
        atomic_write_table(
            pa.table({cols.id_col: ids, "features": features}), job.dirs.given_kept()
        )
        tokens_kept, tokens_docs = kept.units()  # documents, without a token budget
        return {
            "n_docs": kept.n_docs,
            "n_kept": kept.n_kept,
            "tokens_kept": tokens_kept if sel.token_budget else None,
            "tokens_docs": tokens_docs if sel.token_budget else None,
            "files": kept.files,
            "seconds": time.perf_counter() - started,
            "peak_rss_mb": peak_rss_mb(),
        }


def kept_counts(dirs: WorkDir) -> dict[str, Any]:
    """What :class:`PrepareKept` recorded: ``n_docs``, ``n_kept``, the files read."""
    return json.loads(dirs.given_marker().read_text())


def kept_table(dirs: WorkDir) -> pa.Table:
    """KEPT's kept rows as :class:`PrepareKept` wrote them (id, features)."""
    return read_table(dirs.given_kept())


def group_floor(corpus: Corpus, spec: SelectSpec, dirs: WorkDir) -> dict | None:
    """Set ``corpus.floor`` to each row's best cosine to KEPT (clipped at 0) when the run
    is given KEPT; returns what the group's stats record (sum, method), else None.

    The floor is taken between unit rows (``corpus`` checked, not changed: only its
    ``floor`` is set)."""
    if spec.selector.given is None:
        return None
    started = time.perf_counter()
    unit = check_corpus(corpus).features
    kept = torch.from_numpy(features_matrix(kept_table(dirs).column("features")).copy())
    floor, _, how = given_floor(torch.from_numpy(unit), kept)
    corpus.floor = floor.numpy().astype(np.float32)
    return {
        "sum": float(floor.double().sum()),
        "method": how,
        "seconds": time.perf_counter() - started,
    }


def rate_totals(k_total: int, n_total: int, kept: dict[str, Any] | None) -> tuple[int, int]:
    """``(k, N)`` of the ``J`` the groups' rate and gains are taken in: the input's, or,
    given KEPT, the union's (``n_kept + k`` kept of ``n_docs + N`` documents)."""
    if kept is None:
        return k_total, n_total
    return kept["n_kept"] + k_total, kept["n_docs"] + n_total


def token_rate_totals(
    total: float, corpus: float, kept: dict[str, Any] | None
) -> tuple[float, float]:
    """:func:`rate_totals` under a token budget: ``(T, L)`` of the input, or, given KEPT,
    the union's (KEPT's kept tokens and ``T``, ``--given``'s tokens and the input's)."""
    if kept is None:
        return total, corpus
    return kept["tokens_kept"] + total, kept["tokens_docs"] + corpus
