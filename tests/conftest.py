"""Shared fixtures: small corpora, the shared demo file when it is present, and files written
by :mod:`tests._data`."""

from __future__ import annotations

import os
from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from datamask import make_clustered
from datamask.data import Corpus
from tests._data import DEMO_ROWS, ROOT, SHARED_DEMO, SHIPPED_DEMO, write_reference_layout

# No test reaches the network for a dataset or a model: datasets and the Hub stay offline.
os.environ.setdefault("HF_DATASETS_OFFLINE", "1")
os.environ.setdefault("HF_HUB_OFFLINE", "1")


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


@pytest.fixture(scope="module")
def demo_table() -> pa.Table:
    """The first ``DEMO_ROWS`` shipped demo documents: chunk_id, text, quality_score,
    feature_arr (the ecosystem layouts of :func:`tests._data.preset_layouts` start here)."""
    if not SHIPPED_DEMO.exists():
        pytest.skip("examples/demo/demo_docs.parquet not present")
    columns = ["chunk_id", "text", "quality_score", "feature_arr"]
    return pq.read_table(SHIPPED_DEMO, columns=columns).slice(0, DEMO_ROWS)


@pytest.fixture(scope="session")
def local_pool():
    """A started ``LocalRunner(2)``: two forked workers, shared by the tests that run
    sharded selects on local files through it (``scheduler=`` / ``runner=``). The first
    pool of a test process waits for its forkserver to import torch and datamask (~3 s on
    2 cores; a spawned pool's two interpreters took 5-10 s), later pools start in ~0.15 s.
    Its workers keep the environment and module state of their start: a test that sets
    storage variables, patches a module or registers a term in this process starts its
    own pool."""
    from datamask.distributed import LocalRunner

    runner = LocalRunner(2)
    yield runner
    runner.close()


#: Fixtures that start something slow, and what: a test that uses one is marked ``slow``
#: at collection (:func:`pytest_collection_modifyitems`), so a test added later with them
#: leaves the fast loop (``python -m pytest -m "not slow"``) without being marked by hand.
SLOW_FIXTURES = {
    "ray_runner": "starts a local Ray",
    "s3": "starts a moto S3 server",
    "sentence_embeddings": "loads the MiniLM model",
    "local_pool": "starts a process pool",
}


#: The files that take longest, longest first, run before all others. pytest-xdist's
#: ``--dist loadfile`` keeps a file in one worker and hands files out in collection order
#: (pyproject's ``--no-loadscope-reorder``: its default orders them by test count, which
#: left the one-test Curator file to run alone at the end of the suite, 4 minutes).
LONG_FILES = (
    "tests/distributed/test_cluster_s3.py",
    "tests/cli/test_reliability.py",
    "tests/integrations/test_curator.py",
    "tests/distributed/test_distributed.py",
    "tests/io/test_storage_faults.py",
    "tests/distributed/test_kmeans.py",
)


def _run_order(item: pytest.Item) -> int:
    path = item.path.relative_to(ROOT).as_posix() if item.path.is_relative_to(ROOT) else ""
    return LONG_FILES.index(path) if path in LONG_FILES else len(LONG_FILES)


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    missing = [f for f in LONG_FILES if not (ROOT / f).is_file()]
    if missing:
        raise pytest.UsageError(f"tests/conftest.py LONG_FILES names missing files: {missing}")
    items.sort(key=_run_order)  # stable: each file's tests keep their order
    for item in items:
        used = SLOW_FIXTURES.keys() & set(getattr(item, "fixturenames", ()))
        if used:
            item.add_marker(pytest.mark.slow(reason=SLOW_FIXTURES[min(used)]))
