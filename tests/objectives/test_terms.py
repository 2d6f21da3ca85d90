"""The term extension point: context, capability flags, registry, user and value-only terms."""

from __future__ import annotations

import multiprocessing
import sys
import textwrap

import numpy as np
import pytest
import torch

from datamask import MaskLearner, Objective, make_clustered
from datamask._validation import Interval, Options, check_corpus, validate_params
from datamask.greedy import DenseGreedy, LazyGreedy, NaiveGreedy, StochasticGreedy
from datamask.greedy.lazy import is_submodular
from datamask.objectives import (
    ALGORITHMS,
    TERMS,
    DiSF,
    FacilityLocation,
    PairwiseSimilarity,
    Quality,
    Term,
    TermContext,
    ValueTerm,
    import_term_modules,
    make_term,
    offdiag_correlation,
    register_term,
    term_names,
    term_params,
)


# --- user terms defined here -----------------------------------------------------------------
@register_term("TestMeanQualitySquared")
class MeanQualitySquared(ValueTerm):
    """Value-only: the mean squared normalised quality of the subset."""

    name = "quality_sq"

    def value(self, selected: torch.Tensor) -> float:
        return float((self.quality_[selected].double() ** 2).mean())


class DenseCoverage(ValueTerm):
    """Value-only facility location, computed densely: submodular, and declared so."""

    name = "coverage"
    submodular = True
    calls = 0

    def value(self, selected: torch.Tensor) -> float:
        sims = self.features_.double() @ self.features_[selected].double().T
        return float(sims.amax(1).clamp_min(0.0).mean())

    def gains(self, state, candidates):
        DenseCoverage.calls += len(candidates)
        return super().gains(state, candidates)


class UndeclaredCoverage(DenseCoverage):
    """The same values, not declared submodular."""

    submodular = False


class ColumnMean(ValueTerm):
    """Reads an extra column: the mean of ``score`` over the subset, scaled by ``scale``."""

    name = "column_mean"
    requires_columns = ("score",)
    _parameter_constraints = {"scale": [Interval(float, 0, None, closed="neither")]}

    def __init__(self, scale: float = 1.0) -> None:
        self.scale = scale

    def value(self, selected: torch.Tensor) -> float:
        col = self.ctx_.columns["score"]
        return float(self.scale * col[selected.cpu().numpy()].mean())


class RandomProjectionSpread(ValueTerm):
    """Draws a random direction from the context's generator at bind time."""

    name = "spread"

    def bind(self, ctx, quality=None, k=None):
        super().bind(ctx, quality, k)
        d = self.features_.shape[1]
        self.direction_ = torch.randn(d, generator=self.ctx_.generator, device=self.ctx_.device)
        return self

    def value(self, selected: torch.Tensor) -> float:
        return float((self.features_[selected] @ self.direction_).std())


@pytest.fixture
def small():
    return check_corpus(make_clustered(40, 6, 4, seed=3))


# --- registry --------------------------------------------------------------------------------
def test_builtins_are_registered_under_the_reference_names():
    assert term_names()[:3] == ["Facility", "Pair_simi", "DiSF"]
    assert ALGORITHMS is TERMS  # a view: registered user terms appear in ALGORITHMS
    assert ALGORITHMS["Facility"] is FacilityLocation
    assert "TestMeanQualitySquared" in ALGORITHMS
    assert isinstance(make_term("Pair_simi"), PairwiseSimilarity)
    assert make_term("DiSF", n_reference=2).n_reference == 2


def test_register_refuses_a_taken_name_and_non_terms():
    with pytest.raises(ValueError, match="'Facility' is already registered to datamask"):

        @register_term("Facility")
        class Other(FacilityLocation):
            pass

    with pytest.raises(TypeError, match="needs a subclass of datamask.objectives.Term"):
        register_term("NotATerm")(dict)
    assert "NotATerm" not in TERMS
    # the same class again (its module imported a second time) is fine
    assert register_term("TestMeanQualitySquared")(MeanQualitySquared) is MeanQualitySquared


def test_unknown_names_and_parameters_are_refused():
    with pytest.raises(ValueError, match=r"term must be one of \['Facility', 'Pair_simi'"):
        make_term("Facilty")
    with pytest.raises(TypeError, match=r"PairwiseSimilarity got unexpected parameter\(s\) "):
        make_term("Pair_simi", n_neighbors=8)
    with pytest.raises(TypeError, match=r"\['bogus'\]"):
        make_term("Facility", bogus=1)


