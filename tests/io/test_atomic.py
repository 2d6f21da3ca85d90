"""The atomic-write module: a group of files published all or nothing, temporary names."""

from __future__ import annotations

import pytest

from datamask.io.atomic import atomic_write_group, is_temporary, temporary_name


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
