"""A selection report a person reads in a browser: one self-contained HTML page.

    datamask report --input docs.parquet --selection mask.parquet --compare topk.parquet \\
        --output report/

For each selection, side by side: per topic (spherical k-means clusters of the
embeddings, labelled by their most distinctive words when a text column exists) the
documents in, kept, share kept and mean quality kept against dropped; the quality and
length distributions of the kept, the dropped and the whole corpus; a 2-D map of a sample
with the kept documents marked; the near-duplicate figures of ``evaluate`` (the same
:func:`~datamask.evaluate.redundancy.redundancy`) with the closest kept pairs; text
samples kept and dropped per topic; dropped documents next to the kept document that
covers them (the selection's ``covered_by``, text side by side: the most similar pairs and
the least); the objective terms and settings of each selection's summary.

The input is streamed twice, batch by batch (any input ``select`` takes: a parquet file,
folder or glob, a save_to_disk folder). Memory holds one batch, a seeded sample of
``sample_size`` documents (chosen by a hash of the id and the seed, so the same seed gives
the same page whatever the batch size or the order of the files), each selection's kept
ids and embeddings (the near-duplicate figures are exact over them), and fixed-size
histograms: flat in the number of documents.

This module computes the report (:func:`build_report`); the page and its figures are made
by :mod:`.page` (matplotlib PNGs inlined as base64; every text that enters the page is
HTML-escaped, and the page's Content-Security-Policy forbids scripts and any request), the
topics by :mod:`.topics`, the distributions by :mod:`.histogram`.
"""

from __future__ import annotations

from collections.abc import Iterator, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.parquet as pq
import torch
from tqdm.auto import tqdm

from ..columns import Columns
from ..io.datasets import input_batches, input_column_names, input_files
from ..io.fs import expect_file
from ..io.keep import IdSet, selection_digest
from ..io.parquet import features_from_arrow, read_summary
from ..io.provenance import selection_record, verify_selection_file, warn_trust_unused
from ..io.selection import SELECTION_FILES, read_selection_ids, summary_is_current
from ..io.shards import hash_ids, inspect_shards
from ..io.text import is_text_type, lengths_from_arrow, text_array
from ..neighbors import assign_clusters
from .histogram import Histogram, bin_edges
from .page import REPORT_SECTIONS, TEXT_CHARS, render_html, write_report
from .plots import project_2d, require_matplotlib
from .redundancy import redundancy
from .report import LENGTH_COLUMNS
from .report_spec import REPORT_CONSTRAINTS, ReportSpec
from .topics import fit_topics, topic_words

__all__ = [
    "REPORT_CONSTRAINTS",
    "REPORT_SECTIONS",
    "ReportSpec",
    "build_report",
    "render_html",
    "write_report",
]


def _sample_keys(ids: pa.Array, seed: int) -> np.ndarray:
    """A seeded pseudo-random 64-bit key per id: the sample is the ``size`` smallest keys."""
    h = hash_ids(ids) + np.uint64(seed & 0xFFFFFFFF)
    return hash_ids(pa.array(h.view(np.int64)))


#: Dropped documents shown beside their cover per selection: the most similar pairs (the
#: drops a reader should agree with) and the least (the drops worth a second look).
COVER_HIGH, COVER_LOW = 4, 2


def _cover_pairs(path: str, id_col: str) -> tuple[pa.Array, pa.Array, np.ndarray] | None:
    """``(dropped ids, their covered_by, covered_sim)`` shown for a selection file: the
    :data:`COVER_HIGH` highest ``covered_sim`` and the :data:`COVER_LOW` lowest, ties by
    row order; None when the file has no cover (ids only, or made before covered_by)."""
    if not path.endswith(".parquet"):
        return None
    wanted = [id_col, "selected", "covered_by", "covered_sim"]
    if not set(wanted) <= set(pq.read_schema(path).names):
        return None
    t = pq.read_table(path, columns=wanted)
    t = t.filter(pc.and_(pc.invert(t.column("selected")), pc.is_valid(t.column("covered_by"))))
    sims = t.column("covered_sim").to_numpy()
    order = np.argsort(-sims, kind="stable")
    n_high = min(COVER_HIGH, len(order))
    rows = np.concatenate([order[:n_high], order[n_high:][::-1][:COVER_LOW][::-1]])
    pick = pa.array(rows.astype(np.int64))
    return t.column(id_col).take(pick), t.column("covered_by").take(pick), sims[rows]


