"""The learner's optimisation time against the lazy greedy's, base epoch and new, in one process.

    PYTHONPATH=src python benchmarks/learner_ops/speed.py                       # 50k clustered
    PYTHONPATH=src python benchmarks/learner_ops/speed.py --ratios 0.1 0.3 \
        --input /work/shared/data/realtext.parquet

One K-NN graph per ratio (the default search, K = the learner's default, which is the
greedy's too at ratio >= 0.1), built once and given to every method, so the graph's build
(timed once, charged to both sides in ``wall``) is not what differs. Then, ``--repeats``
times, in rotating order: ``greedy`` (LazyGreedy, picks on host gains), ``learner-base``
(the learner with the epoch of a746bdc replayed: autograd through that commit's
``expected``, float32 Newton with a residual read per iteration and the bisection
fallback) and ``learner``
(this checkout's epoch). Same seed, same thread count. ``optimise`` is each fit's
``optimise_seconds_`` (the graph given: all of its fit but validation and binding),
``learn`` the learner's epochs (``learn_seconds_``), ``refine`` its swap search, ``fit
CPU`` the process' CPU time over the fit (all threads: on a loaded machine the steadier
figure). J is the exact objective, computed after the timed fit.
Timings on a shared machine: the 1-minute load average is printed before and after.
"""

from __future__ import annotations

import argparse
import hashlib
import json
import os
import statistics
import sys
import time
from pathlib import Path

import numpy as np
import torch

from datamask import FacilityLocation, MaskLearner, Objective, make_clustered
from datamask.greedy import LazyGreedy
from datamask.io.parquet import read_corpus
from datamask.neighbors import knn_graph, resolve_knn
from datamask.objectives.facility_location import LEARNER_MAX_NEIGHBORS, neighbors_for_ratio

HERE = Path(__file__).resolve().parent


def _base_budget_shift(theta, k, start=None, tol=1e-3):
    """The budget shift of a746bdc: float32 sums, a host read per Newton iteration, 60
    bisection iterations when Newton has not converged in 8."""
    tau = theta.new_tensor(0.0) if start is None else start.to(theta.dtype)
    for _ in range(8):
        p = torch.sigmoid(theta - tau)
        excess = p.sum() - k
        slope = (p * (1 - p)).sum()
        if abs(float(excess)) < tol:
            return tau
        tau = tau + excess / slope.clamp_min(1e-6)
    lo, hi = theta.min() - 40.0, theta.max() + 40.0
    for _ in range(60):
        mid = (lo + hi) / 2
        too_many = torch.sigmoid(theta - mid).sum() > k
        lo = torch.where(too_many, mid, lo)
        hi = torch.where(too_many, hi, mid)
    return (lo + hi) / 2


def _base_expected(objective, p, clients):
    """E[J] as a746bdc computed it (facility location's ``expected`` of that commit)."""
    total = 0.0
    for w, term in objective.terms:
        if not isinstance(term, FacilityLocation):
            total = total + w * term.expected(p, clients)
            continue
        idx, sim = term.knn_graph()
        if clients is not None:
            idx, sim = idx[clients], sim[clients]
        pn = p.index_select(0, idx.reshape(-1)).view(idx.shape)
        miss = torch.cumprod(1.0 - pn, dim=1)
        none_before = torch.cat([torch.ones_like(miss[:, :1]), miss[:, :-1]], 1)
        cover = (sim * pn * none_before).sum(1)
        if idx.shape[1] < term.n_docs:
            cover = cover + sim[:, -1] * miss[:, -1]
        total = total + w * cover.mean()
    return total


class BaseEpochLearner(MaskLearner):
    """The learner with the base commit's epoch (a746bdc ``_expected_step``), for timing
    side by side; the loop, the rounding and everything else are this checkout's."""

    def _expected_step(self, theta, lr, n):
        b = int(round(self.partial * n))
        gen = self._torch_gen
        clients = None if b >= n else torch.randperm(n, generator=gen, device=self.device_)[:b]
        tau = self._tau = _base_budget_shift(theta, self.k_, self._tau)
        p = torch.sigmoid(theta - tau).requires_grad_(True)
        expected = _base_expected(self.objective_, p, clients)
        (grad,) = torch.autograd.grad(expected, p)
        grad = grad / (grad.pow(2).mean().sqrt() + 1e-12)
        theta.add_(lr * grad)
        float(expected.detach())  # the base loop read it at every log step (every 2nd)
        return expected.detach()


def load(args) -> tuple[object, str]:
    if args.input:
        corpus = read_corpus(args.input)
        return corpus, Path(args.input).name
    return make_clustered(args.n, 384, 50, seed=0), f"make_clustered({args.n}, 384, 50, seed=0)"


