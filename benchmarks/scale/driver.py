"""The allocation's driver at many groups: time and memory per group, in-process.

    python benchmarks/scale/driver.py --groups 1000 10000 100000

Every group proposes ``--candidates`` gains (a random non-increasing curve); the driver
gets their knots, as from the groups' completion markers, and reads a group's gains only
through the callback, as from its candidates file. Reported per group count: the
seconds of :func:`~datamask.distributed.combine.allocate.allocate_counts`, the gains it read,
and the peak of Python allocations during it (``tracemalloc``) besides the knots; then
the exchange round's other driver work, :func:`~datamask.distributed.combine.exchange.
exchange_neighbors` over the groups' centroids (``--dim``, drawn around ``sqrt(G)``
topics): its seconds and the peak RSS it added (``measure_peak_rss``: torch's memory
too); and every group's completion marker (stats, knots, centroid) parsed and held as
the driver holds them (``markers_held_mb``, the RSS it added). A run with the exchange
round allocates twice, so its driver's time per group is ``2 * ms_per_group +
neighbors_ms_per_group``.
"""

from __future__ import annotations

import argparse
import json
import time
import tracemalloc

import numpy as np

from datamask.distributed.combine.allocate import allocate_counts, compact_marker
from datamask.distributed.combine.exchange import exchange_neighbors
from datamask.distributed.combine.gains import gain_knots
from datamask.measure import measure_peak_rss, peak_rss_mb


def hold_markers(n_groups: int, knots: list, centroids: np.ndarray) -> dict:
    """Every group's completion marker, as ``select_group`` writes it (JSON: its stats,
    32 knots, its d-dim centroid), parsed and held the way the driver holds them
    (:func:`~datamask.distributed.combine.allocate.compact_marker`)."""
    base = {
        "label": "cluster 0",
        "n": 100_000,
        "k": 20_000,
        "seed": 1,
        "seconds": {"read": 1.0, "fit": 90.0, "write": 1.0, "total": 92.0},
        "docs_per_second": 1086.9,
        "peak_rss_mb": 1800.5,
        "gpu_peak_mb": None,
        "device": "cpu",
        "host": "node-0",
        "pid": 1234,
        "terms": {},
        "term_labels": ["quality", "facility"],
    }
    held = {}
    for g in range(n_groups):
        text = json.dumps(
            {
                **base,
                "gid": g,
                "gain_knots": [a.tolist() for a in knots[g]],
                "centroid": centroids[g].astype(np.float64).tolist(),
            }
        )
        held[g] = compact_marker(json.loads(text))
    return held


def measure(n_groups: int, candidates: int, dim: int = 384, seed: int = 0) -> dict:
    rng = np.random.default_rng(seed)
    scale = rng.random(n_groups)

    def curve(g: int) -> np.ndarray:  # regenerated on demand: the driver never holds them
        r = np.random.default_rng([seed, g])
        return np.sort(r.random(candidates))[::-1] * scale[g]

    knots = [gain_knots(curve(g)) for g in range(n_groups)]
    read_count = [0]

    def read(g: int, lo: int, hi: int) -> np.ndarray:
        read_count[0] += hi - lo
        return curve(g)[lo:hi]

    k = n_groups * candidates // 2
    tracemalloc.start()
    started = time.perf_counter()
    counts = allocate_counts(knots, [candidates] * n_groups, read, k)
    seconds = time.perf_counter() - started
    _, peak = tracemalloc.get_traced_memory()
    tracemalloc.stop()
    assert int(counts.sum()) == k
    topics = rng.standard_normal((max(1, int(n_groups**0.5)), dim)).astype(np.float32)
    centroids = topics[rng.integers(0, len(topics), n_groups)]
    centroids += 0.3 * rng.standard_normal(centroids.shape).astype(np.float32)
    held, marker_mem = measure_peak_rss(lambda: hold_markers(n_groups, knots, centroids))
    del held
    started = time.perf_counter()
    near, mem = measure_peak_rss(lambda: exchange_neighbors(centroids, 8))
    neighbors_s = time.perf_counter() - started
    return {
        "groups": n_groups,
        "candidates_per_group": candidates,
        "k": k,
        "seconds": seconds,
        "ms_per_group": 1e3 * seconds / n_groups,
        "gains_read": read_count[0],
        "gains_read_share": read_count[0] / (n_groups * candidates),
        "peak_alloc_mb": peak / 2**20,
        "knots_mb": sum(p.nbytes + v.nbytes for p, v in knots) / 2**20,
        "markers_held_mb": marker_mem["peak_mb"],
        "neighbors_s": neighbors_s,
        "neighbors_ms_per_group": 1e3 * neighbors_s / n_groups,
        "neighbors_peak_mb": mem["peak_mb"],
        "neighbors_listed": sum(map(len, near)),
        "dim": dim,
        # this whole process so far (it measured smaller G first): the knots, centroids
        # and markers above besides Python and torch, as a driver holds them
        "process_peak_mb": peak_rss_mb(),
    }


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--groups", type=int, nargs="+", default=[1000, 10_000, 100_000])
    ap.add_argument("--candidates", type=int, default=200)
    ap.add_argument("--dim", type=int, default=384)
    args = ap.parse_args()
    for n in args.groups:
        print(json.dumps(measure(n, args.candidates, args.dim)), flush=True)


if __name__ == "__main__":
    main()
