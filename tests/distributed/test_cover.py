"""The cover dataset of sharded runs (``OUT/covered/``) against brute force over the whole
corpus: groups that split every cluster, so a row's nearest kept row often sits in another
group; every combine path (groups keep their share, gains with the exchange round, the
central round) on the local pool, and Ray (slow)."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pyarrow.parquet as pq
import pytest

from datamask import make_clustered
from datamask.config import SelectSpec
from datamask.distributed import LocalRunner, run_selection
from datamask.distributed.finish.cover import COVER_NEIGHBORS
from tests._data import write_corpus_shards
from tests.test_cover import check_against_brute

ROWS = 480
FAST = dict(n_epochs=20, select_ratio=0.1, n_neighbors=16)
GAINS = dict(partition="cluster", chunk_size=160)  # allocated by gains: the exchange round


@pytest.fixture(scope="module")
def corpus():
    return make_clustered(ROWS, 12, 6, seed=5)  # clusters spread over every shard


def run(corpus, tmp_path: Path, n_shards: int, runner=None, workers=1, **settings):
    root = tmp_path / "in"
    write_corpus_shards(root, corpus, n_shards)
    spec = SelectSpec.from_mapping({"partition": "shard", **FAST, **settings})
    out = tmp_path / "out"
    runner = runner or LocalRunner(workers=workers)
    manifest = run_selection(root, out, spec, runner=runner, progress=False)
    return manifest, pq.read_table(out / "covered"), out


def against_brute(corpus, table, out: Path):
    """The cover rows in the corpus' order, checked against the exact argmax over every
    row the output keeps; returns whether each row's cover sits in another group."""
    ids = np.asarray(corpus.ids)
    row_of = {v: i for i, v in enumerate(ids.tolist())}
    kept_ids = pq.read_table(out / "selected").column("chunk_id").to_pylist()
    kept = np.sort([row_of[v] for v in kept_ids])
    assert table.num_rows == len(ids)
    order = np.argsort([row_of[v] for v in table.column("chunk_id").to_pylist()])
    t = table.take(order)
    assert np.array_equal(np.flatnonzero(t.column("selected").to_numpy()), kept)
    index = np.asarray([row_of[v] for v in t.column("covered_by").to_pylist()])
    x = np.asarray(corpus.features, dtype=np.float64)
    exact = t.column("covered_exact").to_numpy()
    if exact.all():
        check_against_brute(index, t.column("covered_sim").to_numpy(), x, kept)
    else:  # every cosine is that of a kept row named, never above the truth
        assert np.isin(index, kept).all()
        xu = x / np.linalg.norm(x, axis=1, keepdims=True)
        named = (xu * xu[index]).sum(1)
        np.testing.assert_allclose(t.column("covered_sim").to_numpy(), named, atol=1e-5)
    group = t.column("group").to_numpy()
    group_of = dict(zip(t.column("chunk_id").to_pylist(), group.tolist(), strict=True))
    return np.asarray([group_of[v] for v in t.column("covered_by").to_pylist()]) != group


@pytest.mark.parametrize(
    "settings",
    [
        {"budget": "group"},
        # global budget, allocated by gains, with the exchange round, in a pool of two
        pytest.param({}, marks=pytest.mark.slow),
        {"algorithm": "Pair_simi"},  # the central round (part-global.parquet)
    ],
    ids=["group", "gains", "central"],
)
def test_sharded_cover_equals_brute_force(corpus, tmp_path, settings):
    # the local pool of two processes once, inline elsewhere (the steps are the same)
    workers = 2 if not settings else 1
    manifest, table, out = run(corpus, tmp_path, 3, workers=workers, **settings)
    assert table.column_names == [
        "chunk_id",
        "group",
        "selected",
        "covered_by",
        "covered_sim",
        "covered_exact",
    ]
    assert table.column("covered_exact").to_numpy().all()  # 3 groups: all compared
    across = against_brute(corpus, table, out)
    assert across.sum() > ROWS // 10  # many rows are covered from another group
    cover = manifest["cover"]
    assert cover["rows"] == ROWS and cover["exact"] == ROWS and cover["searched_all_groups"]
    assert len(list((out / "covered").glob("part-*.parquet"))) == 3
    # J over every document, from the cover: with every cover exact, the objective itself
    # (brute force over the whole corpus); pairwise similarity's terms are the central
    # round's (over the kept rows alone: exact), the cover adds none
    terms = manifest["terms"]
    if "algorithm" in settings:
        assert set(terms) == {"quality", "pairwise", "J"}
    else:
        assert terms == pytest.approx({**terms, **brute_terms(corpus, out)}, rel=1e-6)


