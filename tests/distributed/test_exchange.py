"""The exchange round of a sharded run (datamask.distributed.combine.exchange): brute force
and steps."""

from __future__ import annotations

from dataclasses import replace
from pathlib import Path

import numpy as np
import pyarrow.parquet as pq
import pytest
import torch

from datamask import FacilityLocation, make_clustered
from datamask.config import SelectSpec
from datamask.distributed import execute, run_selection
from datamask.distributed.combine import exchange
from datamask.distributed.combine.exchange import ExchangeGroup, ExchangeJob, exchange_neighbors
from datamask.distributed.paths import WorkDir
from datamask.distributed.plan.partition import make_groups, plan_by_chunk
from datamask.distributed.select.steps import GroupJob, SelectGroup, candidate_count
from datamask.io.shards import inspect_shards
from tests._data import reference_table, write, write_corpus_shards

FAST = dict(n_epochs=20, select_ratio=0.137, n_neighbors=16)


def test_raised_floor_counts_coverage_above_it_like_brute_force():
    rng = np.random.default_rng(0)
    x = torch.nn.functional.normalize(torch.from_numpy(rng.standard_normal((60, 8))), dim=1)
    x = x.float()
    floor = torch.from_numpy(rng.uniform(0, 0.8, 60)).float()
    term = FacilityLocation(n_neighbors=60).bind(x, None, 6)
    term.raise_floor(floor)
    sims = (x @ x.T).clamp_min(0)
    for _ in range(20):
        sel = torch.from_numpy(rng.choice(60, 6, replace=False))
        best = sims[:, sel].amax(1)
        # max(floor, best) - floor: what the selection adds to the cover from outside
        expected = torch.maximum(floor, best) - floor
        assert torch.allclose(term.graph_coverage(sel), expected, atol=1e-6)
    with pytest.raises(ValueError, match=r"floor must have shape \(60,\)"):
        term.raise_floor(torch.zeros(59))


def test_neighbours_are_lower_groups_nearest_first_like_brute_force():
    rng = np.random.default_rng(1)
    c = rng.standard_normal((30, 5))
    unit = c / np.linalg.norm(c, axis=1, keepdims=True)
    for h in (0, 1, 4, 40):
        near = exchange_neighbors(c, h)
        for g in range(30):
            sims = unit[:g] @ unit[g]
            want = sorted(range(g), key=lambda j: (-sims[j], j))[: min(h, g)]
            assert near[g] == want


def test_many_groups_find_most_lower_neighbours_by_the_ivf_search(monkeypatch):
    rng = np.random.default_rng(4)
    topics = rng.standard_normal((40, 16))
    c = topics[rng.integers(0, 40, 3000)] + 0.3 * rng.standard_normal((3000, 16))
    exact = exchange_neighbors(c, 8)
    monkeypatch.setattr(exchange, "EXACT_NEIGHBORS_MAX", 1000)
    approx = exchange_neighbors(c, 8)
    unit = c / np.linalg.norm(c, axis=1, keepdims=True)
    found = []
    for g, (a, e) in enumerate(zip(approx, exact, strict=True)):
        assert len(a) <= 8 and all(h < g for h in a) and len(set(a)) == len(a)
        sims = unit[a] @ unit[g]
        assert np.all(np.diff(sims) <= 1e-6)  # nearest first
        found.append(len(set(a) & set(e)) / max(1, len(e)))
    assert np.mean(found) > 0.8


@pytest.fixture(scope="module")
def steps_setup(tmp_path_factory):
    """Four chunk groups of a clustered corpus, each proposing by gains (the pure steps)."""
    root = tmp_path_factory.mktemp("exchange")
    corpus = make_clustered(1200, 16, 6, seed=5)
    ids = [f"d{i:05d}" for i in range(corpus.n_docs)]
    feats = np.asarray(corpus.features, np.float32)
    quality = np.asarray(corpus.quality).reshape(-1)
    write(reference_table(ids, quality, feats), root / "part.parquet", row_group_size=100)
    settings = SelectSpec.from_mapping(dict(n_epochs=20, select_ratio=0.1)).check()
    infos = inspect_shards([root / "part.parquet"])
    n, k = 1200, 120
    groups = make_groups(plan_by_chunk(infos, 300), k, 0)
    groups = [replace(g, k=candidate_count(g.n, n, k, 2.0)) for g in groups]
    q = np.asarray(corpus.quality).reshape(-1)
    qr = ([float(q.min())], [float(q.max())])
    work = WorkDir.of(root / "out", root / "work")
    for g in groups:
        job = GroupJob(g, settings, work, qr, propose=True, totals=(k, n))
        execute(SelectGroup(), job)
        with np.load(work.graph(g.gid)) as saved:  # kept for the exchange round
            assert saved["indices"].shape == saved["sims"].shape
            assert saved["indices"].shape[0] == g.n and saved["indices"].max() < g.n
    return groups, settings, work, qr, (k, n)


def _exchange(group, neighbors, spec, work, qr, totals):
    job = ExchangeJob(group, tuple(neighbors), spec, work, qr, totals)
    return execute(ExchangeGroup(), job)


