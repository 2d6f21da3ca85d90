"""Inputs in the ecosystem's shapes: presets, save_to_disk folders, Hub layouts, select_table."""

from __future__ import annotations

import os
from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest

os.environ.setdefault("HF_DATASETS_OFFLINE", "1")
os.environ.setdefault("HF_HUB_OFFLINE", "1")

from datamask import select_table  # noqa: E402
from datamask.cli import main  # noqa: E402
from datamask.columns import resolve_columns  # noqa: E402

DEMO = Path(__file__).resolve().parents[1] / "examples" / "demo" / "demo_docs.parquet"
N = 600
FLAGS = ["--select-ratio", "0.1", "--n-epochs", "20", "--device", "cpu", "--no-progress"]


@pytest.fixture(scope="module")
def demo() -> pa.Table:
    if not DEMO.exists():
        pytest.skip("examples/demo/demo_docs.parquet not present")
    return pq.read_table(DEMO, columns=["chunk_id", "text", "quality_score", "feature_arr"]).slice(
        0, N
    )


def layouts(demo: pa.Table) -> dict[str, pa.Table]:
    """The same documents in the three layouts the presets name."""
    ids, q, emb = demo["chunk_id"], demo["quality_score"], demo["feature_arr"]
    # fineweb-edu's embeddings are plain lists; curator's are lists too (cudf writes them so)
    as_list = emb.cast(pa.list_(pa.float32()))
    return {
        "datamask": pa.table({"chunk_id": ids, "quality_score": q, "feature_arr": emb}),
        "fineweb-edu": pa.table(
            {
                "text": demo["text"],
                "id": ids,
                "score": q,
                "int_score": pa.array(np.round(q.to_numpy() * 5).astype(np.int64)),
                "embedding": as_list,
            }
        ),
        "curator": pa.table(
            {"id": ids, "text": demo["text"], "fineweb-edu-score": q, "embeddings": as_list}
        ),
    }


def kept(path: Path, id_col: str) -> list[str]:
    table = pq.read_table(path)
    return sorted(table.filter(table["selected"])[id_col].to_pylist())


@pytest.mark.parametrize("preset", ["datamask", "fineweb-edu", "curator"])
def test_preset_selects_the_same_documents_in_every_layout(tmp_path, demo, preset):
    reference = tmp_path / "ref.parquet"
    pq.write_table(layouts(demo)["datamask"], reference)
    assert (
        main(["select", "--input", str(reference), "--output", str(tmp_path / "r.parquet"), *FLAGS])
        == 0
    )
    src = tmp_path / f"{preset}.parquet"
    pq.write_table(layouts(demo)[preset], src)
    id_col = "chunk_id" if preset == "datamask" else "id"
    for extra in (["--preset", preset], []):  # named, then detected from the columns
        out = tmp_path / f"out-{preset}-{len(extra)}.parquet"
        assert main(["select", "--input", str(src), "--output", str(out), *extra, *FLAGS]) == 0
        assert kept(out, id_col) == kept(tmp_path / "r.parquet", "chunk_id")
        assert len(kept(out, id_col)) == N // 10
    # evaluate reads the same layout with the same (detected) columns
    report = tmp_path / f"report-{preset}.json"
    args = ["evaluate", "--input", str(src), "--selection", str(out), "--output", str(report)]
    assert main(args) == 0
    assert report.exists()


def test_preset_that_does_not_fit_is_refused_at_the_door(tmp_path, demo, capsys):
    src = tmp_path / "fw.parquet"
    pq.write_table(layouts(demo)["fineweb-edu"], src)
    out = tmp_path / "out.parquet"
    code = main(
        ["select", "--input", str(src), "--output", str(out), "--preset", "curator", *FLAGS]
    )
    err = capsys.readouterr().err
    assert code == 2
    assert "no embedding column of preset 'curator' (['embeddings'])" in err
    assert "Name it with --feature-col." in err
    assert len(err.strip().splitlines()) == 1
    assert not out.exists()


def test_resolve_columns_flags_win_over_the_preset():
    names = ["id", "score", "embedding", "my_q"]
    assert resolve_columns(names, preset="fineweb-edu", quality_cols=["my_q"]) == (
        "id",
        ["my_q"],
        "embedding",
    )
    assert resolve_columns(names) == ("id", ["score"], "embedding")
    with pytest.raises(ValueError, match=r"preset must be one of \['auto', 'datamask'"):
        resolve_columns(names, preset="fineweb")


