"""Reliability of ``report``, ``apply``, ``evaluate`` and ``embed`` (issue 34): the six
classes of the second audit, each tested as a class through the real commands."""

from __future__ import annotations

import dataclasses
import inspect
import json
from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from datamask._validation import Interval, Options
from datamask.applying.core import apply_selection
from datamask.cli import build_parser, main
from datamask.config import SECTIONS
from datamask.evaluation.browse import build_report, write_report
from datamask.evaluation.report_spec import ReportSpec
from datamask.io.parquet import read_summary
from datamask.settings import section_settings
from tests._data import reference_table, write
from tests.cli.test_reliability import _row_n_corpus, _select, check_refused, write_docs

NO_PROGRESS = ["--no-progress"]
#: What each declared setting of the report accepts.
REPORT_ALLOWED = {o.name: list(o.allowed()) for o in section_settings(ReportSpec)}


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


# --- class 5: a folder where a file is expected is named a folder, with what is accepted ----
def _folders(t: Path) -> dict[str, tuple[Path, str]]:
    """Folders a user hands over by mistake, each with what the refusal calls it."""
    docs = write_docs(t / "in" / "docs.parquet")
    _select(docs, t / "sel.parquet")  # writes its keep lists to sel.keep/
    plain = t / "plain"
    plain.mkdir()
    sharded = t / "sharded"  # the layout a sharded select leaves (tested for real below)
    (sharded / "selected").mkdir(parents=True)
    return {
        "keep-lists": (t / "sel.keep", "the keep lists of a `datamask select` output"),
        "plain": (plain, "is a folder"),
        "sharded": (sharded, "a sharded `datamask select` output"),
    }


def _file_arguments(t: Path, folder: Path) -> dict[str, list]:
    """Every command's file argument given ``folder``."""
    docs, sel = t / "in" / "docs.parquet", t / "sel.parquet"
    out = ["--output", t / "out"]
    return {
        "report --selection": ["report", "--input", docs, "--selection", folder, *out],
        "report --compare": ["report", "--input", docs, "--selection", sel, "--compare", folder]
        + out,
        "evaluate --selection": ["evaluate", "--input", docs, "--selection", folder]
        + ["--output", t / "e.json"],
        "evaluate --given-selection": ["evaluate", "--input", docs, "--selection", sel]
        + ["--given", docs, "--given-selection", folder, "--output", t / "e.json"],
        "select --given-selection": ["select", "--input", docs, "--output", t / "s.parquet"]
        + ["--given", docs, "--given-selection", folder, "--n-epochs", "5"],
        "select --config": ["select", "--config", folder, "--input", docs, *out],
    }


@pytest.mark.parametrize("kind", ["keep-lists", "plain", "sharded"])
@pytest.mark.parametrize("argument", list(_file_arguments(Path("."), Path("."))))
def test_a_folder_given_for_a_file_is_named_a_folder(tmp_path, capsys, kind, argument):
    folder, called = _folders(tmp_path)[kind]
    argv = _file_arguments(tmp_path, folder)[argument]
    err = check_refused(argv, tmp_path, capsys, "is a folder")
    assert "does not exist" not in err
    if argument != "select --config":  # a config folder is named a folder, and why
        assert called in err and "give one selection file" in err, err


@pytest.mark.parametrize("kind", ["keep-lists", "plain"])
def test_apply_names_a_folder_that_is_not_a_sharded_selection(tmp_path, capsys, kind):
    folder, called = _folders(tmp_path)[kind]
    argv = ["apply", "--input", tmp_path / "in", "--selection", folder, "--output"]
    err = check_refused([*argv, tmp_path / "kept"], tmp_path, capsys, "is a folder")
    assert "sharded `datamask select` output folder" in err  # what it accepts
    assert kind != "keep-lists" or "its selection file is" in err


