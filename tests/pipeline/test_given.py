"""``select --given KEPT`` and ``evaluate --given``: every rule against brute force on small
data (the floor, coverage above it, J given KEPT, the union's J, the best subset), and the
errors, with nothing written."""

from __future__ import annotations

import itertools
import json
from pathlib import Path

import numpy as np
import pyarrow.parquet as pq
import pytest
import torch

import datamask
from datamask.cli import main
from datamask.config import SelectSpec
from datamask.data import Corpus
from datamask.evaluation.scores import evaluate_selection
from datamask.neighbors import best_match
from datamask.objectives import FacilityLocation, PairwiseSimilarity, TermContext
from datamask.objectives.combined import Objective
from datamask.pipeline.given import Given, given_floor, given_spec
from tests._data import reference_table, write, write_columns

LAMB = 0.5


def _unit(x: np.ndarray) -> np.ndarray:
    return (x / np.linalg.norm(x, axis=1, keepdims=True)).astype(np.float32)


def _pair(tmp_path: Path, n_kept: int = 6, n_new: int = 10, dim: int = 6, seed: int = 0):
    """KEPT and new documents on disk (ids 1000+ and 0+), and their unit rows and scores."""
    rng = np.random.default_rng(seed)
    xk, xn = _unit(rng.normal(size=(n_kept, dim))), _unit(rng.normal(size=(n_new, dim)))
    qk, qn = rng.random(n_kept) * 3, rng.random(n_new) * 3 + 1
    kept = write(reference_table(np.arange(1000, 1000 + n_kept), qk, xk), tmp_path / "kept.parquet")
    new = write(reference_table(np.arange(n_new), qn, xn), tmp_path / "new.parquet")
    return kept, new, (xk, qk), (xn, qn)


def _union_j(xk, qk, xn, qn, chosen, kept_rows=None) -> float:
    """J of KEPT ∪ chosen over every document of --given and the input, by brute force
    (``kept_rows``: the rows of --given kept; default all)."""
    x = np.concatenate([xk, xn]).astype(np.float64)
    q = np.concatenate([qk, qn])
    q = (q - q.min()) / (q.max() - q.min())
    kept = list(range(len(xk))) if kept_rows is None else list(kept_rows)
    sel = kept + [len(xk) + j for j in chosen]
    cover = np.clip((x @ x[sel].T).max(1), 0, None).mean()
    return LAMB * q[sel].mean() + (1 - LAMB) * cover


def test_floor_is_the_best_cosine_to_kept_and_its_row():
    rng = np.random.default_rng(1)
    new, kept = _unit(rng.normal(size=(300, 16))), _unit(rng.normal(size=(70, 16)))
    sims = new.astype(np.float64) @ kept.T.astype(np.float64)
    floor, index, how = given_floor(torch.from_numpy(new), torch.from_numpy(kept))
    assert how == "exact"
    np.testing.assert_allclose(floor.numpy(), np.clip(sims.max(1), 0, None), atol=1e-6)
    np.testing.assert_array_equal(index.numpy(), sims.argmax(1))
    # the ivf search never reports more than the truth, and names the row it measured
    s, i, how = best_match(torch.from_numpy(new), torch.from_numpy(kept), method="ivf")
    assert how == "ivf"
    found = i.numpy() >= 0
    assert found.mean() > 0.9
    assert (s.numpy() <= sims.max(1) + 1e-6).all()
    np.testing.assert_allclose(s.numpy()[found], sims[found, i.numpy()[found]], atol=1e-6)


def test_facility_counts_coverage_above_the_floor_in_every_part():
    """value, dense gains, graph gains and batch rewards against brute force."""
    rng = np.random.default_rng(2)
    x = _unit(rng.normal(size=(12, 5)))
    floor = np.clip(rng.normal(0.3, 0.3, size=12), 0, 1).astype(np.float32)
    t = FacilityLocation(n_neighbors=12).bind(
        TermContext.create(torch.from_numpy(x), None, 3, floor=torch.from_numpy(floor))
    )
    sims = np.clip(x.astype(np.float64) @ x.T, 0, None)

    def above(sel):
        if not sel:
            return np.zeros(12)
        return np.clip(sims[:, sel].max(1) - floor, 0, None)

    sel = [1, 4, 7]
    assert t.value(torch.tensor(sel)) == pytest.approx(above(sel).mean(), abs=1e-6)
    every = torch.arange(12)
    for graph in (False, True):
        state = t.init_state(graph=graph)
        for j in sel[:2]:
            state = t.update(state, j)
        want = [above([*sel[:2], c]).mean() - above(sel[:2]).mean() for c in range(12)]
        np.testing.assert_allclose(t.gains(state, every).numpy(), want, atol=1e-6)
    batch = torch.tensor([0, 2, 3, 5])
    mask = torch.tensor([[1.0, 0.0, 1.0, 0.0]])
    sub = sims[np.ix_([0, 2, 3, 5], [0, 3])].max(1) - floor[[0, 2, 3, 5]]
    assert float(t.batch_values(batch, mask)[0]) == pytest.approx(np.clip(sub, 0, None).mean())


