"""Reliability of ``report``, ``apply``, ``evaluate`` and ``embed`` (issue 34): the six
classes of the second audit, each tested as a class through the real commands."""

from __future__ import annotations

from pathlib import Path

import pytest

from datamask.cli import main
from tests.cli.test_reliability import _row_n_corpus, _select, check_refused

NO_PROGRESS = ["--no-progress"]


# --- class 1: every command that reads a selection checks its provenance -------------------
def _foreign(t: Path) -> tuple[Path, Path]:
    """A selection of corpus a, and corpus b with the same ids and file name, other content."""
    sel = _select(_row_n_corpus(t / "a", 1), t / "sel.parquet")
    _row_n_corpus(t / "b", 2)
    return sel, t / "b"


def _report(src, sel, out, *extra) -> list:
    return ["report", "--input", src, "--selection", sel, "--output", out, *NO_PROGRESS, *extra]


@pytest.mark.parametrize("as_compare", [False, True])
def test_report_refuses_a_selection_of_another_corpus(tmp_path, capsys, as_compare):
    sel, other = _foreign(tmp_path)
    if as_compare:  # a --compare selection is checked as the first one is
        own = _select(other / "docs.parquet", tmp_path / "own.parquet")
        argv = _report(other, own, tmp_path / "rep", "--compare", sel)
    else:
        argv = _report(other, sel, tmp_path / "rep")
    check_refused(argv, tmp_path, capsys, "is not the file the selection")


def test_report_and_evaluate_refuse_alike_and_trust_skips(tmp_path, capsys):
    sel, other = _foreign(tmp_path)
    ev = ["evaluate", "--input", other / "docs.parquet", "--selection", sel]
    ev += ["--output", tmp_path / "e.json"]
    err_e = check_refused(ev, tmp_path, capsys, "is not the file the selection")
    err_r = check_refused(_report(other, sel, tmp_path / "rep"), tmp_path, capsys, "differs")
    assert err_e == err_r  # one check, one message
    assert main([str(a) for a in _report(other, sel, tmp_path / "rep", "--trust-selection")]) == 0
    assert (tmp_path / "rep" / "index.html").is_file()
