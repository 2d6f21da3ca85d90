"""One ``datamask report`` run: its context (:class:`ReportRun`) and its two streaming
passes over the input, the phases :func:`~datamask.evaluation.browse.build_report` runs
between opening the input and assembling the page's figures.

:func:`first_pass` reads quality and length ranges, a seeded sample (chosen by a hash of
the id and the seed, so the same seed gives the same page whatever the batch size or the
order of the files) and each selection's kept embeddings; :func:`topics_and_duplicates`
fits the topics on the sample and computes the near-duplicate figures over each kept set;
:func:`second_pass` counts per topic, fills the histograms and reads the texts shown.
"""

from __future__ import annotations

from collections.abc import Iterator, Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np
import pyarrow as pa
import torch
from tqdm.auto import tqdm

from ..columns import Columns
from ..io.datasets import input_batches
from ..io.parquet import features_from_arrow
from ..io.shards import hash_ids
from ..io.text import lengths_from_arrow, text_array
from ..neighbors import assign_clusters
from .histogram import Histogram, bin_edges
from .page import TEXT_CHARS
from .redundancy import redundancy
from .report_spec import ReportSpec
from .topics import fit_topics

__all__ = ["ReportRun", "first_pass", "second_pass", "topics_and_duplicates"]


def _sample_keys(ids: pa.Array, seed: int) -> np.ndarray:
    """A seeded pseudo-random 64-bit key per id: the sample is the ``size`` smallest keys."""
    h = hash_ids(ids) + np.uint64(seed & 0xFFFFFFFF)
    return hash_ids(pa.array(h.view(np.int64)))


def _truncate(text: str, n: int = TEXT_CHARS) -> str:
    text = " ".join(text.split())
    return text if len(text) <= n else text[: n - 1] + "\u2026"


@dataclass
class ReportRun:
    """One report's state, as its phases fill it: the input and its resolved columns
    (``_open``), the selections and the cover pairs shown (``_load_selections``), then
    :func:`first_pass` (``n``, the quality and length ranges, the sample ``samp``, each
    selection's ``kept`` embeddings and rows), :func:`topics_and_duplicates` (``topics``;
    ``kept`` freed) and :func:`second_pass` (``per_topic`` counts and sums, the histograms,
    the ``texts`` shown)."""

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
    len_range: tuple[float, float] = (np.inf, -np.inf)
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


def first_pass(run: ReportRun) -> None:
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
    run.kept = {"feats": kept_feats, "rows": kept_rows}
    run.len_range = (len_lo, len_hi)


def _check_found(run: ReportRun, found: list[int]) -> None:
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


def topics_and_duplicates(run: ReportRun) -> None:
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
    run.kept = {}  # the kept embeddings: freed
    run.topics = {
        "centroids": centroids,
        "n": centroids.shape[0],  # fewer than asked for on a small sample
        "samp_topic": samp_topic,
        "dup_sample": dup_sample,
        "dups": dups,
        "pair_rows": pair_rows,
    }


def _histograms(run: ReportRun) -> tuple[Histogram, Histogram | None]:
    """The quality and length histograms' bins, from pass 1's ranges."""
    n_sel = len(run.sels)
    qc = run.combined(np.stack([run.q_lo, run.q_hi]))
    q_hist = Histogram(bin_edges(float(qc.min()), float(qc.max()), log=False), False, n_sel=n_sel)
    if run.length_col is None:
        return q_hist, None
    len_lo, len_hi = run.len_range
    log_len = len_lo >= 1 and len_hi / max(len_lo, 1) > 20
    return q_hist, Histogram(bin_edges(len_lo, len_hi, log=log_len), log_len, n_sel=n_sel)


def second_pass(run: ReportRun) -> None:
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


def _rows_shown(run: ReportRun) -> np.ndarray:
    """The rows whose texts the page shows: the sample, the closest pairs, the covers
    (each cover pair's rows kept as ``run.pairs["row"]``, in the covers' order)."""
    pair_rows = run.topics["pair_rows"]
    want = np.union1d(run.samp["row"], np.fromiter(pair_rows, np.int64, len(pair_rows)))
    pairs = run.pairs
    pair_row = pairs["unique_row"][pairs["of"]] if pairs else np.zeros(0, np.int64)
    run.pairs["row"] = pair_row
    return np.union1d(want, pair_row[pair_row >= 0])


def _read_texts(
    run: ReportRun, batch: pa.RecordBatch, where: str, file_row: int, want: np.ndarray, row0: int
) -> None:
    """The texts of the wanted rows in this batch (``want``: sorted, from ``row0`` on)."""
    local = want[: np.searchsorted(want, row0 + batch.num_rows)] - row0
    if len(local):
        col = text_array(batch.column(run.text_col), run.text_col, where, file_row)
        col = col.take(pa.array(local))
        for r, t in zip(local, col.to_pylist(), strict=True):
            run.texts[int(r + row0)] = _truncate(t or "")


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
