"""How many ivf lists the cover's search against the neighbours' kept rows needs to probe.

    python benchmarks/covered/probes.py --work /tmp/datamask-scale/run-head4/_work \
        --group 0 --output benchmarks/covered/PROBES.md

Reads one finished sharded run's work dir (the cluster group's object, its kept rows and
the kept rows of the groups its cover step compared it with, from the group's cover
marker) and times, on one thread, what the cover step computes for that group:

- every row's nearest kept row of its own group, and of the neighbours' kept rows, both
  against every pair (``best_match(method="exact")``);
- the neighbours' search by the ivf at ``--fractions`` of its lists probed: seconds, the
  share of rows whose best neighbour it found, and the rows whose cover (the nearer of the
  two) comes out lower than against every pair, with the mean shortfall.
"""

from __future__ import annotations

import argparse
import json
import time
from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.parquet as pq
import torch

from datamask.io.parquet import features_matrix
from datamask.neighbors import best_match


def _unit_rows(path: Path, column: str) -> np.ndarray:
    col = pq.read_table(path, columns=[column]).column(0).combine_chunks()
    if pa.types.is_fixed_size_binary(col.type):  # a spill's float32 rows as bytes
        x = np.frombuffer(col.buffers()[1], dtype=np.float32).reshape(len(col), -1).copy()
    else:
        x = features_matrix(col).copy()
    return x / np.linalg.norm(x, axis=1, keepdims=True)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--work", required=True, help="a finished sharded run's WORK dir")
    parser.add_argument("--group", type=int, default=0)
    parser.add_argument("--feature-col", default="feature_arr")
    parser.add_argument("--id-col", default="chunk_id")
    parser.add_argument("--fractions", type=float, nargs="+", default=[0.2, 0.1, 0.05])
    parser.add_argument("--output", required=True, help="markdown to write")
    args = parser.parse_args()
    torch.set_num_threads(1)
    work, g = Path(args.work), args.group
    marker = json.loads((work / "cover" / f"{g:05d}.json").read_text())
    group = work / "clusters" / "groups" / f"group-{g:05d}.parquet"
    x = _unit_rows(group, args.feature_col)
    ids = pq.read_table(group, columns=[args.id_col]).column(0).combine_chunks()
    own = pq.read_table(work / "cover" / f"kept-{g:05d}.parquet", columns=[args.id_col])
    kept = np.flatnonzero(pc.is_in(ids, value_set=own.column(0).combine_chunks()))
    near = sorted(marker["neighbors"])  # the cover step's order
    tables = [pq.read_table(work / "cover" / f"kept-{h:05d}.parquet") for h in near]
    others = features_matrix(pa.concat_tables(tables).column("features")).copy()
    q = torch.from_numpy(x)
    clock = time.perf_counter()
    s_own = best_match(q, torch.from_numpy(x[kept]), method="exact")[0].numpy()
    own_s = time.perf_counter() - clock
    clock = time.perf_counter()
    s_far = best_match(q, torch.from_numpy(others), method="exact")[0].numpy()
    far_s = time.perf_counter() - clock
    best = np.maximum(s_own, s_far)
    lines = [
        "# The cover's search against the neighbours' kept rows: lists probed",
        "",
        f"`{' '.join(['python benchmarks/covered/probes.py', '--work', args.work])} "
        f"--group {g}`, one thread. Group {g}: {len(x):,} rows, {len(kept):,} kept; the "
        f"kept rows of groups {sorted(marker['neighbors'])} (in the cover step's order): "
        f"{len(others):,}. Against every pair: "
        f"own group {own_s:.1f} s, neighbours {far_s:.1f} s; {int((s_far > s_own).sum()):,} "
        "rows have their nearest kept row in a neighbour.",
        "",
        "| lists probed | seconds | best neighbour found | rows whose cover is lower | "
        "mean shortfall |",
        "|---:|---:|---:|---:|---:|",
    ]
    for fraction in args.fractions:
        clock = time.perf_counter()
        s = best_match(q, torch.from_numpy(others), method="ivf", probe_fraction=fraction)[0]
        seconds = time.perf_counter() - clock
        cover = np.maximum(s_own, s.numpy())
        lower = cover < best - 1e-6
        found = float((s.numpy() >= s_far - 1e-6).mean())
        lines.append(
            f"| {fraction} | {seconds:.1f} | {found:.1%} | {int(lower.sum())} | "
            f"{float((best - cover).mean()):.2e} |"
        )
    Path(args.output).write_text("\n".join(lines) + "\n")
    print("\n".join(lines))


if __name__ == "__main__":
    main()
