"""The Curator workflow against ``datamask select`` on the same shards, same settings.

    flock -x /work/cpu.lock python benchmarks/curator/bench_curator.py \\
        --corpus ../shared/data/realtext.parquet --n-shards 8 --repeats 2 --work /tmp/dmcur-bench

The corpus is cut into ``--n-shards`` shards of consecutive rows. Each repeat runs, each in
its own process under ``/usr/bin/time -v`` (wall, user + sys CPU of the process and its
reaped children, peak RSS of the largest process):

* ``cli``: ``datamask select --input SHARDS --output OUT --select-ratio 0.1 --seed 0``
  (the local pool, one worker per core: what ``datamask select`` does by default);
* ``workflow``: a local Ray of ``--cpus`` CPUs is started (timed apart: a Curator user
  already runs one), then ``DatamaskSelectionWorkflow(...).run(XennaExecutor)`` with the
  same settings, ``workers`` = the CLI's pool size.

Both selections are compared id for id. What Curator's executor adds is measured twice:
the workflow's pipelines (one per batch of steps: count and seconds) and a no-op pipeline
of 8 tasks (``max`` of two ints) through the same executor, its fixed cost. Rows append to
``results/bench_curator.jsonl``; RESULTS.md is written by hand from them.
"""

from __future__ import annotations

import argparse
import json
import os
import re
import shutil
import subprocess
import sys
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent
SETTINGS = {"select_ratio": 0.1, "seed": 0}
CLI_FLAGS = ["--select-ratio", "0.1", "--seed", "0", "--no-progress"]

WORKFLOW = """
import json, sys, time
t0 = time.perf_counter()
from nemo_curator.backends.xenna import XennaExecutor
from datamask.integrations.curator import (
    CuratorRunner, DatamaskSelectionWorkflow, local_ray_cluster)
shards, out, cpus = sys.argv[1], sys.argv[2], int(sys.argv[3])
executor = XennaExecutor(config={"cpu_allocation_percentage": 1.0})
with local_ray_cluster(cpus):
    t1 = time.perf_counter()
    result = DatamaskSelectionWorkflow(shards, out, id_field="chunk_id",
        embedding_field="feature_arr", quality_fields="quality_score",
        select_ratio=0.1, seed=0, workers=cpus).run(executor)
    t2 = time.perf_counter()
    runner = CuratorRunner(executor, workers=cpus)
    list(runner.map(max, [(i, i + 1) for i in range(8)]))
    t3 = time.perf_counter()
meta = result.metadata
print("RESULT " + json.dumps({"startup_s": t1 - t0, "workflow_s": t2 - t1,
    "noop_pipeline_s": t3 - t2, "seconds": meta["seconds"], "pipelines": meta["pipelines"],
    "n_selected": meta["n_selected"], "selection_path": meta["selection_path"]}))
"""


def split(corpus: Path, folder: Path, n_shards: int) -> int:
    import numpy as np
    import pyarrow.parquet as pq

    table = pq.read_table(corpus, columns=["chunk_id", "quality_score", "feature_arr"])
    folder.mkdir(parents=True, exist_ok=True)
    bounds = np.linspace(0, table.num_rows, n_shards + 1).astype(int)
    for i in range(n_shards):
        part = table.slice(bounds[i], bounds[i + 1] - bounds[i])
        pq.write_table(part, folder / f"part-{i:05d}.parquet", row_group_size=2000)
    return table.num_rows


def timed(cmd: list[str], env: dict[str, str]) -> tuple[dict, str]:
    """Run ``cmd`` under /usr/bin/time -v; wall, CPU, peak RSS and its stdout."""
    started = time.perf_counter()
    proc = subprocess.run(["/usr/bin/time", "-v", *cmd], capture_output=True, text=True, env=env)
    wall = time.perf_counter() - started
    if proc.returncode != 0:
        raise SystemExit(f"{cmd[:3]} failed:\n{proc.stderr[-4000:]}")
    user = float(re.search(r"User time \(seconds\): ([\d.]+)", proc.stderr).group(1))
    system = float(re.search(r"System time \(seconds\): ([\d.]+)", proc.stderr).group(1))
    rss = int(re.search(r"Maximum resident set size \(kbytes\): (\d+)", proc.stderr).group(1))
    load = os.getloadavg()
    return {"wall_s": wall, "cpu_s": user + system, "peak_rss_mb": rss / 1024,
            "load_after": [round(x, 2) for x in load]}, proc.stdout  # fmt: skip


def selected_ids(out: str) -> list:
    import pyarrow.parquet as pq

    parts = sorted(Path(out, "selected").glob("*.parquet"))
    return sorted(i for p in parts for i in pq.read_table(p).column("chunk_id").to_pylist())


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--corpus", default=str(HERE.parents[2] / "shared/data/realtext.parquet"))
    parser.add_argument("--n-shards", type=int, default=8)
    parser.add_argument("--repeats", type=int, default=2)
    parser.add_argument("--cpus", type=int, default=len(os.sched_getaffinity(0)))
    parser.add_argument("--work", default="/tmp/dmcur-bench", help="scratch folder (replaced)")
    args = parser.parse_args()

    work = Path(args.work)
    shutil.rmtree(work, ignore_errors=True)
    n = split(Path(args.corpus), work / "shards", args.n_shards)
    env = {**os.environ, "PYTHONPATH": str(HERE.parents[1] / "src")}
    env.pop("RAY_ADDRESS", None)
    rows = []
    for rep in range(args.repeats):
        for kind in ("cli", "workflow"):
            out = str(work / f"{kind}-{rep}")
            load_before = [round(x, 2) for x in os.getloadavg()]
            if kind == "cli":
                cmd = [sys.executable, "-c", "from datamask.cli import main; raise SystemExit("
                       "main(__import__('sys').argv[1:]))", "select", "--input",
                       str(work / "shards"), "--output", out, "--workers", str(args.cpus),
                       *CLI_FLAGS]  # fmt: skip
            else:
                cmd = [sys.executable, "-c", WORKFLOW, str(work / "shards"), out, str(args.cpus)]
            stats, stdout = timed(cmd, env)
            row = {"kind": kind, "repeat": rep, "n_docs": n, "n_shards": args.n_shards,
                   "cpus": args.cpus, "load_before": load_before, **stats}  # fmt: skip
            if kind == "workflow":
                extra = json.loads(stdout.split("RESULT ", 1)[1])
                out = extra.pop("selection_path")
                row.update(extra)
            row["n_selected"] = len(ids := selected_ids(out))
            row["equal_to_cli"] = ids == selected_ids(str(work / f"cli-{rep}"))
            print(json.dumps({k: v for k, v in row.items() if k != "pipelines"}), flush=True)
            rows.append(row)
    results = HERE / "results"
    results.mkdir(exist_ok=True)
    with open(results / "bench_curator.jsonl", "a") as fh:
        for row in rows:
            fh.write(json.dumps({"date": time.strftime("%Y-%m-%dT%H:%M:%S"), **row}) + "\n")


if __name__ == "__main__":
    main()
