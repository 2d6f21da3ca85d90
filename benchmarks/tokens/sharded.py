"""Token budgets on shards (issue 46): exact J over every document against one selection.

For each corpus the script runs one selection of the whole file (``datamask.api.select``)
and sharded runs (``run_selection``, ``--partition cluster``) at ``--chunk-size`` values
small enough to split the clusters, at the same token budget, and scores every selection
with the exact objective per token over every document (docs/method.md "Token budgets").

- ``test``: the corpus of ``tests/distributed/test_tokens_sharded.py`` (300 rows, 5
  clusters, 3 shards, ``--chunk-size 100``), at ``--oversample`` 2 and 4;
- ``realtext``: the 56k real-text corpus (``../shared/data/realtext.parquet``) in 8
  shards, ``n_chars`` as lengths, ``--chunk-size`` 7100 and 3600.

10% of the tokens, lamb 0.5, Facility, seed 0.

    python benchmarks/tokens/sharded.py --corpus test      # results/...-sharded-test.json
    python benchmarks/tokens/sharded.py --corpus realtext  # results/...-sharded-realtext.json
    python benchmarks/tokens/sharded.py --table            # RESULTS.md's section
"""

from __future__ import annotations

import argparse
import os
import sys
import tempfile
import time
from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import torch

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE.parent / "_lib"))
import ledger  # noqa: E402

from datamask import check_corpus  # noqa: E402
from datamask.api import select  # noqa: E402
from datamask.budget import TokenBudget  # noqa: E402
from datamask.config import SelectSpec  # noqa: E402
from datamask.data import Corpus  # noqa: E402
from datamask.distributed.executors import LocalRunner  # noqa: E402
from datamask.distributed.runner import run_selection  # noqa: E402

REALTEXT = HERE.parents[1].parent / "shared" / "data" / "realtext.parquet"
RATIO, LAMB = 0.1, 0.5


def test_corpus() -> pa.Table:
    """tests/distributed/test_tokens_sharded.py's ``_corpus(7, n=300, n_clusters=5)``."""
    rng = np.random.default_rng(7)
    n, n_clusters, dim = 300, 5, 8
    centers = rng.normal(size=(n_clusters, dim)) * 3
    labels = rng.integers(0, n_clusters, n)
    emb = (centers[labels] + rng.normal(size=(n, dim))).astype(np.float32)
    return pa.table(
        {
            "chunk_id": pa.array([f"d{i:05d}" for i in range(n)]),
            "quality_score": pa.array(rng.random(n) + 0.3 * labels),
            "n_chars": pa.array(rng.integers(20, 400, n)),
            "feature_arr": pa.FixedSizeListArray.from_arrays(pa.array(emb.ravel()), dim),
        }
    )


def realtext() -> pa.Table:
    return pq.read_table(REALTEXT, columns=["chunk_id", "quality_score", "n_chars", "feature_arr"])


def exact_j(table: pa.Table, ids: set, spec: SelectSpec) -> dict[str, float]:
    """J per token of the rows ``ids`` over every document of ``table``, exactly."""
    lengths = np.asarray(table.column("n_chars").to_numpy(), dtype=np.float64)
    corpus = check_corpus(
        Corpus(
            ids=np.asarray(table.column("chunk_id").to_pylist()),
            quality=table.column("quality_score").to_numpy()[:, None],
            features=np.stack(table.column("feature_arr").to_numpy(zero_copy_only=False)),
            lengths=lengths,
        )
    )
    budget = TokenBudget(lengths, RATIO * lengths.sum())
    objective = spec.objective.make().bind(corpus, budget.expected_count(), budget=budget)
    rows = np.flatnonzero(np.isin(corpus.ids, list(ids)))
    values = objective.term_values(rows)
    return {key: float(v) for key, v in values.items()} | {"tokens": float(lengths[rows].sum())}


def kept_ids(out: Path) -> set:
    parts = sorted((out / "selected").glob("part-*.parquet"))
    return {i for p in parts for i in pq.read_table(p).column("chunk_id").to_pylist()}


def one_file(table: pa.Table, folder: Path, spec: SelectSpec) -> tuple[set, float]:
    pq.write_table(table, folder / "all.parquet")
    clock = time.perf_counter()
    select(str(folder / "all.parquet"), folder / "one" / "sel.parquet", spec)
    wall = time.perf_counter() - clock
    one = pq.read_table(folder / "one" / "sel.parquet")
    return set(one.filter(one.column("selected")).column("chunk_id").to_pylist()), wall


