"""A selection report a person reads in a browser: one self-contained HTML page.

    datamask report --input docs.parquet --selection mask.parquet --compare topk.parquet \\
        --output report/

For each selection, side by side: per topic (spherical k-means clusters of the
embeddings, labelled by their most distinctive words when a text column exists) the
documents in, kept, share kept and mean quality kept against dropped; the quality and
length distributions of the kept, the dropped and the whole corpus; a 2-D map of a sample
with the kept documents marked; the near-duplicate figures of ``evaluate`` (the same
:func:`~datamask.evaluation.redundancy.redundancy`) with the closest kept pairs; text
samples kept and dropped per topic; dropped documents next to the kept document that
covers them (the selection's ``covered_by``, text side by side: the most similar pairs and
the least); the objective terms and settings of each selection's summary.

The input is streamed twice, batch by batch (any input ``select`` takes: a parquet file,
folder or glob, a save_to_disk folder). Memory holds one batch, a seeded sample of
``sample_size`` documents (chosen by a hash of the id and the seed, so the same seed gives
the same page whatever the batch size or the order of the files), each selection's kept
ids and embeddings (the near-duplicate figures are exact over them), and fixed-size
histograms: flat in the number of documents.

This module computes the report (:func:`build_report`, from one checked
:class:`~datamask.evaluation.report_spec.ReportSpec`): it opens the input, reads the
selections and assembles the figures; the run's context and its two passes are
:mod:`.report_run`. The page and its figures are made by :mod:`.page` (matplotlib PNGs
inlined as base64; every text that enters the page is HTML-escaped, and the page's
Content-Security-Policy forbids scripts and any request), the topics by :mod:`.topics`,
the distributions by :mod:`.histogram`.
"""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path
from typing import Any

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.parquet as pq

from ..columns import Columns
from ..io.datasets import input_column_names, input_files
from ..io.fs import resolve
from ..io.keep import IdSet, selection_digest
from ..io.parquet import open_parquet
from ..io.provenance import selection_record, verify_selection_file, warn_trust_unused
from ..io.selection import read_selection_ids, selection_summary, summary_is_current
from ..io.shards import inspect_shards
from ..io.text import is_text_type, lengths_from_arrow, text_array
from .page import REPORT_SECTIONS, render_html, write_report
from .plots import project_2d, require_matplotlib
from .report_run import ReportRun, first_pass, second_pass, topics_and_duplicates
from .report_spec import ReportSpec
from .scores import LENGTH_COLUMNS
from .topics import topic_words

__all__ = [
    "REPORT_SECTIONS",
    "ReportSpec",
    "build_report",
    "render_html",
    "write_report",
]


#: Dropped documents shown beside their cover per selection: the most similar pairs (the
#: drops a reader should agree with) and the least (the drops worth a second look).
COVER_HIGH, COVER_LOW = 4, 2


def _cover_pairs(path: str, id_col: str) -> tuple[pa.Array, pa.Array, np.ndarray] | None:
    """``(dropped ids, their covered_by, covered_sim)`` shown for a selection file (a
    sharded run's output folder: its ``covered/`` dataset): the
    :data:`COVER_HIGH` highest ``covered_sim`` and the :data:`COVER_LOW` lowest, ties by
    row order; None when the file has no cover (ids only, or made before covered_by).
    Streamed by batches, holding only the rows that can still be shown (:func:`_extremes`):
    a sharded run's cover has a row per document of the corpus."""
    wanted = [id_col, "selected", "covered_by", "covered_sim"]
    loc = resolve(path, what="selection")  # local or remote
    if loc.is_dir():  # a sharded run's: its cover dataset, its parts in order
        cover = loc.join("covered")
        parts = cover.walk() if cover.is_dir() else []
        files = [f for f in parts if f.path.endswith(".parquet")]  # walk sorts by path
    elif not path.endswith(".parquet"):
        return None
    else:
        files = [loc]
    pool: pa.Table | None = None
    for f in files:
        with f.open_input_file() as fh:
            pf = pq.ParquetFile(fh)
            if not set(wanted) <= set(pf.schema_arrow.names):
                return None  # ids only, or made before covered_by
            for batch in pf.iter_batches(columns=wanted):
                t = pa.Table.from_batches([batch])
                kept = t.column("selected")
                dropped = pc.and_(pc.invert(kept), pc.is_valid(t.column("covered_by")))
                t = t.filter(dropped)
                pool = _extremes(t if pool is None else pa.concat_tables([pool, t]))
    if pool is None:
        return None
    sims = pool.column("covered_sim").to_numpy()
    order = np.argsort(-sims, kind="stable")
    n_high = min(COVER_HIGH, len(order))
    rows = np.concatenate([order[:n_high], order[n_high:][::-1][:COVER_LOW][::-1]])
    pick = pa.array(rows.astype(np.int64))
    return pool.column(id_col).take(pick), pool.column("covered_by").take(pick), sims[rows]