def brute_terms(corpus, out: Path, lamb: float = 0.5) -> dict[str, float]:
    """quality, facility and J of the output's kept rows over every row, in float64."""
    kept_ids = set(pq.read_table(out / "selected").column("chunk_id").to_pylist())
    kept = np.flatnonzero([v in kept_ids for v in np.asarray(corpus.ids).tolist()])
    x = np.asarray(corpus.features, dtype=np.float64)
    x /= np.linalg.norm(x, axis=1, keepdims=True)
    facility = float((x @ x[kept].T).clip(min=0).max(axis=1).mean())
    quality = float(corpus.normalized_quality()[kept].mean())
    return {"quality": quality, "facility": facility, "J": lamb * quality + (1 - lamb) * facility}


def test_more_groups_than_neighbours_are_flagged(corpus, tmp_path):
    n_shards = COVER_NEIGHBORS + 2
    manifest, table, out = run(corpus, tmp_path, n_shards, budget="group")
    assert not table.column("covered_exact").to_numpy().any()
    against_brute(corpus, table, out)
    assert manifest["cover"]["approximate"] == ROWS and not manifest["cover"]["searched_all_groups"]


def test_a_rerun_reuses_the_cover_and_redoes_a_lost_part(corpus, tmp_path):
    first, table, out = run(corpus, tmp_path, 3, budget="group")
    cover_dir = out / "_work" / "cover"
    assert not list(cover_dir.glob("rows-*")) and not list(cover_dir.glob("ids-*"))  # used
    again, table2, _ = run(corpus, tmp_path, 3, budget="group")
    assert table2.equals(table)
    # a part lost after its rows and its group's graph were deleted: pass 2 reads the
    # group again and searches its own kept rows, which the graph gave the first time: the
    # same rows named, each cosine a matmul's instead of a row-wise product (the last bit)
    (out / "covered" / "part-00001.parquet").unlink()
    (cover_dir / "00001.json").unlink()
    _, table3, _ = run(corpus, tmp_path, 3, budget="group")
    a, b = table3.sort_by("chunk_id"), table.sort_by("chunk_id")
    assert a.drop_columns(["covered_sim"]).equals(b.drop_columns(["covered_sim"]))
    sim_a, sim_b = a.column("covered_sim").to_numpy(), b.column("covered_sim").to_numpy()
    np.testing.assert_allclose(sim_a, sim_b, rtol=0, atol=1e-6)


@pytest.mark.slow
def test_sharded_cover_on_ray(corpus, tmp_path):
    pytest.importorskip("ray")
    from datamask.distributed import RayRunner

    runner = RayRunner(workers=2)  # starts Ray; close() stops it and restores os.environ
    try:
        _, table, out = run(corpus, tmp_path, 3, runner=runner)
    finally:
        runner.close()
    local = run(corpus, tmp_path / "local", 3)[1]
    assert table.sort_by("chunk_id").equals(local.sort_by("chunk_id"))
    against_brute(corpus, table, out)


def test_the_cover_changes_no_selected_row(corpus, tmp_path):
    with_cover, _, out = run(corpus, tmp_path / "a", 3)
    without = run_selection(
        tmp_path / "a" / "in",
        tmp_path / "b",
        SelectSpec.from_mapping({"partition": "shard", "selected_only": True, **FAST}),
        runner=LocalRunner(workers=1),
        progress=False,
    )
    assert without["cover"] is None and not (tmp_path / "b" / "covered").exists()
    assert with_cover["selection_digest"] == without["selection_digest"]


