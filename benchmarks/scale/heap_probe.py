"""Replay select steps of a finished sharded run in one process and sample its RSS.

    python benchmarks/scale/heap_probe.py --run /tmp/dm/run-1m-exchange --gids 7 13
    MALLOC_MMAP_THRESHOLD_=4194304 python benchmarks/scale/heap_probe.py ... --no-bound

A worker of a sharded run runs one group after another. This replays groups (whole
clusters of a ``--partition cluster`` run: label ``cluster C``) in that order, with the
run's settings, seeds and quality range, as ``select_group`` runs them (``fit_group``
with the gain curve), samples the process' RSS every 0.25 s and prints one JSON line:
the peak, when it happened, and each step's start, end and seconds. ``--no-bound`` skips
``datamask._memory.bound_heap`` (to see glibc's default, or a ``MALLOC_*`` setting).
"""

from __future__ import annotations

import argparse
import glob
import json
import sys
import threading
import time
from pathlib import Path

import numpy as np
import pyarrow.parquet as pq
import torch

import datamask.pipeline.step as step
from datamask._memory import rss_mb
from datamask.config import SelectSpec
from datamask.data import Corpus
from datamask.distributed.allocate import group_spec


def load_cluster(work: Path, cluster: int, quality_range: tuple[float, float]) -> Corpus:
    """Cluster ``cluster``'s rows from every shard's spill (one run of rows per cluster)."""
    feats, qual, ids = [], [], []
    for marker in sorted(glob.glob(str(work / "clusters" / "shard-*.json"))):
        counts = json.loads(Path(marker).read_text())["counts"]
        lo, n = sum(counts[:cluster]), counts[cluster]
        if n == 0:
            continue
        t = pq.read_table(marker.replace(".json", ".parquet")).slice(lo, n)
        f = t.column("feature_arr").combine_chunks()
        feats.append(f.values.to_numpy().reshape(n, -1))
        qual.append(t.column("quality_score").to_numpy())
        ids += t.column("chunk_id").to_pylist()
    q = np.concatenate(qual)
    low, high = quality_range
    return Corpus(
        features=np.concatenate(feats).astype(np.float32),
        quality=((q - low) / (high - low)).reshape(-1, 1),
        ids=np.asarray(ids),
    )


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--run", type=Path, required=True, help="a finished run's output folder")
    ap.add_argument("--gids", type=int, nargs="+", required=True)
    ap.add_argument("--threads", type=int, default=1, help="as a worker of 2 on 2 cores")
    ap.add_argument("--no-bound", action="store_true")
    args = ap.parse_args()
    torch.set_num_threads(args.threads)
    if args.no_bound:
        step.bound_heap = lambda: False
    m = json.loads((args.run / "manifest.json").read_text())
    settings = SelectSpec.from_mapping({k: v for k, v in m["settings"].items() if v is not None})
    ((low, high),) = m["budget"]["quality_range"].values()
    k_total, n_total = m["totals"]["k"], m["totals"]["n_docs"]
    by_gid = {g["gid"]: g for g in m["groups"]}
    samples: list[tuple[float, float]] = []
    stop, t0 = threading.Event(), time.perf_counter()

    def sample() -> None:
        while not stop.wait(0.25):
            samples.append((time.perf_counter() - t0, rss_mb()))

    threading.Thread(target=sample, daemon=True).start()
    steps = []
    for gid in args.gids:
        g = by_gid[gid]
        if not g["label"].startswith("cluster ") or "part" in g["label"]:
            sys.exit(f"group {gid} is {g['label']!r}: only whole clusters are replayed.")
        corpus = load_cluster(args.run / "_work", int(g["label"].split()[1]), (low, high))
        spec = group_spec(settings.check(), g["k"], corpus.n_docs, k_total, n_total)
        start = time.perf_counter() - t0
        # as select_group runs it: the gain curve, no exact scoring of the group
        step.fit_group(corpus, g["k"], spec, seed=g["seed"], gain_curve=True, evaluate=False)
        steps.append(
            {
                "gid": gid,
                "n": corpus.n_docs,
                "k": g["k"],
                "start": start,
                "seconds": time.perf_counter() - t0 - start,
            }
        )
        del corpus
    stop.set()
    at, peak = max(samples, key=lambda s: s[1])
    print(
        json.dumps(
            {
                "gids": args.gids,
                "bounded": not args.no_bound,
                "peak_mb": peak,
                "peak_at_s": at,
                "steps": steps,
                "threads": args.threads,
            }
        )
    )


if __name__ == "__main__":
    main()