def test_raising_the_floor_twice_keeps_the_larger():
    rng = np.random.default_rng(3)
    x = torch.from_numpy(_unit(rng.normal(size=(9, 4))))
    a = torch.rand(9, generator=torch.Generator().manual_seed(0)) * 0.5
    b = torch.rand(9, generator=torch.Generator().manual_seed(1)) * 0.5
    t = FacilityLocation(n_neighbors=9).bind(TermContext.create(x, None, 2, floor=a))
    t.raise_floor(b)
    once = FacilityLocation(n_neighbors=9).bind(TermContext.create(x, None, 2))
    once.raise_floor(torch.maximum(a, b))
    torch.testing.assert_close(t.knn_graph()[1], once.knn_graph()[1])


def test_j_given_at_the_union_rate_ranks_every_subset_as_the_union(tmp_path):
    """Over every S of size k: the objective the run optimises (floor, union quality
    scale, group_lamb) is an increasing affine function of the union's J."""
    _, _, (xk, qk), (xn, qn) = _pair(tmp_path)
    k = 3
    q = np.concatenate([qk, qn])
    corpus = Corpus(ids=np.arange(len(xn)), quality=qn, features=xn.copy())
    corpus.quality_range = (q.min(keepdims=True), q.max(keepdims=True))
    corpus.floor = np.clip((xn @ xk.T).max(1), 0, None)
    kept = Corpus(ids=np.arange(100, 100 + len(xk)), quality=qk, features=xk)
    spec = given_spec(SelectSpec(), k, len(xn), Given(kept, np.arange(len(xk)), [], "kept"))
    objective = spec.objective.make().bind(corpus, k)
    subsets = list(itertools.combinations(range(len(xn)), k))
    ours = np.array([objective.term_values(np.array(s))["J"] for s in subsets])
    union = np.array([_union_j(xk, qk, xn, qn, s) for s in subsets])
    slope, intercept = np.polyfit(union, ours, 1)
    assert slope > 0
    np.testing.assert_allclose(ours, slope * union + intercept, atol=1e-5)


@pytest.mark.parametrize("method", ["greedy-dense", "greedy", "mask"])
def test_select_given_finds_the_exhaustive_best_single_document(tmp_path, method):
    """k = 1: greedy is exact, so every coverage method must pick the exhaustive best."""
    kept, new, (xk, qk), (xn, qn) = _pair(tmp_path)
    out = tmp_path / f"{method}.parquet"
    summary = datamask.select(new, out, given=kept, k=1, method=method, progress=False)
    best = max(range(len(xn)), key=lambda j: _union_j(xk, qk, xn, qn, [j]))
    table = pq.read_table(out)
    chosen = table.filter(table["selected"])["chunk_id"].to_pylist()
    assert chosen == [best]
    assert summary["terms_union"]["J"] == pytest.approx(_union_j(xk, qk, xn, qn, [best]), abs=1e-5)


def test_summary_and_evaluate_report_j_given_and_the_union_j(tmp_path, capsys):
    kept, new, (xk, qk), (xn, qn) = _pair(tmp_path, n_kept=8, n_new=14)
    out = tmp_path / "sel.parquet"
    summary = datamask.select(new, out, given=kept, k=4, method="greedy-dense", progress=False)
    table = pq.read_table(out)
    chosen = table.filter(table["selected"])["chunk_id"].to_pylist()
    # the union, by brute force and by evaluate's exact scorer on KEPT ∪ new
    assert summary["terms_union"]["J"] == pytest.approx(_union_j(xk, qk, xn, qn, chosen), abs=1e-5)
    union = Corpus(
        ids=np.arange(22), quality=np.concatenate([qk, qn]), features=np.concatenate([xk, xn])
    )
    rows = np.array([*range(8), *(8 + j for j in chosen)])
    scored = evaluate_selection(union, rows, algorithm="Facility", lamb=LAMB)
    assert summary["terms_union"]["J"] == pytest.approx(scored["objective"]["J"], abs=1e-5)
    # J given KEPT, by brute force: the new documents' coverage above their floors
    q = np.concatenate([qk, qn])
    qs = (qn - q.min()) / (q.max() - q.min())
    floor = np.clip((xn @ xk.T).max(1), 0, None)
    above = np.clip(np.clip((xn @ xn[chosen].T).max(1), 0, None) - floor, 0, None).mean()
    want = LAMB * qs[chosen].mean() + (1 - LAMB) * above
    assert summary["terms"]["J"] == pytest.approx(want, abs=1e-6)
    assert summary["given"]["floor"]["method"] == "exact"
    assert "given" in summary["provenance"]
    # evaluate --given scores the same selection the same way
    report = tmp_path / "eval.json"
    argv = ["evaluate", "--input", str(new), "--selection", str(out), "--given", str(kept)]
    assert main([*argv, "--output", str(report)]) == 0
    given = json.loads(report.read_text())["given"]
    assert given["terms"]["J"] == pytest.approx(summary["terms"]["J"], abs=1e-9)
    assert given["terms_union"]["J"] == pytest.approx(summary["terms_union"]["J"], abs=1e-9)
    assert "KEPT + selection: J" in capsys.readouterr().out


