"""Baseline selectors: each greedy against brute force, lazy == naive (the common battery
over every method: tests/test_selectors.py)."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from datamask import DiSF, FacilityLocation, Objective, PairwiseSimilarity, make_clustered
from datamask._device import make_generators, seed_streams
from datamask.data import Corpus
from datamask.greedy import (
    DenseGreedy,
    GreedyDiSF,
    LazyGreedy,
    NaiveGreedy,
    StochasticGreedy,
)
from datamask.greedy.disf import batch_quotas, candidate_losses, reference_correlation
from datamask.greedy.stochastic import sample_size
from datamask.objectives.disf import correlation_loss
from datamask.ranking import RandomSelector, TopKQuality

TERMS = {"Facility": FacilityLocation, "Pair_simi": PairwiseSimilarity, "DiSF": DiSF}


def tiny(seed: int, n: int = 24, d: int = 6) -> Corpus:
    return make_clustered(n, d, 4, seed=seed)


# --- brute force: the set function greedy maximises, in numpy float64 ----------------------
def brute_value(
    corpus: Corpus, rows: list[int], algorithm: str, lamb: float, k: int, disf_scale: float = 1.0
) -> float:
    """``lamb * sum_S q / k + (1 - lamb) * D(S)``: J at the target size k, for any |S|.

    ``disf_scale`` is the DiSF term's reference loss ``L_k`` (a constant of the term).
    """
    x = corpus.features.astype(np.float64)
    q = corpus.normalized_quality()
    s = np.asarray(rows, dtype=np.int64)
    quality = q[s].sum() / k
    if algorithm == "Facility":
        div = np.maximum((x @ x[s].T).max(1), 0.0).mean() if len(s) else 0.0
    elif algorithm == "Pair_simi":
        total = x[s].sum(0)
        div = 1.0 - (total @ total - len(s)) / (k * (k - 1))
    else:  # DiSF: 1 - mean squared off-diagonal correlation (biased, variance floored)
        if len(s) == 0:
            div = 1.0
        else:
            xs = x[s]
            cov = (xs - xs.mean(0)).T @ (xs - xs.mean(0)) / len(s)
            inv = 1.0 / np.sqrt(np.maximum(np.diag(cov), 1e-8))
            corr = cov * inv[:, None] * inv[None, :]
            d = x.shape[1]
            off = (corr**2).sum() - (np.diag(corr) ** 2).sum()
            div = 1.0 - off / (d * (d - 1)) / disf_scale
    return lamb * quality + (1.0 - lamb) * div


def exhaustive_greedy(
    corpus: Corpus, k: int, algorithm: str, lamb: float, disf_scale: float = 1.0
) -> list[int]:
    """Each step: the j maximising J(S + {j}), found by scoring every candidate set."""
    picked: list[int] = []
    for _ in range(k):
        rest = [j for j in range(corpus.n_docs) if j not in picked]
        values = [brute_value(corpus, picked + [j], algorithm, lamb, k, disf_scale) for j in rest]
        picked.append(rest[int(np.argmax(values))])
    return picked


@pytest.mark.parametrize("algorithm", ["Facility", "Pair_simi", "DiSF"])
@pytest.mark.parametrize("seed", [0, 1, 2])
def test_every_greedy_equals_exhaustive_greedy(algorithm, seed):
    corpus = tiny(seed)
    k = 6
    kw = dict(algorithm=algorithm, lamb=0.5, k=k, device="cpu")
    naive = NaiveGreedy(**kw).fit(corpus)
    scale = getattr(naive.objective_.terms[1][1], "scale_", 1.0)  # DiSF's L_k constant
    expected = exhaustive_greedy(corpus, k, algorithm, 0.5, scale)
    lazy = LazyGreedy(**kw).fit(corpus)
    full_sample = StochasticGreedy(sample=corpus.n_docs, **kw).fit(corpus)
    assert naive.order_.tolist() == expected
    assert lazy.order_.tolist() == expected
    assert full_sample.order_.tolist() == expected
    # The reported objective is the exact J of the final k-set.
    want = brute_value(corpus, expected, algorithm, 0.5, k, scale)
    assert naive.terms_["J"] == pytest.approx(want, abs=1e-4)


@pytest.mark.parametrize("batch_size", [1, 2, 16, 1000])
@pytest.mark.parametrize("lamb", [0.0, 0.5, 0.9])
def test_lazy_equals_naive_with_fewer_evaluations(batch_size, lamb):
    corpus = make_clustered(300, 12, 6, seed=4)
    kw = dict(lamb=lamb, select_ratio=0.1, device="cpu")
    naive = NaiveGreedy(**kw).fit(corpus)
    lazy = DenseGreedy(batch_size=batch_size, **kw).fit(corpus)  # all pairs, like naive
    assert lazy.lazy_
    np.testing.assert_array_equal(lazy.order_, naive.order_)
    assert lazy.terms_["J"] == pytest.approx(naive.terms_["J"])
    naive_evals = sum(300 - t for t in range(30))
    if batch_size <= 16:  # a batch as large as the corpus re-evaluates everything
        assert lazy.n_evaluations_ < naive_evals / 2


def test_lazy_falls_back_to_full_evaluation_when_not_submodular():
    corpus = make_clustered(120, 8, 4, seed=5)
    kw = dict(algorithm="Pair_simi", select_ratio=0.1, device="cpu")
    lazy = LazyGreedy(**kw).fit(corpus)
    assert not lazy.lazy_
    np.testing.assert_array_equal(lazy.order_, NaiveGreedy(**kw).fit(corpus).order_)


def test_greedy_history_ends_at_the_exact_objective():
    corpus = make_clustered(200, 8, 4, seed=1)
    sel = LazyGreedy(select_ratio=0.1, device="cpu").fit(corpus)
    values = [h["objective"] for h in sel.history_]
    assert sel.history_[-1]["step"] == 20
    assert values[-1] == pytest.approx(sel.terms_["J"])
    assert all(b >= a - 1e-6 for a, b in zip(values, values[1:], strict=False))  # gains >= 0


def test_scores_replay_the_pick_order():
    corpus = make_clustered(100, 8, 4, seed=2)
    sel = LazyGreedy(select_ratio=0.1, device="cpu").fit(corpus)
    ranked = np.argsort(-sel.scores_, kind="stable")[: len(sel.order_)]
    np.testing.assert_array_equal(ranked, sel.order_)


# --- stochastic greedy ----------------------------------------------------------------------
def test_stochastic_sample_size_is_mirzasoleiman():
    assert sample_size(1000, 100, 0.1) == int(np.ceil(10 * np.log(10)))
    assert sample_size(10, 10, 0.99) == 1


def test_stochastic_with_tiny_eps_is_greedy():
    corpus = make_clustered(150, 8, 5, seed=6)
    kw = dict(select_ratio=0.1, device="cpu")
    sto = StochasticGreedy(eps=1e-12, **kw).fit(corpus)  # sample (n/k) log(1e12) > n
    assert sto.sample_size_ >= corpus.n_docs
    np.testing.assert_array_equal(sto.order_, DenseGreedy(**kw).fit(corpus).order_)


@pytest.mark.parametrize("algorithm", ["Facility", "Pair_simi"])
def test_stochastic_pick_is_the_exact_best_of_its_sample(algorithm):
    """Lazy bounds inside the sample must not change the pick: compare with no bounds."""
    corpus = make_clustered(200, 8, 5, seed=7)
    kw = dict(algorithm=algorithm, select_ratio=0.1, eps=0.3, seed=3, device="cpu")
    sto = StochasticGreedy(**kw).fit(corpus)
    # Replay: same sampling stream (the selector's, stream 0 of the seed), every sampled
    # gain evaluated exactly.
    obj = sto.objective_
    gen, _ = make_generators(seed_streams(3, 1)[0], torch.device("cpu"))
    pool = torch.arange(corpus.n_docs)
    state = obj.init_state()
    for t in range(sto.k_):
        pos = torch.randperm(len(pool), generator=gen)[: sto.sample_size_]
        cand = pool[pos.sort().values]
        j = int(cand[int(torch.argmax(obj.gains(state, cand)))])
        assert j == sto.order_[t]
        state = obj.update(state, j)
        pool = pool[pool != j]


def test_stochastic_seeds():
    corpus = make_clustered(300, 8, 5, seed=8)
    kw = dict(select_ratio=0.1, eps=0.5, device="cpu")
    a, b = StochasticGreedy(seed=1, **kw).fit(corpus), StochasticGreedy(seed=1, **kw).fit(corpus)
    c = StochasticGreedy(seed=2, **kw).fit(corpus)
    np.testing.assert_array_equal(a.order_, b.order_)
    assert not np.array_equal(a.order_, c.order_)


# --- DiSF greedy ----------------------------------------------------------------------------
def cal_corre(feat: np.ndarray, eps: float = 1e-8) -> float:
    """The original's loss in numpy (without its 1/10000 scale)."""
    z = feat - feat.mean(0, keepdims=True)
    z = z / np.sqrt(eps + z.var(0, ddof=1, keepdims=True))
    corr = z.T @ z / (len(feat) - 1)
    return float((corr**2).sum() - (np.diag(corr) ** 2).sum())


