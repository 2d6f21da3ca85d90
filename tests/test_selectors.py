"""The common battery: every registered method (datamask.selectors.SELECTORS) against one
contract of datamask.base.Selector, through ``fit`` and through the door ``select_table``.

Exactly k sorted unique rows, scores that rank them first, the same seed giving the same
rows (two instances, one instance fit twice, a pickled copy), clear errors on bad, empty or
ragged input, no state kept from an earlier fit, and kept ids a subset of the input's ids.
"""

from __future__ import annotations

import inspect
import pickle

import numpy as np
import pyarrow as pa
import pytest
import torch

from datamask import make_clustered, select_table
from datamask.base import Selector
from datamask.data import Corpus
from datamask.greedy import GreedyDiSF, LazyGreedy, StochasticGreedy
from datamask.neighbors import exact_graph
from datamask.objectives import FacilityLocation, Objective
from datamask.ranking import TopKQuality
from datamask.selectors import SELECTORS, Method, make_selector

METHODS = list(SELECTORS)


def _build(method: str, **kw):
    extra = {"n_epochs": 15} if method == "mask" else {}
    if method == "disf-greedy":
        extra["batch_size"] = 64
    return make_selector(method, device="cpu", **extra, **kw)


def _door(method: str, **settings) -> dict:
    """``select_table``'s settings for ``method`` (a short run for the learner)."""
    return {
        "method": method,
        "device": "cpu",
        **({"n_epochs": 15} if method == "mask" else {}),
        **settings,
    }


def _table(corpus: Corpus, order: np.ndarray) -> pa.Table:
    """``corpus``'s rows in ``order`` as a table with string ids, one quality column and a
    fixed-size embedding column: what ``select_table`` reads."""
    feats = np.asarray(corpus.features, dtype=np.float32)[order]
    return pa.table(
        {
            "chunk_id": pa.array([str(i) for i in np.asarray(corpus.ids)[order]]),
            "quality_score": pa.array(corpus.quality[order, 0]),
            "feature_arr": pa.FixedSizeListArray.from_arrays(
                pa.array(feats.reshape(-1)), feats.shape[1]
            ),
        }
    )


@pytest.mark.parametrize("method", METHODS)
def test_common_battery(method, small_corpus):
    n = small_corpus.n_docs
    a = _build(method, select_ratio=0.15, seed=3).fit(small_corpus)
    b = _build(method, select_ratio=0.15, seed=3).fit(small_corpus)
    k = round(0.15 * n)
    assert a.selected_.dtype == np.int64
    assert len(a.selected_) == k and len(np.unique(a.selected_)) == k
    assert np.all(np.diff(a.selected_) > 0) and a.selected_[-1] < n
    assert a.scores_.shape == (n,) and np.all(np.isfinite(a.scores_))
    assert np.isfinite(a.terms_["J"]) and a.fit_seconds_ > 0
    np.testing.assert_array_equal(a.selected_, b.selected_)
    # The k best scores are the selection.
    assert np.min(a.scores_[a.selected_]) >= np.max(np.delete(a.scores_, a.selected_))


@pytest.mark.parametrize("method", METHODS)
def test_common_battery_rejects_bad_input(method, small_corpus):
    with pytest.raises(ValueError, match=r"select_ratio must be in \(0, 1\); got 1.5"):
        _build(method, select_ratio=1.5).fit(small_corpus)
    with pytest.raises(ValueError, match="k=0: select_ratio"):
        _build(method, select_ratio=0.0001).fit(small_corpus)
    bad = make_clustered(50, 4, 2, seed=0)
    bad.quality[5, 0] = np.nan
    with pytest.raises(ValueError, match="NaN"):
        _build(method, select_ratio=0.2).fit(bad)