def test_term_params_keeps_only_declared_settings():
    cli = {"n_neighbors": 8, "knn": "exact", "n_probe": None}
    assert term_params("Facility", cli) == cli
    assert term_params("Pair_simi", cli) == {}
    assert term_params("DiSF", cli) == {}
    facility = make_term("Facility", **term_params("Facility", cli))
    assert (facility.n_neighbors, facility.knn) == (8, "exact")


# --- constraint tables -----------------------------------------------------------------------
@pytest.mark.parametrize(
    "params, error, message",
    [
        ({"n_neighbors": 0}, ValueError, "n_neighbors must be > 0; got 0."),
        ({"n_neighbors": True}, TypeError, "n_neighbors must be > 0; got True."),
        (
            {"knn": "hnsw"},
            ValueError,
            "knn must be one of ['auto', 'exact', 'ivf', 'faiss']; got 'hnsw'.",
        ),
        ({"n_probe": 2.5}, TypeError, "n_probe must be >= 1; got 2.5."),
    ],
)
def test_constraint_errors_name_the_parameter_and_what_it_got(params, error, message):
    """One wording for every check at the door (flags, config files, terms, selectors)."""
    with pytest.raises(error) as err:
        make_term("Facility", **params)
    assert str(err.value) == message


def test_interval_bounds_and_types():
    half_open = Interval(float, 0, 1, closed="right")
    assert [half_open.is_satisfied_by(v) for v in (0, 0.5, 1, 1.5, np.nan)] == [
        False,
        True,
        True,
        False,
        False,
    ]
    assert str(half_open) == "in (0, 1]"
    ints = Interval(int, None, 3, closed="neither")
    assert [ints.is_satisfied_by(v) for v in (-7, 2, 3, 2.0, False)] == [
        True,
        True,
        False,
        False,
        False,
    ]
    assert str(ints) == "< 3"
    validate_params("X", {"m": [Options(str, frozenset({"a", "b"})), bool]}, {"m": True})
    with pytest.raises(
        ValueError, match=r"m must be one of \['a', 'b'\] or true or false; got 'c'"
    ):
        validate_params("X", {"m": [Options(str, frozenset({"a", "b"})), bool]}, {"m": "c"})


# --- capability flags ------------------------------------------------------------------------
def test_capability_flags_of_the_builtins():
    assert (Quality.submodular, Quality.modular) == (True, True)
    assert (FacilityLocation.submodular, FacilityLocation.has_graph) == (True, True)
    assert not PairwiseSimilarity.submodular and not DiSF.submodular
    assert all(c.has_expected for c in (Quality, FacilityLocation, PairwiseSimilarity, DiSF))
    assert not ValueTerm.has_expected and not MeanQualitySquared.has_expected
    assert is_submodular(Objective(FacilityLocation()))
    assert not is_submodular(Objective([FacilityLocation(), PairwiseSimilarity()]))
    assert is_submodular(Objective(DenseCoverage()))


def test_a_term_declared_submodular_gets_lazy_evaluation(small):
    """LazyGreedy with a user term declared submodular: lazy (fewer gain evaluations) and
    the same picks, in the same order, as the naive greedy and the undeclared copy."""
    kw = dict(select_ratio=0.2, device="cpu")
    DenseCoverage.calls = 0
    lazy = LazyGreedy(Objective(DenseCoverage(), lamb=0.3), graph=False, **kw).fit(small)
    lazy_calls = DenseCoverage.calls
    DenseCoverage.calls = 0
    eager = LazyGreedy(Objective(UndeclaredCoverage(), lamb=0.3), graph=False, **kw).fit(small)
    eager_calls = DenseCoverage.calls
    naive = NaiveGreedy(Objective(DenseCoverage(), lamb=0.3), **kw).fit(small)
    assert lazy.lazy_ and not eager.lazy_
    assert lazy_calls == lazy.n_evaluations_ < eager_calls == eager.n_evaluations_
    assert lazy.order_.tolist() == naive.order_.tolist() == eager.order_.tolist()
    # and the value-only coverage is the built-in facility location: dense greedy agrees
    dense = DenseGreedy(Objective(FacilityLocation(), lamb=0.3), **kw).fit(small)
    assert lazy.terms_["J"] == pytest.approx(dense.terms_["J"], rel=1e-5)