def test_candidate_losses_equal_the_original_loss():
    rng = np.random.default_rng(0)
    x = rng.standard_normal((40, 7))
    picked = [3, 11, 17]
    xt = torch.as_tensor(x)
    got = candidate_losses(len(picked), xt[picked].sum(0), xt[picked].T @ xt[picked], xt)
    want = [cal_corre(x[picked + [j]]) for j in range(40)]
    np.testing.assert_allclose(got.numpy(), want, rtol=1e-9)
    want_torch = [float(reference_correlation(xt[picked + [j]])) for j in range(40)]
    np.testing.assert_allclose(want_torch, want, rtol=1e-9)


def test_batch_quotas_sum_to_k_in_proportion():
    starts, quotas = batch_quotas(2500, 250, 1024)
    assert starts.tolist() == [0, 1024, 2048]
    assert quotas.sum() == 250
    # shares 102.4, 102.4, 45.2: the one seat left goes to the earlier of the tied batches
    assert quotas.tolist() == [103, 102, 45]
    _, q = batch_quotas(4096, 64, 1024)
    assert q.tolist() == [16, 16, 16, 16]  # the original's 16 per 1024


def test_disf_greedy_equals_the_original_loop():
    corpus = make_clustered(90, 6, 3, seed=9)
    sel = GreedyDiSF(select_ratio=0.2, batch_size=40, device="cpu").fit(corpus)
    x = corpus.features.astype(np.float64)
    assert sel.quotas_.sum() == sel.k_ == 18
    order = sel.order_.tolist()
    pos = 0
    for lo, q in zip(sel.batch_starts_, sel.quotas_, strict=True):
        hi = min(lo + 40, 90)
        picks = [order[pos] - lo]  # the random first pick, taken from the selector
        while len(picks) < q:  # the original's loop: strict '<' over rows in order
            best, best_j = np.inf, -1
            for j in range(hi - lo):
                if j in picks:
                    continue
                loss = cal_corre(x[lo:hi][picks + [j]])
                if loss < best:
                    best, best_j = loss, j
            picks.append(best_j)
        assert [lo + p for p in picks] == order[pos : pos + q]
        pos += q
    assert sel.disf_loss_ == pytest.approx(
        correlation_loss(torch.as_tensor(x[order]).float()), rel=1e-5
    )
    ref = GreedyDiSF(select_ratio=0.2, batch_size=40, device="cpu", implementation="reference").fit(
        corpus
    )
    np.testing.assert_array_equal(ref.order_, sel.order_)


