"""Near-duplicates: the pair search and report against brute force, and the similarity cap
(no pair above T, exactly k) for every selector, the infeasible case and sharded runs."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pyarrow.parquet as pq
import pytest
from scipy.sparse.csgraph import connected_components

from datamask import Corpus
from datamask.cli import main
from datamask.config import SelectSpec
from datamask.distributed import LocalRunner, run_selection
from datamask.evaluation.redundancy import check_thresholds, redundancy
from datamask.io.parquet import read_corpus
from datamask.near_duplicates import (
    SimilarityCap,
    capped_top_k,
    check_max_similarity,
    max_pair_similarity,
    similar_pairs,
)
from datamask.selectors import SELECTORS, make_selector


def near_duplicate_corpus(n: int = 600, dim: int = 24, n_bases: int = 60, *, seed: int = 0):
    """Rows scattered around ``n_bases`` random directions: many pairs above 0.9."""
    rng = np.random.default_rng(seed)
    base = rng.standard_normal((n_bases, dim))
    labels = rng.integers(0, n_bases, n)
    noise = rng.uniform(0.05, 0.5, size=(n, 1))
    x = base[labels] / np.linalg.norm(base[labels], axis=1, keepdims=True)
    x = x + noise * rng.standard_normal((n, dim)) / np.sqrt(dim)
    x = (x / np.linalg.norm(x, axis=1, keepdims=True)).astype(np.float32)
    quality = rng.random(n) + 0.5 * (labels % 3 == 0)  # good documents pile into clusters
    ids = np.array([f"doc-{i:05d}" for i in range(n)], dtype=object)
    return Corpus(ids=ids, quality=quality, features=x, source="near-duplicates")


def brute_force(x: np.ndarray, t: float) -> dict[str, int]:
    sims = x @ x.T
    iu = np.triu_indices(len(x), 1)
    above = sims[iu] > t
    i, j = iu[0][above], iu[1][above]
    adj = np.zeros((len(x), len(x)), dtype=bool)
    adj[i, j] = adj[j, i] = True
    sizes = np.bincount(connected_components(adj, directed=False)[1])
    groups = sizes[sizes >= 2]
    docs = len(np.union1d(i, j))
    return {
        "pairs": int(above.sum()),
        "documents": docs,
        "groups": len(groups),
        "largest_group": int(groups.max()) if len(groups) else 0,
        "dedup_removes": docs - len(groups),
    }


# --- the pair search and the report ----------------------------------------------------------
@pytest.mark.parametrize("seed", range(5))
def test_report_matches_brute_force(seed):
    x = near_duplicate_corpus(300 + 37 * seed, seed=seed).features
    rows = np.random.default_rng(seed).choice(len(x), 120, replace=False)
    whole = redundancy(x, thresholds=(0.9, 0.95, 0.99))
    chosen = redundancy(x, rows, thresholds=(0.9, 0.95, 0.99))
    assert whole["method"] == "exact" and not whole["approximate"]
    for t in (0.9, 0.95, 0.99):
        assert whole["thresholds"][f"{t:g}"] == brute_force(x, t)
        assert chosen["thresholds"][f"{t:g}"] == brute_force(x[rows], t)
    assert brute_force(x, 0.9)["pairs"] > 100  # the toy has something to find


def test_pairs_cross_tiles_and_forest_compression(monkeypatch):
    """Tiles smaller than the input and a forest compressed on every block still count
    every pair once and find the same groups."""
    import datamask.evaluation.redundancy as R
    import datamask.near_duplicates as N

    x = near_duplicate_corpus(500, seed=7).features
    expected = brute_force(x, 0.9)
    monkeypatch.setattr(N, "TILE_ELEMENTS", 64 * 64)
    monkeypatch.setattr(R, "_COMPRESS_EDGES", 10)
    assert redundancy(x, thresholds=[0.9])["thresholds"]["0.9"] == expected
    pairs = [(a, b) for i, j, _ in similar_pairs(x, 0.9) for a, b in zip(i, j, strict=True)]
    assert len(pairs) == len(set(pairs)) == expected["pairs"]
    assert all(a < b for a, b in pairs)


def test_ivf_search_finds_a_subset_of_the_true_pairs():
    x = near_duplicate_corpus(2000, dim=32, n_bases=200, seed=1).features
    exact = {(a, b) for i, j, _ in similar_pairs(x, 0.9) for a, b in zip(i, j, strict=True)}
    found = [
        (a, b) for i, j, _ in similar_pairs(x, 0.9, method="ivf") for a, b in zip(i, j, strict=True)
    ]
    assert len(found) == len(set(found))  # each pair once
    assert set(found) <= exact  # never invents one
    assert len(found) >= 0.95 * len(exact)  # and misses few near-duplicates
    report = redundancy(x, thresholds=[0.9], method="ivf")
    assert report["approximate"] and report["thresholds"]["0.9"]["pairs"] == len(found)


def test_bad_thresholds_and_caps_are_refused():
    with pytest.raises(ValueError, match=r"dup_thresholds must lie in \(-1, 1\); got 1.5"):
        check_thresholds([0.9, 1.5])
    with pytest.raises(ValueError, match="at least one"):
        check_thresholds([])
    assert check_thresholds([0.99, 0.9, 0.9]) == (0.9, 0.99)
    with pytest.raises(ValueError, match=r"max_similarity must be in \(-1, 1\]; got 2"):
        check_max_similarity(2)
    with pytest.raises(TypeError, match="must be a number"):
        check_max_similarity("high")


# --- the cap ---------------------------------------------------------------------------------
def test_walk_keeps_the_better_ranked_row_and_takes_the_next():
    x = np.array([[1, 0, 0], [0.99, 0.14, 0], [0, 1, 0], [0, 0.995, 0.1], [0, 0, 1]], np.float32)
    x /= np.linalg.norm(x, axis=1, keepdims=True)
    scores = np.array([5.0, 4.0, 3.0, 2.0, 1.0])
    rows = capped_top_k(scores, np.arange(5), 3, x, 0.95)
    assert rows.tolist() == [0, 2, 4]  # 1 conflicts with 0 and 3 with 2: the next ones fill in
    cap = SimilarityCap(x, 0.95)
    assert cap.admit(1) and not cap.admit(0) and cap.n_refused == 1
    assert cap.walk([0, 2, 3, 4], 3).tolist() == [2, 4]


@pytest.mark.parametrize("seed", range(20))
def test_walk_equals_one_at_a_time(seed):
    x = near_duplicate_corpus(400, seed=seed).features
    order = np.random.default_rng(seed).permutation(400)
    one = SimilarityCap(x, 0.9)
    expected = [r for r in order if len(one) < 80 and one.admit(r)]
    assert SimilarityCap(x, 0.9).walk(order, 80, block=64).tolist() == expected


@pytest.mark.parametrize("method", sorted(SELECTORS))
@pytest.mark.parametrize("threshold", [0.95, 0.9])
def test_every_method_keeps_exactly_k_with_no_pair_above_the_cap(method, threshold):
    corpus = near_duplicate_corpus()
    params = {"n_epochs": 30} if method == "mask" else {}
    if method == "disf-greedy":
        params["batch_size"] = 200
    capped = make_selector(
        method, select_ratio=0.15, device="cpu", max_similarity=threshold, **params
    ).fit(corpus)
    k = round(0.15 * corpus.n_docs)
    assert len(capped.selected_) == len(np.unique(capped.selected_)) == k
    assert max_pair_similarity(corpus.features, capped.selected_) <= threshold
    assert capped.max_pair_similarity_ <= threshold
    if method == "disf-greedy":  # its own criterion ignores quality: nothing more to compare
        return
    free = make_selector(method, select_ratio=0.15, device="cpu", **params).fit(corpus)
    # the toy makes every method keep near-duplicates without the cap
    assert max_pair_similarity(corpus.features, free.selected_) > threshold
    if method in ("topk", "mask"):  # compatible rows of the uncapped choice stay chosen
        kept = capped_top_k(free.scores_, corpus.ids, k, corpus.features, threshold)
        assert capped.selected_.tolist() == kept.tolist()


def test_cap_in_greedy_equals_greedy_skipping_conflicts():
    """Lazy greedy under the cap = naive greedy over the candidates compatible so far."""
    corpus = near_duplicate_corpus(300, seed=4)
    capped = make_selector("greedy", select_ratio=0.1, device="cpu", max_similarity=0.9)
    capped.fit(corpus)
    obj = capped.objective_
    import torch

    state, kept, x = obj.init_state(), [], corpus.features
    alive = np.ones(300, dtype=bool)
    while len(kept) < 30:
        gains = obj.gains(state, torch.arange(300)).numpy().astype(np.float64)
        gains[~alive] = -np.inf
        j = int(np.argmax(gains))
        alive[j] = False
        if kept and (x[kept] @ x[j]).max() > 0.9:
            continue
        kept.append(j)
        state = obj.update(state, j)
    assert capped.order_.tolist() == kept


@pytest.mark.parametrize("method", sorted(SELECTORS))
def test_infeasible_cap_names_how_many_fit(method):
    corpus = near_duplicate_corpus(300, n_bases=10, seed=2)
    params = {"n_epochs": 5} if method == "mask" else {}
    sel = make_selector(method, select_ratio=0.3, device="cpu", max_similarity=0.5, **params)
    with pytest.raises(ValueError, match=r"max_similarity=0.5 admits only \d+ of the k=90"):
        sel.fit(corpus)


def test_infeasible_cap_in_greedy_without_bounds():
    """Facility + DiSF is not submodular: greedy re-evaluates every row each pick; the cap
    still ends with the one-line error."""
    from datamask.objectives import Objective, make_term

    objective = Objective([make_term("Facility"), make_term("DiSF")], lamb=0.5)
    corpus = near_duplicate_corpus(300, n_bases=10, seed=2)
    sel = make_selector(
        "greedy", objective=objective, select_ratio=0.3, device="cpu", max_similarity=0.5
    )
    with pytest.raises(ValueError, match=r"admits only \d+ of the k=90 .*greedy's candidates"):
        sel.fit(corpus)
    assert sel.lazy_ is False


def write_docs(path: Path, corpus: Corpus) -> Path:
    from tests._data import write_reference_layout

    return write_reference_layout(path, corpus)


def test_cli_cap_writes_a_capped_selection_and_infeasible_exits_2(tmp_path, capsys):
    corpus = near_duplicate_corpus(400, seed=5)
    docs = write_docs(tmp_path / "docs.parquet", corpus)
    out = tmp_path / "sel.parquet"
    common = ["select", "--input", docs, "--select-ratio", "0.1", "--no-progress"]
    common += ["--device", "cpu", "--n-epochs", "20"]
    assert main([str(a) for a in [*common, "--output", out, "--max-similarity", "0.9"]]) == 0
    table = pq.read_table(out)
    rows = np.flatnonzero(table.column("selected").to_numpy())
    assert len(rows) == 40 and max_pair_similarity(corpus.features, rows) <= 0.9
    summary = json.loads((tmp_path / "sel.summary.json").read_text())
    assert summary["settings"]["max_similarity"] == 0.9
    assert summary["resolved"]["max_pair_similarity_"] <= 0.9
    capsys.readouterr()
    bad = tmp_path / "bad.parquet"
    argv = [*common, "--select-ratio", "0.5", "--output", bad, "--max-similarity", "0.3"]
    assert main([str(a) for a in argv]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and err[0].startswith("datamask: error: max_similarity=0.3 admits only")
    assert "lower select_ratio to" in err[0]
    assert not bad.exists()


def test_evaluate_reports_redundancy_against_brute_force(tmp_path, capsys):
    corpus = near_duplicate_corpus(400, seed=6)
    docs = write_docs(tmp_path / "docs.parquet", corpus)
    ids = tmp_path / "ids.txt"
    rows = np.arange(0, 400, 3)
    ids.write_text("\n".join(corpus.ids[rows]))
    argv = ["evaluate", "--input", docs, "--selection", ids, "--device", "cpu"]
    assert main([str(a) for a in [*argv, "--dup-thresholds", "0.9", "0.97"]]) == 0
    printed = capsys.readouterr().out
    report = json.loads((tmp_path / "ids.eval.json").read_text())
    red = report["redundancy"]
    x = read_corpus(docs).features
    for t in ("0.9", "0.97"):
        assert red["selected"]["thresholds"][t] == brute_force(x[rows], float(t))
        assert red["all"]["thresholds"][t] == brute_force(x, float(t))
    pairs = red["selected"]["thresholds"]["0.9"]["pairs"]
    assert any(
        line.startswith("pairs cos > 0.9 ") and str(pairs) in line for line in printed.splitlines()
    )


def test_bench_tabulates_redundancy_per_method_and_for_the_input():
    from datamask.evaluation.bench import bench, format_markdown

    corpus = near_duplicate_corpus(300, seed=9)
    result = bench(
        corpus,
        methods=["topk", "random"],
        select_ratio=0.2,
        device="cpu",
        isolate=False,
        plots=False,
        dup_thresholds=[0.9],
        method_params={"random": {"max_similarity": 0.9}},
    )
    x = corpus.features
    assert result["redundancy_all"]["thresholds"]["0.9"] == brute_force(x, 0.9)
    topk, random = result["runs"]
    assert topk["redundancy"]["thresholds"]["0.9"] == brute_force(x[topk["selected"]], 0.9)
    assert random["redundancy"]["thresholds"]["0.9"]["pairs"] == 0  # capped through --param
    every = result["redundancy_all"]["thresholds"]["0.9"]
    line = f"| all documents | {every['pairs']} / {every['documents']} / {every['largest_group']} |"
    assert line in format_markdown(result).splitlines()


# --- sharded ---------------------------------------------------------------------------------
def test_sharded_cap_resolves_near_duplicates_across_shards(tmp_path):
    """Two shards holding near-copies of each other: each group alone keeps near-duplicates
    of the other's picks; the cross-group pass removes them and keeps the global count."""
    rng = np.random.default_rng(0)
    half = near_duplicate_corpus(300, dim=16, n_bases=40, seed=8)
    copy = half.features + 0.02 * rng.standard_normal(half.features.shape).astype(np.float32)
    both = Corpus(
        ids=np.concatenate([half.ids, np.array([f"copy-{i:05d}" for i in range(300)])]),
        quality=np.concatenate([half.quality, half.quality + 0.01]),
        features=np.concatenate([half.features, copy / np.linalg.norm(copy, axis=1)[:, None]]),
    )
    shards = tmp_path / "shards"
    shards.mkdir()
    for name, rows in (("part-00000", slice(0, 300)), ("part-00001", slice(300, 600))):
        part = Corpus(ids=both.ids[rows], quality=both.quality[rows], features=both.features[rows])
        write_docs(shards / f"{name}.parquet", part)
    fast = dict(n_epochs=20, select_ratio=0.1, n_neighbors=16, device="cpu")
    ids_of = {i: r for r, i in enumerate(both.ids)}

    def run(out: Path, cap: float | None, budget: str = "group") -> tuple[np.ndarray, dict]:
        m = run_selection(
            shards,
            out,
            SelectSpec.from_mapping(
                dict(
                    max_similarity=cap,
                    selected_only=True,
                    budget=budget,
                    partition="shard",  # the near-copies sit in different groups
                    **fast,
                )
            ),
            runner=LocalRunner(),
            progress=False,
        )
        ids = pq.read_table(out / "selected").column("chunk_id").to_pylist()
        return np.array([ids_of[i] for i in ids]), m

    free, _ = run(tmp_path / "free", None)
    assert max_pair_similarity(both.features, free) > 0.9  # the groups chose near-copies
    rows, m = run(tmp_path / "capped", 0.9)
    assert len(rows) == len(set(rows.tolist())) == 60 == m["totals"]["k"]
    assert max_pair_similarity(both.features, rows) <= 0.9
    facts = m["max_similarity"]
    assert facts["replaced"] > 0 and facts["max_pair_similarity"] <= 0.9
    assert list(facts["per_group"]) == ["1"]  # the first group's own capped choice stands
    first = pq.read_table(tmp_path / "capped" / "_work" / "groups" / "00000.parquet")
    own = np.flatnonzero(first.column("selected").to_numpy(zero_copy_only=False))
    assert set(own) <= set(rows.tolist()) and max_pair_similarity(both.features, own) <= 0.9
    # a rerun resumes every group and ends with the same capped selection
    again, m2 = run(tmp_path / "capped", 0.9)
    assert sorted(again.tolist()) == sorted(rows.tolist())
    assert m2["totals"]["groups_reused"] == 2
    # each group fits its own share under 0.75, but not together: the cross-group pass says so
    with pytest.raises(ValueError, match=r"max_similarity=0.75 admits only \d+ of the k=60"):
        run(tmp_path / "infeasible", 0.75)
    # the global budget applies the cap in its global round, to the whole selection at once
    rows, m = run(tmp_path / "global", 0.9, budget="global")
    assert len(rows) == len(set(rows.tolist())) == 60 == m["totals"]["k"]
    assert max_pair_similarity(both.features, rows) <= 0.9
    assert m["max_similarity"]["applied_in"] == "global round"
