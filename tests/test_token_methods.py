"""Token budgets for the methods and terms added after the first ones (issue 46):
stochastic-greedy, disf-greedy, and the Pair_simi and DiSF terms under every method that
optimises them. Each rule against a naive implementation or brute force on small cases,
the budget's bounds over 10 seeds, and the terms counted per token from their definitions
(a document's tokens as rows of its embedding)."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from datamask import MaskLearner, make_clustered
from datamask.budget import TokenBudget
from datamask.greedy import DenseGreedy, GreedyDiSF, LazyGreedy, StochasticGreedy
from datamask.objectives.combined import resolve_objective
from datamask.objectives.disf import offdiag_correlation, rank_one_offdiag


def _corpus(n: int = 300, seed: int = 0, dim: int = 12, high: int | None = None):
    """Clustered documents with long-tailed lengths (or integer ones below ``high``)."""
    corpus = make_clustered(n, dim, 5, seed=seed)
    rng = np.random.default_rng(seed)
    if high is None:
        corpus.lengths = rng.lognormal(5.0, 1.0, n).round() + 1
    else:
        corpus.lengths = rng.integers(1, high, n).astype(float)
    return corpus


def _unit(corpus) -> np.ndarray:
    x = np.asarray(corpus.features, dtype=np.float64)
    return x / np.linalg.norm(x, axis=1, keepdims=True)


def _bound(corpus, algorithm: str, total: float, k: int = 10):
    budget = TokenBudget(corpus.lengths.astype(float), total)
    return resolve_objective(None, algorithm, 0.5).bind(corpus, k, budget=budget)


# --- the budget, for every method and term added --------------------------------------------
CASES = [
    (StochasticGreedy, "Pair_simi", {}),
    (StochasticGreedy, "DiSF", {}),
    (GreedyDiSF, "DiSF", {"batch_size": 64}),
    (LazyGreedy, "Pair_simi", {}),
    (LazyGreedy, "DiSF", {}),
    (DenseGreedy, "Pair_simi", {}),
    (MaskLearner, "Pair_simi", {"n_epochs": 20}),
    (MaskLearner, "DiSF", {"n_epochs": 20}),
]


@pytest.mark.parametrize(
    ("cls", "algorithm", "own"), CASES, ids=[f"{c.method}-{a}" for c, a, _ in CASES]
)
def test_the_kept_tokens_are_within_one_document_of_the_budget(cls, algorithm, own):
    for seed in range(10):
        corpus = _corpus(200, seed=seed)
        ratio = 0.05 + 0.03 * seed
        settings = {"select_token_ratio": ratio, "seed": seed, "device": "cpu", **own}
        sel = cls(algorithm=algorithm, **settings).fit(corpus)
        total = ratio * corpus.lengths.sum()
        kept = corpus.lengths[sel.selected_].sum()
        assert total - corpus.lengths.max() <= kept <= total, (seed, kept, total)
        assert sel.tokens_ == pytest.approx(kept)
        again = cls(algorithm=algorithm, **settings).fit(corpus)
        assert np.array_equal(sel.selected_, again.selected_)  # one seed, one selection


# --- the terms, counted per token -------------------------------------------------------------
def _tokens(corpus, rows) -> np.ndarray:
    """The embeddings of the tokens of ``rows``: row i repeated l_i times (integer lengths)."""
    x = _unit(corpus)
    return np.repeat(x[rows], corpus.lengths[rows].astype(int), axis=0)


def test_pair_simi_is_the_mean_cosine_over_pairs_of_kept_tokens():
    corpus = _corpus(80, high=7)
    objective = _bound(corpus, "Pair_simi", 0.2 * corpus.lengths.sum())
    rows = np.arange(3, 80, 7)
    t = _tokens(corpus, rows)
    expected = 1.0 - (t @ t.T).mean()  # every ordered pair of tokens, a token with itself too
    assert objective.term_values(rows)["pairwise"] == pytest.approx(expected, rel=1e-6)


def test_disf_is_the_correlation_of_the_kept_tokens():
    corpus = _corpus(80, high=7)
    objective = _bound(corpus, "DiSF", 0.2 * corpus.lengths.sum())
    term = objective.terms[1][1]
    rows = np.arange(3, 80, 7)
    t = _tokens(corpus, rows)
    cov = torch.as_tensor(np.cov(t.T, bias=True))
    d = t.shape[1]
    expected = 1.0 - float(offdiag_correlation(cov)) / (d * (d - 1)) / term.scale_
    assert objective.term_values(rows)["disf"] == pytest.approx(expected, rel=1e-4)


def test_pair_simi_expectation_is_exact_under_independent_draws():
    corpus = _corpus(40, dim=6)
    objective = _bound(corpus, "Pair_simi", 0.3 * corpus.lengths.sum())
    term = objective.terms[1][1]
    term.features_ = term.features_.double()
    p = torch.as_tensor(np.random.default_rng(0).uniform(0, 0.6, 40))
    w, x = term.w_, term.features_
    # the expectation over every mask of 40 rows, by the variance of each draw: E m = p,
    # E m_i m_j = p_i p_j (i != j), E m_i^2 = p_i; the quadratic form summed directly
    gram = (w[:, None] * x) @ (w[:, None] * x).T
    second = torch.outer(p, p)
    second.fill_diagonal_(0.0)
    second += torch.diag(p)
    assert float(term.expected(p)) == pytest.approx(1.0 - float((gram * second).sum()), rel=1e-9)
    grad = torch.zeros(40, dtype=torch.float64)
    term.expected_grad(p, None, grad)
    q = p.clone().requires_grad_(True)
    term.expected(q).backward()
    assert torch.allclose(grad, q.grad)


# --- the greedy rules, against naive implementations --------------------------------------------
def _naive_budget_greedy(corpus, total, gain_value, final_value):
    """The better (by ``final_value``) of the naive cost-benefit greedy and the naive
    plain-gain greedy, each adding the best row that fits until none does; the gains are
    differences of ``gain_value``, ties to the lower row."""
    runs = []
    for per_token in (True, False):
        rows: list[int] = []
        left = total
        while True:
            base = gain_value(rows)
            keys = [
                (gain_value([*rows, j]) - base) / (corpus.lengths[j] if per_token else 1.0)
                if j not in rows and corpus.lengths[j] <= left
                else -np.inf
                for j in range(corpus.n_docs)
            ]
            if max(keys) == -np.inf:
                break
            j = int(np.argmax(keys))
            rows.append(j)
            left -= corpus.lengths[j]
        runs.append((final_value(rows), per_token, sorted(rows)))
    return max(runs)[2]


def _pair_simi_greedy_value(corpus, x, total, lamb=0.5):
    """J as the greedy maximises it, from its definition: quality per token kept, and
    ``1 - ||sum l x||^2 / T^2`` (docs/method.md "Token budgets")."""
    q, lengths = corpus.normalized_quality(), corpus.lengths

    def value(rows):
        rows = list(rows)
        w = lengths[rows] / total
        s = (w[:, None] * x[rows]).sum(0)
        return lamb * float((w * q[rows]).sum()) + (1 - lamb) * (1.0 - float(s @ s))

    return value


@pytest.mark.parametrize("algorithm", ["Pair_simi", "DiSF"])
def test_the_greedy_is_the_naive_algorithm_for_terms_that_are_not_submodular(algorithm):
    for seed in range(3):
        corpus = _corpus(16, seed=seed, dim=4)
        total = 0.3 * corpus.lengths.sum()
        sel = LazyGreedy(algorithm=algorithm, budget_tokens=total, seed=seed, device="cpu")
        sel.fit(corpus)
        assert not sel.lazy_
        objective = sel.objective_
        x = objective.features_.double().numpy()

        def exact(rows, objective=objective):
            """J; DiSF of fewer than two rows is 1 (no correlation), as the greedy counts it."""
            if len(rows) >= 2:
                return objective.term_values(np.asarray(rows, dtype=np.int64))["J"]
            (wq, quality), (wd, _) = objective.terms
            return wq * (quality.value(torch.as_tensor(rows, dtype=torch.long)) if rows else 0) + wd

        gains = _pair_simi_greedy_value(corpus, x, total) if algorithm == "Pair_simi" else exact
        naive = _naive_budget_greedy(corpus, total, gains, exact)
        assert sel.selected_.tolist() == naive


@pytest.mark.parametrize("algorithm", ["Facility", "Pair_simi"])
def test_stochastic_greedy_with_every_row_sampled_is_the_greedy(algorithm):
    """A sample as large as the rows that fit: every pick is the exact greedy's, so the
    stochastic greedy under a token budget is the (dense) cost-benefit greedy + guard."""
    for seed in range(3):
        corpus = _corpus(60, seed=seed, dim=6)
        settings = {"algorithm": algorithm, "select_token_ratio": 0.2, "seed": seed}
        sel = StochasticGreedy(sample=60, device="cpu", **settings).fit(corpus)
        greedy = DenseGreedy(device="cpu", **settings).fit(corpus)
        assert np.array_equal(sel.selected_, greedy.selected_)
        assert sel.per_token_ == greedy.per_token_


def test_stochastic_greedy_samples_only_rows_that_fit():
    """With a sample of one row, each pick is a uniform draw among the rows that still
    fit: the run is a random fill that ends within one document of the budget, and the
    seed decides it."""
    corpus = _corpus(200)
    a = StochasticGreedy(sample=1, select_token_ratio=0.1, seed=1, device="cpu").fit(corpus)
    b = StochasticGreedy(sample=1, select_token_ratio=0.1, seed=2, device="cpu").fit(corpus)
    total = 0.1 * corpus.lengths.sum()
    for sel in (a, b):
        kept = corpus.lengths[sel.selected_].sum()
        assert total - corpus.lengths.max() <= kept <= total
    assert not np.array_equal(a.selected_, b.selected_)


# --- disf-greedy ----------------------------------------------------------------------------
def _token_loss(x: np.ndarray, lengths: np.ndarray, eps: float) -> float:
    """The correlation loss of the tokens of rows ``x`` (row i repeated lengths[i] times):
    biased covariance, ``eps`` added to the variances."""
    t = np.repeat(x, lengths.astype(int), axis=0)
    cov = torch.as_tensor(np.cov(t.T, bias=True))
    return float(offdiag_correlation(cov, eps=eps, eps_mode="add"))


def test_the_rank_one_losses_are_the_losses_of_the_tokens():
    rng = np.random.default_rng(0)
    x = rng.normal(size=(30, 5))
    lengths = rng.integers(1, 9, 30).astype(float)
    picked, cands = [0, 4, 9, 13], [1, 2, 20, 25]
    w = lengths[picked]
    weight, mean = w.sum(), (w[:, None] * x[picked]).sum(0) / w.sum()
    cov = (w[:, None] * x[picked]).T @ x[picked] / weight - np.outer(mean, mean)
    lc = torch.as_tensor(lengths[cands])
    a = weight / (weight + lc)
    b = a * lc / (weight + lc)
    got = rank_one_offdiag(
        torch.as_tensor(cov),
        torch.as_tensor(cov * cov),
        torch.as_tensor(x[cands] - mean),
        a,
        b,
        eps=1e-8,
        eps_mode="add",
    )
    want = [_token_loss(x[[*picked, c]], lengths[[*picked, c]], 1e-8) for c in cands]
    assert np.allclose(got.numpy(), want, rtol=1e-9)


def _naive_disf_batch(x, lengths, first, left, per_token, eps=1e-8):
    """The token disf-greedy rule in one batch, by brute force on the tokens: from the
    given first pick, add the row that fits with the largest loss decrease per token (or
    the lowest loss after), until none fits."""
    picks = [first]
    left -= lengths[first]
    while True:
        before = _token_loss(x[picks], lengths[picks], eps) if len(picks) > 1 else 0.0
        keys = []
        for j in range(len(x)):
            if j in picks or lengths[j] > left:
                keys.append(-np.inf)
                continue
            after = _token_loss(x[[*picks, j]], lengths[[*picks, j]], eps)
            keys.append((before - after) / lengths[j] if per_token else -after)
        if max(keys) == -np.inf:
            return picks
        j = int(np.argmax(keys))
        picks.append(j)
        left -= lengths[j]


def test_disf_greedy_is_the_naive_rule_batch_by_batch():
    """Every batch's picks from its (random) first pick are the brute-force rule's, with
    the batch's share of the tokens plus what the batches before it left; the better run
    by the loss of the kept tokens is kept; the fill spends what the last batch left."""
    for seed in range(3):
        corpus = _corpus(48, seed=seed, dim=4, high=9)
        lengths = corpus.lengths
        total = 0.3 * lengths.sum()
        sel = GreedyDiSF(budget_tokens=total, batch_size=16, seed=seed, device="cpu").fit(corpus)
        x = sel.objective_.features_.double().numpy()
        firsts = [int(np.flatnonzero(sel.scores_ == 0)[b]) for b in range(3)]
        runs = []
        for per_token in (True, False):
            rows: list[int] = []
            for b, first in enumerate(firsts):
                due = total * lengths[: 16 * (b + 1)].sum() / lengths.sum()
                lo = 16 * b
                batch = slice(lo, lo + 16)
                local = _naive_disf_batch(
                    x[batch], lengths[batch], first - lo, due - lengths[rows].sum(), per_token
                )
                rows += [lo + j for j in local]
            left = total - lengths[rows].sum()
            for j in range(48):  # the fill, in row order
                if j not in rows and lengths[j] <= left:
                    rows.append(j)
                    left -= lengths[j]
            runs.append((-_token_loss(x[rows], lengths[rows], 1e-8), per_token, sorted(rows)))
        best = max(runs)
        assert sel.selected_.tolist() == best[2]
        assert sel.per_token_ == best[1]


def test_disf_greedy_reference_implementation_refuses_a_token_budget():
    with pytest.raises(ValueError, match="token budget .* needs implementation='vectorised'"):
        GreedyDiSF(implementation="reference", select_token_ratio=0.1, device="cpu").fit(
            _corpus(50)
        )
