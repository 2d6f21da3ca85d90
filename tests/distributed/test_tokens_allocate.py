"""Token budgets on shards priced per token (issue 46): the cost-benefit order against the
naive greedy, the one-price allocation against brute force, and ``--given`` and
``--max-similarity`` with a token budget on shards against their one-file definitions."""

from __future__ import annotations

import itertools

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest
import torch

import datamask
from datamask import make_clustered
from datamask._validation import check_corpus
from datamask.budget import TokenBudget
from datamask.distributed.select.tokens import allocate_tokens
from datamask.greedy.lazy import gain_order
from datamask.objectives.combined import resolve_objective


def _corpus(n: int, seed: int = 0, dim: int = 8):
    corpus = make_clustered(n, dim, 5, seed=seed)
    rng = np.random.default_rng(seed)
    corpus.lengths = rng.integers(20, 400, n).astype(np.float64)
    return corpus


def test_the_cost_benefit_order_is_the_naive_greedy_by_gain_per_token():
    corpus = check_corpus(_corpus(60, seed=3))
    budget = TokenBudget(corpus.lengths, 0.2 * corpus.lengths.sum())
    rows = np.arange(0, 60, 2)  # a pool: every row still counts for coverage

    def bound():
        objective = resolve_objective(None, "Facility", 0.5)
        return objective.bind(corpus, budget.expected_count(), budget=budget)

    order, gains = gain_order(bound(), rows, sizes=corpus.lengths)
    naive = bound()  # the definition: every gain again at every pick, on the graph
    naive.build_graphs()

    def value(picks: list[int]) -> float:
        chosen = torch.as_tensor(picks, dtype=torch.long)
        return sum(w * term.graph_value(chosen) for w, term in naive.terms)

    picked: list[int] = []
    for t in range(len(rows)):
        left = [j for j in rows if j not in picked]
        now = value(picked)
        steps = [value(picked + [j]) - now for j in left]
        ratios = [g / corpus.lengths[j] for g, j in zip(steps, left, strict=True)]
        best = int(np.argmax(ratios))  # ties: the lower row
        picked.append(left[best])
        assert gains[t] == pytest.approx(steps[best], rel=1e-4, abs=1e-7)
    assert order.tolist() == picked
    ratios = gains / corpus.lengths[order]
    assert np.all(np.diff(ratios) <= 1e-7)  # the per-token curve does not increase


@pytest.mark.parametrize("seed", range(6))
def test_the_allocation_keeps_the_best_prefixes_for_its_tokens(seed):
    rng = np.random.default_rng(seed)
    sizes = [rng.integers(1, 9, int(rng.integers(0, 5))).astype(float) for _ in range(3)]
    prices = [np.sort(rng.random(len(s)))[::-1] for s in sizes]
    total = float(rng.integers(1, max(2, int(sum(s.sum() for s in sizes)))))
    counts, filled, kept = allocate_tokens(prices, sizes, total)
    kept_rows = [np.r_[np.arange(m), f].astype(int) for m, f in zip(counts, filled, strict=True)]
    used = sum(s[r].sum() for s, r in zip(sizes, kept_rows, strict=True))
    assert used == pytest.approx(kept) and used <= total
    rest = [np.delete(s, r) for s, r in zip(sizes, kept_rows, strict=True)]
    if any(len(r) for r in rest):  # nothing left that would still fit
        assert total - used < min(r.min() for r in rest if len(r))
    # the prefixes are the best gains (price x length) of any prefixes within their tokens
    prefix_tokens = sum(s[:m].sum() for s, m in zip(sizes, counts, strict=True))
    value = sum((p * s)[:m].sum() for p, s, m in zip(prices, sizes, counts, strict=True))
    for ends in itertools.product(*[range(len(s) + 1) for s in sizes]):
        tokens = sum(s[:m].sum() for s, m in zip(sizes, ends, strict=True))
        if tokens <= prefix_tokens:
            other = sum((p * s)[:m].sum() for p, s, m in zip(prices, sizes, ends, strict=True))
            assert other <= value + 1e-12


# --- --given and --max-similarity on shards --------------------------------------------------
def _table(corpus, rows: np.ndarray) -> pa.Table:
    return pa.table(
        {
            "chunk_id": pa.array([f"d{i:05d}" for i in rows]),
            "quality_score": pa.array(corpus.quality[rows, 0]),
            "n_chars": pa.array(corpus.lengths[rows].astype(np.int64)),
            "feature_arr": pa.array(list(corpus.features[rows].astype(np.float32))),
        }
    )


