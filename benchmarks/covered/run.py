"""What ``covered_by`` costs on top of the selection, and how often it names the exact
nearest kept document.

    # one file: the 56k real-text corpus, each setting in a fresh process
    python benchmarks/covered/run.py one-file --input ../shared/data/realtext.parquet \
        --results benchmarks/covered/results/<date>-<machine>-realtext-mask.json
    # sharded: generated shards (benchmarks/scale/generate.py), the local pool; then the
    # sampled-row check, not timed
    python benchmarks/covered/run.py sharded --input /tmp/dm-covered/1m --out /tmp/dm-covered/run \
        --partition shard --budget group --workers 2 --no-check \
        --results benchmarks/covered/results/<date>-<machine>-1m-topk-shard-group.json
    python benchmarks/covered/run.py check --input /tmp/dm-covered/1m --out /tmp/dm-covered/run \
        --results benchmarks/covered/results/<date>-<machine>-1m-topk-shard-group.json
    # the markdown, from the JSON results
    python benchmarks/covered/run.py report --results benchmarks/covered/results \
        --output benchmarks/covered/RESULTS.md

``one-file`` runs what ``datamask select`` runs on one file, in two timed parts: the
selection (``fit``: graph + optimisation, the selector's own ``fit``) and then the cover
(:func:`datamask.pipeline.step.cover_rows` on the selection's own graph), wall and CPU
seconds (CPU: the process, every thread) and the process' peak RSS after each. Then, not
timed, the cover of 2,000 sampled rows is compared with the exact argmax over every kept
row (float64): the share that names the same document, and the mean and largest cosine
shortfall. ``--end-to-end`` adds one ``datamask.select`` call and its summary's seconds.

``sharded`` runs :func:`datamask.distributed.run_selection` with the given settings and
reports the manifest's seconds: the run's total, the cover step's (both passes), and the
cover steps' largest worker RSS; then the same sampled-row check against every kept row.
Run timed commands alone on the machine (``flock -x``) and record the load average.
"""

from __future__ import annotations

import argparse
import json
import os
import resource
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import numpy as np
import pyarrow.dataset as ds
import pyarrow.parquet as pq
import torch

SAMPLE_ROWS = 2000


def _cpu() -> float:
    r = resource.getrusage(resource.RUSAGE_SELF)
    return r.ru_utime + r.ru_stime


def _rss_mb() -> float:
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024.0


def _check(x: np.ndarray, kept: np.ndarray, covered: np.ndarray, sims: np.ndarray, seed: int):
    """Sampled rows' cover against the exact argmax over every kept row (float64)."""
    rng = np.random.default_rng(seed)
    rows = np.sort(rng.choice(len(x), min(SAMPLE_ROWS, len(x)), replace=False))
    xs = x[rows].astype(np.float64)
    xs /= np.linalg.norm(xs, axis=1, keepdims=True)
    xk = x[kept].astype(np.float64)
    xk /= np.linalg.norm(xk, axis=1, keepdims=True)
    s = xs @ xk.T
    best = kept[s.argmax(1)]
    top = s.max(1)
    is_kept = np.isin(rows, kept)
    best[is_kept], top[is_kept] = rows[is_kept], 1.0
    short = top - sims[rows].astype(np.float64)
    return {
        "rows": len(rows),
        "same_document": float(np.mean(covered[rows] == best)),
        "same_cosine": float(np.mean(short <= 1e-5)),  # ties or equal-cosine duplicates
        "mean_shortfall": float(short.mean()),
        "max_shortfall": float(short.max()),
    }


# --- one file -----------------------------------------------------------------------------
def one_setting(path: str, method: str, ratio: float, threads: int, seed: int) -> dict[str, Any]:
    """One selection and its cover, in this process (the parent starts a fresh one)."""
    from datamask.config import SelectSpec
    from datamask.io.datasets import read_input_corpus
    from datamask.measure import set_threads
    from datamask.pipeline.step import cover_rows

    set_threads(threads)
    spec = SelectSpec.from_mapping(
        {"method": method, "select_ratio": ratio, "seed": seed, "threads": threads}
    )
    corpus = read_input_corpus(path, spec.columns.resolve(pq.read_schema(path).names, where=path))
    rss_read = _rss_mb()
    selector = spec.make_selector()
    w0, c0 = time.perf_counter(), _cpu()
    selector.fit(corpus, evaluate=False)
    fit_wall, fit_cpu = time.perf_counter() - w0, _cpu() - c0
    rss_fit = _rss_mb()
    selected = np.asarray(selector.selected_)
    w0, c0 = time.perf_counter(), _cpu()
    cover = cover_rows(corpus, selected, selector.objective_)
    cover_wall, cover_cpu = time.perf_counter() - w0, _cpu() - c0
    rss_cover = _rss_mb()
    return {
        "method": method,
        "select_ratio": ratio,
        "threads": threads,
        "n_docs": corpus.n_docs,
        "k": len(selected),
        "graph": getattr(selector, "graph_seconds_", None),
        "fit": {"wall": fit_wall, "cpu": fit_cpu},
        "cover": {"wall": cover_wall, "cpu": cover_cpu},
        "cover_share_of_fit": cover_wall / fit_wall,
        "peak_rss_mb": {"read": rss_read, "after_fit": rss_fit, "after_cover": rss_cover},
        "routes": cover.counts,
        "exact_rows": int(cover.exact.sum()),
        "check": _check(corpus.features, selected, cover.index, cover.sim, seed),
    }


