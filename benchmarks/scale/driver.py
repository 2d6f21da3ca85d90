"""The allocation's driver at many groups: time and memory per group, in-process.

    python benchmarks/scale/driver.py --groups 1000 10000 100000

Every group proposes ``--candidates`` gains (a random non-increasing curve); the driver
gets their knots, as from the groups' completion markers, and reads a group's gains only
through the callback, as from its candidates file. Reported per group count: the
seconds of :func:`~datamask.distributed.allocate.allocate_counts`, the gains it read,
and the peak of Python allocations during it (``tracemalloc``) besides the knots; then
the exchange round's other driver work, :func:`~datamask.distributed.exchange.
exchange_neighbors` over the groups' centroids (``--dim``, drawn around ``sqrt(G)``
topics): its seconds and the peak RSS it added (``measure_peak_rss``: torch's memory
too). A run with the exchange round allocates twice, so its driver's time per group is
``2 * ms_per_group + neighbors_ms_per_group``.
"""

from __future__ import annotations

import argparse
import json
import time
import tracemalloc

import numpy as np

from datamask._memory import measure_peak_rss
from datamask.distributed.allocate import allocate_counts, gain_knots
from datamask.distributed.exchange import exchange_neighbors


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
        "neighbors_s": neighbors_s,
        "neighbors_ms_per_group": 1e3 * neighbors_s / n_groups,
        "neighbors_peak_mb": mem["peak_mb"],
        "neighbors_listed": sum(map(len, near)),
        "dim": dim,
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
