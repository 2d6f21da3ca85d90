"""Token budgets (issue 46): the budget's bounds for every method that keeps one, the
objective's per-token counting (a document cut in two halves changes nothing), the
cost-benefit greedy against brute force, and the errors at the door."""

from __future__ import annotations

import itertools

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest

import datamask
from datamask import MaskLearner, make_clustered
from datamask.budget import TokenBudget
from datamask.greedy import GreedyDiSF, LazyGreedy, StochasticGreedy
from datamask.objectives.combined import resolve_objective
from datamask.ranking import RandomSelector, TopKQuality

TOKEN_METHODS = (MaskLearner, LazyGreedy, StochasticGreedy, GreedyDiSF, TopKQuality, RandomSelector)


def _corpus(n: int = 400, seed: int = 0, dim: int = 16):
    corpus = make_clustered(n, dim, 6, seed=seed)
    rng = np.random.default_rng(seed)
    corpus.lengths = rng.lognormal(6.0, 1.0, n).round() + 1  # long-tailed, like web text
    return corpus


@pytest.mark.parametrize("cls", TOKEN_METHODS, ids=lambda c: c.method)
def test_the_kept_tokens_are_within_one_document_of_the_budget(cls):
    for seed in range(10):
        corpus = _corpus(seed=seed)
        ratio = 0.05 + 0.03 * seed
        own = {"n_epochs": 20} if cls is MaskLearner else {}
        sel = cls(select_token_ratio=ratio, seed=seed, device="cpu", **own).fit(corpus)
        total = ratio * corpus.lengths.sum()
        kept = corpus.lengths[sel.selected_].sum()
        assert kept <= total
        assert kept >= total - corpus.lengths.max()
        assert sel.tokens_ == pytest.approx(kept)
        assert sel.k_ == len(sel.selected_) == len(np.unique(sel.selected_))


def test_budget_tokens_is_t_itself_and_the_same_seed_keeps_the_same_documents():
    corpus = _corpus()
    a = MaskLearner(budget_tokens=20_000, seed=3, device="cpu").fit(corpus)
    b = MaskLearner(budget_tokens=20_000, seed=3, device="cpu").fit(corpus)
    assert np.array_equal(a.selected_, b.selected_)
    assert 20_000 - corpus.lengths.max() <= corpus.lengths[a.selected_].sum() <= 20_000


def _objective_value(corpus, rows, total, lamb=0.5):
    """J per token, computed here from its definition (docs/method.md "Token budgets")."""
    x = corpus.features / np.linalg.norm(corpus.features, axis=1, keepdims=True)
    q = corpus.normalized_quality()
    lengths = corpus.lengths
    cover = np.clip(x @ x[rows].T, 0, None).max(axis=1)
    quality = float((lengths[rows] * q[rows]).sum() / total)
    facility = float((lengths * cover).sum() / lengths.sum())
    return lamb * quality + (1 - lamb) * facility


def test_the_objective_counts_per_token():
    """The library's exact terms under a token budget equal the definition."""
    corpus = _corpus(200)
    budget = TokenBudget(corpus.lengths.astype(float), 0.1 * corpus.lengths.sum())
    objective = resolve_objective(None, "Facility", 0.5).bind(corpus, 20, budget=budget)
    rows = np.arange(0, 200, 9)
    assert objective.term_values(rows)["J"] == pytest.approx(
        _objective_value(corpus, rows, budget.total), rel=1e-5
    )


def _bound(corpus, algorithm: str, total: float):
    budget = TokenBudget(corpus.lengths.astype(float), total)
    return resolve_objective(None, algorithm, 0.5).bind(corpus, 10, budget=budget)


@pytest.mark.parametrize("algorithm", ["Facility", "Pair_simi", "DiSF"])
def test_cutting_a_document_in_two_halves_changes_no_value(algorithm):
    """A document split into two halves of its embedding and quality: keeping both halves
    scores as keeping the whole, keeping neither as keeping none of it (DiSF's scale, the
    loss of random subsets of the corpus, is a constant of each corpus: the one of the
    whole corpus is used for both, so the values compare the selections alone). Equal to
    float32's precision: the terms sum in float32."""
    corpus = _corpus(120)
    cut = 7
    halves = corpus.take(np.r_[np.arange(corpus.n_docs), cut])
    halves.ids = np.array([*map(str, corpus.ids), "half"], dtype=object)
    halves.lengths = halves.lengths.astype(float).copy()
    halves.lengths[[cut, -1]] = corpus.lengths[cut] / 2
    total = 0.2 * corpus.lengths.sum()
    whole_obj, halves_obj = _bound(corpus, algorithm, total), _bound(halves, algorithm, total)
    if algorithm == "DiSF":
        halves_obj.terms[1][1].scale_ = whole_obj.terms[1][1].scale_

    with_whole = [cut, 30, 60, 90]
    both = halves_obj.term_values(np.asarray([*with_whole, corpus.n_docs]))["J"]
    assert both == pytest.approx(whole_obj.term_values(np.asarray(with_whole))["J"], rel=1e-5)
    rest = np.asarray([30, 60, 90])
    assert halves_obj.term_values(rest)["J"] == pytest.approx(
        whole_obj.term_values(rest)["J"], rel=1e-5
    )