def end_to_end(path: str, threads: int, out: str) -> dict[str, Any]:
    import datamask

    s = datamask.select(path, out, select_ratio=0.1, threads=threads, progress=False)
    return {"seconds": s["seconds"], "cover": s["cover"], "k": s["k"], "n_docs": s["n_docs"]}


def run_one_file(args: argparse.Namespace) -> dict[str, Any]:
    results = {
        "input": args.input,
        "lock": args.lock,
        "load_before": os.getloadavg(),
        "settings": [],
    }
    for method, ratio in [(m, r) for m in args.methods for r in args.ratios]:
        cmd = [sys.executable, __file__, "_one", args.input, method, str(ratio)]
        cmd += [str(args.threads), str(args.seed)]
        done = subprocess.run(cmd, check=True, capture_output=True, text=True)
        row = json.loads(done.stdout.strip().splitlines()[-1])
        print(json.dumps(row), flush=True)
        results["settings"].append(row)
    if args.end_to_end:
        out = Path(args.scratch) / "e2e.parquet"
        cmd = [sys.executable, __file__, "_e2e", args.input, str(args.threads), str(out)]
        done = subprocess.run(cmd, check=True, capture_output=True, text=True)
        results["end_to_end"] = json.loads(done.stdout.strip().splitlines()[-1])
    results["load_after"] = os.getloadavg()
    return results


# --- sharded ------------------------------------------------------------------------------
def run_sharded(args: argparse.Namespace) -> dict[str, Any]:
    from datamask.config import SelectSpec
    from datamask.distributed import LocalRunner, run_selection

    given = {"select_ratio": args.select_ratio, "seed": args.seed}
    for key in ("partition", "budget", "chunk_size", "method"):
        if getattr(args, key) is not None:
            given[key] = getattr(args, key)
    settings = SelectSpec.from_mapping(given)
    load_before = os.getloadavg()
    started = time.perf_counter()
    runner = LocalRunner(workers=args.workers)
    try:
        m = run_selection(args.input, args.out, settings, runner=runner, progress=args.progress)
    finally:
        runner.close()
    wall = time.perf_counter() - started
    load_after = os.getloadavg()
    cover = m["cover"]
    result = {
        "input": args.input,
        "lock": args.lock,
        "settings": given,
        "workers": args.workers,
        "n_docs": m["totals"]["n_docs"],
        "k": m["totals"]["k"],
        "n_groups": m["totals"]["n_groups"],
        "wall": wall,
        "seconds": m["totals"]["seconds"],
        "selection_wall": wall - cover["seconds"]["total"],
        "cover": cover,
        "cover_share_of_selection": cover["seconds"]["total"] / (wall - cover["seconds"]["total"]),
        "peak_rss_mb_per_worker": m["summary"]["peak_rss_mb_per_worker"],
        # the select steps' seconds summed over groups, against the cover steps' (CPU-bound
        # steps of one thread each: the per-group cost, free of the pool's scheduling)
        "select_group_seconds_sum": m["summary"]["group_seconds"]["sum"],
        "driver_peak_rss_mb": m["totals"]["driver_peak_rss_mb"],
        "load_before": load_before,
        "load_after": load_after,
    }
    if not args.no_check:  # not timed: the corpus and the cover read back
        result["check"] = check_sharded(args.input, args.out)
    return result


def check_sharded(source: str, out: str, id_col: str = "chunk_id") -> dict[str, Any]:
    """The sampled-row check of a finished sharded run (``check`` separately: not timed)."""
    data = ds.dataset(source, format="parquet").to_table(columns=[id_col, "feature_arr"])
    col = data.column("feature_arr").combine_chunks()
    x = col.values.to_numpy().reshape(len(col), -1).astype(np.float32)
    ids = data.column(id_col).to_pylist()
    row_of = {v: i for i, v in enumerate(ids)}
    cov = pq.read_table(Path(out) / "covered")
    cov = cov.take(np.argsort([row_of[v] for v in cov.column(id_col).to_pylist()]))
    covered = np.asarray([row_of[v] for v in cov.column("covered_by").to_pylist()])
    kept = np.flatnonzero(cov.column("selected").to_numpy())
    return _check(x, kept, covered, cov.column("covered_sim").to_numpy(), 0)


