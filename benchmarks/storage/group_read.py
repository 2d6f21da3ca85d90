"""A cluster group step's read as the shards grow: objects opened, bytes, seconds (issue 30).

    python benchmarks/storage/group_read.py \
        --out benchmarks/storage/results/2026-11-26-cpu2-group-read.jsonl
    python benchmarks/storage/group_read.py --one 1000        # a single point

At a fixed corpus (``--n-docs`` generated documents, ``benchmarks/scale/generate.py``,
``--dim`` wide, drawn around ``--clusters`` true clusters) cut into S shards (100, 1,000,
4,000), each point runs :func:`datamask.distributed.run_selection` in a fresh process with
``--partition cluster`` into ``--clusters`` k-means clusters, one group per cluster
(``chunk_size`` = N: no splits, no merges), ``--method random --budget group
--selected-only`` (so a group step is mostly its read) on a two-process
:class:`~datamask.distributed.LocalRunner`, on local disk. Reported per point: wall and
CPU seconds, the manifest's phases, the driver's and the workers' peak RSS, and per group
step (from the work dir the run leaves): its read seconds (from its completion marker), the
objects it opens and the bytes of the column chunks it reads plus their footers:

- spills (the code before issue 30's gather): a group reads its cluster's row group of
  every spill that has rows of it;
- gathered (after): a group reads one object, ``WORK/clusters/groups/group-GGGGG.parquet``;
  the gather steps that wrote them are timed too (their markers' seconds).

The code measured is the ``datamask`` on ``PYTHONPATH`` (recorded as ``datamask``): run
it once with an older checkout's ``src`` for "before". Run it alone (``flock -x
/work/cpu.lock``): the machine has two cores.
"""

from __future__ import annotations

import argparse
import json
import os
import resource
import shutil
import sys
import tempfile
import time
from pathlib import Path

import numpy as np
import pyarrow.parquet as pq

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "driver"))
from sweep import corpus_at, light_settings, point_row  # noqa: E402  (same data, same run)

SHARDS = (100, 1000, 4000)
READ = ["chunk_id", "quality_score", "feature_arr"]  # what a group step reads


def _read_bytes(path: Path, row_groups: list[int] | None = None) -> int:
    """Footer plus the read columns' compressed chunks of ``row_groups`` (default all)."""
    meta = pq.ParquetFile(path).metadata
    names = [meta.schema.column(i).path for i in range(meta.num_columns)]
    wanted = [i for i, n in enumerate(names) if n.split(".")[0] in READ]
    groups = range(meta.num_row_groups) if row_groups is None else row_groups
    body = sum(meta.row_group(g).column(i).total_compressed_size for g in groups for i in wanted)
    return int(meta.serialized_size + body)


def per_group_io(work: Path, markers: list[dict]) -> dict:
    """Objects opened and bytes read by each group step, from the files it read."""
    from datamask.distributed.plan.gather import (
        gather_summary,  # the measured code's, on PYTHONPATH
    )

    gathered = work / "clusters" / "groups"
    if gathered.is_dir():
        opened = [1] * len(markers)
        read = [_read_bytes(gathered / f"group-{m['gid']:05d}.parquet") for m in markers]
        try:  # the work dir as the measured code's gather_summary takes it
            from datamask.distributed.paths import WorkDir

            done = gather_summary(WorkDir(str(work.parent), str(work)))
        except ImportError:  # code before WorkDir
            done = gather_summary(work)
        extra = {
            "gather_steps_s_sum": round(done["seconds"], 1),
            "gather_steps": done["steps"],
            "gather_spills_opened": done["spills_opened"],
            "gather_spills_read_mean": round(done["spills_read_mean"], 1),
        }
    else:  # one group per cluster, one leaf per cluster: the spill's row group of it
        counts = {
            int(p.stem.split("-")[1]): np.asarray(json.loads(p.read_text())["counts"])
            for p in (work / "clusters").glob("shard-*.json")
        }
        opened, read = [], []
        for m in markers:
            c = int(m["label"].split()[1])
            having = [s for s in sorted(counts) if counts[s][c] > 0]
            assert sum(int(counts[s][c]) for s in having) == m["n"], m["label"]
            opened.append(len(having))
            read.append(
                sum(
                    _read_bytes(
                        work / "clusters" / f"shard-{s:05d}.parquet",
                        [int(np.count_nonzero(counts[s][:c]))],
                    )
                    for s in having
                )
            )
        extra = {}
    return {
        "objects_per_group_mean": round(float(np.mean(opened)), 1),
        "objects_per_group_max": int(max(opened)),
        "bytes_per_group_mean": int(np.mean(read)),
        **extra,
    }


