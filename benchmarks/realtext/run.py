"""The learner against the sparse greedy (and the dense one where it fits), real text first.

    python benchmarks/realtext/run.py                       # every set, the whole grid
    python benchmarks/realtext/run.py --sets demo shared --ratios 0.1 --lambs 0.5
    python benchmarks/realtext/run.py --markdown-only       # rebuild RESULTS.md from results/

Sets: ``realtext`` (the 50k real-text corpus; ``--corpus``, built by
``benchmarks/realtext/build_corpus.py`` when missing), ``demo`` (examples/demo, 3,000 Debian
package descriptions), ``shared`` (../shared/data/demo_docs.parquet, 2,077 docs) and
``clustered`` (``make_clustered(10000, 384, 50)``). For every select_ratio the K-NN graph is
built once (K from the ratio, the default search) and handed to every selector and
objective of that ratio, so the learner and the sparse greedy use the same graph; its build
time is charged to both ("graph s"). ``greedy-dense`` runs where the n x n matrix fits
(``--dense-max``). Each selector runs in this one process, one after another, with the same
thread count; "CPU s" is the process' CPU time over graph build + fit; peak RSS is what the
fit added (``datamask.evaluate.bench.measure_peak_rss``). Rows append to
``results/<set>.jsonl`` as they finish (a rerun skips rows already there) and RESULTS.md is
rebuilt from them.
"""

from __future__ import annotations

# isort: off
import datamask  # noqa: F401  (first: it makes idle OpenMP threads sleep before torch loads)

# isort: on
import argparse
import json
import os
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import numpy as np
import pyarrow.parquet as pq
import torch

from datamask import make_clustered
from datamask._device import set_threads
from datamask.data import Corpus
from datamask.evaluate.bench import _cpu_seconds, measure_peak_rss
from datamask.io.parquet import read_corpus
from datamask.neighbors import knn_graph, resolve_knn, sampled_recall
from datamask.objectives import Objective, make_diversity
from datamask.objectives.facility_location import neighbors_for_ratio
from datamask.selectors import make_selector

HERE = Path(__file__).resolve().parent
ROOT = HERE.parents[1]
DEFAULT_CORPUS = HERE / "data" / "realtext.parquet"
SHARED = ROOT.parent / "shared" / "data" / "demo_docs.parquet"
OBJECTIVES = {
    "Facility": ["Facility"],
    "Pair_simi": ["Pair_simi"],
    "Facility+DiSF": ["Facility", "DiSF"],
}
SET_NAMES = ("realtext", "demo", "shared", "clustered")


def load_set(name: str, corpus_path: Path, clustered_n: int) -> Corpus | None:
    if name == "realtext":
        if not corpus_path.exists():
            builder = HERE / "build_corpus.py"
            if not builder.exists():
                print(f"realtext: {corpus_path} missing and no {builder.name}; skipped")
                return None
            subprocess.run([sys.executable, str(builder), "--out", str(corpus_path)], check=True)
        corpus = read_corpus(corpus_path)
        meta = pq.read_schema(corpus_path).metadata or {}
        info = json.loads(meta.get(b"datamask.realtext", b"{}"))
        if info.get("partial"):
            corpus.source = (
                f"real-text corpus, partial snapshot: {corpus.n_docs} of "
                f"{info.get('rows_total')} documents (a uniform random sample)"
            )
        else:
            corpus.source = "real-text corpus (benchmarks/realtext/build_corpus.py)"
        return corpus
    if name == "demo":
        return read_corpus(ROOT / "examples" / "demo" / "demo_docs.parquet")
    if name == "shared":
        if not SHARED.exists():
            print(f"shared: {SHARED} missing; skipped")
            return None
        return read_corpus(SHARED, id_col="id", feature_col="embedding")
    corpus = make_clustered(clustered_n, 384, 50, seed=0)
    corpus.source = f"make_clustered({clustered_n}, 384, 50, seed=0)"
    return corpus


def build_graph(x: torch.Tensor, kk: int, knn: str, n_probe: int | None) -> dict[str, Any]:
    method = resolve_knn(knn, x.shape[0], x.device)
    cpu0, t0 = _cpu_seconds(), time.perf_counter()
    idx, sim = knn_graph(x, kk, method=method, n_probe=n_probe)
    seconds, cpu = time.perf_counter() - t0, _cpu_seconds() - cpu0
    return {
        "graph": (idx, sim.clamp_min(0.0)),
        "method": method,
        "K": kk,
        "seconds": seconds,
        "cpu": cpu,
        "recall": sampled_recall(x, idx, n_rows=200),
    }


