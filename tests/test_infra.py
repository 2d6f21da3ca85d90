"""The shared infrastructure: one device check, one group write, one memory module,
one corpus builder, one apportion (issue 8, part 5)."""

from __future__ import annotations

import json
import subprocess
import sys

import numpy as np
import pyarrow as pa
import pytest

from datamask._device import check_device_name, resolve_device
from datamask._memory import peak_rss_mb, rss_mb
from datamask.columns import Columns
from datamask.data import apportion, top_k_rows
from datamask.embed import _resolve_device
from datamask.greedy.disf import batch_quotas
from datamask.io.atomic import atomic_write_group, is_temporary, temporary_name
from datamask.io.parquet import corpus_from_tables, read_table


@pytest.mark.parametrize("name", ["auto", "cpu", "cuda", "cuda:0", " CUDA:3 ", "Cpu"])
def test_check_device_name_accepts_without_touching_cuda(name):
    assert check_device_name(name) == name.strip().lower()


@pytest.mark.parametrize("name", ["tpu", "cuda:x", "cudas", "cuda:", "", "mps"])
def test_check_device_name_refuses(name):
    with pytest.raises(ValueError, match=r"device must be 'auto', 'cpu', 'cuda' or 'cuda:N'"):
        check_device_name(name)
    with pytest.raises(ValueError, match="device must be"):
        resolve_device(name)


def test_embed_device_goes_through_resolve_device():
    assert _resolve_device("cpu") == "cpu"
    assert _resolve_device(" AUTO ") == str(resolve_device("auto"))
    assert _resolve_device("mps") == "mps"
    with pytest.raises(ValueError, match=r"'cuda', 'cuda:N' or 'mps'; got 'tpu'\."):
        _resolve_device("tpu")
    with pytest.raises(TypeError, match="device must be a string"):
        _resolve_device(0)


def test_atomic_write_group_publishes_all_or_nothing(tmp_path):
    a, b = tmp_path / "sel.parquet", tmp_path / "sel.summary.json"
    a.write_text("old a")
    b.write_text("old b")
    with pytest.raises(RuntimeError), atomic_write_group([a, b]) as (ta, tb):
        ta.write_text("new a")
        tb.write_text("new b")
        raise RuntimeError("crash before the commit")
    assert (a.read_text(), b.read_text()) == ("old a", "old b")
    with atomic_write_group([a, b]) as (ta, tb):
        assert is_temporary(ta.name, a.name) and is_temporary(tb.name, b.name)
        ta.write_text("new a")
        tb.write_text("new b")
    assert (a.read_text(), b.read_text()) == ("new a", "new b")
    assert sorted(p.name for p in tmp_path.iterdir()) == sorted([a.name, b.name])  # no tmp


def test_temporary_names_are_recognised():
    tmp = temporary_name("out/sel.parquet")
    assert is_temporary(tmp.name) and is_temporary(tmp.name, "sel.parquet")
    assert not is_temporary(tmp.name, "other.parquet")
    assert not is_temporary(".sel.parquet.tmp") and not is_temporary("sel.parquet")


_MEASURE = """
import json
import numpy as np
from datamask._memory import measure_peak_rss
value, memory = measure_peak_rss(lambda: np.ones(40 * 2**20 // 8).sum())
print(json.dumps({"value": float(value), **memory}))
"""


def test_memory_figures():
    # In a fresh process, as bench measures every method: in this one, threads left by
    # earlier tests (Ray's, a moto server's) may free memory during the call and hide it
    # (seen once: peak_mb 0.0 after the Ray tests, in a full run).
    done = subprocess.run([sys.executable, "-c", _MEASURE], capture_output=True, text=True)
    assert done.returncode == 0, done.stderr
    memory = json.loads(done.stdout)
    assert memory["value"] == 40 * 2**20 // 8
    assert memory["peak_mb"] >= 30 and memory["memory_method"] != "unavailable"
    # The lifetime peak is above the current RSS once memory was used and given back (the
    # kernel's counters are read with per-CPU lag, so equal figures are not compared).
    np.ones(40 * 2**20 // 8).sum()
    assert peak_rss_mb() >= rss_mb() > 0


def test_apportion_and_batch_quotas_agree_on_exact_ties():
    # Quotas 4/3, 4/3 and 1/3: three equal remainders, the seat goes to the first batch
    # (the float rounding batch_quotas used before gave it to the last).
    assert apportion([4, 4, 1], 3).tolist() == [2, 1, 0]
    assert batch_quotas(9, 3, 4)[1].tolist() == [2, 1, 0]
    assert top_k_rows(np.array([0.5, 0.9, 0.5]), np.array(["c", "a", "b"]), 2).tolist() == [1, 2]


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
    bad = tmp_path / "bad.parquet"
    bad.write_bytes(b"not parquet")
    with pytest.raises(ValueError, match="bad.parquet"):
        read_table(bad)
