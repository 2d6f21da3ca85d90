"""One read of the corpus before the groups run (issue 43): the k-means tree is fitted on
its sample first, then the check pass writes each shard's spill from the rows it reads.

Real parquet shards and the runner's own steps on a local runner; nothing is mocked.
"""

from __future__ import annotations

from dataclasses import replace
from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from datamask import make_clustered
from datamask.config import SelectSpec
from datamask.distributed import LocalRunner, run_selection
from datamask.distributed.check.validate import ScanShard, scan_jobs
from datamask.distributed.engine import run_steps
from datamask.distributed.paths import WorkDir
from datamask.distributed.plan.partition import SpillShard
from datamask.distributed.plan.plan import fit_first, plan_partition, spill_jobs
from datamask.io.shards import inspect_shards, list_shards
from tests._data import write_corpus_shards

COLUMNS = dict(id_col="chunk_id", quality_cols=("quality_score",), feature_col="feature_arr")
FAST = dict(n_epochs=5, select_ratio=0.2, n_neighbors=8)


@pytest.fixture(scope="module")
def shards(tmp_path_factory) -> Path:
    folder = tmp_path_factory.mktemp("one-scan") / "in"
    corpus = make_clustered(n_docs=600, dim=8, n_clusters=6, seed=4)
    write_corpus_shards(folder, corpus, 3, row_group_size=64)
    return folder


def _copy(src: Path, dst: Path) -> Path:
    dst.mkdir(parents=True)
    for f in sorted(src.glob("*.parquet")):
        (dst / f.name).write_bytes(f.read_bytes())
    return dst


def _files(folder: Path) -> dict[str, bytes]:
    return {str(f.relative_to(folder)): f.read_bytes() for f in folder.rglob("*") if f.is_file()}


def test_the_check_pass_writes_the_spills_a_spill_step_writes(shards, tmp_path):
    settings = SelectSpec.from_mapping(dict(partition="cluster", chunk_size=150, **COLUMNS))
    infos = inspect_shards(list_shards(shards), columns=settings.read_columns)
    runner = LocalRunner(workers=1)
    # the spill steps on their own read of every shard (what the plan does without a scan)
    alone = WorkDir.of(tmp_path / "alone")
    fit_first(infos, settings, alone, runner, progress=False)
    run_steps(runner, SpillShard(), spill_jobs(infos, settings, alone), progress=False)
    # the check pass, spilling every shard from the rows it checks
    work = WorkDir.of(tmp_path / "scan")
    fitted = fit_first(infos, settings, work, runner, progress=False)
    spills = {j.shard: j for j in spill_jobs(infos, settings, work)}
    jobs = scan_jobs(infos, settings, work)
    jobs = [replace(job, spill=spills[job.index]) for job in jobs]
    run_steps(runner, ScanShard(), jobs, progress=False)
    for s in range(len(infos)):
        by_scan = pq.read_table(work.spill(s))
        by_step = pq.read_table(alone.spill(s))
        assert by_scan.num_rows == infos[s].num_rows
        assert by_scan.equals(by_step)
    # the plan finds every spill done: no shard is read or spilled again
    markers = sorted(work.clusters().glob("shard-*.json"))
    assert len(markers) == len(infos)
    stamps = {m: m.stat().st_mtime_ns for m in markers}
    plan, facts = plan_partition(infos, settings, work, runner, False, fitted)
    plan_alone, _ = plan_partition(infos, settings, alone, runner, progress=False)
    assert {m: m.stat().st_mtime_ns for m in markers} == stamps
    assert [(label, [(p.start, p.stop) for p in pieces]) for label, pieces in plan] == [
        (label, [(p.start, p.stop) for p in pieces]) for label, pieces in plan_alone
    ]
    assert facts["kmeans"] == fitted["kmeans"]
    runner.close()


