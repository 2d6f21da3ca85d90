"""The cover step of a sharded run: every document's nearest kept document, written by the
groups as a dataset of their own (``OUT/covered/``), never through the driver.

It runs once the selection is final (after the allocation, the exchange round, the central
round or the similarity cap), in two passes of pure, resumable steps:

1. **Kept rows.** Every group writes the ids and unit embeddings of the rows the output
   keeps (``OUT/selected/``) to ``WORK/cover/kept-NNNNN.parquet``, in its row order; its
   marker (the group's centroid) last. Allocated by gains, both are already stored: the
   embeddings in the table the group's part was written from (``WORK/exchange/``, else
   ``WORK/candidates/``), the centroid in its select step's marker; the group then reads
   only its id column. Otherwise it reads its rows. Pass 2 reads the group's rows again
   (its object, or its pieces of the input shards), not a cached copy: a copy is the
   corpus once more on disk, as float32 (15 GB at 10M x 384), and the work dir's peak
   disk is the bound that matters at scale (docs/scale.md, "The 10M run").
2. **Cover.** Every group loads its rows and, with
   :func:`~datamask.coverage.nearest_kept`, finds each row's nearest kept row of its own
   group (a kept row covers itself; read from the K-NN graph its select step saved where
   there is one, ``WORK/graphs/``, searched for the rows the graph does not resolve) and,
   as the floor (of a row it does not keep), its nearest kept row of its
   :data:`COVER_NEIGHBORS` nearest groups by centroid (both directions:
   :func:`~..combine.exchange.exchange_neighbors` with ``lower_only=False``); the nearer
   wins, the own group's on a tie. On a run's GPU both
   searches compare every pair there (exact); on the host they are ivf searches. It writes
   ``OUT/covered/part-NNNNN.parquet``: the id, ``group``, ``selected``, ``covered_by``,
   ``covered_sim`` (float32), ``covered_exact``; then its marker ``WORK/cover/NNNNN.json``,
   and deletes the group's graph (the exchange round leaves it for this step).

Given documents already kept (``--given``), pass 2 adds KEPT's rows
(:func:`~..select.given.kept_table`) to the neighbours' kept rows: a dropped document names the
KEPT document where that one is nearer, as the one-file output does.

Why not the exchange round's floors: they are taken against the neighbours' kept prefixes
of the *first* allocation (the final one differs), only from groups of lower id and by an
ivf search probing 0.05 of its lists (the selection depends on them as they are, so they
cannot be made the cover's search without changing it); the cover must name a row the
output keeps.

``covered_exact`` is True only where the row is guaranteed to be the exact argmax over
every kept row of the corpus: the group was compared with every other group (at most
:data:`COVER_NEIGHBORS` + 1 groups) and both the own group's route (an exact graph, or
every pair: ``rows x kept <= COVER_EXACT_PAIRS``, :mod:`datamask.neighbors`) and the
neighbours' search were exact, whichever won. Elsewhere an ivf graph or search found it
and a nearer kept row may exist. The nearest groups by centroid are where a row's nearest kept
row lies when groups are k-means clusters (the default: 99.3% of sampled rows exact at
200k); with ``--partition shard`` or ``chunk`` beyond 5 groups they often are not (31% at
20 groups, 14% at 100: ``benchmarks/covered/RESULTS.md``).
"""

from __future__ import annotations

import time
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
import torch

from ..._device import accelerator, resolve_device
from ..._memory import peak_rss_mb, release_heap
from ..._validation import check_corpus
from ...config import SelectSpec
from ...coverage import nearest_kept
from ...data import Corpus
from ...io.parquet import atomic_write_table, features_column, features_matrix, read_table
from ...io.shards import read_rows
from ...neighbors import resolve_knn
from ...objectives.facility_location import FacilityLocation, facility_term
from ...pipeline.writer import COVER_COLUMNS, cover_columns
from ..check.validate import QualityRange
from ..combine.exchange import exchange_neighbors
from ..context import RunContext
from ..engine import Step, run_steps
from ..lifecycle import read_marker
from ..paths import WorkDir
from ..plan.partition import Group
from ..select.given import kept_table
from ..select.graphs import saved_graph
from ..select.steps import read_group

