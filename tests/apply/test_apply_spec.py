"""``apply`` and ``evaluate`` take one frozen spec, checked once at the door (issue 34): bad
settings are refused before any output exists, library and command line read one
declaration, and the old keywords still work."""

from __future__ import annotations

import dataclasses
import json
from pathlib import Path

import numpy as np
import pyarrow.parquet as pq
import pytest

from datamask.applying import ApplySpec, apply_selection
from datamask.cli import build_parser
from datamask.config import ObjectiveSpec
from datamask.evaluation import EvaluateSpec, evaluate_file
from datamask.settings import section_settings
from tests._data import write_columns, write_reference_layout
from tests.cli.test_reliability import check_refused


def _docs_and_selection(tmp_path: Path, corpus) -> tuple[Path, Path]:
    data = write_reference_layout(tmp_path / "docs.parquet", corpus)
    keep = np.zeros(corpus.n_docs, dtype=bool)
    keep[::4] = True
    sel = write_columns(tmp_path / "sel.parquet", chunk_id=list(corpus.ids), selected=keep)
    return data, sel


# --- apply ----------------------------------------------------------------------------------
def test_apply_spec_is_frozen_and_checked():
    spec = ApplySpec.from_mapping({"removed-format": "curator", "batch_size": None})
    assert spec.removed_format == "curator" and spec.batch_size == 65_536
    with pytest.raises(dataclasses.FrozenInstanceError):
        spec.batch_size = 3  # type: ignore[misc]
    with pytest.raises(ValueError, match=r"removed_format must be one of \['ids', 'rows'"):
        ApplySpec(removed_format="parquet")
    with pytest.raises(ValueError, match="batch_size must be >= 1; got 0"):
        ApplySpec.from_mapping({"batch_size": 0})
    with pytest.raises(ValueError, match=r"unknown setting\(s\) \['batchsize'\] in settings"):
        ApplySpec.from_mapping({"batchsize": 10})


@pytest.mark.parametrize(
    ("flags", "match"),
    [
        (["--batch-size", "0"], "batch_size must be >= 1; got 0"),
        (["--removed", "{t}/gone", "--batch-size", "-5"], "batch_size must be >= 1; got -5"),
    ],
)
def test_apply_command_refuses_bad_settings_before_any_output(
    tmp_path, capsys, small_corpus, flags, match
):
    data, sel = _docs_and_selection(tmp_path, small_corpus)
    argv = ["apply", "--input", data, "--selection", sel, "--output", tmp_path / "kept"]
    check_refused([*argv, *(f.format(t=tmp_path) for f in flags)], tmp_path, capsys, match)


def test_apply_flags_are_the_spec_declarations():
    sub = build_parser()._subparsers._group_actions[0].choices["apply"]  # type: ignore[union-attr]
    dests = {a.dest for a in sub._actions}
    assert {o.name for o in section_settings(ApplySpec)} <= dests


def test_apply_old_keywords_and_spec_give_the_same_rows(tmp_path, small_corpus):
    data, sel = _docs_and_selection(tmp_path, small_corpus)
    kw = dict(removed_format="rows", batch_size=37, progress=False)
    a = apply_selection(data, sel, tmp_path / "a", removed=tmp_path / "ra", **kw)
    b = apply_selection(data, sel, tmp_path / "b", removed=tmp_path / "rb", spec=ApplySpec(**kw))
    assert (a["rows"], a["kept"]) == (b["rows"], b["kept"]) == (small_corpus.n_docs, 100)
    for folder in ("{}/docs.parquet", "r{}/docs.parquet"):
        left = (tmp_path / folder.format("a")).read_bytes()
        assert left == (tmp_path / folder.format("b")).read_bytes()
    # spec and keywords together: the keywords win over the spec's fields
    c = apply_selection(data, sel, tmp_path / "c", spec=ApplySpec(**kw), batch_size=3)
    assert (c["rows"], c["kept"]) == (a["rows"], a["kept"])
    assert pq.read_table(tmp_path / "c/docs.parquet").equals(
        pq.read_table(tmp_path / "a/docs.parquet")
    )


# --- evaluate -------------------------------------------------------------------------------
def test_evaluate_spec_shares_its_declarations_and_checks_at_the_door():
    values = {"algorithm": "DiSF", "lamb": 1, "dup_thresholds": [0.99, 0.9]}
    spec = EvaluateSpec.from_mapping(values)
    assert spec.objective == ObjectiveSpec.from_mapping({"algorithm": "DiSF", "lamb": 1})
    assert spec.objective.lamb == 1.0 and spec.dup_thresholds == (0.9, 0.99)
    assert (spec.device, spec.dup_search, spec.given) == ("auto", "auto", None)
    with pytest.raises(ValueError, match=r"lamb must be in \[0, 1\]; got 2"):
        EvaluateSpec.from_mapping({"lamb": 2})
    with pytest.raises(ValueError, match="dup_search must be one of"):
        EvaluateSpec(dup_search="fast")
    with pytest.raises(ValueError, match=r"unknown setting\(s\) \['n_topics'\]"):
        EvaluateSpec.from_mapping({"n_topics": 3})
    with pytest.raises(TypeError, match="objective must be an ObjectiveSpec"):
        EvaluateSpec(objective={"lamb": 0.5})  # type: ignore[arg-type]


def test_evaluate_refuses_given_selection_alone_before_any_output(tmp_path, capsys, small_corpus):
    data, sel = _docs_and_selection(tmp_path, small_corpus)
    argv = ["evaluate", "--input", data, "--selection", sel, "--given-selection", sel]
    check_refused(argv, tmp_path, capsys, "--given-selection needs --given")


def test_evaluate_file_is_what_the_command_writes(tmp_path, capsys, small_corpus):
    from datamask.cli import main

    data, sel = _docs_and_selection(tmp_path, small_corpus)
    flags = ["--device", "cpu", "--algorithm", "Facility", "Pair_simi", "--lamb", "0.4"]
    argv = ["evaluate", "--input", data, "--selection", sel, "--output", tmp_path / "cli.json"]
    assert main([str(a) for a in [*argv, *flags]]) == 0
    capsys.readouterr()
    settings = dict(device="cpu", algorithm=["Facility", "Pair_simi"], lamb=0.4)
    report = evaluate_file(data, sel, tmp_path / "lib.json", **settings)
    cli = json.loads((tmp_path / "cli.json").read_text())
    lib = json.loads((tmp_path / "lib.json").read_text())
    assert cli["objective"] == lib["objective"] == report["objective"]
    assert cli["metrics"] == lib["metrics"] and lib["k"] == 100
    assert lib["provenance"] == {"trusted": False, "verified_files": 0}
