"""``datamask evaluate``: every metric against brute-force numpy, selection files, the CLI."""

from __future__ import annotations

import argparse
import json
from pathlib import Path

import numpy as np
import pytest

from datamask import Objective, make_clustered
from datamask.cli.evaluate import add_evaluate_parser, run_evaluate
from datamask.data import Corpus
from datamask.evaluation import evaluate_selection, format_report, length_stats, read_selection
from datamask.objectives import DiSF, FacilityLocation, PairwiseSimilarity
from tests._data import with_column, write_columns, write_reference_layout


def brute_metrics(corpus: Corpus, rows: np.ndarray) -> dict[str, float]:
    x = corpus.features.astype(np.float64)
    xs = x[rows]
    k = len(rows)
    sims = xs @ xs.T
    off = ~np.eye(k, dtype=bool)
    z = (xs - xs.mean(0)) / xs.std(0)
    corr = z.T @ z / k
    nn = np.where(off, sims, -np.inf).max(1)
    q = corpus.normalized_quality()
    return {
        "quality_mean": q[rows].mean(),
        "facility_coverage": np.mean(
            [max(0.0, max(x[i] @ x[j] for j in rows)) for i in range(len(x))]
        ),
        "mean_pairwise_similarity": sims[off].mean(),
        "disf_loss": (corr**2).sum() - np.trace(corr**2),
        "mean_nn_similarity": nn.mean(),
    }


@pytest.mark.parametrize("seed", [0, 1, 2])
def test_metrics_equal_brute_force(seed):
    corpus = make_clustered(60, 5, 3, seed=seed)
    rows = np.random.default_rng(seed).choice(60, size=9, replace=False)
    report = evaluate_selection(corpus, rows, algorithm=["Facility", "Pair_simi", "DiSF"])
    want = brute_metrics(corpus, rows)
    for name, value in want.items():
        assert report["metrics"][name] == pytest.approx(value, rel=1e-4, abs=1e-5), name
    # The objective is the project's, bound at k = |selection|.
    obj = Objective([FacilityLocation(), PairwiseSimilarity(), DiSF()], lamb=0.5)
    terms = obj.bind(corpus, 9, "cpu").term_values(rows)
    assert report["objective"]["terms"] == pytest.approx(terms)
    assert report["objective"]["J"] == pytest.approx(terms["J"])
    assert report["objective"]["terms"]["facility"] == pytest.approx(
        want["facility_coverage"], rel=1e-5
    )
    assert report["k"] == 9 and report["n_docs"] == 60
    assert report["metrics"]["quality_mean_all"] == pytest.approx(
        corpus.normalized_quality().mean()
    )


def test_hand_computed_toy():
    # Three unit vectors: e1, e2 and (e1 + e2)/sqrt(2); select the first two.
    r = 1 / np.sqrt(2)
    x = np.array([[1, 0], [0, 1], [r, r]], dtype=np.float32)
    corpus = Corpus(
        ids=np.array(["a", "b", "c"], dtype=object), quality=np.array([0.0, 1.0, 0.5]), features=x
    )
    report = evaluate_selection(corpus, np.array([0, 1]))
    m = report["metrics"]
    assert m["facility_coverage"] == pytest.approx((1 + 1 + r) / 3)
    assert m["mean_pairwise_similarity"] == pytest.approx(0.0)
    assert m["mean_nn_similarity"] == pytest.approx(0.0)
    assert m["quality_mean"] == pytest.approx(0.5)
    assert report["length"] is None


def test_length_distribution_from_counts_or_texts():
    corpus = make_clustered(40, 4, 2, seed=0)
    corpus.extra["n_chars"] = np.arange(40) * 10
    rows = np.arange(0, 40, 4)
    rep = evaluate_selection(corpus, rows)
    assert rep["length"]["column"] == "n_chars"
    assert rep["length"]["selected"] == length_stats(np.arange(0, 40, 4) * 10.0)
    assert rep["length"]["selected"]["p50"] == pytest.approx(np.median(rows * 10))
    del corpus.extra["n_chars"]
    corpus.extra["text"] = np.array(["x" * i for i in range(40)], dtype=object)
    rep = evaluate_selection(corpus, rows)
    assert rep["length"]["column"] == "len(text)"
    assert rep["length"]["all"]["mean"] == pytest.approx(19.5)
    assert "len(text) p50" in format_report(rep)


def test_bad_rows_are_rejected():
    corpus = make_clustered(20, 4, 2, seed=0)
    with pytest.raises(ValueError, match="must not repeat"):
        evaluate_selection(corpus, np.array([1, 1]))
    with pytest.raises(ValueError, match=r"must lie in \[0, 20\)"):
        evaluate_selection(corpus, np.array([3, 20]))
    with pytest.raises(ValueError, match="algorithm must be one of"):
        evaluate_selection(corpus, np.array([3]), algorithm="facility")