__all__ = [
    "COVER_NEIGHBORS",
    "COVER_PROBE_FRACTION",
    "corpus_terms",
    "cover_round",
    "CoverGroup",
    "CoverJob",
    "KeptRows",
    "objective_sums",
]

#: A group's rows are compared with the kept rows of this many nearest groups (by the
#: cosine of their centroids), besides its own.
COVER_NEIGHBORS = 4

#: The share of the ivf lists the search against the neighbours' kept rows probes. Only a
#: row whose nearest kept row lies in another group needs it found: at 1M (a 90,587-row
#: group, 31,946 neighbours' kept rows, 1 thread) 821 rows, and against every pair the
#: cover came out lower for 38 rows at 0.2 (7.0 s), 59 at 0.1 (3.8 s), 93 at 0.05 (2.4 s)
#: (benchmarks/covered/PROBES.md). At 1M the cover phase went from 58.8 s to 33.4 s.
COVER_PROBE_FRACTION = 0.1


def _kept_ids(dirs: WorkDir, gid: int, id_col: str) -> pa.Array:
    """The ids the output keeps in group ``gid``: its part, or its rows of the central
    round's part."""
    own = dirs.part(gid)
    if own.exists():
        return read_table(own, columns=[id_col]).column(0).combine_chunks()
    table = read_table(dirs.global_part(), columns=[id_col, "group"])
    return table.filter(pc.equal(table.column("group"), gid)).column(0).combine_chunks()


def _read_unit_rows(
    group: Group, spec: SelectSpec, quality_range: QualityRange
) -> tuple[Corpus, pa.Array]:
    """The group's rows (unit embeddings, quality on the corpus' scale, lengths under a
    token budget) and its ids as stored."""
    corpus, ids = read_group(group, spec, quality_range)
    return check_corpus(corpus), ids  # L2-normalised, as the selection saw them


def objective_sums(corpus: Corpus, kept: np.ndarray, sim: np.ndarray) -> dict[str, float]:
    """One group's share of the objective over every document (:func:`corpus_terms`):
    its rows and kept rows, the sum of its rows' cover (``sim``, the cosine of each row's
    nearest kept row, clipped at 0 as facility location counts it; 0 where nothing is
    kept) and of its kept rows' quality; under a token budget the same weighted by each
    row's length, and the lengths' sum."""
    cover = np.nan_to_num(np.asarray(sim, dtype=np.float64), nan=0.0).clip(min=0.0)
    quality = corpus.normalized_quality()[kept]
    sums = {
        "rows": float(len(cover)),
        "kept": float(len(kept)),
        "cover": float(cover.sum()),
        "quality": float(quality.sum()),
    }
    if corpus.lengths is not None:
        lengths = np.asarray(corpus.lengths, dtype=np.float64)
        sums["lengths"] = float(lengths.sum())
        sums["cover_tokens"] = float(lengths @ cover)
        sums["quality_tokens"] = float(lengths[kept] @ quality)
    return sums


def corpus_terms(
    spec: SelectSpec, sums: dict[str, float] | None, tokens: float | None = None
) -> dict[str, float]:
    """``quality``, ``facility`` and ``J`` over every document of the corpus, from the
    groups' :func:`objective_sums` (the cover's cosines): what one selection over the
    whole corpus reports of the same rows, where the cover is exact (``covered_exact``);
    elsewhere the facility term is a lower bound (a nearer kept row the search missed
    only raises it). ``tokens``: the budget T of a token budget (quality per T tokens,
    coverage per token). Empty where the cover does not give the objective: a diversity
    term other than one facility location, or ``--given`` (KEPT covers too, and its rows
    are not in the budget)."""
    objective = spec.objective.make()
    diversity = objective.diversity
    facility_only = len(diversity) == 1 and isinstance(diversity[0], FacilityLocation)
    if not sums or not facility_only or spec.selector.given is not None or not sums["kept"]:
        return {}
    if tokens is None:
        quality, facility = sums["quality"] / sums["kept"], sums["cover"] / sums["rows"]
    else:
        quality = sums["quality_tokens"] / tokens
        facility = sums["cover_tokens"] / sums["lengths"]
    lamb = objective.lamb
    return {"quality": quality, "facility": facility, "J": lamb * quality + (1 - lamb) * facility}


