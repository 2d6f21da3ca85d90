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
import pyarrow as pa
import pyarrow.parquet as pq
import torch

from .._validation import check_corpus, first_duplicate, k_from_ratio
from ..budget import length_column, resolve_token_budget
from ..columns import Columns
from ..config import ObjectiveSpec, SelectSpec
from ..data import Corpus
from ..io.datasets import input_column_names, input_files, read_input_corpus
from ..io.fs import open_input
from ..io.parquet import corpus_from_tables, read_table
from ..io.selection import read_selection_ids, rows_from_ids
from ..io.text import lengths_from_arrow
from ..neighbors import best_match
from ..objectives import FacilityLocation, TermContext
from ..objectives.combined import group_lamb

__all__ = [
    "Given",
    "budget_and_given",
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

    def units(self) -> tuple[float, float]:
        """``(kept, all)`` in the budget's unit: tokens when the lengths were read (a token
        budget), else documents."""
        if self.corpus.lengths is None:
            return float(self.n_kept), float(self.n_docs)
        lengths = self.corpus.lengths
        return float(lengths[self.rows].sum()), float(lengths.sum())

    def kept_features(self) -> torch.Tensor:
        return torch.from_numpy(self.corpus.features[self.rows])


def read_given(
    source: str | Path,
    columns: Columns,
    *,
    selection: str | Path | None = None,
    lengths: str | None = None,
) -> Given:
    """``--given`` read with the run's columns: a parquet file, a folder or glob of
    parquet shards, or a ``save_to_disk`` folder; with ``selection`` (a ``datamask
    select`` output, a parquet or text file of ids) only the rows it keeps are kept.
    ``lengths``: the length column of a token budget, read into ``Corpus.lengths`` (the
    given name, else the first length column of each file).

    The whole of ``--given`` is held in memory (``n_docs x dim`` floats)."""
    where = str(source)
    kind, files = input_files(where)
    if kind == "arrow":
        found = None
        if lengths is not None:
            found = length_column(input_column_names(where), lengths or None, f"--given {where}")
        corpus = read_input_corpus(where, columns, extra_cols=[found] if found else [])
        if found:
            values = pa.array(corpus.extra.pop(found))
            corpus.lengths = lengths_from_arrow(values, found, f"--given {where}")
        names: list[str] = []
    else:
        if not files:
            raise ValueError(f"--given {where!r} holds no parquet files.")
        # each file checked as --input's are (columns present, types, nulls, widths),
        # every message naming --given and the file
        tables = [(_given_table(f, columns, lengths), f"--given {f}") for f in files]
        corpus, _ = corpus_from_tables(
            [(t, w) for (t, _), w in tables], columns, source=f"--given {where}"
        )
        if lengths is not None:
            corpus.lengths = np.concatenate([lens for (_, lens), _ in tables])
        names = [str(f) for f in files]
    rows = np.arange(corpus.n_docs, dtype=np.int64)
    if selection is not None:
        ids = read_selection_ids(
            selection, id_col=columns.id_col, what="--given-selection", folder=True
        ).to_pylist()
        rows = np.sort(rows_from_ids(corpus.ids, ids, f"--given-selection {selection}"))
    corpus.source = f"--given {where}"
    return Given(corpus, rows, names, where, None if selection is None else str(selection))


def _given_table(
    path: str, columns: Columns, lengths: str | None
) -> tuple[pa.Table, np.ndarray | None]:
    """One parquet file of ``--given``, and its lengths when a token budget reads them
    (``lengths``: the column, "" for the first length column present)."""
    where = f"--given {path}"
    if lengths is None:
        return read_table(path, columns=columns.read, where=where), None
    with open_input(path) as fh:
        names = list(pq.read_schema(fh).names)
    found = length_column(names, lengths or None, where)
    table = read_table(path, columns=list(dict.fromkeys([*columns.read, found])), where=where)
    return table, lengths_from_arrow(table.column(found), found, where)


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
    value = both[again : again + 1].tolist()[0]  # a Python value: 'b', not np.str_('b')
    raise ValueError(
        f"{id_col} {value!r} occurs more than once ({where}; {count} repeated ids in "
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


def given_spec(spec: SelectSpec, k: float, n_new: float, given: Given) -> SelectSpec:
    """The spec the new documents are selected with: the objective at the union's rate
    (:func:`~datamask.objectives.combined.group_lamb` of ``k`` of ``n_new`` against
    ``n_kept + k`` of ``n_docs + n_new``; under a token budget all four in tokens,
    :meth:`Given.units`). Refuses terms other than facility location."""
    check_given_terms(spec.objective)
    n_kept, n_docs = given.units()
    lamb = group_lamb(spec.objective.lamb, k, n_new, n_kept + k, n_docs + n_new)
    checked = spec.__dict__.get("_checked")
    out = replace(spec, objective=replace(spec.objective, lamb=lamb))
    if checked:
        object.__setattr__(out, "_checked", True)
    return out


def given_terms(corpus: Corpus, given: Given, selected: np.ndarray, lamb: float) -> dict[str, Any]:
    """``J`` of the new rows ``selected`` given KEPT (the floor as :func:`prepare_given`
    set it), exact where the floor is (dense, in blocks).

    Returns ``{"given": {"quality", "facility", "J"}, "union": {...}, "nearest": ...}``:
    ``given`` is
    ``lamb * mean_{S} q + (1 - lamb) * mean_{i new} max(0, cover_S(i) - floor_i)``;
    ``union`` is ``J(KEPT ∪ S)`` over every document of ``--given`` and of the input (a
    kept document covers itself at 1; a dropped one by its best cosine to KEPT ∪ S), what
    ``datamask evaluate`` of the two files together reports. Under a token budget (both
    corpora with ``lengths``) every mean is per token: quality over the kept tokens,
    coverage over the documents' tokens (docs/method.md "Token budgets"). ``nearest`` is
    every new row's most similar row of ``selected`` as that pass found it
    (:meth:`~datamask.objectives.facility_location.FacilityLocation.nearest`; None when
    nothing is selected): the cover of ``select --given`` is read from it.
    """
    sel = np.asarray(selected, dtype=np.int64)
    x = torch.from_numpy(corpus.features)
    floor = None if corpus.floor is None else torch.from_numpy(corpus.floor).to(x.dtype)
    term = FacilityLocation().bind(TermContext.create(x, None, max(len(sel), 1), floor=floor))
    rows = torch.from_numpy(sel)
    above = term.coverage(rows).double().numpy()
    covered = above + (0.0 if floor is None else floor.double().numpy())
    # --given's own documents: kept ones at 1, dropped ones by their best cosine to KEPT ∪ S
    docs_cover = np.zeros(given.n_docs)
    docs_cover[given.rows] = 1.0
    dropped = np.setdiff1d(np.arange(given.n_docs), given.rows)
    if len(dropped):
        xd = torch.from_numpy(given.corpus.features[dropped])
        by_kept, _, _ = best_match(xd, given.kept_features())
        by_new, _, _ = best_match(xd, x[torch.from_numpy(sel)])
        docs_cover[dropped] = torch.maximum(by_kept, by_new).clamp_min(0.0).double().numpy()
    per_token = corpus.lengths is not None and given.corpus.lengths is not None
    w_new = corpus.lengths if per_token else np.ones(corpus.n_docs)
    w_docs = given.corpus.lengths if per_token else np.ones(given.n_docs)
    q_new = corpus.normalized_quality()
    q_docs = given.corpus.normalized_quality()
    kept_w = float(w_new[sel].sum())
    quality = float((w_new[sel] * q_new[sel]).sum() / kept_w) if len(sel) else 0.0
    facility = float((w_new * above).sum() / w_new.sum())
    union_kept = float(w_docs[given.rows].sum()) + kept_w
    union_q = (w_docs[given.rows] * q_docs[given.rows]).sum() + (w_new[sel] * q_new[sel]).sum()
    union_quality = float(union_q / max(union_kept, 1e-12)) if union_kept else 0.0
    union_facility = float(
        ((w_docs * docs_cover).sum() + (w_new * covered).sum()) / (w_docs.sum() + w_new.sum())
    )
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
        "nearest": term.exact_nearest(rows),
    }


def budget_and_given(
    corpus: Corpus, spec: SelectSpec, given: tuple[Any, Any]
) -> tuple[
    int | None,
    SelectSpec,
    Given | None,
    dict[str, Any] | None,
    tuple[np.ndarray, np.ndarray, bool] | None,
]:
    """``k`` (None: from select_ratio), the spec to fit with, KEPT, what the summary
    records of it and the cover's floor (``(floor, row of KEPT's corpus, exact)``): with
    ``given`` (the paths of ``--given`` and ``--given-selection``) KEPT is read and
    checked, the input's floors set and the objective put at the union's rate
    (:mod:`datamask.pipeline.given`)."""
    k = spec.selector.k
    if k is not None and k > corpus.n_docs:
        raise ValueError(
            f"k must be at most the {corpus.n_docs} documents of {corpus.source}; got k={k}."
        )
    if given[0] is None:
        return k, spec, None, None, None
    cols = spec.columns
    sel = spec.selector
    tokens = sel.token_budget
    lengths = (sel.length_col or "") if tokens else None  # "": the first length column
    kept = read_given(given[0], cols, selection=given[1], lengths=lengths)
    info = prepare_given(corpus, kept, id_col=cols.id_col)
    # each new document's floor and the row of KEPT's corpus giving it: what covered_by
    # names where KEPT covers a document better than the selection does
    # (the raw cosine, not the floor clipped at 0: a pair's cosine may be negative)
    exact = info["floor"]["method"] == "exact"
    cover_floor = (info.pop("floor_sim"), info.pop("floor_index"), exact)
    if tokens:  # the union's rate in tokens; the selector keeps the budget itself
        budget = resolve_token_budget(
            corpus.lengths, sel.budget_tokens, sel.select_token_ratio, corpus.source
        )
        fit_spec = given_spec(spec, budget.total, float(budget.sizes.sum()), kept)
    else:
        k = k_from_ratio(spec.selector.select_ratio, corpus.n_docs) if k is None else k
        fit_spec = given_spec(spec, k, corpus.n_docs, kept)
    info["lamb_optimised"] = fit_spec.objective.lamb
    return k, fit_spec, kept, info, cover_floor