def _with_column(path: Path, name: str, values: np.ndarray) -> None:
    table = pq.read_table(path)
    i = table.schema.get_field_index(name)
    table = table.set_column(i, name, pa.array(values, type=table.schema.field(name).type))
    pq.write_table(table, path, row_group_size=64)


def test_a_row_the_sample_refuses_is_named_as_the_check_names_it(shards, tmp_path):
    data = _copy(shards, tmp_path / "in")
    path = sorted(data.glob("*.parquet"))[1]
    feats = pq.read_table(path).column("feature_arr").to_pylist()
    feats[70][3] = float("nan")  # row 70: in the k-means sample (the whole corpus here)
    _with_column(path, "feature_arr", np.asarray(feats, dtype=np.float32).tolist())
    messages = []
    for partition in ("cluster", "shard"):  # the shard partition fits nothing
        settings = SelectSpec.from_mapping(dict(partition=partition, chunk_size=150, **FAST))
        out = tmp_path / f"out-{partition}"
        with pytest.raises(ValueError, match="NaN/inf") as refused:
            run_selection(data, out, settings, progress=False)
        assert not out.exists()  # the tree, the spills and the id buckets went with it
        messages.append(str(refused.value))
    assert messages[0] == messages[1]
    assert f"first at row 70 of {path}" in messages[0]


def test_a_run_refused_after_the_fit_leaves_nothing(shards, tmp_path):
    data = _copy(shards, tmp_path / "in")
    path = sorted(data.glob("*.parquet"))[2]
    quality = pq.read_table(path).column("quality_score").to_numpy().copy()
    quality[5] = np.nan  # the fit reads embeddings only: the check refuses it
    _with_column(path, "quality_score", quality)
    settings = SelectSpec.from_mapping(dict(partition="cluster", chunk_size=150, **FAST))
    out = tmp_path / "out"
    with pytest.raises(ValueError, match="quality_score"):
        run_selection(data, out, settings, progress=False)
    assert not out.exists()


def test_a_refused_resume_changes_nothing_of_the_run(shards, tmp_path):
    data = _copy(shards, tmp_path / "in")
    settings = SelectSpec.from_mapping(dict(partition="cluster", chunk_size=150, **FAST))
    out = tmp_path / "out"
    first = run_selection(data, out, settings, progress=False)
    before = _files(out)
    assert not list((out / "_work" / "clusters").glob("shard-*.parquet"))  # released
    path = sorted(data.glob("*.parquet"))[0]
    quality = pq.read_table(path).column("quality_score").to_numpy()[::-1].copy()
    _with_column(path, "quality_score", quality)  # the same values, in place, reordered
    with pytest.raises(ValueError, match=f"content of {path.name} changed"):
        run_selection(data, out, settings, progress=False)
    assert _files(out) == before  # no spill written again, no tree fitted again
    assert first["totals"]["k"] == 120


def test_what_a_run_killed_before_its_claim_left_is_not_trusted(shards, tmp_path):
    settings = SelectSpec.from_mapping(dict(partition="cluster", chunk_size=150, **FAST))
    clean = tmp_path / "clean"
    run_selection(shards, clean, settings, progress=False)
    # a run of other settings killed in its check pass: its tree and a spill, no claim
    out = tmp_path / "out"
    other = SelectSpec.from_mapping(dict(partition="cluster", chunk_size=400, **COLUMNS, **FAST))
    infos = inspect_shards(list_shards(shards), columns=other.read_columns)
    runner = LocalRunner(workers=1)
    fit_first(infos, other, WorkDir.of(out), runner, progress=False)
    run_steps(runner, SpillShard(), spill_jobs(infos, other, WorkDir.of(out))[:1], progress=False)
    runner.close()
    assert not (out / "_work" / "settings.json").exists()
    run_selection(shards, out, settings, progress=False)
    got = pq.read_table(out / "selected").sort_by("chunk_id")
    assert got.equals(pq.read_table(clean / "selected").sort_by("chunk_id"))
