"""Exact J over every document of a sharded corpus, for several outputs of it at once.

    python benchmarks/scale/exact_j.py --data /tmp/datamask-scale/1m \
        --outs /tmp/run-1m-a /tmp/run-1m-b --results /tmp/exact-j.json

The scorer of ``sharded_j.py``, for corpora too large to select as one file here:
``lamb * mean corpus-scaled quality of S + (1 - lamb) * mean_i max(0, max_{j in S} cos)``
over every row of every shard of ``--data``, where S is each output's ``selected/`` rows
(quality scaled by the corpus' min and max, as the runs scale it). One float32 product of
every row against the union of the outputs' selected rows, the maxima taken over each
output's columns: two outputs sharing most of their rows cost about one. 1M x 384 against
102,136 rows: 1,050 s on 2 threads.
"""

from __future__ import annotations

import argparse
import glob
import json
import sys
import time
from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.parquet as pq
import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "_lib"))
from ledger import run_record, write_json  # noqa: E402

ID, Q, F = "chunk_id", "quality_score", "feature_arr"


def read_corpus(data: str) -> tuple[pa.Array, np.ndarray, torch.Tensor]:
    """Every shard's ids, corpus-scaled quality and unit rows, in shard order."""
    tables = [pq.read_table(f, columns=[ID, Q, F]) for f in sorted(glob.glob(f"{data}/*.parquet"))]
    ids = pa.concat_arrays([t.column(ID).combine_chunks() for t in tables])
    q = np.concatenate([t.column(Q).to_numpy() for t in tables]).astype(np.float64)
    rows = [
        t.column(F).combine_chunks().flatten().to_numpy().reshape(t.num_rows, -1) for t in tables
    ]
    x = torch.from_numpy(np.concatenate(rows).astype(np.float32))
    x /= x.norm(dim=1, keepdim=True)
    return ids, (q - q.min()) / (q.max() - q.min()), x


def exact_j(
    x: torch.Tensor, qs: np.ndarray, masks: list[np.ndarray], lamb: float, block: int = 1024
) -> list[dict[str, float]]:
    """J, quality and coverage of each selection ``masks`` (a boolean per row)."""
    union = np.flatnonzero(np.logical_or.reduce(masks))
    s = x[torch.as_tensor(union)]
    cols = [torch.as_tensor(np.flatnonzero(m[union])) for m in masks]
    best = [torch.empty(len(x), dtype=torch.float64) for _ in masks]
    for a in range(0, len(x), block):
        sims = x[a : a + block] @ s.T
        for b, c in zip(best, cols, strict=True):
            b[a : a + block] = sims[:, c].amax(1).clamp_min(0).double()
    out = []
    for m, b in zip(masks, best, strict=True):
        quality, coverage = float(qs[m].mean()), float(b.mean())
        out.append(
            {"J": lamb * quality + (1 - lamb) * coverage, "quality": quality, "coverage": coverage}
        )
    return out


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--data", required=True, help="folder of the corpus' parquet shards")
    ap.add_argument("--outs", nargs="+", required=True, help="output folders (their selected/)")
    ap.add_argument("--lamb", type=float, default=0.5)
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--results", required=True, help="the figures' JSON")
    args = ap.parse_args()
    torch.set_num_threads(args.threads)
    started = time.perf_counter()
    ids, qs, x = read_corpus(args.data)
    masks = []
    for out in args.outs:
        chosen = pq.read_table(Path(out) / "selected", columns=[ID]).column(ID).combine_chunks()
        mask = pc.is_in(ids, value_set=chosen).to_numpy(zero_copy_only=False)
        if mask.sum() != len(chosen):
            raise SystemExit(f"{out}: {len(chosen) - mask.sum()} selected ids are not in --data")
        masks.append(mask)
    scores = exact_j(x, qs, masks, args.lamb)
    record = {
        **run_record(),
        "data": args.data,
        "n_docs": len(ids),
        "lamb": args.lamb,
        "threads": args.threads,
        "outputs": [
            {"out": o, "k": int(m.sum()), **s}
            for o, m, s in zip(args.outs, masks, scores, strict=True)
        ],
        "shared_rows": int(np.logical_and.reduce(masks).sum()),
        "seconds": time.perf_counter() - started,
    }
    write_json(Path(args.results), record)
    print(json.dumps(record, indent=1))


if __name__ == "__main__":
    main()
