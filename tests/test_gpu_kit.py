"""The GPU benchmark kit (``benchmarks/gpu/run.py``) at tiny sizes on the CPU, so that it is
never broken when a GPU is lent: every figure runs, writes its JSON, and RESULTS.md names
the device and every figure."""

from __future__ import annotations

import importlib.util
import json
import sys
from argparse import Namespace
from pathlib import Path

import pytest

SCRIPT = Path(__file__).resolve().parents[1] / "benchmarks" / "gpu" / "run.py"


@pytest.fixture(scope="module")
def kit():
    spec = importlib.util.spec_from_file_location("gpu_kit", SCRIPT)
    module = importlib.util.module_from_spec(spec)
    sys.modules["gpu_kit"] = module  # dataclasses look their module up by name
    spec.loader.exec_module(module)
    return module


@pytest.mark.slow
def test_smoke_runs_every_figure_and_writes_the_report(kit, tmp_path, capsys):
    results, work = tmp_path / "results", tmp_path / "work"
    argv = ["--all", "--smoke", "--in-process", "--device", "cpu"]
    argv += ["--results", str(results), "--work", str(work)]
    assert kit.main(argv) == 0
    figures = {name: json.loads((results / f"{name}.json").read_text()) for name in kit.FIGURES}
    assert all(d["status"] == "done" for d in figures.values()), figures
    assert all(d["machine"]["device"] == "cpu" and d["met"] is None for d in figures.values())
    assert figures["correctness"]["passed"] > 0 and figures["correctness"]["failed"] == 0
    graph = figures["graph"]
    assert graph["recall_at_k"] == 1.0 and graph["precision"] == "fp32"  # CPU: fp32 exact
    assert graph["max_sim_error_vs_fp32"] < 1e-5
    assert graph["variant_recall"] == {f"topk_chunk={kit.SMOKE.topk_chunks[0]}": 1.0}
    group = figures["group"]
    assert group["k"] == round(0.1 * kit.SMOKE.group_n)
    assert set(group["phases"]) == {
        "read",
        "graph",
        "learn_and_round",
        "exact_J",
        "cover",
        "write",
        "total",
    }
    assert 0 < group["round_seconds"] <= group["phases"]["learn_and_round"]
    # the steps' time leaves out the graph the first step builds (it was counted twice)
    assert 0 < group["learn_seconds"] <= group["phases"]["learn_and_round"]
    assert group["phases"]["exact_J"] > 0 and group["phases"]["write"] >= 0
    assert any("datamask/api.py" in line and "(select)" in line for line in group["profile"])
    greedy = figures["greedy"]
    assert greedy["j_ratio"] == pytest.approx(greedy["learner"]["J"] / greedy["greedy"]["J"])
    for name, dim in (("sharded-384", 384), ("sharded-1536", kit.SMOKE.wide_dim)):
        assert figures[name]["dim"] == dim and figures[name]["docs_per_second"] > 0
        assert figures[name]["devices"] == ["cpu"]
        # the files each phase wrote, by folder: where a run cut off at its cap had got to
        counts: dict[str, int] = {}
        for seconds, changed in figures[name]["timeline"]:  # each entry: the changed counts
            assert seconds >= 0
            counts.update(changed)
        assert counts["_work/clusters"] > 0 and counts["keep"] > 0
    embed = figures["embed"]
    assert embed["embed_file_docs_per_second"] > 0 or embed["status"] == "skipped"
    report = (results / "RESULTS.md").read_text()
    assert "Device: cpu (torch" in report
    assert all(f"| {name} | done |" in report for name in kit.FIGURES)
    assert not list(work.glob("shards-*"))  # the generated shards are removed
    assert "| greedy | done |" in capsys.readouterr().out


def test_a_figure_cut_off_keeps_what_it_wrote_and_says_so(kit, tmp_path):
    results = tmp_path / "results"
    results.mkdir()
    args = Namespace(
        device="cpu", results=results, work=str(tmp_path / "work"), smoke=True, keep_data=False
    )
    kit.run_isolated("group", args, timeout=0.5)  # a child that cannot finish in 0.5 s
    data = json.loads((results / "group.json").read_text())
    assert data["status"] == "timeout" and data["figure"] == "group"
    assert data["stopped_after_s"] >= 0.5
    kit.write_report(results)
    assert "| group | timeout |" in (results / "RESULTS.md").read_text()


def test_parts_cover_every_figure_once_and_results_default_to_out(kit, monkeypatch, tmp_path):
    listed = [name for names in kit.PARTS.values() for name in names]
    assert sorted(listed) == sorted(kit.FIGURES) and len(kit.PARTS) <= 3
    assert set(kit.CAPS) == set(kit.TARGETS) == set(kit.FIGURES)
    monkeypatch.setenv("OUT", str(tmp_path))
    assert kit.results_dir(None, smoke=False) == tmp_path
    assert kit.report_path(tmp_path) == tmp_path / "RESULTS.md"
    monkeypatch.delenv("OUT")
    assert kit.report_path(kit.results_dir(None, smoke=False)) == SCRIPT.parent / "RESULTS.md"


def test_sizes_change_one_field_at_a_time_and_bad_keys_exit_2(kit, tmp_path, capsys):
    args = Namespace(smoke=False, size=["group_n=200000", "embed_batches=32,256"])
    sizes = kit.sizes_of(args)
    assert sizes.group_n == 200_000 and sizes.embed_batches == (32, 256)
    assert sizes.sharded_n == kit.Sizes().sharded_n  # the rest as they were
    with pytest.raises(SystemExit) as exc:
        kit.main(["--report", "--results", str(tmp_path), "--size", "group=1"])
    assert exc.value.code == 2
    assert "--size takes KEY=VALUE with KEY one of group_n" in capsys.readouterr().err


@pytest.mark.skipif(__import__("torch").cuda.is_available(), reason="this machine has CUDA")
def test_asking_for_cuda_without_it_stops_before_any_figure(kit, tmp_path, capsys):
    with pytest.raises(SystemExit) as exc:
        kit.main(["--part", "1", "--results", str(tmp_path)])
    assert exc.value.code == 2
    assert "CUDA is not available here" in capsys.readouterr().err
    assert not list(tmp_path.glob("*.json"))


@pytest.mark.slow
def test_the_gpu_correctness_run_selects_every_cuda_test(kit):
    import subprocess

    repo = SCRIPT.parents[2]
    cmd = [sys.executable, "-m", "pytest", *kit.CORRECTNESS_TESTS, "--collect-only", "-q"]
    cmd += ["-o", "addopts=", "-p", "no:cacheprovider"]
    every = subprocess.run(cmd, cwd=repo, capture_output=True, text=True).stdout.splitlines()
    chosen = subprocess.run(
        [*cmd, "-k", kit.CORRECTNESS_SELECT], cwd=repo, capture_output=True, text=True
    ).stdout.splitlines()
    cuda = [line for line in every if line.startswith("tests/test_cuda.py::")]
    assert len(cuda) >= 16 and set(cuda) <= set(chosen)
    assert any("test_bf16_search" in line for line in chosen)