def _extremes(t: pa.Table) -> pa.Table:
    """The rows of ``t`` (in its order) among the ``COVER_HIGH + COVER_LOW`` highest or
    lowest ``covered_sim`` (ties by row order): every row :func:`_cover_pairs` can still
    show, whatever rows follow."""
    keep = COVER_HIGH + COVER_LOW
    if t.num_rows <= 4 * keep:
        return t
    order = np.argsort(-t.column("covered_sim").to_numpy(), kind="stable")
    return t.take(pa.array(np.sort(np.concatenate([order[:keep], order[-keep:]]))))


def _id_list(path: str) -> bool:
    """Whether a selection is a text file of ids (compared with the data's as text)."""
    return not Path(path).is_dir() and not str(path).endswith(".parquet")


def _label(path: str, summary: dict[str, Any] | None, taken: set[str]) -> str:
    base = (summary or {}).get("method") or Path(path).stem
    label, i = str(base), 2
    while label in taken:
        label, i = f"{base} ({i})", i + 1
    taken.add(label)
    return label


def build_report(
    source: str,
    selections: Sequence[str],
    spec: ReportSpec | None = None,
    **settings: Any,
) -> dict[str, Any]:
    """Everything the page shows, computed in two streaming passes over ``source``.

    It runs as named phases over one run context (:class:`ReportRun`): :func:`_open` (the
    input's files and columns), :func:`_load_selections` (each selection's ids, checked
    against its provenance), :func:`first_pass` (ranges, the seeded sample, each
    selection's kept embeddings), :func:`topics_and_duplicates` (topics and near-duplicate
    figures), :func:`second_pass` (per-topic counts, histograms, texts) and
    :func:`_assemble`.

    Parameters
    ----------
    source : str
        The corpus the selections were made from (any input ``datamask select`` takes).
    selections : sequence of str
        Selection files (any form :func:`~datamask.io.selection.read_selection_ids` reads),
        shown side by side in this order.
    spec : ReportSpec, optional
        Everything else (default: from ``settings``).
    **settings
        Any field of :class:`~datamask.evaluation.report_spec.ReportSpec` by its key, instead
        of ``spec`` (its declarations hold the defaults, the accepted values and the help):
        ``split``, ``columns``, ``text_col``, ``length_col``, ``n_topics``, ``sample_size``,
        ``map_method``, ``n_examples``, ``dup_thresholds``, ``seed`` (the same seed gives
        the same page), ``batch_size``, ``progress``, ``trust_selection`` (skip the check
        that ``source`` is what each selection was made from, ``docs/provenance.md``).
    """
    spec = ReportSpec.of(spec, settings, where="report's arguments")
    if not isinstance(spec, ReportSpec):
        raise TypeError(f"spec must be a ReportSpec; got {spec!r}.")
    if not selections:
        raise ValueError("selections must name at least one selection file; got none.")
    require_matplotlib(tsne=spec.map_method == "tsne")  # before the long passes
    run = _open(source, spec)
    _load_selections(run, selections)
    first_pass(run)
    topics_and_duplicates(run)
    second_pass(run)
    return _assemble(run)


def _open(source: Any, spec: ReportSpec) -> ReportRun:
    """The input's files and columns, each named column checked to exist and hold what the
    page reads, before any pass."""
    kind, files = input_files(source, split=spec.split)  # refuses a missing input or split now
    total = sum(i.num_rows for i in inspect_shards(files)) if kind == "parquet" else None
    names = input_column_names(source, split=spec.split)
    cols = spec.columns.resolve(names, where=str(source))
    missing = [c for c in [cols.id_col, *cols.quality_cols, cols.feature_col] if c not in names]
    text_col, length_col = spec.text_col, spec.length_col
    if text_col is None:
        text_col = "text" if "text" in names else None
    elif text_col not in names:
        missing.append(text_col)
    if length_col is None:
        length_col = next((c for c in LENGTH_COLUMNS if c in names), None)
    elif length_col not in names:
        missing.append(length_col)
    if missing:
        raise ValueError(
            f"column {missing[0]!r} not found in {files[0]}; available columns: {names}."
        )
    schema = _schema(files[0], kind)
    if text_col is not None:  # the one text check: names the column and the file
        text_array(pa.nulls(0, schema.field(text_col).type), text_col, str(files[0]))
    length_of_text = False
    if length_col is not None:
        length_type = schema.field(length_col).type
        lengths_from_arrow(pa.nulls(0, length_type), length_col, str(files[0]))
        length_of_text = is_text_type(length_type)
    weights = _quality_weights(cols)
    return ReportRun(
        spec, source, kind, files, total, cols, text_col, length_col, length_of_text, weights
    )


