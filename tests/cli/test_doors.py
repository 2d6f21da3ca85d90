"""Errors at the door (issue 45): every bad input answered with one line naming what is
wrong and where (file, column, row), whichever reader meets it; every corpus ``--given``
takes checked as ``--input`` is, naming ``--given``; every documented bound of a flag runs
or is refused with one line. Real parquet files through the real command
(``datamask.cli.main``)."""

from __future__ import annotations

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from datamask.cli import main
from tests._data import reference_table, write

N, DIM = 40, 6
FAST = ["--n-epochs", "5", "--no-progress", "--device", "cpu"]


def _docs(n: int = N, seed: int = 0, first_id: int = 0) -> pa.Table:
    rng = np.random.default_rng(seed)
    x = rng.normal(size=(n, DIM)).astype(np.float32)
    return reference_table(np.arange(first_id, first_id + n), rng.random(n), x)


def _set(table: pa.Table, name: str, values) -> pa.Table:
    return table.set_column(table.schema.get_field_index(name), name, values)


def _nan_quality(t: pa.Table) -> pa.Table:
    q = t["quality_score"].to_numpy().copy()
    q[7] = np.nan
    return _set(t, "quality_score", pa.array(q))


def _null_id(t: pa.Table) -> pa.Table:
    ids = t["chunk_id"].to_pylist()
    ids[5] = None
    return _set(t, "chunk_id", pa.array(ids, pa.int64()))


def _dup_id(t: pa.Table) -> pa.Table:
    ids = t["chunk_id"].to_pylist()
    ids[9] = ids[3]
    return _set(t, "chunk_id", pa.array(ids))


def _ragged(t: pa.Table) -> pa.Table:
    rows = [list(r) for r in t["feature_arr"].to_pylist()]
    rows[11] = rows[11][:-1]
    return _set(t, "feature_arr", pa.array(rows, pa.list_(pa.float32())))


def _nan_embedding(t: pa.Table) -> pa.Table:
    rows = [list(r) for r in t["feature_arr"].to_pylist()]
    rows[4][2] = float("nan")
    return _set(t, "feature_arr", pa.array(rows, pa.list_(pa.float32())))


#: (name, how a good table becomes bad, what the message must say beside where)
BAD = [
    ("no quality column", lambda t: t.drop_columns(["quality_score"]), "quality_score"),
    ("no id column", lambda t: t.drop_columns(["chunk_id"]), "chunk_id"),
    ("no embedding column", lambda t: t.drop_columns(["feature_arr"]), "feature_arr"),
    (
        "quality as text",
        lambda t: _set(t, "quality_score", t["quality_score"].cast(pa.string())),
        "quality_score",
    ),  # noqa: E501
    ("quality NaN", _nan_quality, "NaN"),
    ("null id", _null_id, "null"),
    ("duplicate id", _dup_id, "more than once"),
    ("ragged embeddings", _ragged, "width"),
    ("NaN in an embedding", _nan_embedding, "feature_arr"),
    ("no rows", lambda t: t.slice(0, 0), "no rows"),
]


def _refused(argv: list, capsys) -> str:
    code = main([str(a) for a in argv])
    err = capsys.readouterr().err.strip()
    assert code == 2, err
    assert len(err.splitlines()) == 1 and "Traceback" not in err, err
    return err


@pytest.mark.parametrize("bad", BAD, ids=[b[0] for b in BAD])
def test_given_is_checked_as_input_is(tmp_path, capsys, bad):
    name, make, says = bad
    good_in = write(_docs(), tmp_path / "in.parquet")
    good_given = write(_docs(seed=1, first_id=1000), tmp_path / "given.parquet")
    bad_in = write(make(_docs()), tmp_path / "bad_in.parquet")
    bad_given = write(make(_docs(seed=1, first_id=1000)), tmp_path / "bad_given.parquet")
    out = tmp_path / "out.parquet"
    as_input = _refused(["select", "--input", bad_in, "--output", out, "--k", 5, *FAST], capsys)
    assert "bad_in.parquet" in as_input and says in as_input, as_input
    argv = ["select", "--input", good_in, "--output", out, "--k", 5, *FAST]
    as_given = _refused([*argv, "--given", bad_given], capsys)
    assert "--given" in as_given and "bad_given.parquet" in as_given, as_given
    assert says in as_given, as_given
    assert not out.exists()
    del good_given


