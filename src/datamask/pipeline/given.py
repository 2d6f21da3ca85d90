"""Selecting given documents already kept (``datamask select --given KEPT``).

KEPT is a corpus already selected (the last dump's selection, an existing source); the
run selects ``k`` documents from the new input only and never changes KEPT. What is
maximised is the objective of the union, ``J(KEPT ∪ S)`` scored over every document of
KEPT and of the input, as ``datamask evaluate`` scores it, with S chosen among the new
documents:

- **Coverage.** A kept document covers itself (cosine 1), so only the new documents
  gain: new document i is already covered up to its floor, ``floor_i = max(0,
  max_{j in KEPT} <x_i, x_j>)`` (:func:`given_floor`), and S adds
  ``max(0, max_{j in S} <x_i, x_j> - floor_i)``. Facility location counts only that
  (:attr:`datamask.data.Corpus.floor`).
- **Quality** is min-max scaled over KEPT ∪ input, one scale for both.
- **The rate.** The union's quality is a mean over ``n_kept + k`` documents and its
  coverage a mean over ``n_kept + n_new``, so the new documents' objective is run at
  :func:`~datamask.objectives.combined.group_lamb` of those counts: then ``J`` of the new
  documents given KEPT (at that ``lamb``) is an increasing affine function of the union's
  ``J``, and both rank every S alike.

The summary reports ``terms`` (``J_given`` at the run's ``lamb``: quality of S, mean
coverage the new documents gain above their floors) and ``terms_union`` (``J`` of
KEPT ∪ S over every document of both). docs/incremental.md.
"""

from __future__ import annotations

import time
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

import numpy as np
import torch

from .._validation import check_corpus, first_duplicate
from ..columns import Columns
from ..config import ObjectiveSpec, SelectSpec
from ..data import Corpus
from ..io.datasets import input_files, read_input_corpus
from ..io.parquet import corpus_from_tables, read_table
from ..io.selection import read_selection_ids, rows_from_ids
from ..neighbors import best_match
from ..objectives import FacilityLocation, TermContext
from ..objectives.combined import group_lamb

__all__ = [
    "Given",
    "check_given_terms",
    "evaluate_given",
    "given_floor",
    "given_spec",
    "given_terms",
    "prepare_given",
    "read_given",
]


@dataclass
class Given:
    """Documents already kept: the rows of KEPT, their files and how they were chosen.

    Attributes
    ----------
    corpus : Corpus
        The kept rows (features unit rows once :func:`prepare_given` checked them).
    files : list of str
        The parquet files read (empty for a ``save_to_disk`` folder), for provenance.
    source : str
        ``--given`` as given.
    selection : str or None
        ``--given-selection``: only the rows of KEPT that selection keeps.
    """

    corpus: Corpus
    files: list[str]
    source: str
    selection: str | None = None

    @property
    def n_docs(self) -> int:
        return self.corpus.n_docs


def read_given(
    source: str | Path, columns: Columns, *, selection: str | Path | None = None
) -> Given:
    """KEPT read with the run's columns: a parquet file, a folder or glob of parquet
    shards, or a ``save_to_disk`` folder; with ``selection`` (a ``datamask select``
    output, a parquet or text file of ids) only the rows it keeps.

    The whole of KEPT is held in memory (``n_kept x dim`` floats)."""
    where = str(source)
    kind, files = input_files(where)
    if kind == "arrow":
        corpus = read_input_corpus(where, columns)
        names: list[str] = []
    else:
        if not files:
            raise ValueError(f"--given {where!r} holds no parquet files.")
        tables = [(read_table(f, columns=columns.read), str(f)) for f in files]
        corpus, _ = corpus_from_tables(tables, columns, source=f"--given {where}")
        names = [str(f) for f in files]
    if selection is not None:
        ids = read_selection_ids(selection, id_col=columns.id_col).to_pylist()
        rows = rows_from_ids(corpus.ids, ids, f"--given-selection {selection}")
        rows.sort()
        corpus = replace(
            corpus,
            ids=corpus.ids[rows],
            quality=corpus.quality[rows],
            features=corpus.features[rows],
        )
    corpus.source = f"--given {where}"
    return Given(corpus, names, where, None if selection is None else str(selection))