def test_disf_greedy_beats_random_on_its_loss():
    corpus = make_clustered(600, 16, 6, seed=10)
    sel = GreedyDiSF(select_ratio=0.1, batch_size=200, device="cpu").fit(corpus)
    rnd = RandomSelector(select_ratio=0.1, device="cpu").fit(corpus)
    assert sel.disf_loss_ < correlation_loss(torch.as_tensor(corpus.features[rnd.selected_]))
    assert sel.terms_.keys() >= {"quality", "disf", "J"}  # scored with its DiSF objective


# --- top-k and random -----------------------------------------------------------------------
def test_topk_is_the_quality_ranking_with_id_ties():
    corpus = make_clustered(50, 4, 2, seed=0)
    corpus.quality[:] = 1.0
    corpus.quality[[7, 9]] = 2.0
    corpus.ids = np.array([f"id-{49 - i:02d}" for i in range(50)], dtype=object)
    sel = TopKQuality(k=4, device="cpu").fit(corpus)
    # 7 and 9 by quality, then the two smallest ids among the ties: rows 49 and 48.
    assert sel.selected_.tolist() == [7, 9, 48, 49]


def test_random_is_uniform_and_seeded():
    corpus = make_clustered(1000, 4, 2, seed=0)
    counts = np.zeros(1000)
    picks = []
    for seed in range(40):
        picks.append(RandomSelector(select_ratio=0.5, seed=seed, device="cpu").fit(corpus))
        counts[picks[-1].selected_] += 1
    again = RandomSelector(select_ratio=0.5, seed=7, device="cpu").fit(corpus)
    np.testing.assert_array_equal(again.selected_, picks[7].selected_)
    assert not np.array_equal(picks[0].selected_, picks[1].selected_)
    # Each row is kept Binomial(40, 1/2) times if the draw is uniform: std sqrt(10) = 3.16.
    # A draw that favoured the early (or late) rows, or repeated one subset, fails these.
    assert 2.5 < counts.std() < 3.9
    assert abs(counts[:500].mean() - 20) < 0.5
    assert counts.max() < 40 and counts.min() > 0