# --- value-only terms ------------------------------------------------------------------------
def _hand_greedy(objective: Objective, n: int, k: int) -> list[int]:
    picked: list[int] = []
    for _ in range(k):
        rest = [j for j in range(n) if j not in picked]
        values = [objective.value(np.array(picked + [j])) for j in rest]
        picked.append(rest[int(np.argmax(values))])
    return picked


def test_value_only_term_through_greedy_equals_a_greedy_by_hand(small):
    objective = Objective(make_term("TestMeanQualitySquared"), lamb=0.5)
    sel = NaiveGreedy(objective, select_ratio=0.15, device="cpu").fit(small)
    want = _hand_greedy(sel.objective_, small.n_docs, sel.k_)
    assert sel.order_.tolist() == want
    q = small.normalized_quality()
    assert sel.terms_["quality_sq"] == pytest.approx(float(np.mean(q[sel.selected_] ** 2)))
    stochastic = StochasticGreedy(objective, select_ratio=0.15, device="cpu").fit(small)
    assert len(stochastic.selected_) == sel.k_


def test_value_only_term_by_name_through_the_learner(small):
    settings = dict(
        algorithm="TestMeanQualitySquared",
        lamb=0.0,
        select_ratio=0.2,
        estimator="reinforce",
        n_epochs=30,
        n_rollout=8,
        device="cpu",
    )
    learner = MaskLearner(**settings).fit(small)
    q = small.normalized_quality()
    sel = learner.selected_
    assert len(sel) == 8 and len(np.unique(sel)) == 8
    assert learner.terms_["quality_sq"] == pytest.approx(float(np.mean(q[sel] ** 2)))
    # The swap search (differencing the value) never lowers it below the learner's top k.
    raw = MaskLearner(**settings, refine="none").fit(small)
    assert learner.terms_["J"] >= raw.terms_["J"] - 1e-12
    with pytest.raises(NotImplementedError, match="estimator='reinforce'"):
        MaskLearner(
            algorithm="TestMeanQualitySquared", select_ratio=0.2, n_epochs=2, device="cpu"
        ).fit(small)


def test_batch_values_of_a_value_only_term_loop_over_the_masks(small):
    term = MeanQualitySquared()
    Objective(term).bind(small, 5)
    batch = torch.tensor([1, 4, 9, 16, 25])
    masks = torch.tensor([[1.0, 0, 1, 0, 0], [0, 0, 0, 0, 0], [1, 1, 1, 1, 1]])
    q = small.normalized_quality()
    got = term.batch_values(batch, masks).tolist()
    want = [np.mean(q[[1, 9]] ** 2), 0.0, np.mean(q[batch.numpy()] ** 2)]
    np.testing.assert_allclose(got, want, rtol=1e-6)


# --- the context -----------------------------------------------------------------------------
def test_context_generators_come_from_the_seed():
    x = torch.nn.functional.normalize(torch.randn(30, 4), dim=1)
    a = TermContext.create(x, None, 5, seed=7)
    torch.manual_seed(99)
    np.random.seed(99)  # noqa: NPY002  (the global state must not matter)
    b = TermContext.create(x, None, 5, seed=7)
    assert torch.equal(
        torch.randperm(30, generator=a.generator), torch.randperm(30, generator=b.generator)
    )
    assert a.rng.integers(1 << 30) == b.rng.integers(1 << 30)
    c = TermContext.create(x, None, 5, seed=8)
    assert not torch.equal(
        torch.randperm(30, generator=TermContext.create(x, None, 5, seed=7).generator),
        torch.randperm(30, generator=c.generator),
    )


def test_terms_draw_from_their_context_not_the_global_rng(small):
    """A term that draws at bind time: the same seed gives the same value whatever
    torch's global seed; another seed another draw; every term gets its own generator, on
    its own stream of the seed (two equal terms draw different numbers)."""

    def bound(seed: int) -> RandomProjectionSpread:
        term = RandomProjectionSpread()
        Objective([term, RandomProjectionSpread()]).bind(small, 5, seed=seed)
        return term

    torch.manual_seed(1)
    first = bound(0)
    torch.manual_seed(12345)
    np.random.seed(4)  # noqa: NPY002  (the global state must not matter)
    second = bound(0)
    assert torch.equal(first.direction_, second.direction_)
    assert not torch.equal(first.direction_, bound(1).direction_)
    objective = Objective([RandomProjectionSpread(), RandomProjectionSpread()]).bind(small, 5)
    one, two = (t for _, t in objective.terms[1:])
    assert not torch.equal(one.direction_, two.direction_)  # streams 2 and 3 of seed 0
    assert torch.equal(one.direction_, first.direction_)  # the same place: the same stream
    sel = np.arange(0, 40, 5)
    assert objective.term_values(sel)["spread"] == pytest.approx(first.value(torch.tensor(sel)))