def test_registry_and_errors():
    assert set(SELECTORS) == {m.value for m in Method}
    assert isinstance(make_selector(Method.GREEDY), LazyGreedy)
    with pytest.raises(ValueError, match="method must be one of"):
        make_selector("approimate-lazy")
    with pytest.raises(ValueError, match="algorithm must be one of"):
        LazyGreedy(algorithm="facility", device="cpu").fit(make_clustered(20, 4, 2))
    with pytest.raises(ValueError, match="batch_size must be > 0"):
        LazyGreedy(batch_size=0, device="cpu").fit(make_clustered(20, 4, 2))
    with pytest.raises(ValueError, match="eps must be in"):
        StochasticGreedy(eps=1.0, device="cpu").fit(make_clustered(20, 4, 2))
    with pytest.raises(ValueError, match="implementation must be one of"):
        GreedyDiSF(implementation="fast", device="cpu").fit(make_clustered(20, 4, 2))
    with pytest.raises(ValueError, match="k=30 exceeds the 20 documents"):
        TopKQuality(k=30, device="cpu").fit(make_clustered(20, 4, 2))


def test_every_method_is_a_selector_with_every_parameter_declared_once():
    """One contract: every registered method subclasses :class:`datamask.base.Selector`, and
    each constructor parameter (but the objective's) is in exactly one constraint table,
    so check_params validates all of them."""
    for name, cls in SELECTORS.items():
        assert issubclass(cls, Selector) and cls.method == name
        shared, own = set(cls._shared_constraints), set(cls._parameter_constraints)
        assert not shared & own, name
        takes = set(inspect.signature(cls).parameters) - {"objective", "algorithm", "lamb"}
        assert takes - {"kwargs"} <= shared | own, name
        assert own <= takes | set(inspect.signature(Selector).parameters), name
    assert [n for n, c in SELECTORS.items() if c.modular] == ["topk", "random"]


# --- the scikit-learn contract: get_params, set_params, clone ---------------------------------
@pytest.mark.parametrize("method", METHODS)
def test_get_params_names_every_constructor_argument_and_clone_round_trips(method):
    """``get_params`` returns every constructor argument (the objective's included), so
    ``sklearn.base.clone`` builds an equal unfitted selector, and ``set_params`` sets what
    ``get_params`` then returns; the clone selects what the original selects."""
    from sklearn.base import clone

    cls = SELECTORS[method]
    own = set(inspect.signature(cls).parameters) - {"kwargs"}
    params = _build(method, select_ratio=0.1, seed=7, lamb=0.3).get_params(deep=True)
    assert own | set(inspect.signature(Selector).parameters) == set(params)
    assert params["lamb"] == 0.3 and params["algorithm"] is None and params["objective"] is None

    original = _build(method, select_ratio=0.1, seed=7, lamb=0.3)
    copy = clone(original)
    assert type(copy) is cls and copy is not original
    assert copy.get_params(deep=False) == original.get_params(deep=False)
    corpus = make_clustered(150, 8, 4, seed=2)
    np.testing.assert_array_equal(copy.fit(corpus).selected_, original.fit(corpus).selected_)
    assert not hasattr(clone(original), "selected_")  # a clone is unfitted

    changed = clone(original).set_params(seed=11, select_ratio=0.2, algorithm="Pair_simi")
    assert (changed.seed, changed.select_ratio, changed.algorithm) == (11, 0.2, "Pair_simi")
    assert clone(changed).get_params(deep=False) == changed.get_params(deep=False)
    with pytest.raises(ValueError, match=f"Invalid parameter 'ratio' for {cls.__name__}"):
        original.set_params(ratio=0.2)


@pytest.mark.parametrize("method", METHODS)
def test_clone_keeps_a_given_objective_and_fit_leaves_it_unbound(method):
    """A selector given an ``Objective`` clones with a copy of it, and ``fit`` binds its own
    copy: the caller's objective is left unbound, so one objective serves many selectors."""
    from sklearn.base import clone

    objective = Objective([FacilityLocation(n_neighbors=8)], lamb=0.25)
    selector = _build(method, objective=objective, select_ratio=0.1, seed=1)
    twin = clone(selector)
    assert isinstance(twin.objective, Objective) and twin.objective is not objective
    assert twin.objective.lamb == 0.25
    corpus = make_clustered(150, 8, 4, seed=2)
    selector.fit(corpus)
    assert selector.objective is objective and selector.objective_ is not objective
    assert not hasattr(objective, "features_")
    assert not any(hasattr(term, "features_") for _, term in objective.terms)
    np.testing.assert_array_equal(twin.fit(corpus).selected_, selector.selected_)


