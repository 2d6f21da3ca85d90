"""The original per-candidate DiSF loop, timed on a few batches and extrapolated to all.

    python benchmarks/headline/disf_reference.py --n 10000 --batches 2

The headline's DiSF rows compare the learner with the batched greedy DiSF and with the
original's loop (``GreedyDiSF(implementation="reference")``, which recomputes the loss of
picked + candidate for every candidate). That loop takes minutes a batch, so it runs on the
first ``n_batches`` full batches only: ``GreedyDiSF`` fitted on those rows alone, at the
same ``select_ratio`` and ``batch_size``, picks the same quota from each batch as on the
whole corpus (``datamask.greedy.disf.batch_quotas``), and its cost is the same for every
full batch with that quota. Only the public API is used (``tests/test_benchmarks.py``).
"""

from __future__ import annotations

import argparse
import json
import math
import time
from typing import Any

from datamask import make_clustered
from datamask.data import Corpus
from datamask.greedy.disf import GreedyDiSF
from datamask.measure import cpu_seconds, load_average, set_threads

#: The row the headline's tables give this timing.
LABEL = "disf-greedy (original loop)"


def time_reference(
    corpus: Corpus,
    *,
    select_ratio: float,
    batch_size: int = 1024,
    n_batches: int = 1,
    seed: int = 0,
    device: str = "cpu",
) -> dict[str, float]:
    """Time the original per-candidate DiSF loop on the first ``n_batches`` full batches of
    ``corpus`` and extrapolate to every batch.

    Returns ``seconds_per_batch``, ``n_batches_timed``, ``n_batches`` (of the whole
    corpus) and ``seconds_estimated`` (per batch x every batch).
    """
    n_total = math.ceil(corpus.n_docs / batch_size)
    timed = max(1, min(n_batches, corpus.n_docs // batch_size))
    rows = min(timed * batch_size, corpus.n_docs)
    selector = GreedyDiSF(
        select_ratio=select_ratio,
        batch_size=batch_size,
        seed=seed,
        device=device,
        implementation="reference",
    )
    t0 = time.perf_counter()
    selector.fit(corpus.take(range(rows)))
    per_batch = (time.perf_counter() - t0) / timed
    return {
        "seconds_per_batch": per_batch,
        "n_batches_timed": timed,
        "n_batches": n_total,
        "seconds_estimated": per_batch * n_total,
    }


def run_reference(corpus: Corpus, params: dict[str, Any], threads: int | None = None) -> dict:
    """:func:`time_reference` as one row of a bench's ``runs``: seconds (the estimate), CPU
    seconds (per timed batch x every batch) and the load around it."""
    set_threads(threads)
    load_before, cpu_before = load_average(), cpu_seconds()
    est = time_reference(corpus, **params)
    est["cpu_seconds_per_batch"] = (cpu_seconds() - cpu_before) / est["n_batches_timed"]
    return {
        "label": LABEL,
        "method": "disf-greedy-reference",
        "estimate": est,
        "seconds": est["seconds_estimated"],
        "cpu_seconds": est["cpu_seconds_per_batch"] * est["n_batches"],
        "load_before": load_before,
        "load_after": load_average(),
        "params": params,
    }


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--n", type=int, default=10_000, help="make_clustered(N, 384, 50, seed=0)")
    p.add_argument("--select-ratio", type=float, default=0.1)
    p.add_argument("--batch-size", type=int, default=1024)
    p.add_argument("--batches", type=int, default=2, help="full batches timed")
    p.add_argument("--threads", type=int, default=None)
    args = p.parse_args()
    corpus = make_clustered(args.n, 384, 50, seed=0)
    params = {
        "select_ratio": args.select_ratio,
        "batch_size": args.batch_size,
        "n_batches": args.batches,
    }
    print(json.dumps(run_reference(corpus, params, args.threads), indent=2))


if __name__ == "__main__":
    main()
