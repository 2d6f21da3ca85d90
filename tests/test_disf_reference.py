"""The original DiSF loop's timer of the headline benchmark
(``benchmarks/headline/disf_reference.py``) on a tiny corpus: it times the first full batches
and extrapolates to every batch, with the public API only."""

from __future__ import annotations

import importlib
import sys
from pathlib import Path

import pytest

from datamask import make_clustered

FOLDER = Path(__file__).resolve().parents[1] / "benchmarks" / "headline"


@pytest.fixture(scope="module")
def disf_reference():
    """The module, imported as ``python benchmarks/headline/run.py`` imports it (its folder
    first on sys.path)."""
    sys.path.insert(0, str(FOLDER))
    try:
        return importlib.import_module("disf_reference")
    finally:
        sys.path.remove(str(FOLDER))


def test_time_reference_times_the_first_batches_and_extrapolates(disf_reference):
    corpus = make_clustered(80, 4, 2, seed=0)
    est = disf_reference.time_reference(corpus, select_ratio=0.25, batch_size=32)
    assert est["n_batches"] == 3 and est["n_batches_timed"] == 1
    assert est["seconds_estimated"] == pytest.approx(3 * est["seconds_per_batch"])


def test_run_reference_is_a_bench_row(disf_reference):
    corpus = make_clustered(64, 4, 2, seed=0)
    params = {"select_ratio": 0.25, "batch_size": 32, "n_batches": 5}
    row = disf_reference.run_reference(corpus, params, threads=1)
    assert row["label"] == "disf-greedy (original loop)"
    assert row["estimate"]["n_batches_timed"] == 2  # no more full batches than there are
    assert row["seconds"] == row["estimate"]["seconds_estimated"] > 0
    assert row["cpu_seconds"] >= 0 and row["params"] == params