def test_fit_shares_a_given_graph_with_the_callers_objective_instead_of_copying_it():
    """The copy ``fit`` binds shares the tensors the caller's objective holds (a given
    neighbour graph can be gigabytes) and leaves them unchanged."""
    corpus = make_clustered(150, 8, 4, seed=2)
    idx, sim = exact_graph(torch.as_tensor(corpus.features), 8)
    before = sim.clone()
    objective = Objective([FacilityLocation(n_neighbors=8, graph=(idx, sim))], lamb=0.5)
    selector = LazyGreedy(objective, select_ratio=0.1, device="cpu").fit(corpus)
    fitted_term = selector.objective_.diversity[0]
    assert fitted_term is not objective.diversity[0]
    assert fitted_term.graph[0] is idx and fitted_term.graph[1] is sim
    assert torch.equal(sim, before) and not hasattr(objective.diversity[0], "graph_")


@pytest.mark.parametrize("method", METHODS)
def test_fit_stats_and_resolved_params_are_plain_values(method):
    corpus = make_clustered(120, 8, 4, seed=0)
    params = {"n_epochs": 5} if method == "mask" else {}
    sel = make_selector(method, select_ratio=0.1, device="cpu", max_similarity=0.99, **params)
    sel.fit(corpus)
    stats = sel.fit_stats()
    assert stats["k"] == 12 and stats["graph_seconds"] >= 0
    resolved = sel.resolved_params()
    assert resolved["max_pair_similarity_"] <= 0.99
    if method == "mask":
        assert resolved["n_epochs_"] == 5 and stats["n_epochs"] == 5


# --- pickling, refitting, stale state ----------------------------------------------------------
@pytest.mark.parametrize("method", METHODS)
def test_a_pickled_fitted_selector_keeps_and_repeats_its_selection(method):
    """A fitted selector survives pickle (what a process pool or a saved run does): the copy
    holds the same rows and scores, and refitting the copy selects them again."""
    corpus = make_clustered(200, 8, 4, seed=5)
    fitted = _build(method, select_ratio=0.1, seed=7).fit(corpus)
    copy = pickle.loads(pickle.dumps(fitted))
    assert type(copy) is type(fitted) and copy.get_params() == fitted.get_params()
    np.testing.assert_array_equal(copy.selected_, fitted.selected_)
    np.testing.assert_array_equal(copy.scores_, fitted.scores_)
    assert copy.terms_ == fitted.terms_
    np.testing.assert_array_equal(copy.fit(corpus).selected_, fitted.selected_)


@pytest.mark.parametrize("method", METHODS)
def test_fit_twice_with_the_same_seed_is_idempotent(method):
    """One instance fit twice on the same corpus: the same rows, scores and objective (no
    generator or graph carried over from the first fit)."""
    corpus = make_clustered(200, 8, 4, seed=6)
    sel = _build(method, select_ratio=0.1, seed=11)
    first = sel.fit(corpus)
    rows, scores, terms = first.selected_.copy(), first.scores_.copy(), dict(first.terms_)
    second = sel.fit(corpus)
    assert second is sel
    np.testing.assert_array_equal(second.selected_, rows)
    np.testing.assert_array_equal(second.scores_, scores)
    assert second.terms_ == terms


@pytest.mark.parametrize("method", METHODS)
def test_fit_without_evaluation_selects_the_same_rows_and_scores_nothing(method):
    """``fit(evaluate=False)`` (a sharded run's group step) skips the exact n x k scoring:
    the same rows and scores as a scored fit, and no terms or greedy history."""
    corpus = make_clustered(200, 8, 4, seed=6)
    scored = _build(method, select_ratio=0.1, seed=11).fit(corpus)
    bare = _build(method, select_ratio=0.1, seed=11).fit(corpus, evaluate=False)
    np.testing.assert_array_equal(bare.selected_, scored.selected_)
    np.testing.assert_array_equal(bare.scores_, scored.scores_)
    assert bare.terms_ == {} and scored.terms_["J"] > 0
    if scored._trace is not None:  # a greedy's history is offset by the final J
        assert bare.history_ == [] and scored.history_


