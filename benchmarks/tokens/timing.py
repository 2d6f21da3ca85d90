"""Token budgets, wall time side by side (issue 46's cost figures), on the real text.

In one process, alternated and repeated: the cost-benefit greedy and the learner at 10% of
the characters, then both at a document budget of the learner's k. Each fit's wall and CPU
seconds, split into graph and optimisation, its J and the load average at its start.

    python benchmarks/tokens/timing.py [--repeats 2]   # results/<date>-<machine>-timing.json
"""

from __future__ import annotations

import argparse
import os
import resource
import sys
import time
from pathlib import Path

import torch

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE.parent / "_lib"))
sys.path.insert(0, str(HERE))
import ledger  # noqa: E402
from run import CORPUS, load  # noqa: E402

from datamask import MaskLearner  # noqa: E402
from datamask.greedy import LazyGreedy  # noqa: E402


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    ap.add_argument("--corpus", type=Path, default=CORPUS)
    ap.add_argument("--ratio", type=float, default=0.1)
    ap.add_argument("--repeats", type=int, default=2)
    ap.add_argument("--threads", type=int, default=2)
    args = ap.parse_args()
    torch.set_num_threads(args.threads)
    corpus = load(args.corpus)
    k = MaskLearner(device="cpu", seed=0, select_token_ratio=args.ratio).fit(corpus).k_
    runs = (
        ("greedy", LazyGreedy, {"select_token_ratio": args.ratio}),
        ("mask", MaskLearner, {"select_token_ratio": args.ratio}),
        ("mask", MaskLearner, {"k": k}),
        ("greedy", LazyGreedy, {"k": k}),
    )
    rows = []
    for rep in range(args.repeats):
        for name, cls, settings in runs:
            load_now, cpu = os.getloadavg()[0], time.process_time()
            sel = cls(device="cpu", seed=0, **settings).fit(corpus)
            rows.append(
                {
                    "method": name,
                    "budget": "tokens" if "k" not in settings else f"k={k}",
                    "repeat": rep,
                    "fit_s": sel.fit_seconds_,
                    "graph_s": sel.graph_seconds_,
                    "optimise_s": sel.optimise_seconds_,
                    "cpu_s_with_eval": time.process_time() - cpu,
                    "J": float(sel.terms_["J"]),
                    "k": int(sel.k_),
                    "load_average_at_start": load_now,
                    "peak_rss_mb_so_far": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024,
                }
            )
            print({key: rows[-1][key] for key in ("method", "budget", "fit_s", "J")}, flush=True)
    out = ledger.result_path(HERE, "timing")
    ledger.write_json(
        out,
        ledger.run_record(
            ratio=args.ratio, threads=args.threads, time_started=time.time(), rows=rows
        ),
    )
    print("wrote", out)


if __name__ == "__main__":
    main()
