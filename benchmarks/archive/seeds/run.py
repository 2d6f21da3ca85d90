"""J of every method that draws random numbers, over seeds 0-9, on the demo.

The seeds changed meaning in issue 21 (point 5): the selector and each term now draw from
their own children of ``numpy.random.SeedSequence(seed)`` instead of all seeding their
generators with the same number. This measures whether that moved the results beyond
their spread over seeds. Run it on the current code and on the commit before the change
(09fb092), each from the repository root::

    S=benchmarks/archive/seeds
    PYTHONPATH=$PWD/src python $S/run.py --label streams --out $S
    git archive 09fb092 src | tar -x -C /tmp/old
    PYTHONPATH=/tmp/old/src python $S/run.py --label same-seed --out $S

and ``python $S/run.py --table $S`` writes ``SEEDS.md`` from
the two JSON files. CPU, 1 thread, select_ratio 0.3, lamb 0.5, each method's default
objective as ``make_selector`` builds it (Facility; DiSF for disf-greedy).
"""

from __future__ import annotations

import argparse
import json
import statistics
from pathlib import Path

METHODS = ("mask", "stochastic-greedy", "disf-greedy", "random")
SEEDS = range(10)
DEMO = Path(__file__).resolve().parents[3].parent / "shared" / "data" / "demo_docs.parquet"


def measure(label: str, out: Path) -> None:
    import torch

    from datamask.io import read_corpus
    from datamask.selectors import make_selector

    torch.set_num_threads(1)
    rows = {}
    for method in METHODS:
        rows[method] = []
        for seed in SEEDS:
            corpus = read_corpus(DEMO, id_col="id", feature_col="embedding")
            sel = make_selector(method, select_ratio=0.3, seed=seed, device="cpu").fit(corpus)
            rows[method].append(float(sel.terms_["J"]))
            print(label, method, seed, rows[method][-1], flush=True)
    (out / f"{label}.json").write_text(json.dumps(rows, indent=1))


def table(out: Path) -> None:
    old = json.loads((out / "same-seed.json").read_text())
    new = json.loads((out / "streams.json").read_text())
    lines = [
        "# J over seeds 0-9 before and after spawned streams (issue 21, point 5)",
        "",
        "Demo (2,077 documents), select_ratio 0.3, Facility, lamb 0.5, CPU, 1 thread;",
        "`python benchmarks/archive/seeds/run.py` (its docstring has the commands).",
        "`same-seed`: every "
        "generator seeded with the seed itself (commit 09fb092); `streams`: the selector and",
        "each term on their own child of `SeedSequence(seed)`. J of quality + Facility, except",
        "disf-greedy: quality + DiSF, its default objective.",
        "",
        "| method | seed 0 before | seed 0 after | mean before (sd) | mean after (sd) | "
        "min-max before | min-max after |",
        "|---|---:|---:|---:|---:|---:|---:|",
    ]
    for method in METHODS:
        a, b = old[method], new[method]
        lines.append(
            f"| {method} | {a[0]:.5f} | {b[0]:.5f} | {statistics.mean(a):.5f} "
            f"({statistics.stdev(a):.5f}) | {statistics.mean(b):.5f} ({statistics.stdev(b):.5f}) "
            f"| {min(a):.5f}-{max(a):.5f} | {min(b):.5f}-{max(b):.5f} |"
        )
    (out / "SEEDS.md").write_text("\n".join(lines) + "\n")
    print("\n".join(lines))


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--label", choices=["streams", "same-seed"])
    p.add_argument("--out", type=Path, default=Path(__file__).parent)
    p.add_argument("--table", type=Path, help="write SEEDS.md from the two JSON files here")
    args = p.parse_args()
    if args.table:
        table(args.table)
    else:
        measure(args.label, args.out)


if __name__ == "__main__":
    main()