@pytest.mark.slow  # a real sharded select starts a process pool
def test_a_real_sharded_selection_is_reported_and_its_other_folders_refused(tmp_path, capsys):
    """report reads a sharded run's output folder as a selection (its selected/ rows, its
    covered/ pairs); a folder inside it is named for what it is."""
    root = tmp_path / "in"
    for s in range(2):
        write_docs(root / f"s{s}.parquet", n=100, seed=s)
    out = _select(root, tmp_path / "sel", partition="shard", budget="group", runner="local")
    assert main([str(a) for a in _report(root, out, tmp_path / "rep")]) == 0
    assert "200 documents, 1 selection" in capsys.readouterr().out
    shown = build_report(str(root), [str(out)], progress=False)["selections"][0]
    assert shown["covers"] and all(0 < c["cosine"] <= 1 for c in shown["covers"])  # covered/
    argv = _report(root, out / "keep", tmp_path / "rep2")
    check_refused(argv, tmp_path, capsys, "the keep lists of a `datamask select` output")


# --- class 2: a selection is read by its rows, never by its summary -------------------------
def _edited(t: Path, how: str) -> tuple[Path, Path, set]:
    """A one-file selection edited after select wrote it (schema metadata, i.e. the
    summary, kept as an editor with pyarrow keeps it): the ids its rows now select."""
    docs = write_docs(t / "in" / "docs.parquet")
    sel = _select(docs, t / "sel.parquet")
    table = pq.read_table(sel)
    flags = np.asarray(table.column("selected").to_pylist())
    if how == "rows-removed":  # the first five selected rows deleted
        drop = np.flatnonzero(flags)[:5]
        table = table.take(np.setdiff1d(np.arange(len(flags)), drop))
    else:  # five dropped rows flipped to selected
        flags[np.flatnonzero(~flags)[:5]] = True
        table = table.set_column(1, "selected", pa.array(flags))
    pq.write_table(table, sel)
    now = table.filter(table.column("selected")).column("chunk_id").to_pylist()
    return docs, sel, set(now)


@pytest.mark.parametrize("how", ["rows-removed", "rows-added"])
def test_apply_evaluate_report_read_an_edited_selection_as_its_rows(tmp_path, capsys, how):
    docs, sel, kept = _edited(tmp_path, how)
    assert read_summary(sel)["selection_digest"]  # the stale summary is still there
    assert main(["apply", "--input", str(docs.parent), "--selection", str(sel), "--output",
                 str(tmp_path / "kept"), "--no-progress"]) == 0  # fmt: skip
    assert "was edited after `datamask select` wrote it" in capsys.readouterr().err
    applied = pq.read_table(tmp_path / "kept" / "docs.parquet").column("chunk_id").to_pylist()
    assert set(applied) == kept and len(applied) == len(kept)
    assert main(["evaluate", "--input", str(docs), "--selection", str(sel), "--output",
                 str(tmp_path / "e.json"), "--format", "json"]) == 0  # fmt: skip
    assert json.loads((tmp_path / "e.json").read_text())["k"] == len(kept)
    with pytest.warns(UserWarning, match="was edited"):
        report = build_report(str(docs), [str(sel)], n_topics=2, sample_size=50)
    assert report["selections"][0]["k"] == len(kept)


def test_apply_of_an_unedited_selection_uses_its_keep_lists_silently(tmp_path, recwarn):
    docs = write_docs(tmp_path / "in" / "docs.parquet")
    sel = _select(docs, tmp_path / "sel.parquet")
    result = apply_selection(docs.parent, sel, tmp_path / "kept", progress=False)
    assert result["mode"] == "keep" and result["kept"] == 40
    assert not [w for w in recwarn if "edited" in str(w.message)]


def test_report_shows_no_stale_terms_of_an_edited_selection(tmp_path):
    docs, sel, kept = _edited(tmp_path, "rows-removed")
    with pytest.warns(UserWarning, match="selection '.*sel.parquet' was edited"):
        report = build_report(str(docs), [str(sel)], n_topics=2, sample_size=50)
    assert report["selections"][0]["terms"] is None  # the summary's terms are of other rows
    assert report["selections"][0]["method"] == read_summary(sel)["method"]


