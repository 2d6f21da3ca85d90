"""The k-means fit spread over steps (:mod:`datamask.distributed.plan.kmeans`) and the Ray
runner's separate in-flight limits for CPU and GPU steps.

Real parquet shards, the runner's own plan phase (sample, fit, spill, gather) on a local
runner, a local Ray for the runner comparison; no selection runs here except the last
test's.
"""

from __future__ import annotations

import io
import json
from pathlib import Path

import numpy as np
import pyarrow.parquet as pq
import pytest
import torch

from datamask import make_clustered
from datamask.cli import main
from datamask.config import SelectSpec
from datamask.distributed import LocalRunner, execute, run_selection
from datamask.distributed.paths import WorkDir
from datamask.distributed.plan.kmeans import FitPlan, LloydPart, PartJob, SamplePart, fit_plan
from datamask.distributed.plan.partition import plan_by_cluster, sample_plan
from datamask.distributed.plan.plan import fit_cluster_tree, plan_partition
from datamask.distributed.plan.tree import ClusterTree
from datamask.distributed.ray_backend import TaskLimits, task_limits
from datamask.io.shards import inspect_shards, list_shards
from tests._data import write_corpus_shards
from tests.io.test_remote import BUCKET, s3  # noqa: F401 (the moto S3 server fixture)


def sample_part(part, reads, work):
    dirs = WorkDir.of(work / "out", work)
    return execute(SamplePart(), PartJob(dirs, part, reads=tuple(reads)))


def lloyd_part(work, part, n, dim, cent, device):
    dirs = WorkDir.of(work / "out", work)
    return execute(LloydPart(), PartJob(dirs, part, n, dim, centroids=cent, device=device))


COLUMNS = dict(id_col="chunk_id", quality_cols=("quality_score",), feature_col="feature_arr")


def settings_of(**partition) -> SelectSpec:
    return SelectSpec.from_mapping(dict(partition="cluster", **COLUMNS, **partition))


def fitted(shards: Path, work: Path, runner=None, **partition) -> tuple[list, dict, ClusterTree]:
    """The plan phase of ``--partition cluster``: (plan, facts, the tree it fitted)."""
    settings = settings_of(**partition)
    infos = inspect_shards(list_shards(shards), columns=settings.read_columns)
    dirs = WorkDir.of(work.parent / "out", work)
    plan, facts = plan_partition(infos, settings, dirs, runner or LocalRunner(), progress=False)
    return plan, facts, ClusterTree.load(dirs.tree())


def leaf_cosine(tree: ClusterTree, x: np.ndarray) -> float:
    """Mean cosine of every row to the centre of the leaf the tree files it under."""
    x = x / np.linalg.norm(x, axis=1, keepdims=True)
    leaf, _ = tree.assign(torch.from_numpy(x.astype(np.float32)))
    node_of = np.flatnonzero(tree.leaf >= 0)[np.argsort(tree.leaf[tree.leaf >= 0])]
    return float((x * tree.centre[node_of[leaf]]).sum(1).mean())


@pytest.fixture(scope="module")
def corpus():
    return make_clustered(4000, 16, 12, seed=1)


@pytest.fixture(scope="module")
def shards(tmp_path_factory, corpus) -> Path:
    root = tmp_path_factory.mktemp("kmeans-shards")
    write_corpus_shards(root, corpus, 5)
    return root


# --- the shape of the fit ------------------------------------------------------------------
def test_the_sample_grows_with_the_clusters_and_spreads_past_one_step():
    # few clusters: today's sample and one step
    assert fit_plan(100, 10**6, None, 100_000) == FitPlan(100_000, False, 1, 100)
    # 64 rows a centroid: 640k rows, above one step, two levels of ceil(sqrt(C))
    assert fit_plan(10_000, 10**6, None, 100_000) == FitPlan(640_000, True, 2, 100)
    # a given sample is kept as given; never more rows than the corpus
    assert fit_plan(10_000, 10**6, 50_000, 100_000) == FitPlan(50_000, False, 1, 10_000)
    assert fit_plan(10_000, 300_000, None, 100_000).n_sample == 300_000
    # capped at SAMPLE_CAP rows
    assert fit_plan(10**6, 10**9, None, 100_000).n_sample == 4_000_000
    # spread but few clusters: one level
    assert fit_plan(500, 10**6, 200_000, 100_000) == FitPlan(200_000, True, 1, 500)