def test_required_columns_reach_the_term(small):
    score = np.linspace(0.0, 1.0, small.n_docs)
    term = ColumnMean(scale=2.0)
    objective = Objective(term, lamb=0.5)
    with pytest.raises(ValueError, match=r"requires the column 'score', which was not read"):
        objective.bind(small, 5)
    objective.bind(small, 5, columns={"score": score})
    sel = np.array([0, 10, 39])
    assert objective.term_values(sel)["column_mean"] == pytest.approx(2.0 * score[sel].mean())
    small.extra["score"] = score  # read from the corpus when not given
    objective.bind(small, 5)
    assert term.ctx_.columns["score"] is not None
    assert list(term.ctx_.columns) == ["score"]
    with pytest.raises(ValueError, match="column 'score' has 3 rows but there are 40"):
        objective.bind(small, 5, columns={"score": score[:3]})
    with pytest.raises(ValueError, match="scale must be > 0; got 0"):
        validate_params("ColumnMean", ColumnMean._parameter_constraints, {"scale": 0})


def test_two_user_terms_with_one_name_keep_their_own_values(small):
    objective = Objective(
        [MeanQualitySquared(), DenseCoverage(), MeanQualitySquared()],
        lamb=0.2,
        weights=[1.0, 2.0, 1.0],
    )
    objective.bind(small, 6)
    sel = np.array([2, 5, 11, 30])
    values = objective.term_values(sel)
    assert list(values) == ["quality", "quality_sq", "coverage", "quality_sq_2", "J"]
    q = small.normalized_quality()
    x = small.features.astype(np.float64)
    sq = float(np.mean(q[sel] ** 2))
    cover = float(np.mean(np.maximum((x @ x[sel].T).max(1), 0.0)))
    assert (
        values["quality_sq"] == pytest.approx(sq) and values["quality_sq_2"] == values["quality_sq"]
    )
    want = 0.2 * q[sel].mean() + 0.8 * (0.25 * sq + 0.5 * cover + 0.25 * sq)
    assert values["J"] == pytest.approx(want, rel=1e-6)


# --- one correlation kernel ------------------------------------------------------------------
def test_offdiag_correlation_matches_numpy_in_both_conventions():
    rng = np.random.default_rng(1)
    x = rng.standard_normal((25, 5))
    c = np.corrcoef(x, rowvar=False)
    brute = float((c**2).sum() - np.trace(c**2))
    cov = torch.as_tensor(np.cov(x, rowvar=False, bias=True))
    assert float(offdiag_correlation(cov)) == pytest.approx(brute, rel=1e-10)
    # "add": eps added to the (unbiased) variances, as the original cal_corre does
    eps = 0.5
    cu = np.cov(x, rowvar=False)
    s = np.sqrt(np.diag(cu) + eps)
    r = cu / s[:, None] / s[None, :]
    want = float((r**2).sum() - np.trace(r**2))
    got = offdiag_correlation(torch.as_tensor(cu), eps=eps, eps_mode="add")
    assert float(got) == pytest.approx(want, rel=1e-10)
    batched = offdiag_correlation(torch.stack([cov, cov]))
    assert batched.shape == (2,) and float(batched[1]) == pytest.approx(brute, rel=1e-10)
    with pytest.raises(ValueError, match=r"eps_mode must be one of \['clamp', 'add'\]"):
        offdiag_correlation(cov, eps_mode="bias")


# --- user terms in other processes -----------------------------------------------------------
TERM_MODULE = """
import torch
from datamask.objectives import ValueTerm, register_term


@register_term("ModuleSpread")
class ModuleSpread(ValueTerm):
    name = "module_spread"

    def value(self, selected):
        return float(self.features_[selected].double().std(0).sum())
"""


