"""The cover phase of one sharded run, timed A/B on the same inputs: two codes resume the
same run stopped after its allocation (the exchange round done, graphs saved), and their
``OUT/covered/`` are compared value by value.

    # 1. a run stopped before its cover (a folder where group 0's kept rows go)
    PYTHONPATH=src python benchmarks/scale/cover_ab.py prepare --data /tmp/os/200k \\
        --snapshot /tmp/os/snap
    # 2. each code resumes a copy of it (alternate them); one JSON line each
    PYTHONPATH=/work/main/src python benchmarks/scale/cover_ab.py resume \\
        --snapshot /tmp/os/snap --out /tmp/os/ab-base1 --label base >> /tmp/os/ab.jsonl
    PYTHONPATH=src python benchmarks/scale/cover_ab.py resume \\
        --snapshot /tmp/os/snap --out /tmp/os/ab-head1 --label head >> /tmp/os/ab.jsonl
    # 3. the two covers, value by value
    python benchmarks/scale/cover_ab.py compare /tmp/os/ab-base1 /tmp/os/ab-head1 > /tmp/os/cmp.json
    # 4. the ledger file: results/<date>-<machine>-200k-cover-ab.json
    python benchmarks/scale/cover_ab.py record --rows /tmp/os/ab.jsonl --compare /tmp/os/cmp.json \
        --base 63db509

Settings: the library's defaults with ``select_ratio=0.1`` (``run.py``'s), the local pool
of ``--workers`` processes. ``prepare`` must run with the code that keeps the graphs for
the cover (the snapshot then serves both).
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import time
from pathlib import Path

import numpy as np
import pyarrow.parquet as pq

HERE = Path(__file__).resolve().parent


def _run(data: str, out: Path, workers: int) -> dict:
    from datamask.config import SelectSpec
    from datamask.distributed import LocalRunner, run_selection

    runner = LocalRunner(workers=workers)
    try:
        spec = SelectSpec.from_mapping({"select_ratio": 0.1})
        return run_selection(data, out, spec, runner=runner, progress=False)
    finally:
        runner.close()


def prepare(args: argparse.Namespace) -> None:
    snap = Path(args.snapshot)
    blocker = snap / "_work" / "cover" / "kept-00000.parquet"
    blocker.mkdir(parents=True)
    try:
        _run(args.data, snap, args.workers)
    except OSError:
        pass
    else:
        raise SystemExit("the run finished: the blocker did not stop its cover")
    blocker.rmdir()
    (snap / "data.txt").write_text(args.data)
    print(sorted(p.name for p in (snap / "_work").iterdir()))


def resume(args: argparse.Namespace) -> None:
    snap, out = Path(args.snapshot), Path(args.out)
    shutil.copytree(snap, out)
    load = os.getloadavg()
    started = time.perf_counter()
    m = _run((snap / "data.txt").read_text(), out, args.workers)
    wall = time.perf_counter() - started
    c = m["cover"]
    row = {
        "label": args.label,
        "wall": wall,
        "cover": c["seconds"],
        "routes": c["routes"],
        "floor_routes": c["floor_routes"],
        "exact": c["exact"],
        "rows": c["rows"],
        "load_before": load,
        "load_after": os.getloadavg(),
    }
    print(json.dumps(row))


def compare(args: argparse.Namespace) -> None:
    a, b = (
        pq.read_table(Path(p) / "covered").sort_by(m)
        for p, m in ((args.a, "chunk_id"), (args.b, "chunk_id"))
    )
    same_by = np.asarray(a["covered_by"].to_pylist()) == np.asarray(b["covered_by"].to_pylist())
    sa, sb = a["covered_sim"].to_numpy(), b["covered_sim"].to_numpy()
    ea, eb = a["covered_exact"].to_numpy(), b["covered_exact"].to_numpy()
    diff = sb - sa
    out = {
        "rows": a.num_rows,
        "same_ids_groups_selected": a.select(["chunk_id", "group", "selected"]).equals(
            b.select(["chunk_id", "group", "selected"])
        ),
        "covered_by_equal": int(same_by.sum()),
        "covered_sim_equal": int((sa == sb).sum()),
        "covered_sim_within_1e-6": int((np.abs(diff) <= 1e-6).sum()),
        "b_higher_by_more_than_1e-6": int((diff > 1e-6).sum()),
        "b_lower_by_more_than_1e-6": int((diff < -1e-6).sum()),
        "mean_sim_a": float(sa.mean()),
        "mean_sim_b": float(sb.mean()),
        "exact_a": int(ea.sum()),
        "exact_b": int(eb.sum()),
    }
    print(json.dumps(out))


def record(args: argparse.Namespace) -> None:
    import sys

    sys.path.insert(0, str(HERE.parent / "_lib"))
    from ledger import result_path, run_record, write_json

    rows = [json.loads(line) for line in Path(args.rows).read_text().splitlines() if line]
    compare = json.loads(Path(args.compare).read_text())
    path = result_path(HERE, args.what)
    write_json(path, run_record(base=args.base, rows=rows, compare=compare))
    print(path)


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    sub = p.add_subparsers(dest="command", required=True)
    q = sub.add_parser("prepare")
    q.add_argument("--data", required=True)
    q.add_argument("--snapshot", required=True)
    q.add_argument("--workers", type=int, default=2)
    r = sub.add_parser("resume")
    r.add_argument("--snapshot", required=True)
    r.add_argument("--out", required=True)
    r.add_argument("--label", required=True)
    r.add_argument("--workers", type=int, default=2)
    c = sub.add_parser("compare")
    c.add_argument("a")
    c.add_argument("b")
    w = sub.add_parser("record")
    w.add_argument("--rows", required=True)
    w.add_argument("--compare", required=True)
    w.add_argument("--base", required=True, help="the base code's commit")
    w.add_argument("--what", default="200k-cover-ab")
    args = p.parse_args()
    steps = {"prepare": prepare, "resume": resume, "compare": compare, "record": record}
    steps[args.command](args)


if __name__ == "__main__":
    main()