@pytest.mark.parametrize("method", METHODS)
def test_refit_on_another_width_keeps_nothing_of_the_first_fit(method):
    """A selector fitted on 16-wide embeddings, then fit on 8-wide ones (another corpus
    size too), selects exactly what a fresh selector does there: no width, k or graph is
    kept from the first fit."""
    wide, narrow = make_clustered(240, 16, 6, seed=1), make_clustered(180, 8, 4, seed=2)
    refit = _build(method, select_ratio=0.1, seed=3).fit(wide).fit(narrow)
    fresh = _build(method, select_ratio=0.1, seed=3).fit(narrow)
    assert refit.k_ == fresh.k_ == 18 and refit.scores_.shape == (180,)
    np.testing.assert_array_equal(refit.selected_, fresh.selected_)
    np.testing.assert_array_equal(refit.scores_, fresh.scores_)


# --- empty and ragged input ---------------------------------------------------------------------
@pytest.mark.parametrize("method", METHODS)
def test_empty_input_is_refused_by_name(method):
    """Zero rows is a mistake upstream (an empty shard, a filter that kept nothing), not a
    selection of nothing: ``fit`` and ``select_table`` both refuse it and say so."""
    empty = Corpus(np.array([], dtype=object), np.zeros((0, 1)), np.zeros((0, 8), dtype=np.float32))
    with pytest.raises(ValueError, match=r"^<memory> has no rows\.$"):
        _build(method, select_ratio=0.1).fit(empty)
    table = _table(make_clustered(20, 8, 2, seed=0), np.arange(20)).slice(0, 0)
    with pytest.raises(ValueError, match=r"^data has no rows\.$"):
        select_table(table, **_door(method, select_ratio=0.1))


@pytest.mark.parametrize("method", METHODS)
def test_ragged_or_empty_embeddings_are_refused_by_name(method):
    ids = [f"d{i}" for i in range(10)]
    ragged = [[1.0, 0.0, 0.0, 0.0]] * 9 + [[1.0, 2.0]]
    table = pa.table(
        {
            "chunk_id": ids,
            "quality_score": np.arange(10.0),
            "feature_arr": pa.array(ragged, pa.list_(pa.float32())),
        }
    )
    settings = _door(method, select_ratio=0.5)
    with pytest.raises(ValueError, match="embedding width 2 at row 9 of data does not match"):
        select_table(table, **settings)
    no_width = table.set_column(2, "feature_arr", pa.array([[]] * 10, pa.list_(pa.float32())))
    with pytest.raises(ValueError, match="features in data have width 0"):
        select_table(no_width, **settings)


# --- the door: kept ids and the budget ----------------------------------------------------------
@pytest.mark.parametrize("method", METHODS)
@pytest.mark.parametrize("ratio", [0.05, 0.3])
def test_select_table_keeps_input_ids_and_exactly_the_budget(method, ratio):
    """Through the door with ids given (strings, rows shuffled): the kept ids are input ids,
    each kept once, ``row`` points at the id's own input row, and the count is
    round(select_ratio * n)."""
    corpus = make_clustered(300, 8, 4, seed=4)
    order = np.random.default_rng(0).permutation(300)
    table = _table(corpus, order)
    out = select_table(table, **_door(method, select_ratio=ratio, seed=2))
    assert out.num_rows == 300
    assert out.column("chunk_id").to_pylist() == table.column("chunk_id").to_pylist()
    kept = out.filter(out["selected"])
    kept_ids = kept.column("chunk_id").to_pylist()
    assert len(kept_ids) == round(ratio * 300) == len(set(kept_ids))
    assert set(kept_ids) <= set(table.column("chunk_id").to_pylist())
    input_ids = table.column("chunk_id").to_pylist()
    assert [input_ids[r] for r in kept.column("row").to_pylist()] == kept_ids
    ranks = sorted(kept.column("rank").to_pylist())
    assert ranks == list(range(1, len(kept_ids) + 1))  # the kept rows rank first


@pytest.mark.parametrize("method", METHODS)
def test_an_explicit_k_is_the_count_and_wins_over_the_ratio(method):
    corpus = make_clustered(200, 8, 4, seed=8)
    sel = _build(method, k=37, select_ratio=0.5, seed=1).fit(corpus)
    assert sel.k_ == 37 and len(sel.selected_) == 37 == len(np.unique(sel.selected_))
    assert sel.fit_stats()["k"] == 37


