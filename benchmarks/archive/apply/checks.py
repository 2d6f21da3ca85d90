"""What apply's provenance checks cost by themselves, on the 1M-row benchmark selection.

    python benchmarks/apply/run.py ... --compare ...     # makes WORK/sel-1M (see run.py)
    python benchmarks/archive/apply/checks.py --data /tmp/datamask-apply/1m \
        --selection /tmp/datamask-apply/runs/sel-1M --repeat 5

Times, in this process, the checks ``apply`` runs before writing (docs/provenance.md):
(1) the input's fingerprints against the selection's record when the input is the very
files the selection read (stat only), (2) the same when they are not (a moved corpus: the
content checksum of every shard), (3) the id probe of the selected-ids mode (reads ids until
the first selected one). Prints the fastest of ``--repeat`` and the 1-minute load average.
"""

from __future__ import annotations

import argparse
import json
import os
import time
from pathlib import Path

from datamask.applying.inputs import _format, _input_shards
from datamask.applying.plan import _plan, _probe_ids, _selection_meta
from datamask.io.fs import resolve
from datamask.io.keep import relative_names
from datamask.io.listing import glob_root
from datamask.io.provenance import verify_inputs


def fastest(fn, repeat: int) -> float:
    best = float("inf")
    for _ in range(repeat):
        started = time.perf_counter()
        fn()
        best = min(best, time.perf_counter() - started)
    return best


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--data", required=True)
    p.add_argument("--selection", required=True, help="run.py's sel-1M folder")
    p.add_argument("--repeat", type=int, default=5)
    args = p.parse_args()
    src, sel = resolve(args.data), resolve(args.selection)
    shards = _input_shards(src, sel)
    names = relative_names(glob_root(src), [s.path for s in shards])
    is_dir, meta = _selection_meta(sel)
    record = meta["provenance"]
    inputs = list(zip(names, shards, strict=True))
    load = os.getloadavg()[0]
    same = fastest(lambda: verify_inputs(record, inputs, selection=sel.uri), args.repeat)
    moved = json.loads(json.dumps(record))
    for entry in moved["files"].values():
        entry["path"] = "/elsewhere/" + Path(entry["path"]).name  # as if copied from there
    other = fastest(lambda: verify_inputs(moved, inputs, selection=sel.uri), 1)
    ids_sel = resolve(str(Path(args.selection) / "selected" / "part-00000.parquet"))
    _, ids_meta = _selection_meta(ids_sel)
    plan = _plan(ids_sel, False, ids_meta, names, "chunk_id")
    formats = [_format(n) for n in names]
    probe = fastest(
        lambda: _probe_ids(shards, formats, plan, "chunk_id", 65_536, ids_sel.uri), args.repeat
    )
    print(f"{len(shards)} shards; load 1m {load:.1f}")
    print("| check | seconds |")
    print("|---|---:|")
    print(f"| fingerprints, the files the selection read (stat) | {same:.4f} |")
    print(f"| fingerprints, a moved corpus (checksum of every shard) | {other:.2f} |")
    print(f"| id probe (selected-ids mode) | {probe:.4f} |")


if __name__ == "__main__":
    main()
