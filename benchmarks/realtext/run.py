"""The learner against the sparse greedy (and the dense one where it fits), real text first.

    python benchmarks/realtext/run.py                       # every set, the whole grid
    python benchmarks/realtext/run.py --sets demo shared --ratios 0.1 --lambs 0.5
    python benchmarks/realtext/run.py --markdown-only       # rebuild RESULTS.md from results/
    python benchmarks/realtext/run.py --speed --threads 1 2 # the speed table (issue 19)

``--speed`` is the table of "never slower than greedy" (RESULTS.md's speed section):
every set x ratio x lamb x objective x thread count, the learner at its own default graph
(K capped at ``LEARNER_MAX_NEIGHBORS``) against the lazy greedy at *its* default graph (K
from the ratio, up to 1024) and, where the two K differ, the greedy on the learner's graph
too (``greedy@learner-K``). Each graph is built and timed once per ratio and thread count
and charged to the methods that use it; J is always the exact objective. Sets add
``sample15k`` (a seeded 15,000-document sample of the real-text corpus).

Sets: ``realtext`` (the 50k real-text corpus; ``--corpus``, built by
``benchmarks/realtext/build_corpus.py`` when missing), ``demo`` (examples/demo, 3,000 Debian
package descriptions), ``shared`` (../shared/data/demo_docs.parquet, 2,077 docs) and
``clustered`` (``make_clustered(10000, 384, 50)``). For every select_ratio the K-NN graph is
built once (K from the ratio, the default search) and handed to every selector and
objective of that ratio, so the learner and the sparse greedy use the same graph; its build
time is charged to both ("graph s"). ``greedy-dense`` runs where the n x n matrix fits
(``--dense-max``). Each selector runs in this one process, one after another, with the same
thread count; "CPU s" is the process' CPU time over graph build + fit; peak RSS is what the
fit added (``datamask.measure.measure_peak_rss``). Rows are recorded as they finish in
``results/<date>-<machine>-grid-<set>.json`` (``-speed-<set>`` with ``--speed``,
``-speed-memory`` with ``--memory``; the commit inside, ``benchmarks/_lib/ledger.py``); a
rerun on the same day skips the rows already there. RESULTS.md's ``grid`` (or ``speed``)
section is rebuilt from every such file of ``results/``; the text around it is by hand.
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

import torch
from grid import DEFAULT_CORPUS, HERE, OBJECTIVES, SET_NAMES, load_set, unit_features
from result_tables import write_markdown, write_speed_markdown

from datamask.data import Corpus
from datamask.measure import cpu_seconds, measure_peak_rss, set_threads
from datamask.neighbors import knn_graph, resolve_knn, sampled_recall
from datamask.objectives import Objective, make_term
from datamask.objectives.facility_location import LEARNER_MAX_NEIGHBORS, neighbors_for_ratio
from datamask.selectors import make_selector

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "_lib"))
from ledger import result_path, run_record, write_json  # noqa: E402


class Record:
    """One run's result file: its rows so far, rewritten whole after each new row."""

    def __init__(self, study: Path, what: str) -> None:
        self.path = result_path(study, what)
        old = json.loads(self.path.read_text()) if self.path.exists() else {}
        self.rows: list[dict[str, Any]] = old.get("rows", [])

    def add(self, row: dict[str, Any]) -> None:
        self.rows.append(row)
        write_json(self.path, {**run_record(), "rows": self.rows})


def build_graph(x: torch.Tensor, kk: int, knn: str, n_probe: int | None) -> dict[str, Any]:
    method = resolve_knn(knn, x.shape[0], x.device)
    cpu0, t0 = cpu_seconds(), time.perf_counter()
    (idx, sim), memory = measure_peak_rss(lambda: knn_graph(x, kk, method=method, n_probe=n_probe))
    seconds, cpu = time.perf_counter() - t0, cpu_seconds() - cpu0
    return {
        "graph": (idx, sim.clamp_min(0.0)),
        "method": method,
        "K": kk,
        "seconds": seconds,
        "cpu": cpu,
        "recall": sampled_recall(x, idx, n_rows=200),
        # held while the selector runs: int64 indices + float32 similarities
        "graph_mb": (idx.element_size() + sim.element_size()) * idx.numel() / 2**20,
        "build_peak_mb": memory["peak_mb"],
    }


