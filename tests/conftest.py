"""Shared fixtures: small corpora, the shared demo file when it is present, and files written
by :mod:`tests._data`."""

from __future__ import annotations

from pathlib import Path

import pytest

from datamask import make_clustered
from datamask.data import Corpus
from tests._data import SHARED_DEMO, SHIPPED_DEMO, write_reference_layout


@pytest.fixture
def small_corpus() -> Corpus:
    return make_clustered(400, 16, 8, seed=3)


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