# --- class 3: report takes every input select accepts and every value its options allow -----
def _tiny(t: Path, n: int, *, quality: str = "spread", feats: str = "spread") -> Path:
    """``n`` documents with text; quality and embeddings spread out or all equal."""
    rng = np.random.default_rng(n)
    x = rng.standard_normal((n, 8)) if feats == "spread" else np.ones((n, 8))
    q = rng.random(n) if quality == "spread" else np.full(n, 0.5)
    table = reference_table([f"d{i}" for i in range(n)], q, x)
    table = table.append_column("text", pa.array([f"word{i} text {i}" for i in range(n)]))
    return write(table, t / "docs.parquet")


def _ids(t: Path, n: int, k: int) -> Path:
    path = t / f"first{k}.txt"
    path.write_text("".join(f"d{i}\n" for i in range(k)))
    return path


@pytest.mark.parametrize("n", [1, 2, 3])
@pytest.mark.parametrize("data", ["spread", "equal-quality", "equal-embeddings"])
@pytest.mark.parametrize("map_method", REPORT_ALLOWED["map_method"][0].ordered)
def test_report_on_the_smallest_corpora_select_accepts(tmp_path, n, data, map_method):
    docs = _tiny(
        tmp_path,
        n,
        quality="equal" if data == "equal-quality" else "spread",
        feats="equal" if data == "equal-embeddings" else "spread",
    )
    sels = [str(_ids(tmp_path, n, k)) for k in sorted({1, n})]  # k = 1 and k = n
    report = build_report(str(docs), sels, map_method=map_method, sample_size=2)
    page = write_report(report, tmp_path / "rep")
    assert report["n_docs"] == n and [s["k"] for s in report["selections"]] == sorted({1, n})
    assert report["_map"]["xy"].shape == (min(n, 2), 2) and np.isfinite(report["_map"]["xy"]).all()
    assert page.stat().st_size > 0


def _bounds(constraints: list) -> list:
    """The values at the documented bounds of one setting's declaration (and the first
    value beyond each closed bound, refused)."""
    out = []
    for c in constraints:
        if isinstance(c, Interval):
            low, high = c.closed in ("both", "left"), c.closed in ("both", "right")
            if c.left is not None and low:
                out += [(c.left, True), (c.left - 1, False)]
            if c.right is not None and high:
                out += [(c.right, True), (c.right + 1, False)]
        elif isinstance(c, Options):
            out += [(v, True) for v in c.ordered] + [("no-such-" + str(c.ordered[0]), False)]
    return out


def _report_flags() -> dict[str, str]:
    """``build_report`` setting -> the report command's flag for it (from the parser)."""
    parser = build_parser()
    sub = next(a for a in parser._actions if getattr(a, "choices", None) and "report" in a.choices)
    report = sub.choices["report"]
    return {a.dest: a.option_strings[0] for a in report._actions if a.option_strings}


BOUNDS = [(name, v, ok) for name, cs in REPORT_ALLOWED.items() for v, ok in _bounds(cs)]


@pytest.mark.parametrize(("name", "value", "accepted"), BOUNDS)
def test_report_at_every_documented_bound(tmp_path, capsys, name, value, accepted):
    docs = _tiny(tmp_path, 5)
    sel = _ids(tmp_path, 5, 2)
    flag = _report_flags().get(name)
    if flag is None:  # a library-only setting: the function's door
        if accepted:
            build_report(str(docs), [str(sel)], **{name: value})
        else:
            with pytest.raises((ValueError, TypeError), match=f"{name} must be"):
                build_report(str(docs), [str(sel)], **{name: value})
        return
    argv = _report(docs, sel, tmp_path / "rep", flag, str(value))
    if accepted:
        assert main([str(a) for a in argv]) == 0, capsys.readouterr().err
        assert (tmp_path / "rep" / "index.html").is_file()
    elif isinstance(value, str):  # a choice: argparse refuses it, with the usage
        with pytest.raises(SystemExit) as exit_:
            main([str(a) for a in argv])
        assert exit_.value.code == 2 and "invalid choice" in capsys.readouterr().err
    else:
        check_refused(argv, tmp_path, capsys, f"{name} must be")


