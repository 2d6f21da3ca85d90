"""``datamask evaluate`` of a sharded run: the shards read whole as one corpus, the output
folder's ``selected/`` rows scored over every document (against brute force), its
provenance checked, and the refusals (unfinished, other inputs, too large)."""

from __future__ import annotations

import json

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from datamask import make_clustered
from datamask.cli.main import main
from datamask.config import SelectSpec
from datamask.distributed import LocalRunner, run_selection
from datamask.evaluation import evaluate_file, evaluate_run
from datamask.io.selection import selection_summary
from tests._data import write_corpus_shards

ROWS = 600


@pytest.fixture(scope="module")
def sharded(tmp_path_factory):
    """A sharded run over 3 shards (cluster groups of 200 rows, allocated by gains), and
    the corpus it read."""
    root = tmp_path_factory.mktemp("sharded")
    corpus = make_clustered(ROWS, 12, 6, seed=5)
    write_corpus_shards(root / "in", corpus, 3)
    spec = SelectSpec.from_mapping(
        {"partition": "cluster", "chunk_size": 200, "n_epochs": 20, "select_ratio": 0.1}
    )
    manifest = run_selection(
        root / "in", root / "out", spec, runner=LocalRunner(workers=1), progress=False
    )
    return root, corpus, manifest


def brute_j(corpus, kept: np.ndarray, lamb: float = 0.5) -> float:
    """J over every document: quality scaled over the whole corpus, coverage of every row."""
    x = np.asarray(corpus.features, dtype=np.float64)
    x /= np.linalg.norm(x, axis=1, keepdims=True)
    cover = (x @ x[kept].T).max(1).clip(min=0).mean()
    return lamb * corpus.normalized_quality()[kept].mean() + (1 - lamb) * cover


def test_a_sharded_run_is_scored_over_every_document(sharded, tmp_path):
    root, corpus, manifest = sharded
    report = evaluate_file(root / "in", root / "out", tmp_path / "e.json")
    chosen = set(pq.read_table(root / "out" / "selected").column("chunk_id").to_pylist())
    kept = np.flatnonzero([i in chosen for i in corpus.ids])
    assert report["n_docs"] == ROWS and report["k"] == len(kept) == manifest["k"]
    assert report["objective"]["J"] == pytest.approx(brute_j(corpus, kept), abs=1e-6)
    # the run's own J, from its cover, is a lower bound where the cover is not exact
    assert report["objective"]["J"] >= manifest["terms"]["J"] - 1e-6
    assert report["provenance"] == {"trusted": False, "verified_files": 3}
    assert json.loads((tmp_path / "e.json").read_text())["selection"] == str(root / "out")


def test_the_command_takes_the_folders_and_writes_beside_the_output(sharded, tmp_path, capsys):
    root, _, _ = sharded
    shards = tmp_path / "shards"
    shards.mkdir()
    for f in sorted((root / "in").glob("*.parquet")):
        (shards / f.name).write_bytes(f.read_bytes())  # a copy: the same content
    out = tmp_path / "run"
    (out / "selected").mkdir(parents=True)
    for f in (root / "out").glob("*.json"):
        (out / f.name).write_bytes(f.read_bytes())
    for f in (root / "out" / "selected").glob("*.parquet"):
        (out / "selected" / f.name).write_bytes(f.read_bytes())
    assert main(["evaluate", "--input", f"{shards}/*.parquet", "--selection", str(out)]) == 0
    assert f"wrote {tmp_path / 'run.eval.json'}" in capsys.readouterr().out
    assert (tmp_path / "run.eval.json").is_file()


def test_other_shards_and_unfinished_runs_are_refused(sharded, tmp_path):
    root, _, _ = sharded
    other = tmp_path / "other"
    write_corpus_shards(other, make_clustered(ROWS, 12, 6, seed=6), 3)
    with pytest.raises(ValueError, match="part-00000.parquet is not the file the selection"):
        evaluate_file(other, root / "out", tmp_path / "e.json")
    unfinished = tmp_path / "unfinished"
    (unfinished / "selected").mkdir(parents=True)
    manifest = json.loads((root / "out" / "manifest.json").read_text())
    (unfinished / "manifest.json").write_text(json.dumps({**manifest, "complete": False}))
    with pytest.raises(ValueError, match="unfinished .* then evaluate it"):
        evaluate_file(root / "in", unfinished, tmp_path / "e.json")
    assert not (tmp_path / "e.json").exists()  # refused before any work


def test_shards_too_large_for_memory_are_refused_before_reading(sharded, tmp_path, monkeypatch):
    root, _, _ = sharded
    monkeypatch.setattr(evaluate_run, "available_bytes", lambda: 10_000)
    refused = r"600 rows of 12-d embeddings: about 0.2 MB to evaluate whole, more than the 0.0 MB"
    with pytest.raises(ValueError, match=refused):
        evaluate_file(root / "in", root / "out", tmp_path / "e.json")


