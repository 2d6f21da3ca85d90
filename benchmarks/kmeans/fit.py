"""The k-means fit of ``--partition cluster``: one step against the fit spread over steps.

    python benchmarks/scale/generate.py --out /tmp/kmeans-bench/1m128 --n-docs 1000000 \
        --dim 128 --n-shards 50
    python benchmarks/kmeans/fit.py --shards /tmp/kmeans-bench/1m128   # every (C, variant)
    python benchmarks/kmeans/fit.py --shards ... --one 1000 spread   # a single point

Every point is a fresh Python process (``ru_maxrss`` never goes down), which runs only
the fit (:func:`datamask.distributed.plan.plan.fit_cluster_tree`, what ``datamask select
--partition cluster`` runs before its spill) on a two-process
:class:`~datamask.distributed.LocalRunner`, so the steps run in workers and the driver
only plans and adds sums. Variants:

- ``one``: the fit as it was before the spread fit: a 100,000-row sample, one step.
- ``spread``: the sample sized from C (``--kmeans-sample`` left out: 100,000, or 64 rows
  per centroid when that is more) and fitted by steps of ``--step-rows`` rows; two
  levels above 1,000 clusters.
- ``spread-100k``: the same steps on the old 100,000-row sample (what the steps change,
  apart from the sample's size).

Reported per point: fit wall seconds, the driver's and the workers' CPU seconds, the
driver's peak RSS (``RUSAGE_SELF``, taken right after the fit) and the workers' largest
(``RUSAGE_CHILDREN``), the fit's facts, then the fit's quality over EVERY row of the
corpus: the mean cosine of each row to the centre of the leaf the tree files it under
(its k-means centroid, or its part where a cluster was split), the leaves, and the leaf
sizes' max / mean and coefficient of variation; and the seconds to file every row (what
the spill pays per row). Load averages before and after. Run it alone (``flock -x
/work/cpu.lock``): the machine has two cores. Rows append to ``--out``, by default
``results/<date>-<machine>-fit.jsonl`` (``benchmarks/_lib/ledger.py``), each with its commit.
"""

from __future__ import annotations

import argparse
import json
import os
import resource
import subprocess
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "_lib"))
from ledger import commit, result_path  # noqa: E402

CLUSTERS = (100, 1_000, 10_000)
VARIANTS = {
    "one": {"kmeans_sample": 100_000, "kmeans_step_rows": 10**9},
    "spread": {},
    "spread-100k": {"kmeans_sample": 100_000},
}
COLUMNS = dict(id_col="chunk_id", quality_cols=("quality_score",), feature_col="feature_arr")


def _cpu() -> tuple[float, float]:
    me = resource.getrusage(resource.RUSAGE_SELF)
    kids = resource.getrusage(resource.RUSAGE_CHILDREN)
    return me.ru_utime + me.ru_stime, kids.ru_utime + kids.ru_stime


def quality(tree, infos, feature_col: str) -> dict:
    """Mean cosine of every row to its leaf's centre, and the leaves' sizes."""
    import numpy as np
    import torch

    from datamask.io.parquet import features_from_arrow
    from datamask.io.shards import read_rows

    node_of = np.flatnonzero(tree.leaf >= 0)[np.argsort(tree.leaf[tree.leaf >= 0])]
    counts = np.zeros(tree.n_leaves, np.int64)
    total, n, started = 0.0, 0, time.perf_counter()
    for info in infos:
        table = read_rows(info.path, 0, info.num_rows, [feature_col])
        x = features_from_arrow(table.column(feature_col), info.path, feature_col)
        x = (x / np.linalg.norm(x, axis=1, keepdims=True)).astype(np.float32)
        leaf, _ = tree.assign(torch.from_numpy(x))
        counts += np.bincount(leaf, minlength=tree.n_leaves)
        total += float((x * tree.centre[node_of[leaf]]).sum(dtype=np.float64))
        n += len(x)
    used = counts[counts > 0]
    return {
        "mean_cosine": total / n,
        "leaves": int(tree.n_leaves),
        "leaves_with_rows": int(len(used)),
        "leaf_max_over_mean": float(used.max() / used.mean()),
        "leaf_cv": float(used.std() / used.mean()),
        "assign_s": time.perf_counter() - started,
        "rows": n,
    }


