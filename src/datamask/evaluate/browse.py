"""A selection report a person reads in a browser: one self-contained HTML page.

    datamask report --input docs.parquet --selection mask.parquet --compare topk.parquet \\
        --output report/

For each selection, side by side: per topic (spherical k-means clusters of the
embeddings, labelled by their most distinctive words when a text column exists) the
documents in, kept, share kept and mean quality kept against dropped; the quality and
length distributions of the kept, the dropped and the whole corpus; a 2-D map of a sample
with the kept documents marked; the near-duplicate figures of ``evaluate`` (the same
:func:`~datamask.evaluate.redundancy.redundancy`) with the closest kept pairs; text
samples kept and dropped per topic; the objective terms and settings of each selection's
summary.

The input is streamed twice, batch by batch (any input ``select`` takes: a parquet file,
folder or glob, a save_to_disk folder). Memory holds one batch, a seeded sample of
``sample_size`` documents (chosen by a hash of the id and the seed, so the same seed gives
the same page whatever the batch size or the order of the files), each selection's kept
ids and embeddings (the near-duplicate figures are exact over them), and fixed-size
histograms: flat in the number of documents. The figures are matplotlib PNGs inlined as
base64; every text that enters the page is HTML-escaped, and the page's
Content-Security-Policy forbids scripts and any request.
"""

from __future__ import annotations

import base64
import html
import io
import json
import re
import string
from collections import Counter
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
from ..io.atomic import atomic_write_text
from ..io.datasets import input_batches, input_column_names, input_files
from ..io.keep import IdSet
from ..io.parquet import features_from_arrow, read_summary
from ..io.selection import read_selection_ids
from ..io.shards import hash_ids, inspect_shards
from ..neighbors import assign_clusters, spherical_kmeans
from .plots import _color, project_2d, require_matplotlib
from .redundancy import DEFAULT_THRESHOLDS, check_thresholds, redundancy
from .report import LENGTH_COLUMNS

__all__ = ["REPORT_SECTIONS", "build_report", "render_html", "write_report"]

#: The page's sections (their HTML ids), in order.
REPORT_SECTIONS = (
    "overview",
    "topics",
    "distributions",
    "map",
    "duplicates",
    "samples",
    "settings",
)

_BINS = 40
_TEXT_CHARS = 360
_WORD = re.compile(r"[a-z][a-z'_-]{2,}")
_STOP = frozenset(
    """the and for that this with from are was were you your have has had not but all any can
    will would there their they them then than what when which who whom how why where into
    out our ours its it's about also more most some such only other over under use used using
    one two may might must should could been being each per via get got let see like just
    these those here very much many make made does did done his her she him hers him's
    i'm we've you're it's don't can't won't isn't aren't the' new set sets value values
    file files line lines name names type types true false none null return returns data
    http https www com org html""".split()  # noqa: SIM905 - a word list reads better so
)


@dataclass
class _Hist:
    """Counts of values over fixed bins, for the whole corpus and kept/dropped per selection."""

    edges: np.ndarray
    log: bool
    all: np.ndarray = field(init=False)
    kept: list[np.ndarray] = field(init=False)
    n_sel: int = 0

    def __post_init__(self) -> None:
        self.all = np.zeros(len(self.edges) - 1, np.int64)
        self.kept = [np.zeros(len(self.edges) - 1, np.int64) for _ in range(self.n_sel)]

    def add(self, values: np.ndarray, kept: list[np.ndarray]) -> None:
        idx = np.clip(np.searchsorted(self.edges, values, side="right") - 1, 0, len(self.all) - 1)
        self.all += np.bincount(idx, minlength=len(self.all))
        for s, mask in enumerate(kept):
            self.kept[s] += np.bincount(idx[mask], minlength=len(self.all))


def _edges(lo: float, hi: float, *, log: bool) -> np.ndarray:
    if not hi > lo:
        lo, hi = lo - 0.5, hi + 0.5
    if log:
        return np.geomspace(max(lo, 1.0), hi, _BINS + 1)
    return np.linspace(lo, hi, _BINS + 1)