# --- the common battery -------------------------------------------------------------------------


def test_objective_argument_is_used():
    corpus = make_clustered(80, 6, 3, seed=0)
    obj = Objective([FacilityLocation(), PairwiseSimilarity()], lamb=0.3)
    sel = LazyGreedy(obj, select_ratio=0.1, device="cpu").fit(corpus)
    assert set(sel.terms_) == {"quality", "facility", "pairwise", "J"}
    assert not sel.lazy_  # pairwise is not known submodular


def test_initial_gains_pass_shows_progress(capsys):
    # The first pass over every row's gain ran for minutes at N=200k with nothing shown.
    from datamask.greedy import DenseGreedy

    corpus = make_clustered(300, 8, 4, seed=0)
    plain = DenseGreedy(select_ratio=0.1, device="cpu").fit(corpus)
    shown = DenseGreedy(select_ratio=0.1, device="cpu", progress=True).fit(corpus)
    err = capsys.readouterr().err
    assert "greedy-dense initial gains" in err and "300/300" in err
    np.testing.assert_array_equal(plain.selected_, shown.selected_)


@pytest.mark.parametrize("with_floor", [False, True])
def test_gain_order_on_the_host_is_the_tensor_lazy_greedy(with_floor):
    """gain_order runs on host gains (quality and facility location have them): the same
    picks, in the same order, as lazy greedy on the objective's tensors, with the same
    gains; on a floor-raised graph (a sharded run's exchange round) too. Quality takes
    four values only, so ties between rows are common and go to the lower row."""
    from datamask.greedy.lazy import _Pool, gain_order, lazy_picks

    rng = np.random.default_rng(5)
    x = rng.standard_normal((400, 8)).astype(np.float32)
    x /= np.linalg.norm(x, axis=1, keepdims=True)
    q = rng.integers(0, 4, 400).astype(np.float64)
    corpus = Corpus(ids=np.array([f"d{i}" for i in range(400)]), quality=q, features=x)
    objective = Objective([FacilityLocation(n_neighbors=12, knn="exact")], lamb=0.3)
    objective.bind(corpus, 30, "cpu", seed=0)
    if with_floor:
        objective.terms[1][1].raise_floor(torch.as_tensor(rng.random(400) * 0.5))
    rows = rng.choice(400, 150, replace=False)
    assert all(term.host_gains() is not None for _, term in objective.terms)
    order, gains = gain_order(objective, rows)
    pool = np.sort(rows)
    rows_t = torch.as_tensor(pool)
    state = objective.init_state(graph=True)
    bounds = objective.gains(state, rows_t).clone()
    picks = list(lazy_picks(_Pool(objective, rows_t), state, bounds, len(pool), batch_size=16))
    assert order.tolist() == pool[[j for j, _ in picks]].tolist()
    np.testing.assert_allclose(gains, [g for _, g in picks], rtol=1e-5, atol=1e-9)
    assert np.all(np.diff(gains) <= 1e-12)  # submodular: the host curve never rises
