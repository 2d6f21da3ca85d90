"""How far below the exact J a sharded run's reported J is, at any scale, by sampling.

    python benchmarks/scale/reported_j_gap.py --data SHARDS --out RUN_OUTPUT \
        --sample 100000 --json results/DATE-cpu2-...-reported-j.json

A sharded run's manifest states ``quality``, ``facility`` and ``J`` over every document
(:func:`datamask.distributed.finish.cover.corpus_terms`), its facility summed from the
cover's ``covered_sim``, which is a lower bound where the cover searched only the nearest
groups. The exact J over 10^6 rows costs 10^6 x k products (13 minutes on 2 cores at 1M);
the gap needs only a sample: for ``--sample`` random rows, each row's exact nearest-kept
cosine (every kept row, fp32, clipped at 0) minus its ``covered_sim``. Quality is exact, so
``J_exact ~ J_reported + (1 - lamb) * mean(gap)``, with the sample's standard error.
"""

from __future__ import annotations

import argparse
import json
import time
from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.dataset as ds
import torch

ID, F = "chunk_id", "feature_arr"


def unit_rows(data: Path, ids: pa.Array) -> tuple[dict, torch.Tensor]:
    """The unit embeddings of the rows ``ids`` of the shards, and each id's row."""
    table = ds.dataset(data).to_table(columns=[ID, F], filter=ds.field(ID).isin(ids))
    flat = table.column(F).combine_chunks().flatten().to_numpy()
    x = torch.from_numpy(flat.reshape(table.num_rows, -1).astype(np.float32))
    row = {v: i for i, v in enumerate(table.column(ID).to_pylist())}
    return row, x / x.norm(dim=1, keepdim=True)


def gap(data: Path, out: Path, n_sample: int, seed: int = 0) -> dict:
    started = time.perf_counter()
    cover = ds.dataset(out / "covered").to_table(columns=[ID, "covered_sim", "selected"])
    kept = cover.filter(cover.column("selected")).column(ID).combine_chunks()
    rows = np.sort(np.random.default_rng(seed).choice(cover.num_rows, n_sample, replace=False))
    sample = cover.take(pa.array(rows))
    row, x = unit_rows(data, pa.concat_arrays([kept, sample.column(ID).combine_chunks()]))
    s = x[torch.as_tensor([row[v] for v in kept.to_pylist()])]
    q = x[torch.as_tensor([row[v] for v in sample.column(ID).to_pylist()])]
    best = torch.empty(len(q), dtype=torch.float64)
    for a in range(0, len(q), 2048):
        best[a : a + 2048] = (q[a : a + 2048] @ s.T).clamp_min(0).max(1).values.double()
    reported = sample.column("covered_sim").to_numpy().astype(np.float64)
    d = best.numpy() - np.nan_to_num(reported, nan=0.0).clip(min=0.0)
    manifest = json.loads((out / "manifest.json").read_text())
    lamb = manifest["settings"]["lamb"]
    terms = manifest["terms"]
    return {
        "rows": cover.num_rows,
        "kept": len(kept),
        "sampled": n_sample,
        "facility_gap": float(d.mean()),
        "facility_gap_se": float(d.std() / np.sqrt(len(d))),
        "rows_with_a_nearer_kept_row": float((d > 1e-6).mean()),
        "largest_gap": float(d.max()),
        "reported": terms,
        "J_exact_estimate": terms["J"] + (1 - lamb) * float(d.mean()),
        "cover_exact_rows": manifest["cover"]["exact"],
        "seconds": time.perf_counter() - started,
    }


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--data", type=Path, required=True, help="the run's input shards")
    ap.add_argument("--out", type=Path, required=True, help="the run's output folder")
    ap.add_argument("--sample", type=int, default=100_000)
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--json", type=Path)
    args = ap.parse_args()
    torch.set_num_threads(args.threads)
    result = {"data": str(args.data), "out": str(args.out), **gap(args.data, args.out, args.sample)}
    print(json.dumps(result, indent=1))
    if args.json:
        args.json.write_text(json.dumps(result, indent=1) + "\n")


if __name__ == "__main__":
    main()
