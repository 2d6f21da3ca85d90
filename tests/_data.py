"""Every parquet file the tests write, written here: small named writers and the repo's paths.

A test that needs data on disk calls one of these (or a conftest fixture that does), so a
layout is written in one place and a newcomer finds it here:

- :func:`reference_table` / :func:`write_reference_layout`: the reference's ``chunk_id,
  quality_score, feature_arr`` columns (fixed-size or variable-length embedding lists),
  optionally with extra columns (``text``, ``n_chars``);
- :func:`write_fineweb_layout` and :func:`preset_layouts`: the same documents under the
  names of the other ecosystems the presets know;
- :func:`write_shards`: a table cut into shard files of a folder; :func:`write_corpus`: a
  sharded corpus in nested folders with a text column (and its ``.jsonl.gz`` twin);
- :func:`write_columns`: a small file from its columns (a selection's ids, a bad layout for
  the error tests: a missing, ragged or null column);
- :func:`write_not_parquet`: bytes that are no parquet file at all;
- :func:`with_column`: a column added to a file on disk;
- :func:`write`: any other table, written the one way (parent folders made, path returned);
- :func:`kept_ids`: what ``select`` kept, read back from its output file.

The writers never change a value: what a test builds is what lands on disk.
"""

from __future__ import annotations

import gzip
import json
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq

from datamask import make_clustered
from datamask.data import Corpus

ROOT = Path(__file__).resolve().parents[1]
"""The repository root (``src/``, ``examples/``, ``benchmarks/`` sit here)."""
SRC = ROOT / "src"
SHIPPED_DEMO = ROOT / "examples" / "demo" / "demo_docs.parquet"
SHARED_DEMO = ROOT.parent / "shared" / "data" / "demo_docs.parquet"
DEMO_ROWS = 600
"""The rows of the shipped demo in conftest's ``demo_table``."""


def write(table: pa.Table, path: Path, **pq_kwargs: Any) -> Path:
    """Write ``table`` to ``path`` (parent folders made); ``pq_kwargs`` go to pyarrow."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    pq.write_table(table, path, **pq_kwargs)
    return path


def write_columns(path: Path, *, metadata: dict | None = None, **columns: Any) -> Path:
    """A file holding ``columns`` as given (lists or arrow arrays): a selection's ids, or a
    layout the error tests need (a missing, ragged, null or mistyped column)."""
    return write(pa.table(columns, metadata=metadata), path)


def reference_table(
    ids: Any, quality: Any, features: np.ndarray, *, fixed: bool = True, **extra: Any
) -> pa.Table:
    """The reference's ``chunk_id, quality_score, feature_arr`` columns, then ``extra``.

    ``features`` keep their dtype; ``fixed`` makes the embedding a fixed-size list (else a
    variable-length list of the same values).
    """
    feats = np.asarray(features)
    values = pa.array(feats.reshape(-1))
    col = (
        pa.FixedSizeListArray.from_arrays(values, feats.shape[1])
        if fixed
        else pa.ListArray.from_arrays(
            pa.array(np.arange(0, feats.size + 1, feats.shape[1], dtype=np.int32)), values
        )
    )
    ids = ids if isinstance(ids, pa.Array | pa.ChunkedArray) else pa.array(ids)
    return pa.table(
        {"chunk_id": ids, "quality_score": pa.array(quality), "feature_arr": col, **extra}
    )


def write_reference_layout(
    path: Path, corpus: Corpus, *, fixed: bool = True, **pq_kwargs: Any
) -> Path:
    """Write ``corpus`` as the reference's ``chunk_id, quality_score, feature_arr`` parquet
    (float32 embeddings, its first quality column)."""
    feats = np.asarray(corpus.features, dtype=np.float32)
    table = reference_table(list(corpus.ids), corpus.quality[:, 0], feats, fixed=fixed)
    return write(table, path, **pq_kwargs)


def write_fineweb_layout(path: Path, corpus: Corpus) -> Path:
    """``corpus`` under FineWeb-Edu's names (``id``, ``score``, ``embedding``: plain lists)."""
    feats = np.asarray(corpus.features, dtype=np.float32)
    table = pa.table(
        {
            "id": pa.array([f"doc-{i}" for i in corpus.ids]),
            "score": pa.array(corpus.quality[:, 0]),
            "embedding": pa.array(list(feats), type=pa.list_(pa.float32())),
        }
    )
    return write(table, path)