def test_the_greedy_is_at_least_half_of_the_best_subset_within_the_budget():
    """Cost-benefit greedy with the plain-gain guard against every subset of a tiny
    corpus, on the dense objective (an exact graph: K = n)."""
    for seed in range(4):
        corpus = _corpus(12, seed=seed, dim=4)
        total = 0.3 * corpus.lengths.sum()
        sel = LazyGreedy(budget_tokens=total, seed=seed, device="cpu").fit(corpus)
        best = max(
            _objective_value(corpus, np.array(rows), total)
            for r in range(1, 13)
            for rows in itertools.combinations(range(12), r)
            if corpus.lengths[list(rows)].sum() <= total
        )
        got = _objective_value(corpus, sel.selected_, total)
        assert got == pytest.approx(sel.terms_["J"], rel=1e-5)
        assert got >= (1 - 1 / np.e) / 2 * best
        assert got == pytest.approx(_naive_celf(corpus, total), rel=1e-6)


def _naive_celf(corpus, total):
    """The better of the naive cost-benefit greedy and the naive plain-gain greedy, each
    adding the best fitting row until none fits (no laziness, no heap)."""
    results = []
    for per_token in (True, False):
        rows: list[int] = []
        left = total
        while True:
            base = _objective_value(corpus, np.array(rows, dtype=int), total) if rows else 0.0
            best, pick = -np.inf, None
            for j in range(corpus.n_docs):
                if j in rows or corpus.lengths[j] > left:
                    continue
                gain = _objective_value(corpus, np.array([*rows, j]), total) - base
                key = gain / corpus.lengths[j] if per_token else gain
                if key > best + 1e-12:
                    best, pick = key, j
            if pick is None:
                break
            rows.append(pick)
            left -= corpus.lengths[pick]
        results.append(_objective_value(corpus, np.array(rows), total))
    return max(results)


def test_the_learner_reaches_the_greedy_per_token():
    corpus = _corpus(1500, dim=32)
    learner = MaskLearner(select_token_ratio=0.1, seed=0, device="cpu").fit(corpus)
    greedy = LazyGreedy(select_token_ratio=0.1, seed=0, device="cpu").fit(corpus)
    assert learner.terms_["J"] >= 0.995 * greedy.terms_["J"]


def test_a_document_budget_is_unchanged_by_the_new_parameters():
    corpus = _corpus()
    a = MaskLearner(select_ratio=0.1, seed=1, device="cpu").fit(corpus)
    corpus.lengths = None
    b = MaskLearner(select_ratio=0.1, seed=1, device="cpu").fit(corpus)
    assert np.array_equal(a.selected_, b.selected_)


@pytest.mark.parametrize(
    ("settings", "lengths", "message"),
    [
        ({"select_token_ratio": 0.1}, None, "--select-token-ratio needs each document's length"),
        ({"budget_tokens": 5.0}, "ok", "shorter than every document"),
        ({"budget_tokens": 1e12}, "ok", "holds all"),
        ({"select_token_ratio": 0.1, "k": 3}, "ok", "either as k or as a token budget"),
        ({"select_token_ratio": 0.1}, "zero", r"not numbers > 0 \(first at row 4: 0\.0\)"),
    ],
)
def test_token_budget_errors_name_the_flag(settings, lengths, message):
    corpus = _corpus(50)
    if lengths is None:
        corpus.lengths = None
    elif lengths == "zero":
        corpus.lengths = corpus.lengths.copy()
        corpus.lengths[4] = 0
    with pytest.raises(ValueError, match=message):
        MaskLearner(device="cpu", **settings).fit(corpus)


def test_a_selector_without_a_token_rule_is_refused_by_name():
    """Every built-in method keeps a token budget; a user's Selector that declares no
    rule (``takes_tokens`` False) is refused, naming the methods that keep one."""
    from datamask.base import Selector

    class FirstRows(Selector):
        method = "first-rows"

        def _select(self, corpus, objective):
            return np.arange(self.k_), -np.arange(corpus.n_docs, dtype=float)

    with pytest.raises(ValueError, match="'first-rows' does not keep a token budget.*disf-greedy"):
        FirstRows(select_token_ratio=0.1, device="cpu").fit(_corpus(50))


def test_the_dense_greedy_is_the_naive_algorithm_on_all_pairs():
    from datamask.greedy import DenseGreedy

    for seed in range(3):
        corpus = _corpus(14, seed=seed, dim=4)
        total = 0.3 * corpus.lengths.sum()
        sel = DenseGreedy(budget_tokens=total, seed=seed, device="cpu").fit(corpus)
        assert corpus.lengths[sel.selected_].sum() <= total
        got = _objective_value(corpus, sel.selected_, total)
        assert got == pytest.approx(_naive_celf(corpus, total), rel=1e-6)