def test_every_report_setting_with_a_flag_is_declared():
    """The bounds above come from the declarations: each flag's setting has one."""
    flags = _report_flags()
    settings = {p for p in inspect.signature(build_report).parameters if p in flags}
    assert settings - {"text_col", "length_col", "dup_thresholds", "progress", "split",
                       "trust_selection"} <= set(REPORT_ALLOWED)  # fmt: skip


# --- class 4: errors name the column, the file and the row; names are drawn literally -------
N4 = 20
TEXTS = {  # a text column that is not text, and where it goes wrong
    "not-utf8": (
        pa.array([b"fine"] * 5 + [b"\xff bad"] + [b"x"] * (N4 - 6), pa.binary()),
        "is not UTF-8 text at row 5: byte 0xff",
    ),
    "int": (pa.array(range(N4)), "holds int64, not text"),
    "list": (pa.array([["a", "b"]] * N4), "holds list<"),
    "struct": (pa.array([{"a": 1}] * N4), "holds struct<a: int64>"),
}


def _with_text(t: Path, column: pa.Array, name: str = "docs.parquet") -> Path:
    rng = np.random.default_rng(0)
    table = reference_table([f"d{i}" for i in range(N4)], rng.random(N4), rng.random((N4, 8)))
    return write(table.append_column("text", column), t / "in" / name)


@pytest.mark.parametrize("kind", list(TEXTS))
@pytest.mark.parametrize("command", ["report", "report --length-col", "evaluate", "embed"])
def test_a_text_column_that_is_not_text_is_named_with_its_file(tmp_path, capsys, kind, command):
    column, message = TEXTS[kind]
    docs = _with_text(tmp_path, column)
    sel = _ids(tmp_path, N4, 4)
    argv = {
        "report": _report(docs, sel, tmp_path / "rep"),
        "report --length-col": _report(docs, sel, tmp_path / "rep", "--text-col", "chunk_id")
        + ["--length-col", "text"],
        "evaluate": ["evaluate", "--input", docs, "--selection", sel, "--length-col", "text"]
        + ["--output", tmp_path / "e.json", "--device", "cpu"],
        "embed": ["embed", "--input", docs, "--output", tmp_path / "e.parquet", "--device", "cpu"],
    }[command]
    if kind == "int" and command != "embed" and command != "report":
        assert main([str(a) for a in argv]) == 0  # numbers are lengths: accepted
        return
    if kind in ("list", "struct") and command in ("evaluate", "report --length-col"):
        message = "neither numbers nor text"
    err = check_refused(argv, tmp_path, capsys, message)
    assert "'text'" in err and "docs.parquet" in err, err


def test_null_text_is_refused_by_embed_with_its_row_and_shown_empty_by_report(tmp_path, capsys):
    docs = _with_text(tmp_path, pa.array(["a b"] * 3 + [None] + ["c d"] * (N4 - 4)))
    argv = ["embed", "--input", docs, "--output", tmp_path / "e.parquet", "--device", "cpu"]
    check_refused(argv, tmp_path, capsys, "column 'text' in docs.parquet has 1 null value(s) "
                  "(first at row 3)")  # fmt: skip
    assert main([str(a) for a in _report(docs, _ids(tmp_path, N4, 4), tmp_path / "rep")]) == 0