def test_small_cases_keep_the_one_step_fit(shards, corpus, tmp_path):
    """The default settings on a small corpus fit in one step, exactly as before: the tree
    is the one fitted on the same sample read directly (one reader, shard by shard)."""
    from datamask.distributed.plan.partition import fit_centroids, fit_tree, read_sample

    plan, facts, tree = fitted(shards, tmp_path / "w", chunk_size=500)
    assert facts["kmeans"]["spread"] is False and facts["kmeans"]["levels"] == 1
    assert facts["kmeans"]["sample_rows"] == 4000
    settings = settings_of(chunk_size=500)
    infos = inspect_shards(list_shards(shards), columns=settings.read_columns)
    wanted = sample_plan(infos, 100_000, 0)
    sample = np.concatenate(
        [read_sample(s, infos[s], rows, "feature_arr")[1] for s, rows in sorted(wanted.items())]
    )
    old = fit_tree(sample, fit_centroids(sample, facts["n_clusters"], 0), 4000, 500, 0)
    for name in ("centroids", "centre", "offset", "axis", "children"):
        np.testing.assert_array_equal(getattr(tree, name), getattr(old, name))


def test_the_one_step_fit_holds_its_sample_once(corpus, tmp_path):
    """The fit step's numpy heap (tracemalloc traces numpy's buffers) peaks near one
    sample, not two: its 20 parts are copied into it one at a time, not held while
    they are concatenated (issue 30: the fit step was the largest worker)."""
    import tracemalloc

    from datamask.distributed.plan.fit import FitJob, fit_partition, read_sample_parts

    write_corpus_shards(tmp_path / "in", corpus, 20)
    settings = settings_of(chunk_size=500)
    infos = inspect_shards(list_shards(tmp_path / "in"), columns=settings.read_columns)
    dirs = WorkDir.of(tmp_path / "out", tmp_path)  # the sample as 20 parts of 200 rows
    parts = read_sample_parts(infos, 100_000, 200, settings, dirs, LocalRunner())
    assert len(parts) == 20
    rows = tuple(p["rows"] for p in parts)
    sample_bytes = sum(rows) * 16 * 4  # float32, 16-d
    job = FitJob(dirs, rows, 16, 12, 4000, 500, 0)
    tracemalloc.start()
    try:
        stats = fit_partition(job)
        _, peak = tracemalloc.get_traced_memory()
    finally:
        tracemalloc.stop()
    assert stats["sample_rows"] == 4000
    assert sample_bytes <= peak < 1.6 * sample_bytes, (peak, sample_bytes)


def test_spread_fit_matches_one_step_quality_and_bounds_the_groups(shards, corpus, tmp_path):
    """The same sample fitted by 9 steps of 450 rows: every row in one group, none above
    --chunk-size, and the rows as near their leaves' centres as the one-step fit's."""
    one = fitted(shards, tmp_path / "one", chunk_size=300)
    spread = fitted(shards, tmp_path / "spread", chunk_size=300, kmeans_step_rows=450)
    kmeans = spread[1]["kmeans"]
    assert kmeans["spread"] and kmeans["levels"] == 1 and kmeans["parts"] == 9
    sizes = [sum(p.n for p in pieces) for _, pieces in spread[0]]
    assert max(sizes) <= 300 and sum(sizes) == 4000
    x = np.asarray(corpus.features)
    assert leaf_cosine(spread[2], x) >= leaf_cosine(one[2], x) - 0.01


TWO_LEVELS = dict(chunk_size=300, n_clusters=1100, kmeans_step_rows=1000)


def fit_only(shards: Path, work: Path, runner=None, **partition) -> tuple[dict, ClusterTree]:
    """Only the k-means fit of the plan phase (no spill, no gather): (facts, tree)."""
    settings = settings_of(**partition)
    infos = inspect_shards(list_shards(shards), columns=settings.read_columns)
    n_clusters = settings.partition.n_clusters
    dirs = WorkDir.of(work / "out", work)
    facts = fit_cluster_tree(infos, settings, n_clusters, dirs, runner or LocalRunner())
    return facts, ClusterTree.load(dirs.tree())