def fit(method: str, corpus, graph, k_nn: int, ratio: float):
    objective = Objective([FacilityLocation(n_neighbors=k_nn, graph=graph)], lamb=0.5)
    common = {"select_ratio": ratio, "seed": 0, "device": "cpu"}
    if method == "greedy":
        sel = LazyGreedy(objective, **common)
    elif method == "learner-base":
        sel = BaseEpochLearner(objective, **common)
    else:
        sel = MaskLearner(objective, **common)
    cpu = time.process_time()
    sel.fit(corpus, evaluate=False)
    cpu = time.process_time() - cpu  # every thread's, validation and binding included
    row = {
        "method": method,
        "optimise": sel.optimise_seconds_,
        "cpu": cpu,
        "J": sel.objective_.value(sel.selected_),
        "selection": hashlib.sha1(sel.selected_.tobytes()).hexdigest()[:12],
    }
    if method != "greedy":
        row["refine"] = sel.refine_seconds_
        row["swaps"] = sel.swaps_
        row["learn"] = getattr(sel, "learn_seconds_", sel.optimise_seconds_ - sel.refine_seconds_)
        row["epochs"] = sel.n_epochs_
    return row


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--input", help="a parquet corpus (default: generated clustered data)")
    p.add_argument("--n", type=int, default=50_000)
    p.add_argument("--ratios", type=float, nargs="+", default=[0.1])
    p.add_argument("--repeats", type=int, default=3)
    p.add_argument("--threads", type=int, default=2)
    p.add_argument("--methods", nargs="+", default=["greedy", "learner-base", "learner"])
    p.add_argument("--json", type=Path)
    args = p.parse_args()
    torch.set_num_threads(args.threads)
    corpus, name = load(args)
    n = corpus.n_docs
    x = torch.as_tensor(np.asarray(corpus.features, dtype=np.float32))
    x = x / x.norm(dim=1, keepdim=True)
    out = {"data": name, "n": n, "threads": args.threads, "cells": []}
    for ratio in args.ratios:
        k_nn = neighbors_for_ratio(round(ratio * n), n, LEARNER_MAX_NEIGHBORS)
        method = resolve_knn("auto", n, x.device)
        started = time.perf_counter()
        idx, sim = knn_graph(x, k_nn, method=method, generator=torch.Generator().manual_seed(0))
        graph = (idx, sim.clamp_min(0.0))
        graph_s = time.perf_counter() - started
        rows = []
        load_before = os.getloadavg()[0]
        for r in range(args.repeats):
            order = args.methods[r % len(args.methods) :] + args.methods[: r % len(args.methods)]
            for m in order:
                rows.append({**fit(m, corpus, graph, k_nn, ratio), "repeat": r})
                print(json.dumps(rows[-1]), file=sys.stderr, flush=True)
        load_after = os.getloadavg()[0]
        cell = {
            "ratio": ratio,
            "k_nn": k_nn,
            "graph_method": method,
            "graph_seconds": graph_s,
            "load": [load_before, load_after],
            "rows": rows,
        }
        out["cells"].append(cell)
        print(report(cell, name, n, args.threads))
    if args.json:
        args.json.write_text(json.dumps(out, indent=1))


def report(cell: dict, name: str, n: int, threads: int) -> str:
    by: dict[str, list[dict]] = {}
    for row in cell["rows"]:
        by.setdefault(row["method"], []).append(row)
    med = {m: statistics.median(r["optimise"] for r in rows) for m, rows in by.items()}
    g = med.get("greedy")
    lines = [
        f"\n{name} (N={n:,}), ratio {cell['ratio']}, K={cell['k_nn']} ({cell['graph_method']}, "
        f"{cell['graph_seconds']:.1f} s once), {threads} threads, load "
        f"{cell['load'][0]:.2f} -> {cell['load'][1]:.2f}\n",
        "| method | optimise s (each repeat) | median | learn s | refine s | "
        "optimise / greedy | wall / greedy (graph + optimise) | fit CPU s | J | selection |",
        "|---|---|---:|---:|---:|---:|---:|---:|---:|---|",
    ]
    for m, rows in by.items():
        each = ", ".join(f"{r['optimise']:.2f}" for r in rows)
        learn = statistics.median(r["learn"] for r in rows) if "learn" in rows[0] else None
        refine = statistics.median(r["refine"] for r in rows) if "refine" in rows[0] else None
        ratio = f"{med[m] / g:.3f}" if g else "-"
        wall = f"{(cell['graph_seconds'] + med[m]) / (cell['graph_seconds'] + g):.3f}" if g else "-"
        lines.append(
            f"| {m} | {each} | {med[m]:.2f} | "
            f"{'-' if learn is None else f'{learn:.2f}'} | "
            f"{'-' if refine is None else f'{refine:.2f}'} | {ratio} | {wall} | "
            f"{statistics.median(r['cpu'] for r in rows):.2f} | "
            f"{rows[0]['J']:.6f} | {rows[0]['selection']} |"
        )
    return "\n".join(lines)


if __name__ == "__main__":
    main()
