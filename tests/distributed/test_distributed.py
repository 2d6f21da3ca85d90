"""Sharded selection: exact global budget, equivalence with one process, resume, bad shards.

Runs on a local Ray (one per module: starting Ray is the slow part) with small shards.
"""

from __future__ import annotations

import json
import os
import re
import shutil
import signal
import subprocess
import sys
import textwrap
from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.dataset as ds
import pyarrow.parquet as pq
import pytest

from datamask import Corpus, MaskLearner, make_clustered
from datamask.config import SelectSpec
from datamask.distributed import (
    LocalRunner,
    apportion,
    group_seeds,
    run_selection,
)
from datamask.distributed.executors import largest_first
from datamask.distributed.manifest import step_seconds
from datamask.distributed.plan.partition import plan_by_chunk
from datamask.distributed.select.steps import candidate_count
from datamask.io.parquet import read_corpus
from datamask.io.shards import inspect_shards, list_shards, read_rows
from tests._data import reference_table, write, write_columns, write_corpus_shards

N_SHARDS, ROWS, DIM = 6, 300, 16
FAST = dict(n_epochs=20, select_ratio=0.137, n_neighbors=16)


def write_shards(root: Path, corpus, n_shards: int, *, row_group_size: int = 100) -> list[Path]:
    return write_corpus_shards(root, corpus, n_shards, row_group_size=row_group_size)


def selected_ids(out: Path) -> list:
    return sorted(pq.read_table(out / "selected").column("chunk_id").to_pylist())


@pytest.fixture(scope="module")
def corpus():
    return make_clustered(N_SHARDS * ROWS, DIM, 6, seed=0)


@pytest.fixture(scope="module")
def shard_dir(tmp_path_factory, corpus) -> Path:
    root = tmp_path_factory.mktemp("shards")
    write_shards(root, corpus, N_SHARDS)
    return root


@pytest.fixture(scope="module")
def ray_runner():
    pytest.importorskip("ray")
    from datamask.distributed import RayRunner

    # the runner starts Ray itself, so its close() also puts back the variables ray.init
    # leaves in os.environ (RAY_AUTH_MODE=token broke a later cluster's node registration)
    runner = RayRunner(workers=2).connect()
    yield runner
    runner.close()


def test_ray_steps_run_in_the_workers_its_warm_up_started(ray_runner):
    """Connecting starts one worker per CPU slot at once (each imports datamask); the
    steps then run in those workers, not in ones started one after another for them."""
    warmed = ray_runner.warmed()
    assert len(set(warmed)) == ray_runner.workers == 2
    ran = set(ray_runner.map(os.getpid, [()] * 4))
    assert ran <= set(warmed)


def cli_main():
    """``datamask.cli.main``, its parser built: a broken CLI import fails, never skips."""
    from datamask.cli import build_parser, main

    build_parser()
    return main


# --- budget, seeds and plans ---------------------------------------------------------------
def test_apportion_hand_computed():
    # quotas 3 * (5, 3, 2) / 10 = (1.5, 0.9, 0.6): floors (1, 0, 0), the two seats left go
    # to the largest remainders 0.9 and 0.6.
    assert apportion([5, 3, 2], 3).tolist() == [1, 1, 1]
    assert apportion([5, 3, 2], 2).tolist() == [1, 1, 0]
    # equal remainders: the lower group id wins
    assert apportion([1, 1, 1], 2).tolist() == [1, 1, 0]
    assert apportion([7], 3).tolist() == [3]


@pytest.mark.parametrize("seed", range(100))
def test_apportion_is_exact_and_bounded(seed):
    rng = np.random.default_rng(seed)
    sizes = rng.integers(0, 1000, size=rng.integers(1, 40))
    sizes[0] += 1
    ratio = rng.uniform(0.001, 0.999)
    k_total = int(round(ratio * sizes.sum()))
    k = apportion(sizes, k_total)
    assert k.sum() == k_total
    assert (k >= 0).all() and (k <= sizes).all()
    assert np.all(np.abs(k - k_total * sizes / sizes.sum()) < 1)  # within one of its quota


def test_apportion_rejects_bad_budget():
    with pytest.raises(ValueError, match="k_total must be in"):
        apportion([3, 4], 8)


def test_group_seeds_one_group_keeps_the_seed():
    assert group_seeds(7, 1) == [7]
    assert group_seeds(7, 3) == group_seeds(7, 3)
    assert len(set(group_seeds(7, 50))) == 50


def test_chunks_cover_every_row_once(shard_dir):
    infos = inspect_shards(list_shards(shard_dir))
    plan = plan_by_chunk(infos, 250)
    sizes = [sum(p.n for p in pieces) for _, pieces in plan]
    assert sizes == [250] * 7 + [50]
    seen = [(p.path, r) for _, pieces in plan for p in pieces for r in range(p.start, p.stop)]
    assert len(seen) == len(set(seen)) == N_SHARDS * ROWS


