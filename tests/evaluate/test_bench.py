"""``datamask bench``: tables, JSON and PNGs on a tiny corpus; memory measurement; the CLI."""

from __future__ import annotations

import argparse
import builtins
import json
from pathlib import Path

import numpy as np
import pytest

from datamask import make_clustered
from datamask.cli.bench import add_bench_parser, run_bench
from datamask.evaluation import bench, format_markdown, measure_peak_rss

ALL = ["mask", "greedy", "stochastic-greedy", "disf-greedy", "topk", "random"]
FAST = {"mask": {"n_epochs": 30}, "disf-greedy": {"batch_size": 50}}


def test_bench_writes_table_json_and_plots(tmp_path: Path):
    pytest.importorskip("matplotlib")
    corpus = make_clustered(200, 8, 4, seed=0)
    result = bench(
        corpus,
        methods=ALL,
        select_ratio=0.1,
        device="cpu",
        method_params=FAST,
        isolate=False,
        out_dir=tmp_path,
    )
    assert set(result["files"]) == {
        "curve_png",
        "objective_vs_time_png",
        "map_png",
        "markdown",
        "json",
    }
    for name in ("bench.md", "bench.json", "curve.png", "objective_vs_time.png", "map.png"):
        assert (tmp_path / name).stat().st_size > 0, name
    for name in ("curve.png", "objective_vs_time.png", "map.png"):
        assert (tmp_path / name).read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
        assert (tmp_path / name).stat().st_size < 200_000  # small enough to commit
    md = (tmp_path / "bench.md").read_text()
    for method in ALL:
        assert f"| {method} |" in md
    assert "| method | DiSF loss / greedy DiSF | time saved vs greedy DiSF |" in md
    data = json.loads((tmp_path / "bench.json").read_text())
    runs = {r["label"]: r for r in data["runs"]}
    assert set(runs) == set(ALL)
    for method in ALL:
        r = runs[method]
        assert len(r["selected"]) == 20
        assert r["seconds"] > 0 and r["rss_before_mb"] > 0 and np.isfinite(r["peak_mb"])
        assert set(r["metrics"]) >= {"facility_coverage", "disf_loss", "mean_nn_similarity"}
        assert r["terms"]["J"] == pytest.approx(
            r["terms"]["quality"] * 0.5 + r["terms"]["facility"] * 0.5
        )
    assert runs["greedy"]["J_vs_greedy"] == 1.0
    assert runs["mask"]["J_vs_greedy"] == pytest.approx(
        runs["mask"]["terms"]["J"] / runs["greedy"]["terms"]["J"]
    )
    assert runs["greedy"]["terms"]["J"] >= runs["random"]["terms"]["J"]
    assert runs["disf-greedy"]["disf_loss_vs_disf_greedy"] == 1.0
    assert set(data["figures"]) >= {
        "mask_J_pct_of_greedy",
        "mask_time_pct_of_greedy",
        "mask_time_saved_pct_vs_disf_greedy",
    }
    assert runs["mask"]["history"]  # the learner's curve is recorded


@pytest.mark.slow
def test_bench_isolated_runs_measure_memory(tmp_path: Path):
    corpus = make_clustered(150, 8, 3, seed=1)
    result = bench(
        corpus,
        methods=["greedy", "random"],
        select_ratio=0.1,
        device="cpu",
        isolate=True,
        out_dir=None,
        plots=False,
    )
    inproc = bench(
        corpus,
        methods=["greedy", "random"],
        select_ratio=0.1,
        device="cpu",
        isolate=False,
        plots=False,
    )
    for a, b in zip(result["runs"], inproc["runs"], strict=True):
        np.testing.assert_array_equal(a["selected"], b["selected"])  # same result either way
        assert a["memory_method"] in ("clear_refs+VmHWM", "rss-sampling-2ms")
        assert a["rss_before_mb"] > 10  # a real process with torch loaded
    assert "files" not in result


