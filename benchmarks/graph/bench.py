"""The ivf K-NN graph of one group, this code against another checkout, alternated.

    git worktree add /tmp/graph-base <commit>
    python benchmarks/graph/bench.py --base /tmp/graph-base/src --threads 1 2 --repeats 3
    python benchmarks/graph/bench.py --markdown-only      # rebuild RESULTS.md's table

Each run is a fresh process (``PYTHONPATH`` = the code timed; torch and BLAS pinned to
``--threads``, glibc's mmap threshold fixed as in a sharded worker) that builds
``knn_graph`` of ``make_clustered(--n, 384, 500)`` (a 1M sharded run's group) or of the
rows of a parquet file (``--corpus``: the real-text corpus, or a group a sharded run
spilled, ``OUT/_work/clusters/groups/group-NNNNN.parquet``) with K = ``--k`` and the
default probes, and records its
wall and CPU seconds, the load average, recall@K on 200 sampled rows, and digests of the
indices and similarities (equal digests: the same graph bit for bit). Versions alternate
within each repeat, so both see the same load. Rows go to
``results/<date>-<machine>-graph[-<corpus>][-run<n>].json`` (``-run2``: a later run of the
day); RESULTS.md's table is rebuilt from every such file.
"""

from __future__ import annotations

import argparse
import hashlib
import json
import os
import subprocess
import sys
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE.parent / "_lib"))
from ledger import replace_section, result_path, run_record, write_json  # noqa: E402


def one(args: argparse.Namespace) -> dict:
    """Build one graph in this process and return its row."""
    import torch

    from datamask import make_clustered
    from datamask.measure import bound_heap, set_threads
    from datamask.neighbors import knn_graph, sampled_recall

    set_threads(args.one_threads)
    bound_heap()
    if args.corpus:
        import pyarrow.parquet as pq

        from datamask.columns import Columns
        from datamask.io.parquet import arrays_from_table

        table = pq.read_table(args.corpus, columns=["chunk_id", "quality_score", "feature_arr"])
        cols = Columns("chunk_id", ("quality_score",), feature_col="feature_arr")
        x = torch.from_numpy(arrays_from_table(table, args.corpus, cols)[2])
        x = torch.nn.functional.normalize(x, dim=1)
    else:
        x = torch.from_numpy(make_clustered(args.n, 384, 500, seed=0).features)
    load = os.getloadavg()
    wall, cpu = time.perf_counter(), time.process_time()
    idx, sim = knn_graph(x, args.k)
    wall, cpu = time.perf_counter() - wall, time.process_time() - cpu
    return {
        "rows": len(x),
        "k": args.k,
        "threads": args.one_threads,
        "wall": round(wall, 2),
        "cpu": round(cpu, 2),
        "load": [round(v, 2) for v in (*load, *os.getloadavg())],
        "recall": round(sampled_recall(x, idx, n_rows=200), 4),
        "idx_digest": hashlib.sha256(idx.numpy().tobytes()).hexdigest()[:12],
        "sim_digest": hashlib.sha256(sim.numpy().tobytes()).hexdigest()[:12],
    }


def table(runs: list[dict]) -> str:
    lines = [
        "| date | commit | data | rows | K | threads | code | wall s | CPU s "
        "| load (before, after) | recall@K | idx / sim digest |",
        "|---|---|---|---:|---:|---:|---|---:|---:|---|---:|---|",
    ]
    for run in runs:
        for r in run["rows"]:
            load = ", ".join(f"{v:.1f}" for v in (r["load"][0], r["load"][3]))
            lines.append(
                f"| {run['date']} | {run['commit']} | {run['data']} | {r['rows']} | {r['k']} "
                f"| {r['threads']} "
                f"| {r['code']} | {r['wall']:.1f} | {r['cpu']:.1f} | {load} | {r['recall']:.4f} "
                f"| {r['idx_digest']} / {r['sim_digest']} |"
            )
    return "\n".join(lines)


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--base", help="src folder of the code to compare against")
    p.add_argument("--corpus", help="real-text parquet (default: make_clustered rows)")
    p.add_argument("--n", type=int, default=90_000, help="generated rows (default 90,000)")
    p.add_argument("--k", type=int, default=80, help="neighbours (default 80: ratio 0.2)")
    p.add_argument("--threads", type=int, nargs="+", default=[1, 2])
    p.add_argument("--repeats", type=int, default=3)
    p.add_argument("--one-threads", type=int, help=argparse.SUPPRESS)
    p.add_argument("--markdown-only", action="store_true")
    args = p.parse_args()
    if args.one_threads:
        print(json.dumps(one(args)))
        return
    if not args.markdown_only:
        here_src = str(HERE.parents[1] / "src")
        rows = []
        for _ in range(args.repeats):
            for threads in args.threads:
                for name, src in (("base", args.base), ("this", here_src)):
                    cmd = [sys.executable, __file__, "--one-threads", str(threads)]
                    cmd += ["--n", str(args.n), "--k", str(args.k)]
                    cmd += ["--corpus", args.corpus] if args.corpus else []
                    env = {**os.environ, "PYTHONPATH": src}
                    out = subprocess.run(cmd, env=env, capture_output=True, text=True, check=True)
                    rows.append({"code": name, **json.loads(out.stdout.splitlines()[-1])})
                    print(rows[-1], flush=True)
        data = Path(args.corpus).name if args.corpus else f"make_clustered({args.n}, 384, 500)"
        what = f"graph-{Path(args.corpus).stem}" if args.corpus else "graph"
        path, again = result_path(HERE, what), 1
        while path.exists():  # a second run of the day: a file of its own
            again += 1
            path = result_path(HERE, f"{what}-run{again}")
        write_json(path, run_record(data=data, base=args.base, rows=rows))
    found = (HERE / "results").glob("*-graph*.json")  # a day's "-run2" after its first files
    runs = [
        json.loads(p.read_text()) for p in sorted(found, key=lambda p: p.stem.replace("-run", "~"))
    ]
    replace_section(HERE / "RESULTS.md", "graph", table(runs))


if __name__ == "__main__":
    main()