def run_one(
    corpus: Corpus, method: str, names: list[str], lamb: float, ratio: float, g: dict, seed: int
) -> dict[str, Any]:
    terms = [
        make_diversity(a, n_neighbors=g["K"], graph=g["graph"])
        if a == "Facility"
        else make_diversity(a)
        for a in names
    ]
    selector = make_selector(
        method, objective=Objective(terms, lamb=lamb), select_ratio=ratio, seed=seed, device="cpu"
    )
    cpu0 = _cpu_seconds()
    _, memory = measure_peak_rss(lambda: selector.fit(corpus))
    cpu = _cpu_seconds() - cpu0
    uses_graph = "Facility" in names and method != "greedy-dense"
    graph_s = g["seconds"] if uses_graph else 0.0
    return {
        "method": method,
        "J": float(selector.terms_["J"]),
        "terms": {k: float(v) for k, v in selector.terms_.items()},
        "graph_s": graph_s,
        "optimise_s": float(selector.fit_seconds_),
        "total_s": graph_s + float(selector.fit_seconds_),
        "cpu_s": cpu + (g["cpu"] if uses_graph else 0.0),
        "peak_mb": memory["peak_mb"],
        "swaps": getattr(selector, "swaps_", None),
        "refine_s": getattr(selector, "refine_seconds_", None),
    }


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--corpus", type=Path, default=DEFAULT_CORPUS)
    p.add_argument("--sets", nargs="+", choices=SET_NAMES, default=list(SET_NAMES))
    p.add_argument("--ratios", nargs="+", type=float, default=[0.01, 0.05, 0.1, 0.3])
    p.add_argument("--lambs", nargs="+", type=float, default=[0.2, 0.5, 0.8])
    p.add_argument("--objectives", nargs="+", choices=list(OBJECTIVES), default=list(OBJECTIVES))
    p.add_argument("--clustered-n", type=int, default=10_000)
    p.add_argument("--dense-max", type=int, default=20_000, help="largest N for greedy-dense")
    p.add_argument(
        "--disf-greedy-budget",
        type=float,
        default=1.5e11,
        help="skip the greedy on Facility+DiSF when n * k * d^2 exceeds this (its gains cost "
        "O(n d^2) a pick)",
    )
    p.add_argument("--knn", default="auto")
    p.add_argument("--n-probe", type=int, default=None)
    p.add_argument("--threads", type=int, default=None)
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--out", type=Path, default=HERE / "results")
    p.add_argument("--markdown", type=Path, default=HERE / "RESULTS.md", help="markdown to write")
    p.add_argument("--markdown-only", action="store_true")
    args = p.parse_args(argv)
    args.out.mkdir(parents=True, exist_ok=True)
    if not args.markdown_only:
        threads = set_threads(args.threads)
        for name in args.sets:
            run_set(name, args, threads)
    write_markdown(args.out, args.markdown)
    return 0


def run_set(name: str, args: argparse.Namespace, threads: int) -> None:
    corpus = load_set(name, args.corpus, args.clustered_n)
    if corpus is None:
        return
    from datamask._validation import check_corpus

    check_corpus(corpus)
    path = args.out / f"{name}.jsonl"
    done = set()
    if path.exists():
        for line in path.read_text().splitlines():
            r = json.loads(line)
            done.add((r["ratio"], r["objective"], r["lamb"], r["method"]))
    x = torch.as_tensor(corpus.features)
    n, d = corpus.features.shape
    for ratio in args.ratios:
        k = round(ratio * n)
        todo = [
            (obj, lamb)
            for obj in args.objectives
            for lamb in args.lambs
            if any((ratio, obj, lamb, m) not in done for m in ("greedy", "mask"))
        ]
        if not todo:
            continue
        g = build_graph(x, neighbors_for_ratio(k, n), args.knn, args.n_probe)
        print(
            f"{name} ratio={ratio}: graph {g['method']} K={g['K']} {g['seconds']:.1f}s "
            f"recall@K={g['recall']:.3f}",
            flush=True,
        )
        for obj, lamb in todo:
            names = OBJECTIVES[obj]
            methods = ["greedy", "mask"]
            if "Facility" in names and n <= args.dense_max:
                methods.append("greedy-dense")
            for method in methods:
                if (ratio, obj, lamb, method) in done:
                    continue
                row = {
                    "set": name,
                    "source": corpus.source,
                    "n": n,
                    "d": d,
                    "k": k,
                    "ratio": ratio,
                    "objective": obj,
                    "lamb": lamb,
                    "threads": threads,
                    "graph_method": g["method"],
                    "K": g["K"],
                    "recall": g["recall"],
                    "load_before": os.getloadavg()[0],
                }
                if method != "mask" and "DiSF" in names and n * k * d * d > args.disf_greedy_budget:
                    row.update(method=method, skipped=f"n*k*d^2 = {n * k * d * d:.1e} over budget")
                else:
                    row.update(run_one(corpus, method, names, lamb, ratio, g, args.seed))
                row["load_after"] = os.getloadavg()[0]
                with path.open("a") as f:
                    f.write(json.dumps(row) + "\n")
                j = row.get("J", float("nan"))
                print(
                    f"  {obj:<14} lamb={lamb} {method:<13} J={j:.5f} "
                    f"total={row.get('total_s', float('nan')):.2f}s",
                    flush=True,
                )
    write_markdown(args.out, args.markdown)