@dataclass(frozen=True, slots=True)
class CoverJob:
    """One group's cover: the group, its neighbouring groups (gids) and whether they are
    every other group (then an exact search is exact over the whole corpus)."""

    group: Group
    spec: SelectSpec
    dirs: WorkDir
    quality_range: QualityRange
    neighbors: tuple[int, ...] = ()
    searched_all: bool = False


class KeptRows(Step[CoverJob]):
    """Pass 1: write the group's kept rows (id, unit embedding); stats: its centroid."""

    name = "cover: kept rows"

    def marker(self, job: CoverJob) -> Path:
        return job.dirs.kept_rows_marker(job.group.gid)

    def outputs(self, job: CoverJob) -> tuple[Path, ...]:
        return (job.dirs.kept_rows(job.group.gid),)

    def size(self, job: CoverJob) -> int:
        return job.group.n

    def run(self, job: CoverJob) -> dict[str, Any]:
        started = time.perf_counter()
        group, id_col = job.group, job.spec.columns.id_col
        stored = _stored_kept_rows(job)
        if stored is None:  # no stored embeddings of its kept rows: read the group
            corpus, ids = _read_unit_rows(group, job.spec, job.quality_range)
            x = corpus.features
            rows = np.flatnonzero(pc.is_in(ids, value_set=_kept_ids(job.dirs, group.gid, id_col)))
            table = pa.table(
                {id_col: ids.take(pa.array(rows)), "features": features_column(x[rows])}
            )
            centroid = x.mean(0).tolist() if len(x) else [0.0] * x.shape[1]
        else:
            table, centroid = stored
        atomic_write_table(table, job.dirs.kept_rows(group.gid))
        release_heap()
        return {
            "gid": group.gid,
            "kept": table.num_rows,
            "centroid": centroid,
            "read": "group" if stored is None else "stored",
            "seconds": time.perf_counter() - started,
            "peak_rss_mb": peak_rss_mb(),
        }


def _stored_kept_rows(job: CoverJob) -> tuple[pa.Table, list[float]] | None:
    """:class:`KeptRows`' table (id and unit embedding of every kept row, in the group's
    row order) and the group's centroid without reading its embeddings again, when the
    allocation left them: the embeddings from the table its part was written from (the
    exchange round's, else its candidates: the unit rows its select step wrote), the
    centroid from its select step's marker (proposing by gains: the mean of the same
    unit rows), the order from its id column. None where one of them is missing."""
    group, dirs, id_col = job.group, job.dirs, job.spec.columns.id_col
    done = read_marker(dirs.completion(group.gid))
    centroid = None if done is None else done.get("centroid")
    sources = [dirs.exchange(group.gid), dirs.candidates(group.gid)]
    sources = [p for p in sources if p.exists()]
    if centroid is None or not sources:
        return None
    source = read_table(sources[0], columns=[id_col, "features"])
    kind = source.schema.field(id_col).type
    parts = []
    for p in group.pieces:  # the id column alone: a few bytes a row
        col = read_rows(p.path, p.start, p.stop, [id_col]).column(0).combine_chunks()
        parts.append(col.dictionary_decode() if pa.types.is_dictionary(col.type) else col)
    ids = pa.concat_arrays([c.cast(kind) for c in parts]) if parts else pa.array([], kind)
    kept = _kept_ids(dirs, group.gid, id_col).cast(kind)
    in_order = ids.filter(pc.is_in(ids, value_set=kept))
    at = pc.index_in(in_order, value_set=source.column(0).combine_chunks())
    if len(in_order) != len(kept) or at.null_count:  # not the table the part came from
        return None
    return pa.table({id_col: in_order, "features": source.column(1).take(at)}), centroid


class CoverGroup(Step[CoverJob]):
    """Pass 2: every row's nearest kept row, of its own group or of its neighbours,
    written as the group's part of ``OUT/covered/``."""

    name = "cover"

    def marker(self, job: CoverJob) -> Path:
        return job.dirs.cover_marker(job.group.gid)

    def outputs(self, job: CoverJob) -> tuple[Path, ...]:
        return (job.dirs.cover_part(job.group.gid),)

    def size(self, job: CoverJob) -> int:
        return job.group.n

    def run(self, job: CoverJob) -> dict[str, Any]:
        stats = _cover(job)
        release_heap()
        return stats

    def release(self, job: CoverJob) -> None:
        job.dirs.graph(job.group.gid).unlink(missing_ok=True)  # its last reader


