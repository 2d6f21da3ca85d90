"""datamask inside NeMo Curator: Curator's own writer makes the input, a real Curator
executor on a local Ray runs the workflow, and its selection is ``datamask select``'s."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest

pytest.importorskip("nemo_curator")

import datamask  # noqa: E402
from datamask.io.keep import read_selected_ids  # noqa: E402
from tests._data import ROOT  # noqa: E402

SRC = str(Path(datamask.__file__).resolve().parents[1])  # this checkout, for every worker
SHARED_DEMO = ROOT.parent / "shared" / "data" / "demo_docs.parquet"
EXAMPLE_DIR = ROOT / "examples" / "curator"  # curator_pipeline.py: PreEmbedded, the example
N_SHARDS = 4
#: Small and fast: about 4 groups of 520 rows, a short learner.
EXTRA = dict(n_epochs=20, n_neighbors=16)
#: Xenna schedules int(CPUs x cpu_allocation_percentage) CPUs (default 0.95: 1 of 2 here).
XENNA_CONFIG = {"cpu_allocation_percentage": 1.0}


@pytest.fixture(scope="module")
def cluster():
    """One local Ray (2 CPUs, dashboard on: Xenna asks its state API) for the module."""
    from datamask.integrations.curator import local_ray_cluster

    saved = os.environ.get("PYTHONPATH")
    # Ray's workers import datamask from this checkout and the example's stage by name.
    os.environ["PYTHONPATH"] = os.pathsep.join([SRC, str(EXAMPLE_DIR)])
    sys.path.insert(0, str(EXAMPLE_DIR))
    try:
        with local_ray_cluster(num_cpus=2) as address:
            yield address
    finally:
        sys.path.remove(str(EXAMPLE_DIR))
        if saved is None:
            os.environ.pop("PYTHONPATH", None)
        else:
            os.environ["PYTHONPATH"] = saved


@pytest.fixture(scope="module")
def curator_files(cluster, tmp_path_factory) -> tuple[Path, Path]:
    """Embedding files written by Curator's own ParquetWriter, through its executor."""
    from curator_pipeline import split_corpus, write_embeddings  # the example's steps

    if not SHARED_DEMO.exists():
        pytest.skip(f"{SHARED_DEMO} not present")
    root = tmp_path_factory.mktemp("curator")
    split_corpus(SHARED_DEMO, root / "raw", N_SHARDS)
    write_embeddings(root / "raw", root / "embeddings", "id")  # Curator's ParquetWriter
    return root / "raw", root / "embeddings"


@pytest.mark.slow  # starts Ray
def test_curator_writer_layout_is_read_by_the_curator_preset(curator_files):
    _, emb = curator_files
    files = sorted(emb.glob("*.parquet"))
    assert len(files) == N_SHARDS
    schema = pq.read_schema(files[0])
    # What Curator's embedders write: a variable-length list of doubles (tolist()).
    assert pa.types.is_list(schema.field("embeddings").type)
    cols = datamask.Columns(preset="curator").resolve(schema.names)
    assert (cols.id_col, cols.quality_cols, cols.feature_col) == (
        "id", ("fineweb-edu-score-float",), "embeddings"
    )


