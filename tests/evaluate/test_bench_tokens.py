"""``datamask bench`` under a token budget (issue 46): every method keeps the same budget of
tokens read from the length column, its kept documents and tokens shown side by side, the
default methods included."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest

from datamask import make_clustered
from datamask.cli.main import main
from datamask.doors import bench
from datamask.evaluation.bench_spec import DEFAULT_METHODS, BenchSpec
from tests._data import reference_table, write

FAST = {"mask": {"n_epochs": 30}}
TOKEN_METHODS = ["mask", "greedy", "stochastic-greedy", "disf-greedy", "topk", "random"]


def _tokens_file(tmp_path: Path, n: int = 160) -> tuple[Path, np.ndarray]:
    corpus = make_clustered(n, 8, 4, seed=0)
    lengths = np.random.default_rng(1).integers(5, 400, size=n)
    feats = np.asarray(corpus.features, dtype=np.float32)
    table = reference_table(list(corpus.ids), corpus.quality[:, 0], feats, n_tokens=lengths)
    return write(table, tmp_path / "docs.parquet"), lengths.astype(float)


def test_every_method_keeps_the_same_token_budget(tmp_path: Path):
    path, lengths = _tokens_file(tmp_path)
    out = tmp_path / "bench"
    code = main(
        [
            "bench",
            "--input",
            str(path),
            "--output",
            str(out),
            "--methods",
            *TOKEN_METHODS,
            "--select-token-ratio",
            "0.1",
            "--n-epochs",
            "30",
            "--no-plots",
            "--no-isolate",
            "--device",
            "cpu",
        ]
    )
    assert code == 0
    data = json.loads((out / "bench.json").read_text())
    budget = 0.1 * lengths.sum()
    settings = data["settings"]
    assert settings["budget_tokens"] == pytest.approx(budget)
    assert settings["length_col"] == "n_tokens" and settings["k"] is None
    assert settings["corpus_tokens"] == pytest.approx(lengths.sum())
    for r in data["runs"]:
        kept = lengths[r["selected"]].sum()
        assert r["tokens"] == pytest.approx(kept), r["label"]
        assert r["budget_tokens"] == pytest.approx(budget), r["label"]
        assert budget - lengths.max() <= kept <= budget, r["label"]
        assert r["k"] == len(r["selected"])
    md = (out / "bench.md").read_text()
    assert "| method | kept docs | kept tokens | J |" in md
    assert f"token budget {budget:,.0f}" in md
    greedy = next(r for r in data["runs"] if r["label"] == "greedy")
    assert f"| greedy | {greedy['k']:,} | {greedy['tokens']:,.0f} |" in md


def test_isolated_runs_carry_the_lengths(tmp_path: Path):
    path, lengths = _tokens_file(tmp_path, n=80)
    result = bench(
        str(path), None, methods=["topk"], budget_tokens=2000.0, device="cpu", plots=False
    )
    (run,) = result["runs"]
    assert run["budget_tokens"] == 2000.0
    assert 2000 - lengths.max() <= lengths[run["selected"]].sum() <= 2000


def test_the_default_methods_all_run_under_a_token_budget():
    spec = BenchSpec.from_mapping({"select_token_ratio": 0.2})
    assert spec.methods == DEFAULT_METHODS


def test_one_budget_at_a_time():
    with pytest.raises(ValueError, match="give the budget one way"):
        BenchSpec.from_mapping({"select_ratio": 0.2, "select_token_ratio": 0.1})


def test_a_corpus_without_lengths_is_refused_with_the_budget_error():
    corpus = make_clustered(50, 4, 2, seed=0)
    with pytest.raises(ValueError, match="--select-token-ratio needs each document's length"):
        bench(corpus, None, methods=["topk"], select_token_ratio=0.1, plots=False)
