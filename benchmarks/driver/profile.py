"""What the driver of a sharded selection holds per group: tracemalloc at its peak, by holder.

    python benchmarks/driver/profile.py --one 100 1000 200000 0.1   # one point, one process
    python benchmarks/driver/profile.py --out benchmarks/driver/profile.jsonl  # G 100 and 1,000

Runs the point of ``sweep.py`` (same data under ``--data``, same settings: cluster
partition, ``--method random --budget group --selected-only``, two-process
:class:`~datamask.distributed.LocalRunner`) with :mod:`tracemalloc` on in the driver only
(the workers are spawned without it). The driver's phases (:data:`PHASES`, looked up in
``datamask.distributed.runner``) are wrapped to record the traced bytes when each starts
and ends and the peak while it ran; when the manifest is built, the heap is snapshotted
and grouped by holder: the innermost ``datamask`` frame of each allocation's traceback (or,
when none, the innermost frame). Also reported: the peak RSS (tracemalloc's own tables
raise it: compare RSS from ``sweep.py``) and the manifest's size as JSON. ``--out`` runs
G = 100 and G = 1,000 at S = 100 in fresh processes and appends both; the difference
per group, holder by holder, is what the driver holds per group. Run it alone
(``flock -x /work/cpu.lock``).
"""

from __future__ import annotations

import json
import linecache
import os
import resource
import sys
import tempfile
import tracemalloc
from pathlib import Path
from typing import Any

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))
from sweep import (  # noqa: E402  (the same data, run and command line)
    corpus_at,
    light_settings,
    point_command,
    point_of,
    point_parser,
    point_row,
)

#: The two points compared: S = 100 shards, G = C = 100 and 1,000 clusters, 200k docs.
POINTS = [(100, 100, 200_000, 0.1), (100, 1000, 200_000, 0.1)]


def _holder(trace: tracemalloc.Trace, repo: str) -> str:
    """The innermost frame of ``trace`` inside datamask (else the innermost frame)."""
    frames = list(trace.traceback)[::-1]  # most recent first
    for frame in frames:
        if frame.filename.startswith(repo):
            name = frame.filename[len(repo) + 1 :]
            line = linecache.getline(frame.filename, frame.lineno).strip()[:50]
            return f"{name}:{frame.lineno} {line}"
    f = frames[0]
    return f"{'/'.join(f.filename.rsplit('/', 2)[-2:])}:{f.lineno}"


def _by_holder(snap: tracemalloc.Snapshot, repo: str, top: int) -> dict[str, float]:
    holders: dict[str, int] = {}
    for trace in snap.traces:
        key = _holder(trace, repo)
        holders[key] = holders.get(key, 0) + trace.size
    ranked = sorted(holders.items(), key=lambda kv: -kv[1])[:top]
    return {k: round(v / 1024, 1) for k, v in ranked}


#: The driver's phases (names in ``datamask.distributed.runner``), wrapped to record the
#: traced bytes when each ends and the peak while it ran (``tracemalloc.reset_peak``).
PHASES = ["plan_groups", "select_round", "keep_round", "build_manifest", "atomic_write_json"]


def _wrap_phases(module: Any, record: dict[str, Any], repo: str, top: int) -> None:
    for name in PHASES:
        original = getattr(module, name)

        def wrapped(*args: Any, _f: Any = original, _n: str = name, **kwargs: Any) -> Any:
            before, _ = tracemalloc.get_traced_memory()
            tracemalloc.reset_peak()
            out = _f(*args, **kwargs)
            after, peak = tracemalloc.get_traced_memory()
            record[_n] = {
                "before_kb": round(before / 1024),
                "peak_above_before_kb": round((peak - before) / 1024),
                "after_kb": round(after / 1024),
            }
            if _n == "build_manifest":  # what the driver holds once every phase has run
                snap = tracemalloc.take_snapshot()
                record["holders_at_manifest_kb"] = _by_holder(snap, repo, top)
            return out

        setattr(module, name, wrapped)


def one_point(shards: int, clusters: int, n_docs: int, ratio: float, data: Path, top: int) -> dict:
    corpus = corpus_at(data, n_docs, shards, clusters, 16)
    import datamask
    from datamask.config import SelectSpec
    from datamask.distributed import LocalRunner, run_selection

    repo = str(Path(datamask.__file__).parent)
    base_kb = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    settings = SelectSpec.from_mapping(light_settings(clusters, n_docs, ratio))
    import datamask.distributed.runner as driver

    phases: dict[str, Any] = {}
    _wrap_phases(driver, phases, repo, top)
    tracemalloc.start(8)
    runner = LocalRunner(workers=2)
    with tempfile.TemporaryDirectory(prefix="datamask-profile-") as tmp:
        try:
            out = Path(tmp) / "out"
            manifest = run_selection(corpus, out, settings, runner=runner, progress=False)
        finally:
            runner.close()
    traced_now, traced_peak = tracemalloc.get_traced_memory()
    tracemalloc.stop()
    peak_kb = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    return {
        "shards": shards,
        "clusters": clusters,
        "groups": manifest["totals"]["n_groups"],
        "driver_base_mb": round(base_kb / 1024, 1),
        "driver_peak_mb": round(peak_kb / 1024, 1),
        "traced_peak_mb": round(traced_peak / 2**20, 2),
        "traced_end_mb": round(traced_now / 2**20, 2),
        "manifest_json_kb": round(len(json.dumps(manifest, indent=2)) / 1024, 1),
        "manifest_groups_json_kb": round(len(json.dumps(manifest["groups"], indent=2)) / 1024, 1),
        "phases": phases,
        "datamask": repo,
        "load": os.getloadavg()[0],
    }


def main() -> None:
    p = point_parser(__doc__.splitlines()[0])
    p.add_argument("--top", type=int, default=40, help="holders reported (default 40)")
    args = p.parse_args()
    if args.one:
        print(json.dumps(one_point(*point_of(args.one), args.data, args.top)), flush=True)
        return
    rows = []
    for point in POINTS:
        cmd = point_command(__file__, point, args.data, "--top", str(args.top))
        rows.append(row := point_row(cmd, list(point), None, args.out))
        if "error" in row:  # the per-group arithmetic below needs both points
            sys.exit(f"point {list(point)} failed: {row['error']}")
    small, large = rows
    dg = large["groups"] - small["groups"]
    print(f"per group (G {small['groups']} -> {large['groups']}):")
    for name in PHASES:
        for key in ("peak_above_before_kb", "after_kb"):
            d = large["phases"][name][key] - small["phases"][name][key]
            print(f"  {name:18s} {key:22s} {1024 * d / dg:8.0f} B")
    hs, hl = small["phases"]["holders_at_manifest_kb"], large["phases"]["holders_at_manifest_kb"]
    diff = {k: hl.get(k, 0) - hs.get(k, 0) for k in set(hs) | set(hl)}
    print("  held when the manifest is built, by holder:")
    for k, v in sorted(diff.items(), key=lambda kv: -abs(kv[1]))[:15]:
        print(f"    {1024 * v / dg:8.0f} B  {k}")
    rss = 1024 * 1024 * (large["driver_peak_mb"] - small["driver_peak_mb"]) / dg
    print(f"  RSS peak (under tracemalloc): {rss:.0f} B per group")


if __name__ == "__main__":
    main()
