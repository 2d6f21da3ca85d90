"""A user term defined here, used by name through ``select``, ``bench`` and a sharded run.

``--term-module tests.objectives.test_user_terms`` imports this file (pytest puts the repo root
on the path and spawned workers inherit it), which registers ``Spread``; the generated
``--power`` flag is its parameter. Every path must score with it exactly as a direct
evaluation does.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path
from typing import ClassVar

import numpy as np
import pyarrow.parquet as pq
import pytest
import torch

from datamask import Corpus, Objective, make_clustered, register_term
from datamask._validation import Interval
from datamask.cli import main
from datamask.io.parquet import read_corpus, read_summary
from datamask.objectives import Quality, ValueTerm
from tests._data import with_column, write_reference_layout, write_shards

MODULE = __name__  # tests.objectives.test_user_terms: importable from the repo root
FAST = ["--device", "cpu", "--no-progress", "--select-ratio", "0.1"]


@register_term("Spread")
class Spread(ValueTerm):
    """``1 - |mean of the selected unit embeddings| ** power``: higher when the selection
    points in many directions. Value-only: gains by differencing, no lazy evaluation."""

    name = "spread"
    _parameter_constraints: ClassVar[dict[str, list]] = {
        "power": [Interval(float, 0, None, closed="neither")],
    }

    def __init__(self, power: float = 1.0) -> None:
        self.power = power

    def value(self, selected: torch.Tensor) -> float:
        centre = self.features_[selected].double().mean(0)
        return float(1.0 - centre.norm() ** self.power)


@register_term("ShortDocs")
class ShortDocs(ValueTerm):
    """Reads an extra column: ``1 - mean(n_chars) / max(n_chars)`` over the selection."""

    name = "short"
    requires_columns = ("n_chars",)

    def value(self, selected: torch.Tensor) -> float:
        n_chars = np.asarray(self.ctx_.columns["n_chars"], dtype=np.float64)
        return float(1.0 - n_chars[selected.cpu().numpy()].mean() / n_chars.max())


def _with_lengths(path: Path, n: int = 300) -> np.ndarray:
    """The demo layout plus an ``n_chars`` column; returns the lengths."""
    _write(path, n=n)
    lengths = np.random.default_rng(0).integers(100, 5000, size=n)
    with_column(path, "n_chars", lengths)
    return lengths


def _write(path: Path, n: int = 300, seed: int = 0) -> Path:
    return write_reference_layout(path, make_clustered(n, 16, 5, seed=seed))


def _j(corpus, rows: np.ndarray, power: float, lamb: float = 0.5) -> dict[str, float]:
    """The objective by hand: quality term and Spread, bound to the corpus."""
    obj = Objective([Spread(power)], lamb=lamb).bind(corpus, len(rows), "cpu")
    return obj.term_values(np.sort(rows))


@pytest.mark.slow
def test_select_uses_the_user_term_and_its_flag(tmp_path):
    docs = _write(tmp_path / "docs.parquet")
    out = tmp_path / "sel.parquet"
    argv = ["select", "--input", docs, "--output", out, "--term-module", MODULE]
    argv += ["--algorithm", "Spread", "--power", "2", "--method", "greedy", *FAST]
    assert main([str(a) for a in argv]) == 0
    summary = read_summary(out)
    assert summary["settings"]["algorithm"] == ["Spread"]
    assert summary["settings"]["power"] == 2.0 and summary["settings"]["term_modules"] == [MODULE]
    corpus = read_corpus(docs)
    table = pq.read_table(out).to_pydict()
    rows = np.flatnonzero(table["selected"])
    expected = _j(corpus, rows, power=2.0)
    assert set(summary["terms"]) == {"quality", "spread", "J"}
    for key, value in expected.items():
        assert summary["terms"][key] == pytest.approx(value, abs=1e-9)
    # the greedy maximised this objective: it beats the top-quality subset on it
    topk = np.argsort(-corpus.normalized_quality(), kind="stable")[: len(rows)]
    assert expected["J"] > _j(corpus, topk, power=2.0)["J"]
    # in a fresh process without the module the name is unknown: argparse refuses it
    bare = [str(a) for a in argv if a not in ("--term-module", MODULE)]
    done = subprocess.run(
        [sys.executable, "-m", "datamask.cli", *bare], capture_output=True, text=True
    )
    assert done.returncode == 2 and "invalid choice: 'Spread'" in done.stderr


@pytest.mark.slow
def test_bench_runs_the_user_term_in_spawned_processes(tmp_path):
    docs = _write(tmp_path / "docs.parquet")
    out = tmp_path / "bench"
    argv = ["bench", "--input", docs, "--out-dir", out, "--term-module", MODULE]
    argv += ["--algorithm", "Spread", "--methods", "greedy", "topk", "--no-plots"]
    argv += ["--device", "cpu", "--no-progress", "--select-ratio", "0.1"]
    assert main([str(a) for a in argv]) == 0  # isolated: every method in a spawned process
    data = json.loads((out / "bench.json").read_text())
    assert data["settings"]["algorithm"] == ["Spread"]
    runs = {r["label"]: r for r in data["runs"]}
    corpus = read_corpus(docs)
    for run in runs.values():
        assert set(run["terms"]) == {"quality", "spread", "J"}
    assert runs["greedy"]["terms"]["J"] > runs["topk"]["terms"]["J"]
    topk = np.argsort(-corpus.normalized_quality(), kind="stable")[:30]
    assert runs["topk"]["terms"]["J"] == pytest.approx(_j(corpus, topk, 1.0)["J"], abs=1e-9)


@pytest.mark.slow
def test_sharded_run_uses_the_user_term_in_spawned_workers(tmp_path):
    shards = tmp_path / "shards"
    shards.mkdir()
    whole = make_clustered(360, 16, 5, seed=0)
    for s in range(3):
        rows = slice(120 * s, 120 * (s + 1))
        part = Corpus(
            ids=whole.ids[rows], quality=whole.quality[rows], features=whole.features[rows]
        )
        write_reference_layout(shards / f"part-{s}.parquet", part)
    common = ["--term-module", MODULE, "--algorithm", "Spread", "--method", "greedy"]
    common += ["--partition", "chunk", "--chunk-size", "150", "--runner", "local", *FAST]
    outs = {}
    for workers in ("1", "2"):
        out = tmp_path / f"out-{workers}"
        argv = ["select", "--input", shards, "--output", out, "--workers", workers, *common]
        assert main([str(a) for a in argv]) == 0
        outs[workers] = json.loads((out / "manifest.json").read_text())
        ids = pq.read_table(out / "selected").column("chunk_id").to_pylist()
        outs[workers]["ids"] = sorted(ids)
    spawned = outs["2"]
    assert {g["pid"] for g in spawned["groups"]} - {os.getpid()}  # ran in worker processes
    assert spawned["settings"]["algorithm"] == ["Spread"]
    assert spawned["budget"]["global_round"]["terms"].keys() == {"quality", "spread", "J"}
    # every group optimised the user's term (a group step does not score itself)
    assert all(set(g["term_labels"]) == {"quality", "spread"} for g in spawned["groups"])
    assert spawned["ids"] == outs["1"]["ids"]  # the same selection in-process and spawned


def test_a_term_reads_the_extra_column_it_requires(tmp_path, capsys):
    docs = tmp_path / "docs.parquet"
    lengths = _with_lengths(docs)
    out = tmp_path / "sel.parquet"
    argv = ["select", "--input", docs, "--output", out, "--term-module", MODULE]
    argv += ["--algorithm", "ShortDocs", "--method", "greedy", "--lamb", "0.2", *FAST]
    assert main([str(a) for a in argv]) == 0
    rows = np.flatnonzero(pq.read_table(out).column("selected").to_numpy(zero_copy_only=False))
    summary = read_summary(out)
    want = 1.0 - lengths[rows].mean() / lengths.max()
    assert summary["terms"]["short"] == pytest.approx(want, abs=1e-12)
    assert lengths[rows].mean() < lengths.mean()  # it did prefer short documents
    # an input without the column is refused before anything is written
    bare = tmp_path / "bare.parquet"
    _write(bare)
    code = main([str(a) for a in [*argv[:2], bare, "--output", tmp_path / "o.parquet", *argv[5:]]])
    assert code == 2 and "n_chars" in capsys.readouterr().err
    assert not (tmp_path / "o.parquet").exists()


@pytest.mark.parametrize("budget", ["global", "group"])
def test_a_sharded_run_carries_the_required_column_to_every_round(tmp_path, budget):
    docs = tmp_path / "docs.parquet"
    lengths = _with_lengths(docs, n=360)
    table = pq.read_table(docs)
    shards = tmp_path / "shards"
    write_shards(table, shards, 120)
    out = tmp_path / "out"
    argv = ["select", "--input", shards, "--output", out, "--term-module", MODULE]
    argv += ["--algorithm", "ShortDocs", "--method", "greedy", "--lamb", "0.2", "--budget"]
    argv += [budget, "--workers", "1", "--partition", "shard", *FAST]  # a central round
    assert main([str(a) for a in argv]) == 0
    m = json.loads((out / "manifest.json").read_text())
    kept = set(pq.read_table(out / "selected").column("chunk_id").to_pylist())
    rows = np.flatnonzero(np.isin(table.column("chunk_id").to_pylist(), list(kept)))
    assert len(rows) == 36 and lengths[rows].mean() < lengths.mean()
    if budget == "global":  # the global round scored the candidates with the column too
        cands = pq.read_table(out / "_work" / "candidates").column("chunk_id").to_pylist()
        assert len(cands) == m["budget"]["candidates"] > 36
        pool = lengths[np.isin(table.column("chunk_id").to_pylist(), cands)]
        want = 1.0 - lengths[rows].mean() / pool.max()
        assert m["budget"]["global_round"]["terms"]["short"] == pytest.approx(want, abs=1e-12)


def test_a_term_taken_by_another_class_is_refused():
    class Other(ValueTerm):
        name = "other"

        def value(self, selected: torch.Tensor) -> float:
            return 0.0

    with pytest.raises(ValueError, match="'Spread' is already registered"):
        register_term("Spread")(Other)
    assert Quality().name == "quality"