def one_point(shards: str, n_clusters: int, variant: str, chunk: int, step_rows: int) -> dict:
    from datamask.config import SelectSpec
    from datamask.distributed import LocalRunner
    from datamask.distributed.paths import WorkDir
    from datamask.distributed.plan.plan import fit_cluster_tree
    from datamask.distributed.plan.tree import ClusterTree
    from datamask.io.shards import inspect_shards, list_shards

    spec = dict(partition="cluster", n_clusters=n_clusters, chunk_size=chunk, **COLUMNS)
    spec.update(kmeans_step_rows=step_rows)
    spec.update(VARIANTS[variant])
    settings = SelectSpec.from_mapping(spec)
    infos = inspect_shards(list_shards(shards), columns=settings.read_columns)
    load0 = os.getloadavg()[0]
    with tempfile.TemporaryDirectory(dir="/tmp") as work:
        runner = LocalRunner(2)
        cpu0, wall0 = _cpu(), time.perf_counter()
        dirs = WorkDir.of(Path(work) / "out", work)
        facts = fit_cluster_tree(infos, settings, n_clusters, dirs, runner)
        runner.close()  # the workers are reaped: their CPU and peak are counted
        wall, cpu1 = time.perf_counter() - wall0, _cpu()
        driver_peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024
        workers_peak = resource.getrusage(resource.RUSAGE_CHILDREN).ru_maxrss / 1024
        tree = ClusterTree.load(dirs.tree())
    return {
        "n_clusters": n_clusters,
        "variant": variant,
        "chunk_size": chunk,
        "step_rows": step_rows,
        "fit_wall_s": wall,
        "driver_cpu_s": cpu1[0] - cpu0[0],
        "workers_cpu_s": cpu1[1] - cpu0[1],
        "driver_peak_mb": driver_peak,
        "workers_peak_mb": workers_peak,
        "facts": facts,
        **quality(tree, infos, settings.columns.feature_col),
        "load_before": load0,
        "load_after": os.getloadavg()[0],
    }


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--shards", help="folder of parquet shards (generate.py's layout)")
    p.add_argument("--out", help="jsonl to append (default: results/<date>-<machine>-fit.jsonl)")
    p.add_argument("--clusters", type=int, nargs="+", default=list(CLUSTERS), help="C values")
    p.add_argument("--variants", nargs="+", default=["one", "spread"], help=", ".join(VARIANTS))
    p.add_argument("--chunk-size", type=int, default=100_000, help="--chunk-size of the fit")
    p.add_argument("--step-rows", type=int, default=25_000, help="--kmeans-step-rows")
    p.add_argument("--one", nargs=2, metavar=("C", "VARIANT"), help="run one point, print it")
    args = p.parse_args()
    if args.one:
        row = one_point(args.shards, int(args.one[0]), args.one[1], args.chunk_size, args.step_rows)
        print(json.dumps(row))
        return
    for n_clusters in args.clusters:
        for variant in args.variants:
            cmd = [sys.executable, __file__, "--shards", args.shards, "--one", str(n_clusters)]
            cmd += [variant, "--chunk-size", str(args.chunk_size)]
            cmd += ["--step-rows", str(args.step_rows)]
            out = subprocess.run(cmd, check=True, capture_output=True, text=True).stdout
            row = {"commit": commit(), **json.loads(out.strip().splitlines()[-1])}
            print(json.dumps(row), flush=True)
            where = Path(
                args.out or result_path(Path(__file__).parent, "fit").with_suffix(".jsonl")
            )
            where.parent.mkdir(parents=True, exist_ok=True)
            with open(where, "a") as fh:
                fh.write(json.dumps(row) + "\n")


if __name__ == "__main__":
    main()
