"""Why a dense group's ivf graph compares most of its pairs, and three ways around it.

    python benchmarks/archive/scale/dense_group_ivf.py --work /tmp/prof/j1m/_work --groups 9 1

Issue 43 (the 10M run's group steps are 87.5% dense groups' graphs). For a group of a
finished 1M run, with the graph's own ivf settings (sqrt(n) lists, probes 0.3 of them,
every row filed under its probes, a query compared with its home list's members):

- the share of the n^2 pairs compared (sum over lists of homes x members) and recall@K
  of 300 sampled rows against every pair, for the probes as chosen today, half of them,
  hubness-corrected probes (``x.c - alpha * mean over rows of x.c``), and the lists and
  probes of the rows centred on the group's mean;
- with ``--time``, :func:`~datamask.neighbors.knn_graph` ``ivf`` against ``exact``.

Numbers in the archive's README.
"""

from __future__ import annotations

import argparse
import math
import time
from pathlib import Path

import numpy as np
import pyarrow.parquet as pq
import torch

from datamask.neighbors import knn_graph, spherical_kmeans


def _group(work: Path, g: int, column: str) -> torch.Tensor:
    path = work / "clusters" / "groups" / f"group-{g:05d}.parquet"
    col = pq.read_table(path, columns=[column]).column(0).combine_chunks()
    x = np.frombuffer(col.buffers()[1], dtype=np.float32).reshape(len(col), -1).copy()
    return torch.nn.functional.normalize(torch.from_numpy(x), dim=1)


def _probe_share(x: torch.Tensor, space: torch.Tensor, probes: int, alpha: float, k: int):
    n = len(x)
    n_lists = int(math.sqrt(n))
    gen = torch.Generator().manual_seed(0)
    cent = spherical_kmeans(space, n_lists, n_iter=6, sample=min(n, 20 * n_lists + 10_000),
                            generator=gen)  # fmt: skip
    scores = space @ cent.T
    home = scores.argmax(1)
    probe = (scores - alpha * scores.mean(0)).topk(probes, dim=1).indices
    filed = torch.zeros(n, n_lists, dtype=torch.bool)
    filed.scatter_(1, probe, True)
    filed[torch.arange(n), home] = True  # a row is always filed under its home list
    homes, members = torch.bincount(home, minlength=n_lists), filed.sum(0)
    sample = torch.randperm(n, generator=torch.Generator().manual_seed(1))[:300]
    true = (x[sample] @ x.T).topk(k, dim=1).indices
    found = filed[true, home[sample][:, None].expand(-1, k)]
    return float((homes.double() * members.double()).sum() / n / n), float(found.float().mean())


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--work", required=True, help="a finished sharded run's WORK dir")
    parser.add_argument("--groups", type=int, nargs="+", default=[9, 1])
    parser.add_argument("--k", type=int, default=80, help="the graph's K at 1M (80)")
    parser.add_argument("--feature-col", default="feature_arr")
    parser.add_argument("--time", action="store_true", help="also time ivf and exact")
    args = parser.parse_args()
    torch.set_num_threads(2)
    for g in args.groups:
        x = _group(Path(args.work), g, args.feature_col)
        n_lists = int(math.sqrt(len(x)))
        probes = math.ceil(0.3 * n_lists)
        centred = torch.nn.functional.normalize(x - x.mean(0), dim=1)
        print(f"group {g}: {len(x)} rows, |mean| {float(x.mean(0).norm()):.3f}")
        for name, space, alpha in (("today", x, 0.0), ("hubness 0.5", x, 0.5),
                                   ("hubness 1", x, 1.0), ("centred", centred, 0.0)):  # fmt: skip
            for p in (probes, probes // 2):
                share, recall = _probe_share(x, space, p, alpha, args.k)
                print(
                    f"  {name:12s} probes {p:3d}: pairs {share:.3f}  recall@{args.k} {recall:.4f}"
                )
        if args.time:
            for method in ("ivf", "exact"):
                started = time.perf_counter()
                knn_graph(x, args.k, method=method)
                print(f"  knn_graph {method}: {time.perf_counter() - started:.1f} s")


if __name__ == "__main__":
    main()