def test_apply_names_the_row_of_a_jsonl_line_that_is_not_utf8(tmp_path, capsys):
    sel = _select(write_docs(tmp_path / "a" / "docs.parquet"), tmp_path / "sel.parquet")
    src = tmp_path / "texts" / "docs.jsonl"
    src.parent.mkdir()
    good = b"".join(b'{"chunk_id": "x%d", "text": "t"}\n' % i for i in range(3))
    src.write_bytes(good + b'{"chunk_id": "x3", "text": "\xe9t\xe9"}\n')
    argv = ["apply", "--input", src, "--selection", sel, "--output", tmp_path / "kept"]
    err = check_refused(argv, tmp_path, capsys, "row 3 of")
    assert "docs.jsonl is not UTF-8 text: byte 0xe9 at offset 28" in err, err


@pytest.mark.parametrize("name", ["$\\frac{a}$", "$a^$", "$x$", "a_b^c", "\\alpha"])
def test_names_that_look_like_markup_are_drawn_literally(tmp_path, name, monkeypatch):
    import matplotlib

    monkeypatch.setitem(matplotlib.rcParams, "text.usetex", True)  # no TeX here: literal only
    docs = _with_text(tmp_path, pa.array(["a b"] * N4), name=f"{name}.parquet")
    table = pq.read_table(docs).rename_columns(["chunk_id", name, "feature_arr", "text"])
    pq.write_table(table, docs)  # the quality column (an axis label) named like markup too
    sel = tmp_path / f"{name}.txt"  # its stem labels the selection's panels
    sel.write_text("".join(f"d{i}\n" for i in range(5)))
    argv = _report(docs, sel, tmp_path / "rep", "--quality-col", name)
    assert main([str(a) for a in argv]) == 0
    assert matplotlib.rcParams["text.usetex"] is True  # the caller's settings are left alone
    from matplotlib import cbook

    from datamask.evaluation.plots import literal

    assert not cbook.is_math_text(literal(name))  # drawn as written, not as mathtext


# --- class 6: a setting a run ignores is said and not recorded; a hatch matching nothing too -
def _needs_declared() -> list[tuple[str, object]]:
    """Every setting declared with ``needs`` (read by some runs only), with a value that is
    not its default, chosen from its own constraints."""
    out = []
    for section in SECTIONS.values():
        for f in dataclasses.fields(section):
            if "needs" not in f.metadata:
                continue
            constraints = f.metadata["setting"][0]
            out.append((f.name, _other_value(f.default, constraints)))
    return out


def _other_value(default, constraints):
    for c in constraints:
        if isinstance(c, Options):
            return next(v for v in c.ordered if v != default)
        if isinstance(c, Interval):
            if c.type is float:
                low = c.left if c.left is not None else 0.0
                high = c.right if c.right is not None else low + 4.0
                value = (low + high) / 2
            else:
                value = int(c.left or 0) + 3
            return value if value != default else value + 1
        if c is str:
            return "elsewhere"
    raise AssertionError(f"no value for {constraints}")


NEEDS = _needs_declared()


def test_the_settings_some_runs_ignore_are_declared():
    names = {n for n, _ in NEEDS}
    assert {"chunk_size", "n_clusters", "workers", "ray_address", "gpus_per_task"} <= names


@pytest.mark.parametrize(("name", "value"), NEEDS, ids=[n for n, _ in NEEDS])
def test_a_setting_a_one_file_run_ignores_is_warned_and_not_recorded(tmp_path, name, value):
    from datamask import select
    from datamask.config import SelectSpec

    docs = write_docs(tmp_path / "docs.parquet")
    settings = dict(n_epochs=5, n_neighbors=8, select_ratio=0.2, progress=False, device="cpu")
    spec = SelectSpec.from_mapping({**settings, name: value})
    with pytest.warns(UserWarning, match=f"{name}={value!r} is ignored: a one-file run"):
        summary = select(docs, tmp_path / "sel.parquet", spec)
    assert name not in summary["settings"]  # not recorded as used
    assert summary["ignored_settings"][name]["value"] == value
    assert read_summary(tmp_path / "sel.parquet")["ignored_settings"] == summary["ignored_settings"]
    plain = select(docs, tmp_path / "plain.parquet", SelectSpec.from_mapping(settings))
    assert "ignored_settings" not in plain and name in plain["settings"]  # nothing given