def _label(path: str, summary: dict[str, Any] | None, taken: set[str]) -> str:
    base = (summary or {}).get("method") or Path(path).stem
    label, i = str(base), 2
    while label in taken:
        label, i = f"{base} ({i})", i + 1
    taken.add(label)
    return label


def _truncate(text: str, n: int = TEXT_CHARS) -> str:
    text = " ".join(text.split())
    return text if len(text) <= n else text[: n - 1] + "\u2026"


def build_report(
    source: str,
    selections: Sequence[str],
    spec: ReportSpec | None = None,
    **settings: Any,
) -> dict[str, Any]:
    """Everything the page shows, computed in two streaming passes over ``source``.

    It runs as named phases over one run context (:class:`_Report`): :func:`_open` (the
    input's files and columns), :func:`_load_selections` (each selection's ids, checked
    against its provenance), :func:`_first_pass` (ranges, the seeded sample, each
    selection's kept embeddings), :func:`_fit_topics` (topics and near-duplicate figures),
    :func:`_second_pass` (per-topic counts, histograms, texts) and :func:`_assemble`.

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
        Any field of :class:`~datamask.evaluate.report_spec.ReportSpec` by its key, instead
        of ``spec``: ``split``, ``columns``, ``text_col``, ``length_col``, ``n_topics``
        (default 12), ``sample_size`` (4000), ``map_method`` (``"pca"`` or ``"tsne"``),
        ``n_examples`` (3), ``dup_thresholds`` ((0.9, 0.95, 0.99)), ``seed`` (0: the same
        seed gives the same page), ``batch_size`` (16384), ``progress`` (False),
        ``trust_selection`` (False: ``source`` is checked to be what each selection was
        made from, its recorded fingerprints, ``docs/provenance.md``).
    """
    if spec is not None and settings:
        raise TypeError(
            f"give the settings either as spec= or as keywords, not both; got spec= and "
            f"{sorted(settings)}."
        )
    spec = ReportSpec.from_mapping(settings) if spec is None else spec
    if not isinstance(spec, ReportSpec):
        raise TypeError(f"spec must be a ReportSpec; got {spec!r}.")
    if not selections:
        raise ValueError("selections must name at least one selection file; got none.")
    require_matplotlib(tsne=spec.map_method == "tsne")  # before the long passes
    run = _open(source, spec)
    _load_selections(run, selections)
    _first_pass(run)
    _fit_topics(run)
    _second_pass(run)
    return _assemble(run)


@dataclass
class _Report:
    """One report's state, as its phases fill it."""

    spec: ReportSpec
    source: Any
    kind: str
    files: list
    total: int | None
    cols: Columns  # resolved
    text_col: str | None
    length_col: str | None
    length_of_text: bool
    weights: np.ndarray
    sels: list[dict[str, Any]] = field(default_factory=list)
    covers: list[Any] = field(default_factory=list)
    pairs: dict[str, Any] = field(default_factory=dict)  # the covers' ids, rows
    n: int = 0
    q_lo: np.ndarray | None = None
    q_hi: np.ndarray | None = None
    samp: dict[str, np.ndarray] | None = None
    kept: dict[str, list] = field(default_factory=dict)  # pass 1: feats, rows per selection
    topics: dict[str, Any] = field(default_factory=dict)
    per_topic: dict[str, Any] = field(default_factory=dict)  # pass 2
    texts: dict[int, str] = field(default_factory=dict)

    @property
    def quality_cols(self) -> list[str]:
        return list(self.cols.quality_cols)

    def read_cols(self, text: bool = False) -> list[str]:
        out = [self.cols.id_col, *self.quality_cols, self.cols.feature_col]
        if self.length_col is not None:
            out.append(self.length_col)
        if text and self.text_col is not None:
            out.append(self.text_col)
        return out

    def batches(self, cols: list[str], desc: str) -> Iterator[tuple[pa.RecordBatch, str, int]]:
        """Each batch with its file and its first row in that file (named by errors)."""
        spec = self.spec
        bar = tqdm(total=self.total, desc=desc, unit="doc", disable=not spec.progress, leave=False)
        last, row = None, 0
        with bar:
            for batch, where in input_batches(
                self.source, cols, split=spec.split, batch_size=spec.batch_size
            ):
                row = row if where == last else 0
                yield batch, where, row
                last, row = where, row + batch.num_rows
                bar.update(batch.num_rows)

    def kept_masks(self, ids: pa.Array) -> list[np.ndarray]:
        out = []
        for s in self.sels:
            mask = np.zeros(len(ids), dtype=bool)
            own = ids.cast(pa.string()) if s["as_text"] and ids.type != pa.string() else ids
            mask[s["set"].positions(own)] = True
            out.append(mask)
        return out

    def lengths_of(self, batch: pa.RecordBatch, where: str, row: int) -> np.ndarray | None:
        if self.length_col is None:
            return None
        return lengths_from_arrow(batch.column(self.length_col), self.length_col, where, row)

    def features(self, batch: pa.RecordBatch, where: str) -> np.ndarray:
        col = self.cols.feature_col
        return _unit(features_from_arrow(batch.column(col), where, col))

    def combined(self, q: np.ndarray) -> np.ndarray:
        """Quality as shown: one column raw, several as their weighted min-max mix."""
        if q.shape[1] == 1:
            return q[:, 0]
        q_lo, q_hi = self.q_lo, self.q_hi
        span = np.where(q_hi > q_lo, q_hi - q_lo, 1.0)
        return np.where(q_hi > q_lo, (q - q_lo) / span, 0.5) @ self.weights


