"""The global budget by equal marginal gains (distributed.combine.allocate), against brute force."""

from __future__ import annotations

import itertools
from pathlib import Path

import numpy as np
import pyarrow.parquet as pq
import pytest
import torch

from datamask import Corpus, FacilityLocation, Objective
from datamask.config import SelectSpec
from datamask.distributed import LocalRunner, run_selection
from datamask.distributed.combine.allocate import allocate, allocate_counts, saturated
from datamask.distributed.combine.gains import allocates_by_gains, gain_knots, gains_in_j_units
from datamask.greedy.lazy import gain_order
from datamask.objectives.combined import group_lamb
from datamask.pipeline.step import fit_group, gain_curve
from tests._data import reference_table, write


def _corpus(x: np.ndarray, q: np.ndarray, qrange=None) -> Corpus:
    return Corpus(
        ids=np.array([f"d{i}" for i in range(len(x))]),
        quality=q,
        features=x.astype(np.float32),
        quality_range=qrange,
    )


def _exact_j(x: np.ndarray, qs: np.ndarray, rows, lamb: float, k: int) -> float:
    """J with quality summed over ``rows`` / k and coverage over every row of ``x`` / n."""
    rows = list(rows)
    if not rows:
        return 0.0
    cover = np.clip(x @ x[rows].T, 0, None).max(axis=1)
    return lamb * qs[rows].sum() / k + (1 - lamb) * cover.mean()


@pytest.mark.parametrize("lamb", [0.0, 0.2, 0.5, 0.8, 1.0])
def test_group_lamb_trades_at_the_corpus_rate(lamb):
    for c, n, k, big_n in [(200, 1000, 1000, 10_000), (7, 13, 50, 400), (1, 1, 3, 9)]:
        lg = group_lamb(lamb, c, n, k, big_n)
        assert 0 <= lg <= 1
        if 0 < lamb < 1:
            assert (lg / c) / ((1 - lg) / n) == pytest.approx((lamb / k) / ((1 - lamb) / big_n))
        else:
            assert lg == lamb


def test_gain_order_is_greedy_on_the_rows_with_exact_gains():
    rng = np.random.default_rng(0)
    x = rng.standard_normal((40, 6))
    x /= np.linalg.norm(x, axis=1, keepdims=True)
    q = rng.random(40)
    corpus = _corpus(x, q)
    rows = np.array([3, 8, 11, 17, 20, 25, 31, 39])
    lamb, k = 0.4, len(rows)
    # K = n: the graph is every pair, so the graph objective is the exact one
    objective = Objective([FacilityLocation(n_neighbors=40, knn="exact")], lamb=lamb)
    objective.bind(corpus, k, "cpu", seed=0)
    order, gains = gain_order(objective, rows[::-1].copy())  # any order in: ties to lower
    qs = (q - q.min()) / (q.max() - q.min())
    # brute force: naive greedy over the rows, coverage over all 40
    picked: list[int] = []
    for t in range(len(rows)):
        base = _exact_j(x, qs, picked, lamb, k)
        cand = [r for r in rows if r not in picked]
        best = max(cand, key=lambda r: (_exact_j(x, qs, picked + [r], lamb, k), -r))
        assert order[t] == best
        want = _exact_j(x, qs, picked + [best], lamb, k) - base
        assert gains[t] == pytest.approx(want, rel=1e-5, abs=1e-7)
        picked.append(best)
    assert np.all(np.diff(gains) <= 1e-7)  # submodular: the curve does not rise


def test_a_group_that_keeps_nothing_has_an_empty_gain_curve():
    """k = 0 with the gain curve (a small group's share rounds to nothing) once crashed in
    torch.cat over no rows; its curve is empty and the group proposes nothing."""
    rng = np.random.default_rng(1)
    x = rng.standard_normal((30, 6))
    corpus = _corpus(x / np.linalg.norm(x, axis=1, keepdims=True), rng.random(30))
    spec = SelectSpec.from_mapping({"select_ratio": 0.1, "n_neighbors": 8})
    sel, objective = fit_group(corpus, 0, spec)
    gain_curve(corpus, sel, objective, spec)
    order, gains = sel.meta["gain_order"]
    assert len(sel.selected) == 0 and order.shape == (0,) and gains.shape == (0,)
    assert order.dtype == np.int64 and gains.dtype == np.float64