def run_one(
    corpus: Corpus, method: str, names: list[str], lamb: float, ratio: float, g: dict, seed: int
) -> dict[str, Any]:
    terms = [
        make_term(a, n_neighbors=g["K"], graph=g["graph"]) if a == "Facility" else make_term(a)
        for a in names
    ]
    selector = make_selector(
        method.split("@")[0],
        objective=Objective(terms, lamb=lamb),
        select_ratio=ratio,
        seed=seed,
        device="cpu",
    )
    cpu0 = cpu_seconds()
    _, memory = measure_peak_rss(lambda: selector.fit(corpus))
    cpu = cpu_seconds() - cpu0
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
        "graph_mb": g["graph_mb"] if uses_graph else 0.0,
        "swaps": getattr(selector, "swaps_", None),
        "refine_s": getattr(selector, "refine_seconds_", None),
        "steps": getattr(selector, "n_epochs_", None),
    }


def probe_memory(corpus: Corpus, method: str, ratio: float, seed: int) -> dict[str, Any]:
    """In a fresh process: what fitting ``method`` (Facility, lamb 0.5) at its own default
    graph, the build included, adds to the resident memory of a process that holds the
    embeddings (VmHWM, ``measure_peak_rss``)."""
    selector = make_selector(
        method, algorithm="Facility", lamb=0.5, select_ratio=ratio, seed=seed, device="cpu"
    )
    _, memory = measure_peak_rss(lambda: selector.fit(corpus))
    term = selector.objective_.terms[-1][1]
    return {"peak_mb": memory["peak_mb"], "K": int(term.n_neighbors_), "n": corpus.n_docs}


