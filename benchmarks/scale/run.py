"""Time a sharded selection end to end and report throughput and memory per worker.

    python benchmarks/scale/generate.py --out /tmp/datamask-scale/1m
    python benchmarks/scale/run.py --data /tmp/datamask-scale/1m --out /tmp/datamask-scale/run-1m \
        --workers 2

Runs :func:`datamask.distributed.run_selection` on a local Ray (or ``--runner local``, the
standard-library process pool), with ``--budget global`` (two rounds) or ``group``,
then prints one markdown row: documents, shards, groups, wall time, documents/s, peak RSS
per worker (``getrusage`` inside every worker, the largest over the run), the driver's
peak RSS, and peak GPU memory per worker when the groups ran on CUDA. Every setting is
the library's default (``datamask select``'s) unless a flag sets it. ``--out`` must not
exist unless you mean to resume it.

The figures go to ``results/<date>-<machine>-<what>.json`` (``benchmarks/_lib/ledger.py``:
date, machine, commit and command first; ``--what`` defaults to ``<documents>-run``, e.g.
``1m-run``), or to ``--results`` when given; a failed run leaves its record only in
``--results``.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import resource
import sys
import time
from pathlib import Path

import torch

from datamask.config import SelectSpec
from datamask.distributed import LocalRunner, RayRunner, run_selection
from datamask.distributed.manifest import step_seconds

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE.parent / "_lib"))
from ledger import result_path, run_record, write_json  # noqa: E402


def size_name(n: int) -> str:
    """``n`` documents as a file name part: ``200k``, ``1m``, ``10m`` (``1234`` as is)."""
    for unit, scale in (("m", 1_000_000), ("k", 1_000)):
        if n >= scale and n % scale == 0:
            return f"{n // scale}{unit}"
    return str(n)


def results_path(args: argparse.Namespace, default_what: str) -> Path:
    """``--results``, else this folder's ``results/<date>-<machine>-<what>.json``."""
    return Path(args.results) if args.results else result_path(HERE, args.what or default_what)


def _folder_key(f: Path, root: Path) -> str:
    """``f``'s folder under ``root``, partitions (``bucket=00001/`` etc.) as one folder."""
    parts = f.parent.relative_to(root).parts
    return "/".join(p.split("=")[0] + "=*" if "=" in p else p for p in parts) or "."


def folder_sizes(root: Path) -> dict[str, dict[str, int]]:
    """Files and bytes under every folder of ``root`` (what each phase left there)."""
    sizes: dict[str, dict[str, int]] = {}
    for f in root.rglob("*"):
        if f.is_file():
            entry = sizes.setdefault(_folder_key(f, root), {"files": 0, "bytes": 0})
            entry["files"] += 1
            entry["bytes"] += f.stat().st_size
    return dict(sorted(sizes.items()))


def folder_times(root: Path) -> dict[str, dict[str, float | int]]:
    """Files under every folder of ``root`` and the first and last modification time
    (epoch seconds): where a failed run was, phase by phase (markers are written last)."""
    times: dict[str, dict[str, float | int]] = {}
    for f in root.rglob("*"):
        if f.is_file():
            t = f.stat().st_mtime
            entry = times.setdefault(_folder_key(f, root), {"files": 0, "first": t, "last": t})
            entry["files"] += 1
            entry["first"], entry["last"] = min(entry["first"], t), max(entry["last"], t)
    return dict(sorted(times.items()))


