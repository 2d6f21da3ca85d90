"""Write a large clustered corpus as parquet shards, one shard at a time (memory-flat).

    python benchmarks/scale/generate.py --out /tmp/datamask-scale/1m --n-docs 1000000 \
        --dim 384 --n-shards 100

The structure follows :func:`datamask.make_clustered` (Zipf-sized clusters around random
unit centres, cluster-dependent quality with rare clusters scoring high), but every shard
draws its rows from its own generator, ``SeedSequence(seed).spawn(n_shards)``, so a shard
never needs the others in memory: 1M x 384 float32 is 1.5 GB on disk and about 15 MB per
shard in memory. Columns follow the reference layout: ``chunk_id`` (string),
``quality_score`` (float64), ``feature_arr`` (fixed-size list of float32), and ``n_chars``
(int64, a document length for token budgets: log-normal, median 900, mean about 1,350, close
to the real-text corpus' 1,443; drawn last, so the other columns are those of a corpus
generated without it). Keep the output under /tmp, never in the repository.
"""

from __future__ import annotations

import argparse
import os
import time
from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq


def cluster_model(dim: int, n_clusters: int, seed: int) -> tuple[np.ndarray, ...]:
    """Centres, cluster probabilities and mean quality per cluster, shared by all shards."""
    rng = np.random.default_rng(np.random.SeedSequence([seed, 0xC1]))
    centres = rng.standard_normal((n_clusters, dim))
    centres /= np.linalg.norm(centres, axis=1, keepdims=True)
    weights = 1.0 / np.arange(1, n_clusters + 1) ** 0.8
    quality = rng.beta(2.0, 2.0, size=n_clusters)
    quality[np.argsort(weights)[: n_clusters // 5]] += 0.3  # rare clusters score high
    return centres.astype(np.float32), weights / weights.sum(), quality


def write_shard(
    path: Path,
    first_id: int,
    n_rows: int,
    model: tuple[np.ndarray, ...],
    seed_seq: np.random.SeedSequence,
    spread: float = 0.6,
    row_group_size: int = 8192,
) -> None:
    centres, probs, cluster_quality = model
    rng = np.random.default_rng(seed_seq)
    dim = centres.shape[1]
    labels = rng.choice(len(centres), size=n_rows, p=probs)
    x = rng.standard_normal((n_rows, dim), dtype=np.float32)
    x *= spread / np.sqrt(dim)
    x += centres[labels]
    x /= np.linalg.norm(x, axis=1, keepdims=True)
    quality = cluster_quality[labels] + 0.15 * rng.standard_normal(n_rows)
    # Drawn after every other column: adding lengths changed none of them.
    n_chars = np.maximum(1, np.rint(rng.lognormal(np.log(900.0), 0.9, n_rows))).astype(np.int64)
    ids = pa.array([f"doc-{i:010d}" for i in range(first_id, first_id + n_rows)])
    table = pa.table(
        {
            "chunk_id": ids,
            "quality_score": pa.array(quality),
            "feature_arr": pa.FixedSizeListArray.from_arrays(pa.array(x.reshape(-1)), dim),
            "n_chars": pa.array(n_chars),
        }
    )
    tmp = path.with_name(f".{path.name}.tmp")
    pq.write_table(table, tmp, row_group_size=row_group_size, compression="zstd")
    os.replace(tmp, path)


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--out", required=True, help="output folder (under /tmp)")
    p.add_argument("--n-docs", type=int, default=1_000_000, help="documents (default 1M)")
    p.add_argument("--dim", type=int, default=384, help="embedding width (default 384)")
    p.add_argument("--n-shards", type=int, default=100, help="parquet files (default 100)")
    p.add_argument("--n-clusters", type=int, default=500, help="true clusters (default 500)")
    p.add_argument("--seed", type=int, default=0, help="random seed (default 0)")
    args = p.parse_args()

    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    model = cluster_model(args.dim, args.n_clusters, args.seed)
    seeds = np.random.SeedSequence(args.seed).spawn(args.n_shards)
    bounds = np.linspace(0, args.n_docs, args.n_shards + 1).astype(np.int64)
    started = time.perf_counter()
    for s in range(args.n_shards):
        path = out / f"part-{s:05d}.parquet"
        if path.exists():  # resumable: a shard is written atomically or not at all
            continue
        write_shard(path, int(bounds[s]), int(bounds[s + 1] - bounds[s]), model, seeds[s])
    size = sum(f.stat().st_size for f in out.glob("part-*.parquet"))
    print(
        f"{args.n_docs} docs x {args.dim} in {args.n_shards} shards at {out}: "
        f"{size / 2**30:.2f} GiB in {time.perf_counter() - started:.0f}s"
    )


if __name__ == "__main__":
    main()