def _sample_keys(ids: pa.Array, seed: int) -> np.ndarray:
    """A seeded pseudo-random 64-bit key per id: the sample is the ``size`` smallest keys."""
    h = hash_ids(ids) + np.uint64(seed & 0xFFFFFFFF)
    return hash_ids(pa.array(h.view(np.int64)))


def _label(path: str, summary: dict[str, Any] | None, taken: set[str]) -> str:
    base = (summary or {}).get("method") or Path(path).stem
    label, i = str(base), 2
    while label in taken:
        label, i = f"{base} ({i})", i + 1
    taken.add(label)
    return label


def _topic_words(texts: Sequence[str], topics: np.ndarray, n_topics: int) -> list[list[str]]:
    """Most distinctive frequent words of each topic (count x log inverse topic frequency)."""
    counts = [Counter() for _ in range(n_topics)]
    for text, t in zip(texts, topics, strict=True):
        words = [w.strip("'-_") for w in _WORD.findall(text.lower())]
        counts[int(t)].update(w for w in words if len(w) > 2 and w not in _STOP)
    spread = Counter(w for c in counts for w in c)
    out = []
    for c in counts:
        scored = sorted(
            c.items(), key=lambda kv: (-kv[1] * np.log(1 + n_topics / spread[kv[0]]), kv[0])
        )
        out.append([w for w, _ in scored[:4]])
    return out