def one_point(shards: int, n_docs: int, clusters: int, dim: int, data: Path) -> dict:
    """Generate (once) and select one point in this process; returns its figures."""
    corpus = corpus_at(data, n_docs, shards, clusters, dim)
    import datamask
    from datamask.config import SelectSpec
    from datamask.distributed import LocalRunner, run_selection

    settings = SelectSpec.from_mapping(light_settings(clusters, n_docs, 0.1))
    load_before = os.getloadavg()
    started = time.perf_counter()
    tmp = Path(tempfile.mkdtemp(prefix="datamask-group-read-"))
    runner = LocalRunner(workers=2)
    try:
        manifest = run_selection(corpus, tmp / "out", settings, runner=runner, progress=False)
    finally:
        runner.close()
    wall = time.perf_counter() - started
    me = resource.getrusage(resource.RUSAGE_SELF)
    kids = resource.getrusage(resource.RUSAGE_CHILDREN)
    work = tmp / "out" / "_work"
    markers = [
        json.loads(p.read_text()) for p in (work / "completions").iterdir() if p.name.isdigit()
    ]
    reads = np.asarray([m["seconds"]["read"] for m in markers])
    seconds = manifest["totals"]["seconds"]
    row = {
        "shards": shards,
        "n_docs": n_docs,
        "groups": manifest["totals"]["n_groups"],
        "wall_s": round(wall, 1),
        "cpu_s": round(me.ru_utime + me.ru_stime + kids.ru_utime + kids.ru_stime, 1),
        "plan_s": round(seconds["plan"], 1),
        "select_s": round(seconds["select"], 1),
        "after_select_s": round(seconds["total"] - seconds["plan"] - seconds["select"], 1),
        "group_read_s_mean": round(float(reads.mean()), 4),
        "group_read_s_max": round(float(reads.max()), 4),
        "group_read_s_sum": round(float(reads.sum()), 2),
        **per_group_io(work, markers),
        "driver_peak_mb": round(me.ru_maxrss / 1024, 1),
        "workers_peak_mb": round(kids.ru_maxrss / 1024, 1),
        "datamask": str(Path(datamask.__file__).parents[1]),
        "load_before": [round(x, 2) for x in load_before],
        "load_after": [round(x, 2) for x in os.getloadavg()],
    }
    shutil.rmtree(tmp, ignore_errors=True)
    return row


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--out", type=Path, help="append one JSON line per point here")
    p.add_argument("--data", type=Path, default=Path("/tmp/datamask-group-read"))
    p.add_argument("--n-docs", type=int, default=200_000)
    p.add_argument("--clusters", type=int, default=100)
    p.add_argument("--dim", type=int, default=64)
    p.add_argument("--one", type=int, metavar="S", help="one point only: S shards")
    p.add_argument("--shards", type=int, nargs="+", default=list(SHARDS))
    p.add_argument("--timeout", type=float, default=900, help="seconds per point")
    args = p.parse_args()
    if args.one:
        row = one_point(args.one, args.n_docs, args.clusters, args.dim, args.data)
        print(json.dumps(row), flush=True)
        return
    for s in args.shards:
        cmd = [sys.executable, __file__, "--one", str(s), "--data", str(args.data)]
        cmd += ["--n-docs", str(args.n_docs), "--clusters", str(args.clusters)]
        cmd += ["--dim", str(args.dim)]
        point_row(cmd, s, args.timeout, args.out)


if __name__ == "__main__":
    main()