# --- selection files ------------------------------------------------------------------------
def test_read_selection_formats(tmp_path: Path):
    ids = np.array([f"doc-{i}" for i in range(10)], dtype=object)
    write_columns(
        tmp_path / "sel.parquet",
        chunk_id=list(ids),
        selected=[i % 3 == 0 for i in range(10)],
        logit=np.zeros(10, np.float32),
    )
    assert read_selection(tmp_path / "sel.parquet", ids).tolist() == [0, 3, 6, 9]
    write_columns(tmp_path / "ids.parquet", chunk_id=["doc-7", "doc-2"], rank=[1, 2])
    assert read_selection(tmp_path / "ids.parquet", ids).tolist() == [7, 2]
    write_columns(tmp_path / "one.parquet", whatever=["doc-5"])
    assert read_selection(tmp_path / "one.parquet", ids).tolist() == [5]
    (tmp_path / "ids.txt").write_text("doc-1\n\ndoc-4\n")
    assert read_selection(tmp_path / "ids.txt", ids).tolist() == [1, 4]


def test_read_selection_errors(tmp_path: Path):
    ids = np.array(["a", "b", "c"], dtype=object)
    (tmp_path / "bad.txt").write_text("a\nzz\nyy\n")
    with pytest.raises(ValueError, match=r"2 ids in .*bad.txt are not in the data \(first: 'zz'\)"):
        read_selection(tmp_path / "bad.txt", ids)
    (tmp_path / "dup.txt").write_text("a\na\n")
    with pytest.raises(ValueError, match="id 'a' is listed twice"):
        read_selection(tmp_path / "dup.txt", ids)
    write_columns(tmp_path / "two.parquet", x=["a"], y=["b"])
    with pytest.raises(ValueError, match="column 'chunk_id' not found .* available columns"):
        read_selection(tmp_path / "two.parquet", ids)
    with pytest.raises(ValueError, match="does not exist"):
        read_selection(tmp_path / "nope.parquet", ids)
    (tmp_path / "empty.txt").write_text("\n")
    with pytest.raises(ValueError, match="selects no documents"):
        read_selection(tmp_path / "empty.txt", ids)


def test_a_folder_given_as_a_selection_file_is_named_a_folder(tmp_path: Path):
    """A folder where a selection file is expected (a sharded select output, a keep-list
    folder, any folder) is said to be a folder, not "not to exist"."""
    ids = np.array(["a", "b", "c"], dtype=object)
    (tmp_path / "plain").mkdir()
    with pytest.raises(ValueError, match=r"'.*plain' is a folder, not a file; give one"):
        read_selection(tmp_path / "plain", ids)
    sharded = tmp_path / "sharded"
    (sharded / "selected").mkdir(parents=True)
    write_columns(sharded / "selected" / "part-00000.parquet", chunk_id=["a"], selected=[True])
    with pytest.raises(ValueError, match=r"is a folder, not a file \(a sharded `datamask sel"):
        read_selection(sharded, ids)


# --- the command ----------------------------------------------------------------------------
def _parse(argv: list[str]) -> argparse.Namespace:
    parser = argparse.ArgumentParser()
    add_evaluate_parser(parser.add_subparsers(dest="command"))
    return parser.parse_args(["evaluate", *argv])


def test_evaluate_command_writes_json_and_table(tmp_path: Path, small_corpus, capsys):
    data = write_reference_layout(tmp_path / "docs.parquet", small_corpus)
    keep = np.zeros(small_corpus.n_docs, dtype=bool)
    keep[::5] = True
    write_columns(tmp_path / "sel.parquet", chunk_id=list(small_corpus.ids), selected=keep)
    args = _parse(
        [
            "--input",
            str(data),
            "--selection",
            str(tmp_path / "sel.parquet"),
            "--device",
            "cpu",
            "--algorithm",
            "Facility",
            "DiSF",
            "--lamb",
            "0.3",
        ]
    )
    assert run_evaluate(args) == 0
    out = capsys.readouterr().out
    assert "facility coverage" in out and "DiSF correlation loss" in out
    report = json.loads((tmp_path / "sel.eval.json").read_text())
    assert report["k"] == keep.sum()
    assert report["objective"]["algorithm"] == ["Facility", "DiSF"]
    assert report["objective"]["lamb"] == 0.3
    assert set(report["objective"]["terms"]) == {"quality", "facility", "disf", "J"}


