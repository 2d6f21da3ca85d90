"""covered_by / covered_sim against brute force: every row's nearest kept row by the exact
cosine, for the library rule (:func:`datamask.coverage.nearest_kept`), one file and
``select_table``. The sharded runs' dataset is tested in tests/distributed/test_cover.py."""

from __future__ import annotations

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest
import torch

import datamask
from datamask import make_clustered
from datamask.coverage import nearest_kept
from datamask.neighbors import best_match, knn_graph
from tests._data import write_reference_layout


def unit(x: np.ndarray) -> np.ndarray:
    x = np.asarray(x, dtype=np.float64)
    return x / np.linalg.norm(x, axis=1, keepdims=True)


def brute_cover(x: np.ndarray, kept: np.ndarray, base: np.ndarray | None = None):
    """(argmax row, max cosine, gap to the runner-up) over the kept rows, in float64; kept
    rows of ``x`` cover themselves. Ties go to the lowest kept row (argmax's first)."""
    x = unit(x)
    b = unit(x[kept] if base is None else base)
    sims = x @ b.T
    order = np.argsort(-sims, axis=1, kind="stable")
    best = order[:, 0]
    top = sims[np.arange(len(x)), best]
    gap = top - (sims[np.arange(len(x)), order[:, 1]] if b.shape[0] > 1 else -np.inf)
    index = best if base is not None else kept[best]
    if base is None:
        index[kept], top[kept], gap[kept] = kept, 1.0, np.inf
    return index, top, gap


def check_against_brute(index, sim, x, kept, base=None, *, tol=1e-5):
    want, top, gap = brute_cover(x, kept, base)
    np.testing.assert_allclose(sim, top, atol=tol)
    clear = gap > tol  # a near tie may go either way in float32
    assert clear.mean() > 0.95
    assert np.array_equal(np.asarray(index)[clear], want[clear])


@pytest.fixture
def points():
    rng = np.random.default_rng(0)
    x = unit(rng.normal(size=(600, 12))).astype(np.float32)
    kept = np.sort(rng.choice(600, 45, replace=False))
    return x, kept


@pytest.mark.parametrize("route", ["exact_search", "exact_graph"])
def test_nearest_kept_equals_brute_force(points, route):
    x, kept = points
    kwargs = {}
    if route == "exact_graph":
        kwargs = {"graph": knn_graph(torch.from_numpy(x), 24, method="exact"), "graph_exact": True}
    c = nearest_kept(x, kept, **kwargs)
    check_against_brute(c.index, c.sim, x, kept)
    assert c.exact.all() and not c.external.any()
    assert c.counts["kept"] == len(kept)
    if route == "exact_graph":  # most rows read from the graph, the rest searched
        assert c.counts["graph"] > 0 and c.counts["graph"] + c.counts["exact_search"] == 555
    else:
        assert c.counts["exact_search"] == 555


def test_approximate_routes_are_flagged_and_bounded_by_the_truth(points):
    x, kept = points
    _, top, _ = brute_cover(x, kept)
    for kwargs in (
        {"exact_pairs": 0},  # the ivf search
        {"graph": knn_graph(torch.from_numpy(x), 24, method="ivf"), "graph_exact": False},
    ):
        c = nearest_kept(x, kept, **kwargs)
        # exact: the kept rows and the rows compared with every kept row, no others
        assert c.exact.sum() == len(kept) + c.counts["exact_search"] < 600
        assert c.exact[kept].all()
        # every cosine is the cosine of the pair named, never above the true best
        named = (unit(x) * unit(x)[c.index]).sum(1)
        np.testing.assert_allclose(c.sim, named, atol=1e-5)
        assert (c.sim <= top + 1e-5).all()
        assert np.isin(c.index, kept).all()


