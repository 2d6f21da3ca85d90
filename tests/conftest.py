"""Shared fixtures: small corpora and the shared demo file when it is present."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from datamask import make_clustered
from datamask.data import Corpus

SHARED_DEMO = Path(__file__).resolve().parents[2] / "shared" / "data" / "demo_docs.parquet"
SHIPPED_DEMO = Path(__file__).resolve().parents[1] / "examples" / "demo" / "demo_docs.parquet"


@pytest.fixture
def small_corpus() -> Corpus:
    return make_clustered(400, 16, 8, seed=3)


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


@pytest.fixture
def write_reference():
    """The :func:`write_reference_layout` helper, for tests that write their own files."""
    return write_reference_layout


@pytest.fixture
def reference_parquet(tmp_path: Path, small_corpus: Corpus) -> Path:
    return write_reference_layout(tmp_path / "docs.parquet", small_corpus)


@pytest.fixture
def demo_corpus() -> Corpus:
    """The shipped demo corpus (or the shared one beside the checkout), read as a Corpus."""
    from datamask.columns import Columns
    from datamask.io.parquet import read_corpus

    if SHIPPED_DEMO.exists():
        return read_corpus(SHIPPED_DEMO)
    if SHARED_DEMO.exists():
        return read_corpus(SHARED_DEMO, Columns(id_col="id", feature_col="embedding"))
    pytest.skip("no demo parquet found")