# --- shard I/O ------------------------------------------------------------------------------
def test_list_shards_dir_glob_list_and_dataset(shard_dir, tmp_path):
    files = list_shards(shard_dir)
    assert [f.name for f in files] == [f"part-{s:05d}.parquet" for s in range(N_SHARDS)]
    assert list_shards(str(shard_dir / "part-0000[12].parquet")) == files[1:3]
    assert list_shards(ds.dataset(shard_dir, format="parquet")) == files
    # nested, with hidden and underscore names skipped as pyarrow's discovery does
    nested = tmp_path / "nested"
    (nested / "year=2024").mkdir(parents=True)
    (nested / "_work").mkdir()
    shutil.copy(files[0], nested / "year=2024" / "a.parquet")
    shutil.copy(files[0], nested / "_work" / "b.parquet")
    shutil.copy(files[0], nested / ".c.parquet")
    assert list_shards(nested) == [nested / "year=2024" / "a.parquet"]
    with pytest.raises(ValueError, match="no files match"):
        list_shards(str(tmp_path / "nothing-*.parquet"))
    (tmp_path / "empty").mkdir()
    with pytest.raises(ValueError, match="holds no"):
        list_shards(tmp_path / "empty")
    with pytest.raises(ValueError, match="does not exist"):
        list_shards(tmp_path / "absent")


def test_read_rows_crosses_row_groups(shard_dir):
    path = list_shards(shard_dir)[2]
    full = pq.read_table(path)
    part = read_rows(path, 95, 213, ["chunk_id", "quality_score"])
    assert part.column("chunk_id").to_pylist() == full.column("chunk_id").to_pylist()[95:213]
    assert read_rows(path, 7, 7, ["chunk_id"]).num_rows == 0
    with pytest.raises(ValueError, match="out of range"):
        read_rows(path, 0, ROWS + 1, ["chunk_id"])


# --- exact global count -------------------------------------------------------------------
@pytest.mark.parametrize("partition", ["shard", "chunk", "cluster"])
def test_exact_global_count(partition, shard_dir, corpus, tmp_path, ray_runner):
    settings = SelectSpec.from_mapping(
        dict(partition=partition, chunk_size=250, n_clusters=4, **FAST)
    )
    m = run_selection(shard_dir, tmp_path / "out", settings, runner=ray_runner, progress=False)
    k_total = round(FAST["select_ratio"] * N_SHARDS * ROWS)
    ids = selected_ids(tmp_path / "out")
    assert len(ids) == len(set(ids)) == k_total == m["totals"]["k"]
    assert set(ids) <= set(corpus.ids)
    sizes = [g["n"] for g in m["groups"]]
    assert sum(sizes) == N_SHARDS * ROWS
    # each group's proportional share, and (global budget) the candidates it proposed
    assert [g["share"] for g in m["groups"]] == apportion(sizes, k_total).tolist()
    n_total = N_SHARDS * ROWS
    proposed = [candidate_count(n, n_total, k_total, 2.0) for n in sizes]
    if partition == "cluster":  # allocated by gains: groups cut off propose twice as many
        kept = m["budget"]["global_round"]["kept_per_group"]
        for g, c, m_g in zip(m["groups"], proposed, kept, strict=True):
            assert g["k"] in {min(g["n"], c * 2**r) for r in range(8)}
            assert m_g < g["k"] or g["k"] == g["n"]  # nobody cut off by its candidates
    else:
        assert [g["k"] for g in m["groups"]] == proposed
    assert m["budget"]["mode"] == "global" and m["budget"]["candidates"] == sum(
        g["k"] for g in m["groups"]
    )
    assert m["complete"] and m["totals"]["groups_computed"] == len(sizes)
    if partition == "cluster":
        assert max(sizes) <= 250 and m["partition"]["n_clusters"] == 4
    # every worker reports its memory; the selected parts carry the group id
    assert all(g["peak_rss_mb"] > 0 for g in m["groups"])
    table = pq.read_table(tmp_path / "out" / "selected")
    extra = {"gain"} if partition == "cluster" else set()
    assert set(table.column_names) == {"chunk_id", "group", "rank", "logit", *extra}


def test_ids_carry_through_unchanged(tmp_path):
    c = make_clustered(400, 8, 4, seed=1)
    root = tmp_path / "in"
    root.mkdir()
    for s, rows in enumerate([slice(0, 150), slice(150, 400)]):
        feats = c.features[rows]
        write_columns(
            root / f"{s}.parquet",
            doc=pa.array(np.arange(400, dtype=np.int64)[rows] * 1000 + 7),
            q=pa.array(c.quality[rows, 0]),
            emb=pa.array(list(feats), type=pa.large_list(pa.float32())),
        )
    settings = SelectSpec.from_mapping(
        dict(id_col="doc", quality_cols=("q",), feature_col="emb", **FAST)
    )
    run_selection(root, tmp_path / "out", settings, progress=False)
    table = pq.read_table(tmp_path / "out" / "selected")
    assert table.schema.field("doc").type == pa.int64()
    assert all(v % 1000 == 7 for v in table.column("doc").to_pylist())
    groups = pq.read_table(tmp_path / "out" / "_work" / "groups")
    assert sorted(groups.column("doc").to_pylist()) == list(np.arange(400) * 1000 + 7)