def _table(corpus, lengths_as_text: bool = False) -> pa.Table:
    length = (
        pa.array(["x" * int(v) for v in corpus.lengths])
        if lengths_as_text
        else pa.array(corpus.lengths.astype(np.int64))
    )
    return pa.table(
        {
            "id": pa.array([str(i) for i in corpus.ids]),
            "quality_score": pa.array(corpus.quality[:, 0]),
            "embedding": pa.array(list(corpus.features.astype(np.float32))),
            "text" if lengths_as_text else "n_tokens": length,
        }
    )


def test_select_one_file_records_the_tokens(tmp_path):
    corpus = _corpus(300)
    pq.write_table(_table(corpus), tmp_path / "in.parquet")
    summary = datamask.select(
        str(tmp_path / "in.parquet"),
        tmp_path / "out.parquet",
        select_token_ratio=0.1,
        length_col="n_tokens",
        device="cpu",
        progress=False,
    )
    tokens = summary["tokens"]
    assert tokens["length_col"] == "n_tokens"
    assert tokens["budget"] == pytest.approx(0.1 * corpus.lengths.sum())
    assert tokens["budget"] - corpus.lengths.max() <= tokens["kept"] <= tokens["budget"]
    kept = pq.read_table(tmp_path / "out.parquet")
    assert kept.num_rows == corpus.n_docs  # every row, with its keep flag
    assert summary["k"] == int(pa.compute.sum(kept.column("selected")).as_py())


def test_select_table_counts_texts_in_characters():
    corpus = _corpus(200)
    out = datamask.select_table(
        _table(corpus, lengths_as_text=True), budget_tokens=8_000, device="cpu", progress=False
    )
    rows = np.flatnonzero(out.column("selected").to_numpy(zero_copy_only=False))
    assert 8_000 - corpus.lengths.max() <= corpus.lengths[rows].sum() <= 8_000


def test_shards_refuse_the_cap_with_a_modular_method_and_a_token_budget_by_name(tmp_path):
    corpus = _corpus(200)
    folder = tmp_path / "shards"
    folder.mkdir()
    pq.write_table(_table(corpus), folder / "a.parquet")
    with pytest.raises(ValueError, match="--max-similarity with a token budget.*method='topk'"):
        datamask.select(
            str(folder), tmp_path / "out", select_token_ratio=0.1, progress=False,
            max_similarity=0.9, method="topk", budget="group",
        )  # fmt: skip
    assert not (tmp_path / "out").exists() or not any((tmp_path / "out").iterdir())


@pytest.mark.parametrize("cls", TOKEN_METHODS, ids=lambda c: c.method)
def test_the_similarity_cap_holds_under_a_token_budget(cls):
    corpus = _corpus(300)
    sel = cls(select_token_ratio=0.1, max_similarity=0.9, device="cpu").fit(corpus)
    x = corpus.features / np.linalg.norm(corpus.features, axis=1, keepdims=True)
    sims = x[sel.selected_] @ x[sel.selected_].T
    np.fill_diagonal(sims, -1)
    assert sims.max() <= 0.9 + 1e-6
    assert corpus.lengths[sel.selected_].sum() <= 0.1 * corpus.lengths.sum()


def test_given_keeps_the_token_budget_and_counts_the_union_per_token(tmp_path):
    corpus = _corpus(400)
    old, new = np.arange(0, 300), np.arange(300, 400)
    pq.write_table(_table(corpus.take(old)), tmp_path / "old.parquet")
    pq.write_table(_table(corpus.take(new)), tmp_path / "new.parquet")
    first = datamask.select(
        str(tmp_path / "old.parquet"), tmp_path / "old_sel.parquet",
        select_token_ratio=0.1, device="cpu", progress=False,
    )  # fmt: skip
    summary = datamask.select(
        str(tmp_path / "new.parquet"), tmp_path / "new_sel.parquet",
        select_token_ratio=0.1, given=str(tmp_path / "old.parquet"),
        given_selection=str(tmp_path / "old_sel.parquet"), device="cpu", progress=False,
    )  # fmt: skip
    tokens = summary["tokens"]
    assert tokens["budget"] == pytest.approx(0.1 * corpus.lengths[new].sum())
    assert tokens["budget"] - corpus.lengths[new].max() <= tokens["kept"] <= tokens["budget"]
    # the union's J, per token, from its definition over both parts (quality scaled over both)
    ids_old = pq.read_table(tmp_path / "old_sel.parquet").to_pandas()
    ids_new = pq.read_table(tmp_path / "new_sel.parquet").to_pandas()
    kept = np.r_[old[ids_old["selected"].to_numpy()], new[ids_new["selected"].to_numpy()]]
    assert len(kept) == first["k"] + summary["k"]
    x = corpus.features / np.linalg.norm(corpus.features, axis=1, keepdims=True)
    q = corpus.quality[:, 0]
    q = (q - q.min()) / (q.max() - q.min())
    lengths = corpus.lengths
    cover = np.clip(x @ x[kept].T, 0, None).max(axis=1)
    quality = (lengths[kept] * q[kept]).sum() / lengths[kept].sum()
    facility = (lengths * cover).sum() / lengths.sum()
    union = summary["terms_union"]
    assert union["quality"] == pytest.approx(quality, rel=1e-5)
    assert union["facility"] == pytest.approx(facility, rel=1e-4)