# --- random: one file and sharded draw the same documents -------------------------------------
@pytest.mark.parametrize("partition", ["shard", "cluster"])
def test_random_keeps_the_same_documents_on_one_file_and_sharded(tmp_path, partition):
    """``--method random`` draws per id and seed: the one-file run, the sharded run (any
    partition, global budget) and ``RandomSelector.fit`` on the rows in another order keep
    the same documents; another seed keeps others."""
    import pyarrow.parquet as pq

    import datamask
    from datamask.ranking import RandomSelector
    from tests._data import write_corpus_shards, write_reference_layout

    corpus = make_clustered(600, 8, 4, seed=0)
    write_corpus_shards(tmp_path / "shards", corpus, 3)
    write_reference_layout(tmp_path / "one.parquet", corpus)
    common = dict(method="random", select_ratio=0.1, seed=5, device="cpu", progress=False)
    datamask.select(tmp_path / "one.parquet", tmp_path / "one-sel.parquet", **common)
    datamask.select(
        tmp_path / "shards", tmp_path / "sharded", partition=partition, workers=1, **common
    )
    one = pq.read_table(tmp_path / "one-sel.parquet")
    one_ids = sorted(one.filter(one["selected"])["chunk_id"].to_pylist())
    sharded_ids = sorted(pq.read_table(tmp_path / "sharded" / "selected")["chunk_id"].to_pylist())
    assert len(one_ids) == 60 and one_ids == sharded_ids

    order = np.random.default_rng(1).permutation(corpus.n_docs)
    shuffled = Corpus(
        ids=corpus.ids[order], quality=corpus.quality[order], features=corpus.features[order]
    )
    fitted = RandomSelector(select_ratio=0.1, seed=5, device="cpu").fit(shuffled)
    assert sorted(shuffled.ids[fitted.selected_].tolist()) == one_ids
    other = RandomSelector(select_ratio=0.1, seed=6, device="cpu").fit(corpus)
    assert sorted(corpus.ids[other.selected_].tolist()) != one_ids


def _fields(corpus: Corpus) -> dict:
    """Every field of ``corpus``: the array objects and a copy of their values."""
    from dataclasses import fields

    out = {}
    for f in fields(corpus):
        value = getattr(corpus, f.name)
        copy = {k: np.array(v) for k, v in value.items()} if isinstance(value, dict) else value
        out[f.name] = (value, np.array(copy) if isinstance(copy, np.ndarray) else copy)
    return out


def _assert_unchanged(corpus: Corpus, before: dict) -> None:
    for name, (obj, values) in before.items():
        now = getattr(corpus, name)
        assert now is obj, f"{name} was rebound"
        if isinstance(values, np.ndarray):
            assert now.dtype == values.dtype and np.array_equal(now, values), name


def test_check_corpus_returns_a_checked_copy_and_leaves_its_argument_unchanged():
    from datamask._validation import check_corpus

    corpus = make_clustered(50, 6, 3, seed=2)
    corpus.features = corpus.features * 3.0  # not unit rows: the check must scale a copy
    corpus.quality_weights = np.array([2.0])
    before = _fields(corpus)
    checked = check_corpus(corpus)
    _assert_unchanged(corpus, before)
    assert checked is not corpus
    np.testing.assert_allclose(np.linalg.norm(checked.features, axis=1), 1.0, rtol=1e-5)
    np.testing.assert_allclose(checked.quality_weights, [1.0])
    assert checked.ids is corpus.ids and checked.source == corpus.source


@pytest.mark.parametrize("method", METHODS)
def test_fit_leaves_the_callers_corpus_unchanged(method):
    corpus = make_clustered(80, 6, 3, seed=5)
    corpus.features = corpus.features * 2.0
    before = _fields(corpus)
    a = _build(method, select_ratio=0.1, seed=0).fit(corpus)
    _assert_unchanged(corpus, before)
    b = _build(method, select_ratio=0.1, seed=0).fit(corpus)  # the same rows from the same input
    np.testing.assert_array_equal(a.selected_, b.selected_)


@pytest.mark.parametrize("method", METHODS)
def test_check_params_sets_nothing_on_the_selector(method):
    sel = _build(method, select_ratio=0.1, seed=0)
    before = dict(vars(sel))
    sel.check_params()
    after = vars(sel)
    assert after.keys() == before.keys()
    assert all(after[name] is before[name] for name in before)
