"""The driver's memory per group (issue 30, "a flat driver": at most 3 KB per group above
a fixed base). Real shards, a real two-process pool, the whole run; the driver's Python
heap (numpy included) measured by tracemalloc at its peak, as G grows tenfold at the same
rows. RSS is measured by ``benchmarks/driver/sweep.py``."""

from __future__ import annotations

import tracemalloc

import pytest

from datamask import make_clustered
from datamask.config import SelectSpec
from datamask.distributed import LocalRunner, run_selection
from tests._data import write_corpus_shards


def _peak(shards, out, runner, chunk_size):
    settings = SelectSpec.from_mapping(
        dict(
            method="random",
            select_ratio=0.1,
            partition="chunk",
            chunk_size=chunk_size,
            budget="group",
            selected_only=True,
            seed=0,
        )
    )
    tracemalloc.start()
    try:
        manifest = run_selection(shards, out, settings, runner=runner, progress=False)
        _, peak = tracemalloc.get_traced_memory()
    finally:
        tracemalloc.stop()
    return manifest["totals"]["n_groups"], peak


@pytest.mark.slow
def test_the_driver_holds_at_most_3_kb_per_group(tmp_path):
    write_corpus_shards(tmp_path / "in", make_clustered(6000, 8, 5, seed=0), 4)
    runner = LocalRunner(workers=2)
    try:
        # pool, lazy imports, and the interpreter's table of interned strings: pathlib
        # interns every file name it parses ("part-00123.json"), and that table's one-off
        # doubling (3.7 MB here) would be charged to whichever run first names G files
        _peak(tmp_path / "in", tmp_path / "warm", runner, 15)
        g_small, small = _peak(tmp_path / "in", tmp_path / "small", runner, 150)
        g_large, large = _peak(tmp_path / "in", tmp_path / "large", runner, 15)
    finally:
        runner.close()
    assert (g_small, g_large) == (40, 400)
    per_group = (large - small) / (g_large - g_small)
    assert per_group <= 3 * 1024, f"{per_group:.0f} bytes per group"
