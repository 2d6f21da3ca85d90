"""Replay select steps of a finished sharded run in one process and sample its RSS.

    python benchmarks/archive/scale/heap_probe.py --run /tmp/dm/run-1m-exchange --gids 7 13
    MALLOC_MMAP_THRESHOLD_=4194304 python benchmarks/archive/scale/heap_probe.py ... --no-bound

A worker of a sharded run runs one group after another. This replays groups (of a
``--partition cluster`` run, read as the run read them) in that order, with the
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

import torch

import datamask.pipeline.step as step
from datamask._memory import rss_mb
from datamask.config import SelectSpec
from datamask.distributed.combine.gains import group_spec
from datamask.distributed.plan.partition import ClusterTree, Group, plan_by_cluster
from datamask.distributed.select.steps import read_group


def cluster_groups(work: Path, chunk_size: int) -> dict[str, tuple]:
    """Every group of a ``--partition cluster`` run by label, with its pieces: the
    run's own plan (:func:`~datamask.distributed.plan.partition.plan_by_cluster`) over the
    spills its plan phase left in ``WORK/clusters``."""
    spills = [
        (marker.replace(".json", ".parquet"), json.loads(Path(marker).read_text())["counts"])
        for marker in sorted(glob.glob(str(work / "clusters" / "shard-*.json")))
    ]
    tree = ClusterTree.load(work / "clusters" / "tree.npz")
    return {label: tuple(pieces) for label, pieces in plan_by_cluster(spills, chunk_size, tree)}


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
    ranges = list(m["budget"]["quality_range"].values())
    quality_range = ([lo for lo, _ in ranges], [hi for _, hi in ranges])
    pieces = cluster_groups(args.run / "_work", settings.partition.chunk_size)
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
        if g["label"] not in pieces:
            sys.exit(f"group {gid} is {g['label']!r}: only the groups of a cluster partition.")
        group = Group(gid, g["label"], pieces[g["label"]], g["k"], g["seed"])
        corpus, ids = read_group(group, settings, quality_range)  # as select_group reads it
        spec = group_spec(settings.check(), g["k"], corpus.n_docs, k_total, n_total)
        start = time.perf_counter() - t0
        # as select_group runs it: the gain curve, no exact scoring of the group
        sel, objective = step.fit_group(
            corpus, g["k"], spec, seed=g["seed"], stored_ids=ids, evaluate=False
        )
        step.gain_curve(corpus, sel, objective, spec, g["seed"])
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
