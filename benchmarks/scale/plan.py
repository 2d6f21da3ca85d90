"""The cost model of benchmarks/scale/PLAN.md: calibrate on one run, predict others.

    python benchmarks/scale/plan.py --calibrate results/run-200k.json \
        --check results/run-1m.json --at 1e10 --nodes 100 --cpus 64

A run's figures come from ``run.py --results``. The model has one cost per document and
worker-second for each parallel phase (plan: validation pass, k-means assignment and the
regrouping spill; select: every group's learner, its gain curve and any extension round),
and one cost per group for the allocation and the writes::

    T(N, G, W) = (c_plan + c_select) * N / W + c_group * G / W + t_fixed

``t_fixed`` (the k-means fit on a fixed-size sample, starting the workers) is taken as
measured. Groups keep their size (``chunk_size``), so the per-document costs hold at
any N; that is the assumption the check against a larger run tests.
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path


def costs(run: dict) -> dict[str, float]:
    s, n, g = run["seconds"], run["n_docs"], run["n_groups"]
    w = run["workers"]
    return {
        "plan_per_doc": s["plan"] * w / n,
        "select_per_doc": s["select"] * w / n,
        "global_per_group": s["global"] * w / g,
        "fixed": s["wall_incl_ray_start"] - s["total"],
    }


def predict(c: dict[str, float], n: float, groups: float, workers: float) -> dict[str, float]:
    plan = c["plan_per_doc"] * n / workers
    select = c["select_per_doc"] * n / workers
    glob = c["global_per_group"] * groups / workers
    return {
        "plan": plan,
        "select": select,
        "global": glob,
        "total": plan + select + glob + c["fixed"],
    }


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--calibrate", type=Path, required=True)
    ap.add_argument("--check", type=Path, nargs="*", default=[])
    ap.add_argument("--at", type=float, default=1e10, help="documents of the plan")
    ap.add_argument("--group-size", type=float, default=100_000)
    ap.add_argument("--nodes", type=int, default=100)
    ap.add_argument("--cpus", type=int, default=64, help="worker processes per node")
    args = ap.parse_args()
    cal = json.loads(args.calibrate.read_text())
    c = costs(cal)
    print("calibration:", args.calibrate.name, json.dumps({k: round(v, 6) for k, v in c.items()}))
    for path in args.check:
        run = json.loads(path.read_text())
        p = predict(c, run["n_docs"], run["n_groups"], run["workers"])
        s = run["seconds"]
        measured = {
            "plan": s["plan"],
            "select": s["select"],
            "global": s["global"],
            "total": s["wall_incl_ray_start"],
        }
        for phase in ("plan", "select", "global", "total"):
            err = p[phase] / measured[phase] - 1 if measured[phase] else float("nan")
            print(
                f"{path.name} {phase}: predicted {p[phase]:.1f} s, measured "
                f"{measured[phase]:.1f} s ({100 * err:+.0f}%)"
            )
    workers = args.nodes * args.cpus
    groups = args.at / args.group_size
    p = predict(c, args.at, groups, workers)
    print(
        f"{args.at:.0e} documents, {groups:.0e} groups, {workers} workers: "
        + ", ".join(f"{k} {v / 3600:.1f} h" for k, v in p.items())
    )


if __name__ == "__main__":
    main()