def test_nothing_kept_next_door_leaves_the_first_order_and_gains(steps_setup):
    groups, settings, work, qr, totals = steps_setup
    stats = _exchange(groups[2], [(0, 0), (1, 0)], settings, work, qr, totals)
    first = pq.read_table(work.candidates(2))
    again = pq.read_table(work.exchange(2))
    assert stats["floors"] == 0 and not stats["reused"]
    # the graph its select step saved, kept for the cover: the same graph, the same order
    assert stats["graph"] == "saved" and work.graph(2).exists()
    assert again.column("chunk_id").equals(first.column("chunk_id"))
    assert np.array_equal(again.column("gain").to_numpy(), first.column("gain").to_numpy())
    # with its marker in place the step returns it and computes nothing
    assert _exchange(groups[2], [(0, 0)], settings, work, qr, totals)["reused"]
    # without a cover (selected_only) nothing reads the graph again: deleted
    alone = replace(settings, run=replace(settings.run, selected_only=True))
    assert _exchange(groups[2], [(0, 0)], alone, work, qr, totals)["reused"]
    assert not work.graph(2).exists()


def test_a_covered_border_is_priced_lower(steps_setup):
    groups, settings, work, qr, totals = steps_setup
    kept = [int(groups[h].k // 2) for h in range(3)]
    stats = _exchange(groups[3], [(h, kept[h]) for h in range(3)], settings, work, qr, totals)
    first = pq.read_table(work.candidates(3)).column("gain").to_numpy()
    again = pq.read_table(work.exchange(3))
    gains = again.column("gain").to_numpy()
    assert stats["floors"] > 0 and stats["graph"] == "saved"
    assert sorted(again.column("chunk_id").to_pylist()) == sorted(
        pq.read_table(work.candidates(3)).column("chunk_id").to_pylist()
    )
    assert np.all(np.diff(gains) <= 0)  # still a curve the allocation can read
    # coverage others already give is worth nothing again: the curve only drops
    assert gains.sum() < first.sum()


def test_a_run_with_the_exchange_round_records_it(tmp_path):
    corpus = make_clustered(900, 16, 6, seed=2)
    shards = tmp_path / "shards"
    corpus.ids = np.asarray([f"d{i:04d}" for i in range(900)])
    write_corpus_shards(shards, corpus, 3)
    settings = SelectSpec.from_mapping(dict(partition="cluster", chunk_size=250, **FAST))
    m = run_selection(shards, tmp_path / "out", settings, progress=False)
    n_groups = m["totals"]["n_groups"]
    assert n_groups > 1 and m["budget"]["allocation"] == "gains"
    work = Path(m["work_dir"])
    assert len(list((work / "exchange").glob("*.json"))) == n_groups
    assert m["budget"]["global_round"]["seconds"]["exchange"] > 0
    assert not list((work / "graphs").glob("*"))  # each deleted once its cover step ran
    kept = pq.read_table(tmp_path / "out" / "selected").num_rows
    assert kept == round(FAST["select_ratio"] * 900)
    off = run_selection(shards, tmp_path / "off", replace_exchange(settings, 0), progress=False)
    assert not (Path(off["work_dir"]) / "exchange").exists()
    assert off["budget"]["global_round"]["seconds"]["exchange"] < 0.01


def replace_exchange(settings: SelectSpec, n: int) -> SelectSpec:
    return replace(settings, partition=replace(settings.partition, exchange_neighbors=n))


def test_floors_are_never_above_the_exact_best_cosine_and_mostly_equal_it():
    # The exchange's floors probe EXCHANGE_PROBE_FRACTION of the ivf lists: a row whose
    # best kept row lies in an unprobed list gets a lower floor, never a higher one.
    rng = np.random.default_rng(0)
    centres = rng.standard_normal((40, 32))
    rows = centres[rng.integers(0, 40, 3000)] + 0.3 * rng.standard_normal((3000, 32))
    kept = centres[rng.integers(0, 40, 2500)] + 0.3 * rng.standard_normal((2500, 32))
    x = torch.nn.functional.normalize(torch.from_numpy(rows).float(), dim=1)
    base = torch.nn.functional.normalize(torch.from_numpy(kept).float(), dim=1)
    floors = exchange._floors(x, [base[:1200].numpy(), base[1200:].numpy()])
    exact = (x @ base.T).max(dim=1).values.clamp_min(0.0)
    assert exchange.EXCHANGE_PROBE_FRACTION < 0.2  # cheaper than the given floors' search
    assert bool((floors <= exact + 1e-5).all())
    assert float((floors >= exact - 1e-5).float().mean()) > 0.8
    # given a device (a run's GPU), every pair is compared there: the exact floors
    on_device = exchange._floors(x, [base[:1200].numpy(), base[1200:].numpy()], torch.device("cpu"))
    torch.testing.assert_close(on_device, exact, atol=1e-6, rtol=0)
    assert exchange._floors(x, [base[:0].numpy()], torch.device("cpu")).eq(0).all()