# --- report -------------------------------------------------------------------------------
def report(folder: Path) -> str:
    lines = [
        "# covered_by: its cost on top of the selection, and its accuracy",
        "",
        "Generated by `benchmarks/covered/run.py report` from the JSON in `results/`; the",
        "commands are in the script's docstring. Machine: 2 CPU cores shared with other",
        "work; the load averages are recorded, and so is the lock each run held (`shared`:",
        "other engineers' jobs ran beside it, so seconds are inflated; the cover and the",
        "selection it is compared with ran in the same process or run, under the same load).",
        "Torch "
        + torch.__version__
        + ", CPU only. `check`: 2,000 sampled rows against the exact argmax over every kept",
        "row (float64): the share naming the same document, the share with the same cosine",
        "(equal-cosine duplicates count), and the cosine shortfall.",
        "",
    ]

    def sharded(path: Path) -> bool:
        return not isinstance(json.loads(path.read_text())["settings"], list)

    paths = sorted(folder.glob("*.json"), key=lambda p: (sharded(p), p.name))
    for path in paths:
        r = json.loads(path.read_text())
        if "settings" in r and isinstance(r["settings"], list):
            lines += [
                f"## One file: `{Path(r['input']).name}` ({path.name})",
                "",
                f"Lock: {r.get('lock', 'exclusive')}. Load average (1, 5, 15 min) before: "
                f"{_load(r['load_before'])}; after: "
                f"{_load(r['load_after'])}. Each row in a fresh process; selection = the "
                "selector's fit (graph + optimisation), not the read.",
                "",
                "| method | ratio | N | k | selection wall s (CPU s) | cover wall s (CPU s) "
                "| cover / selection | peak RSS MB after fit / after cover | rows from graph "
                "/ exact search / ivf search | exact rows | same document | same cosine "
                "| mean / max shortfall |",
                "|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|",
            ]
            for s in r["settings"]:
                c, rt = s["check"], s["routes"]
                lines.append(
                    f"| {s['method']} | {s['select_ratio']:g} | {s['n_docs']:,} | {s['k']:,} "
                    f"| {s['fit']['wall']:.1f} ({s['fit']['cpu']:.1f}) "
                    f"| {s['cover']['wall']:.2f} ({s['cover']['cpu']:.2f}) "
                    f"| {100 * s['cover_share_of_fit']:.1f}% "
                    f"| {s['peak_rss_mb']['after_fit']:.0f} / "
                    f"{s['peak_rss_mb']['after_cover']:.0f} "
                    f"| {rt['graph']:,} / {rt['exact_search']:,} / {rt['ivf_search']:,} "
                    f"| {s['exact_rows']:,} | {100 * c['same_document']:.1f}% "
                    f"| {100 * c['same_cosine']:.1f}% "
                    f"| {c['mean_shortfall']:.4f} / {c['max_shortfall']:.3f} |"
                )
            if "end_to_end" in r:
                e = r["end_to_end"]
                sec = e["seconds"]
                lines += [
                    "",
                    f"End to end, `datamask.select` at ratio 0.1 (the summary's seconds): "
                    f"total {sec['total']:.1f} s, of which read {sec['read']:.1f}, fit "
                    f"{sec['fit']:.1f}, cover {sec['cover']:.2f} "
                    f"({100 * sec['cover'] / (sec['total'] - sec['cover']):.1f}% on top of "
                    "the rest).",
                ]
            lines.append("")
        else:
            c = r.get("check")
            cv = r["cover"]
            sel_sum = r.get("select_group_seconds_sum")
            g = r["n_groups"]
            sums = (
                f"{sel_sum:.1f} / {cv['seconds']['group_sum']:.1f} "
                f"({100 * cv['seconds']['group_sum'] / sel_sum:.1f}%); per group "
                f"{sel_sum / g:.2f} / {cv['seconds']['group_sum'] / g:.2f}"
                if sel_sum
                else "-"
            )
            lines += [
                f"## Sharded: `{r['input']}` ({path.name})",
                "",
                f"Settings {json.dumps(r['settings'])} (the rest: `datamask select`'s "
                f"defaults), local pool of {r['workers']} workers; lock: "
                f"{r.get('lock', 'exclusive')}; load average before "
                f"{_load(r['load_before'])}, after {_load(r['load_after'])}.",
                "",
                "| N | k | groups | run wall s | selection wall s (the run less the cover) "
                "| cover wall s (kept rows + cover) | cover / selection | step seconds summed: "
                "select / cover | largest worker RSS MB | exact rows | same document "
                "| same cosine | mean / max shortfall |",
                "|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|",
                f"| {r['n_docs']:,} | {r['k']:,} | {r['n_groups']} | {r['wall']:.1f} "
                f"| {r['selection_wall']:.1f} | {cv['seconds']['total']:.1f} "
                f"({cv['seconds']['kept_rows']:.1f} + {cv['seconds']['cover']:.1f}) "
                f"| {100 * r['cover_share_of_selection']:.1f}% | {sums} "
                f"| {r['peak_rss_mb_per_worker']:.0f} | {cv['exact']:,} "
                + (
                    f"| {100 * c['same_document']:.1f}% | {100 * c['same_cosine']:.1f}% "
                    f"| {c['mean_shortfall']:.4f} / {c['max_shortfall']:.3f} |"
                    if c
                    else "| - | - | - |"
                ),
                "",
                f"Rows by route (own group): {json.dumps(cv['routes'])}; the floor's search "
                f"over the kept rows of the {cv['neighbors']} nearest groups: "
                f"{json.dumps(cv.get('floor_routes', {}))}. The largest worker RSS is a "
                "worker's lifetime peak: the same processes ran the selection first.",
                "",
            ]
            if r["settings"].get("method") == "topk":
                lines += [
                    "This run's selection is `topk` (a score per row, no optimisation), so "
                    "its ratio says nothing of a learner's run: it measures the cover step's "
                    "own seconds on these rows. A group's cover does not depend on the "
                    "method, only on its rows and kept rows: compare its per-group cover "
                    "seconds with a learner's per-group select seconds on groups of the same "
                    "size (the 200k shard run: same generator, 10k-row groups).",
                    "",
                ]
    return "\n".join(lines)