def _truncate(text: str, n: int = _TEXT_CHARS) -> str:
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
    """
    thresholds = check_thresholds(dup_thresholds)
    if not selections:
        raise ValueError("selections must name at least one selection file; got none.")
    if n_topics < 1:
        raise ValueError(f"n_topics must be >= 1; got {n_topics}.")
    if sample_size < 2:
        raise ValueError(f"sample_size must be >= 2; got {sample_size}.")
    if map_method not in ("pca", "tsne"):
        raise ValueError(f"map_method must be 'pca' or 'tsne'; got {map_method!r}.")
    if n_examples < 0:
        raise ValueError(f"n_examples must be >= 0; got {n_examples}.")
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
    length_of_text = length_col is not None and _is_text(files[0], kind, length_col)
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
    for path in selections:
        summary = read_summary(path) if str(path).endswith(".parquet") else None
        ids = read_selection_ids(path, id_col=id_col)
        if len(ids) == 0:
            raise ValueError(f"{path} selects no documents.")
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
    read_cols = [id_col, *quality_cols, feature_col]
    if length_col is not None:
        read_cols.append(length_col)

    def batches(cols: list[str], desc: str) -> Iterator[tuple[pa.RecordBatch, str]]:
        bar = tqdm(total=total, desc=desc, unit="doc", disable=not progress, leave=False)
        with bar:
            for batch, where in input_batches(source, cols, split=split, batch_size=batch_size):
                yield batch, where
                bar.update(batch.num_rows)

    def kept_masks(ids: pa.Array) -> list[np.ndarray]:
        out = []
        for s in sels:
            mask = np.zeros(len(ids), dtype=bool)
            own = ids.cast(pa.string()) if s["as_text"] and ids.type != pa.string() else ids
            mask[s["set"].positions(own)] = True
            out.append(mask)
        return out

    def lengths_of(batch: pa.RecordBatch) -> np.ndarray | None:
        if length_col is None:
            return None
        col = batch.column(length_col)
        if pa.types.is_string(col.type) or pa.types.is_large_string(col.type):
            col = pc.utf8_length(col)
        return np.asarray(col.fill_null(0).to_numpy(zero_copy_only=False), dtype=np.float64)

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
    for batch, where in batches(read_cols, "report: pass 1/2"):
        m = batch.num_rows
        ids = batch.column(id_col)
        q = _quality(batch, quality_cols, where)
        feats = _unit(features_from_arrow(batch.column(feature_col), where, feature_col))
        if width is None:
            width = feats.shape[1]
        elif feats.shape[1] != width:
            raise ValueError(f"embedding width {feats.shape[1]} in {where} does not match {width}.")
        lengths = lengths_of(batch)
        q_lo, q_hi = np.minimum(q_lo, q.min(0)), np.maximum(q_hi, q.max(0))
        if lengths is not None:
            len_lo, len_hi = min(len_lo, float(lengths.min())), max(len_hi, float(lengths.max()))
        masks = kept_masks(ids)
        rows = np.arange(n, n + m, dtype=np.int64)
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
    q_hist = _Hist(_edges(float(qc.min()), float(qc.max()), log=False), False, n_sel=n_sel)
    log_len = length_col is not None and len_lo >= 1 and len_hi / max(len_lo, 1) > 20
    l_hist = (
        _Hist(_edges(len_lo, len_hi, log=log_len), log_len, n_sel=n_sel)
        if length_col is not None
        else None
    )

    # --- topics (fitted on the sample), near-duplicates (exact over each kept set) ----------
    gen = torch.Generator().manual_seed(seed)
    x_s = torch.from_numpy(samp["feats"])
    centroids = _topics(x_s, n_topics, gen)
    n_topics = centroids.shape[0]
    samp_topic = assign_clusters(x_s, centroids).numpy()
    dup_sample = redundancy(x_s, thresholds=thresholds, method="exact")
    dups, pair_rows = [], set()
    for s in range(n_sel):
        xk = torch.from_numpy(np.concatenate(kept_feats[s]))
        rk = np.concatenate(kept_rows[s])
        fig = redundancy(xk, thresholds=thresholds, method="exact", closest=n_examples)
        examples = [(int(rk[i]), int(rk[j]), sim) for i, j, sim in fig.pop("closest")]
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
    texts: dict[int, str] = {}
    cols2 = [id_col, *quality_cols, feature_col]
    if length_col is not None:
        cols2.append(length_col)
    if text_col is not None:
        cols2.append(text_col)
    row0 = 0
    cent = centroids
    for batch, where in batches(cols2, "report: pass 2/2"):
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
        lengths = lengths_of(batch)
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
                col = batch.column(text_col).take(pa.array(local))
                for r, t in zip(local, col.to_pylist(), strict=True):
                    texts[int(r + row0)] = _truncate(t or "")
        row0 += m
    if row0 != n:
        raise ValueError(f"{source} changed between the two passes ({n} rows, then {row0}).")

    # --- assemble --------------------------------------------------------------------------
    samp_q = combined(samp["q"])
    sample_texts = [texts.get(int(r), "") for r in samp["row"]]
    words = (
        _topic_words(sample_texts, samp_topic, n_topics)
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


def _is_text(path: Path, kind: str, column: str) -> bool:
    """Whether ``column`` of the first file holds strings (its length is then counted)."""
    schema = (
        pq.read_schema(path)
        if kind == "parquet"
        else pa.ipc.open_stream(pa.memory_map(str(path), "r")).schema
    )
    typ = schema.field(column).type
    return pa.types.is_string(typ) or pa.types.is_large_string(typ)


def _topics(x: torch.Tensor, n_topics: int, gen: torch.Generator, n_init: int = 5) -> torch.Tensor:
    """The best of ``n_init`` spherical k-means fits (highest total cosine to the centroids):
    one fit from random rows can merge two topics and split another."""
    fits = [spherical_kmeans(x, n_topics, n_iter=20, sample=None, generator=gen)]
    for _ in range(n_init - 1):
        fits.append(spherical_kmeans(x, n_topics, n_iter=20, sample=None, generator=gen))
    return max(fits, key=lambda cent: float((x @ cent.T).amax(1).sum()))


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


# --- figures ---------------------------------------------------------------------------------
def _png(fig: Any) -> str:
    plt = require_matplotlib()
    buf = io.BytesIO()
    fig.savefig(buf, format="png", dpi=72, bbox_inches="tight")
    plt.close(fig)
    return base64.b64encode(buf.getvalue()).decode("ascii")


def _fig_distributions(hist: _Hist, labels: Sequence[str], xlabel: str) -> str:
    plt = require_matplotlib()
    cols = len(labels)
    fig, axes = plt.subplots(1, cols, figsize=(3.4 * cols, 2.4), squeeze=False, sharey=True)
    widths = np.diff(hist.edges)
    centers = (
        np.sqrt(hist.edges[:-1] * hist.edges[1:]) if hist.log else hist.edges[:-1] + widths / 2
    )

    def density(c: np.ndarray) -> np.ndarray:
        total = c.sum()
        return c / total if total else c * 0.0

    for ax, label, kept in zip(axes[0], labels, hist.kept, strict=True):
        ax.step(centers, density(hist.all), where="mid", color="black", lw=1, label="all")
        ax.fill_between(
            centers, density(kept), step="mid", color=_color(label), alpha=0.5, label="kept"
        )
        ax.step(
            centers,
            density(hist.all - kept),
            where="mid",
            color="tab:blue",
            lw=1,
            ls="--",
            label="dropped",
        )
        if hist.log:
            ax.set_xscale("log")
        ax.set_title(label, fontsize=9)
        ax.set_xlabel(xlabel, fontsize=8)
        ax.tick_params(labelsize=7)
    axes[0][0].set_ylabel("share of documents", fontsize=8)
    axes[0][0].legend(fontsize=7, frameon=False)
    return _png(fig)


def _fig_map(data: dict[str, Any], labels: Sequence[str], n_topics: int, method: str) -> str:
    plt = require_matplotlib()
    xy, topic, kept = data["xy"], data["topic"], data["kept"]
    cols = len(labels) + 1
    fig, axes = plt.subplots(1, cols, figsize=(3.0 * cols, 3.0), squeeze=False)
    cmap = plt.get_cmap("tab20")
    ax = axes[0][0]
    ax.scatter(xy[:, 0], xy[:, 1], s=3, c=topic % 20, cmap=cmap, vmin=0, vmax=19, linewidths=0)
    for t in range(n_topics):
        pts = xy[topic == t]
        if len(pts):
            mx, my = np.median(pts, axis=0)
            ax.text(mx, my, str(t), fontsize=8, weight="bold", ha="center", va="center")
    ax.set_title("topics", fontsize=9)
    for s, label in enumerate(labels):
        ax = axes[0][s + 1]
        ax.scatter(xy[:, 0], xy[:, 1], s=3, c="#dddddd", linewidths=0)
        mk = kept[:, s]
        ax.scatter(xy[mk, 0], xy[mk, 1], s=5, c=_color(label), linewidths=0)
        ax.set_title(f"{label}: {int(mk.sum())} of {len(mk)} kept", fontsize=9)
    for a in axes[0]:
        a.set_xticks([])
        a.set_yticks([])
    fig.suptitle(f"{method.upper()} map of a seeded sample", fontsize=9, y=1.06)
    return _png(fig)


def _fig_topic_shares(report: dict[str, Any]) -> str:
    plt = require_matplotlib()
    topics = report["topics"]
    sels = report["selections"]
    t = np.arange(len(topics))
    width = 0.8 / len(sels)
    fig, ax = plt.subplots(figsize=(max(5.0, 0.55 * len(topics) * max(1, len(sels)) / 1.5), 2.6))
    for s, sel in enumerate(sels):
        share = [p["share"] or 0.0 for p in sel["topics"]]
        ax.bar(
            t + (s - (len(sels) - 1) / 2) * width,
            share,
            width,
            color=_color(sel["label"]),
            label=sel["label"],
        )
    overall = np.mean([sel["share"] for sel in sels])
    ax.axhline(overall, color="black", lw=0.8, ls=":", label="overall share")
    ax.set_xticks(t)
    ax.set_xticklabels([str(i) for i in t], fontsize=8)
    ax.set_xlabel("topic", fontsize=8)
    ax.set_ylabel("share kept", fontsize=8)
    ax.tick_params(labelsize=7)
    ax.legend(fontsize=7, frameon=False, ncol=len(sels) + 1)
    return _png(fig)


# --- the page --------------------------------------------------------------------------------
_PAGE = string.Template(
    """<!DOCTYPE html>
