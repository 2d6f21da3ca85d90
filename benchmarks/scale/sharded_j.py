"""Sharded selection against one selection over the same corpus: exact J over every document.

    # the real-text corpus cut into 8 shards of random rows
    python benchmarks/scale/sharded_j.py --corpus ../shared/data/realtext.parquet \
        --n-shards 8 --work /tmp/datamask-sharded/realtext --name realtext
    # a generated corpus (benchmarks/scale/generate.py writes random-row shards)
    python benchmarks/scale/generate.py --out /tmp/datamask-sharded/100k/shards \
        --n-docs 100000 --dim 64 --n-shards 20
    python benchmarks/scale/sharded_j.py --shards /tmp/datamask-sharded/100k/shards \
        --work /tmp/datamask-sharded/100k --name synthetic-100k
    python benchmarks/scale/sharded_j.py --markdown-only   # rebuild SHARDED.md

Every variant runs in this process with the library's defaults (``datamask select``'s
settings: the learner, facility location, lamb 0.5, seed 0), ``--select-ratio`` (0.1) and
only the flags its name gives: ``one`` selects from the whole corpus as one file; the others run the
sharded runner over the shards (``partition``/``budget``/``n_clusters``; ``chunkNNNN``:
the default flags with ``--chunk-size NNNN``, which forces k-means clusters to be balanced
and cut). Each sharded row records its group sizes, and the J its manifest reports (from
the run's cover: a lower bound where the cover is not exact). J is computed by
one scorer for all of them, exactly, over every document of the corpus:
``lamb * mean corpus-scaled quality of S + (1 - lamb) * mean_i max(0, max_{j in S} cos)``.
Rows append to ``results/2026-11-23-cpu2-sharded-j.jsonl`` (each with its ``code``, the commit);
SHARDED.md is rebuilt from them. Wall seconds are what the variant took on this machine at
the load average recorded with it.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import time
from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import torch

from datamask import select
from datamask.config import SelectSpec
from datamask.distributed import run_selection

HERE = Path(__file__).resolve().parent
RESULTS = HERE / "results" / "2026-11-23-cpu2-sharded-j.jsonl"
#: Dated notes written by hand (figures the tool does not record), appended to SHARDED.md.
NOTES = HERE / "results" / "2026-11-26-cpu2-sharded-j-notes.md"
MARKDOWN = HERE / "SHARDED.md"
ID, Q, F = "chunk_id", "quality_score", "feature_arr"

#: name -> the settings it changes from the defaults (sharded runs; ``one`` is one file).
VARIANTS: dict[str, dict] = {
    "one": {},
    "shard-global": {"partition": "shard", "budget": "global"},
    "shard-group": {"partition": "shard", "budget": "group"},
    "cluster8-global": {"partition": "cluster", "budget": "global", "n_clusters": 8},
    "cluster8-group": {"partition": "cluster", "budget": "group", "n_clusters": 8},
    "cluster8-global-os1.5": {
        "partition": "cluster",
        "budget": "global",
        "n_clusters": 8,
        "oversample": 1.5,
    },
    "cluster20-global": {"partition": "cluster", "budget": "global", "n_clusters": 20},
    "cluster20-group": {"partition": "cluster", "budget": "group", "n_clusters": 20},
    "cluster40-global": {"partition": "cluster", "budget": "global", "n_clusters": 40},
    "default": {},
    # the exchange round (issue 18) off: what the default was before it
    "cluster8-global-noexchange": {
        "partition": "cluster",
        "budget": "global",
        "n_clusters": 8,
        "exchange_neighbors": 0,
    },
    "cluster20-global-noexchange": {
        "partition": "cluster",
        "budget": "global",
        "n_clusters": 20,
        "exchange_neighbors": 0,
    },
    "default-noexchange": {"exchange_neighbors": 0},
    "cluster20-global-x4": {
        "partition": "cluster",
        "budget": "global",
        "n_clusters": 20,
        "exchange_neighbors": 4,
    },
    "cluster20-global-x19": {  # every lower group a neighbour
        "partition": "cluster",
        "budget": "global",
        "n_clusters": 20,
        "exchange_neighbors": 19,
    },
    # default flags with --chunk-size forcing k-means clusters to be split (issue 30)
    "chunk7100": {"chunk_size": 7100},
    "chunk3600": {"chunk_size": 3600},
    "chunk5000": {"chunk_size": 5000},
    # the same, its k-means fitted by steps of 25,000 sample rows (benchmarks/kmeans)
    "chunk5000-spread": {"chunk_size": 5000, "kmeans_step_rows": 25_000},
}


def cut(corpus: Path, out: Path, n_shards: int, seed: int = 0) -> Path:
    """The corpus as ``n_shards`` parquet shards of random rows (seeded), written once."""
    shards = out / "shards"
    if shards.exists():
        return shards
    table = pq.read_table(corpus, columns=[ID, Q, F])
    order = np.random.default_rng(seed).permutation(table.num_rows)
    tmp = out / ".shards.tmp"
    tmp.mkdir(parents=True, exist_ok=True)
    for s in range(n_shards):
        pq.write_table(table.take(np.sort(order[s::n_shards])), tmp / f"shard-{s:03d}.parquet")
    tmp.rename(shards)
    return shards


def whole(shards: Path, out: Path) -> Path:
    """The shards as one file (what ``one`` selects from and J is scored over)."""
    path = out / "whole.parquet"
    if not path.exists():
        files = sorted(shards.glob("*.parquet"))
        table = pa.concat_tables([pq.read_table(f, columns=[ID, Q, F]) for f in files])
        pq.write_table(table, out / ".whole.tmp.parquet")
        (out / ".whole.tmp.parquet").rename(path)
    return path


def exact_j(path: Path, selected_ids: set, lamb: float = 0.5) -> dict[str, float]:
    table = pq.read_table(path, columns=[ID, Q, F])
    ids = table.column(ID).to_pylist()
    q = table.column(Q).to_numpy().astype(np.float64)
    qs = (q - q.min()) / (q.max() - q.min())
    flat = table.column(F).combine_chunks().flatten().to_numpy()
    x = torch.from_numpy(flat.reshape(table.num_rows, -1).astype(np.float32))
    x = x / x.norm(dim=1, keepdim=True)
    rows = np.asarray([i for i, v in enumerate(ids) if v in selected_ids])
    assert len(rows) == len(selected_ids), "selected ids missing from the corpus"
    s = x[torch.as_tensor(rows)]
    best = torch.empty(len(ids), dtype=torch.float64)
    for a in range(0, len(ids), 4096):
        best[a : a + 4096] = (x[a : a + 4096] @ s.T).clamp_min(0).max(1).values.double()
    quality, coverage = float(qs[rows].mean()), float(best.mean())
    return {"J": lamb * quality + (1 - lamb) * coverage, "quality": quality, "coverage": coverage}


def run_variant(name: str, shards: Path, one_file: Path, out: Path, ratio: float) -> dict:
    target = out / f"sel-{name}"
    shutil.rmtree(target, ignore_errors=True)  # a fresh run, never a resumed one
    started = time.perf_counter()
    load = os.getloadavg()[0]
    if name == "one":
        spec = SelectSpec.from_mapping({"select_ratio": ratio})
        select(str(one_file), str(target) + ".parquet", spec)
        table = pq.read_table(str(target) + ".parquet", columns=[ID, "selected"])
        ids = table.filter(table.column("selected")).column(ID).to_pylist()
        facts: dict = {}
    else:
        spec = SelectSpec.from_mapping(dict(VARIANTS[name], select_ratio=ratio))
        m = run_selection(shards, target, spec, progress=False)
        ids = pq.read_table(target / "selected", columns=[ID]).column(0).to_pylist()
        facts = {
            "n_groups": m["totals"]["n_groups"],
            "allocation": m["budget"].get("allocation"),
            "peak_rss_mb_per_worker": m["summary"]["peak_rss_mb_per_worker"],
            "global_round_s": m["totals"]["seconds"]["global"],
            "allocation_rounds": (m["budget"].get("global_round") or {}).get("rounds"),
            "driver_peak_rss_mb": m["totals"]["driver_peak_rss_mb"],
            "group_sizes": [g["n"] for g in m["groups"]],
            # what the run itself reports over every document, from its cover
            "reported_J": (m["terms"] or {}).get("J"),
            "cover_exact": m["cover"]["exact"] / m["cover"]["rows"],
        }
    wall = time.perf_counter() - started
    return {
        "variant": name,
        "k": len(ids),
        "wall_s": wall,
        "load": load,
        **facts,
        **exact_j(one_file, set(ids)),
    }


def _reported(row: dict) -> str:
    """The J a sharded run's manifest states (from its cover), and the share of rows whose
    cover is exact; "-" for the runs before it was recorded and for one file."""
    if row.get("reported_J") is None:
        return "-"
    return f"{row['reported_J']:.5f} ({100 * row['cover_exact']:.1f}%)"


def markdown() -> None:
    rows = [json.loads(line) for line in RESULTS.read_text().splitlines() if line.strip()]
    lines = [
        "# Sharded selection against one selection: exact J over every document",
        "",
        "Generated by `python benchmarks/scale/sharded_j.py` (see its docstring); do not edit.",
        "J = 0.5 * mean scaled quality of S + 0.5 * mean over every document of its best",
        "cosine to S; the learner, library defaults otherwise; select_ratio per table.",
        "",
    ]
    for corpus, ratio in dict.fromkeys((r["corpus"], r.get("select_ratio")) for r in rows):
        these = [r for r in rows if r["corpus"] == corpus and r.get("select_ratio") == ratio]
        one = next((r["J"] for r in these if r["variant"] == "one"), None)
        lines += [
            f"## {corpus}, select_ratio {ratio}",
            "",
            "| variant | code | groups | group rows min / median / max | allocation | J "
            "| J / one | quality | coverage | J the run reports (cover exact) | wall s | load |",
            "|---|---|---:|---|---|---:|---:|---:|---:|---|---:|---:|",
        ]
        for r in these:
            share = f"{100 * r['J'] / one:.2f}%" if one else "-"
            sizes = sorted(r.get("group_sizes") or [])
            spread = f"{sizes[0]:,} / {sizes[len(sizes) // 2]:,} / {sizes[-1]:,}" if sizes else "-"
            lines.append(
                f"| {r['variant']} | {r.get('code', '')} | {r.get('n_groups', 1)} | {spread} | "
                f"{r.get('allocation') or '-'} | {r['J']:.5f} | {share} | {r['quality']:.4f} | "
                f"{r['coverage']:.4f} | {_reported(r)} | {r['wall_s']:.1f} | {r['load']:.1f} |"
            )
        lines.append("")
    if NOTES.exists():
        lines.append(NOTES.read_text())
    MARKDOWN.write_text("\n".join(lines))


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--corpus", type=Path, help="one parquet file, cut into --n-shards")
    ap.add_argument("--shards", type=Path, help="a folder of shards")
    ap.add_argument("--n-shards", type=int, default=8)
    ap.add_argument("--work", type=Path, default=Path("/tmp/datamask-sharded"))
    ap.add_argument("--name", default="corpus")
    ap.add_argument("--code", default="", help="label of the code measured (e.g. a commit)")
    ap.add_argument("--variants", nargs="*", default=list(VARIANTS))
    ap.add_argument("--select-ratio", type=float, default=0.1)
    ap.add_argument("--markdown-only", action="store_true")
    args = ap.parse_args()
    if args.markdown_only:
        markdown()
        return
    args.work.mkdir(parents=True, exist_ok=True)
    shards = args.shards or cut(args.corpus, args.work, args.n_shards)
    one_file = whole(shards, args.work)
    RESULTS.parent.mkdir(parents=True, exist_ok=True)
    for name in args.variants:
        facts = run_variant(name, shards, one_file, args.work, args.select_ratio)
        row = {"corpus": args.name, "code": args.code, "select_ratio": args.select_ratio, **facts}
        print(json.dumps(row), flush=True)
        with RESULTS.open("a") as f:
            f.write(json.dumps(row) + "\n")
    markdown()


if __name__ == "__main__":
    main()