def run_memory(args: argparse.Namespace) -> None:
    """One fresh process per set x ratio x method (``--probe``), rows to
    ``results/<date>-<machine>-speed-memory.json``."""
    record = Record(args.out, "speed-memory")
    done = {(r["set"], r["ratio"], r["method"]) for r in record.rows}
    for name in args.sets:
        for ratio in args.ratios:
            for method in ("greedy", "mask"):
                if (name, ratio, method) in done:
                    continue
                cmd = [sys.executable, __file__, "--probe", name, str(ratio), method]
                cmd += ["--corpus", str(args.corpus), "--threads", str(args.threads[0] or 1)]
                out = subprocess.run(cmd, check=True, capture_output=True, text=True).stdout
                row = {"set": name, "ratio": ratio, "method": method}
                row.update(json.loads(out.strip().splitlines()[-1]))
                record.add(row)
                print(f"memory {name} ratio={ratio} {method}: {row['peak_mb']:.0f} MB", flush=True)


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--corpus", type=Path, default=DEFAULT_CORPUS)
    p.add_argument("--sets", nargs="+", choices=SET_NAMES, default=None)
    p.add_argument("--ratios", nargs="+", type=float, default=[0.01, 0.05, 0.1, 0.3])
    p.add_argument("--lambs", nargs="+", type=float, default=[0.2, 0.5, 0.8])
    p.add_argument("--objectives", nargs="+", choices=list(OBJECTIVES), default=list(OBJECTIVES))
    p.add_argument("--clustered-n", type=int, default=10_000)
    p.add_argument(
        "--dense-max",
        type=int,
        default=None,
        help="largest N for greedy-dense (default 20000; 0 with --speed)",
    )
    p.add_argument(
        "--disf-greedy-budget",
        type=float,
        default=1.5e11,
        help="skip the greedy on Facility+DiSF when n * k * d^2 exceeds this (its gains cost "
        "O(n d^2) a pick)",
    )
    p.add_argument("--knn", default="auto")
    p.add_argument("--n-probe", type=int, default=None)
    p.add_argument(
        "--threads", type=int, nargs="+", default=[None], help="thread counts, each in turn"
    )
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--speed", action="store_true", help="the speed table (RESULTS.md's speed)")
    p.add_argument(
        "--out", type=Path, default=HERE, help="study folder whose results/ records the run"
    )
    p.add_argument(
        "--markdown", type=Path, default=None, help="page of the grid or speed section (RESULTS.md)"
    )
    p.add_argument("--markdown-only", action="store_true")
    p.add_argument(
        "--memory",
        action="store_true",
        help="with --speed: the peak memory of each method at each ratio, graph build "
        "included, one fresh process each (results/*-speed-memory.json)",
    )
    p.add_argument("--probe", nargs=3, metavar=("SET", "RATIO", "METHOD"), help=argparse.SUPPRESS)
    args = p.parse_args(argv)
    if args.probe:  # a fresh process for one memory figure (run_memory)
        set_threads(args.threads[0])
        name, ratio, method = args.probe
        corpus = unit_features(load_set(name, args.corpus, args.clustered_n))
        print(json.dumps(probe_memory(corpus, method, float(ratio), args.seed)))
        return 0
    if args.sets is None:
        args.sets = [s for s in SET_NAMES if s != "clustered"] if args.speed else list(SET_NAMES)
    if args.dense_max is None:
        args.dense_max = 0 if args.speed else 20_000
    args.markdown = args.markdown or args.out / "RESULTS.md"
    writer = write_speed_markdown if args.speed else write_markdown
    if args.memory and not args.markdown_only:
        run_memory(args)
    elif not args.markdown_only:
        for name in args.sets:
            for wanted in args.threads:
                run_set(name, args, set_threads(wanted))
                writer(args.out, args.markdown)
    writer(args.out, args.markdown)
    return 0


def run_set(name: str, args: argparse.Namespace, threads: int) -> None:
    """Every ratio x objective x lamb of one set at one thread count; for each ratio the
    greedy's default graph and the learner's (K capped at LEARNER_MAX_NEIGHBORS) are built
    once, the same graph when the two K agree."""
    corpus = load_set(name, args.corpus, args.clustered_n)
    if corpus is None:
        return
    unit_features(corpus)
    record = Record(args.out, f"{'speed' if args.speed else 'grid'}-{name}")
    done = {(r["ratio"], r["objective"], r["lamb"], r["method"], r["threads"]) for r in record.rows}
    x = torch.as_tensor(corpus.features)
    n, d = corpus.features.shape
    for ratio in args.ratios:
        k = round(ratio * n)
        k_greedy = neighbors_for_ratio(k, n)
        k_mask = neighbors_for_ratio(k, n, LEARNER_MAX_NEIGHBORS)
        methods = ["greedy", "mask"]
        if k_mask != k_greedy:
            methods.append("greedy@learner-K")
        todo = [
            (obj, lamb)
            for obj in args.objectives
            for lamb in args.lambs
            if any((ratio, obj, lamb, m, threads) not in done for m in methods)
        ]
        if not todo:
            continue
        graphs = {"greedy": build_graph(x, k_greedy, args.knn, args.n_probe)}
        if k_mask != k_greedy:
            graphs["mask"] = build_graph(x, k_mask, args.knn, args.n_probe)
        else:
            graphs["mask"] = graphs["greedy"]
        graphs["greedy@learner-K"] = graphs["greedy-dense"] = graphs["mask"]
        for who in ("greedy", "mask"):
            g = graphs[who]
            print(
                f"{name} ratio={ratio} threads={threads}: {who} graph {g['method']} K={g['K']} "
                f"{g['seconds']:.1f}s recall@K={g['recall']:.3f}",
                flush=True,
            )
        for obj, lamb in todo:
            names = OBJECTIVES[obj]
            wanted = list(methods)
            if "Facility" in names and n <= args.dense_max:
                wanted.append("greedy-dense")
            if "Facility" not in names:  # no graph: the greedy at the learner's K is the greedy
                wanted = [m for m in wanted if m != "greedy@learner-K"]
            for method in wanted:
                if (ratio, obj, lamb, method, threads) in done:
                    continue
                g = graphs[method]
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
                    "build_peak_mb": g["build_peak_mb"],
                    "load_before": os.getloadavg()[0],
                }
                if method != "mask" and "DiSF" in names and n * k * d * d > args.disf_greedy_budget:
                    row.update(method=method, skipped=f"n*k*d^2 = {n * k * d * d:.1e} over budget")
                else:
                    row.update(run_one(corpus, method, names, lamb, ratio, g, args.seed))
                row["load_after"] = os.getloadavg()[0]
                record.add(row)
                j = row.get("J", float("nan"))
                print(
                    f"  {obj:<14} lamb={lamb} {method:<17} J={j:.5f} "
                    f"total={row.get('total_s', float('nan')):.2f}s",
                    flush=True,
                )


if __name__ == "__main__":
    sys.exit(main())
