"""``datamask apply`` and the keep lists ``select`` writes: every row compared, resume, refusals."""

from __future__ import annotations

import gzip
import json
from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from datamask.applying import apply_selection
from datamask.cli import main
from datamask.config import SelectSpec
from datamask.distributed import LocalRunner, run_selection
from tests._data import N_SHARDS, write, write_columns, write_corpus

FAST = dict(n_epochs=10, select_ratio=0.2, n_neighbors=8)


@pytest.fixture(scope="module")
def selected(tmp_path_factory):
    """A sharded selection of three shards (computed once for the module)."""
    root = tmp_path_factory.mktemp("apply")
    files = write_corpus(root / "data", jsonl=True)
    out = root / "sel"
    run_selection(
        root / "data",
        out,
        SelectSpec.from_mapping(dict(**FAST)),
        runner=LocalRunner(),
        progress=False,
    )
    ids = pq.read_table(out / "selected").column("chunk_id").to_pylist()
    return root, files, out, set(ids)


def _lines(path: Path) -> list[bytes]:
    with gzip.open(path) as fh:
        return fh.read().splitlines()


def _rows(path: Path) -> pa.Table:
    return pq.read_table(path)


def test_select_writes_keep_lists_per_input_file(selected):
    root, files, out, ids = selected
    index = json.loads((out / "keep" / "_index.json").read_text())
    assert sorted(index["files"]) == ["a/part-0.parquet", "a/part-1.parquet", "b/part-2.parquet"]
    assert index["n_selected"] == len(ids) == sum(f["kept"] for f in index["files"].values())
    manifest = json.loads((out / "manifest.json").read_text())
    assert manifest["selection_digest"] == index["selection"]
    for f in files:
        keep = pq.read_table(out / "keep" / f.relative_to(root / "data"))
        source = _rows(f).column("chunk_id").to_pylist()
        rows = keep.column("row").to_pylist()
        assert rows == sorted(rows)
        assert [source[r] for r in rows] == keep.column("chunk_id").to_pylist()
        assert set(keep.column("chunk_id").to_pylist()) == ids & set(source)


def test_apply_keeps_every_column_of_the_selected_rows(selected, tmp_path):
    root, files, out, ids = selected
    result = apply_selection(
        root / "data", out, tmp_path / "kept", removed=tmp_path / "gone", progress=False
    )
    assert result["mode"] == "keep" and result["kept"] == len(ids)
    for f in files:
        name = f.relative_to(root / "data")
        source = _rows(f)
        mask = pa.array([i in ids for i in source.column("chunk_id").to_pylist()])
        assert _rows(tmp_path / "kept" / name).equals(source.filter(mask))
        gone = pq.read_table(tmp_path / "gone" / name).column("chunk_id")
        assert gone.equals(source.filter(pa.compute.invert(mask)).column("chunk_id"))


def _dictionary_encoded(path: Path) -> dict[str, bool]:
    """Whether each leaf column of the file's first row group has dictionary pages."""
    meta = pq.ParquetFile(path).metadata.row_group(0)
    cols = (meta.column(i) for i in range(meta.num_columns))
    return {c.path_in_schema: "RLE_DICTIONARY" in c.encodings for c in cols}


def test_written_floats_have_no_dictionary(selected, tmp_path):
    """Embeddings and scores are written plain (a dictionary of distinct floats only costs
    time and bytes: io/dictionary.py); ids and other columns keep theirs."""
    root, files, out, _ = selected
    apply_selection(root / "data", out, tmp_path / "kept", progress=False)
    kept = _dictionary_encoded(tmp_path / "kept" / files[0].relative_to(root / "data"))
    assert kept["chunk_id"] and not kept["quality_score"]
    assert not kept["feature_arr.list.element"]
    covered = _dictionary_encoded(next((out / "covered").glob("*.parquet")))
    assert covered["chunk_id"] and not covered["covered_sim"]


def test_one_file_select_writes_keep_list_beside_it(tmp_path, selected):
    root, files, _, _ = selected
    sel = tmp_path / "sel.parquet"
    code = main(
        ["select", "--input", str(files[0]), "--output", str(sel), "--n-epochs", "10",
         "--select-ratio", "0.25", "--n-neighbors", "8", "--no-progress"]
    )  # fmt: skip
    assert code == 0
    keep = pq.read_table(tmp_path / "sel.keep" / "part-0.parquet")
    table = pq.read_table(sel)
    chosen = table.filter(table.column("selected")).column("chunk_id").to_pylist()
    assert sorted(keep.column("chunk_id").to_pylist()) == sorted(chosen)
    result = apply_selection(files[0], sel, tmp_path / "kept", progress=False)
    assert result["mode"] == "keep" and result["kept"] == len(chosen) == 50
    kept = pq.read_table(tmp_path / "kept" / "part-0.parquet")
    assert kept.column("chunk_id").to_pylist() == keep.column("chunk_id").to_pylist()
    # --removed carries the one file's covered_by / covered_sim of each dropped row
    apply_selection(files[0], sel, tmp_path / "k2", removed=tmp_path / "gone", progress=False)
    gone = pq.read_table(tmp_path / "gone" / "part-0.parquet")
    dropped = table.filter(pa.compute.invert(table.column("selected")))
    assert gone.equals(dropped.select(["chunk_id", "covered_by", "covered_sim"]))