def phase_facts(m: dict, out: Path) -> dict:
    """What the plan's model (plan.py, docs/scale.md) calibrates on: the plan phase's
    parts, every group's size and seconds in each per-group phase, and the files and bytes
    each phase wrote."""
    work = Path(m["work_dir"])
    exchange = [json.loads(f.read_text()) for f in sorted((work / "exchange").glob("*.json"))]
    budget = m["budget"].get("global_round") or {}
    return {
        "plan": m["partition"].get("seconds"),
        # gather steps (buckets of groups); absent before buckets: one step a group
        "gather_steps": m["partition"].get("gather_steps"),
        "groups": [
            {
                "gid": g["gid"],
                "n": g["n"],
                "k": g["k"],
                # every proposal of the group (one that proposed again: its first too)
                "seconds": step_seconds(g, "total"),
                "graph": step_seconds(g, "fit_graph"),  # the K-NN graph, inside the fit
                "proposals": 1 + len(g.get("earlier", ())),
            }
            for g in m["groups"]
        ],
        "exchange": [
            {"gid": e["gid"], "candidates": e["candidates"], "seconds": e["seconds"]}
            for e in exchange
        ],
        "kept_per_group": budget.get("kept_per_group"),
        "cover": (m.get("cover") or {}).get("seconds"),
        "input_bytes": sum(f.stat().st_size for f in Path(m["input"]["source"]).glob("*.parquet")),
        "work": folder_sizes(work),
        "out": {k: v for k, v in folder_sizes(out).items() if not k.startswith("_work")},
    }


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--data", required=True, help="folder of parquet shards")
    p.add_argument("--out", required=True, help="output folder of the selection")
    p.add_argument(
        "--results", help="the figures' JSON (default: results/<date>-<machine>-<what>.json)"
    )
    p.add_argument("--what", help="<what> of the default results file (default: <documents>-run)")
    p.add_argument("--runner", choices=["ray", "local"], default="ray")
    p.add_argument("--workers", type=int, default=None, help="default: all CPUs or GPUs")
    # Every setting below left out is the library's default (``datamask select``'s).
    p.add_argument("--budget", choices=["global", "group"], default=None)
    p.add_argument("--oversample", type=float, default=None)
    p.add_argument("--exchange-neighbors", type=int, default=None)
    p.add_argument("--partition", choices=["shard", "chunk", "cluster"], default=None)
    p.add_argument("--chunk-size", type=int, default=None)
    p.add_argument("--n-clusters", type=int, default=None)
    p.add_argument("--select-ratio", type=float, default=None, help="default 0.1 (no other budget)")
    p.add_argument("--k", type=int, default=None, help="documents to keep, instead of a ratio")
    p.add_argument("--select-token-ratio", type=float, default=None, help="share of the tokens")
    p.add_argument("--budget-tokens", type=float, default=None, help="tokens to keep")
    p.add_argument("--length-col", default=None, help="lengths (generate.py writes n_chars)")
    p.add_argument("--n-epochs", type=int, default=None, help="default: the learner's")
    p.add_argument("--device", default=None)
    p.add_argument("--progress", action="store_true")
    args = p.parse_args()

    given = {
        key: getattr(args, key)
        for key in (
            "select_ratio",
            "k",
            "select_token_ratio",
            "budget_tokens",
            "length_col",
            "n_epochs",
            "partition",
            "chunk_size",
            "n_clusters",
            "device",
            "budget",
            "oversample",
            "exchange_neighbors",
        )
        if getattr(args, key) is not None
    }
    if not any(key in given for key in ("k", "select_token_ratio", "budget_tokens")):
        given.setdefault("select_ratio", 0.1)
    settings = SelectSpec.from_mapping(given)
    load_before = os.getloadavg()
    started = time.perf_counter()
    runner = (
        LocalRunner(workers=args.workers or len(os.sched_getaffinity(0)))
        if args.runner == "local"
        else RayRunner(workers=args.workers, device=settings.selector.device)
    )
    ray_start = time.perf_counter() - started
    try:
        m = run_selection(args.data, args.out, settings, runner=runner, progress=args.progress)
    except BaseException as exc:  # a failed run still leaves its record (the 10M rerun did not)
        if args.results:
            out = Path(args.out)
            failed = {
                **run_record(),
                "failed": f"{type(exc).__name__}: {exc}",
                "started_epoch": time.time() - (time.perf_counter() - started),
                "wall_to_failure": time.perf_counter() - started,
                "disk": folder_sizes(out) if out.exists() else {},
                "files_by_folder": folder_times(out) if out.exists() else {},
                "loadavg_before": load_before,
                "loadavg_after": os.getloadavg(),
                "settings": given,
            }
            write_json(Path(args.results), failed)
        raise
    finally:
        runner.close()
    wall = time.perf_counter() - started
    t, s = m["totals"], m["summary"]
    figures = {
        **run_record(),
        "n_docs": t["n_docs"],
        "n_shards": m["input"]["n_shards"],
        "n_groups": t["n_groups"],
        "k": t["k"],
        "partition": m["partition"],
        "runner": m["runner"],
        "seconds": {"wall_incl_ray_start": wall, "ray_start": ray_start, **t["seconds"]},
        "docs_per_second": t["n_docs"] / wall,
        "select_docs_per_second": t["select_docs_per_second"],
        "group_seconds": s["group_seconds"],
        "peak_rss_mb_per_worker": s["peak_rss_mb_per_worker"],
        "peak_rss_mb_global_round": s.get("peak_rss_mb_global_round"),
        "budget": {k: v for k, v in m["budget"].items() if k != "global_round"},
        "global_round_seconds": (m["budget"].get("global_round") or {}).get("seconds"),
        "driver_peak_rss_mb": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024,
        "gpu_peak_mb_per_worker": s["gpu_peak_mb_per_worker"],
        "devices": s["devices"],
        "workers_seen": s["workers_seen"],
        "workers": args.workers or len(os.sched_getaffinity(0)),
        "peak_rss_mb_write": (m["budget"].get("global_round") or {}).get("peak_rss_mb_write"),
        "allocation_rounds": (m["budget"].get("global_round") or {}).get("rounds"),
        "groups_reused": t["groups_reused"],
        "settings": m["settings"],
        "host": {  # "machine" (ledger.machine()) is the short name; runs before had this there
            "cpus": os.cpu_count(),
            "loadavg_before": load_before,
            "loadavg_after": os.getloadavg(),
            "gpu": torch.cuda.get_device_name(0) if torch.cuda.is_available() else None,
            "torch": torch.__version__,
            "python": platform.python_version(),
        },
    }
    figures["phases"] = phase_facts(m, Path(args.out))
    path = results_path(args, f"{size_name(t['n_docs'])}-run")
    write_json(path, figures)
    print(f"figures: {path}")
    gpu = figures["gpu_peak_mb_per_worker"]
    print(
        "| docs | shards | groups | workers | wall s | docs/s | group s (median) "
        "| peak RSS/worker MB | driver RSS MB | GPU peak/worker MB |"
    )
    print("|---|---|---|---|---|---|---|---|---|---|")
    print(
        f"| {t['n_docs']:,} | {figures['n_shards']} | {t['n_groups']} "
        f"| {figures['workers_seen']} | {wall:.0f} | {figures['docs_per_second']:,.0f} "
        f"| {s['group_seconds']['median']:.1f} | {s['peak_rss_mb_per_worker']:.0f} "
        f"| {figures['driver_peak_rss_mb']:.0f} | {'-' if gpu is None else f'{gpu:.0f}'} |"
    )


if __name__ == "__main__":
    main()
