"""``ReportSpec``: the one frozen spec ``datamask report`` and ``build_report`` run with,
checked once at the door; the command's flags made from its declarations."""

from __future__ import annotations

import dataclasses
from pathlib import Path

import numpy as np
import pyarrow as pa
import pytest

from datamask.cli import build_parser, main
from datamask.cli.report import report_spec_from_args
from datamask.columns import Columns
from datamask.evaluation import ReportSpec
from datamask.evaluation.browse import build_report, render_html
from datamask.settings import section_settings
from tests._data import reference_table, write
from tests.cli.test_reliability import check_refused

N = 40


def _docs(t: Path) -> tuple[Path, Path, Path]:
    """``N`` documents with text, and two id lists of them (the selection and a compare)."""
    rng = np.random.default_rng(0)
    table = reference_table([f"d{i}" for i in range(N)], rng.random(N), rng.random((N, 8)))
    table = table.append_column("text", pa.array([f"word{i % 5} text {i}" for i in range(N)]))
    docs = write(table, t / "in" / "docs.parquet")
    first, second = t / "first.txt", t / "second.txt"
    first.write_text("".join(f"d{i}\n" for i in range(0, N, 4)))
    second.write_text("".join(f"d{i}\n" for i in range(1, N, 3)))
    return docs, first, second


def _argv(docs: Path, sel: Path, out: Path, *extra: str) -> list[str]:
    return ["report", "--input", str(docs), "--selection", str(sel), "--output", str(out),
            "--no-progress", *extra]  # fmt: skip


def test_spec_is_frozen_and_holds_checked_values():
    spec = ReportSpec(dup_thresholds=[0.99, 0.9])
    with pytest.raises(dataclasses.FrozenInstanceError):
        spec.n_topics = 3  # type: ignore[misc]
    assert spec.dup_thresholds == (0.9, 0.99)  # sorted, a tuple
    assert hash(spec) == hash(ReportSpec(dup_thresholds=(0.9, 0.99)))
    assert ReportSpec.from_mapping({"columns": None, "seed": None}) == ReportSpec()


@pytest.mark.parametrize(
    ("settings", "message"),
    [
        ({"n_topics": 0}, "n_topics must be >= 1; got 0."),
        ({"sample_size": 1}, "sample_size must be >= 2; got 1."),
        ({"map_method": "umap"}, "map_method must be"),
        ({"n_examples": -1}, "n_examples must be >= 0; got -1."),
        ({"seed": -1}, "seed must be"),
        ({"batch_size": 0}, "batch_size must be >= 1; got 0."),
        ({"dup_thresholds": [1.5]}, "dup_thresholds must"),
        ({"n_topic": 3}, "unknown setting(s) ['n_topic']"),
        ({"columns": "chunk_id"}, "columns must be a datamask.Columns"),
    ],
)
def test_bad_setting_is_refused_by_name_before_any_work(tmp_path, settings, message):
    docs, sel, _ = _docs(tmp_path)
    before = sorted(tmp_path.rglob("*"))
    with pytest.raises((ValueError, TypeError)) as err:
        build_report(str(docs), [str(sel)], **settings)
    assert message in str(err.value)
    assert sorted(tmp_path.rglob("*")) == before


@pytest.mark.parametrize(
    ("flag", "value", "message"),
    [
        ("--topics", "0", "n_topics must be >= 1; got 0."),
        ("--sample", "1", "sample_size must be >= 2; got 1."),
        ("--examples", "-1", "n_examples must be >= 0; got -1."),
        ("--batch-size", "0", "batch_size must be >= 1; got 0."),
        ("--seed", "-1", "seed must be"),
        ("--dup-thresholds", "1.5", "dup_thresholds must"),
    ],
)
def test_bad_flag_is_refused_by_name_with_nothing_written(tmp_path, capsys, flag, value, message):
    docs, sel, _ = _docs(tmp_path)
    check_refused(_argv(docs, sel, tmp_path / "rep", flag, value), tmp_path, capsys, message)


def test_flags_and_keywords_make_the_same_spec(tmp_path):
    docs, sel, _ = _docs(tmp_path)
    parse = build_parser().parse_args
    plain = report_spec_from_args(parse(_argv(docs, sel, tmp_path / "r")))
    assert plain == ReportSpec(progress=False)  # --no-progress; every spec's default: True
    flags = ["--topics", "3", "--sample", "20", "--map-method", "tsne", "--examples", "0",
             "--dup-thresholds", "0.8", "0.95", "--seed", "7", "--batch-size", "16",
             "--text-col", "text", "--length-col", "text", "--split", "train", "--id-col",
             "chunk_id", "--quality-col", "quality_score", "--trust-selection"]  # fmt: skip
    given = report_spec_from_args(parse(_argv(docs, sel, tmp_path / "r", *flags)))
    assert given == ReportSpec.from_mapping(
        {
            "n_topics": 3,
            "sample_size": 20,
            "map_method": "tsne",
            "n_examples": 0,
            "dup_thresholds": [0.95, 0.8],
            "seed": 7,
            "batch_size": 16,
            "text_col": "text",
            "length_col": "text",
            "split": "train",
            "columns": Columns(id_col="chunk_id", quality_cols=("quality_score",)),
            "trust_selection": True,
            "progress": False,  # --no-progress; the command shows bars by default
        }
    )


def test_every_setting_has_a_flag_and_its_declared_bounds():
    report = next(
        a for a in build_parser()._actions if getattr(a, "choices", None) and "report" in a.choices
    ).choices["report"]
    dests = {a.dest for a in report._actions}
    names = [o.name for o in section_settings(ReportSpec)]
    assert set(names) - {"columns"} <= dests  # columns: --id-col, --quality-col, ...
    assert {"id_col", "quality_col", "feature_col", "preset"} <= dests
    n_topics = next(o for o in section_settings(ReportSpec) if o.name == "n_topics")
    assert n_topics.allowed()[0].left == 1 and ReportSpec.n_topics == 12


def test_spec_and_keywords_give_the_same_page(tmp_path):
    docs, sel, other = _docs(tmp_path)
    kw = {"n_topics": 3, "sample_size": 30, "n_examples": 2, "seed": 5, "batch_size": 7}
    sels = [str(sel), str(other)]
    by_kw = build_report(str(docs), sels, **kw)
    by_spec = build_report(str(docs), sels, ReportSpec(**kw))
    assert render_html(by_kw) == render_html(by_spec)
    # spec and keywords together: the keywords win over the spec's fields
    over = ReportSpec.of(ReportSpec(**kw), {"seed": 6}, where="x")
    assert over == ReportSpec(**{**kw, "seed": 6})
    with pytest.raises(ValueError, match=r"unknown setting\(s\) \['topics'\] in report's"):
        build_report(str(docs), sels, ReportSpec(), topics=1)


def test_cli_runs_from_the_spec(tmp_path, capsys):
    docs, sel, other = _docs(tmp_path)
    argv = _argv(docs, sel, tmp_path / "rep", "--compare", str(other), "--topics", "3",
                 "--batch-size", "9")  # fmt: skip
    assert main(argv) == 0, capsys.readouterr().err
    page = (tmp_path / "rep" / "index.html").read_text()
    kw = {"n_topics": 3, "batch_size": 9}
    assert page == render_html(build_report(str(docs), [str(sel), str(other)], **kw))
