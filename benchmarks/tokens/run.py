"""Token budgets on real text (issue 46): every method at the same share of the characters.

The 56k real-text corpus (``../shared/data/realtext.parquet``), characters (``n_chars``) as
lengths, ``--select-token-ratio`` 0.1 and lamb 0.5 by default. For top-k quality, random,
the cost-benefit greedy and the learner, on one graph each (the greedy's K, the learner's
capped K, as ``select`` builds them), it records: exact J per token over every document,
wall and CPU seconds split into graph and optimisation, the kept documents and characters,
the kept length distribution, and the near-duplicate pairs (cosine > 0.9) among the kept
documents. It then times the learner at a document budget of the same k (the issue's cost
figure: a token run should take at most 1.1x a document run of the same k).

    python benchmarks/tokens/run.py            # writes results/<date>-<machine>-realtext.json
    python benchmarks/tokens/run.py --table    # RESULTS.md's table from the newest run
"""

from __future__ import annotations

import argparse
import os
import resource
import sys
import time
from pathlib import Path

import numpy as np
import pyarrow.parquet as pq
import torch

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE.parent / "_lib"))
import ledger  # noqa: E402

from datamask import MaskLearner, read_corpus  # noqa: E402
from datamask.columns import Columns  # noqa: E402
from datamask.greedy import LazyGreedy  # noqa: E402
from datamask.ranking import RandomSelector, TopKQuality  # noqa: E402

CORPUS = HERE.parents[1].parent / "shared" / "data" / "realtext.parquet"
METHODS = {"topk": TopKQuality, "random": RandomSelector, "greedy": LazyGreedy, "mask": MaskLearner}
QUANTILES = (0.1, 0.25, 0.5, 0.75, 0.9)


def load(path: Path):
    corpus = read_corpus(
        path, Columns(id_col="chunk_id", quality_cols=("quality_score",), feature_col="feature_arr")
    )
    corpus.lengths = pq.read_table(path, columns=["n_chars"]).column("n_chars").to_numpy()
    return corpus.__class__(**{**corpus.__dict__, "lengths": corpus.lengths.astype(float)})


def near_duplicate_pairs(features: np.ndarray, rows: np.ndarray, threshold: float = 0.9) -> int:
    """Pairs of kept documents with cosine above ``threshold`` (blocked, exact)."""
    x = torch.from_numpy(features[rows])
    x = x / x.norm(dim=1, keepdim=True)
    pairs = 0
    for lo in range(0, len(rows), 2048):
        sims = x[lo : lo + 2048] @ x.T
        pairs += int((sims > threshold).sum()) - min(2048, len(rows) - lo)  # minus self
    return pairs // 2


def run_one(name: str, corpus, settings: dict) -> dict:
    cls = METHODS[name]
    wall, cpu = time.perf_counter(), time.process_time()
    sel = cls(device="cpu", seed=0, lamb=0.5, **settings).fit(corpus)
    wall, cpu = time.perf_counter() - wall, time.process_time() - cpu
    lengths = corpus.lengths[sel.selected_]
    return {
        "method": name,
        **{k: v for k, v in settings.items()},
        "k": int(sel.k_),
        "chars_kept": float(lengths.sum()),
        "J": float(sel.terms_["J"]),
        "quality": float(sel.terms_["quality"]),
        "facility": float(sel.terms_["facility"]),
        "fit_wall_s": float(sel.fit_seconds_),
        "graph_s": float(sel.graph_seconds_),
        "optimise_s": float(sel.optimise_seconds_),
        "wall_s_with_eval": wall,
        "cpu_s_with_eval": cpu,
        "kept_length_quantiles": dict(
            zip(map(str, QUANTILES), np.quantile(lengths, QUANTILES).tolist(), strict=True)
        ),
        "kept_length_mean": float(lengths.mean()),
        "near_duplicate_pairs_0.9": near_duplicate_pairs(corpus.features, sel.selected_),
        "per_token_won": getattr(sel, "per_token_", None),
        "peak_rss_mb_so_far": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024,
    }


def measure(args) -> Path:
    torch.set_num_threads(args.threads)
    corpus = load(args.corpus)
    rows = []
    for name in METHODS:
        rows.append(run_one(name, corpus, {"select_token_ratio": args.ratio}))
        print(
            {k: rows[-1][k] for k in ("method", "k", "J", "fit_wall_s", "chars_kept")}, flush=True
        )
    k = next(r["k"] for r in rows if r["method"] == "mask")
    for name in ("mask", "greedy"):  # the cost figure: the same k as a document budget
        rows.append(run_one(name, corpus, {"k": k}))
        print({k_: rows[-1][k_] for k_ in ("method", "k", "J", "fit_wall_s")}, flush=True)
    payload = ledger.run_record(
        corpus=str(args.corpus),
        n_docs=corpus.n_docs,
        chars=float(corpus.lengths.sum()),
        ratio=args.ratio,
        lamb=0.5,
        threads=args.threads,
        load_average=os.getloadavg(),
        rows=rows,
    )
    out = ledger.result_path(HERE, "realtext")
    ledger.write_json(out, payload)
    return out


def table() -> str:
    run = ledger.load_runs(HERE, "realtext")[-1]
    head = (
        f"{run['date']}, {run['machine']}, commit {run['commit']}, {run['threads']} threads, "
        f"load {', '.join(f'{v:.1f}' for v in run['load_average'])}; {run['n_docs']:,} documents, "
        f"{run['chars']:,.0f} characters, budget {run['ratio']:.0%} of them, "
        f"lamb {run['lamb']}.\n\n"
        "| method | budget | k | chars kept | J | quality | facility | fit s (graph + opt) | "
        "median kept length | mean kept length | pairs > 0.9 kept |\n"
        "|---|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|\n"
    )
    lines = []
    for r in run["rows"]:
        budget = "tokens" if "select_token_ratio" in r else f"k={r['k']}"
        lines.append(
            f"| {r['method']} | {budget} | {r['k']:,} | {r['chars_kept']:,.0f} | {r['J']:.4f} | "
            f"{r['quality']:.4f} | {r['facility']:.4f} | {r['fit_wall_s']:.2f} "
            f"({r['graph_s']:.2f} + {r['optimise_s']:.2f}) | "
            f"{r['kept_length_quantiles']['0.5']:,.0f} | {r['kept_length_mean']:,.0f} | "
            f"{r['near_duplicate_pairs_0.9']:,} |"
        )
    return head + "\n".join(lines) + "\n"


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    ap.add_argument("--corpus", type=Path, default=CORPUS)
    ap.add_argument("--ratio", type=float, default=0.1)
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--table", action="store_true", help="print RESULTS.md's table and exit")
    args = ap.parse_args()
    if args.table:
        print(table())
        return
    print("wrote", measure(args))


if __name__ == "__main__":
    main()