def test_save_to_disk_folder_made_by_datasets(tmp_path, demo, capsys):
    datasets = pytest.importorskip("datasets")
    table = layouts(demo)["fineweb-edu"]
    ds = datasets.Dataset(table)
    ds.save_to_disk(str(tmp_path / "ds"))
    datasets.DatasetDict({"train": ds, "test": ds.select(range(100))}).save_to_disk(
        str(tmp_path / "dd")
    )
    pq.write_table(table, tmp_path / "same.parquet")
    assert (
        main(
            [
                "select",
                "--input",
                str(tmp_path / "same.parquet"),
                "--output",
                str(tmp_path / "p.parquet"),
                *FLAGS,
            ]
        )
        == 0
    )
    expected = kept(tmp_path / "p.parquet", "id")

    assert (
        main(
            [
                "select",
                "--input",
                str(tmp_path / "ds"),
                "--output",
                str(tmp_path / "a.parquet"),
                "--preset",
                "fineweb-edu",
                *FLAGS,
            ]
        )
        == 0
    )
    assert kept(tmp_path / "a.parquet", "id") == expected

    capsys.readouterr()
    assert (
        main(
            [
                "select",
                "--input",
                str(tmp_path / "dd"),
                "--output",
                str(tmp_path / "b.parquet"),
                *FLAGS,
            ]
        )
        == 2
    )
    assert "DatasetDict with splits ['train', 'test']; choose one with --split" in (
        capsys.readouterr().err
    )
    assert not (tmp_path / "b.parquet").exists()
    assert (
        main(
            [
                "select",
                "--input",
                str(tmp_path / "dd"),
                "--split",
                "train",
                "--output",
                str(tmp_path / "b.parquet"),
                *FLAGS,
            ]
        )
        == 0
    )
    assert kept(tmp_path / "b.parquet", "id") == expected
    capsys.readouterr()
    args = ["select", "--input", str(tmp_path / "ds"), "--output", str(tmp_path / "c")]
    assert main([*args, "--partition", "shard", *FLAGS]) == 2
    assert "a save_to_disk folder is selected in one process" in capsys.readouterr().err


def test_hub_parquet_layout_needs_a_split_and_reads_its_files(tmp_path, demo, capsys):
    table = layouts(demo)["fineweb-edu"]
    data = tmp_path / "repo" / "data"
    data.mkdir(parents=True)
    (tmp_path / "repo" / "README.md").write_text("---\nconfigs: []\n---\n")
    pq.write_table(table.slice(0, 300), data / "train-00000-of-00002.parquet")
    pq.write_table(table.slice(300, 200), data / "train-00001-of-00002.parquet")
    pq.write_table(table.slice(500), data / "test-00000-of-00001.parquet")
    out = tmp_path / "sel"
    assert main(["select", "--input", str(tmp_path / "repo"), "--output", str(out), *FLAGS]) == 2
    assert "holds the splits ['test', 'train']; choose one with --split" in (
        capsys.readouterr().err
    )
    assert not out.exists()
    assert (
        main(
            [
                "select",
                "--input",
                str(tmp_path / "repo"),
                "--split",
                "train",
                "--output",
                str(out),
                "--runner",
                "local",
                *FLAGS,
            ]
        )
        == 0
    )
    ids = pq.read_table(out / "selected").column("id").to_pylist()
    assert len(ids) == 50
    assert set(ids) <= set(table.slice(0, 500)["id"].to_pylist())


def test_select_table_feeds_dataset_select(demo):
    datasets = pytest.importorskip("datasets")
    ds = datasets.Dataset(layouts(demo)["fineweb-edu"]).shuffle(seed=3)  # an indices mapping
    sel = select_table(ds, preset="fineweb-edu", select_ratio=0.1, method="greedy")
    assert sel.column_names == ["id", "row", "selected", "logit", "rank"]
    assert sel["id"].to_pylist() == ds["id"]  # the dataset's (shuffled) order
    subset = ds.select(sel.filter(sel["selected"])["row"].to_pylist())
    assert len(subset) == N // 10
    assert sorted(subset["id"]) == sorted(sel.filter(sel["selected"])["id"].to_pylist())
    # the same answer from the arrow table and from pandas, in their own row order
    table = layouts(demo)["fineweb-edu"]
    a = select_table(table, select_ratio=0.1, method="greedy")
    b = select_table(table.to_pandas(), select_ratio=0.1, method="greedy")
    assert a.equals(b)
    assert sorted(a.filter(a["selected"])["id"].to_pylist()) == sorted(subset["id"])
    assert np.array_equal(np.sort(a["rank"].to_numpy()), np.arange(1, N + 1))


def test_select_table_without_ids_and_its_errors(demo):
    table = layouts(demo)["datamask"].drop_columns(["chunk_id"])
    sel = select_table(table, select_ratio=0.05, method="topk")
    assert sel.column_names[:2] == ["row", "selected"]
    assert int(sel["selected"].to_numpy().sum()) == N // 20
    with pytest.raises(ValueError, match=r"column 'nope' not found in data; available columns"):
        select_table(table, quality_col="nope")
    with pytest.raises(TypeError, match="data must be a pyarrow.Table"):
        select_table([1, 2, 3])
