"""The driver's peak memory of a sharded selection as shards x clusters and k grow.

    python benchmarks/driver/sweep.py --out benchmarks/driver/results/<date>-<machine>-sweep.jsonl
    python benchmarks/driver/sweep.py --one 100 100 200000 0.1   # a single point

Every point is a fresh Python process (``ru_maxrss`` never goes down, so points cannot
share one), which generates its corpus once under ``--data`` (``benchmarks/scale/
generate.py``'s layout: ``--dim`` wide, ``S`` shards, drawn around ``C`` true clusters),
then runs :func:`datamask.distributed.run_selection` with ``--partition cluster`` into
``C`` k-means clusters (``chunk_size`` above any cluster: one group per cluster, no
splits), ``--method random`` and ``--budget group`` (so the group steps cost little
besides their reads) and ``selected_only`` (no cover round), on a two-process
:class:`~datamask.distributed.LocalRunner`: every step runs in a worker, the driver only
schedules. Reported per point: the driver's own peak RSS
(``getrusage(RUSAGE_SELF)``) and its RSS after imports (the fixed base), the workers'
largest peak (``RUSAGE_CHILDREN``) against one group step's peak alone (the largest group
selected again in a fresh process: issue 30 asks every worker to stay within 1.2x of it),
the driver's and the workers' CPU seconds, the wall
seconds and the manifest's phases, the group steps' read seconds and the gather steps'
(from their markers), the groups and the 1-minute load average before and after. The
code measured is the ``datamask`` on ``PYTHONPATH`` (recorded as ``datamask``), so the
same script times an older checkout's ``src``. Run it alone
(``flock -x /work/cpu.lock``): the machine has two cores.
"""

from __future__ import annotations

import argparse
import json
import os
import resource
import subprocess
import sys
import tempfile
import time
from pathlib import Path

GENERATE = Path(__file__).resolve().parents[1] / "scale" / "generate.py"

#: (shards, clusters, documents, select ratio): S x C from 1e4 to 1e6 at k = 2e4, then k
#: from 1e4 to 4e5 at S x C = 1e4.
POINTS = [
    (100, 100, 200_000, 0.1),
    (316, 316, 200_000, 0.1),
    (1000, 1000, 200_000, 0.1),
    (100, 1000, 200_000, 0.1),  # G = 1,000 at S = 100: the driver's bytes per group
    (100, 100, 1_000_000, 0.01),
    (100, 100, 1_000_000, 0.1),
    (100, 100, 1_000_000, 0.4),
]

#: One group step in a fresh process (what a worker needs for one group): reads the
#: largest group's gathered object and selects it, as the run did; prints its peak RSS (KB):
#: its own high-water mark (results/2026-11-26-cpu2-sweep-driverkb.jsonl's probe used
#: ru_maxrss, which Linux starts at the parent's RSS in a forked child: there it is
#: max(driver's RSS, step's)).
ONE_STEP = """
import json, resource, sys
import torch
from datamask.config import SelectSpec
from datamask.distributed import Group, GroupJob, Piece, SelectGroup, execute
torch.set_num_threads(1)
settings, path, gid, n, k, seed, work, out = json.loads(sys.argv[1])
group = Group(gid, "probe", (Piece(path, 0, n),), k, seed)
try:  # the places as the measured code's jobs carry them
    from datamask.distributed.paths import WorkDir
    places = (WorkDir(out, work),)
except ImportError:  # code before WorkDir: the two folders
    places = (work, out)
execute(SelectGroup(), GroupJob(group, SelectSpec.from_mapping(settings).check(), *places))
# VmHWM, not ru_maxrss: a forked child's ru_maxrss starts at its parent's RSS (Linux)
hwm = [x for x in open("/proc/self/status") if x.startswith("VmHWM")]
print(hwm[0].split()[1] if hwm else resource.getrusage(resource.RUSAGE_SELF).ru_maxrss)
"""


