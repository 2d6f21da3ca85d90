"""The learner against the sparse greedy (and the dense one where it fits), real text first.

    python benchmarks/realtext/run.py                       # every set, the whole grid
    python benchmarks/realtext/run.py --sets demo shared --ratios 0.1 --lambs 0.5
    python benchmarks/realtext/run.py --markdown-only       # rebuild RESULTS.md from results/
    python benchmarks/realtext/run.py --speed --threads 1 2 # SPEED.md: the speed table (issue 19)

``--speed`` is the table of "never slower than greedy" (``benchmarks/realtext/SPEED.md``):
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

from datamask import Columns, make_clustered
from datamask._device import set_threads
from datamask._memory import cpu_seconds, measure_peak_rss
from datamask.data import Corpus
from datamask.io.parquet import read_corpus
from datamask.neighbors import knn_graph, resolve_knn, sampled_recall
from datamask.objectives import Objective, make_term
from datamask.objectives.facility_location import LEARNER_MAX_NEIGHBORS, neighbors_for_ratio
from datamask.selectors import make_selector

HERE = Path(__file__).resolve().parent
ROOT = HERE.parents[1]
SHARED_DATA = ROOT.parent / "shared" / "data"
SHARED = SHARED_DATA / "demo_docs.parquet"
# The shared copy of the corpus when there is one, else where build_corpus.py writes it.
DEFAULT_CORPUS = (
    SHARED_DATA / "realtext.parquet"
    if (SHARED_DATA / "realtext.parquet").exists()
    else HERE / "data" / "realtext.parquet"
)
SAMPLE_N, SAMPLE_SEED = 15_000, 0
OBJECTIVES = {
    "Facility": ["Facility"],
    "Pair_simi": ["Pair_simi"],
    "Facility+DiSF": ["Facility", "DiSF"],
}
SET_NAMES = ("realtext", "sample15k", "demo", "shared", "clustered")


def load_set(name: str, corpus_path: Path, clustered_n: int) -> Corpus | None:
    if name == "sample15k":
        full = load_set("realtext", corpus_path, clustered_n)
        if full is None:
            return None
        rng = np.random.default_rng(SAMPLE_SEED)
        rows = np.sort(rng.choice(full.n_docs, min(SAMPLE_N, full.n_docs), replace=False))
        sample = Corpus(
            ids=full.ids[rows],
            quality=full.quality[rows],
            features=full.features[rows],
            quality_names=full.quality_names,
            quality_weights=full.quality_weights,
        )
        sample.source = (
            f"{len(rows)} documents of the real-text corpus (numpy default_rng({SAMPLE_SEED}) "
            "sample without replacement)"
        )
        return sample
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
        return read_corpus(SHARED, Columns(id_col="id", feature_col="embedding"))
    corpus = make_clustered(clustered_n, 384, 50, seed=0)
    corpus.source = f"make_clustered({clustered_n}, 384, 50, seed=0)"
    return corpus


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
    """One fresh process per set x ratio x method (``--probe``), rows to memory.jsonl."""
    path = args.out / "memory.jsonl"
    done = set()
    if path.exists():
        for line in path.read_text().splitlines():
            r = json.loads(line)
            done.add((r["set"], r["ratio"], r["method"]))
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
                with path.open("a") as f:
                    f.write(json.dumps(row) + "\n")
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
    p.add_argument("--speed", action="store_true", help="the speed table: SPEED.md")
    p.add_argument("--out", type=Path, default=None, help="results/ (results-speed/ with --speed)")
    p.add_argument("--markdown", type=Path, default=None, help="RESULTS.md (SPEED.md with --speed)")
    p.add_argument("--markdown-only", action="store_true")
    p.add_argument(
        "--memory",
        action="store_true",
        help="with --speed: the peak memory of each method at each ratio, graph build "
        "included, one fresh process each (memory.jsonl)",
    )
    p.add_argument("--probe", nargs=3, metavar=("SET", "RATIO", "METHOD"), help=argparse.SUPPRESS)
    args = p.parse_args(argv)
    if args.probe:  # a fresh process for one memory figure (run_memory)
        set_threads(args.threads[0])
        name, ratio, method = args.probe
        corpus = load_set(name, args.corpus, args.clustered_n)
        from datamask._validation import check_corpus

        check_corpus(corpus)
        print(json.dumps(probe_memory(corpus, method, float(ratio), args.seed)))
        return 0
    if args.sets is None:
        args.sets = [s for s in SET_NAMES if s != "clustered"] if args.speed else list(SET_NAMES)
    if args.dense_max is None:
        args.dense_max = 0 if args.speed else 20_000
    args.out = args.out or HERE / ("results-speed" if args.speed else "results")
    args.markdown = args.markdown or HERE / ("SPEED.md" if args.speed else "RESULTS.md")
    writer = write_speed_markdown if args.speed else write_markdown
    args.out.mkdir(parents=True, exist_ok=True)
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
    from datamask._validation import check_corpus

    check_corpus(corpus)
    path = args.out / f"{name}.jsonl"
    done = set()
    if path.exists():
        for line in path.read_text().splitlines():
            r = json.loads(line)
            done.add((r["ratio"], r["objective"], r["lamb"], r["method"], r["threads"]))
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
                with path.open("a") as f:
                    f.write(json.dumps(row) + "\n")
                j = row.get("J", float("nan"))
                print(
                    f"  {obj:<14} lamb={lamb} {method:<17} J={j:.5f} "
                    f"total={row.get('total_s', float('nan')):.2f}s",
                    flush=True,
                )


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
        # (a set run at several thread counts: the last row of each setting is shown)
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


def write_speed_markdown(results: Path, target: Path) -> None:
    """SPEED.md from ``results-speed/*.jsonl``: the learner against the greedy at its own
    default graph (and at the learner's graph), per set x ratio x objective x lamb x
    threads, with every miss listed."""
    rows: list[dict[str, Any]] = []
    for name in SET_NAMES:
        path = results / f"{name}.jsonl"
        if path.exists():
            rows += [json.loads(s) for s in path.read_text().splitlines() if s.strip()]
    by = {
        (r["set"], r["ratio"], r["objective"], r["lamb"], r["threads"], r["method"]): r
        for r in rows
    }
    cells = sorted(
        {key[:5] for key in by},
        key=lambda c: (SET_NAMES.index(c[0]), c[1], list(OBJECTIVES).index(c[2]), c[3], c[4]),
    )
    loads = [r[f] for r in rows for f in ("load_before", "load_after") if f in r]
    lines = [
        "# Never slower than greedy: the learner's time, J and memory against the lazy greedy",
        "",
        "Generated by `python benchmarks/realtext/run.py --speed` (see its docstring); do not "
        "edit. Each cell runs both sides in one process, one after the other, with the same "
        "thread count. `greedy` is the lazy greedy at its own default graph (K = max(64, "
        "ceil(16 N / k)) up to 1024); `mask` the learner at its default graph (the same K "
        f"capped at {LEARNER_MAX_NEIGHBORS}); `greedy@learner-K` the lazy greedy on the "
        "learner's graph, where the two K differ (a faster greedy that a user does not get "
        "by default, shown so that the smaller graph's effect on J is visible). Each graph is "
        "built once per ratio and thread count and its build time charged to the methods "
        "that use it (graph s); optimise s is the selector's fit with the graph given. J is "
        "the exact objective (facility location over all pairs). wall = learner total s / "
        "greedy total s; J % = learner J / greedy J. peak MB: what the fit added to the "
        "process (VmHWM) plus the graph it holds (int64 + float32 per entry); KB/doc divides "
        "that by N. Pair_simi has no graph: its two greedies are one.",
        "",
        f"1-minute load average over the runs: {_fmt(min(loads, default=None), '.2f')}-"
        f"{_fmt(max(loads, default=None), '.2f')}.",
        "",
    ]
    table: list[str] = []
    misses: list[str] = []
    misses_small: list[str] = []
    counts: dict[str, list[int]] = {}
    kb_max: dict[tuple[str, str], float] = {}
    for cell in cells:
        name, ratio, obj, lamb, threads = cell
        g, m, gl = (by.get((*cell, meth)) for meth in ("greedy", "mask", "greedy@learner-K"))
        if m is None or "J" not in m:
            continue
        n = m["n"]
        for who, r in (("greedy", g), ("mask", m)):
            if r is not None and "J" in r:
                kb = (r["peak_mb"] + r["graph_mb"]) * 1024 / n
                kb_max[(name, who)] = max(kb_max.get((name, who), 0.0), kb)
        if g is None or "J" not in g:
            reason = g["skipped"] if g is not None and "skipped" in g else "not run"
            table.append(
                f"| {ratio} | {obj} | {lamb} | {threads} | - / {m['K']} | greedy {reason} | "
                f"{m['graph_s']:.2f} + {m['optimise_s']:.2f} | - | - | - | - | "
                f"- / {m['peak_mb'] + m['graph_mb']:.0f} | "
                f"{(m['peak_mb'] + m['graph_mb']) * 1024 / n:.2f} |"
            )
            continue
        wall = m["total_s"] / g["total_s"]
        jr = m["J"] / g["J"]
        ok = counts.setdefault(name, [0, 0])
        ok[0] += wall <= 1.0 and jr >= 1.0
        ok[1] += 1
        label = f"{name} ratio {ratio} {obj} lamb {lamb} threads {threads}"
        if wall > 1.0 or jr < 1.0:
            misses.append(
                f"- {label}: wall {wall:.2f}x ({m['total_s']:.2f} s against "
                f"{g['total_s']:.2f} s), J {100 * jr:.4f}% ({m['J'] - g['J']:+.2e})"
            )
        gl_wall = gl_j = None
        if gl is not None and "J" in gl:
            gl_wall, gl_j = m["total_s"] / gl["total_s"], m["J"] / gl["J"]
            if gl_wall > 1.0 or gl_j < 1.0:
                misses_small.append(
                    f"- {label}: wall {gl_wall:.2f}x ({m['total_s']:.2f} s against "
                    f"{gl['total_s']:.2f} s), J {100 * gl_j:.3f}% (greedy@learner-K J "
                    f"{100 * gl['J'] / g['J']:.3f}% of the greedy's)"
                )
        table.append(
            f"| {ratio} | {obj} | {lamb} | {threads} | {g['K'] if 'Facility' in obj else '-'} / "
            f"{m['K'] if 'Facility' in obj else '-'} | "
            f"{g['graph_s']:.2f} + {g['optimise_s']:.2f} | "
            f"{m['graph_s']:.2f} + {m['optimise_s']:.2f} | "
            f"{'**' if wall > 1 else ''}{wall:.2f}{'**' if wall > 1 else ''} | "
            f"{'**' if jr < 1 else ''}{100 * jr:.3f}%{'**' if jr < 1 else ''} | "
            f"{_fmt(gl_wall, '.2f')} | {_fmt(None if gl_j is None else 100 * gl_j, '.3f')} | "
            f"{g['peak_mb'] + g['graph_mb']:.0f} / {m['peak_mb'] + m['graph_mb']:.0f} | "
            f"{(m['peak_mb'] + m['graph_mb']) * 1024 / n:.2f} |"
        )
    lines += ["## Summary", ""]
    for name, (good, total) in counts.items():
        lines.append(
            f"- {name}: the learner is no slower and no lower in J than the greedy in {good} "
            f"of {total} cells; peak per document (fit + graph): learner up to "
            f"{kb_max.get((name, 'mask'), float('nan')):.2f} KB, greedy up to "
            f"{kb_max.get((name, 'greedy'), float('nan')):.2f} KB."
        )
    lines += [
        "",
        "## Misses against the greedy at its default graph",
        "",
        *(misses or ["None."]),
        "",
        "## Against the greedy on the learner's graph (greedy@learner-K)",
        "",
        *(misses_small or ["No cell where the learner is slower or lower in J."]),
        "",
    ]
    mem_path = results / "memory.jsonl"
    if mem_path.exists():
        mem = [json.loads(s) for s in mem_path.read_text().splitlines() if s.strip()]
        lines += [
            "## Peak memory, graph build included (one fresh process each)",
            "",
            "`python benchmarks/realtext/run.py --speed --memory`: Facility, lamb 0.5, one "
            "thread; what the fit (the default graph's build, then the selection) adds to a "
            "process that holds the embeddings (VmHWM). Per document: MB * 1024 / N.",
            "",
            "| set | N | ratio | greedy K | greedy MB | greedy KB/doc | learner K | learner MB "
            "| learner KB/doc |",
            "|---|---:|---:|---:|---:|---:|---:|---:|---:|",
        ]
        pairs: dict[tuple[str, float], dict[str, dict]] = {}
        for r in mem:
            pairs.setdefault((r["set"], r["ratio"]), {})[r["method"]] = r
        for (name, ratio), both in sorted(
            pairs.items(), key=lambda kv: (SET_NAMES.index(kv[0][0]), kv[0][1])
        ):
            g, m = both.get("greedy"), both.get("mask")
            if g is None or m is None:
                continue
            lines.append(
                f"| {name} | {m['n']} | {ratio} | {g['K']} | {g['peak_mb']:.0f} | "
                f"{g['peak_mb'] * 1024 / g['n']:.2f} | {m['K']} | {m['peak_mb']:.0f} | "
                f"{m['peak_mb'] * 1024 / m['n']:.2f} |"
            )
        lines.append("")
    header = (
        "| ratio | objective | lamb | threads | K greedy / learner | greedy s (graph + optimise) "
        "| learner s (graph + optimise) | wall | J % | wall vs greedy@learner-K "
        "| J % vs greedy@learner-K | peak MB greedy / learner | learner KB/doc |"
    )
    sep = "|---:|---|---:|---:|---|---:|---:|---:|---:|---:|---:|---:|---:|"
    current = None
    for cell, line in zip(
        [c for c in cells if by.get((*c, "mask"), {}).get("J") is not None], table, strict=True
    ):
        if cell[0] != current:
            current = cell[0]
            first = by[(*cell, "mask")]
            lines += [
                "",
                f"## {current}: {first['source']} (N={first['n']}, d={first['d']})",
                "",
                header,
                sep,
            ]
        lines.append(line)
    target.write_text("\n".join(lines) + "\n")


if __name__ == "__main__":
    sys.exit(main())
