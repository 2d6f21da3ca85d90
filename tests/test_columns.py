"""Columns and presets (datamask.columns): a preset selects the same documents in every
layout it names, is refused at the door when it does not fit, and flags win over it."""

from __future__ import annotations

import pytest

from datamask.cli import main
from datamask.columns import resolve_columns
from tests._data import DEMO_ROWS, kept_ids, preset_layouts, write

N = DEMO_ROWS
FLAGS = ["--select-ratio", "0.1", "--n-epochs", "20", "--device", "cpu", "--no-progress"]


@pytest.mark.parametrize("preset", ["datamask", "fineweb-edu", "curator"])
def test_preset_selects_the_same_documents_in_every_layout(tmp_path, demo_table, preset):
    reference = tmp_path / "ref.parquet"
    write(preset_layouts(demo_table)["datamask"], reference)
    assert (
        main(["select", "--input", str(reference), "--output", str(tmp_path / "r.parquet"), *FLAGS])
        == 0
    )
    src = tmp_path / f"{preset}.parquet"
    write(preset_layouts(demo_table)[preset], src)
    id_col = "chunk_id" if preset == "datamask" else "id"
    for extra in (["--preset", preset], []):  # named, then detected from the columns
        out = tmp_path / f"out-{preset}-{len(extra)}.parquet"
        assert main(["select", "--input", str(src), "--output", str(out), *extra, *FLAGS]) == 0
        assert kept_ids(out, id_col) == kept_ids(tmp_path / "r.parquet", "chunk_id")
        assert len(kept_ids(out, id_col)) == N // 10
    # evaluate reads the same layout with the same (detected) columns
    report = tmp_path / f"report-{preset}.json"
    args = ["evaluate", "--input", str(src), "--selection", str(out), "--output", str(report)]
    assert main(args) == 0
    assert report.exists()


def test_preset_that_does_not_fit_is_refused_at_the_door(tmp_path, demo_table, capsys):
    src = tmp_path / "fw.parquet"
    write(preset_layouts(demo_table)["fineweb-edu"], src)
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
