"""The doors, ``datamask.select`` and ``datamask.select_table``: one way in for settings
(keywords or a spec, never both), column names resolved once against the input, the spec
checked once per run."""

from __future__ import annotations

import json

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest

import datamask
from datamask import Columns, SelectSpec, api, select_table
from datamask.io.parquet import read_corpus
from tests._data import DEMO_ROWS, preset_layouts, write_fineweb_layout, write_reference_layout

FAST = {"select_ratio": 0.2, "n_epochs": 10, "n_neighbors": 8, "device": "cpu", "progress": False}
TOPK = {"method": "topk", **{k: v for k, v in FAST.items() if k != "n_epochs"}}
N = DEMO_ROWS


def test_the_doors_are_exported():
    assert datamask.select is api.select and datamask.select_table is api.select_table
    assert {"select", "select_table", "Columns", "SelectSpec"} <= set(datamask.__all__)
    assert datamask.__version__ == datamask._version.__version__


def test_keywords_and_spec_are_one_way_in(reference_parquet, tmp_path):
    by_keywords = datamask.select(reference_parquet, tmp_path / "a.parquet", **FAST)
    spec = SelectSpec.from_mapping(FAST)
    by_spec = datamask.select(reference_parquet, tmp_path / "b.parquet", spec)
    assert by_keywords["settings"] == by_spec["settings"]
    assert pq.read_table(tmp_path / "a.parquet").equals(pq.read_table(tmp_path / "b.parquet"))
    over = datamask.select(reference_parquet, tmp_path / "c.parquet", spec, lamb=0.3)
    assert over["settings"] == {**by_spec["settings"], "lamb": 0.3}  # keywords over the spec
    with pytest.raises(ValueError, match=r"select_ratio in select's arguments must be"):
        datamask.select(reference_parquet, tmp_path / "d.parquet", select_ratio=1.5)
    assert not (tmp_path / "d.parquet").exists()


def test_a_recorded_run_s_settings_are_accepted_back(reference_parquet, tmp_path):
    """What a summary records (``settings``, None for defaults) is a mapping the library
    takes again, to the same settings: a run is reproducible from its own record."""
    first = datamask.select(reference_parquet, tmp_path / "a.parquet", **FAST)
    as_json = json.loads(json.dumps(first["settings"]))  # as the summary file holds it
    recorded = {k: v for k, v in as_json.items() if v is not None}
    assert recorded["term_modules"] == []  # an empty list: "none", as recorded
    again = SelectSpec.from_mapping(recorded).check()
    fingerprint = json.loads(json.dumps(again.fingerprint()))  # what names the selection
    assert fingerprint == {k: as_json[k] for k in fingerprint}
    with pytest.raises(TypeError, match=r"algorithm must be a name or a list of names; got \[\]"):
        SelectSpec.from_mapping({**recorded, "algorithm": []})


def test_select_resolves_the_columns_once_from_preset_or_schema(small_corpus, tmp_path):
    """The library door finds FineWeb-Edu's columns by itself (as the CLI does), records the
    names it used, and a preset that does not fit names the missing role."""
    src = tmp_path / "fineweb.parquet"
    write_fineweb_layout(src, small_corpus)
    detected = datamask.select(src, tmp_path / "auto.parquet", **TOPK)
    preset = datamask.select(src, tmp_path / "preset.parquet", preset="fineweb-edu", **TOPK)
    for summary in (detected, preset):
        s = summary["settings"]
        assert (s["id_col"], list(s["quality_cols"]), s["feature_col"]) == (
            "id",
            ["score"],
            "embedding",
        )
        assert "preset" not in s  # resolved into the names, which are what is recorded
    assert pq.read_table(tmp_path / "auto.parquet").equals(
        pq.read_table(tmp_path / "preset.parquet")
    )
    on_disk = json.loads((tmp_path / "auto.summary.json").read_text())
    assert on_disk["settings"]["id_col"] == "id"
    with pytest.raises(ValueError, match=r"no id column of preset 'datamask' \(\['chunk_id'\]\)"):
        datamask.select(src, tmp_path / "bad.parquet", preset="datamask", **FAST)