def test_tiny_groups_keep_nothing_or_everything_and_still_sum_exactly(tmp_path):
    c = make_clustered(40, 8, 3, seed=2)
    write_shards(tmp_path / "in", c, 2, row_group_size=7)
    for ratio in (0.2, 0.9):
        tiny = dict(partition="chunk", chunk_size=3, n_epochs=5, select_ratio=ratio, n_neighbors=4)
        out = tmp_path / f"out-{ratio}"
        m = run_selection(
            tmp_path / "in",
            out,
            SelectSpec.from_mapping(dict(budget="group", **tiny)),
            progress=False,
        )
        ks = [g["k"] for g in m["groups"]]
        assert sum(ks) == len(selected_ids(out)) == round(ratio * 40)
        assert (0 in ks) if ratio == 0.2 else (3 in ks)
        # the global budget: every tiny group proposes at least one candidate
        out = tmp_path / f"global-{ratio}"
        m = run_selection(
            tmp_path / "in", out, SelectSpec.from_mapping(dict(**tiny)), progress=False
        )
        assert min(g["k"] for g in m["groups"]) >= 1
        assert len(set(selected_ids(out))) == m["totals"]["k"] == round(ratio * 40)


def test_cluster_partition_resumes_to_the_same_selection(shard_dir, tmp_path):
    settings = SelectSpec.from_mapping(
        dict(partition="cluster", n_clusters=3, chunk_size=400, **FAST)
    )
    out = tmp_path / "out"
    first = run_selection(shard_dir, out, settings, progress=False)
    before = selected_ids(out)
    # the plan phase's parts, which benchmarks/scale/plan.py calibrates on
    # (the check pass writes the spills: "spill" is what it left, none on a first run)
    assert set(first["partition"]["seconds"]) == {"check", "fit", "spill", "gather"}
    assert all(v >= 0 for v in first["partition"]["seconds"].values())
    clusters = out / "_work" / "clusters"
    tree_mtime = (clusters / "tree.npz").stat().st_mtime_ns
    # the spills are gone once gathered (a second copy of every row); their counts stay
    assert not list(clusters.glob("shard-*.parquet"))
    spilled = sum(pq.read_metadata(f).num_rows > 0 for f in list_shards(shard_dir))
    assert len(list(clusters.glob("shard-*.json"))) == spilled  # an empty shard has none
    # lose one shard's spill and every group result: the spill is redone, the tree is kept
    (clusters / "shard-00002.json").unlink()
    shutil.rmtree(out / "_work" / "completions")
    shutil.rmtree(out / "selected")
    again = run_selection(shard_dir, out, settings, progress=False)
    assert again["totals"]["groups_computed"] == first["totals"]["n_groups"]
    assert (clusters / "tree.npz").stat().st_mtime_ns == tree_mtime
    assert not list(clusters.glob("shard-*.parquet"))  # the redone spill is released too
    assert selected_ids(out) == before
    assert [g["n"] for g in again["groups"]] == [g["n"] for g in first["groups"]]


# --- equivalence with the single-process learner -----------------------------------------
def test_one_group_equals_single_process_learner(shard_dir, tmp_path, ray_runner):
    """One chunk spanning all shards = MaskLearner on the concatenated corpus."""
    settings = SelectSpec.from_mapping(dict(partition="chunk", chunk_size=10**6, **FAST))
    m = run_selection(shard_dir, tmp_path / "out", settings, runner=ray_runner, progress=False)
    assert m["partition"]["n_groups"] == 1
    parts = [read_corpus(f) for f in list_shards(shard_dir)]
    whole = Corpus(
        ids=np.concatenate([p.ids for p in parts]),
        quality=np.concatenate([p.quality for p in parts]),
        features=np.concatenate([p.features for p in parts]),
    )
    ref = settings.make_selector(seed=0, device="cpu").fit(whole)
    assert isinstance(ref, MaskLearner)
    expected = sorted(whole.ids[ref.selected_].tolist())
    assert selected_ids(tmp_path / "out") == expected
    rows = pq.read_table(tmp_path / "out" / "_work" / "groups" / "00000.parquet")
    np.testing.assert_array_equal(rows.column("logit").to_numpy(), ref.logits_)


def test_a_corpus_that_fits_one_group_is_not_clustered(shard_dir, tmp_path):
    """The default ``--partition cluster`` over a corpus of at most ``--chunk-size`` rows:
    no k-means, no spill, no gathered copy (``WORK/clusters`` is never made); the group
    is the shards in order, so the run selects what one chunk over every shard does."""
    n = sum(pq.read_metadata(f).num_rows for f in list_shards(shard_dir))
    runs = {}
    for partition in ("cluster", "chunk"):
        spec = SelectSpec.from_mapping(dict(partition=partition, chunk_size=n, **FAST))
        out = tmp_path / partition
        runs[partition] = run_selection(shard_dir, out, spec, progress=False)
        assert runs[partition]["partition"]["n_groups"] == 1
    assert not (tmp_path / "cluster" / "_work" / "clusters").exists()
    assert runs["cluster"]["partition"]["one_group"] is True
    assert selected_ids(tmp_path / "cluster") == selected_ids(tmp_path / "chunk")
    # one row more than the chunk size: clustered again, as before
    spec = SelectSpec.from_mapping(dict(partition="cluster", chunk_size=n - 1, **FAST))
    run_selection(shard_dir, tmp_path / "two", spec, progress=False)
    assert (tmp_path / "two" / "_work" / "clusters" / "tree.npz").exists()