def _fmt(v: Any, spec: str) -> str:
    return "-" if v is None or (isinstance(v, float) and not np.isfinite(v)) else format(v, spec)


def write_markdown(results: Path, target: Path) -> None:
    """RESULTS.md from every ``results/*.jsonl``: one table per set, real text first."""
    lines = [
        "# The learner against the sparse greedy, real text first",
        "",
        "Generated by `python benchmarks/realtext/run.py` (see its docstring); do not edit.",
        "J is the exact objective (facility location over all pairs) of each selection; "
        "`J / sparse greedy` divides by the J of `greedy` (lazy greedy on the same K-NN graph) "
        "at the same setting. graph s: the shared graph build (charged to every method that "
        "uses it); optimise s: the selector's fit with the graph given; CPU s: process CPU "
        "seconds of both; peak MB: resident memory the fit added.",
        "",
    ]
    rows: list[dict[str, Any]] = []
    for name in SET_NAMES:
        path = results / f"{name}.jsonl"
        if path.exists():
            rows += [json.loads(s) for s in path.read_text().splitlines() if s.strip()]
    if not rows:
        lines.append("No results yet.")
    summary: list[str] = []
    for name in SET_NAMES:
        mine = [r for r in rows if r["set"] == name]
        if not mine:
            continue
        first = mine[0]
        loads = [r["load_after"] for r in mine if "load_after" in r]
        lines += [
            f"## {name}: {first['source']} (N={first['n']}, d={first['d']})",
            "",
            f"{first['threads']} threads; 1-minute load average during the runs "
            f"{min(loads):.1f}-{max(loads):.1f}.",
            "",
            "| ratio | objective | lamb | method | J | J / sparse greedy | graph s | optimise s "
            "| total s | CPU s | peak MB | K | graph | recall@K |",
            "|---:|---|---:|---|---:|---:|---:|---:|---:|---:|---:|---:|---|---:|",
        ]
        by = {(r["ratio"], r["objective"], r["lamb"], r["method"]): r for r in mine}
        wins = losses = 0
        worst = None
        for key, r in by.items():
            ratio, obj, lamb, method = key
            ref = by.get((ratio, obj, lamb, "greedy"))
            rel = r["J"] / ref["J"] if ref is not None and "J" in ref and "J" in r else float("nan")
            if method == "mask" and np.isfinite(rel):
                dense = by.get((ratio, obj, lamb, "greedy-dense"))
                ok = rel >= 1.0 and (dense is None or r["J"] >= dense["J"])
                wins += ok
                losses += not ok
                worst = rel if worst is None else min(worst, rel)
            label = method + (f" ({r['skipped']})" if "skipped" in r else "")
            lines.append(
                f"| {ratio} | {obj} | {lamb} | {label} | {_fmt(r.get('J'), '.5f')} | "
                f"{_fmt(100 * rel, '.3f')}% | {_fmt(r.get('graph_s'), '.2f')} | "
                f"{_fmt(r.get('optimise_s'), '.2f')} | {_fmt(r.get('total_s'), '.2f')} | "
                f"{_fmt(r.get('cpu_s'), '.1f')} | {_fmt(r.get('peak_mb'), '.0f')} | {r['K']} | "
                f"{r['graph_method']} | {_fmt(r['recall'], '.3f')} |"
            )
        lines.append("")
        summary.append(
            f"- {name}: learner >= sparse greedy (and >= dense greedy where run) in {wins} of "
            f"{wins + losses} settings; lowest learner J / sparse greedy "
            f"{_fmt(100 * worst if worst is not None else None, '.3f')}%."
        )
    head = 5  # title, blank, two lines of explanation, blank: the summary goes after them
    body = lines[:head] + ["## Summary", "", *summary, ""] + lines[head:]
    target.write_text("\n".join(body) + "\n")


if __name__ == "__main__":
    sys.exit(main())
