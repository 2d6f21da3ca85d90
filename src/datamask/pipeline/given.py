"""Selecting given documents already kept (``datamask select --given KEPT``).

KEPT is a corpus already selected from: ``--given DOCS`` (every row of it kept) or
``--given DOCS --given-selection SEL`` (the rows of DOCS that SEL keeps; the others were
dropped). The run selects ``k`` documents S from the new input only and never changes
KEPT. What is maximised is the objective of the two corpora together, ``J`` of the
selection ``KEPT ∪ S`` over every document of DOCS and of the input, as
``datamask evaluate`` scores their concatenation:

- **Coverage.** A kept document covers itself (cosine 1). New document i is already
  covered up to its floor, ``floor_i = max(0, max_{j in KEPT} <x_i, x_j>)``
  (:func:`given_floor`), and S adds ``max(0, max_{j in S} <x_i, x_j> - floor_i)``.
  Facility location counts only that (:attr:`datamask.data.Corpus.floor`). What S adds
  to the documents of DOCS that KEPT dropped is not counted while selecting (they are not
  candidates and are not read for it; only the new documents' floors are); it is counted
  in the reported union ``J``.
- **Quality** is min-max scaled over DOCS ∪ input, one scale for both.
- **The rate.** The union's quality is a mean over ``n_kept + k`` documents and its
  coverage a mean over ``n_docs + n_new`` (``n_docs``: the rows of DOCS), so the new
  documents' objective is run at :func:`~datamask.objectives.combined.group_lamb` of those
  counts: ``J`` of the new documents given KEPT at that ``lamb`` is then an increasing
  affine function of the union's ``J`` (up to the dropped documents' gains), and both rank
  every S alike.

The summary reports ``terms`` (``J_given`` at the run's ``lamb``: quality of S, mean
coverage the new documents gain above their floors) and ``terms_union`` (``J`` of
KEPT ∪ S over every document of DOCS and of the input). docs/incremental.md.
"""

from __future__ import annotations

import math
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
    """Documents already kept: the corpus they were kept from, which rows, and its files.

    Attributes
    ----------
    corpus : Corpus
        Every row of ``--given`` (features unit rows once :func:`prepare_given` checked
        them).
    rows : ndarray of int64
        The kept rows of ``corpus``, sorted: those ``--given-selection`` keeps, else all.
    files : list of str
        The parquet files read (empty for a ``save_to_disk`` folder), for provenance.
    source : str
        ``--given`` as given.
    selection : str or None
        ``--given-selection`` as given.
    """

    corpus: Corpus
    rows: np.ndarray
    files: list[str]
    source: str
    selection: str | None = None

    @property
    def n_kept(self) -> int:
        return len(self.rows)

    @property
    def n_docs(self) -> int:
        return self.corpus.n_docs

    def kept_features(self) -> torch.Tensor:
        return torch.from_numpy(self.corpus.features[self.rows])