def test_measure_peak_rss_sees_a_large_allocation():
    def allocate() -> int:
        block = np.ones(64 * 2**20 // 8)  # 64 MiB, touched
        return int(block.sum())

    value, memory = measure_peak_rss(allocate)
    assert value == 64 * 2**20 // 8
    assert memory["peak_mb"] > 50


def test_markdown_without_greedy_has_dashes():
    corpus = make_clustered(80, 4, 2, seed=0)
    result = bench(
        corpus,
        methods=["topk", "random"],
        select_ratio=0.1,
        device="cpu",
        isolate=False,
        plots=False,
    )
    md = format_markdown(result)
    assert "| topk |" in md and "J / sparse greedy" in md
    assert result["figures"] == {}


def test_bench_rejects_bad_arguments():
    corpus = make_clustered(50, 4, 2, seed=0)
    with pytest.raises(ValueError, match="methods must be one of"):
        bench(corpus, methods=["lazy"], isolate=False)
    with pytest.raises(ValueError, match="methods not being run"):
        bench(corpus, methods=["topk"], method_params={"mask": {}}, isolate=False)
    with pytest.raises(ValueError, match=r"lamb in bench's arguments must be in \[0, 1\]"):
        bench(corpus, methods=["topk"], lamb=3.0, isolate=False)
    with pytest.raises(ValueError, match="map_method must be"):
        bench(corpus, methods=["topk"], map_method="umap", isolate=False)


def test_missing_matplotlib_names_the_extra(tmp_path: Path, monkeypatch):
    real_import = builtins.__import__

    def no_matplotlib(name, *args, **kwargs):
        if name == "matplotlib" or name.startswith("matplotlib."):
            raise ImportError("no matplotlib")
        return real_import(name, *args, **kwargs)

    monkeypatch.setattr(builtins, "__import__", no_matplotlib)
    corpus = make_clustered(50, 4, 2, seed=0)
    with pytest.raises(ImportError, match=r"pip install datamask\[plot\]"):
        bench(corpus, methods=["topk"], isolate=False, out_dir=tmp_path)
    assert not (tmp_path / "bench.md").exists()  # checked before any work or output


def _parse(argv: list[str]) -> argparse.Namespace:
    parser = argparse.ArgumentParser()
    add_bench_parser(parser.add_subparsers(dest="command"))
    return parser.parse_args(["bench", *argv])


def test_bench_command(tmp_path: Path, capsys):
    args = _parse(
        [
            "--synthetic",
            "120",
            "--dim",
            "6",
            "--clusters",
            "3",
            "--out-dir",
            str(tmp_path),
            "--methods",
            "greedy",
            "stochastic-greedy",
            "topk",
            "--select_ratio",
            "0.1",
            "--eps",
            "0.5",
            "--param",
            "greedy.batch_size=4",
            "--no-plots",
            "--no-isolate",
            "--device",
            "cpu",
        ]
    )
    assert run_bench(args) == 0
    out = capsys.readouterr().out
    assert "| stochastic-greedy |" in out
    data = json.loads((tmp_path / "bench.json").read_text())
    assert data["settings"]["method_params"] == {
        "stochastic-greedy": {"eps": 0.5},
        "greedy": {"batch_size": 4},
    }
    assert data["settings"]["n_docs"] == 120 and data["settings"]["k"] == 12
    assert not (tmp_path / "map.png").exists()


def test_bench_command_bad_input(tmp_path: Path):
    with pytest.raises(ValueError, match="--param takes METHOD.KEY=VALUE"):
        run_bench(
            _parse(
                [
                    "--synthetic",
                    "50",
                    "--out-dir",
                    str(tmp_path),
                    "--param",
                    "eps=1",
                    "--no-plots",
                    "--no-isolate",
                ]
            )
        )
    with pytest.raises(ValueError, match="lists a method twice"):
        run_bench(
            _parse(
                [
                    "--synthetic",
                    "50",
                    "--out-dir",
                    str(tmp_path),
                    "--methods",
                    "topk",
                    "topk",
                    "--no-plots",
                    "--no-isolate",
                ]
            )
        )
    with pytest.raises(SystemExit):  # argparse: --input and --synthetic are exclusive
        _parse(["--synthetic", "50", "--input", "x.parquet", "--out-dir", str(tmp_path)])