@pytest.mark.parametrize("layout", ["ids", "rows"])
def test_removed_carries_the_cover_of_every_dropped_row(selected, tmp_path, layout):
    root, files, out, ids = selected
    covered = pq.read_table(out / "covered")
    want = {
        i: (by, sim)
        for i, by, sim in zip(
            covered.column("chunk_id").to_pylist(),
            covered.column("covered_by").to_pylist(),
            covered.column("covered_sim").to_pylist(),
            strict=True,
        )
    }
    apply_selection(
        root / "data", out, tmp_path / "kept", removed=tmp_path / "gone",
        removed_format=layout, progress=False,
    )  # fmt: skip
    for f in files:
        gone = pq.read_table(tmp_path / "gone" / f.relative_to(root / "data"))
        if layout == "rows":  # every input column, then the two
            assert gone.column_names == [*_rows(f).column_names, "covered_by", "covered_sim"]
        else:
            assert gone.column_names == ["chunk_id", "covered_by", "covered_sim"]
        assert gone.schema.field("covered_sim").type == pa.float32()
        got = zip(
            gone.column("chunk_id").to_pylist(),
            gone.column("covered_by").to_pylist(),
            gone.column("covered_sim").to_pylist(),
            strict=True,
        )
        for i, by, sim in got:
            assert i not in ids and by in ids and (by, sim) == want[i]


def test_jsonl_gz_falls_back_to_selected_ids_and_writes_rows(selected, tmp_path):
    root, _, out, ids = selected
    result = apply_selection(
        str(root / "raw-*.jsonl.gz"), out, tmp_path / "kept", removed=tmp_path / "gone",
        removed_format="rows", progress=False,
    )  # fmt: skip
    assert result["mode"] == "ids" and result["kept"] == len(ids)
    for s in range(N_SHARDS):
        lines = _lines(root / f"raw-{s}.jsonl.gz")
        kept = _lines(tmp_path / "kept" / f"raw-{s}.jsonl.gz")
        gone = _lines(tmp_path / "gone" / f"raw-{s}.jsonl.gz")
        assert kept == [x for x in lines if json.loads(x)["chunk_id"] in ids]  # bytes unchanged
        assert gone == [x for x in lines if json.loads(x)["chunk_id"] not in ids]


def test_curator_layout_sorted_ids_to_remove(selected, tmp_path):
    root, files, out, ids = selected
    apply_selection(
        root / "data", out, tmp_path / "kept", removed=tmp_path / "rm",
        removed_format="curator", progress=False,
    )  # fmt: skip
    parts = sorted((tmp_path / "rm").glob("part.*.parquet"))
    assert [p.name for p in parts] == ["part.0.parquet", "part.1.parquet", "part.2.parquet"]
    everything = set()
    for p in parts:
        col = pq.read_table(p).column("id").to_pylist()
        assert pq.read_schema(p).names == ["id"] and col == sorted(col)
        everything |= set(col)
    all_ids = {i for f in files for i in _rows(f).column("chunk_id").to_pylist()}
    assert everything == all_ids - ids


def test_rerun_resumes_and_refuses_another_selection(selected, tmp_path, capsys):
    root, files, out, _ = selected
    dest = tmp_path / "kept"
    apply_selection(root / "data", out, dest, progress=False)
    first = {p.name: p.read_bytes() for p in dest.rglob("*.parquet")}
    (dest / "_datamask_apply" / "done" / "b" / "part-2.parquet.json").unlink()
    again = apply_selection(root / "data", out, dest, progress=False)
    assert again["shards_reused"] == 2 and again["shards_done"] == 1
    assert {p.name: p.read_bytes() for p in dest.rglob("*.parquet")} == first
    other = tmp_path / "other.parquet"  # another selection of the same corpus
    two = _rows(files[0]).column("chunk_id").to_pylist()[:2]
    write_columns(other, chunk_id=pa.array(two))
    code = main(["apply", "--input", str(root / "data"), "--selection", str(other),
                 "--output", str(dest), "--no-progress"])  # fmt: skip
    err = capsys.readouterr().err
    assert code == 2 and "another selection_id" in err and len(err.strip().splitlines()) == 1


def test_changed_shard_is_refused(selected, tmp_path):
    root, files, out, _ = selected
    data = tmp_path / "data"
    for f in files:
        target = data / f.relative_to(root / "data")
        target.parent.mkdir(parents=True, exist_ok=True)
        table = _rows(f)
        if f.name == "part-1.parquet":  # same row count, rows in another order
            table = table.take(pa.array(np.arange(table.num_rows)[::-1]))
        write(table, target)
    # Names match the keep lists but the selection was made from root/data: refused by its
    # provenance record before anything is written; without that check, by id.
    with pytest.raises(ValueError, match="is not the file the selection"):
        apply_selection(data, out, tmp_path / "kept", progress=False)
    assert not (tmp_path / "kept").exists()
    with pytest.raises(ValueError, match="changed since the selection"):
        apply_selection(data, out, tmp_path / "kept", progress=False, trust_selection=True)
    assert not (tmp_path / "kept" / "a" / "part-1.parquet").exists()