def read_given(
    source: str | Path, columns: Columns, *, selection: str | Path | None = None
) -> Given:
    """``--given`` read with the run's columns: a parquet file, a folder or glob of
    parquet shards, or a ``save_to_disk`` folder; with ``selection`` (a ``datamask
    select`` output, a parquet or text file of ids) only the rows it keeps are kept.

    The whole of ``--given`` is held in memory (``n_docs x dim`` floats)."""
    where = str(source)
    kind, files = input_files(where)
    if kind == "arrow":
        corpus = read_input_corpus(where, columns)
        names: list[str] = []
    else:
        if not files:
            raise ValueError(f"--given {where!r} holds no parquet files.")
        # each file checked as --input's are (columns present, types, nulls, widths),
        # every message naming --given and the file
        tables = [
            (read_table(f, columns=columns.read, where=f"--given {f}"), f"--given {f}")
            for f in files
        ]
        corpus, _ = corpus_from_tables(tables, columns, source=f"--given {where}")
        names = [str(f) for f in files]
    rows = np.arange(corpus.n_docs, dtype=np.int64)
    if selection is not None:
        ids = read_selection_ids(
            selection, id_col=columns.id_col, what="--given-selection", folder=True
        ).to_pylist()
        rows = np.sort(rows_from_ids(corpus.ids, ids, f"--given-selection {selection}"))
    corpus.source = f"--given {where}"
    return Given(corpus, rows, names, where, None if selection is None else str(selection))


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
    """Check ``--given`` against the input, put both on one quality scale and set the
    input's floor. A preparation, in place: ``corpus`` gets the checked unit rows, the
    scale and the floor; ``given.corpus`` becomes its checked copy with the scale.
    Returns what the summary records: counts, the floor's method, mean and seconds, the
    quality scale, ``floor_index`` (the row of ``given.corpus`` giving each floor) and
    ``floor_sim`` (that row's raw cosine, -inf where none; what the cover compares), not JSON."""
    started = time.perf_counter()
    docs = check_corpus(given.corpus)  # NaN, empty, duplicate ids inside --given; unit rows
    corpus.features = check_corpus(corpus).features
    _check_pair(corpus, docs, id_col)
    q = np.concatenate([docs.quality, corpus.quality])
    scale = (q.min(axis=0), q.max(axis=0))
    given.corpus = replace(docs, quality_range=scale)
    corpus.quality_range = scale
    new = torch.from_numpy(corpus.features)
    sims, index, how = best_match(new, given.kept_features())
    floor = sims.clamp_min(0.0)  # given_floor's: what coverage above KEPT counts from
    index = torch.where(index >= 0, torch.from_numpy(given.rows)[index.clamp_min(0)], -1)
    corpus.floor = floor.numpy().astype(np.float32)
    # the cover's floor is the raw cosine (negative too): clipped, a KEPT document at a
    # negative cosine would tie at 0 and beat a newly kept one that is nearer
    raw = torch.where(index >= 0, sims, -math.inf).numpy().astype(np.float32)
    return {
        "source": given.source,
        "selection": given.selection,
        "n_docs": docs.n_docs,
        "n_kept": given.n_kept,
        "quality_scale": "min-max over --given and --input together",
        "quality_range": [scale[0].tolist(), scale[1].tolist()],
        "floor": {
            "method": how,
            "mean": float(floor.double().mean()),
            "seconds": time.perf_counter() - started,
        },
        "floor_index": index.numpy(),
        "floor_sim": raw,
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
    info.pop("floor_sim")
    scored = given_terms(corpus, given, selected, objective.lamb)
    return {**info, "terms": scored["given"], "terms_union": scored["union"]}


def given_spec(spec: SelectSpec, k: int, n_new: int, given: Given) -> SelectSpec:
    """The spec the new documents are selected with: the objective at the union's rate
    (:func:`~datamask.objectives.combined.group_lamb` of ``k`` of ``n_new`` against
    ``n_kept + k`` of ``n_docs + n_new``). Refuses terms other than facility location."""
    check_given_terms(spec.objective)
    n_kept, n_docs = given.n_kept, given.n_docs
    lamb = group_lamb(spec.objective.lamb, k, n_new, n_kept + k, n_docs + n_new)
    checked = spec.__dict__.get("_checked")
    out = replace(spec, objective=replace(spec.objective, lamb=lamb))
    if checked:
        object.__setattr__(out, "_checked", True)
    return out


def given_terms(
    corpus: Corpus, given: Given, selected: np.ndarray, lamb: float
) -> dict[str, dict[str, float]]:
    """``J`` of the new rows ``selected`` given KEPT (the floor as :func:`prepare_given`
    set it), exact where the floor is (dense, in blocks).

    Returns ``{"given": {"quality", "facility", "J"}, "union": {...}}``: ``given`` is
    ``lamb * mean_{S} q + (1 - lamb) * mean_{i new} max(0, cover_S(i) - floor_i)``;
    ``union`` is ``J(KEPT ∪ S)`` over every document of ``--given`` and of the input (a
    kept document covers itself at 1; a dropped one by its best cosine to KEPT ∪ S), what
    ``datamask evaluate`` of the two files together reports.
    """
    sel = np.asarray(selected, dtype=np.int64)
    x = torch.from_numpy(corpus.features)
    floor = None if corpus.floor is None else torch.from_numpy(corpus.floor).to(x.dtype)
    term = FacilityLocation().bind(TermContext.create(x, None, max(len(sel), 1), floor=floor))
    above = term.coverage(torch.from_numpy(sel)).double()
    q_new = corpus.normalized_quality()
    q_docs = given.corpus.normalized_quality()
    k, nk, nn = len(sel), given.n_kept, corpus.n_docs
    quality = float(q_new[sel].mean()) if k else 0.0
    facility = float(above.mean())
    new_cover = float(above.sum()) + (0.0 if floor is None else float(floor.double().sum()))
    # --given's own documents: kept ones at 1, dropped ones by their best cosine to KEPT ∪ S
    dropped = np.setdiff1d(np.arange(given.n_docs), given.rows)
    docs_cover = float(nk)
    if len(dropped):
        xd = torch.from_numpy(given.corpus.features[dropped])
        by_kept, _, _ = best_match(xd, given.kept_features())
        by_new, _, _ = best_match(xd, x[torch.from_numpy(sel)])
        docs_cover += float(torch.maximum(by_kept, by_new).clamp_min(0.0).double().sum())
    union_quality = float((q_docs[given.rows].sum() + q_new[sel].sum()) / max(nk + k, 1))
    union_facility = (docs_cover + new_cover) / (given.n_docs + nn)
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
