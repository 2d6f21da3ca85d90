"""Memory and throughput of ``datamask apply`` on 1M rows (and 100k, to show memory is flat).

    python benchmarks/scale/generate.py --out /tmp/datamask-apply/1m --n-docs 1000000 \
        --dim 384 --n-shards 100
    python benchmarks/apply/run.py --data /tmp/datamask-apply/1m --work /tmp/datamask-apply/runs \
        --results benchmarks/apply/RESULTS.json
    # the provenance checks' cost: this tree against main's, alternately (docs/provenance.md)
    python benchmarks/apply/run.py --data /tmp/datamask-apply/1m --work /tmp/datamask-apply/runs \
        --results benchmarks/apply/PROVENANCE.json --compare /work/main/src --repeat 3

apply's cost does not depend on which rows are kept, only on how many, so the selection is
a seeded random 10% of the ids (selecting 1M documents is measured in benchmarks/scale).
It is written in the layout ``datamask select`` writes for a sharded run: ``selected/``,
``manifest.json`` with the selection digest, and ``keep/`` made by the same
:func:`datamask.io.keep.write_keep_lists` that select calls. Each apply runs as its own
process under ``/usr/bin/time -v`` (peak RSS of that process); the load average is
recorded, as the machine is shared.
"""

from __future__ import annotations

import argparse
import json
import os
import re
import shutil
import subprocess
import sys
import time
from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq

from datamask.io.keep import relative_names, write_keep_lists
from datamask.io.provenance import record_inputs


def make_selection(files: list[Path], root: Path, out: Path, ratio: float, seed: int) -> float:
    """A random ``ratio`` of the ids as a sharded selection folder with keep lists."""
    shutil.rmtree(out, ignore_errors=True)
    ids = pa.concat_arrays(
        [pq.read_table(f, columns=["chunk_id"]).column(0).combine_chunks() for f in files]
    )
    rng = np.random.default_rng(seed)
    chosen = np.sort(rng.choice(len(ids), size=round(ratio * len(ids)), replace=False))
    sel = ids.take(pa.array(chosen))
    (out / "selected").mkdir(parents=True)
    pq.write_table(pa.table({"chunk_id": sel}), out / "selected" / "part-00000.parquet")
    started = time.perf_counter()
    names = relative_names(str(root), [str(f) for f in files])
    index = write_keep_lists(files, names, sel, out / "keep", id_col="chunk_id")
    seconds = time.perf_counter() - started
    # What select records of its input (docs/provenance.md), and that the run finished.
    provenance = record_inputs(
        files, names, ["chunk_id", "quality_score", "feature_arr"], id_col="chunk_id"
    )
    manifest = {"selection_digest": index["selection"], "complete": True, "provenance": provenance}
    (out / "manifest.json").write_text(json.dumps(manifest))
    return seconds