def test_evaluate_command_reads_length_and_prints_json(tmp_path: Path, capsys):
    corpus = make_clustered(30, 4, 2, seed=0)
    data = write_reference_layout(tmp_path / "docs.parquet", corpus)
    with_column(data, "n_chars", np.arange(30) + 100)
    (tmp_path / "sel.txt").write_text("\n".join(corpus.ids[:6]))
    args = _parse(
        [
            "--input",
            str(data),
            "--selection",
            str(tmp_path / "sel.txt"),
            "--device",
            "cpu",
            "--format",
            "json",
            "--output",
            str(tmp_path / "r.json"),
        ]
    )
    assert run_evaluate(args) == 0
    printed = json.loads(capsys.readouterr().out)
    assert printed["length"]["column"] == "n_chars"
    assert printed["length"]["selected"]["mean"] == pytest.approx(102.5)
    assert json.loads((tmp_path / "r.json").read_text())["k"] == 6


def test_evaluate_command_bad_input(tmp_path: Path, small_corpus):
    data = write_reference_layout(tmp_path / "docs.parquet", small_corpus)
    (tmp_path / "sel.txt").write_text("not-an-id\n")
    with pytest.raises(ValueError, match="not in the data"):
        run_evaluate(_parse(["--input", str(data), "--selection", str(tmp_path / "sel.txt")]))
    with pytest.raises(ValueError, match=r"lamb must be in \[0, 1\]"):
        run_evaluate(
            _parse(["--input", str(data), "--selection", str(tmp_path / "sel.txt"), "--lamb", "2"])
        )
    with pytest.raises(ValueError, match="column 'n_words' not found"):
        run_evaluate(
            _parse(
                [
                    "--input",
                    str(data),
                    "--selection",
                    str(tmp_path / "sel.txt"),
                    "--length-col",
                    "n_words",
                ]
            )
        )


def test_cli_exit_codes(tmp_path: Path, small_corpus):
    import datamask.cli as cli  # a broken CLI import fails the test, never skips it

    data = write_reference_layout(tmp_path / "docs.parquet", small_corpus)
    (tmp_path / "sel.txt").write_text("\n".join(small_corpus.ids[:10]))
    ok = cli.main(
        [
            "evaluate",
            "--input",
            str(data),
            "--selection",
            str(tmp_path / "sel.txt"),
            "--device",
            "cpu",
        ]
    )
    assert ok == 0
    (tmp_path / "bad.txt").write_text("nope\n")
    bad = cli.main(["evaluate", "--input", str(data), "--selection", str(tmp_path / "bad.txt")])
    assert bad == 2


@pytest.mark.parametrize("method", ["exact", "ivf"])
def test_the_pair_search_shows_progress_when_asked(method, capsys):
    """``progress`` draws a bar over the whole input's pair search (evaluate's long loop);
    the default and ``--no-progress`` draw nothing, and the figures do not change."""
    corpus = make_clustered(300, 8, 4, seed=0)
    rows = np.arange(0, 300, 7)
    quiet = evaluate_selection(corpus, rows, dup_search=method)
    assert capsys.readouterr().err == ""
    shown = evaluate_selection(corpus, rows, dup_search=method, progress=True)
    assert "pairs" in capsys.readouterr().err
    assert shown["redundancy"]["all"]["thresholds"] == quiet["redundancy"]["all"]["thresholds"]


def test_evaluate_command_passes_no_progress(tmp_path: Path, small_corpus, capsys):
    data = write_reference_layout(tmp_path / "docs.parquet", small_corpus)
    write_columns(tmp_path / "sel.parquet", chunk_id=list(small_corpus.ids[::4]))
    base = ["--input", str(data), "--selection", str(tmp_path / "sel.parquet"), "--device", "cpu"]
    assert run_evaluate(_parse([*base, "--no-progress"])) == 0
    assert "pairs" not in capsys.readouterr().err
    assert run_evaluate(_parse([*base, "--output", str(tmp_path / "b.json")])) == 0
    assert "pairs" in capsys.readouterr().err


def test_lengths_missing_are_refused_before_scoring():
    """A named length column that was not read, or a token budget without any length
    column, is refused naming it (the lengths are looked up once, for the budget and the
    length section)."""
    corpus = make_clustered(60, 8, 3, seed=0)
    with pytest.raises(ValueError, match="length column 'n_tok' was not read from"):
        evaluate_selection(corpus, np.arange(6), length_col="n_tok", dup_all=False)
    with pytest.raises(ValueError, match="a token budget's J counts each document by its length"):
        evaluate_selection(corpus, np.arange(6), budget_tokens=100.0, dup_all=False)
    corpus.extra["n_chars"] = np.arange(60, dtype=np.int64) + 1
    report = evaluate_selection(corpus, np.arange(6), budget_tokens=21.0, dup_all=False)
    assert report["objective"]["per"] == "token" and report["length"]["tokens"]["kept"] == 21.0