<html lang="en"><head><meta charset="utf-8">
<meta http-equiv="Content-Security-Policy" content="default-src 'none'; img-src data:; \
style-src 'unsafe-inline'">
<meta name="viewport" content="width=device-width, initial-scale=1">
<title>$title</title>
<style>
body{font:14px/1.45 system-ui,-apple-system,Segoe UI,sans-serif;margin:0 auto;max-width:1280px;
padding:0 20px 40px;color:#222}
h1{font-size:22px;margin:18px 0 4px}h2{font-size:18px;margin:28px 0 8px;border-bottom:1px solid
#ddd;padding-bottom:3px}h3{font-size:15px;margin:14px 0 6px}
table{border-collapse:collapse;font-size:13px;margin:6px 0}th,td{padding:3px 8px;border:1px solid
#e3e3e3;text-align:right;vertical-align:top}th{background:#f6f6f6}td.l,th.l{text-align:left}
.muted{color:#777}.bad{background:#fdecea}.doc{font-size:12px;white-space:pre-wrap;
background:#fafafa;border:1px solid #eee;padding:5px;margin:3px 0;overflow-wrap:anywhere}
.grid{display:grid;grid-template-columns:repeat($ncols,minmax(0,1fr));gap:10px}
img{max-width:100%}details{margin:4px 0}summary{cursor:pointer}
nav a{margin-right:12px}pre{font-size:12px;background:#fafafa;padding:6px;overflow:auto}
</style></head><body>
<h1>$title</h1>
<p class="muted">$subtitle</p>
<nav>$nav</nav>
$body
</body></html>
"""
)


def _e(value: Any) -> str:
    return html.escape(str(value), quote=True)


def _f(value: float | None, fmt: str = ".3f") -> str:
    return "&ndash;" if value is None else format(value, fmt)


def _section(sid: str, title: str, inner: str) -> str:
    return f'<section id="{sid}"><h2>{_e(title)}</h2>\n{inner}\n</section>'


def _img(b64: str, alt: str) -> str:
    return f'<img alt="{_e(alt)}" src="data:image/png;base64,{b64}">'


def render_html(report: dict[str, Any]) -> str:
    """The page of a :func:`build_report` result: one string, no external resource."""
    sels = report["selections"]
    labels = [s["label"] for s in sels]
    n = report["n_docs"]
    ql = report["quality_label"]

    # overview
    head = "".join(f"<th>{_e(lab)}</th>" for lab in labels)
    rows = [
        ("file", [f'<span class="muted">{_e(s["path"])}</span>' for s in sels]),
        ("documents kept", [f"{s['k']:,} of {n:,} ({100 * s['share']:.1f}%)" for s in sels]),
        (f"mean {ql} kept", [_f(s["quality_kept"]) for s in sels]),
        (f"mean {ql} dropped", [_f(s["quality_dropped"]) for s in sels]),
    ]
    if report["length_all"] is not None:
        rows += [
            (f"mean {report['length_label']} kept", [_f(s["length_kept"], ",.0f") for s in sels]),
            (
                f"mean {report['length_label']} dropped",
                [_f(s["length_dropped"], ",.0f") for s in sels],
            ),
        ]
    term_names = list(dict.fromkeys(k for s in sels for k in (s["terms"] or {})))
    for name in term_names:
        label = "objective J" if name == "J" else f"term {name}"
        rows.append((label, [_f((s["terms"] or {}).get(name), ".4f") for s in sels]))
    body_rows = "".join(
        f'<tr><th class="l">{_e(name)}</th>' + "".join(f"<td>{c}</td>" for c in cells) + "</tr>"
        for name, cells in rows
    )
    corpus_line = (
        f"<p>{n:,} documents; mean {_e(ql)} {_f(report['quality_all'])}"
        + (
            f", mean {_e(report['length_label'])} {_f(report['length_all'], ',.0f')}"
            if report["length_all"] is not None
            else ""
        )
        + ".</p>"
    )
    overview = (
        corpus_line
        + f'<table><tr><th class="l">selection</th>{head}</tr>{body_rows}</table>'
        + '<p class="muted">Terms are those the selection\'s summary recorded (none for a '
        "plain list of ids).</p>"
    )

    # topics
    n_topics = len(report["topics"])
    th = (
        '<tr><th rowspan="2">topic</th><th class="l" rowspan="2">most frequent words</th>'
        '<th rowspan="2">docs</th>'
        + "".join(f'<th colspan="4">{_e(lab)}</th>' for lab in labels)
        + "</tr><tr>"
        + "<th>kept</th><th>share</th><th>q kept</th><th>q dropped</th>" * len(sels)
        + "</tr>"
    )
    trs = []
    for t, topic in enumerate(report["topics"]):
        cells = [
            f"<td>{t}</td>",
            f'<td class="l">{_e(", ".join(topic["words"])) or "&ndash;"}</td>',
            f"<td>{topic['n']:,}</td>",
        ]
        for s in sels:
            p = s["topics"][t]
            low = p["share"] is not None and p["share"] < 0.25 * s["share"]
            cls = ' class="bad"' if low else ""
            cells += [
                f"<td>{p['kept']:,}</td>",
                f"<td{cls}>{_f(p['share'] and 100 * p['share'], '.1f')}%</td>",
                f"<td>{_f(p['q_kept'])}</td>",
                f"<td>{_f(p['q_dropped'])}</td>",
            ]
        trs.append("<tr>" + "".join(cells) + "</tr>")
    topics_html = (
        f"<p>{n_topics} topics: spherical k-means of the embeddings, fitted on the seeded "
        f"sample of {report['sample_size']:,} documents, every document assigned to its "
        f"nearest centroid. q is the mean {_e(ql)}. A share below a quarter of the "
        "selection's overall share is shaded.</p>"
        + _img(_fig_topic_shares(report), "share kept per topic")
        + f"<table>{th}{''.join(trs)}</table>"
    )

    # distributions
    dist = (
        "<h3>"
        + _e(ql)
        + "</h3>"
        + _img(_fig_distributions(report["_quality_hist"], labels, ql), f"{ql} distribution")
    )
    if report["_length_hist"] is not None:
        ll = report["length_label"]
        dist += (
            "<h3>"
            + _e(ll)
            + "</h3>"
            + _img(_fig_distributions(report["_length_hist"], labels, ll), f"{ll} distribution")
        )
    dist = (
        "<p>Share of documents per bin over the whole corpus (black), the kept (filled) and "
        "the dropped (dashed).</p>" + dist
    )

    # map
    map_html = _img(
        _fig_map(report["_map"], labels, n_topics, report["map_method"]), "map of a sample"
    ) + (
        f'<p class="muted">{len(report["_map"]["xy"]):,} documents of the seeded sample '
        f"(seed {report['seed']}); left: coloured by topic (numbers as in the table); then "
        "each selection's kept documents in colour.</p>"
    )

    # duplicates
    ts = report["thresholds"]
    th = (
        '<tr><th class="l">figure</th>'
        + "".join(f"<th>{_e(lab)}</th>" for lab in labels)
        + f"<th>corpus sample ({report['dup_sample']['n']:,})</th></tr>"
    )
    trs = []
    for t in ts:
        for key, name in (
            ("pairs", "pairs"),
            ("documents", "docs in pairs"),
            ("largest_group", "largest group"),
        ):
            cells = [f"<td>{s['duplicates']['thresholds'][t][key]:,}</td>" for s in sels]
            cells.append(f"<td>{report['dup_sample']['thresholds'][t][key]:,}</td>")
            trs.append(f'<tr><th class="l">{name} cos &gt; {_e(t)}</th>{"".join(cells)}</tr>')
    ex = []
    for s in sels:
        items = (
            "".join(
                f'<h3>cosine {e["cosine"]:.4f}</h3><div class="doc">{_e(e["a"])}</div>'
                f'<div class="doc">{_e(e["b"])}</div>'
                for e in s["examples"]
            )
            or f'<p class="muted">no kept pair above cosine {_e(ts[0])}.</p>'
        )
        ex.append(f"<div><h3>{_e(s['label'])}: closest kept pairs</h3>{items}</div>")
    dup_html = (
        "<p>The figures of <code>datamask evaluate</code>, exact over each selection's kept "
        "documents; the last column measures the seeded corpus sample for scale.</p>"
        f"<table>{th}{''.join(trs)}</table>" + f'<div class="grid">{"".join(ex)}</div>'
    )

    # samples
    if report["text_col"] is None:
        samples_html = '<p class="muted">The input has no text column.</p>'
    else:
        parts = []
        for t, topic in enumerate(report["topics"]):
            cols = []
            for s in sels:
                sm = s["samples"][t]
                kept = "".join(f'<div class="doc">{_e(x)}</div>' for x in sm["kept"]) or (
                    '<p class="muted">none kept in the sample</p>'
                )
                drop = "".join(f'<div class="doc">{_e(x)}</div>' for x in sm["dropped"]) or (
                    '<p class="muted">none dropped in the sample</p>'
                )
                cols.append(
                    f"<div><h3>{_e(s['label'])} kept</h3>{kept}"
                    f"<h3>{_e(s['label'])} dropped</h3>{drop}</div>"
                )
            words = ", ".join(topic["words"])
            parts.append(
                f"<details{' open' if t == 0 else ''}><summary>topic {t}: {_e(words)} "
                f'({topic["n"]:,} documents)</summary><div class="grid">{"".join(cols)}'
                "</div></details>"
            )
        samples_html = (
            f"<p>Documents of the seeded sample, truncated to {_TEXT_CHARS} characters.</p>"
            + "".join(parts)
        )

    # settings
    parts = []
    for s in sels:
        settings = s["settings"]
        text = json.dumps(settings, indent=1, sort_keys=True) if settings else "no summary"
        parts.append(
            f"<details><summary>{_e(s['label'])}: {_e(s['path'])}</summary>"
            f"<pre>{_e(text)}</pre></details>"
        )
    settings_html = "".join(parts)

    sections = {
        "overview": ("Overview", overview),
        "topics": ("Topics", topics_html),
        "distributions": ("Quality and length", dist),
        "map": ("Map", map_html),
        "duplicates": ("Near-duplicates", dup_html),
        "samples": ("Text samples", samples_html),
        "settings": ("Settings", settings_html),
    }
    nav = "".join(f'<a href="#{sid}">{_e(sections[sid][0])}</a>' for sid in REPORT_SECTIONS)
    body = "\n".join(_section(sid, *sections[sid]) for sid in REPORT_SECTIONS)
    return _PAGE.substitute(
        title=_e(f"datamask report: {', '.join(labels)}"),
        subtitle=_e(f"{report['source']}: {n:,} documents; seed {report['seed']}"),
        nav=nav,
        body=body,
        ncols=len(sels),
    )


def write_report(report: dict[str, Any], output: str | Path) -> Path:
    """Write the page to ``output/index.html`` (atomically) and return its path."""
    path = Path(output) / "index.html"
    path.parent.mkdir(parents=True, exist_ok=True)
    atomic_write_text(render_html(report), path)
    return path
