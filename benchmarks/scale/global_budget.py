"""Per-group vs global budget vs one global selection: J over the whole corpus, redundancy, cost.

    # one selection per call (each in its own process, so its peak RSS is its own)
    python benchmarks/scale/global_budget.py run --data /tmp/datamask-scale/200k \
        --out /tmp/datamask-scale/sel-200k-group --budget group --workers 2
    python benchmarks/scale/global_budget.py run --data /tmp/datamask-scale/200k \
        --out /tmp/datamask-scale/sel-200k-global --budget global --oversample 2 --workers 2
    python benchmarks/scale/global_budget.py run --data /tmp/datamask-scale/200k \
        --out /tmp/datamask-scale/sel-200k-single --budget single
    # then score them all on one seeded sample
    python benchmarks/scale/global_budget.py evaluate --data /tmp/datamask-scale/200k \
        --selections /tmp/datamask-scale/sel-200k-* --sample 20000 \
        --results /tmp/datamask-scale/eval-200k.json
    # the two-shard skew case
    python benchmarks/scale/global_budget.py skew --out /tmp/datamask-scale/skew

``run`` selects with the library defaults of ``datamask select`` (mask learner, expected
estimator, 300 steps, facility location on a K=128 graph, lamb 0.5, select_ratio 0.1,
seed 0); ``group`` and ``global`` run :func:`datamask.distributed.run_selection` on a
local process pool; ``single`` reads the whole corpus into one process and fits one
learner (the reference a sharded run is compared with). Every run writes
``OUT/figures.json`` (seconds, docs/s, peak RSS, load average before and after).

``evaluate`` computes, for every selection S, the objective over the *whole* corpus:
``J = lamb * Quality(S) + (1 - lamb) * Facility(S)``, Quality the mean corpus-wide
min-max scaled quality of S (exact), Facility ``mean_i max(0, max_{j in S} cos(x_i, x_j))``
estimated on a seeded uniform sample of documents i (the same sample for every selection,
so differences are paired), with its standard error; and the near-duplicate pairs
(cosine > 0.95) inside S, counted exactly.
"""

from __future__ import annotations

import argparse
import glob
import json
import os
import resource
import time
from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import torch

from datamask.config import SelectSpec
from datamask.distributed import LocalRunner, run_selection
from datamask.io.shards import inspect_shards, list_shards, read_rows

ID, Q, F = "chunk_id", "quality_score", "feature_arr"


def _rss_mb() -> float:
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024.0


def _load() -> list[float]:
    return [round(x, 2) for x in os.getloadavg()]


def _features(table: pa.Table) -> np.ndarray:
    col = table.column(F).combine_chunks()
    width = col.type.list_size
    x = col.values.to_numpy().reshape(-1, width).astype(np.float32)
    return x / np.linalg.norm(x, axis=1, keepdims=True)


