"""The cluster partition: k-means clusters cut by the geometry, groups within --chunk-size.

Real parquet shards and the runner's own plan phase (sample, fit, spill, plan) on a local
in-process runner; no selection runs here.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pyarrow.parquet as pq
import pytest
import torch

from datamask import make_clustered
from datamask.config import SelectSpec
from datamask.distributed import LocalRunner
from datamask.distributed.paths import WorkDir
from datamask.distributed.plan.balance import (
    assign_with_offsets,
    balanced_offsets,
    merge_neighbours,
)
from datamask.distributed.plan.partition import Piece, split_across
from datamask.distributed.plan.plan import plan_partition
from datamask.io.shards import inspect_shards, list_shards
from datamask.neighbors import assign_clusters
from tests._data import reference_table, write_corpus_shards, write_shards


def plan_of(shards: Path, work: Path, **partition) -> list[tuple[str, list[Piece]]]:
    """The runner's plan phase for ``--partition cluster`` with ``partition``'s settings."""
    columns = dict(id_col="chunk_id", quality_cols=("quality_score",), feature_col="feature_arr")
    settings = SelectSpec.from_mapping(dict(partition="cluster", **columns, **partition))
    infos = inspect_shards(list_shards(shards), columns=settings.read_columns)
    dirs = WorkDir.of(work.parent / "out", work)
    plan, _ = plan_partition(infos, settings, dirs, LocalRunner(), progress=False)
    return plan


def group_ids(plan: list[tuple[str, list[Piece]]]) -> list[set[str]]:
    """The ids of every group, read back from the spilled rows its pieces name."""
    out = []
    for _, pieces in plan:
        ids: set[str] = set()
        for p in pieces:
            table = pq.read_table(p.path, columns=["chunk_id"])
            ids.update(table.column(0).to_pylist()[p.start : p.stop])
        out.append(ids)
    return out


def test_split_across_cuts_every_piece_at_the_same_fractions():
    # ranks (2t+1)/2n: a0 .07 b0 .13 a1 .21 a2 .36 b1 .38 a3 .50 b2 .63 a4 .64 a5 .79 ...
    parts = split_across([Piece("a", 5, 12), Piece("b", 0, 4)], 4)
    assert parts == [
        [Piece("a", 5, 8), Piece("b", 0, 1)],
        [Piece("a", 8, 10), Piece("b", 1, 3)],
        [Piece("a", 10, 12), Piece("b", 3, 4)],
    ]


@pytest.mark.parametrize("seed", [0, 1, 2])
@pytest.mark.parametrize("chunk_size, kmeans_sample", [(150, 100_000), (400, 100_000), (90, 40)])
def test_groups_never_exceed_the_chunk_size(seed, chunk_size, kmeans_sample, tmp_path):
    """Every row in exactly one group, none above --chunk-size; with a 40-row sample the
    estimates are far off, so leaves come out too large and are cut across their axis."""
    corpus = make_clustered(1200, 16, 5, seed=seed)
    write_corpus_shards(tmp_path / "in", corpus, 4)
    plan = plan_of(
        tmp_path / "in",
        tmp_path / "work",
        chunk_size=chunk_size,
        kmeans_sample=kmeans_sample,
        seed=seed,
    )
    sizes = [sum(p.n for p in pieces) for _, pieces in plan]
    assert max(sizes) <= chunk_size
    ids = group_ids(plan)
    assert sum(len(g) for g in ids) == 1200 == len(set().union(*ids))


def two_blobs(folder: Path, n: int = 300, dim: int = 8, seed: int = 0) -> None:
    """Two tight blobs far apart (around e0 and e1), mixed at random over three shards."""
    rng = np.random.default_rng(seed)
    centres = np.eye(dim, dtype=np.float32)[[0, 1]]
    x = np.repeat(centres, n, axis=0) + 0.05 * rng.standard_normal((2 * n, dim))
    ids = [f"{'ab'[i // n]}{i % n:04d}" for i in range(2 * n)]
    order = rng.permutation(2 * n)
    table = reference_table([ids[i] for i in order], rng.random(2 * n), x[order].astype(np.float32))
    write_shards(table, folder, [200, 200, 200])


def test_a_cluster_too_large_is_split_along_its_geometry(tmp_path):
    """One k-means cluster over two far blobs: the split puts each blob in its own group
    (a split by row order would mix them, the shards holding both)."""
    two_blobs(tmp_path / "in")
    plan = plan_of(tmp_path / "in", tmp_path / "work", n_clusters=1, chunk_size=400)
    ids = group_ids(plan)
    assert len(ids) == 2
    assert sorted("".join(sorted({i[0] for i in g})) for g in ids) == ["a", "b"]


def test_a_split_is_balanced_and_keeps_a_small_blob_whole(tmp_path):
    """One k-means cluster of a 500-row blob and a 100-row blob, above a 400-row chunk:
    re-clustered into two balanced parts of 300 (the capacity), the small blob whole in
    one of them and the big one cut by its geometry (the rows nearest the small blob
    leave), never by row order, the shards holding both blobs in random order."""
    rng = np.random.default_rng(0)
    dim = 8
    centres = np.eye(dim, dtype=np.float32)[[0, 1]]
    x = np.repeat(centres, [500, 100], axis=0) + 0.05 * rng.standard_normal((600, dim))
    ids = [f"a{i:04d}" for i in range(500)] + [f"b{i:04d}" for i in range(100)]
    order = rng.permutation(600)
    table = reference_table([ids[i] for i in order], rng.random(600), x[order].astype(np.float32))
    write_shards(table, tmp_path / "in", [200, 200, 200])
    plan = plan_of(tmp_path / "in", tmp_path / "work", n_clusters=1, chunk_size=400)
    groups = group_ids(plan)
    assert sorted(len(g) for g in groups) == [300, 300]
    (with_b,) = [g for g in groups if any(i[0] == "b" for i in g)]
    assert sum(i[0] == "b" for i in with_b) == 100
    # the 200 rows of blob a that share the part are its rows nearest blob b
    a_rows = {ids[i]: x[i] for i in range(500)}
    pull = {i: float(v @ centres[1]) for i, v in a_rows.items()}
    moved = sorted(pull[i] for i in with_b if i[0] == "a")
    stayed = sorted(pull[i] for g in groups if g is not with_b for i in g)
    assert moved[0] >= np.quantile(stayed, 0.9)


def test_balanced_offsets_cap_every_centre_and_leave_a_fitting_split_alone():
    rng = np.random.default_rng(1)
    centres = torch.nn.functional.normalize(
        torch.randn(3, 16, generator=torch.Generator().manual_seed(0)), dim=1
    )
    x = torch.nn.functional.normalize(
        centres[torch.from_numpy(rng.choice(3, 400, p=[0.6, 0.3, 0.1]))]
        + 0.3 * torch.from_numpy(rng.standard_normal((400, 16)).astype(np.float32)),
        dim=1,
    )
    nearest = assign_clusters(x, centres)
    assert torch.bincount(nearest, minlength=3).max() > 150
    off = balanced_offsets(x, centres, 134)
    counts = torch.bincount(assign_with_offsets(x, centres, off), minlength=3)
    assert counts.max() <= 134 and counts.sum() == 400
    assert balanced_offsets(x, centres, 400).abs().max() == 0  # nothing over: nothing moves
    with pytest.raises(ValueError, match="capacity must hold every row: 3 centres x 100 rows"):
        balanced_offsets(x, centres, 100)


def test_merge_joins_nearest_neighbours_up_to_the_cap():
    """Two pairs of near-identical directions: each pair merges (6 <= 7), the pairs do not."""
    c = np.array([[1, 0, 0], [0, 1, 0], [0.99, 0.1, 0], [0.1, 0.99, 0]], dtype=np.float32)
    assert merge_neighbours([3, 3, 3, 4], c, 7) == [[0, 2], [1, 3]]
    assert merge_neighbours([3, 3, 3, 4], c, 6) == [[0, 2], [1], [3]]
    assert merge_neighbours([3, 3, 3, 4], c, 2) == [[0], [1], [2], [3]]


def test_small_clusters_merge_into_groups_near_the_chunk_size(tmp_path):
    """Default flags: neighbouring clusters are merged, so the median group is well over
    half the chunk size and none is above it; --n-clusters keeps its clusters apart."""
    corpus = make_clustered(3000, 16, 12, seed=0)
    write_corpus_shards(tmp_path / "in", corpus, 4)
    merged = plan_of(tmp_path / "in", tmp_path / "a", chunk_size=400)
    sizes = sorted(sum(p.n for p in ps) for _, ps in merged)
    assert max(sizes) <= 400 and sum(sizes) == 3000
    assert sizes[len(sizes) // 2] >= 0.75 * 400
    assert any(" + " in label for label, _ in merged)
    n_default = len(np.unique([label.split(" part")[0] for label, _ in merged]))
    apart = plan_of(tmp_path / "in", tmp_path / "b", chunk_size=400, n_clusters=n_default)
    assert not any(" + " in label for label, _ in apart)


def test_a_split_the_counts_do_not_need_is_undone(tmp_path):
    """Clusters cut on the sample's estimate are put back together when the full count
    fits: the cut at 0.9 x chunk size leaves a 600-row cluster whole at 600."""
    two_blobs(tmp_path / "in")
    plan = plan_of(tmp_path / "in", tmp_path / "work", n_clusters=1, chunk_size=600)
    assert [(label, sum(p.n for p in pieces)) for label, pieces in plan] == [("cluster 0", 600)]


def test_same_seed_same_plan(tmp_path):
    corpus = make_clustered(1200, 16, 5, seed=3)
    write_corpus_shards(tmp_path / "in", corpus, 4)

    def described(work: str, seed: int) -> list:
        plan = plan_of(tmp_path / "in", tmp_path / work, chunk_size=150, seed=seed)
        return [(label, [(Path(p.path).name, p.start, p.stop) for p in ps]) for label, ps in plan]

    first = described("a", 0)
    assert described("b", 0) == first
    assert group_ids(plan_of(tmp_path / "in", tmp_path / "a", chunk_size=150, seed=0)) == (
        group_ids(plan_of(tmp_path / "in", tmp_path / "b", chunk_size=150, seed=0))
    )
    assert described("c", 1) != first