def test_given_selection_keeps_only_its_rows_and_scores_the_whole_given_corpus(tmp_path):
    """--given DOCS --given-selection SEL: SEL's rows are kept, and the union J is over
    every row of DOCS (the dropped ones covered by KEPT ∪ S) and of the input."""
    kept, new, (xk, qk), (xn, qn) = _pair(tmp_path)
    sel = write_columns(tmp_path / "kept_sel.parquet", chunk_id=[1001, 1004])
    out = tmp_path / "sel.parquet"
    s = datamask.select(
        new, out, given=kept, given_selection=sel, k=2, method="greedy-dense", progress=False
    )
    assert (s["given"]["n_docs"], s["given"]["n_kept"]) == (6, 2)
    table = pq.read_table(out)
    chosen = table.filter(table["selected"])["chunk_id"].to_pylist()
    want = _union_j(xk, qk, xn, qn, chosen, kept_rows=[1, 4])
    assert s["terms_union"]["J"] == pytest.approx(want, abs=1e-5)
    floor = np.clip((xn @ xk[[1, 4]].T).max(1), 0, None)
    assert s["given"]["floor"]["mean"] == pytest.approx(floor.mean(), abs=1e-6)


def _bad(tmp_path: Path, name: str, **columns) -> Path:
    return write_columns(tmp_path / name, **columns)


def test_bad_given_is_refused_with_nothing_written(tmp_path):
    kept, new, (xk, qk), _ = _pair(tmp_path)
    out = tmp_path / "out" / "sel.parquet"
    wide = write(reference_table([7001, 7002], [1.0, 2.0], np.eye(2, 7)), tmp_path / "w.parquet")
    strings = write(reference_table(["a", "b"], [1.0, 2.0], xk[:2]), tmp_path / "s.parquet")
    overlap = write(reference_table([1000, 3], qk[:2], xk[:2]), tmp_path / "o.parquet")
    cases = [
        ({"given": wide}, r"embedding width 7 in --given .*w.parquet does not match 6"),
        ({"given": strings}, r"'chunk_id' holds strings in --given .* but integers"),
        ({"given": overlap}, r"chunk_id 3 occurs more than once \(row 1 of --given"),
        ({"given": kept, "algorithm": ["Pair_simi"]}, r"Use --algorithm Facility"),
        ({"given": kept, "k": 11}, r"k must be at most the 10 documents"),
        ({"given_selection": str(kept)}, r"given_selection needs given"),
    ]
    for settings, match in cases:
        with pytest.raises(ValueError, match=match):
            datamask.select(new, out, progress=False, **settings)
        assert not out.parent.exists() or not any(out.parent.iterdir())
    with pytest.raises(ValueError, match="give the budget one way: select_ratio, k,"):
        SelectSpec.from_mapping({"select_ratio": 0.2, "k": 3})
    # sharded input: tests/distributed/test_given_sharded.py


def test_given_changes_nothing_for_quality_only_methods(tmp_path):
    """topk ranks by quality alone: one scale over both sets keeps its ranking."""
    kept, new, _, _ = _pair(tmp_path)
    a = datamask.select(new, tmp_path / "a.parquet", given=kept, k=3, method="topk")
    b = datamask.select(new, tmp_path / "b.parquet", k=3, method="topk")
    ta, tb = pq.read_table(tmp_path / "a.parquet"), pq.read_table(tmp_path / "b.parquet")
    assert ta["selected"].to_pylist() == tb["selected"].to_pylist()
    assert "terms_union" in a and "terms_union" not in b


def test_objective_refuses_a_floor_for_terms_without_one():
    x = torch.from_numpy(_unit(np.random.default_rng(0).normal(size=(5, 3))))
    corpus = Corpus(ids=np.arange(5), quality=np.ones(5), features=x.numpy())
    corpus.floor = np.zeros(5, np.float32)
    with pytest.raises(ValueError, match="only facility location has a floor"):
        Objective([PairwiseSimilarity()]).bind(corpus, 2)


