"""Parquet reading: every column layout the reference uses, and clear errors."""

from __future__ import annotations

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from datamask._validation import check_corpus
from datamask.columns import Columns
from datamask.io.parquet import corpus_from_tables, read_corpus, read_in_parallel, read_table
from tests._data import write, write_columns, write_not_parquet


@pytest.mark.parametrize("fixed", [True, False])
def test_round_trip_of_every_row(tmp_path, small_corpus, fixed, write_reference):
    path = write_reference(tmp_path / "d.parquet", small_corpus, fixed=fixed)
    got = read_corpus(path)
    assert list(got.ids) == list(small_corpus.ids)
    np.testing.assert_array_equal(got.quality[:, 0], small_corpus.quality[:, 0])
    np.testing.assert_array_equal(got.features, small_corpus.features)


def test_several_quality_columns_are_mixed_by_weight(tmp_path):
    x = np.eye(4, dtype=np.float32)
    table = pa.table(
        {
            "id": ["a", "b", "c", "d"],
            "edu": [0.0, 1.0, 2.0, 3.0],
            "dclm": [3.0, 3.0, 0.0, 0.0],
            "emb": pa.FixedSizeListArray.from_arrays(pa.array(x.reshape(-1)), 4),
        }
    )
    write(table, tmp_path / "q.parquet")
    corpus = check_corpus(
        read_corpus(
            tmp_path / "q.parquet",
            Columns(
                id_col="id", quality_cols=("edu", "dclm"), quality_weights=(3, 1), feature_col="emb"
            ),
        )
    )
    np.testing.assert_allclose(
        corpus.normalized_quality(),
        0.75 * np.array([0, 1 / 3, 2 / 3, 1]) + 0.25 * np.array([1, 1, 0, 0]),
    )


def test_errors_name_the_problem(tmp_path, small_corpus, write_reference):
    good = write_reference(tmp_path / "good.parquet", small_corpus)
    with pytest.raises(
        ValueError,
        match=r"column 'score' not found in .*good.parquet; "
        r"available columns: \['chunk_id', 'quality_score', 'feature_arr'\]",
    ):
        read_corpus(good, Columns(quality_cols=("score",)))
    ragged = write_columns(
        tmp_path / "ragged.parquet",
        chunk_id=["a", "b", "c"],
        quality_score=[1.0, 2.0, 3.0],
        feature_arr=pa.array([[1.0, 0.0], [0.0, 1.0], [1.0, 0.0, 0.0]]),
    )
    with pytest.raises(
        ValueError,
        match="embedding width 3 at row 2 of .*ragged.parquet does not match width 2 at row 0",
    ):
        read_corpus(ragged)
    nan = write_columns(
        tmp_path / "nan.parquet",
        chunk_id=["a", "b", "c"],
        quality_score=[1.0, float("nan"), 3.0],
        feature_arr=pa.array([[1.0, 0.0], [0.0, 1.0], [1.0, 1.0]]),
    )
    with pytest.raises(
        ValueError,
        match=r"quality_score has 1 null, NaN or inf values \(first at row 1 "
        r"of .*nan.parquet\); drop or fill them",
    ):
        check_corpus(read_corpus(nan))
    inf = write_columns(
        tmp_path / "inf.parquet",
        chunk_id=["a", "b"],
        quality_score=[1.0, 2.0],
        feature_arr=pa.array([[1.0, float("inf")], [0.0, 1.0]]),
    )
    with pytest.raises(
        ValueError,
        match=r"features have 1 rows with NaN/inf values \(first at "
        r"row 0",
    ):
        check_corpus(read_corpus(inf))
    empty = write_columns(
        tmp_path / "empty.parquet",
        chunk_id=pa.array([], pa.string()),
        quality_score=pa.array([], pa.float64()),
        feature_arr=pa.array([], pa.list_(pa.float32())),
    )
    with pytest.raises(ValueError, match="empty.parquet has no rows"):
        read_corpus(empty)
    junk = tmp_path / "junk.parquet"
    junk.write_bytes(b"not a parquet file at all")
    with pytest.raises(ValueError, match="cannot read .*junk.parquet.* as parquet"):
        read_corpus(junk)
    with pytest.raises(ValueError, match="input file .*missing.parquet.* does not exist"):
        read_corpus(tmp_path / "missing.parquet")
    with pytest.raises(ValueError, match="embedding width 16 in .*good.parquet does not match 8"):
        read_corpus(good, expected_dim=8)
    zero = write_columns(
        tmp_path / "zero.parquet",
        chunk_id=["a", "b"],
        quality_score=[1.0, 2.0],
        feature_arr=pa.array([[0.0, 0.0], [0.0, 1.0]]),
    )
    with pytest.raises(ValueError, match="1 all-zero rows"):
        check_corpus(read_corpus(zero))


