"""Inputs in the ecosystem's shapes (datamask.io.datasets): ``save_to_disk`` folders made
by ``datasets`` and the Hub's parquet layout with its splits."""

from __future__ import annotations

import pyarrow.parquet as pq
import pytest

from datamask.cli import main
from tests._data import DEMO_ROWS, kept_ids, preset_layouts, write, write_shards

N = DEMO_ROWS
FLAGS = ["--select-ratio", "0.1", "--n-epochs", "20", "--device", "cpu", "--no-progress"]


def test_save_to_disk_folder_made_by_datasets(tmp_path, demo_table, capsys):
    datasets = pytest.importorskip("datasets")
    table = preset_layouts(demo_table)["fineweb-edu"]
    ds = datasets.Dataset(table)
    ds.save_to_disk(str(tmp_path / "ds"))
    datasets.DatasetDict({"train": ds, "test": ds.select(range(100))}).save_to_disk(
        str(tmp_path / "dd")
    )
    write(table, tmp_path / "same.parquet")
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
    expected = kept_ids(tmp_path / "p.parquet", "id")

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
    assert kept_ids(tmp_path / "a.parquet", "id") == expected

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
    assert kept_ids(tmp_path / "b.parquet", "id") == expected
    capsys.readouterr()
    args = ["select", "--input", str(tmp_path / "ds"), "--output", str(tmp_path / "c")]
    assert main([*args, "--partition", "shard", *FLAGS]) == 2
    assert "a save_to_disk folder is selected in one process" in capsys.readouterr().err


@pytest.mark.slow
def test_hub_parquet_layout_needs_a_split_and_reads_its_files(tmp_path, demo_table, capsys):
    table = preset_layouts(demo_table)["fineweb-edu"]
    data = tmp_path / "repo" / "data"
    data.mkdir(parents=True)
    (tmp_path / "repo" / "README.md").write_text("---\nconfigs: []\n---\n")
    names = ["train-00000-of-00002", "train-00001-of-00002", "test-00000-of-00001"]
    write_shards(table, data, [300, 200, None], names=[f"{n}.parquet" for n in names])
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


@pytest.mark.parametrize(
    "name, text",
    [
        ("state.json", "{not json"),
        ("state.json", '{"_data_files": [{"name": "data-00000-of-00001.arrow"}]}'),
        ("dataset_dict.json", '{"split_names": ["train"]}'),
        ("dataset_dict.json", '["train"]'),
    ],
)
def test_a_broken_save_to_disk_folder_names_its_file(tmp_path, name, text):
    """A save_to_disk folder whose JSON cannot be read, or lacks what datasets writes,
    is a ValueError that names that file; nothing else is read."""
    from datamask.io.datasets import save_to_disk_files

    folder = tmp_path / "ds"
    folder.mkdir()
    (folder / name).write_text(text)
    with pytest.raises(ValueError, match=f"cannot read .*{name}"):
        save_to_disk_files(folder)
