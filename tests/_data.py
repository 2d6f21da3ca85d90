"""Every parquet layout the tests write, once: small named writers and the repo's paths.

A test that needs a file on disk calls one of these (or a conftest fixture that does), so
that a layout (the reference's columns, shards of a corpus, a bad file for the error tests)
is written in one place and a newcomer finds it here.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq

from datamask.data import Corpus

ROOT = Path(__file__).resolve().parents[1]
"""The repository root (``src/``, ``examples/``, ``benchmarks/`` sit here)."""
SRC = ROOT / "src"
SHIPPED_DEMO = ROOT / "examples" / "demo" / "demo_docs.parquet"
SHARED_DEMO = ROOT.parent / "shared" / "data" / "demo_docs.parquet"


def write_reference_layout(path: Path, corpus: Corpus, *, fixed: bool = True) -> Path:
    """Write ``corpus`` as the reference's ``chunk_id, quality_score, feature_arr`` parquet."""
    feats = np.asarray(corpus.features, dtype=np.float32)
    values = pa.array(feats.reshape(-1))
    col = (
        pa.FixedSizeListArray.from_arrays(values, feats.shape[1])
        if fixed
        else pa.ListArray.from_arrays(
            pa.array(np.arange(0, feats.size + 1, feats.shape[1], dtype=np.int32)), values
        )
    )
    table = pa.table(
        {
            "chunk_id": pa.array(list(corpus.ids)),
            "quality_score": pa.array(corpus.quality[:, 0]),
            "feature_arr": col,
        }
    )
    pq.write_table(table, path)
    return path