def test_select_table_takes_given_as_select_does(tmp_path):
    kept, new, _, _ = _pair(tmp_path)
    out = tmp_path / "sel.parquet"
    datamask.select(new, out, given=kept, k=3, method="greedy-dense", progress=False)
    table = datamask.select_table(pq.read_table(new), given=kept, k=3, method="greedy-dense")
    assert table["selected"].to_pylist() == pq.read_table(out)["selected"].to_pylist()


def test_cli_select_given_and_its_errors(tmp_path, capsys):
    """The flags are the options: --given and --k select; bad input exits 2 with one line
    and writes nothing."""
    kept, new, _, _ = _pair(tmp_path)
    out = tmp_path / "cli.parquet"
    argv = ["select", "--input", str(new), "--given", str(kept), "--no-progress"]
    assert main([*argv, "--output", str(out), "--k", "3", "--method", "greedy-dense"]) == 0
    summary = json.loads((tmp_path / "cli.summary.json").read_text())
    assert summary["k"] == 3 and summary["settings"]["given"] == str(kept)
    assert "terms_union" in summary
    capsys.readouterr()
    bad = tmp_path / "bad.parquet"
    assert main([*argv, "--output", str(bad), "--k", "3", "--select-ratio", "0.2"]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert err == [
        "datamask: error: give the budget one way: select_ratio, k, budget_tokens or "
        "select_token_ratio; got select_ratio=0.2, k=3."
    ]
    assert not bad.exists() and not (tmp_path / "bad.summary.json").exists()


@pytest.mark.parametrize("kept_sel", [None, [1001, 1004]])
def test_covered_by_names_the_nearest_of_kept_and_selected(tmp_path, kept_sel):
    """With --given, a new document's ``covered_by`` is its nearest document of KEPT ∪ S
    (brute force over every pair), a KEPT document where KEPT covers it better; select and
    select_table agree."""
    kept, new, (xk, _), (xn, _) = _pair(tmp_path, n_kept=8, n_new=30, seed=3)
    sel = None if kept_sel is None else write_columns(tmp_path / "ks.parquet", chunk_id=kept_sel)
    kept_rows = list(range(8)) if kept_sel is None else [i - 1000 for i in kept_sel]
    out = tmp_path / "sel.parquet"
    args = {"given": kept, "given_selection": sel, "k": 4, "method": "greedy-dense"}
    datamask.select(new, out, progress=False, **args)
    table = pq.read_table(out)
    chosen = table.filter(table["selected"])["chunk_id"].to_pylist()
    ids = [1000 + r for r in kept_rows] + chosen
    base = np.concatenate([xk[kept_rows], xn[chosen]]).astype(np.float64)
    sims = xn.astype(np.float64) @ base.T
    want = [ids[j] for j in sims.argmax(1)]
    assert table["covered_by"].to_pylist() == want
    np.testing.assert_allclose(table["covered_sim"].to_numpy(), sims.max(1), atol=1e-5)
    assert any(w >= 1000 for w in want)  # KEPT covers some new documents best
    assert all(table["covered_exact"].to_pylist())
    in_memory = datamask.select_table(pq.read_table(new), **args)
    assert in_memory["covered_by"].to_pylist() == want


def test_given_cover_read_from_the_pass_that_scores_j_given(tmp_path):
    """On an ivf graph the --given cover once read rows from it (``covered_exact`` false
    there); J given KEPT compares every new row with every row of S, and the cover reads
    that pass: exact for every row, KEPT still winning where it is nearer."""
    kept, new, (xk, _), (xn, _) = _pair(tmp_path, n_kept=40, n_new=600, dim=8, seed=5)
    out = tmp_path / "sel.parquet"
    args = {"given": kept, "select_ratio": 0.1, "knn": "ivf", "n_neighbors": 8}
    summary = datamask.select(new, out, progress=False, **args)
    assert summary["graph"]["method"] == "ivf"
    table = pq.read_table(out)
    chosen = table.filter(table["selected"])["chunk_id"].to_pylist()
    base = np.concatenate([xk, xn[chosen]]).astype(np.float64)
    sims = xn.astype(np.float64) @ base.T
    top2 = np.sort(sims, axis=1)[:, -2:]
    clear = top2[:, 1] - top2[:, 0] > 1e-5  # a near tie may go either way in float32
    ids = list(range(1000, 1040)) + chosen
    want = np.asarray([ids[j] for j in sims.argmax(1)])
    assert clear.mean() > 0.95
    assert (np.asarray(table["covered_by"].to_pylist())[clear] == want[clear]).all()
    np.testing.assert_allclose(table["covered_sim"].to_numpy(), sims.max(1), atol=1e-5)
    assert all(table["covered_exact"].to_pylist())
    routes = summary["cover"]["routes"]
    assert routes["graph"] == 0 and routes["exact_search"] == 600 - len(chosen)
    assert routes["floor"] > 0  # KEPT covers some new documents best
