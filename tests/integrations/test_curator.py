"""datamask inside NeMo Curator: Curator's own writer makes the input, a real Curator
executor on a local Ray runs the workflow, and its selection is ``datamask select``'s."""

from __future__ import annotations

import os
from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest

pytest.importorskip("nemo_curator")

import datamask  # noqa: E402
from datamask.io.keep import read_selected_ids  # noqa: E402
from tests._data import ROOT  # noqa: E402

pytestmark = pytest.mark.slow

SRC = str(Path(datamask.__file__).resolve().parents[1])  # this checkout, for every worker
SHARED_DEMO = ROOT.parent / "shared" / "data" / "demo_docs.parquet"
N_SHARDS = 4
#: Small and fast: about 4 groups of 520 rows, a short learner.
SETTINGS = dict(select_ratio=0.1, seed=0, n_epochs=20, n_neighbors=16)
EXTRA = dict(n_epochs=20, n_neighbors=16)


@pytest.fixture(scope="module")
def cluster():
    """One local Ray (2 CPUs, dashboard on: Xenna asks its state API) for the module."""
    from datamask.integrations.curator import local_ray_cluster

    saved = os.environ.get("PYTHONPATH")
    os.environ["PYTHONPATH"] = os.pathsep.join([SRC, str(ROOT)])  # workers import both
    try:
        with local_ray_cluster(num_cpus=2) as address:
            yield address
    finally:
        if saved is None:
            os.environ.pop("PYTHONPATH", None)
        else:
            os.environ["PYTHONPATH"] = saved


def _raw_shards(folder: Path) -> Path:
    """The demo as a user's corpus: id, text, a quality score and an embedding, 4 shards."""
    if not SHARED_DEMO.exists():
        pytest.skip(f"{SHARED_DEMO} not present")
    table = pq.read_table(SHARED_DEMO, columns=["id", "text", "quality_score", "embedding"])
    folder.mkdir(parents=True)
    bounds = np.linspace(0, table.num_rows, N_SHARDS + 1).astype(int)
    for i in range(N_SHARDS):
        part = table.slice(bounds[i], bounds[i + 1] - bounds[i])
        pq.write_table(part, folder / f"raw-{i}.parquet")
    return folder


@pytest.fixture(scope="module")
def curator_files(cluster, tmp_path_factory) -> tuple[Path, Path]:
    """Embedding files written by Curator's own ParquetWriter, through its executor."""
    from nemo_curator.backends.ray_data import RayDataExecutor
    from nemo_curator.pipeline import Pipeline
    from nemo_curator.stages.text.io.reader import ParquetReader
    from nemo_curator.stages.text.io.writer import ParquetWriter

    from tests.integrations.curator_stages import PreEmbedded

    root = tmp_path_factory.mktemp("curator")
    raw = _raw_shards(root / "raw")
    emb = root / "embeddings"
    pipeline = Pipeline(name="embed")
    pipeline.add_stage(ParquetReader(file_paths=str(raw), files_per_partition=1))
    pipeline.add_stage(PreEmbedded())
    pipeline.add_stage(
        ParquetWriter(
            path=str(emb), fields=["id", "embeddings", "fineweb-edu-score-float"]
        )
    )
    pipeline.run(RayDataExecutor())
    return raw, emb


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


def test_workflow_through_xenna_equals_datamask_select(curator_files, tmp_path):
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
    result = workflow.run(XennaExecutor())
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

    # Curator's own removal workflow on the raw shards keeps exactly the selection.
    kept_dir = tmp_path / "kept"
    TextDuplicatesRemovalWorkflow(
        input_path=str(raw), ids_to_remove_path=meta["ids_to_remove_path"],
        output_path=str(kept_dir), id_field="id", input_files_per_partition=1,
    ).run(XennaExecutor())  # fmt: skip
    kept = pq.read_table(kept_dir, columns=["id"]).column("id").to_numpy(zero_copy_only=False)
    np.testing.assert_array_equal(np.sort(kept), expected)
