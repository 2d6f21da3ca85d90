"""``covered_by`` / ``covered_sim`` / ``covered_exact`` right for every row, on every search
path, against brute force over data built to break them: many kept copies of one vector
(ties: the first copy in input order must be named, on every path), and rows whose every
kept document lies at a negative cosine (the raw cosine must be written, never the
coverage floor clipped at 0). One file (exact search, exact and ivf graphs, ivf search),
``--given``, and sharded runs (``workers=1``: inline), with and without ``--given``."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest
import torch

import datamask
from datamask import coverage
from datamask.coverage import nearest_kept
from datamask.neighbors import best_match, first_identical, identical_leads, knn_graph
from tests._data import reference_table, write

DIM = 8
COPIES = 14  # more than the graph's K below: a graph cannot list every copy


def _unit(x: np.ndarray) -> np.ndarray:
    return (x / np.linalg.norm(x, axis=1, keepdims=True)).astype(np.float32)


def _tricky(seed: int = 0, n: int = 160) -> tuple[np.ndarray, np.ndarray]:
    """Unit rows near +e0 (most), COPIES identical copies of one of them scattered over
    the file, and 12 rows near -e0 (at a negative cosine to every row near +e0); and a
    quality that keeps the +e0 rows and about half of the copies (topk keeps the best)."""
    rng = np.random.default_rng(seed)
    x = rng.normal(scale=0.6, size=(n, DIM))
    x[:, 0] = 2.0
    x[-12:, 0] = -2.0
    copy_rows = np.sort(rng.choice(n - 12, COPIES, replace=False))
    x = _unit(x)
    x[copy_rows] = x[copy_rows[0]]
    q = rng.random(n)
    q[copy_rows] = np.linspace(0.2, 0.95, COPIES)[rng.permutation(COPIES)]
    q[-12:] = 0.0  # never kept: covered at a negative cosine
    return x, q


def _expected(x: np.ndarray, base_rows: list[np.ndarray], *, tol: float = 1e-5):
    """Brute force in float64 of each row's nearest of ``base_rows`` (unit rows, in the
    order ties go: the first wins): ``(index into the concatenation, cosine, clear)``;
    ``clear`` is False where two *different* vectors are within ``tol`` (float32 may go
    either way); copies of one vector tie exactly and must go to the first."""
    base = np.concatenate(base_rows).astype(np.float64)
    sims = x.astype(np.float64) @ base.T
    best = sims.max(1)
    index = sims.argmax(1)  # the first of equal values
    near = sims >= best[:, None] - tol
    clear = np.ones(len(x), dtype=bool)
    for i in np.flatnonzero(near.sum(1) > 1):
        cands = base[near[i]]
        clear[i] = bool((cands == cands[0]).all())
    return index, best, clear


def _check(index, sim, exact, want, best, clear, *, tol: float = 1e-5):
    index, exact = np.asarray(index), np.asarray(exact)
    np.testing.assert_allclose(np.asarray(sim)[exact], best[exact], atol=tol)
    assert np.array_equal(index[exact & clear], want[exact & clear])
    assert clear.mean() > 0.9
    assert (np.asarray(sim) <= best + tol).all()  # never above the truth, on any path


ROUTES = {
    "exact_search": {},
    "exact_graph": {"graph": "exact", "graph_exact": True},
    "ivf_graph": {"graph": "ivf", "graph_exact": False},
    "ivf_search": {"exact_pairs": 0},
}


@pytest.mark.parametrize("route", list(ROUTES))
def test_nearest_kept_names_the_first_copy_and_the_raw_cosine(route):
    x, q = _tricky()
    kept = np.flatnonzero(q > 0.5)
    kwargs = dict(ROUTES[route])
    if "graph" in kwargs:
        kwargs["graph"] = knn_graph(torch.from_numpy(x), 6, method=kwargs["graph"])
    c = nearest_kept(x, kept, **kwargs)
    j, best, clear = _expected(x, [x[kept]])
    want = kept[j]
    want[kept], best[kept] = kept, 1.0
    _check(c.index, c.sim, c.exact, want, best, clear)
    # every dropped copy names the first kept copy, whatever the route (ties rule)
    inv = np.unique(x, axis=0, return_inverse=True)[1].ravel()
    group = np.flatnonzero(inv == np.bincount(inv).argmax())
    assert len(group) == COPIES
    first_kept = group[np.isin(group, kept)][0]
    dropped = group[~np.isin(group, kept)]
    assert len(dropped) and (c.index[dropped] == first_kept).all()
    # rows near -e0: every kept row is at a negative cosine; the cosine says so
    neg = np.arange(len(x) - 12, len(x))
    assert (c.sim[neg] < -0.1).all()
    sure = neg[c.exact[neg]]  # the ivf search may miss the nearest: flagged, not exact
    assert (c.index[sure] == want[sure]).all() and (route == "ivf_search" or len(sure) == 12)


def test_first_identical_and_best_match_ties():
    x, _ = _tricky()
    inv = np.unique(x, axis=0, return_inverse=True)[1].ravel()
    group = np.flatnonzero(inv == np.bincount(inv).argmax())
    got = first_identical(torch.from_numpy(x), torch.from_numpy(group[::-1].copy()))
    assert (got.numpy() == group[0]).all()
    for method in ("exact", "ivf"):
        _, index, _ = best_match(torch.from_numpy(x[group]), torch.from_numpy(x), method=method)
        assert (index.numpy() == group[0]).all(), method


def test_identical_leads_against_brute_force_and_hashed_once_per_cover(monkeypatch):
    rng = np.random.default_rng(3)
    x = rng.standard_normal((3000, 16)).astype(np.float32)
    x[rng.integers(0, 3000, 400)] = x[rng.integers(0, 3000, 400)]  # copies, some chained
    x[7] = -0.0 * x[7]  # -0.0 and 0.0 are different bytes: not copies of each other
    leads = identical_leads(torch.from_numpy(x))
    want = [next(j for j in range(i + 1) if x[j].tobytes() == x[i].tobytes()) for i in range(3000)]
    assert leads.tolist() == want
    # the graph lookup goes over row blocks: the kept matrix is hashed once, not per block
    # (per block it cost 56 s of a 1M-row select on an H100)
    x /= np.linalg.norm(x, axis=1, keepdims=True) + 1e-12
    graph = knn_graph(torch.from_numpy(x), 8, method="exact")
    kept = np.arange(0, 3000, 3)
    whole = nearest_kept(x, kept, graph=graph, graph_exact=True)
    calls = []
    real = coverage.identical_leads
    monkeypatch.setattr(coverage, "identical_leads", lambda b: calls.append(1) or real(b))
    monkeypatch.setattr(coverage, "block_rows", lambda *a, **k: 256)  # 12 blocks of rows
    got = nearest_kept(x, kept, graph=graph, graph_exact=True)
    assert len(calls) == 1
    assert (got.index == whole.index).all() and (got.sim == whole.sim).all()


def _write_file(path: Path, ids, q, x) -> Path:
    return write(reference_table(np.asarray(ids), q, x), path)


def _table_cover(table: pa.Table, id_of_row: dict) -> tuple[np.ndarray, ...]:
    by = table["covered_by"].to_pylist()
    return (
        np.asarray([id_of_row[v] for v in by]),
        table["covered_sim"].to_numpy(),
        table["covered_exact"].to_numpy(),
    )


@pytest.mark.parametrize("method", ["topk", "greedy"])
@pytest.mark.parametrize("given", [False, True], ids=["alone", "given"])
def test_one_file_cover_against_brute_force(tmp_path, method, given):
    x, q = _tricky(seed=1)
    n = len(x)
    path = _write_file(tmp_path / "in.parquet", np.arange(n), q, x)
    settings = {"k": 60, "method": method, "n_neighbors": 6, "lamb": 0.9, "progress": False}
    xk = np.zeros((0, DIM), np.float32)
    if given:  # KEPT at about +e0: nearer the rows near -e0 than any kept row, and negative
        rng = np.random.default_rng(7)
        xk = rng.normal(scale=0.05, size=(9, DIM))
        xk[:, 0] = 2.0
        xk = _unit(xk)
        settings["given"] = _write_file(tmp_path / "kept.parquet", 1000 + np.arange(9), q[:9], xk)
    out = tmp_path / "sel.parquet"
    datamask.select(path, out, **settings)
    table = pq.read_table(out)
    assert table["chunk_id"].to_pylist() == list(range(n))  # one row per input row, in order
    kept = np.flatnonzero(table["selected"].to_numpy())
    # ties: the input's kept rows first (lowest row first), then KEPT's
    j, best, clear = _expected(x, [x[kept], xk])
    ids = np.concatenate([kept, 1000 + np.arange(len(xk))])
    want = ids[j]
    want[kept], best[kept] = kept, 1.0
    got, sim, exact = _table_cover(table, {v: v for v in range(n)} | {v: v for v in ids})
    assert exact.all()  # small: exact graphs and searches
    _check(got, sim, exact, want, best, clear)
    neg = np.arange(n - 12, n)  # rows near -e0: everything kept, KEPT too, is negative
    assert (x[neg] @ np.concatenate([x[kept], xk]).T < 0).all()
    assert (sim[neg] < 0).all() and (got[neg] < 1000).all()  # a new document is nearest


@pytest.mark.parametrize("given", [False, True], ids=["alone", "given"])
def test_sharded_cover_against_brute_force(tmp_path, given):
    """3 shard groups (every group searched: exact), copies spread over the groups: a
    dropped copy names a kept copy of its own group first, then of the lowest group."""
    x, q = _tricky(seed=2, n=180)
    n = len(x)
    sizes = [60, 60, 60]
    group = np.repeat(np.arange(3), sizes)
    root = tmp_path / "shards"
    for g in range(3):
        rows = np.flatnonzero(group == g)
        _write_file(root / f"part-{g:05d}.parquet", rows, q[rows], x[rows])
    settings = {
        "k": 60,
        "method": "topk",
        "partition": "shard",
        "budget": "group",
        "workers": 1,
        "progress": False,
    }
    xk = np.zeros((0, DIM), np.float32)
    if given:
        rng = np.random.default_rng(8)
        xk = rng.normal(scale=0.05, size=(9, DIM))
        xk[:, 0] = 2.0
        xk = _unit(xk)
        settings["given"] = _write_file(tmp_path / "kept.parquet", 1000 + np.arange(9), q[:9], xk)
    out = tmp_path / "out"
    datamask.select(root, out, **settings)
    cover = pq.read_table(out / "covered")
    cover = cover.take(np.argsort(cover["chunk_id"].to_numpy()))
    assert cover["chunk_id"].to_pylist() == list(range(n))
    kept = np.flatnonzero(cover["selected"].to_numpy())
    got, sim, exact = _table_cover(
        cover, {v: v for v in range(n)} | {v: v for v in 1000 + np.arange(9)}
    )
    assert exact.all()  # 3 groups: every group searched, exact searches
    floor_routes = json.loads((out / "manifest.json").read_text())["cover"]["floor_routes"]
    # the neighbours' kept rows searched for the dropped rows only: a kept row covers itself
    assert floor_routes.get("exact_search", 0) + floor_routes.get("ivf_search", 0) == n - len(kept)
    for g in range(3):  # per group: its own kept rows first, then the others by group, KEPT last
        rows = np.flatnonzero(group == g)
        order = [kept[group[kept] == g]] + [kept[group[kept] == h] for h in range(3) if h != g]
        j, best, clear = _expected(x[rows], [x[o] for o in order] + [xk])
        ids = np.concatenate([*order, 1000 + np.arange(len(xk))])
        want = ids[j]
        own = np.isin(rows, kept)
        want[own], best[own] = rows[own], 1.0
        _check(got[rows], sim[rows], exact[rows], want, best, clear)
    neg = np.arange(n - 12, n)
    assert (x[neg] @ np.concatenate([x[kept], xk]).T < 0).all()
    assert (sim[neg] < 0).all() and (got[neg] < 1000).all()


def test_sharded_cover_from_the_graphs_against_brute_force(tmp_path):
    """Allocated by gains (k-means groups, the exchange round): each row's nearest kept
    row of its own group is read from the graph its select step saved (K=6, fewer than the
    copies), the rest searched. Every row names a kept row holding the nearest kept vector
    at the true cosine, a kept row itself, and a dropped copy a kept copy of its own group
    where it has one."""
    x, q = _tricky(seed=2, n=180)
    n = len(x)
    root = tmp_path / "shards"
    for g in range(3):
        rows = np.arange(60 * g, 60 * (g + 1))
        _write_file(root / f"part-{g:05d}.parquet", rows, q[rows], x[rows])
    out = tmp_path / "out"
    datamask.select(
        root,
        out,
        k=30,
        partition="cluster",
        chunk_size=60,
        n_neighbors=6,
        n_epochs=20,
        workers=1,
        progress=False,
    )
    manifest = json.loads((out / "manifest.json").read_text())
    assert manifest["budget"]["allocation"] == "gains"
    assert manifest["cover"]["routes"]["graph"] > 0
    cover = pq.read_table(out / "covered")
    cover = cover.take(np.argsort(cover["chunk_id"].to_numpy()))
    got, sim, exact = _table_cover(cover, {v: v for v in range(n)})
    kept = np.flatnonzero(cover["selected"].to_numpy())
    assert exact.all() and np.isin(got, kept).all()  # at most 5 groups: exact everywhere
    j, best, clear = _expected(x, [x[kept]])
    np.testing.assert_allclose(sim, best, atol=1e-5)
    assert (x[got][clear] == x[kept[j]][clear]).all()  # the nearest vector (copies tie)
    assert np.array_equal(got[kept], kept)
    group = cover["group"].to_numpy()
    copies = np.flatnonzero((x == x[got]).all(1) & (got != np.arange(n)))
    checked = 0
    for i in copies:  # a dropped copy: a kept copy of its own group first
        same = kept[(group[kept] == group[i]) & (x[kept] == x[i]).all(1)]
        if len(same):
            assert got[i] == same[0]
            checked += 1
    assert checked > 0