def preset_layouts(demo: pa.Table) -> dict[str, pa.Table]:
    """The same documents (``chunk_id, text, quality_score, feature_arr``) in the three
    layouts the presets name: datamask's, FineWeb-Edu's and NeMo Curator's."""
    ids, q, emb = demo["chunk_id"], demo["quality_score"], demo["feature_arr"]
    # fineweb-edu's embeddings are plain lists; curator's are lists too (cudf writes them so)
    as_list = emb.cast(pa.list_(pa.float32()))
    return {
        "datamask": pa.table({"chunk_id": ids, "quality_score": q, "feature_arr": emb}),
        "fineweb-edu": pa.table(
            {
                "text": demo["text"],
                "id": ids,
                "score": q,
                "int_score": pa.array(np.round(q.to_numpy() * 5).astype(np.int64)),
                "embedding": as_list,
            }
        ),
        "curator": pa.table(
            {"id": ids, "text": demo["text"], "fineweb-edu-score": q, "embeddings": as_list}
        ),
    }


def write_shards(
    table: pa.Table,
    folder: Path,
    rows: int | Sequence[int | None],
    *,
    names: Sequence[str] | None = None,
    **pq_kwargs: Any,
) -> list[Path]:
    """Cut ``table`` into consecutive shards of ``folder``: ``rows`` rows each (an int), or
    the sizes given (``None``: the rest). Files are ``part-{s}.parquet`` unless ``names``."""
    sizes = [rows] * -(-table.num_rows // rows) if isinstance(rows, int) else list(rows)
    names = list(names) if names is not None else [f"part-{s}.parquet" for s in range(len(sizes))]
    paths, start = [], 0
    for size, name in zip(sizes, names, strict=True):
        piece = table.slice(start) if size is None else table.slice(start, size)
        paths.append(write(piece, Path(folder) / name, **pq_kwargs))
        start += piece.num_rows
    return paths


def write_corpus_shards(
    folder: Path, corpus: Corpus, n_shards: int, **pq_kwargs: Any
) -> list[Path]:
    """``corpus`` in the reference layout (float32 embeddings, its first quality column)
    cut into ``n_shards`` near-equal consecutive shards ``part-00000.parquet``, ..."""
    feats = np.asarray(corpus.features, dtype=np.float32)
    table = reference_table(list(corpus.ids), corpus.quality[:, 0], feats)
    sizes = np.diff(np.linspace(0, corpus.n_docs, n_shards + 1).astype(int)).tolist()
    names = [f"part-{s:05d}.parquet" for s in range(n_shards)]
    return write_shards(table, folder, sizes, names=names, **pq_kwargs)


N_SHARDS, ROWS, DIM = 3, 200, 8
"""The shape of :func:`write_corpus`'s corpus."""


def write_corpus(root: Path, *, jsonl: bool = False) -> list[Path]:
    """Three parquet shards of 200 rows with an extra text column, in nested folders
    (``a/part-0``, ``a/part-1``, ``b/part-2``; 64-row groups), and with ``jsonl`` the same
    rows as ``raw-{s}.jsonl.gz`` beside ``root``."""
    corpus = make_clustered(N_SHARDS * ROWS, DIM, 6, seed=1)
    feats = np.asarray(corpus.features, np.float32)
    root.mkdir(parents=True, exist_ok=True)
    files = []
    for s in range(N_SHARDS):
        rows = slice(s * ROWS, (s + 1) * ROWS)
        ids = [str(i) for i in corpus.ids[rows]]
        table = reference_table(
            ids, corpus.quality[rows, 0], feats[rows], text=pa.array([f"text of {i}" for i in ids])
        )
        sub = root / ("a" if s < 2 else "b")  # nested folders keep their relative names
        path = write(table, sub / f"part-{s}.parquet", row_group_size=64)
        files.append(path)
        if jsonl:
            with gzip.open(root.parent / f"raw-{s}.jsonl.gz", "wt") as fh:
                for i in ids:
                    fh.write(json.dumps({"chunk_id": i, "text": f"text of {i}"}) + "\n")
    return files


def with_column(path: Path, name: str, values: Any) -> Path:
    """Add the column ``name`` holding ``values`` to the parquet file at ``path``."""
    return write(pq.read_table(path).append_column(name, pa.array(values)), path)


def write_not_parquet(path: Path, data: bytes = b"not parquet") -> Path:
    """A file named like parquet whose bytes are not (a truncated or foreign file)."""
    path = Path(path)
    path.write_bytes(data)
    return path


def kept_ids(path: Path, id_col: str) -> list[str]:
    """The sorted ids ``select`` flagged ``selected`` in its output file at ``path``."""
    table = pq.read_table(path)
    return sorted(table.filter(table["selected"])[id_col].to_pylist())