def test_gains_in_j_units_sum_to_the_groups_share_of_corpus_j():
    """A group priced at group_lamb: its prefix's gains in J units add up to what the
    prefix contributes to the corpus' J (quality / k, coverage of its rows / N)."""
    rng = np.random.default_rng(1)
    x = rng.standard_normal((60, 5))
    x /= np.linalg.norm(x, axis=1, keepdims=True)
    q = rng.random(60)
    qs = (q - q.min()) / (q.max() - q.min())
    group = np.arange(20, 45)  # 25 rows of a 60-row corpus
    k_total, n_total, c_g, lamb = 12, 60, 9, 0.5
    lamb_g = group_lamb(lamb, c_g, len(group), k_total, n_total)
    corpus = _corpus(x[group], q[group], qrange=(np.array([q.min()]), np.array([q.max()])))
    objective = Objective([FacilityLocation(n_neighbors=25, knn="exact")], lamb=lamb_g)
    objective.bind(corpus, c_g, "cpu", seed=0)
    order, gains = gain_order(objective, np.arange(len(group)))
    in_j = gains_in_j_units(gains, lamb, lamb_g, c_g, len(group), k_total, n_total)
    for m in (1, 4, 9, 25):
        rows = group[order[:m]]
        cover = np.clip(x[group] @ x[rows].T, 0, None).max(axis=1).sum()
        share = lamb * qs[rows].sum() / k_total + (1 - lamb) * cover / n_total
        assert in_j[:m].sum() == pytest.approx(share, rel=1e-5)