@pytest.mark.parametrize(
    "argv, message",
    [
        (["--selection", "foo://x/y"], "unknown storage scheme"),
        (["--selection", "s3:/bucket/sel"], "not a valid URI"),
        (["--output", "s3://"], "invalid bucket name"),
        (["--removed-format", "rows", "--removed", "DATA"], "overlaps"),
        (["--selection", "MISSING"], "does not exist"),
    ],
)
def test_bad_arguments_exit_2_before_writing(
    selected, tmp_path, capsys, monkeypatch, argv, message
):
    root, _, out, _ = selected
    monkeypatch.chdir(tmp_path)
    args = {"--input": str(root / "data"), "--selection": str(out), "--output": "kept"}
    pairs = dict(zip(argv[::2], argv[1::2], strict=True))
    pairs = {k: {"DATA": str(root / "data"), "MISSING": "nope"}.get(v, v) for k, v in pairs.items()}
    args.update(pairs)
    code = main(["apply", *[x for kv in args.items() for x in kv], "--no-progress"])
    err = capsys.readouterr().err
    assert code == 2 and message in err and len(err.strip().splitlines()) == 1
    assert sorted(p.name for p in tmp_path.iterdir()) == []  # no kept/, no s3: folder


def test_keep_lists_of_another_selection_are_not_used(selected, tmp_path):
    """Keep lists left by an earlier run (their digest is not that of the selection's rows)
    are ignored: rows are matched by id against the selection itself. Keep lists that are
    those of the rows are used whatever the manifest says (the rows decide, issue 34)."""
    import shutil

    root, files, out, ids = selected
    sel = tmp_path / "sel"
    shutil.copytree(out, sel, ignore=shutil.ignore_patterns("_work"))
    index = json.loads((sel / "keep" / "_index.json").read_text())
    (sel / "keep" / "_index.json").write_text(json.dumps({**index, "selection": "0" * 32}))
    result = apply_selection(root / "data", sel, tmp_path / "kept", progress=False)
    assert result["mode"] == "ids" and result["kept"] == len(ids)
    (sel / "keep" / "_index.json").write_text(json.dumps(index))
    manifest = json.loads((sel / "manifest.json").read_text())
    (sel / "manifest.json").write_text(json.dumps({**manifest, "selection_digest": "0" * 32}))
    with pytest.warns(UserWarning, match="was edited after `datamask select` wrote it"):
        result = apply_selection(root / "data", sel, tmp_path / "kept2", progress=False)
    assert result["mode"] == "keep" and result["kept"] == len(ids)


def test_a_missing_keep_list_falls_back_to_the_selected_ids(selected, tmp_path):
    """A keep list deleted since select wrote it: apply warns and matches rows by the
    selection's ids, with the same output (before: it stopped at that shard, "cannot read
    ... as parquet: No such file or directory")."""
    import shutil

    root, files, out, ids = selected
    sel = tmp_path / "sel"
    shutil.copytree(out, sel, ignore=shutil.ignore_patterns("_work"))
    (sel / "keep" / "a" / "part-1.parquet").unlink()
    with pytest.warns(UserWarning, match=r"1 keep list\(s\) .* missing \(first: 'a/part-1"):
        result = apply_selection(root / "data", sel, tmp_path / "kept", progress=False)
    assert result["mode"] == "ids" and result["kept"] == len(ids)
    apply_selection(root / "data", out, tmp_path / "by_keep", progress=False)
    for f in files:
        name = f.relative_to(root / "data")
        assert _rows(tmp_path / "kept" / name).equals(_rows(tmp_path / "by_keep" / name))


def test_relative_names():
    from datamask.io.keep import relative_names

    files = ["/d/a/x.parquet", "/d/b/y.parquet"]
    assert relative_names("/d", files) == ["a/x.parquet", "b/y.parquet"]
    assert relative_names("", files) == ["a/x.parquet", "b/y.parquet"]  # a list: common folder
    assert relative_names("/d/a/x.parquet", files[:1]) == ["x.parquet"]


def test_sharded_select_from_a_list_of_files_names_keep_lists_relatively(tmp_path, selected):
    root, files, _, _ = selected
    out = tmp_path / "sel"
    run_selection(
        list(files),
        out,
        SelectSpec.from_mapping(dict(**FAST)),
        runner=LocalRunner(),
        progress=False,
    )
    index = json.loads((out / "keep" / "_index.json").read_text())
    assert sorted(index["files"]) == ["a/part-0.parquet", "a/part-1.parquet", "b/part-2.parquet"]
    assert all(pq.read_schema(f).names[0] == "chunk_id" for f in files)  # inputs untouched