def run_apply(args: list[str], env: dict[str, str]) -> dict[str, float | str]:
    cmd = ["/usr/bin/time", "-v", sys.executable, "-m", "datamask.cli", "apply", *args]
    started = time.perf_counter()
    proc = subprocess.run(cmd, capture_output=True, text=True, env=env)
    wall = time.perf_counter() - started
    if proc.returncode != 0:
        raise SystemExit(proc.stderr[-2000:])
    rss_kb = int(re.search(r"Maximum resident set size \(kbytes\): (\d+)", proc.stderr)[1])
    user = float(re.search(r"User time \(seconds\): ([0-9.]+)", proc.stderr)[1])
    system = float(re.search(r"System time \(seconds\): ([0-9.]+)", proc.stderr)[1])
    inside = re.search(r" in ([0-9.]+)s:", proc.stdout)
    return {
        "wall_s": wall,
        "apply_s": float(inside[1]) if inside else None,  # as printed: after imports
        "peak_rss_mb": rss_kb / 1024,
        "cpu_s": user + system,  # the process's CPU time: far less sensitive to load
        "stdout": proc.stdout.strip(),
    }


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--data", required=True, help="folder of the 1M-row shards (generate.py)")
    p.add_argument("--work", required=True, help="scratch folder for selections and outputs")
    p.add_argument("--results", required=True, help="JSON file for the measurements")
    p.add_argument("--ratio", type=float, default=0.1, help="fraction kept (default 0.1)")
    p.add_argument(
        "--compare",
        default=None,
        help="another source tree (e.g. /work/main/src): time the 1M applies of this tree and "
        "that one alternately, --repeat times each, on one selection (no 100k case)",
    )
    p.add_argument("--repeat", type=int, default=3, help="rounds of --compare (default 3)")
    args = p.parse_args()
    if args.compare:
        compare(Path(args.data), Path(args.work), Path(args.results), args)
        return
    data, work = Path(args.data), Path(args.work)
    files = sorted(data.glob("*.parquet"))
    env = {**os.environ, "PYTHONPATH": str(Path(__file__).resolve().parents[2] / "src")}
    # The interpreter with datamask (and torch, which the package imports) loaded: the
    # floor under every apply's peak RSS.
    base = run_apply(["--help"], env)
    results: list[dict] = [{"label": "imports only (datamask apply --help)", **base}]
    print(json.dumps(results[0]), flush=True)
    for label, subset in (("100k", files[:10]), ("1M", files)):
        sub = work / f"data-{label}"
        if label != "1M":  # a folder with the first shards only, as links
            shutil.rmtree(sub, ignore_errors=True)
            sub.mkdir(parents=True)
            for f in subset:
                (sub / f.name).symlink_to(f.resolve())
        else:
            sub = data
        n_rows = sum(pq.ParquetFile(f).metadata.num_rows for f in subset)
        size = sum(f.stat().st_size for f in subset)
        sel = work / f"sel-{label}"
        keep_s = make_selection(sorted(sub.glob("*.parquet")), sub, sel, args.ratio, 0)
        modes = [("keep lists", sel), ("selected ids", sel / "selected" / "part-00000.parquet")]
        for mode, selection in modes:
            out = work / f"out-{label}-{mode.replace(' ', '-')}"
            shutil.rmtree(out, ignore_errors=True)
            shutil.rmtree(str(out) + "-rm", ignore_errors=True)
            load_before = os.getloadavg()
            m = run_apply(
                ["--input", str(sub), "--selection", str(selection), "--output", str(out),
                 "--removed", str(out) + "-rm", "--removed-format", "curator",
                 "--no-progress"],
                env,
            )  # fmt: skip
            m.update(
                rows=n_rows,
                input_bytes=size,
                label=label,
                mode=mode,
                keep_lists_s=keep_s if mode == "keep lists" else None,
                rows_per_s=n_rows / m["wall_s"],
                rows_per_s_apply=n_rows / m["apply_s"] if m["apply_s"] else None,
                mb_per_s=size / 2**20 / m["wall_s"],
                load_before=load_before,
                load_after=os.getloadavg(),
            )
            print(json.dumps(m), flush=True)
            results.append(m)
    Path(args.results).write_text(json.dumps(results, indent=2) + "\n")


def compare(data: Path, work: Path, results_path: Path, args: argparse.Namespace) -> None:
    """This tree against ``args.compare`` on the 1M applies, one selection, taking turns
    (and turns at going first) ``--repeat`` times."""
    files = sorted(data.glob("*.parquet"))
    sel = work / "sel-1M"
    make_selection(files, data, sel, args.ratio, 0)
    trees = {"this": str(Path(__file__).resolve().parents[2] / "src"), "other": args.compare}
    modes = [("keep lists", sel), ("selected ids", sel / "selected" / "part-00000.parquet")]
    rows = []
    for r in range(args.repeat):
        for mode, selection in modes:
            order = list(trees.items())
            if (r + len(rows)) % 2:  # alternate who goes first: the second run of a pair
                order.reverse()  # also pays the write-back of the first one's output
            for label, tree in order:
                out = work / "out-compare"
                shutil.rmtree(out, ignore_errors=True)
                shutil.rmtree(str(out) + "-rm", ignore_errors=True)
                load = os.getloadavg()[0]
                m = run_apply(
                    ["--input", str(data), "--selection", str(selection), "--output", str(out),
                     "--removed", str(out) + "-rm", "--removed-format", "curator",
                     "--no-progress"],
                    {**os.environ, "PYTHONPATH": tree},
                )  # fmt: skip
                written = [f for d in (out, Path(str(out) + "-rm")) for f in d.rglob("*")]
                size = sum(f.stat().st_size for f in written if f.is_file())
                m.update(round=r + 1, mode=mode, tree=label, src=tree, load_before=load,
                         out_bytes=size)  # fmt: skip
                print(json.dumps(m), flush=True)
                rows.append(m)
    results_path.write_text(json.dumps(rows, indent=2) + "\n")
    print("| mode | tree | apply s per round | fastest | CPU s (user+sys) per round | least "
          "| load 1m per round | MB written |")  # fmt: skip
    print("|---|---|---|---:|---|---:|---|---:|")
    for mode, _ in modes:
        for label, tree in trees.items():
            mine = [m for m in rows if m["mode"] == mode and m["tree"] == label]
            secs = ", ".join(f"{m['apply_s']:.1f}" for m in mine)
            cpus = ", ".join(f"{m['cpu_s']:.1f}" for m in mine)
            loads = ", ".join(f"{m['load_before']:.1f}" for m in mine)
            fastest = min(m["apply_s"] for m in mine)
            least = min(m["cpu_s"] for m in mine)
            written = mine[-1]["out_bytes"] / 1e6
            print(f"| {mode} | {label} ({tree}) | {secs} | {fastest:.1f} | {cpus} | {least:.1f} "
                  f"| {loads} | {written:.1f} |")  # fmt: skip


if __name__ == "__main__":
    main()