def _check_pair(new: Corpus, kept: Corpus, id_col: str) -> None:
    """Refuse a KEPT that cannot stand beside the input: another embedding width, another
    id type, or an id in both."""
    if kept.dim != new.dim:
        raise ValueError(
            f"embedding width {kept.dim} in {kept.source} does not match {new.dim} in "
            f"{new.source}; embed both with the same model."
        )
    kinds = {"i": "integers", "u": "integers"}
    k_kind = kinds.get(np.asarray(kept.ids).dtype.kind, "strings")
    n_kind = kinds.get(np.asarray(new.ids).dtype.kind, "strings")
    if k_kind != n_kind:
        raise ValueError(
            f"column {id_col!r} holds {k_kind} in {kept.source} but {n_kind} in "
            f"{new.source}; store ids with one type."
        )
    both = np.concatenate([np.asarray(kept.ids, dtype=object), np.asarray(new.ids, dtype=object)])
    dup = first_duplicate(both)
    if dup is None:
        return
    first, again = dup
    nk = kept.n_docs
    if again < nk:
        where = f"rows {first} and {again} of {kept.source}"
    elif first >= nk:
        where = f"rows {first - nk} and {again - nk} of {new.source}"
    else:
        where = f"row {first} of {kept.source} and row {again - nk} of {new.source}"
    count = len(both) - len(np.unique(both.astype(str)))
    raise ValueError(
        f"{id_col} {both[again]!r} occurs more than once ({where}; {count} repeated ids in "
        "all); ids must be unique across --given and --input: drop the documents already "
        "kept from the input."
    )


def given_floor(
    new: torch.Tensor, kept: torch.Tensor, *, method: str = "auto"
) -> tuple[torch.Tensor, torch.Tensor, str]:
    """Each new document's floor, its best cosine to KEPT clipped at 0, and the KEPT row
    giving it: ``(floor, index, method)``.

    :func:`~datamask.neighbors.best_match` in blocks (exact up to ``AUTO_EXACT_MAX ** 2``
    pairs, the ivf search above); ``index`` is the row of KEPT (-1 where the search found
    none), what a dropped new document's ``covered_by`` names when KEPT covers it best.
    """
    sims, index, how = best_match(new, kept, method=method)
    return sims.clamp_min(0.0), index, how


def prepare_given(corpus: Corpus, given: Given, *, id_col: str) -> dict[str, Any]:
    """Check KEPT against the input, put both on one quality scale and set the input's
    floor (in place on ``corpus`` and ``given.corpus``). Returns what the summary records:
    counts, the floor's method, mean and seconds, and the quality scale."""
    started = time.perf_counter()
    kept = given.corpus
    check_corpus(kept)  # NaN, empty, duplicate ids inside KEPT; unit rows
    check_corpus(corpus)
    _check_pair(corpus, kept, id_col)
    q = np.concatenate([kept.quality, corpus.quality])
    scale = (q.min(axis=0), q.max(axis=0))
    corpus.quality_range = kept.quality_range = scale
    floor, index, how = given_floor(
        torch.from_numpy(corpus.features), torch.from_numpy(kept.features)
    )
    corpus.floor = floor.numpy().astype(np.float32)
    return {
        "source": given.source,
        "selection": given.selection,
        "n_docs": kept.n_docs,
        "quality_scale": "min-max over --given and --input together",
        "quality_range": [scale[0].tolist(), scale[1].tolist()],
        "floor": {
            "method": how,
            "mean": float(floor.double().mean()),
            "seconds": time.perf_counter() - started,
        },
        "floor_index": index.numpy(),  # not JSON: popped by the caller
    }