def cmd_run(args: argparse.Namespace) -> None:
    out = Path(args.out)
    load_before = _load()
    started = time.perf_counter()
    if args.budget == "single":
        from datamask import Corpus

        files = list_shards(args.data)
        tables = [pq.read_table(f, columns=[ID, Q, F]) for f in files]
        ids = np.concatenate([t.column(ID).to_numpy(zero_copy_only=False) for t in tables])
        quality = np.concatenate([t.column(Q).to_numpy() for t in tables])
        feats = np.concatenate([_features(t) for t in tables])
        del tables
        corpus = Corpus(ids=ids, quality=quality, features=feats)
        read_s = time.perf_counter() - started
        spec = SelectSpec.from_mapping(dict(select_ratio=args.select_ratio))
        learner = spec.make_selector()
        learner.fit(corpus)
        out.mkdir(parents=True, exist_ok=True)
        pq.write_table(pa.table({ID: pa.array(ids[learner.selected_])}), out / "selected.parquet")
        wall = time.perf_counter() - started
        figures = {
            "budget": "single",
            "n_docs": corpus.n_docs,
            "k": len(learner.selected_),
            "seconds": {"read": read_s, "wall": wall},
            "docs_per_second": corpus.n_docs / wall,
            "peak_rss_mb_per_worker": _rss_mb(),
            "terms_own_graph": {k: float(v) for k, v in learner.terms_.items()},
        }
    else:
        settings = SelectSpec.from_mapping(
            dict(select_ratio=args.select_ratio, budget=args.budget, oversample=args.oversample)
        )
        runner = LocalRunner(workers=args.workers)
        try:
            m = run_selection(args.data, out, settings, runner=runner, progress=args.progress)
        finally:
            runner.close()
        wall = time.perf_counter() - started
        t, s = m["totals"], m["summary"]
        rss = [s["peak_rss_mb_per_worker"], s.get("peak_rss_mb_global_round") or 0]
        figures = {
            "budget": args.budget,
            "oversample": args.oversample if args.budget == "global" else None,
            "n_docs": t["n_docs"],
            "n_groups": t["n_groups"],
            "k": t["k"],
            "candidates": m["budget"]["candidates"],
            "seconds": {**t["seconds"], "wall": wall},
            "docs_per_second": t["n_docs"] / wall,
            "group_seconds": s["group_seconds"],
            "peak_rss_mb_group_worker": s["peak_rss_mb_per_worker"],
            "peak_rss_mb_global_round": s.get("peak_rss_mb_global_round"),
            "peak_rss_mb_per_worker": max(rss),
            "driver_peak_rss_mb": t["driver_peak_rss_mb"],
            "workers": args.workers,
        }
    figures["load_before"], figures["load_after"] = load_before, _load()
    (out / "figures.json").write_text(json.dumps(figures, indent=2))
    print(json.dumps(figures, indent=2))


def _selected_ids(sel: Path) -> set:
    path = sel / "selected.parquet" if (sel / "selected.parquet").exists() else sel / "selected"
    return set(pq.read_table(path, columns=[ID]).column(ID).to_pylist())


def cmd_evaluate(args: argparse.Namespace) -> None:
    torch.set_num_threads(max(1, len(os.sched_getaffinity(0))))
    files = list_shards(args.data)
    infos = inspect_shards(files)
    n_total = sum(i.num_rows for i in infos)
    rng = np.random.default_rng(args.seed)
    sample = np.sort(rng.choice(n_total, size=min(args.sample, n_total), replace=False))
    paths = sorted({p for pattern in args.selections for p in glob.glob(pattern)})
    chosen = {p: _selected_ids(Path(p)) for p in paths}
    # One streaming pass: the corpus-wide quality range, each selection's raw quality and
    # features, and the sampled documents' features.
    lo, hi = np.inf, -np.inf
    q_sel: dict[str, list] = {p: [] for p in paths}
    x_sel: dict[str, list] = {p: [] for p in paths}
    x_sample = []
    offset = 0
    for info in infos:
        t = read_rows(info.path, 0, info.num_rows, [ID, Q, F])
        ids = t.column(ID).to_pylist()
        q = t.column(Q).to_numpy()
        x = _features(t)
        lo, hi = min(lo, q.min()), max(hi, q.max())
        here = sample[(sample >= offset) & (sample < offset + len(ids))] - offset
        x_sample.append(x[here])
        for p in paths:
            rows = np.fromiter((i for i, d in enumerate(ids) if d in chosen[p]), dtype=np.int64)
            q_sel[p].append(q[rows])
            x_sel[p].append(x[rows])
        offset += len(ids)
    xs = torch.from_numpy(np.concatenate(x_sample))
    results = {"n_docs": n_total, "sample": len(sample), "seed": args.seed, "selections": {}}
    cover: dict[str, np.ndarray] = {}
    for p in paths:
        started = time.perf_counter()
        xq = torch.from_numpy(np.concatenate(x_sel[p]))
        quality = float(((np.concatenate(q_sel[p]) - lo) / (hi - lo)).mean())
        best = torch.full((len(xs),), -1.0)
        for a in range(0, len(xq), 8192):  # max similarity to S, tile by tile
            best = torch.maximum(best, (xs @ xq[a : a + 8192].T).max(dim=1).values)
        c = best.clamp_min(0).numpy().astype(np.float64)
        cover[p] = c
        facility = float(c.mean())
        se = float(c.std(ddof=1) / np.sqrt(len(c)))
        from datamask.evaluation.redundancy import redundancy

        dup = redundancy(xq, thresholds=[0.95], method="exact")
        j = args.lamb * quality + (1 - args.lamb) * facility
        results["selections"][p] = {
            "k": len(xq),
            "quality": quality,
            "facility": facility,
            "facility_se": se,
            "J": j,
            "J_se": (1 - args.lamb) * se,
            "near_dup_pairs_095": dup["thresholds"]["0.95"]["pairs"],
            "seconds": time.perf_counter() - started,
        }
        print(p, json.dumps(results["selections"][p]))
    # paired differences against the reference (the first selection whose name has "single")
    ref = next((p for p in paths if "single" in Path(p).name), None)
    if ref is not None:
        for p in paths:
            r = results["selections"][p]
            d = (1 - args.lamb) * (cover[p] - cover[ref])
            r["J_ratio_to_single"] = r["J"] / results["selections"][ref]["J"]
            r["J_diff_to_single"] = r["J"] - results["selections"][ref]["J"]
            r["J_diff_se"] = float(d.std(ddof=1) / np.sqrt(len(d)))
    results["load_after"] = _load()
    if args.results:
        Path(args.results).write_text(json.dumps(results, indent=2))