def _quality_weights(cols: Columns) -> np.ndarray:
    """One weight per quality column, summing to 1 (default: equal)."""
    n_cols = len(cols.quality_cols)
    if cols.quality_weights is None:
        return np.full(n_cols, 1.0 / n_cols)
    weights = np.asarray(cols.quality_weights, float)
    if weights.shape != (n_cols,) or weights.sum() <= 0:
        raise ValueError(
            f"quality_weights must hold one positive weight per quality column "
            f"({n_cols}); got {list(cols.quality_weights)}."
        )
    return weights / weights.sum()


def _load_selections(run: ReportRun, selections: Sequence[str]) -> None:
    """Each selection's ids and summary (its provenance checked first), and the dropped
    documents shown beside the kept ones covering them (rows found in pass 1, texts read in
    pass 2 with the samples')."""
    taken: set[str] = set()
    spec, id_col = run.spec, run.cols.id_col
    for i, path in enumerate(selections):
        what = "selection" if i == 0 else "compared selection"
        summary = selection_summary(path, what=what, then="report it")  # then provenance
        if not spec.trust_selection:  # before the passes: is this what it was made from?
            verify_selection_file(path, run.source, split=spec.split)
        elif selection_record(path) is None:
            warn_trust_unused(str(path), "it holds no provenance record to check")
        ids = read_selection_ids(path, id_col=id_col, what=what, folder=True)
        if len(ids) == 0:
            raise ValueError(f"{path} selects no documents.")
        if not summary_is_current(summary, selection_digest(ids), f"{what} {str(path)!r}"):
            summary = {**summary, "terms": None}  # the terms of other rows: not shown
        run.sels.append(
            {
                "path": str(path),
                "label": _label(str(path), summary, taken),
                "summary": summary,
                "set": IdSet(ids),
                "n_ids": len(ids),
                # a text file lists ids as text: compare them with the data's as text
                "as_text": pa.types.is_string(ids.type) and _id_list(path),
            }
        )
    run.covers = [_cover_pairs(sel["path"], id_col) for sel in run.sels]
    pair_ids = [a for c in run.covers if c is not None for a in (c[0], c[1])]
    if pair_ids:  # a kept document may cover several shown: each id once in the set
        every = pa.chunked_array(pair_ids).combine_chunks()
        unique = pc.unique(every)
        pair_set = IdSet(unique)
        pair_of = np.empty(len(every), dtype=np.int64)
        at, members = pair_set.find(every)
        pair_of[at] = members
        unique_row = np.full(len(unique), -1, dtype=np.int64)
        run.pairs = {"set": pair_set, "of": pair_of, "unique_row": unique_row}


def _assemble(run: ReportRun) -> dict[str, Any]:
    """Everything the page shows, from the phases' results."""
    spec, samp, tp, pt = run.spec, run.samp, run.topics, run.per_topic
    n, n_topics, sums = run.n, tp["n"], pt["sums"]
    sample_texts = [run.texts.get(int(r), "") for r in samp["row"]]
    words = (
        topic_words(sample_texts, tp["samp_topic"], n_topics)
        if run.text_col is not None
        else [[] for _ in range(n_topics)]
    )
    counts, q_all = pt["counts"], pt["q_all"]
    topics = [
        {"topic": t, "words": words[t], "n": int(counts[t]), "q_mean": _div(q_all[t], counts[t])}
        for t in range(n_topics)
    ]
    out_sel = [_selection_result(run, s, sample_texts) for s in range(len(run.sels))]
    m_rows = np.arange(len(samp["row"]))
    if spec.map_method == "tsne" and len(m_rows) > 3000:
        m_rows = np.sort(np.random.default_rng(spec.seed).choice(len(m_rows), 3000, replace=False))
    xy = project_2d(samp["feats"][m_rows], method=spec.map_method, seed=spec.seed)
    length_col = run.length_col
    return {
        "source": str(run.source),
        "n_docs": n,
        "quality_label": run.quality_cols[0]
        if len(run.quality_cols) == 1
        else "quality (weighted mix, scaled to [0, 1])",
        "quality_all": sums["q_all"] / n,
        "length_label": length_col if not run.length_of_text else f"len({length_col})",
        "length_all": sums["l_all"] / n if pt["l_hist"] else None,
        "length_col": length_col,
        "tokens_all": sums["l_all"] if pt["l_hist"] else None,
        "text_col": run.text_col,
        "seed": spec.seed,
        "sample_size": len(samp["row"]),
        "map_method": spec.map_method,
        "topics": topics,
        "selections": out_sel,
        "dup_sample": tp["dup_sample"],
        "thresholds": [f"{t:g}" for t in spec.dup_thresholds],
        "_quality_hist": pt["q_hist"],
        "_length_hist": pt["l_hist"],
        "_centroids": tp["centroids"].numpy(),
        "_map": {
            "xy": xy,
            "topic": tp["samp_topic"][m_rows],
            "kept": samp["kept"][m_rows],
            "quality": run.combined(samp["q"])[m_rows],
        },
    }


