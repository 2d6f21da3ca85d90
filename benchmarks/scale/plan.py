"""The cost model of benchmarks/scale/PLAN.md: calibrate on one run, predict others.

    python benchmarks/scale/plan.py --calibrate results/run-200k.json \
        --check results/run-1m.json --at 1e10 --nodes 100 --cpus 64

A run's figures come from ``run.py --results``. The model has one cost per document and
worker-second for each parallel phase (plan: validation pass, k-means assignment and the
regrouping spill; select: every group's learner, its gain curve and any extension round),
and one cost per group for the allocation and the writes::

    T(N, G, W) = c_plan * N / W + max(c_select * N / W, c_select * n_g)
                 + c_group * G / W + c_merge * N + t_fixed

``c_select`` is a worker's busy time per document (the sum of the group steps' seconds
over N), ``n_g`` the largest group; ``c_merge`` (keep lists, manifest) runs on the driver;
``t_fixed`` (starting the workers) is taken as measured. Groups keep their size
(``chunk_size``), so the per-document costs hold at any N; that is the assumption the
check against a larger run tests.
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path


def costs(run: dict) -> dict[str, float]:
    """Per-document and per-group costs of one run (seconds)."""
    s, n, g, w = run["seconds"], run["n_docs"], run["n_groups"], run["workers"]
    merge = s["total"] - s["plan"] - s["select"] - s["global"]
    return {
        # validation pass, k-means assignment and the regrouping spill: parallel
        "plan_per_doc": s["plan"] * w / n,
        # a worker's busy time per document in its group's step (learner, gain curve,
        # extension rounds); wall = busy / workers, or the largest group if longer
        "select_per_doc": run["group_seconds"]["sum"] / n,
        # the allocation and the writes: per group, parallel
        "global_per_group": s["global"] * w / g,
        # keep lists and the manifest: the driver, serial
        "merge_per_doc": merge / n,
        "fixed": s["wall_incl_ray_start"] - s["total"],
    }


def predict(
    c: dict[str, float], n: float, groups: float, workers: float, group_size: float
) -> dict[str, float]:
    plan = c["plan_per_doc"] * n / workers
    select = max(c["select_per_doc"] * n / workers, c["select_per_doc"] * group_size)
    glob = c["global_per_group"] * groups / workers
    merge = c["merge_per_doc"] * n
    return {
        "plan": plan,
        "select": select,
        "global": glob,
        "merge": merge,
        "total": plan + select + glob + merge + c["fixed"],
    }


def print_check(name: str, predicted: dict[str, float], measured: dict[str, float]) -> None:
    """One line per phase: predicted and measured seconds, and the model's error."""
    for phase in ("plan", "select", "global", "merge", "total"):
        err = predicted[phase] / measured[phase] - 1 if measured[phase] else float("nan")
        print(
            f"{name} {phase}: predicted {predicted[phase]:.1f} s, measured "
            f"{measured[phase]:.1f} s ({100 * err:+.0f}%)"
        )


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--calibrate", type=Path, required=True)
    ap.add_argument("--check", type=Path, nargs="*", default=[])
    ap.add_argument(
        "--check-10m",
        type=Path,
        help="results/run-10m.json (run_10m_report.py --gather): phases from its bars",
    )
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
        largest = run["n_docs"] / run["n_groups"]  # groups are near-equal below chunk_size
        p = predict(c, run["n_docs"], run["n_groups"], run["workers"], min(largest, 1e5))
        s = run["seconds"]
        measured = {
            "plan": s["plan"],
            "select": s["select"],
            "global": s["global"],
            "merge": s["total"] - s["plan"] - s["select"] - s["global"],
            "total": s["wall_incl_ray_start"],
        }
        print_check(path.name, p, measured)
    if args.check_10m is not None:
        from run_10m_report import phase_seconds  # this folder's script

        d = json.loads(args.check_10m.read_text())
        run = d["run"]
        n, g = run["n_docs"], run["n_groups"]
        largest = max(x["n"] for x in d["groups"])
        p = predict(c, n, g, run["workers"], largest)
        measured = phase_seconds(d["segments"])
        measured["total"] = sum(measured[k] for k in ("plan", "select", "global", "merge"))
        p["total"] -= c["fixed"]  # the bars hold no start-up
        print_check(args.check_10m.name, p, measured)
    workers = args.nodes * args.cpus
    groups = args.at / args.group_size
    p = predict(c, args.at, groups, workers, args.group_size)
    print(
        f"{args.at:.0e} documents, {groups:.0e} groups, {workers} workers: "
        + ", ".join(f"{k} {v / 3600:.1f} h" for k, v in p.items())
    )


if __name__ == "__main__":
    main()
