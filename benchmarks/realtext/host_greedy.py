"""How fast the lazy greedy baseline could be: the same lazy greedy on host gains.

    python benchmarks/realtext/host_greedy.py [--threads 2] [--repeats 2]

``gain_order`` (the sharded run's gain curves) runs Minoux's lazy greedy as a heap over
numpy gains on the host (:meth:`~datamask.objectives.base.Term.host_gains`). The
``greedy`` baseline (:class:`~datamask.greedy.LazyGreedy`) ran it on tensors, a few tensor
ops per re-evaluated row, when this was first run, and on host gains since (RESULTS.md,
"The greedy baseline on host gains"; the first run: ``benchmarks/archive/realtext/``).
This times both on the same bound objective and graph
(the greedy's default K), facility location with quality, on the real-text corpus and its
15k sample, and checks that they pick the same rows. The baseline is the strongest
alternative a user would pick, so a faster one matters to every "against greedy" figure:
the results say by how much, against the learner's optimisation time in the same process.
Records every cell in ``results/<date>-<machine>-host-greedy.json`` (the commit inside,
``benchmarks/_lib/ledger.py``) and prints a markdown table.
"""

from __future__ import annotations

import argparse
import os
import sys
import time
from pathlib import Path

import numpy as np
import torch

from datamask import FacilityLocation, MaskLearner, Objective
from datamask.greedy import LazyGreedy
from datamask.greedy.lazy import gain_order

HERE = Path(__file__).resolve().parent
import grid  # noqa: E402  (this folder's corpus loader)

sys.path.insert(0, str(HERE.parent / "_lib"))
from ledger import result_path, run_record, write_json  # noqa: E402


def cell(corpus, ratio: float, lamb: float, threads: int) -> dict:
    torch.set_num_threads(threads)
    greedy = LazyGreedy(objective=Objective([FacilityLocation()], lamb=lamb), select_ratio=ratio)
    greedy.fit(corpus)
    objective = greedy.objective_  # bound, its graph built by the fit
    facility = objective.terms[1][1]
    facility.reverse_ = None  # built by the greedy's fit: build it again, timed
    started = time.perf_counter()
    facility.reverse_graph()  # the graph by column, which the host gains read
    to_host = time.perf_counter() - started
    started = time.perf_counter()
    order, _ = gain_order(objective, np.arange(corpus.n_docs), k=greedy.k_)  # on host gains
    host_s = time.perf_counter() - started
    learner = MaskLearner(objective=Objective([FacilityLocation()], lamb=lamb), select_ratio=ratio)
    learner.fit(corpus)
    same = np.array_equal(np.sort(order), np.sort(np.asarray(greedy.selected_)))
    return {
        "n": corpus.n_docs,
        "ratio": ratio,
        "lamb": lamb,
        "threads": threads,
        "k": int(greedy.k_),
        "greedy_optimise_s": round(greedy.optimise_seconds_, 3),
        "host_greedy_s": round(host_s, 3),
        "host_copy_s": round(to_host, 3),
        "same_selection": bool(same),
        "rows_differing": int(len(np.setdiff1d(order, np.asarray(greedy.selected_)))),
        "learner_optimise_s": round(learner.optimise_seconds_, 3),
        "load": os.getloadavg(),
    }


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--repeats", type=int, default=2)
    ap.add_argument("--sets", nargs="+", default=["realtext", "sample15k"])
    args = ap.parse_args()
    out, rows = result_path(HERE, "host-greedy"), []
    print("| set | N | ratio | greedy optimise s | host greedy s | learner optimise s | same |")
    print("|---|---:|---:|---:|---:|---:|---|")
    for name in args.sets:
        corpus = grid.load_set(name, grid.DEFAULT_CORPUS, 0)
        for ratio in (0.01, 0.1):
            for _ in range(args.repeats):
                row = {"set": name, **cell(corpus, ratio, 0.5, args.threads)}
                rows.append(row)
                write_json(out, {**run_record(greedy="LazyGreedy"), "rows": rows})
                print(
                    f"| {name} | {row['n']:,} | {ratio} | {row['greedy_optimise_s']} | "
                    f"{row['host_greedy_s']} (+{row['host_copy_s']} reverse graph) | "
                    f"{row['learner_optimise_s']} | {row['same_selection']} "
                    f"({row['rows_differing']} differ) |",
                    flush=True,
                )


if __name__ == "__main__":
    main()
