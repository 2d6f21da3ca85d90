"""The learner's variants against the sparse greedy, real text (facility location + quality).

    python benchmarks/realtext/variants.py shared demo
    python benchmarks/realtext/variants.py --markdown \
        benchmarks/realtext/results/2026-11-23-cpu2-variants.json

Records ``results/<date>-<machine>-variants.json`` (the commit inside,
``benchmarks/_lib/ledger.py``); each row: one (set, select_ratio, lamb) with the sparse
greedy's J and seconds and, per variant, [learner J / greedy J, learner seconds].
Variants: the default (K from the ratio, swap rounding, 100 steps), K fixed at 128, no
swap rounding (top-k of the logits), both, 300 steps, and coverage over all documents
every step (partial = 1).
"""

# isort: off
import datamask  # noqa: F401  (first: it makes idle OpenMP threads sleep before torch loads)

# isort: on
import argparse
import json
import sys
from pathlib import Path

import numpy as np

from datamask import Columns, MaskLearner
from datamask.io.parquet import read_corpus
from datamask.measure import set_threads
from datamask.objectives import FacilityLocation, Objective
from datamask.selectors import make_selector

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT / "benchmarks" / "_lib"))
from ledger import result_path, run_record, write_json  # noqa: E402

SETS = {
    "shared": (ROOT.parent / "shared" / "data" / "demo_docs.parquet", "id", "embedding"),
    "demo": (ROOT / "examples" / "demo" / "demo_docs.parquet", "chunk_id", "feature_arr"),
}
VARIANTS = {
    "default": ({}, None),
    "K=128": ({}, 128),
    "refine=none": ({"refine": "none"}, None),
    "K=128,refine=none": ({"refine": "none"}, 128),
    "e300": ({"n_epochs": 300}, None),
    "partial=1": ({"partial": 1.0}, None),
}


def run(name: str, rows: list[dict]) -> None:
    path, id_col, feature_col = SETS[name]
    corpus = read_corpus(path, Columns(id_col=id_col, feature_col=feature_col))
    for ratio in (0.01, 0.05, 0.1, 0.3):
        for lamb in (0.2, 0.5, 0.8):
            obj = Objective(FacilityLocation(), lamb=lamb)
            g = make_selector("greedy", objective=obj, select_ratio=ratio, device="cpu")
            g.fit(corpus)
            row = {"set": name, "ratio": ratio, "lamb": lamb, "greedy_J": g.terms_["J"]}
            row["greedy_s"] = g.fit_seconds_
            for label, (kw, kk) in VARIANTS.items():
                m = MaskLearner(
                    Objective(FacilityLocation(n_neighbors=kk), lamb=lamb),
                    select_ratio=ratio,
                    device="cpu",
                    **kw,
                ).fit(corpus)
                row[label] = [m.terms_["J"] / g.terms_["J"], m.fit_seconds_]
            print(json.dumps(row), flush=True)
            rows.append(row)
            out = result_path(Path(__file__).resolve().parent, "variants")
            write_json(out, {**run_record(), "rows": rows})


def markdown(path: str) -> None:
    rows = json.loads(Path(path).read_text())["rows"]
    print("| variant | min J / greedy | median | settings >= greedy | learner s (sum) |")
    print("|---|---:|---:|---:|---:|")
    for label in VARIANTS:
        r = np.array([x[label][0] for x in rows])
        t = sum(x[label][1] for x in rows)
        print(
            f"| {label} | {100 * r.min():.2f}% | {100 * np.median(r):.2f}% | "
            f"{(r >= 1).sum()}/{len(r)} | {t:.1f} |"
        )
    print(f"\nsparse greedy seconds (sum): {sum(x['greedy_s'] for x in rows):.1f}")


if __name__ == "__main__":
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("sets", nargs="*", help=f"sets to run ({', '.join(SETS)}), a JSON line each")
    p.add_argument("--markdown", metavar="JSON", help="print the table of a recorded run")
    args = p.parse_args()
    if args.markdown:
        markdown(args.markdown)
    else:
        set_threads(2)
        rows: list[dict] = []
        for s in args.sets:
            run(s, rows)