@pytest.fixture(scope="module")
def data(tmp_path_factory):
    """A corpus of 400: KEPT (its first 150 rows, 60 of them selected), the new rows as one
    file and as 3 shards."""
    root = tmp_path_factory.mktemp("tokens_given")
    corpus = _corpus(400, seed=5)
    old, new = np.arange(150), np.arange(150, 400)
    pq.write_table(_table(corpus, old), root / "old.parquet")
    chosen = pa.table({"chunk_id": [f"d{i:05d}" for i in old[::3]]})
    pq.write_table(chosen, root / "old_kept.parquet")
    pq.write_table(_table(corpus, new), root / "new.parquet")
    (root / "shards").mkdir()
    for s, part in enumerate(np.array_split(new, 3)):
        pq.write_table(_table(corpus, part), root / "shards" / f"{s:02d}.parquet")
    return {"root": root, "corpus": corpus, "old": old, "new": new, "kept": old[::3]}


def _kept(out) -> np.ndarray:
    parts = sorted((out / "selected").glob("part-*.parquet"))
    ids = [i for p in parts for i in pq.read_table(p).column("chunk_id").to_pylist()]
    return np.asarray(sorted(int(i[1:]) for i in ids), dtype=np.int64)


def _union_j(data, chosen: np.ndarray, lamb: float = 0.5) -> float:
    """J of KEPT ∪ chosen per token over every document of both files, by its definition
    (docs/method.md "Token budgets"; quality scaled over both)."""
    corpus = data["corpus"]
    x = corpus.features / np.linalg.norm(corpus.features, axis=1, keepdims=True)
    q = corpus.quality[:, 0]
    q = (q - q.min()) / (q.max() - q.min())
    lengths = corpus.lengths
    kept = np.r_[data["kept"], chosen]
    cover = np.clip(x @ x[kept].T, 0, None).max(axis=1)
    quality = (lengths[kept] * q[kept]).sum() / lengths[kept].sum()
    return lamb * quality + (1 - lamb) * (lengths * cover).sum() / lengths.sum()


@pytest.mark.parametrize(
    "partition",
    [
        {"partition": "cluster", "n_clusters": 4},  # allocated by gains per token
        {"partition": "chunk", "chunk_size": 90},  # the central round
    ],
    ids=["gains", "central"],
)
def test_given_keeps_the_tokens_of_the_new_documents_near_the_one_file_union_j(data, partition):
    root = data["root"]
    kw = dict(
        select_token_ratio=0.1,
        length_col="n_chars",
        method="greedy",
        given=str(root / "old.parquet"),
        given_selection=str(root / "old_kept.parquet"),
        progress=False,
    )
    name = partition["partition"]
    one = datamask.select(str(root / "new.parquet"), root / f"one-{name}.parquet", **kw)
    out = root / f"sharded-{name}"
    sharded = datamask.select(str(root / "shards"), out, **kw, **partition)
    assert sharded["totals"]["n_groups"] > 1
    want = "gains" if name == "cluster" else "central round"
    assert sharded["budget"]["allocation"] == want
    chosen = _kept(out)
    assert set(chosen) <= set(data["new"])  # from the input only
    lengths = data["corpus"].lengths
    total = 0.1 * lengths[data["new"]].sum()
    assert total - lengths[data["new"]].max() <= lengths[chosen].sum() <= total
    assert sharded["tokens"]["kept"] == pytest.approx(lengths[chosen].sum())
    table = pq.read_table(root / f"one-{name}.parquet")
    one_rows = np.asarray(
        [int(i[1:]) for i in table.filter(table["selected"])["chunk_id"].to_pylist()]
    )
    assert one["terms_union"]["J"] == pytest.approx(_union_j(data, one_rows), rel=1e-4)
    assert _union_j(data, chosen) >= 0.99 * one["terms_union"]["J"]


@pytest.mark.parametrize("partition", ["cluster", "chunk"])
def test_the_similarity_cap_holds_over_every_kept_pair_of_a_sharded_token_run(data, partition):
    root = data["root"]
    out = root / f"capped-{partition}"
    manifest = datamask.select(
        str(root / "shards"), out, select_token_ratio=0.15, length_col="n_chars",
        method="greedy", max_similarity=0.9, partition=partition, chunk_size=90, progress=False,
    )  # fmt: skip
    assert manifest["totals"]["n_groups"] > 1
    assert manifest["budget"]["allocation"] == "central round"
    chosen = _kept(out)
    x = data["corpus"].features[chosen]
    x = x / np.linalg.norm(x, axis=1, keepdims=True)
    sims = x @ x.T
    np.fill_diagonal(sims, -1.0)
    assert sims.max() <= 0.9 + 1e-6
    lengths = data["corpus"].lengths
    assert lengths[chosen].sum() <= 0.15 * lengths[data["new"]].sum()