@pytest.mark.slow  # the folder runs in the local process pool (one worker per core)
def test_cli_directory_of_one_shard_equals_single_file(shard_dir, tmp_path, capsys):
    main = cli_main()
    one = tmp_path / "one"
    one.mkdir()
    shutil.copy(list_shards(shard_dir)[0], one / "only.parquet")
    flags = [
        "--select-ratio",
        "0.2",
        "--n-epochs",
        "20",
        "--n-neighbors",
        "16",
        "--device",
        "cpu",
        "--no-progress",
    ]
    assert (
        main(
            [
                "select",
                "--input",
                str(one / "only.parquet"),
                "--output",
                str(tmp_path / "single.parquet"),
                *flags,
            ]
        )
        == 0
    )
    assert (
        main(
            [
                "select",
                "--input",
                str(one),
                "--output",
                str(tmp_path / "sharded"),
                "--runner",
                "local",
                *flags,
            ]
        )
        == 0
    )
    single = pq.read_table(tmp_path / "single.parquet").to_pydict()
    expected = sorted(i for i, s in zip(single["chunk_id"], single["selected"], strict=True) if s)
    assert selected_ids(tmp_path / "sharded") == expected
    out = capsys.readouterr().out
    assert "docs/s" in out
    # the objective over every document, as the one-file run states it of the same rows
    single_j, sharded_j = re.findall(r"quality=\S+  facility=\S+  J=\S+", out)
    assert sharded_j == single_j
    manifest = json.loads((tmp_path / "sharded" / "manifest.json").read_text())
    summary = json.loads((tmp_path / "single.summary.json").read_text())
    assert manifest["terms"]["J"] == pytest.approx(summary["terms"]["J"], abs=1e-6)


# --- resume ---------------------------------------------------------------------------------
KILLER = textwrap.dedent(
    """
    import os, signal, sys
    import datamask.distributed.combine.allocate as allocate
    import datamask.distributed.engine as engine
    import datamask.distributed.runner as runner
    from datamask.config import SelectSpec
    from datamask.distributed import run_selection

    real = runner.atomic_write_json
    markers = []

    def write_then_die(obj, path):
        if path.name.endswith(".want.json"):  # a group cut off by its candidates
            markers.append(path)
            if {when!r} == "extend":  # the wish is written, the old marker still there
                real(obj, path)
                os.kill(os.getpid(), signal.SIGKILL)
        elif {when!r} == "reproposed" and any(".want" in p.name for p in markers):
            if "completions" in str(path):  # the group proposed more, its marker not written
                os.kill(os.getpid(), signal.SIGKILL)
        if path.parent.name == "clusters" and path.name == "shard-00001.json":
            if {when!r} == "plan":  # the spill: shard 1's rows written, its marker not
                os.kill(os.getpid(), signal.SIGKILL)
        if path.parent.name == "exchange":  # the exchange round: 2 groups re-priced
            markers.append(path)
            if {when!r} == "exchange" and sum(p.parent.name == "exchange" for p in markers) == 2:
                os.kill(os.getpid(), signal.SIGKILL)
        if "completions" in str(path):
            markers.append(path)
            # round 1: group 2's files are in place, its marker is not;
            # round 2: the kept parts are in place, the round's marker is not.
            if ({when!r} == "round1" and len(markers) == 3) or (
                {when!r} == "round2" and path.name == "global"
            ):
                os.kill(os.getpid(), signal.SIGKILL)
        real(obj, path)

    # every step's marker (engine), the allocation's wishes and marker, the manifest
    runner.atomic_write_json = engine.atomic_write_json = write_then_die
    allocate.atomic_write_json = write_then_die
    settings = SelectSpec.from_mapping(
        dict(partition={partition!r}, chunk_size=250, budget={budget!r}, **{fast})
    )
    run_selection(sys.argv[1], sys.argv[2], settings, progress=False)
    """
)