def _piece(ids, dim=3, extra=None):
    n = len(ids)
    feats = np.arange(n * dim, dtype=np.float32) + 1
    cols = {
        "id": pa.array(ids),
        "q": pa.array(np.linspace(0, 1, n)),
        "emb": pa.FixedSizeListArray.from_arrays(pa.array(feats), dim),
    }
    if extra is not None:
        cols["n_chars"] = pa.array(extra)
    return pa.table(cols)


def test_corpus_from_tables_keeps_extra_columns_across_pieces(tmp_path):
    tables = [(_piece(["a", "b"], extra=[10, 20]), "f0"), (_piece(["c"], extra=[30]), "f1")]
    corpus, ids = corpus_from_tables(
        tables,
        Columns(id_col="id", quality_cols=("q",), feature_col="emb"),
        source="two pieces",
        extra_cols=["n_chars"],
    )
    assert ids.to_pylist() == ["a", "b", "c"] and corpus.n_docs == 3 and corpus.dim == 3
    assert corpus.extra["n_chars"].tolist() == [10, 20, 30]
    with pytest.raises(ValueError, match="embedding width 2 in f1 does not match 3 in f0"):
        corpus_from_tables(
            [tables[0], (_piece(["c"], dim=2), "f1")],
            Columns(id_col="id", quality_cols=("q",), feature_col="emb"),
            source="s",
        )


def test_read_table_names_the_file(tmp_path):
    bad = write_not_parquet(tmp_path / "bad.parquet")
    with pytest.raises(ValueError, match="bad.parquet"):
        read_table(bad)


def test_packed_work_features_round_trip_and_a_user_binary_column_is_refused(tmp_path):
    """The work dir's row copies hold embeddings as raw float32 rows (pack_features); read
    back through corpus_from_tables they are the same numbers. A user's binary column
    without the work file's mark stays refused as not a list of floats."""
    from datamask.io.parquet import pack_features

    rng = np.random.default_rng(0)
    feats = rng.standard_normal((50, 6)).astype(np.float32)
    table = pa.table(
        {
            "id": pa.array(np.arange(50)),
            "q": pa.array(rng.random(50)),
            "x": pa.array(list(feats.astype(np.float64)), pa.list_(pa.float64(), 6)),
        }
    )
    packed = pack_features(table, "x", feats).slice(10, 30)  # an offset into the buffer
    pq.write_table(packed, tmp_path / "w.parquet", compression="lz4")
    back = pq.read_table(tmp_path / "w.parquet")
    cols = Columns(id_col="id", quality_cols=("q",), feature_col="x")
    for t in (packed, back):
        corpus, ids = corpus_from_tables([(t, "w")], cols, source="w")
        assert np.array_equal(corpus.features, feats[10:40]) and ids.to_pylist()[0] == 10
    plain = back.cast(pa.schema([f.remove_metadata() for f in back.schema]))
    with pytest.raises(ValueError, match="must be a list of floats"):
        corpus_from_tables([(plain, "user.parquet")], cols, source="user")


@pytest.mark.parametrize("threads", [2, 3, 7, 50])
def test_read_in_parallel_is_the_whole_read(tmp_path, threads):
    """Shares of row groups read by threads of their own (uneven groups, more threads
    than groups) give the table one read gives, in order; a corrupt page still names
    the file."""
    rng = np.random.default_rng(0)
    n = 1_000
    table = pa.table(
        {
            "id": pa.array([f"d{i}" for i in range(n)]),
            "q": pa.array(rng.random(n)),
            "emb": pa.array(list(rng.random((n, 4), dtype=np.float32)), pa.list_(pa.float32())),
        }
    )
    path = tmp_path / "t.parquet"
    with pq.ParquetWriter(path, table.schema) as writer:
        for lo, hi in [(0, 10), (10, 400), (400, 401), (401, 1000)]:
            writer.write_table(table.slice(lo, hi - lo))
    pf = pq.ParquetFile(path)
    got = read_in_parallel(path, pf, ["id", "emb"], threads=threads)
    assert got.equals(pf.read(columns=["id", "emb"]))
    assert got.schema.metadata == pf.read(columns=["id", "emb"]).schema.metadata
    corpus = read_corpus(path, Columns("id", ("q",), feature_col="emb"))
    assert corpus.ids.tolist() == table.column("id").to_pylist()
    # a page of the last share's row group fails its checksum: the read names the file
    plain = {"compression": "none", "use_dictionary": False, "write_page_checksum": True}
    with pq.ParquetWriter(path, table.schema, **plain) as writer:
        for lo in range(0, n, 250):
            writer.write_table(table.slice(lo, 250))
    col = pq.ParquetFile(path).metadata.row_group(3).column(1)
    data = bytearray(path.read_bytes())
    mid = col.data_page_offset + col.total_compressed_size // 2
    data[mid : mid + 8] = b"\x3f" * 8  # finite values: only the checksum tells
    path.write_bytes(bytes(data))
    with pytest.raises(ValueError, match="t.parquet"):
        read_corpus(path, Columns("id", ("q",), feature_col="emb"))