def _worker_value(path: str, modules: list[str]) -> float:
    sys.path.insert(0, path)
    import_term_modules(modules)
    corpus = check_corpus(make_clustered(30, 4, 3, seed=0))
    objective = Objective(make_term("ModuleSpread"), lamb=0.0).bind(corpus, 5)
    return objective.term_values(np.arange(10))["module_spread"]


@pytest.mark.slow  # spawns a process
def test_term_modules_register_user_terms_in_spawned_processes(tmp_path, monkeypatch):
    pkg = tmp_path / "dm_user_terms"
    pkg.mkdir()
    (pkg / "__init__.py").write_text("")
    (pkg / "terms.py").write_text(textwrap.dedent(TERM_MODULE))
    monkeypatch.syspath_prepend(str(tmp_path))
    with pytest.raises(TypeError, match="sequence of module names; got the str"):
        import_term_modules("dm_user_terms.terms")
    with pytest.raises(ImportError, match="cannot import term module 'dm_user_terms.nope'"):
        import_term_modules(["dm_user_terms.nope"])
    try:
        assert import_term_modules(["dm_user_terms.terms"]) == ["dm_user_terms.terms"]
        here = _worker_value(str(tmp_path), ["dm_user_terms.terms"])
        ctx = multiprocessing.get_context("spawn")
        with ctx.Pool(1) as pool:  # a fresh interpreter: only the module import registers it
            there = pool.apply(_worker_value, (str(tmp_path), ["dm_user_terms.terms"]))
        assert there == pytest.approx(here, rel=1e-12)
        x = make_clustered(30, 4, 3, seed=0).features.astype(np.float64)
        x = x / np.linalg.norm(x, axis=1, keepdims=True)
        assert here == pytest.approx(float(x[:10].std(0, ddof=1).sum()), rel=1e-5)
    finally:
        TERMS.pop("ModuleSpread", None)
        for mod in ("dm_user_terms.terms", "dm_user_terms"):
            sys.modules.pop(mod, None)


def test_term_subclass_needs_a_value():
    class Incomplete(Term):
        name = "incomplete"

    with pytest.raises(TypeError):
        Incomplete()


class QualitySquaredExpected(Term):
    """A learner-only term: ``value`` and ``expected`` only (greedy gains and batch values
    come from the defaults, by differencing ``value``)."""

    name = "quality_sq"

    def value(self, selected: torch.Tensor) -> float:
        return float((self.quality_[selected].double() ** 2).mean())

    def expected(self, p: torch.Tensor, clients: torch.Tensor | None = None) -> torch.Tensor:
        q2 = self.quality_.to(p.dtype) ** 2
        return (p * q2).sum() / p.sum().clamp_min(1e-12)


def test_a_learner_only_term_runs_the_exact_gradient_and_the_greedy(small):
    assert QualitySquaredExpected.has_expected
    q = small.normalized_quality()
    k = 8
    best = np.sort(np.argsort(-q, kind="stable")[:k])  # the exact optimum of mean(q^2)
    learner = MaskLearner(
        Objective(QualitySquaredExpected(), lamb=0.0),
        select_ratio=0.2,
        n_epochs=60,
        refine="none",
        device="cpu",
    ).fit(small)
    assert learner.selected_.tolist() == best.tolist()
    greedy = NaiveGreedy(
        Objective(QualitySquaredExpected(), lamb=0.0), select_ratio=0.2, device="cpu"
    ).fit(small)
    assert greedy.selected_.tolist() == best.tolist()
    assert greedy.terms_["quality_sq"] == pytest.approx(float(np.mean(q[best] ** 2)))


@pytest.mark.parametrize("cls", [MaskLearner, LazyGreedy])
def test_objective_with_algorithm_or_lamb_is_refused_not_ignored(small, cls):
    """Before, ``algorithm``/``lamb`` were silently ignored next to ``objective``."""
    objective = Objective(make_term("Pair_simi"), lamb=0.2)
    with pytest.raises(ValueError, match="either as objective= or as algorithm/lamb"):
        cls(objective, lamb=0.7, select_ratio=0.2, device="cpu").fit(small)
    with pytest.raises(ValueError, match="either as objective= or as algorithm/lamb"):
        cls(objective, algorithm="DiSF", select_ratio=0.2, device="cpu").fit(small)
    fitted = cls(algorithm="Pair_simi", lamb=0.2, select_ratio=0.2, device="cpu").fit(small)
    assert set(fitted.terms_) == {"quality", "pairwise", "J"}
    assert fitted.objective_.lamb == 0.2