def test_every_reader_takes_one_columns_value(small_corpus, tmp_path):
    src = tmp_path / "fineweb.parquet"
    write_fineweb_layout(src, small_corpus)
    by_preset = read_corpus(src, Columns(preset="fineweb-edu"))
    by_schema = read_corpus(src)
    by_names = read_corpus(
        src, Columns(id_col="id", quality_cols=("score",), feature_col="embedding")
    )
    for corpus in (by_schema, by_names):
        assert np.array_equal(corpus.ids, by_preset.ids)
        assert np.array_equal(corpus.features, by_preset.features)
    assert Columns(preset="curator").resolve() == Columns(
        id_col="id", quality_cols=("fineweb-edu-score-float",), feature_col="embeddings"
    )
    with pytest.raises(ValueError, match="quality_weights must have one weight per quality"):
        SelectSpec.from_mapping({"quality_col": ["a", "b"]}).evolve(
            columns=Columns(quality_cols=("a", "b"), quality_weights=(1.0,))
        )


def test_the_spec_is_checked_once_per_sharded_run(small_corpus, tmp_path, monkeypatch):
    """SelectSpec.check() builds a throwaway selector: the keyword door, the planner and the
    runner ask for it, and it runs once."""

    shards = tmp_path / "shards"
    shards.mkdir()
    for i, rows in enumerate(np.array_split(np.arange(small_corpus.n_docs), 3)):
        part = datamask.Corpus(
            ids=small_corpus.ids[rows],
            quality=small_corpus.quality[rows],
            features=small_corpus.features[rows],
        )
        write_reference_layout(shards / f"part-{i}.parquet", part)
    calls = []
    real = SelectSpec._check
    monkeypatch.setattr(SelectSpec, "_check", lambda self: calls.append(1) or real(self))
    manifest = datamask.select(shards, tmp_path / "out", workers=1, runner="local", **FAST)
    assert manifest["totals"]["k"] == round(0.2 * small_corpus.n_docs)
    assert len(calls) == 1


def test_select_table_takes_the_same_settings(small_corpus):
    feats = np.asarray(small_corpus.features, dtype=np.float32)
    table = pa.table(
        {
            "score": pa.array(small_corpus.quality[:, 0]),
            "embedding": pa.array(list(feats), type=pa.list_(pa.float32())),
        }
    )
    by_keywords = datamask.select_table(table, method="topk", select_ratio=0.25)
    spec = SelectSpec.from_mapping({"method": "topk", "select_ratio": 0.25})
    assert datamask.select_table(table, spec).equals(by_keywords)
    assert by_keywords.column_names[0] == "row"  # no id column: the rows are the ids
    assert pc_sum(by_keywords["selected"]) == round(0.25 * small_corpus.n_docs)
    by_random = datamask.select_table(table, method="random", select_ratio=0.25)
    assert datamask.select_table(table, spec, method="random").equals(by_random)


def pc_sum(column: pa.ChunkedArray) -> int:
    return int(np.asarray(column.to_numpy(zero_copy_only=False), dtype=bool).sum())


def test_select_table_feeds_dataset_select(demo_table):
    datasets = pytest.importorskip("datasets")
    # shuffled: an indices mapping
    ds = datasets.Dataset(preset_layouts(demo_table)["fineweb-edu"]).shuffle(seed=3)
    sel = select_table(ds, preset="fineweb-edu", select_ratio=0.1, method="greedy")
    assert sel.column_names == [
        "id",
        "row",
        "selected",
        "logit",
        "rank",
        "covered_by",
        "covered_sim",
        "covered_exact",
    ]
    assert sel["id"].to_pylist() == ds["id"]  # the dataset's (shuffled) order
    subset = ds.select(sel.filter(sel["selected"])["row"].to_pylist())
    assert len(subset) == N // 10
    assert sorted(subset["id"]) == sorted(sel.filter(sel["selected"])["id"].to_pylist())
    # the same answer from the arrow table and from pandas, in their own row order
    table = preset_layouts(demo_table)["fineweb-edu"]
    a = select_table(table, select_ratio=0.1, method="greedy")
    b = select_table(table.to_pandas(), select_ratio=0.1, method="greedy")
    assert a.equals(b)
    assert sorted(a.filter(a["selected"])["id"].to_pylist()) == sorted(subset["id"])
    assert np.array_equal(np.sort(a["rank"].to_numpy()), np.arange(1, N + 1))


def test_select_table_without_ids_and_its_errors(demo_table):
    table = preset_layouts(demo_table)["datamask"].drop_columns(["chunk_id"])
    sel = select_table(table, select_ratio=0.05, method="topk")
    assert sel.column_names[:2] == ["row", "selected"]
    assert int(sel["selected"].to_numpy().sum()) == N // 20
    with pytest.raises(ValueError, match=r"column 'nope' not found in data; available columns"):
        select_table(table, quality_col="nope")
    with pytest.raises(TypeError, match="data must be a pyarrow.Table"):
        select_table([1, 2, 3])
