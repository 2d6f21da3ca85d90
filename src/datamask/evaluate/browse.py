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
from pathlib import Path
from typing import Any

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.parquet as pq
import torch
from tqdm.auto import tqdm

from .._validation import SEED, Interval, Options, validate_params
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
from .redundancy import DEFAULT_THRESHOLDS, check_thresholds, redundancy
from .report import LENGTH_COLUMNS
from .topics import fit_topics, topic_words

__all__ = [
    "REPORT_CONSTRAINTS",
    "REPORT_SECTIONS",
    "build_report",
    "render_html",
    "write_report",
]


#: What each setting of :func:`build_report` accepts (the ``report`` command's flags and
#: their documented bounds; checked once, at the door, by ``validate_params``).
REPORT_CONSTRAINTS: dict[str, list] = {
    "n_topics": [Interval(int, 1, None, closed="left")],
    "sample_size": [Interval(int, 2, None, closed="left")],
    "map_method": [Options(str, ("pca", "tsne"))],
    "n_examples": [Interval(int, 0, None, closed="left")],
    "seed": [SEED],
    "batch_size": [Interval(int, 1, None, closed="left")],
}


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
    *,
    split: str | None = None,
    columns: Columns | None = None,
    text_col: str | None = None,
    length_col: str | None = None,
    n_topics: int = 12,
    sample_size: int = 4000,
    map_method: str = "pca",
    n_examples: int = 3,
    dup_thresholds: Sequence[float] = DEFAULT_THRESHOLDS,
    seed: int = 0,
    batch_size: int = 16384,
    progress: bool = False,
    trust_selection: bool = False,
) -> dict[str, Any]:
    """Everything the page shows, computed in two streaming passes over ``source``.

    Parameters
    ----------
    source : str
        The corpus the selections were made from (any input ``datamask select`` takes).
    selections : sequence of str
        Selection files (any form :func:`~datamask.io.selection.read_selection_ids` reads),
        shown side by side in this order.
    columns : Columns, optional
        The id, quality and embedding columns, as ``select`` names them; names not given
        are resolved against the input's schema. One quality column is shown raw; several
        are shown as their weighted mix, each min-max scaled over the corpus.
    text_col : str, optional
        Column with the documents' text, for topic labels, samples and pair examples;
        default ``text`` when the input has it (else the page shows no texts).
    length_col : str, optional
        Numbers or texts whose length is the document's length; default the first of
        ``n_chars, length, n_tokens, text`` present; none: no length figure.
    n_topics : int, default=12
        k-means clusters of the embeddings (fitted on the sample).
    sample_size : int, default=4000
        Seeded sample for the map, the topic fit, the text samples and the corpus's
        near-duplicate figures.
    map_method : {"pca", "tsne"}, default="pca"
        Projection of the 2-D map.
    n_examples : int, default=3
        Closest kept pairs shown per selection.
    dup_thresholds : sequence of float, default=(0.9, 0.95, 0.99)
        Cosine thresholds of the near-duplicate figures.
    seed : int, default=0
        Seed of the sample, the k-means fit and the map: the same seed gives the same page.
    batch_size : int, default=16384
        Rows read at a time.
    progress : bool, default=False
        Show progress bars (stderr).
    trust_selection : bool, default=False
        Skip the check that ``source`` is what each selection was made from (its recorded
        fingerprints, ``docs/provenance.md``), as ``evaluate`` and ``apply`` check it.
    """
    thresholds = check_thresholds(dup_thresholds)
    if not selections:
        raise ValueError("selections must name at least one selection file; got none.")
    settings = dict(n_topics=n_topics, sample_size=sample_size, map_method=map_method)
    settings.update(n_examples=n_examples, seed=seed, batch_size=batch_size)
    validate_params("build_report", REPORT_CONSTRAINTS, settings)
    require_matplotlib(tsne=map_method == "tsne")  # before the long passes

    kind, files = input_files(source, split=split)  # refuses a missing input or split now
    total = sum(i.num_rows for i in inspect_shards(files)) if kind == "parquet" else None
    names = input_column_names(source, split=split)
    cols = (columns or Columns()).resolve(names, where=str(source))
    id_col, feature_col = cols.id_col, cols.feature_col
    quality_cols, quality_weights = list(cols.quality_cols), cols.quality_weights
    for c in [id_col, *quality_cols, feature_col]:
        if c not in names:
            raise ValueError(f"column {c!r} not found in {files[0]}; available columns: {names}.")
    if text_col is None:
        text_col = "text" if "text" in names else None
    elif text_col not in names:
        raise ValueError(
            f"column {text_col!r} not found in {files[0]}; available columns: {names}."
        )
    if length_col is not None:
        if length_col not in names:
            raise ValueError(
                f"column {length_col!r} not found in {files[0]}; available columns: {names}."
            )
    else:
        length_col = next((c for c in LENGTH_COLUMNS if c in names), None)
    schema = _schema(files[0], kind)
    if text_col is not None:  # the one text check: names the column and the file
        text_array(pa.nulls(0, schema.field(text_col).type), text_col, str(files[0]))
    length_of_text = False
    if length_col is not None:
        length_type = schema.field(length_col).type
        lengths_from_arrow(pa.nulls(0, length_type), length_col, str(files[0]))
        length_of_text = is_text_type(length_type)
    weights = np.full(len(quality_cols), 1.0 / len(quality_cols))
    if quality_weights is not None:
        weights = np.asarray(quality_weights, float)
        if weights.shape != (len(quality_cols),) or weights.sum() <= 0:
            raise ValueError(
                f"quality_weights must hold one positive weight per quality column "
                f"({len(quality_cols)}); got {list(quality_weights)}."
            )
        weights = weights / weights.sum()

    sels = []
    taken: set[str] = set()
    for i, path in enumerate(selections):
        what = "selection" if i == 0 else "compared selection"
        expect_file(path, what=what, accepted=SELECTION_FILES)  # before its provenance
        if not trust_selection:  # before the passes: is this what it was made from?
            verify_selection_file(path, source, split=split)
        elif selection_record(path) is None:
            warn_trust_unused(str(path), "it holds no provenance record to check")
        summary = read_summary(path) if str(path).endswith(".parquet") else None
        ids = read_selection_ids(path, id_col=id_col, what=what)
        if len(ids) == 0:
            raise ValueError(f"{path} selects no documents.")
        if not summary_is_current(summary, selection_digest(ids), f"{what} {str(path)!r}"):
            summary = {**summary, "terms": None}  # the terms of other rows: not shown
        sels.append(
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
    n_sel = len(sels)
    # Dropped documents and the kept ones covering them: their rows are found in pass 1,
    # their texts read in pass 2 with the samples'.
    covers = [_cover_pairs(sel["path"], id_col) for sel in sels]
    pair_ids = [a for c in covers if c is not None for a in (c[0], c[1])]
    pair_set = pair_of = None
    if pair_ids:  # a kept document may cover several shown: each id once in the set
        every = pa.chunked_array(pair_ids).combine_chunks()
        unique = pc.unique(every)
        pair_set = IdSet(unique)
        pair_of = np.empty(len(every), dtype=np.int64)
        at, members = pair_set.find(every)
        pair_of[at] = members
        unique_row = np.full(len(unique), -1, dtype=np.int64)
    read_cols = [id_col, *quality_cols, feature_col]
    if length_col is not None:
        read_cols.append(length_col)

    def batches(cols: list[str], desc: str) -> Iterator[tuple[pa.RecordBatch, str, int]]:
        """Each batch with its file and its first row in that file (named by errors)."""
        bar = tqdm(total=total, desc=desc, unit="doc", disable=not progress, leave=False)
        last, row = None, 0
        with bar:
            for batch, where in input_batches(source, cols, split=split, batch_size=batch_size):
                row = row if where == last else 0
                yield batch, where, row
                last, row = where, row + batch.num_rows
                bar.update(batch.num_rows)

    def kept_masks(ids: pa.Array) -> list[np.ndarray]:
        out = []
        for s in sels:
            mask = np.zeros(len(ids), dtype=bool)
            own = ids.cast(pa.string()) if s["as_text"] and ids.type != pa.string() else ids
            mask[s["set"].positions(own)] = True
            out.append(mask)
        return out

    def lengths_of(batch: pa.RecordBatch, where: str, row: int) -> np.ndarray | None:
        if length_col is None:
            return None
        return lengths_from_arrow(batch.column(length_col), length_col, where, row)

    # --- pass 1: ranges, the seeded sample, each selection's kept embeddings ----------------
    n = 0
    q_lo = np.full(len(quality_cols), np.inf)
    q_hi = np.full(len(quality_cols), -np.inf)
    len_lo, len_hi = np.inf, -np.inf
    found = [0] * n_sel
    kept_feats: list[list[np.ndarray]] = [[] for _ in sels]
    kept_rows: list[list[np.ndarray]] = [[] for _ in sels]
    samp: dict[str, np.ndarray] | None = None
    width: int | None = None
    for batch, where, file_row in batches(read_cols, "report: pass 1/2"):
        m = batch.num_rows
        ids = batch.column(id_col)
        q = _quality(batch, quality_cols, where)
        feats = _unit(features_from_arrow(batch.column(feature_col), where, feature_col))
        if width is None:
            width = feats.shape[1]
        elif feats.shape[1] != width:
            raise ValueError(f"embedding width {feats.shape[1]} in {where} does not match {width}.")
        lengths = lengths_of(batch, where, file_row)
        q_lo, q_hi = np.minimum(q_lo, q.min(0)), np.maximum(q_hi, q.max(0))
        if lengths is not None:
            len_lo, len_hi = min(len_lo, float(lengths.min())), max(len_hi, float(lengths.max()))
        masks = kept_masks(ids)
        rows = np.arange(n, n + m, dtype=np.int64)
        if pair_set is not None:
            at, members = pair_set.find(ids)
            unique_row[members] = rows[at]
        for s, mask in enumerate(masks):
            found[s] += int(mask.sum())
            kept_feats[s].append(feats[mask])
            kept_rows[s].append(rows[mask])
        piece = {
            "key": _sample_keys(ids, seed),
            "row": rows,
            "q": q,
            "feats": feats,
            "len": lengths if lengths is not None else np.zeros(m),
            "kept": np.stack(masks, axis=1),
        }
        samp = piece if samp is None else {k: np.concatenate([samp[k], piece[k]]) for k in samp}
        if len(samp["key"]) > sample_size:
            keep = np.sort(np.argpartition(samp["key"], sample_size - 1)[:sample_size])
            samp = {k: v[keep] for k, v in samp.items()}
        n += m
    if samp is None or n == 0:
        raise ValueError(f"{source} has no rows.")
    for s, sel in enumerate(sels):
        if found[s] != sel["n_ids"]:
            raise ValueError(
                f"{sel['n_ids'] - found[s]} of the {sel['n_ids']} ids in {sel['path']} are "
                f"not in {source}; was the selection made from another input, or with another "
                "--id-col?"
                if found[s] < sel["n_ids"]
                else f"ids of {sel['path']} occur more than once in {source}; ids must be unique."
            )
    order = np.argsort(samp["row"])
    samp = {k: v[order] for k, v in samp.items()}

    def combined(q: np.ndarray) -> np.ndarray:
        if q.shape[1] == 1:
            return q[:, 0]
        span = np.where(q_hi > q_lo, q_hi - q_lo, 1.0)
        return np.where(q_hi > q_lo, (q - q_lo) / span, 0.5) @ weights

    quality_label = (
        quality_cols[0] if len(quality_cols) == 1 else "quality (weighted mix, scaled to [0, 1])"
    )
    qc = combined(np.stack([q_lo, q_hi]))
    q_hist = Histogram(bin_edges(float(qc.min()), float(qc.max()), log=False), False, n_sel=n_sel)
    log_len = length_col is not None and len_lo >= 1 and len_hi / max(len_lo, 1) > 20
    l_hist = (
        Histogram(bin_edges(len_lo, len_hi, log=log_len), log_len, n_sel=n_sel)
        if length_col is not None
        else None
    )

    # --- topics (fitted on the sample), near-duplicates (exact over each kept set) ----------
    gen = torch.Generator().manual_seed(seed)
    x_s = torch.from_numpy(samp["feats"])
    centroids = fit_topics(x_s, n_topics, gen)
    n_topics = centroids.shape[0]
    samp_topic = assign_clusters(x_s, centroids).numpy()
    dup_sample = redundancy(x_s, thresholds=thresholds, method="exact")
    dups, pair_rows = [], set()
    for s in range(n_sel):
        xk = torch.from_numpy(np.concatenate(kept_feats[s]))
        rk = np.concatenate(kept_rows[s])
        fig = redundancy(xk, thresholds=thresholds, method="exact", closest=n_examples)
        examples = [(int(rk[i]), int(rk[j]), sim) for i, j, sim in fig.pop("closest", [])]
        pair_rows.update(r for i, j, _ in examples for r in (i, j))
        dups.append({"figures": fig, "examples": examples})
    del kept_feats, kept_rows

    # --- pass 2: per-topic counts and quality, histograms, texts of the rows shown ----------
    counts = np.zeros(n_topics, np.int64)
    kept_n = np.zeros((n_sel, n_topics), np.int64)
    q_all = np.zeros(n_topics)
    q_kept = np.zeros((n_sel, n_topics))
    sums = {"q_all": 0.0, "q_kept": np.zeros(n_sel), "l_all": 0.0, "l_kept": np.zeros(n_sel)}
    want = np.union1d(samp["row"], np.fromiter(pair_rows, np.int64, len(pair_rows)))
    pair_row = unique_row[pair_of] if pair_set is not None else np.zeros(0, np.int64)
    want = np.union1d(want, pair_row[pair_row >= 0])
    texts: dict[int, str] = {}
    cols2 = [id_col, *quality_cols, feature_col]
    if length_col is not None:
        cols2.append(length_col)
    if text_col is not None:
        cols2.append(text_col)
    row0 = 0
    cent = centroids
    for batch, where, file_row in batches(cols2, "report: pass 2/2"):
        m = batch.num_rows
        ids = batch.column(id_col)
        q = combined(_quality(batch, quality_cols, where))
        feats = _unit(features_from_arrow(batch.column(feature_col), where, feature_col))
        topic = assign_clusters(torch.from_numpy(feats), cent).numpy()
        masks = kept_masks(ids)
        counts += np.bincount(topic, minlength=n_topics)
        q_all += np.bincount(topic, weights=q, minlength=n_topics)
        sums["q_all"] += float(q.sum())
        q_hist.add(q, masks)
        lengths = lengths_of(batch, where, file_row)
        if l_hist is not None and lengths is not None:
            l_hist.add(lengths, masks)
            sums["l_all"] += float(lengths.sum())
        for s, mask in enumerate(masks):
            kept_n[s] += np.bincount(topic[mask], minlength=n_topics)
            q_kept[s] += np.bincount(topic[mask], weights=q[mask], minlength=n_topics)
            sums["q_kept"][s] += float(q[mask].sum())
            if lengths is not None:
                sums["l_kept"][s] += float(lengths[mask].sum())
        if text_col is not None:
            lo = np.searchsorted(want, row0)
            hi = np.searchsorted(want, row0 + m)
            local = want[lo:hi] - row0
            if len(local):
                col = text_array(batch.column(text_col), text_col, where, file_row)
                col = col.take(pa.array(local))
                for r, t in zip(local, col.to_pylist(), strict=True):
                    texts[int(r + row0)] = _truncate(t or "")
        row0 += m
    if row0 != n:
        raise ValueError(f"{source} changed between the two passes ({n} rows, then {row0}).")

    # --- assemble --------------------------------------------------------------------------
    samp_q = combined(samp["q"])
    sample_texts = [texts.get(int(r), "") for r in samp["row"]]
    words = (
        topic_words(sample_texts, samp_topic, n_topics)
        if text_col is not None
        else [[] for _ in range(n_topics)]
    )
    topics = [
        {"topic": t, "words": words[t], "n": int(counts[t]), "q_mean": _div(q_all[t], counts[t])}
        for t in range(n_topics)
    ]
    out_sel = []
    for s, sel in enumerate(sels):
        k = int(kept_n[s].sum())
        per_topic = []
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
        samples = []
        for t in range(n_topics):
            in_t = np.flatnonzero(samp_topic == t)
            kept_t = in_t[samp["kept"][in_t, s]]
            drop_t = in_t[~samp["kept"][in_t, s]]
            samples.append(
                {
                    "kept": [sample_texts[i] for i in kept_t[:2]],
                    "dropped": [sample_texts[i] for i in drop_t[:2]],
                }
            )
        summary = sel["summary"] or {}
        cover_shown = None
        if covers[s] is not None:
            start = sum(len(c[0]) * 2 for c in covers[:s] if c is not None)
            n_pairs = len(covers[s][0])
            dropped_rows = pair_row[start : start + n_pairs]
            kept_rows_ = pair_row[start + n_pairs : start + 2 * n_pairs]
            cover_shown = [
                {
                    "dropped": texts.get(int(d), ""),
                    "kept": texts.get(int(c), ""),
                    "cosine": float(sim),
                }
                for d, c, sim in zip(dropped_rows, kept_rows_, covers[s][2], strict=True)
            ]
        out_sel.append(
            {
                "label": sel["label"],
                "path": sel["path"],
                "k": k,
                "share": k / n,
                "terms": summary.get("terms"),
                "settings": summary.get("settings"),
                "method": summary.get("method"),
                "quality_kept": _div(sums["q_kept"][s], k),
                "quality_dropped": _div(sums["q_all"] - sums["q_kept"][s], n - k),
                "length_kept": _div(sums["l_kept"][s], k) if l_hist else None,
                "length_dropped": _div(sums["l_all"] - sums["l_kept"][s], n - k)
                if l_hist
                else None,
                "topics": per_topic,
                "samples": samples,
                "covers": cover_shown,
                "duplicates": dups[s]["figures"],
                "examples": [
                    {"a": texts.get(i, ""), "b": texts.get(j, ""), "cosine": float(sim)}
                    for i, j, sim in dups[s]["examples"]
                ],
            }
        )
    m_rows = np.arange(len(samp["row"]))
    if map_method == "tsne" and len(m_rows) > 3000:
        m_rows = np.sort(np.random.default_rng(seed).choice(len(m_rows), 3000, replace=False))
    xy = project_2d(samp["feats"][m_rows], method=map_method, seed=seed)
    return {
        "source": str(source),
        "n_docs": n,
        "quality_label": quality_label,
        "quality_all": sums["q_all"] / n,
        "length_label": length_col if not length_of_text else f"len({length_col})",
        "length_all": sums["l_all"] / n if l_hist else None,
        "text_col": text_col,
        "seed": seed,
        "sample_size": len(samp["row"]),
        "map_method": map_method,
        "topics": topics,
        "selections": out_sel,
        "dup_sample": dup_sample,
        "thresholds": [f"{t:g}" for t in thresholds],
        "_quality_hist": q_hist,
        "_length_hist": l_hist,
        "_centroids": centroids.numpy(),
        "_map": {
            "xy": xy,
            "topic": samp_topic[m_rows],
            "kept": samp["kept"][m_rows],
            "quality": samp_q[m_rows],
        },
    }


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