def test_two_levels_give_c_fine_clusters_under_sqrt_c_coarse_ones(shards, corpus, tmp_path):
    facts, tree = fit_only(shards, tmp_path, **TWO_LEVELS)
    assert facts["levels"] == 2 and facts["k1"] == 34 == len(tree.centroids)
    assert tree.levels == 2
    # every coarse cluster with rows is cut into its share of the 1,100 fine ones
    fine = sum(int(b - a) if a >= 0 else 1 for a, b in tree.children[:34])
    assert 1000 <= fine <= 1100 and tree.n_leaves >= fine
    # children are consecutive and numbered above their parent (ClusterTree's contract)
    for v, (a, b) in enumerate(tree.children):
        assert a < 0 or v < a < b
    x = np.asarray(corpus.features, dtype=np.float32)
    leaf, _ = tree.assign(torch.from_numpy(x / np.linalg.norm(x, axis=1, keepdims=True)))
    per_leaf = np.bincount(leaf, minlength=tree.n_leaves)
    for merge in (True, False):
        plan = plan_by_cluster(per_leaf, 300, tree, merge=merge)
        sizes = [n for _, _, n in plan]
        assert max(sizes) <= 300 and sum(sizes) == 4000
    # --n-clusters given (no merge): every fine cluster its own group, never a coarse one
    assert len(plan) >= (per_leaf > 0).sum() - 5 >= 990


def test_spread_fit_is_the_same_resumed(shards, tmp_path):
    """A fit killed before its tree was joined resumes from its steps' markers (the parts
    and routed rows are not written again) to the same tree; a fresh folder too."""
    first = fit_only(shards, tmp_path / "a", **TWO_LEVELS)[1]
    kdir = tmp_path / "a" / "clusters" / "kmeans"

    def stamped() -> dict:  # the parts' and routed rows' markers (a subtree is redone)
        return {f: f.stat().st_mtime_ns for f in kdir.glob("*.json") if "subtrees" not in f.name}

    stamps = stamped()
    (tmp_path / "a" / "clusters" / "tree.npz").unlink()
    (kdir / "subtrees-00000.npz").unlink()
    for folder in ("a", "b"):
        again = fit_only(shards, tmp_path / folder, **TWO_LEVELS)[1]
        for name in ("centroids", "centre", "offset", "axis", "children"):
            np.testing.assert_array_equal(getattr(first, name), getattr(again, name))
    assert stamps and stamped() == stamps


def test_lloyd_sums_are_float64_and_count_every_row(shards, tmp_path):
    settings = settings_of()
    infos = inspect_shards(list_shards(shards), columns=settings.read_columns)
    wanted = sample_plan(infos, 1000, 0)
    jobs = [(s, infos[s], rows, "feature_arr") for s, rows in wanted.items()]
    stats = sample_part(0, jobs, tmp_path)
    assert stats["rows"] == 1000
    cent = np.eye(16, dtype=np.float32)[:5]
    _, sums, counts, total = lloyd_part(tmp_path, 0, 1000, 16, cent, "cpu")
    assert sums.dtype == np.float64 and sums.shape == (5, 16) and counts.sum() == 1000
    assert -1000 <= total <= 1000


# --- separate in-flight limits ---------------------------------------------------------------
def test_cpu_and_gpu_steps_have_their_own_in_flight_limits():
    # not pinned: CPU steps one CPU each up to the cluster's CPUs, GPU steps one GPU each
    assert task_limits(64, [16] * 4, 4, None, True) == TaskLimits(64, 1, 4, 1.0)
    # fractional GPUs: four steps share each GPU
    assert task_limits(64, [16] * 4, 4, None, True, 0.25) == TaskLimits(64, 1, 16, 0.25)
    # no GPUs: one limit, as before
    assert task_limits(8, [8], 0, None, False) == TaskLimits(8, 1, 0, 0.0)
    # pinned --workers: that many of either, CPUs shared out, at most the smallest node's
    assert task_limits(64, [16] * 4, 4, 8, True) == TaskLimits(8, 8, 8, 0.5)
    assert task_limits(2, [1, 1], 0, 1, False) == TaskLimits(1, 1, 0, 0.0)
    with pytest.raises(ValueError, match="reports no GPUs"):
        task_limits(8, [8], 0, None, True)