# --- every documented bound of a flag runs or is refused with one line ------------------
#: (flags, whether it runs): --k at 1 and at N, a corpus of one document, select_ratio at
#: its open ends (documented (0, 1): refused), options at their limits.
BOUNDS = [
    (["--k", "1"], True),
    (["--k", str(N)], True),
    (["--k", str(N + 1)], False),
    (["--k", "0"], False),
    (["--select-ratio", "1"], False),
    (["--select-ratio", "0"], False),
    (["--select-ratio", "0.999"], True),
    (["--select-ratio", "0.001"], False),  # selects nothing of 40: refused, saying so
    (["--k", str(N), "--method", "topk"], True),
    (["--k", str(N), "--method", "greedy"], True),
    (["--k", "1", "--method", "greedy"], True),
    (["--k", "1", "--lamb", "0"], True),
    (["--k", "1", "--lamb", "1"], True),
    (["--k", "2", "--n-neighbors", "1"], True),
    (["--k", "2", "--n-neighbors", str(N)], True),
]


@pytest.mark.parametrize("given", [False, True], ids=["alone", "given"])
@pytest.mark.parametrize("flags,runs", BOUNDS, ids=[" ".join(b[0]) for b in BOUNDS])
def test_select_flags_at_their_bounds(tmp_path, capsys, flags, runs, given):
    path = write(_docs(), tmp_path / "in.parquet")
    out = tmp_path / "out.parquet"
    argv = ["select", "--input", path, "--output", out, *flags, *FAST]
    if given:
        argv += ["--given", write(_docs(seed=1, first_id=1000), tmp_path / "given.parquet")]
    if not runs:
        _refused(argv, capsys)
        assert not out.exists()
        return
    code = main([str(a) for a in argv])
    captured = capsys.readouterr()
    assert code == 0, captured.err
    assert "Traceback" not in captured.err
    kept = pq.read_table(out).filter(pq.read_table(out)["selected"]).num_rows
    if "--k" in flags:
        assert kept == int(flags[flags.index("--k") + 1])


@pytest.mark.parametrize("given", [False, True], ids=["alone", "given"])
@pytest.mark.parametrize("k", [1, None])
def test_a_corpus_of_one_document(tmp_path, capsys, k, given):
    path = write(_docs(n=1), tmp_path / "one.parquet")
    out = tmp_path / "out.parquet"
    argv = ["select", "--input", path, "--output", out, *FAST]
    argv += ["--k", "1"] if k else ["--select-ratio", "0.5"]  # round(0.5) of 1: 0 or 1
    if given:
        argv += ["--given", write(_docs(seed=1, first_id=1000), tmp_path / "given.parquet")]
    code = main([str(a) for a in argv])
    err = capsys.readouterr().err.strip()
    assert "Traceback" not in err
    assert code == 0 or (code == 2 and len(err.splitlines()) == 1), err


@pytest.mark.parametrize("k", [1, N])
def test_evaluate_a_selection_at_its_bounds(tmp_path, capsys, k):
    path = write(_docs(), tmp_path / "in.parquet")
    out = tmp_path / "out.parquet"
    assert (
        main([str(a) for a in ["select", "--input", path, "--output", out, "--k", k, *FAST]]) == 0
    )
    code = main([str(a) for a in ["evaluate", "--input", path, "--selection", out]])
    captured = capsys.readouterr()
    assert code == 0, captured.err
    assert "Traceback" not in captured.err


def test_format_bytes_picks_the_unit_that_fits():
    from datamask._units import format_bytes, format_mib

    assert format_bytes(0) == "0 B"
    assert format_bytes(999) == "999 B"
    assert format_bytes(1000) == "1.0 KB"
    assert format_bytes(999_960) == "1.0 MB"
    assert format_bytes(45_300_000) == "45.3 MB"
    assert format_bytes(2.1e12) == "2.1 TB"
    assert format_bytes(5e15) == "5000 TB"
    assert format_mib(1) == "1.0 MB"