def test_a_token_budget_run_is_scored_per_token(tmp_path):
    """Under a token budget the objective is J per token, as the run's manifest reports it
    (quality per budget token, coverage per token): exact here, against brute force, and
    never below the manifest's, a lower bound."""
    corpus = make_clustered(ROWS, 12, 6, seed=7)
    paths = write_corpus_shards(tmp_path / "in", corpus, 3)
    rng = np.random.default_rng(0)
    lengths = []
    for path in paths:
        table = pq.read_table(path)
        n_chars = rng.integers(50, 3000, table.num_rows)
        pq.write_table(table.append_column("n_chars", pa.array(n_chars)), path)
        lengths.append(n_chars)
    lengths = np.concatenate(lengths).astype(np.float64)
    spec = SelectSpec.from_mapping(
        {"partition": "cluster", "chunk_size": 200, "n_epochs": 20}
        | {"select_token_ratio": 0.1, "length_col": "n_chars"}
    )
    out = tmp_path / "out"
    manifest = run_selection(tmp_path / "in", out, spec, runner=LocalRunner(workers=1))
    report = evaluate_file(tmp_path / "in", out, tmp_path / "e.json")
    budget = manifest["tokens"]["budget"]
    assert report["objective"]["per"] == "token"
    assert report["objective"]["budget_tokens"] == budget
    chosen = set(pq.read_table(out / "selected").column("chunk_id").to_pylist())
    kept = np.flatnonzero([i in chosen for i in corpus.ids])
    x = np.asarray(corpus.features, dtype=np.float64)
    x /= np.linalg.norm(x, axis=1, keepdims=True)
    cover = (x @ x[kept].T).max(1).clip(min=0)
    quality = (corpus.normalized_quality()[kept] * lengths[kept]).sum() / budget
    j = 0.5 * quality + 0.5 * (lengths * cover).sum() / lengths.sum()
    assert report["objective"]["J"] == pytest.approx(j, abs=1e-6)
    assert report["objective"]["J"] >= manifest["terms"]["J"] - 1e-6


def test_a_selection_argument_is_checked_before_any_work(sharded, tmp_path):
    """A finished run's folder gives its manifest; a folder that looks like one but holds
    neither a manifest nor selected parts, or any other folder, is refused by name."""
    root, _, manifest = sharded
    read = selection_summary(root / "out", what="--selection", then="x")
    assert read["complete"] and read["selection_digest"] == manifest["selection_digest"]
    empty = tmp_path / "empty"
    (empty / "selected").mkdir(parents=True)
    with pytest.raises(ValueError, match="without manifest.json or selected parts"):
        selection_summary(empty, what="--selection", then="x")
    with pytest.raises(ValueError, match=r"is a folder \(no manifest.json\), not a sharded"):
        selection_summary(tmp_path, what="--given-selection", then="x")


def test_a_run_missing_a_selected_part_is_refused_then_rewritten_by_select(sharded, tmp_path):
    """A finished run with a selected part deleted: evaluate, report, apply and
    --given-selection refuse it, naming the parts (before, each read the parts left and
    went on with fewer documents); select again writes the part back, byte for byte."""
    import shutil

    root, _, manifest = sharded
    out = tmp_path / "out"
    shutil.copytree(root / "out", out)
    parts = {p.name: p.read_bytes() for p in (out / "selected").glob("*.parquet")}
    assert len(parts) == manifest["output"]["parts"] > 1
    (out / "selected" / "part-00001.parquet").unlink()
    refused = rf"holds {len(parts) - 1} selected part\(s\) .* says the run wrote {len(parts)}"
    with pytest.raises(ValueError, match=refused):
        evaluate_file(root / "in", out, tmp_path / "e.json")
    for argv in (
        ["apply", "--input", str(root / "in"), "--selection", str(out), "--output", "kept"],
        ["report", "--input", str(root / "in"), "--selection", str(out), "--output", "page"],
    ):
        assert main([*argv[:-1], str(tmp_path / argv[-1]), "--no-progress"]) == 2
        assert not (tmp_path / argv[-1]).exists()
    spec = SelectSpec.from_mapping(
        {"partition": "cluster", "chunk_size": 200, "n_epochs": 20, "select_ratio": 0.1}
    )
    again = run_selection(root / "in", out, spec, runner=LocalRunner(workers=1), progress=False)
    assert {p.name: p.read_bytes() for p in (out / "selected").glob("*.parquet")} == parts
    assert again["selection_digest"] == manifest["selection_digest"]