@pytest.mark.parametrize(
    ("given", "ignored"),
    [
        ({"partition": "chunk", "n_clusters": 4}, {"n_clusters"}),
        ({"partition": "shard", "chunk_size": 10, "kmeans_sample": 50}, {"chunk_size",
                                                                          "kmeans_sample"}),
        ({"budget": "group", "oversample": 3.0, "exchange_neighbors": 2}, {"oversample",
                                                                            "exchange_neighbors"}),
        ({"runner": "local", "gpus_per_task": 0.5}, {"gpus_per_task"}),
        ({"n_clusters": 4, "oversample": 3.0}, set()),  # read by the defaults
    ],
)  # fmt: skip
def test_a_sharded_run_ignores_what_its_combination_does_not_read(given, ignored):
    from datamask.config import SelectSpec

    spec = SelectSpec.from_mapping(given)
    assert set(spec.ignored(sharded=True)) == ignored
    assert set(spec.ignored(sharded=False)) == set(given)  # one file: none of them is read


@pytest.mark.slow  # a sharded run starts a process pool
def test_a_sharded_manifest_records_no_ignored_setting(tmp_path):
    root = tmp_path / "in"
    for s in range(2):
        write_docs(root / f"s{s}.parquet", n=100, seed=s)
    with pytest.warns(UserWarning, match="n_clusters=4 is ignored: it is read by --partition"):
        out = _select(root, tmp_path / "sel", partition="chunk", n_clusters=4, runner="local")
    manifest = json.loads((out / "manifest.json").read_text())
    assert "n_clusters" not in manifest["settings"] and manifest["settings"]["partition"] == "chunk"
    assert manifest["ignored_settings"]["n_clusters"]["value"] == 4


def test_trust_selection_that_skips_nothing_says_so(tmp_path, capsys):
    docs = write_docs(tmp_path / "in" / "docs.parquet")
    ids = _ids(tmp_path, 200, 5)  # a list of ids: no provenance record to check
    ids.write_text("".join(f"d0-{i}\n" for i in range(5)))
    argv = _report(docs, ids, tmp_path / "rep", "--trust-selection")
    assert main([str(a) for a in argv]) == 0
    assert "--trust-selection skips nothing for" in capsys.readouterr().err
    argv = ["evaluate", "--input", docs, "--selection", ids, "--trust-selection", "--output"]
    assert main([str(a) for a in [*argv, tmp_path / "e.json", "--device", "cpu"]]) == 0
    assert "it holds no provenance record" in capsys.readouterr().err
    sel = _select(docs, tmp_path / "sel.parquet")  # with a record: trusting skips a check
    assert main([str(a) for a in _report(docs, sel, tmp_path / "r2", "--trust-selection")]) == 0
    assert "skips nothing" not in capsys.readouterr().err


def test_embed_warns_of_a_quality_col_no_quality_writes(tmp_path):
    from datamask.embedding import embed_file

    src = tmp_path / "docs.jsonl"
    src.write_text('{"body": "no text column"}\n')  # refused after the door's warning
    with (
        pytest.warns(UserWarning, match="quality_col='edu' is ignored"),
        pytest.raises(ValueError, match="column 'text' not found"),
    ):
        embed_file(src, tmp_path / "out.parquet", quality_col="edu", progress=False)


def test_a_list_of_ids_that_is_not_utf8_is_named_with_its_line(tmp_path, capsys):
    docs = write_docs(tmp_path / "in" / "docs.parquet")
    ids = tmp_path / "ids.txt"
    ids.write_bytes(b"d0-1\nd0-2\nd\xe90-3\n")
    argv = _report(docs, ids, tmp_path / "rep")
    check_refused(argv, tmp_path, capsys, "ids.txt' is not UTF-8 text: byte 0xe9 at line 3")