def test_a_search_device_compares_every_pair_whatever_their_count(points):
    # The cover's and the exchange's route on a GPU: rows the graph leaves are compared with
    # every kept row on the device, exact even where the count would take the ivf search.
    x, kept = points
    graph = knn_graph(torch.from_numpy(x), 24, method="ivf")
    for kwargs in ({"exact_pairs": 0}, {"exact_pairs": 0, "graph": graph}):
        c = nearest_kept(x, kept, search_device="cpu", **kwargs)
        searched = c.counts["exact_search"]
        assert searched > 0 and c.counts["ivf_search"] == 0
        if "graph" not in kwargs:  # no approximate graph: every row exact, as brute force
            check_against_brute(c.index, c.sim, x, kept)
            assert c.exact.all() and searched == 555
    base = x[kept]
    c = nearest_kept(x, kept_features=base, exact_pairs=0, search_device="cpu")
    check_against_brute(c.index, c.sim, x, kept, base)
    assert c.exact.all() and c.counts["exact_search"] == 600


def test_ties_go_to_the_lowest_kept_row():
    x = unit(np.array([[1.0, 0.0], [1.0, 0.0], [0.0, 1.0], [1.0, 0.1]])).astype(np.float32)
    for kwargs in ({}, {"graph": knn_graph(torch.from_numpy(x), 4, method="exact")}):
        c = nearest_kept(x, np.array([1, 0]), **kwargs)  # rows 0 and 1 are one point
        assert c.index.tolist() == [0, 1, 0, 0]  # kept rows cover themselves
        assert c.sim[:2].tolist() == [1.0, 1.0]


def test_kept_held_apart_and_a_floor(points):
    x, kept = points
    base = x[kept]
    c = nearest_kept(x, kept_features=base)
    check_against_brute(c.index, c.sim, x, kept, base)
    # a floor: the kept set split in two, the second half given as each row's best cosine
    half = len(kept) // 2
    i2, s2, _ = brute_cover(x, kept, base[half:])
    c = nearest_kept(x, kept_features=base[:half], floor=s2, floor_index=i2 + half)
    check_against_brute(c.index, c.sim, x, kept, base)
    assert 0 < c.external.sum() < len(x) and c.counts["floor"] == c.external.sum()
    with pytest.raises(ValueError, match="exactly one of kept"):
        nearest_kept(x, kept, kept_features=base)
    with pytest.raises(ValueError, match=r"kept_features must have shape \(m, 12\)"):
        nearest_kept(x, kept_features=base[:, :3])


def test_nothing_kept_covers_nobody(points):
    x, _ = points
    c = nearest_kept(x, np.zeros(0, dtype=np.int64))
    assert (c.index == -1).all() and np.isnan(c.sim).all() and c.counts["none"] == 600


@pytest.mark.parametrize("method", ["mask", "greedy", "topk"])
def test_one_file_selection_records_every_rows_cover(tmp_path, method):
    corpus = make_clustered(500, 16, 8, seed=3)
    path = write_reference_layout(tmp_path / "docs.parquet", corpus)
    out = tmp_path / "sel.parquet"
    summary = datamask.select(path, out, select_ratio=0.1, method=method, progress=False)
    table = pq.read_table(out)
    assert table.column_names[-3:] == ["covered_by", "covered_sim", "covered_exact"]
    assert table.schema.field("covered_by").type == table.schema.field("chunk_id").type
    assert table.schema.field("covered_sim").type == pa.float32()
    ids = np.asarray(table["chunk_id"].to_pylist())
    kept = np.flatnonzero(table["selected"].to_numpy())
    x = np.asarray(corpus.features)  # the file's rows, in order
    row_of = {v: i for i, v in enumerate(ids)}
    index = np.asarray([row_of[v] for v in table["covered_by"].to_pylist()])
    check_against_brute(index, table["covered_sim"].to_numpy(), x, kept)
    assert table["covered_exact"].to_numpy().all()  # 500 rows: an exact graph or search
    assert summary["cover"]["rows"] == 500 and summary["cover"]["exact"] == 500
    assert summary["seconds"]["cover"] >= 0