def _open(source: Any, spec: ReportSpec) -> _Report:
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
    return _Report(
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


def _load_selections(run: _Report, selections: Sequence[str]) -> None:
    """Each selection's ids and summary (its provenance checked first), and the dropped
    documents shown beside the kept ones covering them (rows found in pass 1, texts read in
    pass 2 with the samples')."""
    taken: set[str] = set()
    spec, id_col = run.spec, run.cols.id_col
    for i, path in enumerate(selections):
        what = "selection" if i == 0 else "compared selection"
        expect_file(path, what=what, accepted=SELECTION_FILES)  # before its provenance
        if not spec.trust_selection:  # before the passes: is this what it was made from?
            verify_selection_file(path, run.source, split=spec.split)
        elif selection_record(path) is None:
            warn_trust_unused(str(path), "it holds no provenance record to check")
        summary = read_summary(path) if str(path).endswith(".parquet") else None
        ids = read_selection_ids(path, id_col=id_col, what=what)
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
                "as_text": pa.types.is_string(ids.type) and not str(path).endswith(".parquet"),
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


def _first_pass(run: _Report) -> None:
    """Pass 1: quality and length ranges, the seeded sample, each selection's kept
    embeddings and rows; every selection's ids checked to be found once."""
    spec, n_sel = run.spec, len(run.sels)
    n = 0
    q_lo = np.full(len(run.quality_cols), np.inf)
    q_hi = np.full(len(run.quality_cols), -np.inf)
    len_lo, len_hi = np.inf, -np.inf
    found = [0] * n_sel
    kept_feats: list[list[np.ndarray]] = [[] for _ in run.sels]
    kept_rows: list[list[np.ndarray]] = [[] for _ in run.sels]
    samp: dict[str, np.ndarray] | None = None
    width: int | None = None
    for batch, where, file_row in run.batches(run.read_cols(), "report: pass 1/2"):
        m = batch.num_rows
        ids = batch.column(run.cols.id_col)
        q = _quality(batch, run.quality_cols, where)
        feats = run.features(batch, where)
        if width is None:
            width = feats.shape[1]
        elif feats.shape[1] != width:
            raise ValueError(f"embedding width {feats.shape[1]} in {where} does not match {width}.")
        lengths = run.lengths_of(batch, where, file_row)
        q_lo, q_hi = np.minimum(q_lo, q.min(0)), np.maximum(q_hi, q.max(0))
        if lengths is not None:
            len_lo, len_hi = min(len_lo, float(lengths.min())), max(len_hi, float(lengths.max()))
        masks = run.kept_masks(ids)
        rows = np.arange(n, n + m, dtype=np.int64)
        if run.pairs:
            at, members = run.pairs["set"].find(ids)
            run.pairs["unique_row"][members] = rows[at]
        for s, mask in enumerate(masks):
            found[s] += int(mask.sum())
            kept_feats[s].append(feats[mask])
            kept_rows[s].append(rows[mask])
        piece = {
            "key": _sample_keys(ids, spec.seed),
            "row": rows,
            "q": q,
            "feats": feats,
            "len": lengths if lengths is not None else np.zeros(m),
            "kept": np.stack(masks, axis=1),
        }
        samp = piece if samp is None else {k: np.concatenate([samp[k], piece[k]]) for k in samp}
        if len(samp["key"]) > spec.sample_size:
            keep = np.sort(np.argpartition(samp["key"], spec.sample_size - 1)[: spec.sample_size])
            samp = {k: v[keep] for k, v in samp.items()}
        n += m
    if samp is None or n == 0:
        raise ValueError(f"{run.source} has no rows.")
    _check_found(run, found)
    order = np.argsort(samp["row"])
    run.samp = {k: v[order] for k, v in samp.items()}
    run.n, run.q_lo, run.q_hi = n, q_lo, q_hi
    run.kept = {"feats": kept_feats, "rows": kept_rows, "len_range": (len_lo, len_hi)}


def _check_found(run: _Report, found: list[int]) -> None:
    """Each selection's ids found in the input, each once."""
    for s, sel in enumerate(run.sels):
        if found[s] != sel["n_ids"]:
            raise ValueError(
                f"{sel['n_ids'] - found[s]} of the {sel['n_ids']} ids in {sel['path']} are "
                f"not in {run.source}; was the selection made from another input, or with "
                "another --id-col?"
                if found[s] < sel["n_ids"]
                else f"ids of {sel['path']} occur more than once in {run.source}; ids must be "
                "unique."
            )


def _fit_topics(run: _Report) -> None:
    """Topics (k-means fitted on the sample) and near-duplicates (exact over each kept
    set, with its closest pairs' rows)."""
    spec, samp = run.spec, run.samp
    thresholds = spec.dup_thresholds
    gen = torch.Generator().manual_seed(spec.seed)
    x_s = torch.from_numpy(samp["feats"])
    centroids = fit_topics(x_s, spec.n_topics, gen)
    samp_topic = assign_clusters(x_s, centroids).numpy()
    dup_sample = redundancy(x_s, thresholds=thresholds, method="exact")
    dups, pair_rows = [], set()
    for s in range(len(run.sels)):
        xk = torch.from_numpy(np.concatenate(run.kept["feats"][s]))
        rk = np.concatenate(run.kept["rows"][s])
        fig = redundancy(xk, thresholds=thresholds, method="exact", closest=spec.n_examples)
        examples = [(int(rk[i]), int(rk[j]), sim) for i, j, sim in fig.pop("closest", [])]
        pair_rows.update(r for i, j, _ in examples for r in (i, j))
        dups.append({"figures": fig, "examples": examples})
    run.kept = {"len_range": run.kept["len_range"]}  # the kept embeddings: freed
    run.topics = {
        "centroids": centroids,
        "n": centroids.shape[0],  # fewer than asked for on a small sample
        "samp_topic": samp_topic,
        "dup_sample": dup_sample,
        "dups": dups,
        "pair_rows": pair_rows,
    }


def _histograms(run: _Report) -> tuple[Histogram, Histogram | None]:
    """The quality and length histograms' bins, from pass 1's ranges."""
    n_sel = len(run.sels)
    qc = run.combined(np.stack([run.q_lo, run.q_hi]))
    q_hist = Histogram(bin_edges(float(qc.min()), float(qc.max()), log=False), False, n_sel=n_sel)
    if run.length_col is None:
        return q_hist, None
    len_lo, len_hi = run.kept["len_range"]
    log_len = len_lo >= 1 and len_hi / max(len_lo, 1) > 20
    return q_hist, Histogram(bin_edges(len_lo, len_hi, log=log_len), log_len, n_sel=n_sel)


def _second_pass(run: _Report) -> None:
    """Pass 2: per-topic counts and quality, the histograms, the texts of the rows shown."""
    n_sel, n_topics = len(run.sels), run.topics["n"]
    q_hist, l_hist = _histograms(run)
    counts = np.zeros(n_topics, np.int64)
    kept_n = np.zeros((n_sel, n_topics), np.int64)
    q_all = np.zeros(n_topics)
    q_kept = np.zeros((n_sel, n_topics))
    sums = {"q_all": 0.0, "q_kept": np.zeros(n_sel), "l_all": 0.0, "l_kept": np.zeros(n_sel)}
    want = _rows_shown(run)
    row0, cent = 0, run.topics["centroids"]
    for batch, where, file_row in run.batches(run.read_cols(text=True), "report: pass 2/2"):
        m = batch.num_rows
        q = run.combined(_quality(batch, run.quality_cols, where))
        topic = assign_clusters(torch.from_numpy(run.features(batch, where)), cent).numpy()
        masks = run.kept_masks(batch.column(run.cols.id_col))
        counts += np.bincount(topic, minlength=n_topics)
        q_all += np.bincount(topic, weights=q, minlength=n_topics)
        sums["q_all"] += float(q.sum())
        q_hist.add(q, masks)
        lengths = run.lengths_of(batch, where, file_row)
        if l_hist is not None and lengths is not None:
            l_hist.add(lengths, masks)
            sums["l_all"] += float(lengths.sum())
        for s, mask in enumerate(masks):
            kept_n[s] += np.bincount(topic[mask], minlength=n_topics)
            q_kept[s] += np.bincount(topic[mask], weights=q[mask], minlength=n_topics)
            sums["q_kept"][s] += float(q[mask].sum())
            if lengths is not None:
                sums["l_kept"][s] += float(lengths[mask].sum())
        if run.text_col is not None:
            _read_texts(run, batch, where, file_row, want[np.searchsorted(want, row0) :], row0)
        row0 += m
    if row0 != run.n:
        raise ValueError(
            f"{run.source} changed between the two passes ({run.n} rows, then {row0})."
        )
    run.per_topic = {"counts": counts, "kept_n": kept_n, "q_all": q_all, "q_kept": q_kept}
    run.per_topic.update(sums=sums, q_hist=q_hist, l_hist=l_hist)


def _rows_shown(run: _Report) -> np.ndarray:
    """The rows whose texts the page shows: the sample, the closest pairs, the covers."""
    pair_rows = run.topics["pair_rows"]
    want = np.union1d(run.samp["row"], np.fromiter(pair_rows, np.int64, len(pair_rows)))
    pairs = run.pairs
    pair_row = pairs["unique_row"][pairs["of"]] if pairs else np.zeros(0, np.int64)
    run.pairs["row"] = pair_row
    return np.union1d(want, pair_row[pair_row >= 0])


def _read_texts(
    run: _Report, batch: pa.RecordBatch, where: str, file_row: int, want: np.ndarray, row0: int
) -> None:
    """The texts of the wanted rows in this batch (``want``: sorted, from ``row0`` on)."""
    local = want[: np.searchsorted(want, row0 + batch.num_rows)] - row0
    if len(local):
        col = text_array(batch.column(run.text_col), run.text_col, where, file_row)
        col = col.take(pa.array(local))
        for r, t in zip(local, col.to_pylist(), strict=True):
            run.texts[int(r + row0)] = _truncate(t or "")


def _assemble(run: _Report) -> dict[str, Any]:
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


def _selection_result(run: _Report, s: int, sample_texts: list[str]) -> dict[str, Any]:
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
        "topics": per_topic,
        "samples": samples,
        "covers": _covers_shown(run, s),
        "duplicates": dups["figures"],
        "examples": [
            {"a": texts.get(i, ""), "b": texts.get(j, ""), "cosine": float(sim)}
            for i, j, sim in dups["examples"]
        ],
    }


def _covers_shown(run: _Report, s: int) -> list[dict[str, Any]] | None:
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
        return pq.read_schema(path)
    return pa.ipc.open_stream(pa.memory_map(str(path), "r")).schema


def _quality(batch: pa.RecordBatch, cols: Sequence[str], where: str) -> np.ndarray:
    out = []
    for c in cols:
        col = batch.column(c)
        if col.null_count:
            raise ValueError(f"column {c!r} has {col.null_count} null values in {where}.")
        out.append(np.asarray(col.to_numpy(zero_copy_only=False), dtype=np.float64))
    q = np.stack(out, axis=1)
    if not np.isfinite(q).all():
        raise ValueError(f"quality columns {list(cols)} hold NaN or inf values in {where}.")
    return q


def _unit(feats: np.ndarray) -> np.ndarray:
    norms = np.linalg.norm(feats, axis=1, keepdims=True)
    return (feats / np.where(norms > 0, norms, 1.0)).astype(np.float32, copy=False)


def _div(a: float, b: float) -> float | None:
    return float(a) / float(b) if b else None