@pytest.mark.slow  # starts Ray
def test_workflow_through_xenna_equals_datamask_select(curator_files, tmp_path):
    from nemo_curator.backends.ray_data import RayDataExecutor
    from nemo_curator.backends.xenna import XennaExecutor
    from nemo_curator.stages.text.deduplication.removal_workflow import (
        TextDuplicatesRemovalWorkflow,
    )

    from datamask.cli import main
    from datamask.integrations.curator import DatamaskSelectionWorkflow

    raw, emb = curator_files
    cli_out = tmp_path / "cli"
    argv = ["select", "--input", str(emb), "--output", str(cli_out), "--preset", "curator",
            "--select-ratio", "0.1", "--seed", "0", "--n-epochs", "20", "--n-neighbors", "16",
            "--no-progress"]  # fmt: skip
    assert main(argv) == 0
    workflow = DatamaskSelectionWorkflow(
        input_path=str(emb), output_path=str(tmp_path / "wf"), id_field="id",
        select_ratio=0.1, seed=0, select_kwargs=EXTRA,
    )  # fmt: skip
    result = workflow.run(XennaExecutor(config=XENNA_CONFIG))
    meta = result.metadata

    expected = np.sort(read_selected_ids(cli_out, "id").to_numpy(zero_copy_only=False))
    got = np.sort(read_selected_ids(meta["selection_path"], "id").to_numpy(zero_copy_only=False))
    assert len(expected) == round(0.1 * 2077) == meta["n_selected"]
    np.testing.assert_array_equal(got, expected)
    assert meta["executor"] == "XennaExecutor"
    steps = {p["step"] for p in meta["pipelines"]}
    assert {"scan_step", "_removal_ids_step"} <= steps, steps  # every phase ran in Curator

    # The ids to remove: every other id, sorted per part, one `id` column.
    parts = sorted(Path(meta["ids_to_remove_path"]).glob("part.*.parquet"))
    removed = pa.concat_tables([pq.read_table(p) for p in parts])
    assert removed.column_names == ["id"]
    all_ids = pq.read_table(emb, columns=["id"]).column("id").to_numpy(zero_copy_only=False)
    np.testing.assert_array_equal(
        np.sort(removed.column("id").to_numpy(zero_copy_only=False)),
        np.setdiff1d(all_ids, expected),
    )
    assert meta["n_removed"] == 2077 - len(expected)

    # Curator's own removal workflow on the raw shards keeps exactly the selection (on Ray
    # Data: its reader, removal and writer stages ask Xenna for 3.5 CPUs, more than 2).
    kept_dir = tmp_path / "kept"
    TextDuplicatesRemovalWorkflow(
        input_path=str(raw), ids_to_remove_path=meta["ids_to_remove_path"],
        output_path=str(kept_dir), id_field="id", input_files_per_partition=1,
    ).run(RayDataExecutor())  # fmt: skip
    kept = pq.read_table(kept_dir, columns=["id"]).column("id").to_numpy(zero_copy_only=False)
    np.testing.assert_array_equal(np.sort(kept), expected)


@pytest.mark.slow  # starts Ray
def test_example_runs_from_the_shared_demo(tmp_path):
    """examples/curator/curator_pipeline.py end to end, with its own local Ray."""
    if not SHARED_DEMO.exists():
        pytest.skip(f"{SHARED_DEMO} not present")
    env = {k: v for k, v in os.environ.items() if k != "RAY_ADDRESS"}
    env["PYTHONPATH"] = os.pathsep.join([SRC, str(EXAMPLE_DIR)])
    proc = subprocess.run(
        [sys.executable, str(EXAMPLE_DIR / "curator_pipeline.py"), "--input", str(SHARED_DEMO),
         "--work", str(tmp_path / "work"), "--cpus", "2"],
        capture_output=True, text=True, env=env, timeout=580, cwd=tmp_path,
    )  # fmt: skip
    assert proc.returncode == 0, proc.stderr[-3000:]
    kept = pq.read_table(tmp_path / "work" / "kept")
    assert kept.num_rows == round(0.1 * 2077)
    assert {"id", "text", "quality_score"} <= set(kept.column_names)  # every column kept


def test_bad_arguments_are_refused_at_the_door(tmp_path):
    from datamask.integrations.curator import CuratorRunner, DatamaskSelectionWorkflow

    with pytest.raises(ValueError, match=r"one of select_ratio and k; got select_ratio=0.1, k=5"):
        DatamaskSelectionWorkflow(str(tmp_path), str(tmp_path / "o"), select_ratio=0.1, k=5)
    with pytest.raises(ValueError, match="give one of select_ratio and k"):
        DatamaskSelectionWorkflow(str(tmp_path), str(tmp_path / "o"))
    with pytest.raises(TypeError, match="executor must be a Curator executor .* got LocalRunner"):
        CuratorRunner(datamask.distributed.LocalRunner())
    wf = DatamaskSelectionWorkflow(
        str(tmp_path), str(tmp_path / "o"), k=5, quality_fields="q", lamb=0.3, method="topk"
    )
    assert wf.select_settings() == {
        "preset": "curator", "id_col": "id", "feature_col": "embeddings", "seed": 0,
        "progress": False, "quality_col": ["q"], "k": 5, "lamb": 0.3, "method": "topk",
    }  # fmt: skip
