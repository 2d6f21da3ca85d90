"""``datamask report`` and ``datamask evaluate`` of selections made under a token budget
(issue 46): each selection's kept tokens shown beside its kept documents, with the budget
its summary records; a page without lengths unchanged (test_report pins it)."""

from __future__ import annotations

import json

import numpy as np
import pytest

from datamask import make_clustered, select
from datamask.cli import main
from datamask.evaluation.browse import build_report, render_html
from tests._data import reference_table, write


@pytest.fixture(scope="module")
def made(tmp_path_factory) -> dict:
    root = tmp_path_factory.mktemp("tokens")
    n = 150
    corpus = make_clustered(n, 8, 4, seed=0)
    lengths = np.random.default_rng(2).integers(5, 300, size=n).astype(float)
    feats = np.asarray(corpus.features, dtype=np.float32)
    table = reference_table(list(corpus.ids), corpus.quality[:, 0], feats, n_tokens=lengths)
    path = write(table, root / "docs.parquet")
    out = {"root": root, "input": path, "lengths": lengths, "ids": list(corpus.ids)}
    for method in ("greedy", "topk"):
        sel = root / f"{method}.parquet"
        summary = select(
            str(path),
            sel,
            method=method,
            select_token_ratio=0.2,
            length_col="n_tokens",
            device="cpu",
        )
        out[method] = (sel, summary)
    return out


def _kept(made: dict, method: str) -> float:
    sel = made[method][1]
    return sel["tokens"]["kept"]


def test_report_shows_the_kept_tokens_beside_the_kept_documents(made):
    sels = [str(made["greedy"][0]), str(made["topk"][0])]
    report = build_report(str(made["input"]), sels, n_topics=2, sample_size=100)
    total = made["lengths"].sum()
    assert report["tokens_all"] == pytest.approx(total)
    page = render_html(report)
    assert "tokens kept (n_tokens)" in page
    for s, method in zip(report["selections"], ("greedy", "topk"), strict=True):
        kept = _kept(made, method)
        budget = made[method][1]["tokens"]["budget"]
        assert s["tokens_kept"] == pytest.approx(kept)
        assert s["tokens"]["budget"] == pytest.approx(0.2 * total)
        assert f"{kept:,.0f} of {total:,.0f}" in page
        assert f"budget {budget:,.0f}" in page


def test_report_cli_shows_the_kept_tokens(made, tmp_path):
    argv = ["report", "--input", made["input"], "--selection", made["greedy"][0]]
    argv += ["--output", tmp_path / "page", "--topics", "2", "--no-progress"]
    assert main([str(a) for a in argv]) == 0
    page = (tmp_path / "page" / "index.html").read_text()
    assert f"{_kept(made, 'greedy'):,.0f} of {made['lengths'].sum():,.0f}" in page


def test_evaluate_reports_the_kept_tokens_and_the_budget(made, tmp_path):
    sel = made["topk"][0]
    out = tmp_path / "eval.json"
    argv = ["evaluate", "--input", made["input"], "--selection", sel, "--output", out]
    assert main([str(a) for a in argv]) == 0
    tokens = json.loads(out.read_text())["length"]["tokens"]
    assert tokens["kept"] == pytest.approx(_kept(made, "topk"))
    assert tokens["all"] == pytest.approx(made["lengths"].sum())
    assert tokens["budget"] == pytest.approx(made["topk"][1]["tokens"]["budget"])