def corpus_at(data: Path, n_docs: int, shards: int, clusters: int, dim: int) -> Path:
    """The generated corpus of one point under ``data`` (generated on first use)."""
    corpus = data / f"n{n_docs}-s{shards}-c{clusters}-d{dim}"
    if not (corpus / "_done").exists():
        cmd = [sys.executable, str(GENERATE), "--out", str(corpus), "--n-docs", str(n_docs)]
        cmd += ["--dim", str(dim), "--n-shards", str(shards), "--n-clusters", str(clusters)]
        subprocess.run(cmd, check=True, capture_output=True)
        (corpus / "_done").write_text("")
    return corpus


def light_settings(clusters: int, n_docs: int, ratio: float) -> dict:
    """A cluster-partitioned run whose steps cost little besides their reads: one group per
    k-means cluster (``chunk_size`` = N), ``random`` per group, no cover round."""
    return dict(
        method="random",
        select_ratio=ratio,
        partition="cluster",
        n_clusters=clusters,
        chunk_size=n_docs,
        budget="group",
        selected_only=True,
        seed=0,
    )


def point_parser(description: str) -> argparse.ArgumentParser:
    """The flags of every driver benchmark here: ``--out``, ``--data``, ``--one``."""
    p = argparse.ArgumentParser(description=description)
    p.add_argument("--out", type=Path, help="append one JSON line per point here")
    p.add_argument("--data", type=Path, default=Path("/tmp/datamask-driver"))
    p.add_argument("--one", nargs=4, metavar=("S", "C", "N", "RATIO"), help="one point only")
    return p


def point_of(one: list[str]) -> tuple[int, int, int, float]:
    """``--one S C N RATIO`` as numbers."""
    return int(one[0]), int(one[1]), int(one[2]), float(one[3])


def point_command(script: str, point: tuple, data: Path, *extra: str) -> list[str]:
    """The command that measures one point in a fresh process (``script --one ...``)."""
    return [sys.executable, script, "--one", *map(str, point), "--data", str(data), *extra]


def point_row(cmd: list[str], point: object, timeout: float | None, out: Path | None) -> dict:
    """Run one point's ``--one`` command in a fresh process; its JSON line (or the error)
    as a row, with its wall seconds, printed and appended to ``out``."""
    started = time.perf_counter()
    try:
        done = subprocess.run(cmd, capture_output=True, text=True, timeout=timeout)
        line = done.stdout.strip().splitlines()[-1] if done.returncode == 0 else None
        row = json.loads(line) if line else {"error": done.stderr.strip()[-500:]}
    except subprocess.TimeoutExpired:
        row = {"error": f"not measured: over {timeout:.0f} s"}
    row = {"point": point, **row, "wall_s": round(time.perf_counter() - started, 1)}
    print(json.dumps(row), flush=True)
    if out:
        with open(out, "a") as fh:
            fh.write(json.dumps(row) + "\n")
    return row


def _mb(kb: int) -> float:
    return kb / 1024


def phase_seconds(seconds: dict) -> dict:
    """The manifest's phases; ``after_s`` is what follows the select round (with
    ``selected_only`` and a budget per group: the keep lists and the manifest)."""
    after = seconds["total"] - seconds["plan"] - seconds["select"] - (seconds["global"] or 0)
    after -= seconds["cover"] or 0
    return {
        "plan_s": round(seconds["plan"], 1),
        "select_s": round(seconds["select"], 1),
        "after_s": round(after, 1),
    }


def _places(work: Path) -> object:
    """The work dir as the measured code's ``gather_summary`` takes it."""
    try:
        from datamask.distributed.paths import WorkDir
    except ImportError:  # code before WorkDir: the folder
        return work
    return WorkDir(str(work.parent), str(work))


def step_seconds(work: Path) -> dict:
    """From the steps' markers (JSON files of the work dir): the group steps' read seconds
    (sum and largest) and the gather steps' seconds (sum; absent before issue 30's gather)."""
    from datamask.distributed.plan.gather import (
        gather_summary,  # the measured code's, on PYTHONPATH
    )

    reads = [
        json.loads(p.read_text())["seconds"]["read"]
        for p in (work / "completions").iterdir()
        if p.name.isdigit()
    ]
    gathered = (work / "clusters" / "groups").is_dir()
    return {
        "group_read_s_sum": round(sum(reads), 2),
        "group_read_s_max": round(max(reads), 3),
        "gather_s_sum": round(gather_summary(_places(work))["seconds"], 1) if gathered else None,
    }


