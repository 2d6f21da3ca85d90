"""Reproduce the headline table: the learner against the sparse greedy on its own objective.

    python benchmarks/headline/run.py                      # every case below
    python benchmarks/headline/run.py --cases realtext demo
    python benchmarks/headline/run.py --out /tmp/headline  # somewhere else

Cases (each is one ``datamask bench`` run, every method in a fresh process, same machine,
same thread count), real text first:

- ``realtext``: the real-text corpus (``--realtext``; default the 50k corpus, which
  ``benchmarks/realtext/build_corpus.py`` builds when missing), k = 10%, lamb = 0.5,
  facility location + quality: mask, lazy greedy on the K-NN graph (the yardstick),
  top-k, random (stochastic greedy and the dense greedy read the 10 GB N x N matrix at
  50k: left out).
- ``demo``: the shipped demo corpus (examples/demo/demo_docs.parquet), same objective,
  plus the dense greedy.
- ``clustered-10k``, ``clustered-50k``: ``make_clustered(N, 384, 50, seed=0)``, same
  objective (the dense and stochastic greedy at 10k only: at 50k their matrix is 10 GB).
- ``disf-10k``, ``disf-50k``: DiSF + quality on the clustered data: the learner against
  the batched greedy DiSF (1024 per batch), plus the original per-candidate loop timed on
  two batches and extrapolated (``disf_reference.py``, in a fresh process after the bench;
  ``results/<case>/original_loop.json``).

Each case writes ``results/<case>/bench.{md,json}`` and three PNGs; the script then
collects the headline figures into ``RESULTS.md``. Equivalent commands::

    datamask bench --synthetic 50000 --select-ratio 0.1 --lamb 0.5 --device cpu \\
        --out-dir benchmarks/headline/results/clustered-50k
    datamask bench --synthetic 50000 --algorithm DiSF --methods mask disf-greedy topk random \\
        --device cpu --out-dir benchmarks/headline/results/disf-50k
    python benchmarks/headline/disf_reference.py --n 50000 --batches 2   # the original loop
"""

from __future__ import annotations

import argparse
import concurrent.futures as cf
import json
import multiprocessing as mp
import os
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

from disf_reference import LABEL as ORIGINAL_LOOP
from disf_reference import run_reference

from datamask import make_clustered
from datamask.evaluation import bench
from datamask.io.parquet import read_corpus

HERE = Path(__file__).resolve().parent
DEMO = HERE.parents[1] / "examples" / "demo" / "demo_docs.parquet"
REALTEXT = HERE.parent / "realtext" / "data" / "realtext.parquet"
WITH_DENSE = ["mask", "greedy", "greedy-dense", "stochastic-greedy", "topk", "random"]
AT_50K = ["mask", "greedy", "topk", "random"]
DISF_METHODS = ["mask", "disf-greedy", "topk", "random"]

CASES: dict[str, dict[str, Any]] = {
    "realtext": {"n": "realtext", "algorithm": "Facility", "methods": AT_50K},
    "demo": {"n": None, "algorithm": "Facility", "methods": WITH_DENSE},
    "clustered-10k": {"n": 10_000, "algorithm": "Facility", "methods": WITH_DENSE},
    "clustered-50k": {"n": 50_000, "algorithm": "Facility", "methods": AT_50K},
    "disf-10k": {"n": 10_000, "algorithm": "DiSF", "methods": DISF_METHODS},
    "disf-50k": {"n": 50_000, "algorithm": "DiSF", "methods": DISF_METHODS},
}


def run_case(name: str, out: Path, device: str, realtext: Path = REALTEXT) -> dict[str, Any]:
    spec = CASES[name]
    if spec["n"] == "realtext":
        if not realtext.exists():
            builder = HERE.parent / "realtext" / "build_corpus.py"
            subprocess.run([sys.executable, str(builder), "--out", str(realtext)], check=True)
        corpus = read_corpus(realtext)
        corpus.source = f"real text ({realtext.name}, {corpus.n_docs} documents)"
    elif spec["n"] is None:
        corpus = read_corpus(DEMO, extra_cols=["n_chars"])
        corpus.source = "examples/demo/demo_docs.parquet"
    else:
        corpus = make_clustered(spec["n"], 384, 50, seed=0)
        corpus.source = f"make_clustered({spec['n']}, 384, 50, seed=0)"
    disf = spec["algorithm"] == "DiSF"
    t0 = time.perf_counter()
    result = bench(
        corpus,
        methods=spec["methods"],
        algorithm=spec["algorithm"],
        lamb=0.5,
        select_ratio=0.1,
        seed=0,
        device=device,
        isolate=True,
        out_dir=out / name,
        map_points=3000,
        title=f"Headline: {name} ({spec['algorithm']} + quality, k = 10%, lamb = 0.5)",
        progress=True,
    )
    if disf:  # the original loop, in a fresh process as bench runs each method
        params = {"select_ratio": 0.1, "batch_size": 1024, "n_batches": 2, "device": device}
        with cf.ProcessPoolExecutor(1, mp_context=mp.get_context("spawn")) as pool:
            ref = pool.submit(run_reference, corpus, params, result["settings"]["threads"])
            (out / name / "original_loop.json").write_text(json.dumps(ref.result(), indent=2))
    print(f"{name}: done in {time.perf_counter() - t0:.0f}s", flush=True)
    return result