def sharded(table: pa.Table, folder: Path, n_shards: int, flat: dict) -> tuple[set, dict, float]:
    shards = folder / f"in-{n_shards}"
    if not shards.exists():
        shards.mkdir()
        step = -(-table.num_rows // n_shards)
        for s in range(n_shards):
            pq.write_table(table.slice(s * step, step), shards / f"{s:03d}.parquet")
    out = Path(tempfile.mkdtemp(dir=folder))
    clock = time.perf_counter()
    manifest = run_selection(
        shards, out / "out", SelectSpec.from_mapping(flat), runner=LocalRunner(), progress=False
    )
    return kept_ids(out / "out"), manifest, time.perf_counter() - clock


def measure(which: str, methods: list[str], threads: int) -> Path:
    torch.set_num_threads(threads)
    table = test_corpus() if which == "test" else realtext()
    n_shards, chunks = (3, [100]) if which == "test" else (8, [7100, 3600])
    oversamples = [2.0, 4.0] if which == "test" else [2.0]
    rows = []
    with tempfile.TemporaryDirectory() as tmp:
        folder = Path(tmp)
        for method in methods:
            base = {"select_token_ratio": RATIO, "length_col": "n_chars", "method": method}
            base |= {"lamb": LAMB, "seed": 0}
            spec = SelectSpec.from_mapping(base)
            ids, wall = one_file(table, folder, spec)
            ref = exact_j(table, ids, spec)
            load = os.getloadavg()
            rows.append({"method": method, "run": "one file", "wall_s": wall, **ref, "load": load})
            print(rows[-1], flush=True)
            for chunk in chunks:
                for over in oversamples:
                    flat = base | {"partition": "cluster", "chunk_size": chunk, "oversample": over}
                    ids, manifest, wall = sharded(table, folder, n_shards, flat)
                    got = exact_j(table, ids, spec)
                    rows.append(
                        {
                            "method": method,
                            "run": "sharded",
                            "chunk_size": chunk,
                            "oversample": over,
                            "n_groups": manifest["totals"]["n_groups"],
                            "allocation": manifest["budget"]["allocation"],
                            "rounds": (manifest["budget"]["global_round"] or {}).get("rounds"),
                            "wall_s": wall,
                            **got,
                            "J_vs_one": got["J"] / ref["J"],
                            "load": os.getloadavg(),
                        }
                    )
                    print(rows[-1], flush=True)
    payload = ledger.run_record(
        corpus=which, n_docs=table.num_rows, ratio=RATIO, lamb=LAMB, threads=threads, rows=rows
    )
    out = ledger.result_path(HERE, f"sharded-{which}")
    ledger.write_json(out, payload)
    return out


def table_md() -> str:
    lines = [
        "| corpus | method | run | chunk size | oversample | groups | allocation | rounds | "
        "tokens kept | J | J / one file | wall s | load (1 min) |",
        "|---|---|---|---:|---:|---:|---|---:|---:|---:|---:|---:|---:|",
    ]
    for which in ("test", "realtext"):
        runs = ledger.load_runs(HERE, f"sharded-{which}")
        if not runs:
            continue
        run = runs[-1]
        for r in run["rows"]:
            ratio = f"{r['J_vs_one']:.2%}" if r["run"] == "sharded" else ""
            lines.append(
                f"| {which} ({run['commit']}) | {r['method']} | {r['run']} | "
                f"{r.get('chunk_size', '')} | {r.get('oversample', '')} | {r.get('n_groups', '')} "
                f"| {r.get('allocation', '')} | {r.get('rounds') or ''} | {r['tokens']:,.0f} | "
                f"{r['J']:.5f} | {ratio} | "
                f"{r['wall_s']:.1f} | {r['load'][0]:.1f} |"
            )
    return "\n".join(lines) + "\n"


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    ap.add_argument("--corpus", choices=["test", "realtext"], default="test")
    ap.add_argument("--methods", nargs="+", default=["greedy", "mask"])
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--table", action="store_true", help="print RESULTS.md's section and exit")
    args = ap.parse_args()
    if args.table:
        print(table_md())
        return
    print("wrote", measure(args.corpus, args.methods, args.threads))


if __name__ == "__main__":
    main()