@pytest.mark.slow
def test_ray_spread_fit_equals_the_local_pool_and_limits_follow_the_cluster(
    shards, tmp_path, local_pool
):
    """On a local Ray with --workers left out: CPU steps up to its CPUs; the spread,
    two-level fit gives the same tree as in this process, and a spread selection equals
    the local pool's with 2 workers."""
    pytest.importorskip("ray")
    from datamask.distributed import RayRunner

    local = fit_only(shards, tmp_path / "local", **TWO_LEVELS)[1]
    runner = RayRunner().connect()
    try:
        assert runner.limits.cpu_tasks == runner.n_cpus and runner.cpus_per_task == 1
        assert runner.describe()["gpu_workers"] == runner.limits.gpu_tasks
        on_ray = fit_only(shards, tmp_path / "ray", runner=runner, **TWO_LEVELS)[1]
        for name in ("centroids", "centre", "offset", "axis", "children"):
            np.testing.assert_array_equal(getattr(local, name), getattr(on_ray, name))
        # the whole selection, with a one-level spread fit (45 clusters, 4 parts)
        args = dict(chunk_size=300, kmeans_step_rows=1000)
        spec = settings_of(select_ratio=0.1, n_epochs=5, n_neighbors=16, **args)
        run_selection(shards, tmp_path / "out-ray", spec, runner=runner, progress=False)
    finally:
        runner.close()
    run_selection(shards, tmp_path / "out-pool", spec, runner=local_pool, progress=False)
    ref = pq.read_table(tmp_path / "out-pool" / "selected")
    assert ref.num_rows == 400
    assert pq.read_table(tmp_path / "out-ray" / "selected").equals(ref)


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")
def test_lloyd_step_on_cuda_counts_as_on_cpu(shards, tmp_path):
    settings = settings_of()
    infos = inspect_shards(list_shards(shards), columns=settings.read_columns)
    wanted = sample_plan(infos, 2000, 0)
    sample_part(0, [(s, infos[s], r, "feature_arr") for s, r in wanted.items()], tmp_path)
    cent = np.eye(16, dtype=np.float32)[:8]
    cpu = lloyd_part(tmp_path, 0, 2000, 16, cent, "cpu")
    gpu = lloyd_part(tmp_path, 0, 2000, 16, cent, "cuda")
    np.testing.assert_array_equal(cpu[2], gpu[2])
    np.testing.assert_allclose(cpu[1], gpu[1], rtol=1e-6, atol=1e-6)


@pytest.mark.slow
def test_spread_fit_reads_and_writes_s3_in_place(shards, s3, tmp_path, monkeypatch):  # noqa: F811
    """s3 in, s3 out, the work dir on s3: the spread fit's parts, routed rows and subtrees
    are objects read by ranged reads, and the selection equals a run on local files."""
    client, _ = s3
    for f in sorted(shards.glob("*.parquet")):
        client.put_object(Bucket=BUCKET, Key=f"kmeans/{f.name}", Body=f.read_bytes())
    monkeypatch.chdir(tmp_path)
    flags = ["--chunk-size", "300", "--kmeans-step-rows", "1000", "--select-ratio", "0.1",
             "--n-epochs", "5", "--n-neighbors", "16", "--runner", "local", "--no-progress",
             "--id-col", "chunk_id", "--quality-col", "quality_score",
             "--feature-col", "feature_arr"]  # fmt: skip
    uri = f"s3://{BUCKET}"
    assert main(["select", "--input", f"{uri}/kmeans/", "--output", f"{uri}/km", *flags]) == 0
    # the local reference in this process (--workers 1): steps are pure, the pool's
    # selection is the same (test_distributed.test_identical_across_worker_counts_and_runners)
    local_run = ["--input", str(shards), "--output", str(tmp_path / "km"), "--workers", "1"]
    assert main(["select", *local_run, *flags]) == 0
    pages = client.get_paginator("list_objects_v2").paginate(Bucket=BUCKET, Prefix="km/")
    keys = [o["Key"] for page in pages for o in page.get("Contents", [])]
    assert "km/_work/clusters/kmeans/part-00000.f32" in keys
    assert any(k.startswith("km/_work/clusters/kmeans/subtrees-") for k in keys)
    manifest = json.loads(client.get_object(Bucket=BUCKET, Key="km/manifest.json")["Body"].read())
    remote = set()
    for k in keys:
        if k.startswith("km/selected/") and k.endswith(".parquet"):
            body = client.get_object(Bucket=BUCKET, Key=k)["Body"].read()
            remote |= set(pq.read_table(io.BytesIO(body)).column("chunk_id").to_pylist())
    local = set(pq.read_table(tmp_path / "km" / "selected").column("chunk_id").to_pylist())
    assert len(local) == 400 and remote == local
    assert manifest["partition"]["kmeans"]["spread"] is True
    assert manifest["partition"]["kmeans"]["parts"] == 4  # 4,000 sampled rows, 1,000 a step
