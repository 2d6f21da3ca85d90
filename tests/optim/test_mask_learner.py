"""The DATAMASK learner: exact k, determinism, and beating the simple baselines."""

from __future__ import annotations

import numpy as np
import pytest

from datamask import DiSF, FacilityLocation, MaskLearner, Objective, PairwiseSimilarity


@pytest.mark.parametrize("estimator", ["expected", "reinforce"])
@pytest.mark.parametrize("ratio", [0.05, 0.3, 0.9])
def test_selects_exactly_k(small_corpus, estimator, ratio):
    learner = MaskLearner(
        select_ratio=ratio, estimator=estimator, n_epochs=20, n_rollout=8, device="cpu"
    ).fit(small_corpus)
    k = round(ratio * small_corpus.n_docs)
    assert len(learner.selected_) == k
    assert len(np.unique(learner.selected_)) == k
    assert np.all(np.diff(learner.selected_) > 0)
    # The selection is exactly the top-k of its scores (the logits, refined by swaps).
    assert (
        learner.scores_[learner.selected_].min()
        >= np.delete(learner.scores_, learner.selected_).max()
    )


def test_explicit_k_overrides_the_ratio(small_corpus):
    learner = MaskLearner(k=37, n_epochs=10, device="cpu").fit(small_corpus)
    assert len(learner.selected_) == 37
    with pytest.raises(ValueError, match="k=401 exceeds the 400 documents"):
        MaskLearner(k=401, n_epochs=10, device="cpu").fit(small_corpus)


@pytest.mark.parametrize(
    "params",
    [
        dict(estimator="expected"),
        dict(estimator="reinforce", n_rollout=8),
        dict(estimator="reinforce", n_rollout=8, mask_sampler="topk", baseline="loo"),
    ],
)
def test_same_seed_same_selection(small_corpus, params):
    def run(seed):
        return MaskLearner(select_ratio=0.2, n_epochs=25, seed=seed, device="cpu", **params).fit(
            small_corpus
        )

    a, b, c = run(7), run(7), run(8)
    np.testing.assert_array_equal(a.selected_, b.selected_)
    np.testing.assert_array_equal(a.logits_, b.logits_)
    assert not np.array_equal(a.logits_, c.logits_)


@pytest.mark.parametrize(("ratio", "steps"), [(0.01, 10), (0.2, 20), (0.9, 90)])
def test_default_steps_follow_k(small_corpus, ratio, steps):
    """expected: min(100, max(10, ceil(k / 4))) steps unless n_epochs is given."""
    learner = MaskLearner(select_ratio=ratio, device="cpu").fit(small_corpus)
    assert learner.n_epochs_ == steps  # k = 4, 80, 360 of 400
    given = MaskLearner(select_ratio=ratio, n_epochs=7, device="cpu").fit(small_corpus)
    assert given.n_epochs_ == 7


def test_same_seed_same_selection_with_the_exact_rounding(demo_corpus):
    """At select_ratio 0.01 (exact cover in the rounding) the same seed selects the same
    rows, in a second fit of the same learner too."""
    learner = MaskLearner(select_ratio=0.01, seed=3, device="cpu")
    a = learner.fit(demo_corpus).selected_.copy()
    assert learner.objective_.terms[-1][1].exact_rounding_
    b = MaskLearner(select_ratio=0.01, seed=3, device="cpu").fit(demo_corpus).selected_
    np.testing.assert_array_equal(a, b)
    np.testing.assert_array_equal(a, learner.fit(demo_corpus).selected_)


def test_ties_are_broken_by_id():
    from datamask.optim import top_k_rows

    ids = np.array(["d", "b", "a", "c"], dtype=object)
    assert list(top_k_rows(np.array([1.0, 1.0, 1.0, 1.0]), ids, 2)) == [1, 2]  # "a", "b"


@pytest.mark.filterwarnings("error::RuntimeWarning")
@pytest.mark.parametrize("n", [2, 4])
def test_a_group_smaller_than_one_batch_still_measures_its_coverage(n):
    """``partial * n`` rounds to 0 below 5 documents (a sharded run's tiny group): each
    step still averages one document's coverage, so the logged objective is a number
    (it was the mean of nothing, NaN, with a division by zero in the gradient)."""
    from datamask import make_clustered

    learner = MaskLearner(select_ratio=0.5, n_epochs=10, seed=0, device="cpu")
    learner.fit(make_clustered(n, 8, 2, seed=0))
    assert np.isfinite([h["objective"] for h in learner.history_]).all()


@pytest.mark.parametrize("term", [FacilityLocation(), PairwiseSimilarity(), DiSF()])
def test_learner_improves_on_its_init(small_corpus, term):
    obj = Objective(term, lamb=0.5)
    learner = MaskLearner(obj, select_ratio=0.1, n_epochs=150, device="cpu").fit(small_corpus)
    q = learner.objective_.quality_.numpy()
    topk = np.argsort(-q)[: learner.k_]
    assert learner.terms_["J"] > learner.objective_.value(topk)


@pytest.mark.parametrize("algorithm", ["Facility", "Pair_simi", "DiSF"])
def test_beats_random_and_topk_on_real_demo_data(demo_corpus, algorithm):
    """On real documents at lamb=0.5 the learner's J beats random and top-quality at equal k."""
    corpus = demo_corpus
    learner = MaskLearner(
        algorithm=algorithm, select_ratio=0.1, lamb=0.5, seed=0, device="cpu"
    ).fit(corpus)
    obj = learner.objective_
    k = learner.k_
    topk = np.argsort(-obj.quality_.numpy(), kind="stable")[:k]
    rng = np.random.default_rng(0)
    randoms = [obj.value(rng.choice(corpus.n_docs, k, replace=False)) for _ in range(5)]
    assert learner.terms_["J"] > obj.value(topk)
    assert learner.terms_["J"] > max(randoms)


@pytest.mark.parametrize(
    ("params", "message"),
    [
        (dict(select_ratio=1.5), r"select_ratio must be in \(0, 1\); got 1.5"),
        (dict(select_ratio=0.0), r"select_ratio must be in \(0, 1\); got 0.0"),
        (dict(estimator="reinforced"), "estimator must be one of"),
        (dict(init="random"), "init must be one of"),
        (dict(partial=0.0), r"partial must be in \(0, 1\]"),
        (dict(n_epochs=0), "n_epochs must be > 0"),
        (dict(estimator="reinforce", n_rollout=1), "n_rollout must be >= 2"),
        (dict(max_lr=1.0, min_lr=2.0), "min_lr"),
        (dict(select_ratio=0.0001), "k=0: select_ratio 0.0001 of 400 documents selects nothing"),
    ],
)
def test_bad_parameters_are_named(small_corpus, params, message):
    with pytest.raises(ValueError, match=message):
        MaskLearner(n_epochs=params.pop("n_epochs", 5), device="cpu", **params).fit(small_corpus)