@pytest.mark.parametrize(("n_knots", "window_max"), [(32, 1 << 20), (2, 0), (3, 4)])
def test_allocate_is_the_k_largest_gains_with_ties_by_group_then_pick(n_knots, window_max):
    """Against brute force: sort every (gain, group, pick) and take k. Few knots and a
    small window force the refinement rounds; few distinct values force ties."""
    rng = np.random.default_rng(2)
    for _ in range(200):
        sizes = rng.integers(0, 12, size=rng.integers(1, 6))
        curves = [
            np.sort(rng.integers(0, rng.integers(1, 9), size=s).astype(float))[::-1] for s in sizes
        ]
        total = int(sum(sizes))
        reads = []

        def read(g, lo, hi, curves=curves, reads=reads):
            reads.append(hi - lo)
            return curves[g][lo:hi]

        for k in {0, 1, total // 3, total // 2, max(total - 1, 0), total} - {-1}:
            if k > total:
                continue
            knots = [gain_knots(c, n_knots=n_knots) for c in curves]
            counts = allocate_counts(knots, sizes, read, k, window_max=window_max)
            flat = [(-v, g, p) for g, c in enumerate(curves) for p, v in enumerate(c)]
            want = sorted(flat)[:k]
            assert counts.tolist() == [
                sum(1 for _, g, _ in want if g == h) for h in range(len(curves))
            ]
            assert counts.tolist() == allocate(curves, k).tolist()
    with pytest.raises(ValueError, match="k_total must be in"):
        allocate([np.ones(2)], 3)


def test_allocate_reads_only_near_the_threshold():
    """A thousand groups of a thousand gains: the allocation reads each undecided range
    once, and the gains it holds at once are bounded by the window, not the total."""
    rng = np.random.default_rng(5)
    curves = [np.sort(rng.random(1000))[::-1] * rng.random() for _ in range(1000)]
    k = 100_000
    held = []

    def read(g, lo, hi):
        held.append(hi - lo)
        return curves[g][lo:hi]

    knots = [gain_knots(c) for c in curves]
    counts = allocate_counts(knots, [1000] * 1000, read, k, window_max=50_000)
    flat = np.concatenate(curves)
    assert counts.sum() == k
    threshold = np.sort(flat)[::-1][k - 1]
    assert all((c[:m] >= threshold).all() for c, m in zip(curves, counts, strict=True))
    assert sum(held) < 0.2 * flat.size  # far from reading every gain


def test_saturated_groups_are_those_cut_off_by_their_candidates():
    counts = np.array([3, 2, 5, 0])
    assert saturated(counts, [3, 4, 5, 0], [10, 10, 5, 7]) == [0]


def test_allocation_is_optimal_for_concave_curves():
    """Equal marginal gains: no other split of k over the groups has a larger total."""
    rng = np.random.default_rng(3)
    curves = [np.sort(rng.random(6))[::-1] for _ in range(3)]
    k = 7
    counts = allocate(curves, k)
    got = sum(c[:m].sum() for c, m in zip(curves, counts, strict=True))
    best = max(
        sum(c[:m].sum() for c, m in zip(curves, split, strict=True))
        for split in itertools.product(range(7), repeat=3)
        if sum(split) == k
    )
    assert got == pytest.approx(best)


def _write(path: Path, ids, x, q) -> None:
    write(reference_table(ids, q, x.astype(np.float32)), path)


def test_a_sharded_run_spends_the_budget_where_it_pays(tmp_path):
    """Topic a: 200 near-copies of one document; topic b, orthogonal to it: 200 spread-out
    ones; same quality. The group budget keeps 20 of each; the allocation moves budget to
    the spread topic (the copies still earn their quality), and its exact J over the
    corpus is higher."""
    rng = np.random.default_rng(0)
    d = 16
    a = np.eye(d)[0] + 0.02 * rng.standard_normal((200, d))
    b = 4.0 * np.eye(d)[1] + np.hstack([np.zeros((200, 1)), rng.standard_normal((200, d - 1))])
    a /= np.linalg.norm(a, axis=1, keepdims=True)
    b /= np.linalg.norm(b, axis=1, keepdims=True)
    q = rng.uniform(0.4, 0.6, 400)
    shards = tmp_path / "shards"
    shards.mkdir()
    _write(shards / "a.parquet", [f"a{i}" for i in range(200)], a, q[:200])
    _write(shards / "b.parquet", [f"b{i}" for i in range(200)], b, q[200:])
    x = np.vstack([a, b])
    qs = (q - q.min()) / (q.max() - q.min())
    ids = [f"a{i}" for i in range(200)] + [f"b{i}" for i in range(200)]
    common = dict(select_ratio=0.1, n_epochs=30, workers=1, partition="cluster", n_clusters=2)
    results = {}
    for budget in ("global", "group"):
        spec = SelectSpec.from_mapping(dict(common, budget=budget))
        m = run_selection(shards, tmp_path / budget, spec, runner=LocalRunner(1), progress=False)
        assert sorted(g["n"] for g in m["groups"]) == [200, 200]  # the two topics
        kept = set(pq.read_table(tmp_path / budget / "selected").column("chunk_id").to_pylist())
        rows = [i for i, v in enumerate(ids) if v in kept]
        assert len(rows) == 40
        results[budget] = (m, _exact_j(x, qs, rows, 0.5, 40), sum(v[0] == "a" for v in kept))
    m, j_global, from_a = results["global"]
    assert m["budget"]["allocation"] == "gains"
    assert sorted(m["budget"]["global_round"]["kept_per_group"]) == sorted([from_a, 40 - from_a])
    assert results["group"][2] == 20 and from_a <= 15
    assert j_global > results["group"][1]
    parts = sorted(p.name for p in (tmp_path / "global" / "selected").iterdir())
    assert parts == ["part-00000.parquet", "part-00001.parquet"]
    table = pq.read_table(tmp_path / "global" / "selected")
    assert set(table.column_names) == {"chunk_id", "group", "rank", "logit", "gain"}
    for g in (0, 1):  # each group's kept prefix, in pick order, its gains non-increasing
        part = pq.read_table(tmp_path / "global" / "selected" / f"part-0000{g}.parquet")
        assert part.column("rank").to_pylist() == list(range(1, part.num_rows + 1))
        assert (np.diff(part.column("gain").to_numpy()) <= 0).all()


def test_which_runs_allocate_by_gains():
    def spec(**kw):
        return SelectSpec.from_mapping({"partition": "cluster", **kw})

    assert allocates_by_gains(spec())
    assert allocates_by_gains(spec(method="greedy"))
    assert allocates_by_gains(SelectSpec.from_mapping({}))  # the default: k-means groups
    assert not allocates_by_gains(spec(partition="shard"))  # shards of random rows
    assert not allocates_by_gains(spec(partition="chunk"))
    assert not allocates_by_gains(spec(algorithm=["Facility", "DiSF"]))
    assert not allocates_by_gains(spec(algorithm=["Pair_simi"]))
    assert not allocates_by_gains(spec(method="topk"))  # an exact merge of scores
    assert not allocates_by_gains(spec(max_similarity=0.9))
    assert torch.isfinite(torch.tensor(group_lamb(0.5, 1, 1, 1, 1)))