def _own_graph(job: CoverJob, n: int) -> tuple[tuple[torch.Tensor, torch.Tensor] | None, bool]:
    """The K-NN graph the group's select step saved (proposing by gains, for the exchange
    round), to read each row's nearest kept row of its own group from, and whether it is
    exact: the method the group's learner resolved for ``n`` rows with this spec
    (:func:`~datamask.neighbors.resolve_knn`). None without one, or with ``--given``
    (that graph is raised by KEPT's floor)."""
    if job.spec.selector.given is not None:
        return None, False
    graph = saved_graph(job.dirs.graph(job.group.gid))
    if graph is None or graph[0].shape[0] != n:
        return None, False
    term = facility_term(job.spec.objective.make())
    knn = "auto" if term is None else term.knn
    return graph, resolve_knn(knn, n, resolve_device(job.spec.selector.device)) == "exact"


def _floor(
    x: np.ndarray, kept: np.ndarray, others: np.ndarray, device: torch.device | None
) -> tuple[np.ndarray, np.ndarray, np.ndarray, dict[str, int]]:
    """Each row's best cosine to the rows of ``others`` (the neighbours' kept rows, and
    KEPT's), the row, whether exact, and the rows by route: searched for the rows the
    group does not keep only (a kept row covers itself, the floor never wins there). At the
    default ratio that is 12% fewer rows and 5% less time for a 1M run's group (the ivf's
    k-means and filing of ``others`` do not shrink); where rows x ``others`` falls under
    ``COVER_EXACT_PAIRS`` the search compares every pair. Kept rows get ``-inf`` and row
    -1."""
    rows = np.setdiff1d(np.arange(len(x)), kept, assume_unique=True)
    floor = np.full(len(x), -np.inf, dtype=np.float32)
    index = np.full(len(x), -1, dtype=np.int64)
    exact = np.ones(len(x), dtype=bool)
    if not len(rows):
        return floor, index, exact, {}
    far = nearest_kept(
        x[rows], kept_features=others, probe_fraction=COVER_PROBE_FRACTION, search_device=device
    )
    floor[rows] = np.nan_to_num(far.sim, nan=-np.inf)
    index[rows], exact[rows] = far.index, far.exact
    return floor, index, exact, {k: int(v) for k, v in far.counts.items() if v}


def _cover(job: CoverJob) -> dict[str, Any]:
    """:class:`CoverGroup`'s work: the floor from the neighbours' kept rows (and KEPT's),
    then every row's nearest kept row above it; writes the group's cover part."""
    group, spec, dirs, neighbors = job.group, job.spec, job.dirs, job.neighbors
    started = time.perf_counter()
    id_col = spec.columns.id_col
    corpus, ids = _read_unit_rows(group, spec, job.quality_range)
    x = corpus.features
    own = read_table(dirs.kept_rows(group.gid), columns=[id_col])
    kept = np.flatnonzero(pc.is_in(ids, value_set=own.column(0).combine_chunks()))
    read_s = time.perf_counter() - started
    # The neighbours' kept rows: the floor, and which of their rows it is.
    # in group order: equal cosines go to the lowest group, then its lowest row
    tables = [read_table(dirs.kept_rows(h)) for h in sorted(neighbors)]
    if spec.selector.given is not None:  # KEPT's rows cover too, where they are nearer
        given = kept_table(dirs)
        tables.append(given.set_column(0, id_col, given.column(0).cast(ids.type)))
    tables = [t for t in tables if t.num_rows]
    floor = floor_index = None
    other_ids = pa.array([], type=ids.type)
    floor_exact = np.ones(len(ids), dtype=bool)  # no kept rows elsewhere: nothing missed
    floor_routes: dict[str, int] = {}
    gpu = accelerator(spec.selector.device)  # the searches: exact there, else ivf here
    if tables:
        other = pa.concat_tables(tables)
        other_ids = other.column(id_col).combine_chunks()
        others = features_matrix(other.column("features"))
        floor, floor_index, floor_exact, floor_routes = _floor(x, kept, others, gpu)
    graph, graph_exact = _own_graph(job, len(ids))
    cover = nearest_kept(
        x,
        kept,
        graph=graph,
        graph_exact=graph_exact,
        floor=floor,
        floor_index=floor_index,
        floor_exact=floor_exact,
        search_device=gpu,
    )
    cols = cover_columns(cover, ids, other_ids)
    mask = np.zeros(len(ids), dtype=bool)
    mask[kept] = True
    # exact where both searches were (the one that lost may have missed a nearer row), or
    # the row is kept; over the whole corpus only where every other group was searched
    exact = ((cover.exact & floor_exact) | mask) & job.searched_all
    table = pa.table(
        {
            id_col: ids,
            "group": pa.array(np.full(len(ids), group.gid, dtype=np.int32)),
            "selected": pa.array(mask),
            **cols,
            "covered_exact": pa.array(exact),
        }
    )
    atomic_write_table(table, job.dirs.cover_part(group.gid))
    return {
        "gid": group.gid,
        "rows": len(ids),
        "exact": int(exact.sum()),
        "routes": dict(cover.counts),
        "floor_routes": floor_routes,  # how the neighbours' kept rows were searched
        "neighbors": list(neighbors),
        "objective": objective_sums(corpus, kept, cover.sim),
        "seconds": {
            "read": read_s,
            "search": time.perf_counter() - started - read_s,
            "total": time.perf_counter() - started,
        },
        "peak_rss_mb": peak_rss_mb(),
    }