def original_loop(case: Path, runs: dict[str, Any]) -> dict[str, Any] | None:
    """The original DiSF loop's timing of a case: ``original_loop.json`` (written by
    :func:`run_case`), or the row that ``bench`` itself wrote before the timing moved here."""
    path = case / "original_loop.json"
    return json.loads(path.read_text()) if path.exists() else runs.get(ORIGINAL_LOOP)


def summarise(out: Path) -> str:
    """RESULTS.md: one line per case with the headline figures, then links."""
    lines = [
        "# Headline results",
        "",
        "Produced by `python benchmarks/headline/run.py` (see its docstring). Each case is one",
        "`datamask bench` run: every method in a fresh process on the same machine, the same",
        "objective and thread count, k = 10%, lamb = 0.5. The yardstick is `greedy`: lazy",
        "greedy on the learner's K-NN graph (same K). Times are `fit` wall times on the CPU,",
        "as graph build + optimisation; dense greedy J where it was run.",
        "",
        "| case | N | learner J | sparse greedy J | learner J / sparse greedy "
        "| dense greedy J | learner time (graph + opt) | sparse greedy time (graph + opt) "
        "| learner time / sparse greedy | threads | load avg |",
        "|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|",
    ]
    disf_lines = [
        "",
        "| case | N | learner DiSF loss | greedy DiSF loss | loss ratio | learner time "
        "| greedy DiSF time | time saved | original loop (est.) | time saved vs original |",
        "|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|",
    ]
    for name in CASES:
        path = out / name / "bench.json"
        if not path.exists():
            continue
        data = json.loads(path.read_text())
        runs = {r["label"]: r for r in data["runs"]}
        n = data["settings"]["n_docs"]
        load = data["machine"]["load_average"][0] if data["machine"]["load_average"] else 0
        mask = runs["mask"]
        if "greedy" in runs:
            g = runs["greedy"]
            dense = runs.get("greedy-dense")
            dense_j = f"{dense['terms']['J']:.4f}" if dense else "-"

            def split(r: dict[str, Any]) -> str:
                return (
                    f"{r['seconds']:.1f}s ({r.get('graph_seconds', 0):.1f} + "
                    f"{r.get('optimise_seconds', r['seconds']):.1f})"
                )

            lines.append(
                f"| [{name}](results/{name}/bench.md) | {n} | {mask['terms']['J']:.4f} | "
                f"{g['terms']['J']:.4f} | {100 * mask['J_vs_greedy']:.2f}% | {dense_j} | "
                f"{split(mask)} | {split(g)} | {100 * mask['time_vs_greedy']:.1f}% | "
                f"{data['settings'].get('threads', '-')} | {load:.1f} |"
            )
        if "disf-greedy" in runs:
            g = runs["disf-greedy"]
            ref = original_loop(out / name, runs)
            ref_s = f"{ref['seconds']:.0f}s" if ref else "-"
            saved_ref = f"{100 * (1 - mask['seconds'] / ref['seconds']):.1f}%" if ref else "-"
            disf_lines.append(
                f"| [{name}](results/{name}/bench.md) | {n} | "
                f"{mask['metrics']['disf_loss']:.1f} | {g['metrics']['disf_loss']:.1f} | "
                f"{mask['disf_loss_vs_disf_greedy']:.3f} | {mask['seconds']:.1f}s | "
                f"{g['seconds']:.1f}s | {100 * mask['time_saved_vs_disf_greedy']:.1f}% | "
                f"{ref_s} | {saved_ref} |"
            )
    return "\n".join(lines + disf_lines) + "\n"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--cases", nargs="+", choices=list(CASES), default=list(CASES))
    parser.add_argument("--out", default=str(HERE), help="folder for results/ and RESULTS.md")
    parser.add_argument("--device", default="cpu")
    parser.add_argument("--realtext", type=Path, default=REALTEXT, help="real-text corpus")
    args = parser.parse_args()
    out = Path(args.out)
    for name in args.cases:
        run_case(name, out / "results", args.device, args.realtext)
        summary = summarise(out / "results")
        tmp = out / "RESULTS.md.tmp"
        tmp.write_text(summary)
        os.replace(tmp, out / "RESULTS.md")
    print((out / "RESULTS.md").read_text())


if __name__ == "__main__":
    main()