def test_the_cover_reads_the_own_group_from_its_graph(corpus, tmp_path):
    """Allocated by gains (the exchange round): every kept row's embedding comes from the
    table the parts were written from, each row's nearest kept row of its own group from
    the graph its select step saved (exact: groups of 160 rows), and the cover is brute
    force's; the graphs are deleted by the cover, their last reader."""
    manifest, table, out = run(corpus, tmp_path, 3, **GAINS)
    cover = manifest["cover"]
    assert manifest["budget"]["allocation"] == "gains"
    assert cover["kept_rows_read"] == {"stored": manifest["partition"]["n_groups"]}
    assert cover["routes"]["graph"] > ROWS // 2 and cover["exact"] == ROWS
    against_brute(corpus, table, out)
    assert not list((out / "_work" / "graphs").glob("*.npz"))


def test_one_group_covers_from_its_graph(corpus, tmp_path):
    """One group (the corpus within --chunk-size: no exchange round): its select step
    keeps its graph for the cover, which reads each row's nearest kept row from it
    (exact: 480 rows) instead of searching every row, equals brute force, and deletes it.
    With ``selected_only`` there is no cover, and no graph is left behind."""
    manifest, table, out = run(corpus, tmp_path / "a", 3, partition="cluster", chunk_size=ROWS)
    cover = manifest["cover"]
    assert manifest["partition"]["n_groups"] == 1
    assert cover["routes"]["graph"] > ROWS // 2 and cover["exact"] == ROWS
    against_brute(corpus, table, out)
    assert not list((out / "_work" / "graphs").glob("*.npz"))
    spec = SelectSpec.from_mapping(
        {"partition": "cluster", "chunk_size": ROWS, "selected_only": True, **FAST}
    )
    only = run_selection(tmp_path / "a" / "in", tmp_path / "b", spec, progress=False)
    assert only["selection_digest"] == manifest["selection_digest"]
    assert not list((tmp_path / "b" / "_work").glob("graphs/*.npz"))


def test_a_run_killed_between_exchange_and_cover_resumes_from_the_graphs(corpus, tmp_path):
    """A cover step that fails (a folder where a group's kept rows go) after the exchange
    round: the graphs stay, the resumed run reads its own groups from them and equals
    brute force, and the same cover searched without the graphs is the same table."""
    blocker = tmp_path / "out" / "_work" / "cover" / "kept-00001.parquet"
    blocker.mkdir(parents=True)
    with pytest.raises(OSError):
        run(corpus, tmp_path, 3, **GAINS)
    work = tmp_path / "out" / "_work"
    graphs = sorted(f.stem for f in (work / "graphs").glob("*.npz"))
    assert graphs and graphs == sorted(f.stem for f in (work / "exchange").glob("*.parquet"))
    blocker.rmdir()
    manifest, table, out = run(corpus, tmp_path, 3, **GAINS)
    assert manifest["cover"]["routes"]["graph"] > ROWS // 2
    against_brute(corpus, table, out)
    assert not list((work / "graphs").glob("*.npz"))
    # again without the graphs: every own group searched, the same rows named
    for f in [*(out / "covered").glob("part-*"), *(out / "_work" / "cover").glob("*")]:
        f.unlink()
    again, searched, _ = run(corpus, tmp_path, 3, **GAINS)
    assert again["cover"]["routes"]["graph"] == 0
    a, b = table.sort_by("chunk_id"), searched.sort_by("chunk_id")
    assert a.drop_columns(["covered_sim"]).equals(b.drop_columns(["covered_sim"]))
    # a graph's pair is the row-wise dot product, the search's a matmul's: the last bit
    sim_a, sim_b = a.column("covered_sim").to_numpy(), b.column("covered_sim").to_numpy()
    np.testing.assert_allclose(sim_a, sim_b, rtol=0, atol=1e-6)