def cmd_skew(args: argparse.Namespace) -> None:
    """Two shards of 1,000 similar documents: one scored in [0, 1], the other in [9, 10]."""
    from datamask import make_clustered

    root = Path(args.out) / "in"
    root.mkdir(parents=True, exist_ok=True)
    c = make_clustered(2000, 64, 8, seed=0)
    rng = np.random.default_rng(0)
    for s, lo in enumerate([0.0, 9.0]):
        rows = slice(s * 1000, (s + 1) * 1000)
        feats = np.asarray(c.features[rows], dtype=np.float32)
        pq.write_table(
            pa.table(
                {
                    ID: pa.array([f"s{s}-{i:04d}" for i in range(1000)]),
                    Q: pa.array(lo + rng.random(1000)),
                    F: pa.FixedSizeListArray.from_arrays(pa.array(feats.reshape(-1)), 64),
                }
            ),
            root / f"part-{s:05d}.parquet",
        )
    rows = {}
    for budget in ("group", "global"):
        out = Path(args.out) / budget
        run_selection(
            root,
            out,
            SelectSpec.from_mapping(dict(select_ratio=0.5, budget=budget)),
            progress=False,
        )
        ids = pq.read_table(out / "selected").column(ID).to_pylist()
        rows[budget] = {
            "k": len(ids),
            "from_low_0_1": sum(i.startswith("s0") for i in ids),
            "from_high_9_10": sum(i.startswith("s1") for i in ids),
        }
    print(json.dumps(rows, indent=2))
    (Path(args.out) / "skew.json").write_text(json.dumps(rows, indent=2))


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    sub = p.add_subparsers(dest="cmd", required=True)
    r = sub.add_parser("run")
    r.add_argument("--data", required=True)
    r.add_argument("--out", required=True)
    r.add_argument("--budget", choices=["group", "global", "single"], required=True)
    r.add_argument("--oversample", type=float, default=2.0)
    r.add_argument("--select-ratio", type=float, default=0.1)
    r.add_argument("--workers", type=int, default=2)
    r.add_argument("--progress", action="store_true")
    e = sub.add_parser("evaluate")
    e.add_argument("--data", required=True)
    e.add_argument("--selections", nargs="+", required=True)
    e.add_argument("--sample", type=int, default=20_000)
    e.add_argument("--seed", type=int, default=0)
    e.add_argument("--lamb", type=float, default=0.5)
    e.add_argument("--results")
    k = sub.add_parser("skew")
    k.add_argument("--out", required=True)
    args = p.parse_args()
    {"run": cmd_run, "evaluate": cmd_evaluate, "skew": cmd_skew}[args.cmd](args)


if __name__ == "__main__":
    main()