def one_step_peak_kb(mapping: dict, manifest: dict, tmp: Path) -> int:
    """The peak RSS (KB) of one group step alone: the run's largest group selected again
    by :class:`~datamask.distributed.SelectGroup` in a fresh process, from its gathered
    object (``WORK/clusters/groups/group-GGGGG.parquet``), into a scratch work dir. (It
    is a child too: the caller reads ``RUSAGE_CHILDREN`` before.)"""
    g = max(manifest["groups"], key=lambda g: g["n"])
    path = tmp / "out" / "_work" / "clusters" / "groups" / f"group-{g['gid']:05d}.parquet"
    args = [mapping, str(path), g["gid"], g["n"], g["k"], g["seed"]]
    args += [str(tmp / "probe-work"), str(tmp / "probe-out")]
    done = subprocess.run(
        [sys.executable, "-c", ONE_STEP, json.dumps(args)],
        capture_output=True,
        text=True,
    )
    if done.returncode:
        raise RuntimeError(f"the one-step probe failed: {done.stderr.strip()[-800:]}")
    return int(done.stdout.strip().splitlines()[-1])


def one_point(shards: int, clusters: int, n_docs: int, ratio: float, data: Path, dim: int) -> dict:
    """Generate (once) and select one point in this process; returns its figures."""
    corpus = corpus_at(data, n_docs, shards, clusters, dim)
    import datamask
    from datamask.config import SelectSpec
    from datamask.distributed import LocalRunner, run_selection

    base_kb = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    mapping = light_settings(clusters, n_docs, ratio)
    settings = SelectSpec.from_mapping(mapping)
    load_before = os.getloadavg()[0]
    self0 = resource.getrusage(resource.RUSAGE_SELF)
    started = time.perf_counter()
    runner = LocalRunner(workers=2)
    with tempfile.TemporaryDirectory(prefix="datamask-driver-") as tmp:
        try:
            manifest = run_selection(
                corpus, Path(tmp) / "out", settings, runner=runner, progress=False
            )
        finally:
            runner.close()
        wall = time.perf_counter() - started
        steps = step_seconds(Path(tmp) / "out" / "_work")
        me = resource.getrusage(resource.RUSAGE_SELF)
        kids = resource.getrusage(resource.RUSAGE_CHILDREN)  # before the probe's process
        step_kb = one_step_peak_kb(mapping, manifest, Path(tmp))
    return {
        "shards": shards,
        "clusters": clusters,
        "s_x_c": shards * clusters,
        "n_docs": n_docs,
        "k": manifest["totals"]["k"],
        "groups": manifest["totals"]["n_groups"],
        "driver_base_mb": round(_mb(base_kb), 1),
        "driver_peak_mb": round(_mb(me.ru_maxrss), 1),
        "driver_above_base_mb": round(_mb(me.ru_maxrss - base_kb), 1),
        "workers_peak_mb": round(_mb(kids.ru_maxrss), 1),
        "one_group_step_peak_mb": round(_mb(step_kb), 1),
        "workers_over_one_step": round(kids.ru_maxrss / step_kb, 2),
        "driver_cpu_s": round(me.ru_utime + me.ru_stime - self0.ru_utime - self0.ru_stime, 1),
        "workers_cpu_s": round(kids.ru_utime + kids.ru_stime, 1),
        "wall_s": round(wall, 1),
        **phase_seconds(manifest["totals"]["seconds"]),
        **steps,
        "datamask": str(Path(datamask.__file__).parents[1]),
        "load_before": round(load_before, 2),
        "load_after": round(os.getloadavg()[0], 2),
    }


def main() -> None:
    p = point_parser(__doc__.splitlines()[0])
    p.add_argument("--dim", type=int, default=16, help="embedding width (default 16)")
    p.add_argument("--timeout", type=float, default=300, help="seconds per point (default 300)")
    args = p.parse_args()
    if args.one:
        print(json.dumps(one_point(*point_of(args.one), args.data, args.dim)), flush=True)
        return
    for point in POINTS:
        cmd = point_command(__file__, point, args.data, "--dim", str(args.dim))
        point_row(cmd, list(point), args.timeout, args.out)


if __name__ == "__main__":
    main()