def cover_round(
    run: RunContext, groups: list[Group], quality_range: QualityRange
) -> dict[str, Any]:
    """Both passes over every group (:mod:`.cover`); returns the manifest's ``cover``."""
    started = time.perf_counter()
    jobs = [CoverJob(g, run.spec, run.dirs, quality_range) for g in groups]
    # Centroids as float32 arrays on arrival, not JSON's Python floats (compact_marker's
    # reason: at 10^5 groups of 384-d the lists alone would take over 1 GB).
    kept = {
        r["gid"]: {**r, "centroid": np.asarray(r["centroid"], dtype=np.float32)}
        for r in run_steps(run.runner, KeptRows(), jobs, progress=run.progress)
    }
    kept_s = time.perf_counter() - started
    near = exchange_neighbors(
        [kept[g.gid]["centroid"] for g in groups],
        COVER_NEIGHBORS,
        lower_only=False,
    )
    searched_all = len(groups) - 1 <= COVER_NEIGHBORS
    jobs = [
        replace(job, neighbors=tuple(groups[h].gid for h in near[i]), searched_all=searched_all)
        for i, job in enumerate(jobs)
    ]
    done = run_steps(run.runner, CoverGroup(), jobs, progress=run.progress)
    routes: dict[str, int] = {}
    floor_routes: dict[str, int] = {}
    for r in done:
        for into, got in ((routes, r["routes"]), (floor_routes, r.get("floor_routes", {}))):
            for key, v in got.items():
                into[key] = into.get(key, 0) + int(v)
    rows = sum(r["rows"] for r in done)
    exact = sum(r["exact"] for r in done)
    # a marker of an earlier version has no sums: then the run reports no corpus J
    sums = None
    if all("objective" in r for r in done):
        sums = {
            key: float(sum(r["objective"].get(key, 0.0) for r in done))
            for key in done[0]["objective"]
        }
    rss = [r["peak_rss_mb"] for r in [*kept.values(), *done] if r.get("peak_rss_mb")]
    read: dict[str, int] = {}
    for r in kept.values():  # where the kept rows' embeddings came from
        read[r.get("read", "group")] = read.get(r.get("read", "group"), 0) + 1
    return {
        "dataset": str(run.dirs.covered()),
        "kept_rows_read": read,
        "columns": list(COVER_COLUMNS),
        "rows": rows,
        "exact": exact,
        "approximate": rows - exact,
        "routes": routes,
        "floor_routes": floor_routes,
        "neighbors": COVER_NEIGHBORS,
        "searched_all_groups": searched_all,
        "objective_sums": sums,  # corpus_terms' input
        "seconds": {
            "kept_rows": kept_s,
            "cover": time.perf_counter() - started - kept_s,
            "total": time.perf_counter() - started,
            "group_sum": float(sum(r["seconds"]["total"] for r in done))
            + float(sum(r["seconds"] for r in kept.values())),
        },
        "peak_rss_mb_per_worker": max(rss) if rss else None,
    }