def check_given_terms(objective: ObjectiveSpec) -> None:
    """Refuse diversity terms that have no floor (only facility location has one)."""
    other = [t.name for t in objective.make().diversity if not t.takes_floor]
    if other:
        raise ValueError(
            f"--given counts coverage above the documents already kept, which only facility "
            f"location has; got --algorithm {list(objective.algorithm)}. Use "
            "--algorithm Facility."
        )


def evaluate_given(
    corpus: Corpus, given: Given, selected: np.ndarray, objective: ObjectiveSpec, *, id_col: str
) -> dict[str, Any]:
    """``datamask evaluate --given``: the new rows ``selected`` scored given KEPT, as
    ``select --given`` scores them (:func:`prepare_given`, then :func:`given_terms`; sets
    the floor and the union's quality scale on ``corpus``). Returns the ``given`` block:
    KEPT, the floor, the scale, ``terms`` (J given, at ``objective.lamb``) and
    ``terms_union``."""
    check_given_terms(objective)
    info = prepare_given(corpus, given, id_col=id_col)
    info.pop("floor_index")
    scored = given_terms(corpus, given.corpus, selected, objective.lamb)
    return {**info, "terms": scored["given"], "terms_union": scored["union"]}


def given_spec(spec: SelectSpec, k: int, n_new: int, n_kept: int) -> SelectSpec:
    """The spec the new documents are selected with: the objective at the union's rate
    (:func:`~datamask.objectives.combined.group_lamb` of ``k`` of ``n_new`` against
    ``n_kept + k`` of ``n_kept + n_new``). Refuses terms other than facility location."""
    check_given_terms(spec.objective)
    lamb = group_lamb(spec.objective.lamb, k, n_new, n_kept + k, n_kept + n_new)
    checked = spec.__dict__.get("_checked")
    out = replace(spec, objective=replace(spec.objective, lamb=lamb))
    if checked:
        object.__setattr__(out, "_checked", True)
    return out


def given_terms(
    corpus: Corpus, kept: Corpus, selected: np.ndarray, lamb: float
) -> dict[str, dict[str, float]]:
    """``J`` of the new rows ``selected`` given KEPT, exact (dense, in blocks; the floor as
    :func:`prepare_given` set it).

    Returns ``{"given": {"quality", "facility", "J"}, "union": {...}}``: ``given`` is
    ``lamb * mean_{S} q + (1 - lamb) * mean_{i new} max(0, cover_S(i) - floor_i)``;
    ``union`` is ``J(KEPT ∪ S)`` over every document of both (kept ones cover themselves
    at 1), what ``datamask evaluate`` of the union reports.
    """
    sel = torch.as_tensor(np.asarray(selected, dtype=np.int64))
    x = torch.from_numpy(corpus.features)
    floor = None if corpus.floor is None else torch.from_numpy(corpus.floor).to(x.dtype)
    term = FacilityLocation().bind(TermContext.create(x, None, max(len(sel), 1), floor=floor))
    above = term.coverage(sel).double()
    q_new = corpus.normalized_quality()
    q_kept = kept.normalized_quality()
    k, nk, nn = len(sel), kept.n_docs, corpus.n_docs
    quality = float(q_new[sel.numpy()].mean()) if k else 0.0
    facility = float(above.mean())
    base = 0.0 if floor is None else float(floor.double().sum())
    union_quality = float((q_kept.sum() + q_new[sel.numpy()].sum()) / max(nk + k, 1))
    union_facility = (nk + base + float(above.sum())) / (nk + nn)
    return {
        "given": {
            "quality": quality,
            "facility": facility,
            "J": lamb * quality + (1 - lamb) * facility,
        },
        "union": {
            "quality": union_quality,
            "facility": union_facility,
            "J": lamb * union_quality + (1 - lamb) * union_facility,
        },
    }
