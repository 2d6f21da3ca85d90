"""An exact cover search pruned by the triangle inequality on angles, against the ivf.

    python benchmarks/archive/covered/bounded.py --work /tmp/prof/j1m/_work --groups 0 5

Issue 43's exchange + cover share (17.3% at 1M): could the cover's search against the
neighbours' kept rows be exact and cheaper than the ivf probing 0.1 of its lists? For one
group of a finished 1M run (its rows, its own kept rows, the kept rows of the 4 groups
its cover step compared it with), on one thread:

- the exact best cosine of every row against its own kept rows (``own``) and the
  neighbours' kept rows (every pair);
- :func:`~datamask.neighbors.best_match` with ``method="ivf"``, ``probe_fraction=0.1``
  (the cover step's search);
- the bounded search: the neighbours' kept rows in ``f * sqrt(n)`` k-means lists, each
  list's angular radius ``r`` (the largest angle of a member from its centroid); a row
  compares with a list's members only when ``cos(max(0, angle(row, centroid) - r))``
  exceeds its best so far (its own kept rows' best first): exact, since no member of a
  list lies nearer than that bound.

Numbers in ``README.md`` of this folder (the archive's table). A prototype: lists are
processed in the order of their mean bound, gathering the rows each needs.
"""

from __future__ import annotations

import argparse
import json
import math
import time
from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import torch

from datamask.io.parquet import features_matrix
from datamask.neighbors import assign_clusters, best_match, spherical_kmeans


def _unit(path: Path, column: str) -> torch.Tensor:
    col = pq.read_table(path, columns=[column]).column(0).combine_chunks()
    if pa.types.is_fixed_size_binary(col.type):  # a spill's float32 rows as bytes
        x = np.frombuffer(col.buffers()[1], dtype=np.float32).reshape(len(col), -1).copy()
    else:
        x = features_matrix(col).copy()
    return torch.nn.functional.normalize(torch.from_numpy(x), dim=1)


def _best(q: torch.Tensor, base: torch.Tensor) -> torch.Tensor:
    return torch.cat([(q[i : i + 8192] @ base.T).amax(1) for i in range(0, len(q), 8192)])


def bounded(q: torch.Tensor, base: torch.Tensor, lower: torch.Tensor, factor: int) -> dict:
    n, nb = len(q), len(base)
    n_lists = max(1, factor * int(math.sqrt(nb)))
    started = time.perf_counter()
    gen = torch.Generator().manual_seed(0)
    cent = spherical_kmeans(base, n_lists, n_iter=6, sample=min(nb, 20 * n_lists + 10_000),
                            generator=gen)  # fmt: skip
    home = assign_clusters(base, cent).reshape(-1)
    order = torch.argsort(home, stable=True)
    members = base[order]
    bounds = torch.searchsorted(home[order], torch.arange(n_lists + 1))
    cos_r = torch.ones(n_lists).scatter_reduce(0, home, (base * cent[home]).sum(1), "amin")
    radius = torch.arccos(cos_r.clamp(-1, 1)) + 1e-4  # a margin for rounding
    fitted = time.perf_counter()
    upper = torch.cos((torch.arccos((q @ cent.T).clamp(-1, 1)) - radius).clamp_min(0))
    bounded_at = time.perf_counter()
    best, pairs = lower.clone(), 0
    for c in torch.argsort(upper.mean(0), descending=True).tolist():
        lo, hi = int(bounds[c]), int(bounds[c + 1])
        if hi == lo:
            continue
        rows = torch.nonzero(upper[:, c] > best).reshape(-1)
        if len(rows):
            best[rows] = torch.maximum(best[rows], (q[rows] @ members[lo:hi].T).amax(1))
            pairs += len(rows) * (hi - lo)
    done = time.perf_counter()
    return {"lists": n_lists, "kmeans_s": fitted - started, "bounds_s": bounded_at - fitted,
            "search_s": done - bounded_at, "seconds": done - started,
            "pair_share": pairs / (n * nb), "best": best}  # fmt: skip


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--work", required=True, help="a finished sharded run's WORK dir")
    parser.add_argument("--groups", type=int, nargs="+", default=[0])
    parser.add_argument("--factors", type=int, nargs="+", default=[2, 4, 8])
    parser.add_argument("--feature-col", default="feature_arr")
    args = parser.parse_args()
    torch.set_num_threads(1)
    work = Path(args.work)
    for g in args.groups:
        marker = json.loads((work / "cover" / f"{g:05d}.json").read_text())
        x = _unit(work / "clusters" / "groups" / f"group-{g:05d}.parquet", args.feature_col)
        own = _unit(work / "cover" / f"kept-{g:05d}.parquet", "features")
        near = torch.cat([_unit(work / "cover" / f"kept-{h:05d}.parquet", "features")
                          for h in marker["neighbors"]])  # fmt: skip
        own_best, exact = _best(x, own), _best(x, near)
        started = time.perf_counter()
        sims, _, _ = best_match(x, near, method="ivf", probe_fraction=0.1)
        ivf_s = time.perf_counter() - started
        missed = int(((sims < exact - 1e-6) & (exact > own_best)).sum())
        print(json.dumps({"group": g, "rows": len(x), "kept_own": len(own),
                          "kept_neighbours": len(near), "ivf_seconds": ivf_s,
                          "ivf_rows_cover_low": missed}))  # fmt: skip
        for f in args.factors:
            out = bounded(x, near, own_best, f)
            best = out.pop("best")
            ok = torch.where(exact > own_best, (best - exact).abs() < 1e-5, best >= own_best)
            print(
                json.dumps(
                    {"group": g, "factor": f, **out, "exact_share": float(ok.float().mean())}
                )
            )


if __name__ == "__main__":
    main()