def _selection_result(run: ReportRun, s: int, sample_texts: list[str]) -> dict[str, Any]:
    """What the page shows of selection ``s``: per topic, samples, covers, duplicates."""
    sel, pt, texts = run.sels[s], run.per_topic, run.texts
    n, n_topics, samp_topic = run.n, run.topics["n"], run.topics["samp_topic"]
    counts, q_all, kept_n, q_kept = pt["counts"], pt["q_all"], pt["kept_n"], pt["q_kept"]
    sums, has_len = pt["sums"], bool(pt["l_hist"])
    k = int(kept_n[s].sum())
    per_topic = []
    samples = []
    for t in range(n_topics):
        kn, cn = int(kept_n[s, t]), int(counts[t])
        per_topic.append(
            {
                "kept": kn,
                "share": _div(kn, cn),
                "q_kept": _div(q_kept[s, t], kn),
                "q_dropped": _div(q_all[t] - q_kept[s, t], cn - kn),
            }
        )
        in_t = np.flatnonzero(samp_topic == t)
        kept_t = in_t[run.samp["kept"][in_t, s]]
        drop_t = in_t[~run.samp["kept"][in_t, s]]
        samples.append(
            {
                "kept": [sample_texts[i] for i in kept_t[:2]],
                "dropped": [sample_texts[i] for i in drop_t[:2]],
            }
        )
    summary = sel["summary"] or {}
    dups = run.topics["dups"][s]
    return {
        "label": sel["label"],
        "path": sel["path"],
        "k": k,
        "share": k / n,
        "terms": summary.get("terms"),
        "settings": summary.get("settings"),
        "method": summary.get("method"),
        "quality_kept": _div(sums["q_kept"][s], k),
        "quality_dropped": _div(sums["q_all"] - sums["q_kept"][s], n - k),
        "length_kept": _div(sums["l_kept"][s], k) if has_len else None,
        "length_dropped": _div(sums["l_all"] - sums["l_kept"][s], n - k) if has_len else None,
        # the kept tokens (the length column's sum), and the token budget it was made under
        "tokens_kept": float(sums["l_kept"][s]) if has_len else None,
        "tokens": summary.get("tokens"),
        "topics": per_topic,
        "samples": samples,
        "covers": _covers_shown(run, s),
        "duplicates": dups["figures"],
        "examples": [
            {"a": texts.get(i, ""), "b": texts.get(j, ""), "cosine": float(sim)}
            for i, j, sim in dups["examples"]
        ],
    }


def _covers_shown(run: ReportRun, s: int) -> list[dict[str, Any]] | None:
    """Selection ``s``'s dropped documents beside the kept ones covering them (None: the
    file has no cover)."""
    covers = run.covers
    if covers[s] is None:
        return None
    start = sum(len(c[0]) * 2 for c in covers[:s] if c is not None)
    n_pairs = len(covers[s][0])
    pair_row = run.pairs["row"]
    dropped_rows = pair_row[start : start + n_pairs]
    kept_rows = pair_row[start + n_pairs : start + 2 * n_pairs]
    return [
        {
            "dropped": run.texts.get(int(d), ""),
            "kept": run.texts.get(int(c), ""),
            "cosine": float(sim),
        }
        for d, c, sim in zip(dropped_rows, kept_rows, covers[s][2], strict=True)
    ]


def _schema(path: Path, kind: str) -> pa.Schema:
    """The schema of the input's first file (what its text and length columns hold)."""
    if kind == "parquet":
        return open_parquet(path).schema_arrow  # local or remote
    return pa.ipc.open_stream(pa.memory_map(str(path), "r")).schema


def _div(a: float, b: float) -> float | None:
    return float(a) / float(b) if b else None