def _load(values: list[float]) -> str:
    return ", ".join(f"{v:.2f}" for v in values)


def main() -> None:
    if len(sys.argv) > 1 and sys.argv[1] == "_one":
        path, method, ratio, threads, seed = sys.argv[2:7]
        print(json.dumps(one_setting(path, method, float(ratio), int(threads), int(seed))))
        return
    if len(sys.argv) > 1 and sys.argv[1] == "_e2e":
        print(json.dumps(end_to_end(sys.argv[2], int(sys.argv[3]), sys.argv[4])))
        return
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    sub = p.add_subparsers(dest="cmd", required=True)
    one = sub.add_parser("one-file")
    one.add_argument("--input", required=True)
    one.add_argument("--methods", nargs="+", default=["mask", "greedy"])
    one.add_argument("--ratios", nargs="+", type=float, default=[0.01, 0.1, 0.3])
    one.add_argument("--threads", type=int, default=2)
    one.add_argument("--seed", type=int, default=0)
    one.add_argument("--end-to-end", action="store_true")
    one.add_argument("--scratch", default="/tmp/dm-covered")
    one.add_argument("--results", required=True)
    one.add_argument("--lock", choices=["exclusive", "shared"], default="exclusive")
    sh = sub.add_parser("sharded")
    sh.add_argument("--input", required=True)
    sh.add_argument("--out", required=True)
    sh.add_argument("--workers", type=int, default=2)
    sh.add_argument("--select-ratio", type=float, default=0.1)
    sh.add_argument("--seed", type=int, default=0)
    sh.add_argument("--partition", default=None)
    sh.add_argument("--method", default=None)
    sh.add_argument("--budget", default=None)
    sh.add_argument("--chunk-size", type=int, default=None)
    sh.add_argument("--progress", action="store_true")
    sh.add_argument("--no-check", action="store_true")
    sh.add_argument("--results", required=True)
    sh.add_argument("--lock", choices=["exclusive", "shared"], default="exclusive")
    chk = sub.add_parser("check", help="add the sampled-row check to a sharded result")
    chk.add_argument("--input", required=True)
    chk.add_argument("--out", required=True)
    chk.add_argument("--results", required=True)
    rep = sub.add_parser("report")
    rep.add_argument("--results", required=True)
    rep.add_argument("--output", required=True)
    args = p.parse_args()
    if args.cmd == "report":
        Path(args.output).write_text(report(Path(args.results)) + "\n")
        return
    if args.cmd == "check":
        result = json.loads(Path(args.results).read_text())
        result["check"] = check_sharded(args.input, args.out)
        Path(args.results).write_text(json.dumps(result, indent=1) + "\n")
        return
    result = run_one_file(args) if args.cmd == "one-file" else run_sharded(args)
    Path(args.results).parent.mkdir(parents=True, exist_ok=True)
    Path(args.results).write_text(json.dumps(result, indent=1) + "\n")


if __name__ == "__main__":
    main()
