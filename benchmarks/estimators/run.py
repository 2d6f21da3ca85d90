"""Which policy-gradient estimator should the learner use? Measure each on one problem.

    python benchmarks/estimators/run.py --n-docs 10000 --out benchmarks/estimators/RESULTS.md

Generated clustered data (``datamask.make_clustered``, d=384, 50 clusters), k = 10%,
lamb = 0.5, facility location + quality; every variant from the same seed on the CPU.
The reference estimator (Bernoulli masks, group-normalised rewards) and the options
METHOD.md lists (exact-k Gumbel top-k masks, leave-one-out baseline, warm start from
quality) against the exact expected gradient, with lazy greedy's value as the yardstick.
"""

from __future__ import annotations

import argparse
import json
import platform
from pathlib import Path

import torch

from datamask import FacilityLocation, MaskLearner, Objective, make_clustered
from datamask.greedy import LazyGreedy


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--n-docs", type=int, default=10_000)
    parser.add_argument("--reinforce-steps", type=int, default=1000)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--out", default="benchmarks/estimators/RESULTS.md")
    args = parser.parse_args()

    corpus = make_clustered(args.n_docs, 384, 50, seed=args.seed)  # unit rows, checked by fit

    def objective() -> Objective:
        return Objective(FacilityLocation(), lamb=0.5)

    rows = []

    def record(name: str, selector) -> None:
        selector.fit(corpus)
        rows.append(
            {
                "variant": name,
                "J": selector.terms_["J"],
                "quality": selector.terms_["quality"],
                "facility": selector.terms_["facility"],
                "seconds": selector.fit_seconds_,
            }
        )
        print(f"{name:55s} J={selector.terms_['J']:.4f} {selector.fit_seconds_:7.1f}s", flush=True)

    common = dict(select_ratio=0.1, seed=args.seed, device="cpu")
    record("lazy greedy (yardstick)", LazyGreedy(objective(), **common))
    steps = args.reinforce_steps
    for name, params in [
        ("reinforce: Bernoulli, group-norm, init quality (reference)", {}),
        ("reinforce: Bernoulli, group-norm, init same", dict(init="same")),
        ("reinforce: Gumbel top-k (exact k), group-norm", dict(mask_sampler="topk")),
        ("reinforce: Bernoulli, leave-one-out", dict(baseline="loo")),
        ("reinforce: Gumbel top-k, leave-one-out", dict(mask_sampler="topk", baseline="loo")),
    ]:
        record(
            f"{name}, {steps} steps",
            MaskLearner(objective(), estimator="reinforce", n_epochs=steps, **params, **common),
        )
    for name, params in [
        ("expected: K=128, 300 steps (default)", {}),
        ("expected: K=128, 100 steps, partial 0.05", dict(n_epochs=100, partial=0.05)),
        ("expected: K=128, init same", dict(init="same")),
        ("expected: K=32", dict(k_nn=32)),
        ("expected: K=64", dict(k_nn=64)),
    ]:
        k_nn = params.pop("k_nn", 128)
        obj = Objective(FacilityLocation(n_neighbors=k_nn), lamb=0.5)
        record(name, MaskLearner(obj, estimator="expected", **params, **common))

    greedy_j = rows[0]["J"]
    lines = [
        "# Estimators of the mask learner, measured",
        "",
        f"`python benchmarks/estimators/run.py --n-docs {args.n_docs} --reinforce-steps {steps}`",
        "",
        f"Clustered synthetic data, N={args.n_docs:,}, d=384, k=10%, lamb=0.5, facility "
        f"location + quality, seed {args.seed}, CPU ({torch.get_num_threads()} threads, "
        f"torch {torch.__version__}, Python {platform.python_version()}). Time is the "
        "selection only (the exact evaluation of J afterwards is not counted).",
        "",
        "| variant | J | % of greedy J | quality | facility | seconds |",
        "|---|---|---|---|---|---|",
    ]
    for r in rows:
        lines.append(
            f"| {r['variant']} | {r['J']:.4f} | {100 * r['J'] / greedy_j:.1f}% | "
            f"{r['quality']:.4f} | {r['facility']:.4f} | {r['seconds']:.1f} |"
        )
    out = Path(args.out)
    out.write_text("\n".join(lines) + "\n")
    out.with_suffix(".json").write_text(json.dumps(rows, indent=2) + "\n")
    print(f"wrote {out}")


if __name__ == "__main__":
    main()
