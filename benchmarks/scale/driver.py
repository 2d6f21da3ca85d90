"""The allocation's driver at many groups: time and memory per group, in-process.

    python benchmarks/scale/driver.py --groups 1000 10000 100000

Every group proposes ``--candidates`` gains (a random non-increasing curve); the driver
gets their knots, as from the groups' completion markers, and reads a group's gains only
through the callback, as from its candidates file. Reported per group count: the
seconds of :func:`~datamask.distributed.allocate.allocate_counts`, the gains it read,
and the peak of Python allocations during it (``tracemalloc``) besides the knots.
"""

from __future__ import annotations

import argparse
import json
import time
import tracemalloc

import numpy as np

from datamask.distributed.allocate import allocate_counts, gain_knots


def measure(n_groups: int, candidates: int, seed: int = 0) -> dict:
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
    }


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--groups", type=int, nargs="+", default=[1000, 10_000, 100_000])
    ap.add_argument("--candidates", type=int, default=200)
    args = ap.parse_args()
    for n in args.groups:
        print(json.dumps(measure(n, args.candidates)), flush=True)


if __name__ == "__main__":
    main()
