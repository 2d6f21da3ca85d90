"""The plan phase before and after one scan of the corpus (issue 43, "read once").

    python benchmarks/scale/generate.py --out /tmp/onescan/c200k --n-docs 200000 --dim 384 \
        --n-shards 20
    git archive <base> src | tar -x -C /tmp/onescan/base
    python benchmarks/scale/one_scan.py --data /tmp/onescan/c200k --base-src /tmp/onescan/base/src \
        --head-src src --pairs 2

Runs ``benchmarks/scale/run.py --runner local --workers 2`` on the same corpus with the
base's code and this checkout's, alternated (base, head, base, head), each in a fresh
output folder, and reads each run's phase split from its figures: the plan phase
(``seconds.plan``: check + fit + spill + gather) and its parts (``partition.seconds``; the
base has no ``check`` key, so its check is the plan less fit, spill and gather). The
selections are compared id for id. The load average is recorded beside every run.

Bytes of the corpus read by the plan phase are counted from the shards' footers, not
timed: the compressed size of every column chunk each pass opens (the check's decode and
its checksum of the stored bytes, the k-means sample's row groups, the spill, the token
count). The figures go to ``results/<date>-<machine>-one-scan.json`` (``_lib/ledger.py``).
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
from pathlib import Path
from typing import Any

import numpy as np
import pyarrow.dataset as ds
import pyarrow.parquet as pq

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE.parent / "_lib"))
from ledger import result_path, run_record, write_json  # noqa: E402


def chunk_bytes(path: Path, columns: set[str], row_groups: list[int] | None = None) -> int:
    """Compressed bytes of ``columns``' chunks in ``row_groups`` (all: None) of ``path``."""
    meta = pq.ParquetFile(path).metadata
    groups = range(meta.num_row_groups) if row_groups is None else row_groups
    total = 0
    for rg in groups:
        group = meta.row_group(rg)
        for i in range(group.num_columns):
            if group.column(i).path_in_schema.split(".")[0] in columns:
                total += group.column(i).total_compressed_size
    return total


def plan_bytes(data: Path, n_sample: int, seed: int) -> dict[str, int]:
    """Bytes of the corpus each pass of the plan phase reads, by the shards' footers
    (default columns: ``chunk_id``, ``quality_score``, ``feature_arr``)."""
    from datamask.distributed.plan.partition import sample_plan
    from datamask.io.shards import inspect_shards, list_shards

    files = list_shards(str(data))
    infos = inspect_shards(files, columns=["chunk_id", "quality_score", "feature_arr"])
    read = {"chunk_id", "quality_score", "feature_arr"}
    columns = sum(chunk_bytes(Path(i.path), read) for i in infos)
    sampled = 0
    for s, rows in sample_plan(infos, n_sample, seed).items():
        starts = infos[s].row_group_starts()
        touched = np.unique(np.searchsorted(starts, rows, side="right") - 1).tolist()
        sampled += chunk_bytes(Path(infos[s].path), {"feature_arr"}, touched)
    return {
        "corpus_columns": columns,
        "sample": sampled,
        "base": columns + columns + sampled + columns,  # check, its checksum, sample, spill
        "head": sampled + columns + columns,  # sample, check with the spill, its checksum
        "base_decoded": columns + sampled + columns,  # without the checksum's raw re-read
        "head_decoded": sampled + columns,
    }


def selected_ids(out: Path) -> list[str]:
    """The kept ids of a run, sorted."""
    table = ds.dataset(out / "selected", format="parquet").to_table(columns=["chunk_id"])
    return sorted(table.column("chunk_id").to_pylist())


def one_run(src: str, data: Path, workers: int, epochs: int, scratch: Path) -> dict[str, Any]:
    """``run.py`` with the code under ``src``; its figures, with the selection's ids."""
    out = Path(tempfile.mkdtemp(prefix="run-", dir=scratch))
    figures = out.with_suffix(".json")
    command = [
        sys.executable,
        str(HERE / "run.py"),
        "--data",
        str(data),
        "--out",
        str(out / "sel"),
        "--runner",
        "local",
        "--workers",
        str(workers),
        "--n-epochs",
        str(epochs),
        "--results",
        str(figures),
    ]
    env = {**os.environ, "PYTHONPATH": str(Path(src).resolve())}
    load = os.getloadavg()
    subprocess.run(command, env=env, check=True, capture_output=True)
    f = json.loads(figures.read_text())
    seconds = f["seconds"]
    part = dict(f["partition"].get("seconds") or {})
    if "check" not in part:  # the base: the check is the plan less its parts
        part["check"] = seconds["plan"] - sum(part.values())
    return {
        "src": src,
        "load_before": load,
        "load_after": os.getloadavg(),
        "wall": seconds["wall_incl_ray_start"],
        "plan": seconds["plan"],
        "plan_parts": part,
        "select": seconds["select"],
        "ids": selected_ids(out / "sel"),
    }


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--data", required=True, type=Path)
    p.add_argument("--base-src", required=True, help="the base's src/ folder")
    p.add_argument("--head-src", default="src", help="this checkout's src/ (default)")
    p.add_argument("--pairs", type=int, default=2)
    p.add_argument("--workers", type=int, default=2)
    p.add_argument("--n-epochs", type=int, default=20, help="the plan phase does not use it")
    p.add_argument("--scratch", type=Path, default=Path("/tmp/onescan/runs"))
    args = p.parse_args()
    args.scratch.mkdir(parents=True, exist_ok=True)
    runs = []
    for pair in range(args.pairs):
        for code, src in (("base", args.base_src), ("head", args.head_src)):
            run = one_run(src, args.data, args.workers, args.n_epochs, args.scratch)
            runs.append({"code": code, "pair": pair, **run})
            parts = " ".join(f"{k} {v:.1f}" for k, v in run["plan_parts"].items())
            load = run["load_before"][0]
            print(f"{code} pair {pair}: plan {run['plan']:.1f} s ({parts}), load {load:.1f}")
    same = all(r["ids"] == runs[0]["ids"] for r in runs)
    for r in runs:
        r["n_selected"] = len(r.pop("ids"))
    from datamask.distributed.plan.kmeans import SAMPLE_DEFAULT

    figures = {
        **run_record(),
        "data": str(args.data),
        "settings": {"workers": args.workers, "n_epochs": args.n_epochs, "runner": "local"},
        "same_selection": same,
        "bytes": plan_bytes(args.data, SAMPLE_DEFAULT, 0),
        "runs": runs,
    }
    path = result_path(HERE, "one-scan")
    write_json(path, figures)
    print(f"figures: {path}; same selection in every run: {same}")
    print(json.dumps(figures["bytes"]))


if __name__ == "__main__":
    main()