def test_one_file_cover_read_from_the_pass_that_scored_j(tmp_path):
    """On an ivf graph the cover once read most rows from it (a kept neighbour it lists,
    not always the nearest: ``covered_exact`` False); the exact J has compared every row
    with every kept row already, and the cover is read from that pass: exact everywhere."""
    corpus = make_clustered(600, 16, 8, seed=5)
    path = write_reference_layout(tmp_path / "docs.parquet", corpus)
    out = tmp_path / "sel.parquet"
    summary = datamask.select(path, out, select_ratio=0.1, knn="ivf", n_neighbors=8, progress=False)
    assert summary["graph"]["method"] == "ivf"
    table = pq.read_table(out)
    kept = np.flatnonzero(table["selected"].to_numpy())
    row_of = {v: i for i, v in enumerate(table["chunk_id"].to_pylist())}
    index = np.asarray([row_of[v] for v in table["covered_by"].to_pylist()])
    check_against_brute(index, table["covered_sim"].to_numpy(), np.asarray(corpus.features), kept)
    assert table["covered_exact"].to_numpy().all()
    routes = summary["cover"]["routes"]
    assert routes["exact_search"] == 600 - len(kept) and routes["graph"] == 0


def test_nearest_given_is_the_exact_search(points):
    """``nearest`` (the J pass's every-pair maxima, as best_match finds them) gives what
    the exact search gives, copies of one kept vector to the first of them."""
    x, kept = points
    x = x.copy()
    x[kept[7]] = x[kept[3]]  # two kept rows hold one vector: every row ties on them
    base = torch.from_numpy(x[kept])
    sims, index, _ = best_match(torch.from_numpy(x), base, method="exact")
    a = nearest_kept(x, kept, nearest=(sims, index))
    b = nearest_kept(x, kept)  # 600 x 45 pairs: the exact search
    assert np.array_equal(a.index, b.index) and np.array_equal(a.sim, b.sim)
    assert a.exact.all() and a.counts == b.counts
    assert not np.isin(kept[7], a.index[np.setdiff1d(np.arange(600), kept)])
    with pytest.raises(ValueError, match="need kept"):
        nearest_kept(x, kept_features=x[kept], nearest=(sims, index))


def test_select_table_records_the_cover_by_id_and_by_row(demo_table):
    sel = datamask.select_table(demo_table, select_ratio=0.1, method="greedy")
    x = np.stack(demo_table["feature_arr"].to_numpy(zero_copy_only=False)).astype(np.float32)
    kept = np.flatnonzero(sel["selected"].to_numpy())
    row_of = {v: i for i, v in enumerate(sel["chunk_id"].to_pylist())}
    index = np.asarray([row_of[v] for v in sel["covered_by"].to_pylist()])
    check_against_brute(index, sel["covered_sim"].to_numpy(), x, kept)
    # without an id column the rows are the ids, and covered_by names rows
    numbered = datamask.select_table(
        demo_table.drop_columns(["chunk_id"]), select_ratio=0.1, method="greedy"
    )
    assert numbered["covered_by"].to_pylist() == index.tolist()


def test_the_cover_changes_no_selected_row(tmp_path):
    corpus = make_clustered(500, 16, 8, seed=4)
    path = write_reference_layout(tmp_path / "docs.parquet", corpus)
    a = datamask.select(path, tmp_path / "a.parquet", select_ratio=0.1, progress=False)
    b = datamask.select(
        path, tmp_path / "b.parquet", select_ratio=0.1, selected_only=True, progress=False
    )
    assert b["cover"] is None and a["cover"]["rows"] == 500
    assert a["selection_digest"] == b["selection_digest"]
    table = pq.read_table(tmp_path / "a.parquet")
    kept = table.filter(table["selected"])
    assert sorted(kept["chunk_id"].to_pylist()) == sorted(
        pq.read_table(tmp_path / "b.parquet")["chunk_id"].to_pylist()
    )
