"""What the validation pass of a sharded selection costs, next to the selection itself.

    python benchmarks/scale/generate.py --out /tmp/datamask-rel/100k --n-docs 100000 \
        --dim 384 --n-shards 10
    python benchmarks/reliability/run.py --data /tmp/datamask-rel/100k --repeat 2

Times, in one process and one after another with the same thread count: (1) the
validation pass alone (every row of every shard read, checked, ids hashed, stored bytes
checksummed: ``scan_jobs`` + ``check_scans`` on a ``LocalRunner``), (2) a whole
``run_selection`` with the default learner settings (which includes the pass). Prints a
markdown table with the 1-minute load average (the machine is shared).
"""

from __future__ import annotations

import argparse
import os
import resource
import shutil
import tempfile
import time
from pathlib import Path

import torch

from datamask.config import SelectSpec
from datamask.distributed import LocalRunner, run_selection
from datamask.distributed.check.validate import ScanShard, check_scans, scan_jobs
from datamask.distributed.engine import run_steps
from datamask.distributed.paths import WorkDir
from datamask.io.shards import inspect_shards, list_shards


def validation_pass(data: Path, settings: SelectSpec) -> float:
    infos = inspect_shards(list_shards(data), columns=settings.columns.read)
    started = time.perf_counter()
    runner = LocalRunner()
    with tempfile.TemporaryDirectory(prefix="datamask-ids-") as work:
        dirs = WorkDir.of(Path(work) / "out", work)
        scans = run_steps(runner, ScanShard(), scan_jobs(infos, settings, dirs), progress=False)
        check_scans(scans, infos, settings, runner, dirs)
    return time.perf_counter() - started


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--data", type=Path, required=True)
    p.add_argument("--repeat", type=int, default=2)
    p.add_argument("--select-ratio", type=float, default=0.1)
    args = p.parse_args()
    settings = SelectSpec.from_mapping(dict(select_ratio=args.select_ratio))
    n_docs = sum(i.num_rows for i in inspect_shards(list_shards(args.data)))
    rows = []
    for r in range(args.repeat):
        load = os.getloadavg()[0]
        v = validation_pass(args.data, settings)
        out = Path(tempfile.mkdtemp(prefix="datamask-rel-"))
        try:
            started = time.perf_counter()
            run_selection(args.data, out / "run", settings, runner=LocalRunner(), progress=False)
            total = time.perf_counter() - started
        finally:
            shutil.rmtree(out)
        rows.append((r + 1, v, total, load))
    peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024
    print(f"N={n_docs:,}, torch threads {torch.get_num_threads()}, peak RSS {peak:.0f} MB")
    print("| repeat | validation pass s | whole run s (pass included) | pass / run | load 1m |")
    print("|---:|---:|---:|---:|---:|")
    for r, v, total, load in rows:
        print(f"| {r} | {v:.2f} | {total:.1f} | {v / total:.1%} | {load:.1f} |")


if __name__ == "__main__":
    main()