def kill_during(
    when: str, budget: str, shard_dir: Path, out: Path, tmp_path: Path, partition: str = "chunk"
) -> None:
    script = tmp_path / f"killer-{when}-{budget}-{partition}.py"
    script.write_text(KILLER.format(fast=repr(FAST), when=when, budget=budget, partition=partition))
    proc = subprocess.run(
        [sys.executable, str(script), str(shard_dir), str(out)],
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert proc.returncode == -signal.SIGKILL, proc.stderr
    if when == "plan":  # the spills are written by the check pass, before the claim
        assert not (out / "manifest.json").exists()
    else:
        assert not json.loads((out / "manifest.json").read_text())["complete"]


@pytest.fixture(scope="module")
def clean_run(shard_dir, tmp_path_factory):
    """``clean_run(budget, partition)``: (manifest, output) of the uninterrupted run the
    resume tests compare with, made once per combination (five of the eight cases share
    ("global", "cluster")); the tests only read it."""
    made: dict[tuple[str, str], tuple[dict, Path]] = {}

    def clean(budget: str, partition: str) -> tuple[dict, Path]:
        if (budget, partition) not in made:
            out = tmp_path_factory.mktemp(f"clean-{budget}-{partition}") / "clean"
            settings = SelectSpec.from_mapping(
                dict(partition=partition, chunk_size=250, budget=budget, **FAST)
            )
            made[budget, partition] = run_selection(shard_dir, out, settings, progress=False), out
        return made[budget, partition]

    return clean


@pytest.mark.parametrize(
    "when, budget, partition",
    [
        ("plan", "global", "cluster"),  # in the partition's spill
        ("round1", "group", "chunk"),
        ("round1", "global", "chunk"),
        ("round2", "global", "chunk"),  # the central round
        ("round2", "global", "cluster"),  # allocated by gains
        ("extend", "global", "cluster"),  # ... a group asked to propose more
        ("reproposed", "global", "cluster"),  # ... and killed while it does
        ("exchange", "global", "cluster"),  # ... killed in the exchange round
    ],
)
@pytest.mark.slow
def test_resume_after_a_killed_run(
    when, budget, partition, shard_dir, tmp_path, ray_runner, clean_run
):
    settings = SelectSpec.from_mapping(
        dict(partition=partition, chunk_size=250, budget=budget, **FAST)
    )
    clean, clean_out = clean_run(budget, partition)
    n_groups = clean["totals"]["n_groups"]
    sizes = [g["n"] for g in clean["groups"]]
    submitted = [clean["groups"][i]["gid"] for i in largest_first(sizes)]

    out = tmp_path / "killed"
    kill_during(when, budget, shard_dir, out, tmp_path, partition)
    work = out / "_work"
    done = sorted(p.name for p in (work / "completions").glob("*"))
    if when == "plan":  # shard 0 spilled and marked, shard 1 spilled only, no group ran
        # (the resume fits and spills again: an unclaimed work dir's tree is not trusted)
        assert not done and not (out / "selected").exists()
        assert [p.name for p in (work / "clusters").glob("shard-*.json")] == ["shard-00000.json"]
        assert (work / "clusters" / "shard-00001.parquet").exists()
    elif when == "round1":  # steps run largest first: the first two marked, the third not
        assert done == sorted(f"{g:05d}" for g in submitted[:2])
        written = (
            out / "selected" / f"part-{submitted[2]:05d}.parquet"
            if budget == "group"
            else work / "candidates" / f"{submitted[2]:05d}.parquet"
        )
        assert written.exists()  # written, but not marked
    elif when in ("extend", "reproposed"):
        wants = sorted(p.name for p in (work / "candidates").glob("*.want.json"))
        assert wants and not (work / "completions" / "global").exists()
        assert clean["budget"]["global_round"]["rounds"] > 1
    elif when == "exchange":  # every group proposed, two re-priced, no allocation yet
        assert done == [f"{g:05d}" for g in range(n_groups)]
        assert len(list((work / "exchange").glob("*.json"))) == 1  # the second died writing
        assert not (work / "completions" / "global").exists()
    else:
        assert done == [f"{g:05d}" for g in range(n_groups)]  # every group, not the round
        parts = sorted(p.name for p in (out / "selected").glob("part-*.parquet"))
        if partition == "cluster":  # each group's kept prefix
            assert parts == [f"part-{g:05d}.parquet" for g in range(n_groups)]
            assert clean["budget"]["allocation"] == "gains"
        else:
            assert parts == ["part-global.parquet"]

    resumed = run_selection(shard_dir, out, settings, runner=ray_runner, progress=False)
    computed = [g["gid"] for g in resumed["groups"] if not g["reused"]]
    if when in ("extend", "reproposed"):  # only groups asked for more run again
        again_ids = {int(p.name[:5]) for p in (work / "candidates").glob("*.want.json")}
        assert set(computed) <= again_ids and computed
    elif when == "plan":
        assert computed == list(range(n_groups))
    else:
        assert computed == (sorted(submitted[2:]) if when == "round1" else [])
    if budget == "global":
        assert not resumed["budget"]["global_round"]["reused"]
    assert selected_ids(out) == selected_ids(clean_out)
    assert pq.read_table(out / "selected").equals(pq.read_table(clean_out / "selected"))

    # A finished run started again does nothing; a lost marker redoes only its group.
    (work / "completions" / "00005").unlink()
    again = run_selection(shard_dir, out, settings, runner=ray_runner, progress=False)
    assert [g["gid"] for g in again["groups"] if not g["reused"]] == [5]
    assert selected_ids(out) == selected_ids(clean_out)


def test_other_settings_in_the_same_work_dir_are_refused(shard_dir, tmp_path):
    settings = SelectSpec.from_mapping(dict(partition="shard", **FAST))
    run_selection(shard_dir, tmp_path / "out", settings, progress=False)
    changed = SelectSpec.from_mapping(dict(partition="shard", **{**FAST, "select_ratio": 0.2}))
    with pytest.raises(ValueError, match=r"other settings \(select_ratio 0.137 -> 0.2\)"):
        run_selection(shard_dir, tmp_path / "out", changed, progress=False)


# --- bad shards -----------------------------------------------------------------------------
def test_missing_shard_is_named_and_nothing_is_written(shard_dir, tmp_path):
    files = list_shards(shard_dir)[:2] + [tmp_path / "gone.parquet"]
    with pytest.raises(ValueError, match="gone.parquet' does not exist"):
        run_selection(
            files, tmp_path / "out", SelectSpec.from_mapping(dict(**FAST)), progress=False
        )
    assert not (tmp_path / "out").exists()


def test_corrupt_footer_is_named_and_nothing_is_written(shard_dir, tmp_path):
    root = tmp_path / "in"
    shutil.copytree(shard_dir, root)
    (root / "part-00003.parquet").write_bytes(b"not a parquet file at all")
    with pytest.raises(ValueError, match=r"cannot read '.*part-00003.parquet' as parquet"):
        run_selection(root, tmp_path / "out", SelectSpec.from_mapping(dict(**FAST)), progress=False)
    assert not (tmp_path / "out").exists()


def test_corrupt_page_fails_before_any_group(shard_dir, tmp_path, ray_runner):
    root = tmp_path / "in"
    shutil.copytree(shard_dir, root)
    bad = root / "part-00004.parquet"
    column = pq.ParquetFile(bad).metadata.row_group(0).column(2)
    data = bytearray(bad.read_bytes())
    start = column.data_page_offset
    data[start : start + 200] = b"\xab" * 200  # the footer stays intact: planning passes
    bad.write_bytes(bytes(data))
    out = tmp_path / "out"
    with pytest.raises(ValueError, match=r"cannot read '.*part-00004.parquet' as parquet"):
        run_selection(
            root, out, SelectSpec.from_mapping(dict(**FAST)), runner=ray_runner, progress=False
        )
    assert not out.exists()  # found by the validation pass: no group ran, nothing written


def test_worker_count_does_not_change_a_bit(shard_dir, tmp_path, ray_runner):
    settings = SelectSpec.from_mapping(dict(partition="chunk", chunk_size=450, **FAST))
    run_selection(shard_dir, tmp_path / "one", settings, runner=LocalRunner(), progress=False)
    run_selection(shard_dir, tmp_path / "many", settings, runner=ray_runner, progress=False)
    assert ray_runner.workers >= 2
    one = sorted((tmp_path / "one" / "_work" / "groups").glob("*.parquet"))
    many = sorted((tmp_path / "many" / "_work" / "groups").glob("*.parquet"))
    assert [p.name for p in one] == [p.name for p in many] and len(one) == 4
    for a, b in zip(one, many, strict=True):
        assert pq.read_table(a).equals(pq.read_table(b))  # logits, ranks: bit for bit


def test_bad_settings_fail_before_writing(shard_dir, tmp_path):
    with pytest.raises(ValueError, match="partition must be one of"):
        run_selection(
            shard_dir,
            tmp_path / "o",
            SelectSpec.from_mapping(dict(partition="rows")),
            progress=False,
        )
    with pytest.raises(ValueError, match="select_ratio must be in"):
        run_selection(
            shard_dir,
            tmp_path / "o",
            SelectSpec.from_mapping(dict(select_ratio=1.5)),
            progress=False,
        )
    with pytest.raises(ValueError, match="column 'score' not found in .*part-00000.parquet"):
        run_selection(
            shard_dir,
            tmp_path / "o",
            SelectSpec.from_mapping(dict(quality_cols=("score",))),
            progress=False,
        )
    assert not (tmp_path / "o").exists()


@pytest.mark.parametrize("algorithm", ["Facility", "Pair_simi"])
def test_cli_selected_only_states_no_objective_over_every_document(
    algorithm, shard_dir, tmp_path, capsys
):
    """Without a cover (``--selected-only``) there is no J over every document to print;
    pairwise similarity's central round has terms of its own, which are not it."""
    argv = ["select", "--input", str(shard_dir), "--output", str(tmp_path / "out")]
    argv += ["--runner", "local", "--workers", "1", "--selected-only", "--no-progress"]
    argv += ["--algorithm", algorithm, "--select-ratio", "0.2", "--n-epochs", "5"]
    argv += ["--partition", "shard"]  # a group per shard: the central round of Pair_simi
    assert cli_main()(argv) == 0
    out = capsys.readouterr().out
    assert "docs/s overall" in out and "over every document" not in out


def test_cli_bad_shard_exits_2_naming_it(shard_dir, tmp_path, capsys):
    main = cli_main()
    root = tmp_path / "in"
    shutil.copytree(shard_dir, root)
    (root / "part-00001.parquet").write_bytes(b"\x00" * 64)
    code = main(
        [
            "select",
            "--input",
            str(root),
            "--output",
            str(tmp_path / "out"),
            "--runner",
            "local",
            "--no-progress",
        ]
    )
    assert code == 2
    assert "part-00001.parquet" in capsys.readouterr().err


def test_make_runner_defaults_to_a_local_pool():
    from datamask.api import make_runner
    from datamask.distributed import RayRunner
    from datamask.distributed.executors import available_cpus

    def runner(**run):
        return make_runner(SelectSpec.from_mapping(run))

    default = runner()
    assert isinstance(default, LocalRunner) and default.workers == available_cpus()
    assert runner(runner="local", workers=4).workers == 4
    assert isinstance(runner(workers=2, ray_address="auto"), RayRunner)  # --ray-address: Ray
    with pytest.raises(ValueError, match="needs --runner ray"):
        runner(runner="local", ray_address="auto")
    with pytest.raises(ValueError, match="workers must be > 0"):
        runner(workers=0)


def test_ray_runner_without_gpus_refuses_use_gpus(ray_runner):
    from datamask.distributed import RayRunner

    if ray_runner.n_gpus:
        pytest.skip("this machine has GPUs")
    assert ray_runner.describe()["gpus_per_task"] == 0
    with pytest.raises(ValueError, match="reports no GPUs"):
        RayRunner(use_gpus=True)


@pytest.mark.skipif(not __import__("torch").cuda.is_available(), reason="needs a CUDA GPU")
def test_gpu_workers_select_on_cuda(shard_dir, tmp_path, ray_runner):
    m = run_selection(
        shard_dir,
        tmp_path / "out",
        SelectSpec.from_mapping(dict(**FAST)),
        runner=ray_runner,
        progress=False,
    )
    assert all(d.startswith("cuda") for d in m["summary"]["devices"])
    assert ray_runner.describe()["gpus_per_task"] == 1
    assert m["summary"]["gpu_peak_mb_per_worker"] > 0


# --- global budget: one quality scale, exact count for every method, same on any runner ------
def write_skewed(root: Path, n: int = 300, dim: int = 16) -> None:
    """Two shards of similar documents: one scored in [0, 1], the other in [9, 10]."""
    root.mkdir(parents=True, exist_ok=True)
    c = make_clustered(2 * n, dim, 4, seed=3)
    rng = np.random.default_rng(0)
    for s, (lo, prefix) in enumerate([(0.0, "low"), (9.0, "high")]):
        rows = slice(s * n, (s + 1) * n)
        feats = np.asarray(c.features[rows], dtype=np.float32)
        table = reference_table([f"{prefix}-{i:04d}" for i in range(n)], lo + rng.random(n), feats)
        write(table, root / f"part-{s:05d}.parquet")


def test_corpus_quality_range_scales_like_the_whole_corpus():
    c = Corpus(ids=np.arange(3), quality=[0.0, 0.5, 1.0], features=np.eye(3, dtype=np.float32))
    assert c.normalized_quality().tolist() == [0.0, 0.5, 1.0]
    c.quality_range = (np.array([0.0]), np.array([10.0]))
    np.testing.assert_allclose(c.normalized_quality(), [0.0, 0.05, 0.1])


def test_global_scaling_two_skewed_shards(tmp_path):
    write_skewed(tmp_path / "in")
    # one group per shard: the shards are the two quality levels
    fast = dict(n_epochs=20, select_ratio=0.5, n_neighbors=16, device="cpu", partition="shard")
    shares = {}
    for budget in ("group", "global"):
        m = run_selection(
            tmp_path / "in",
            tmp_path / budget,
            SelectSpec.from_mapping(dict(budget=budget, **fast)),
            progress=False,
        )
        ids = selected_ids(tmp_path / budget)
        assert len(ids) == 300 == m["totals"]["k"]
        shares[budget] = sum(i.startswith("high") for i in ids) / len(ids)
        assert m["budget"]["quality_range"]["quality_score"][1] > 9.9  # the corpus-wide max
    assert shares["group"] == 0.5  # each shard keeps its proportional share
    assert shares["global"] > 0.9  # one ranking: the high-quality shard wins
    # each group scaled by the corpus-wide range: topk's scores are that scaled quality
    run_selection(
        tmp_path / "in",
        tmp_path / "topk",
        SelectSpec.from_mapping(dict(method="topk", budget="group", **fast)),
        progress=False,
    )
    groups = tmp_path / "topk" / "_work" / "groups"
    low = pq.read_table(groups / "00000.parquet").column("logit").to_numpy()
    high = pq.read_table(groups / "00001.parquet").column("logit").to_numpy()
    assert low.max() <= 0.1 + 1e-6 and high.min() >= 0.9 - 1e-6


METHODS = ["mask", "greedy", "greedy-dense", "stochastic-greedy", "disf-greedy", "topk", "random"]


@pytest.mark.parametrize("method", METHODS)
def test_exact_global_count_for_every_method(method, shard_dir, corpus, tmp_path):
    settings = SelectSpec.from_mapping(
        dict(method=method, partition="chunk", chunk_size=450, **FAST)
    )
    m = run_selection(shard_dir, tmp_path / "out", settings, progress=False)
    k_total = round(FAST["select_ratio"] * N_SHARDS * ROWS)
    ids = selected_ids(tmp_path / "out")
    assert len(ids) == len(set(ids)) == k_total == m["totals"]["k"]
    assert set(ids) <= set(corpus.ids)
    assert m["budget"]["mode"] == "global" and m["budget"]["method"] == method
    if method == "topk":  # exactly the global top k of the corpus-wide quality (ties by id)
        q = corpus.normalized_quality().astype(np.float32)
        expected = corpus.ids[np.lexsort((corpus.ids, -q.astype(np.float64)))[:k_total]]
        assert ids == sorted(expected.tolist())
    if method == "random":  # a seeded uniform draw per id: the partition does not matter
        other = SelectSpec.from_mapping(dict(method=method, partition="shard", **FAST))
        run_selection(shard_dir, tmp_path / "by-shard", other, progress=False)
        assert selected_ids(tmp_path / "by-shard") == ids
        reseeded = SelectSpec.from_mapping(
            dict(method=method, partition="chunk", chunk_size=450, **{**FAST, "seed": 1})
        )
        run_selection(shard_dir, tmp_path / "seed-1", reseeded, progress=False)
        assert selected_ids(tmp_path / "seed-1") != ids


def test_identical_across_worker_counts_and_runners(shard_dir, tmp_path, ray_runner, local_pool):
    settings = SelectSpec.from_mapping(dict(partition="chunk", chunk_size=450, **FAST))
    for name, runner in [("one", LocalRunner()), ("pool", local_pool), ("ray", ray_runner)]:
        run_selection(shard_dir, tmp_path / name, settings, runner=runner, progress=False)
    ref = pq.read_table(tmp_path / "one" / "selected")
    assert ref.num_rows == round(FAST["select_ratio"] * N_SHARDS * ROWS)
    for name in ("pool", "ray"):
        assert pq.read_table(tmp_path / name / "selected").equals(ref), name  # ranks, logits
        for a in sorted((tmp_path / "one" / "_work" / "candidates").glob("*.parquet")):
            b = tmp_path / name / "_work" / "candidates" / a.name
            assert pq.read_table(a).equals(pq.read_table(b)), (name, a.name)
    manifest = json.loads((tmp_path / "pool" / "manifest.json").read_text())
    pids = {g["pid"] for g in manifest["groups"]}
    assert len(pids) >= 1 and os.getpid() not in pids  # the pool ran the groups


RAY_AFTER_CHECKS = textwrap.dedent(
    """
    import sys
    import ray
    from datamask.config import SelectSpec
    from datamask.distributed import RayRunner, run_selection

    runner = RayRunner(workers=1)
    try:
        run_selection(sys.argv[1], sys.argv[2], SelectSpec(), runner=runner, progress=False)
    except ValueError as exc:
        print("refused:", exc)
    print("ray started:", ray.is_initialized())
    """
)


@pytest.mark.slow
def test_bad_input_fails_before_ray_starts(shard_dir, tmp_path):
    root = tmp_path / "in"
    shutil.copytree(shard_dir, root)
    (root / "part-00003.parquet").write_bytes(b"not a parquet file at all")
    script = tmp_path / "ray_after_checks.py"
    script.write_text(RAY_AFTER_CHECKS)
    proc = subprocess.run(
        [sys.executable, str(script), str(root), str(tmp_path / "out")],
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert "refused: cannot read" in proc.stdout, proc.stderr
    assert "ray started: False" in proc.stdout


def test_a_group_proposing_again_reuses_its_saved_graph(shard_dir, tmp_path, monkeypatch):
    """Groups whose whole curve was kept propose again, twice as many: on the graph their
    first proposal saved for the exchange round, not a new build. The same K's columns of
    an exact graph are the graph a new build gives, so the selection is the same as when
    every proposal builds its own (the saved graph hidden from the select step)."""
    import datamask.distributed.select.steps as steps

    settings = SelectSpec.from_mapping(
        dict(partition="cluster", chunk_size=250, budget="global", **FAST)
    )
    reused = run_selection(shard_dir, tmp_path / "reused", settings, progress=False)
    assert reused["budget"]["global_round"]["rounds"] > 1  # some group proposed again
    again = [g for g in reused["groups"] if g["graph_reused"]]
    assert again and all(g["graph_reused"] is False for g in reused["groups"] if g not in again)
    assert all(g["seconds"]["fit_graph"] == 0.0 for g in again)  # given: no graph built
    # the manifest counts both proposals: the first's graph and seconds are kept
    assert all(e["seconds"]["fit_graph"] > 0 for g in again for e in g["earlier"])
    assert not any("earlier" in g for g in reused["groups"] if g not in again)
    every = sum(step_seconds(g, "total") for g in reused["groups"])
    assert reused["summary"]["group_seconds"]["sum"] == pytest.approx(every)
    assert every > sum(g["seconds"]["total"] for g in reused["groups"])
    monkeypatch.setattr(steps, "saved_graph", lambda path: None)
    built = run_selection(shard_dir, tmp_path / "built", settings, progress=False)
    assert not any(g["graph_reused"] for g in built["groups"])
    assert selected_ids(tmp_path / "reused") == selected_ids(tmp_path / "built")


def test_a_capped_run_recomputes_a_group_whose_ranking_is_gone(shard_dir, tmp_path):
    """The cap across groups walks every group's ranked rows (WORK/groups/): a group whose
    file is gone is computed again on resume, not reused from its marker (which then
    failed: "input file .../_work/groups/00000.parquet does not exist")."""
    settings = SelectSpec.from_mapping(dict(max_similarity=0.95, budget="group", **FAST))
    out = tmp_path / "out"
    first = run_selection(shard_dir, out, settings, progress=False)
    (out / "_work" / "groups" / "00000.parquet").unlink()
    again = run_selection(shard_dir, out, settings, progress=False)
    assert again["selection_digest"] == first["selection_digest"]
    assert again["totals"]["groups_reused"] == again["totals"]["n_groups"] - 1
