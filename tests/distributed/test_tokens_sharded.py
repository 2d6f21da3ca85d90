"""Token budgets on sharded runs (issue 46): the budget's bounds, J against one file, resume."""

from __future__ import annotations

import json

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from datamask._validation import check_corpus
from datamask.api import select
from datamask.budget import TokenBudget
from datamask.config import SelectSpec
from datamask.data import Corpus
from datamask.distributed.executors import LocalRunner
from datamask.distributed.manifest import step_seconds
from datamask.distributed.runner import run_selection


def _corpus(seed: int, n: int = 240, n_clusters: int = 4, dim: int = 8) -> pa.Table:
    rng = np.random.default_rng(seed)
    centers = rng.normal(size=(n_clusters, dim)) * 3
    labels = rng.integers(0, n_clusters, n)
    emb = (centers[labels] + rng.normal(size=(n, dim))).astype(np.float32)
    return pa.table(
        {
            "chunk_id": pa.array([f"d{i:05d}" for i in range(n)]),
            "quality_score": pa.array(rng.random(n) + 0.3 * labels),
            "n_chars": pa.array(rng.integers(20, 400, n)),
            "feature_arr": pa.FixedSizeListArray.from_arrays(pa.array(emb.ravel()), dim),
        }
    )


def _shards(table: pa.Table, folder, n_shards: int = 3):
    folder.mkdir()
    step = -(-table.num_rows // n_shards)
    for s in range(n_shards):
        pq.write_table(table.slice(s * step, step), folder / f"{s:03d}.parquet")
    return folder


def _spec(**more) -> SelectSpec:
    flat = {"select_token_ratio": 0.1, "length_col": "n_chars", "method": "greedy"}
    return SelectSpec.from_mapping({**flat, **more})


def _kept_ids(out) -> set[str]:
    parts = sorted((out / "selected").glob("part-*.parquet"))
    return {i for p in parts for i in pq.read_table(p).column("chunk_id").to_pylist()}


@pytest.mark.parametrize(
    "method, seed", [("greedy", s) for s in range(10)] + [("topk", s) for s in range(3)]
)
def test_tokens_within_budget(tmp_path, method, seed):
    """greedy: the central round over every group's candidates; topk: each group's share
    and the fill of what they left (:mod:`datamask.distributed.select.tokens`)."""
    table = _corpus(seed, n=120)
    shards = _shards(table, tmp_path / "in")
    spec = _spec(partition="chunk", chunk_size=40, seed=seed, method=method)
    manifest = run_selection(shards, tmp_path / "out", spec, runner=LocalRunner(), progress=False)
    ids, sizes = table.column("chunk_id").to_pylist(), table.column("n_chars").to_pylist()
    lengths = dict(zip(ids, sizes, strict=True))
    kept = _kept_ids(tmp_path / "out")
    used = sum(lengths[i] for i in kept)
    total = 0.1 * sum(lengths.values())
    assert total - max(lengths.values()) <= used <= total
    tokens = manifest["totals"]["tokens"]
    assert tokens["kept"] == pytest.approx(used)
    assert tokens["budget"] == pytest.approx(total)
    assert tokens["corpus"] == sum(lengths.values()) and tokens["length_col"] == "n_chars"
    assert manifest["totals"]["k"] == len(kept)


def _exact_j(table: pa.Table, ids: set[str], spec: SelectSpec) -> float:
    lengths = np.asarray(table.column("n_chars").to_numpy(), dtype=np.float64)
    corpus = check_corpus(
        Corpus(
            ids=np.asarray(table.column("chunk_id").to_pylist()),
            quality=table.column("quality_score").to_numpy()[:, None],
            features=np.stack(table.column("feature_arr").to_numpy(zero_copy_only=False)),
            lengths=lengths,
        )
    )
    budget = TokenBudget(lengths, 0.1 * lengths.sum())
    objective = spec.objective.make().bind(corpus, budget.expected_count(), budget=budget)
    rows = np.flatnonzero(np.isin(corpus.ids, list(ids)))
    return objective.term_values(rows)["J"]


def test_sharded_j_close_to_one_file(tmp_path):
    table = _corpus(7, n=300, n_clusters=5)
    pq.write_table(table, tmp_path / "all.parquet")
    spec = _spec()
    select(str(tmp_path / "all.parquet"), tmp_path / "one" / "sel.parquet", spec)
    one = pq.read_table(tmp_path / "one" / "sel.parquet")
    one_ids = set(one.filter(one.column("selected")).column("chunk_id").to_pylist())
    shards = _shards(table, tmp_path / "in")
    # clusters merged up to 100 rows: several groups, at the default --oversample (2); the
    # allocation by gains per token (benchmarks/tokens/RESULTS.md: 100.00% of one file)
    sharded = _spec(chunk_size=100)
    manifest = run_selection(shards, tmp_path / "out", sharded, progress=False)
    assert manifest["totals"]["n_groups"] > 1
    assert manifest["budget"]["allocation"] == "gains"
    # the exchange round re-priced every group above its lower neighbours' kept rows, per
    # token, and the parts were written from its candidates
    assert manifest["budget"]["global_round"]["seconds"]["exchange"] > 0
    exchanged = sorted((tmp_path / "out" / "_work" / "exchange").glob("[0-9]*.parquet"))
    assert len(exchanged) == manifest["totals"]["n_groups"]
    assert {"length", "price"} <= set(pq.read_schema(exchanged[-1]).names)
    j_one = _exact_j(table, one_ids, spec)
    j_sharded = _exact_j(table, _kept_ids(tmp_path / "out"), spec)
    assert j_sharded >= 0.998 * j_one
    # the manifest's J over every document, per token, from the cover: exact here (every
    # group compared with every other), so the objective itself
    cover = manifest["cover"]
    assert cover["searched_all_groups"] and cover["exact"] == cover["rows"] == 300
    assert manifest["terms"]["J"] == pytest.approx(j_sharded, rel=1e-6)
    # the phases one after another, as a document run reports them: the global round
    # ends before the cover begins (it once ran on to the end of the keep lists)
    seconds = manifest["totals"]["seconds"]
    phases = ("plan", "select", "global", "cover")
    assert all(seconds[p] > 0 for p in phases)
    assert sum(seconds[p] for p in phases) <= seconds["total"]


def test_resume_reuses_every_group(tmp_path):
    shards = _shards(_corpus(3, n=150), tmp_path / "in")
    spec = _spec(partition="chunk", chunk_size=50)
    first = run_selection(shards, tmp_path / "out", spec, progress=False)
    kept = _kept_ids(tmp_path / "out")
    again = run_selection(shards, tmp_path / "out", spec, progress=False)
    assert again["totals"]["groups_reused"] == again["totals"]["n_groups"] == 3
    assert _kept_ids(tmp_path / "out") == kept
    assert again["totals"]["tokens"] == first["totals"]["tokens"]
    saved = json.loads((tmp_path / "out" / "manifest.json").read_text())
    assert saved["totals"]["tokens"]["kept"] == first["totals"]["tokens"]["kept"]


def test_bad_length_refused_naming_shard_and_row(tmp_path):
    table = _corpus(0, n=90)
    sizes = table.column("n_chars").to_numpy().copy()
    sizes[40] = 0  # shard 001.parquet, its row 10
    table = table.set_column(2, "n_chars", pa.array(sizes))
    shards = _shards(table, tmp_path / "in")
    with pytest.raises(ValueError, match=r"001\.parquet.*first at row 10"):
        run_selection(shards, tmp_path / "out", _spec(partition="chunk"), progress=False)


def test_groups_proposing_more_tokens_keep_their_earlier_proposals(tmp_path):
    """Clusters whose documents score above the rest have their whole curves kept and
    propose twice their tokens, again; the manifest counts every proposal."""
    shards = _shards(_corpus(0, n=600, n_clusters=6), tmp_path / "in")
    spec = _spec(method="mask", partition="cluster", chunk_size=120, oversample=1.0, lamb=0.9)
    manifest = run_selection(shards, tmp_path / "out", spec, progress=False)
    assert manifest["budget"]["global_round"]["rounds"] > 1
    again = [g for g in manifest["groups"] if "earlier" in g]
    assert again and all(e["seconds"]["total"] > 0 for g in again for e in g["earlier"])
    every = sum(step_seconds(g, "total") for g in manifest["groups"])
    assert manifest["summary"]["group_seconds"]["sum"] == pytest.approx(every)


@pytest.mark.parametrize("method", ["greedy", "mask"])
def test_one_group_covers_from_its_graph(tmp_path, method):
    """One group under a token budget (no central round): its select step keeps its graph
    for the cover, which reads each row's nearest kept row from it (exact at 240 rows),
    and deletes it."""
    table = _corpus(3)
    spec = _spec(method=method, partition="cluster", chunk_size=240)
    manifest = run_selection(
        _shards(table, tmp_path / "in"), tmp_path / "out", spec, progress=False
    )
    cover = manifest["cover"]
    assert manifest["totals"]["n_groups"] == 1
    assert cover["routes"]["graph"] > 0 and cover["exact"] == cover["rows"] == 240
    assert not list((tmp_path / "out" / "_work").glob("graphs/*.npz"))


def test_groups_allocated_by_gains_per_token_cover_from_their_graphs(tmp_path):
    """Several groups under a token budget, allocated by gains per token: each keeps its
    graph for the cover, which reads the rows' nearest kept rows of their own group from
    it (and equals the exact search: every group compared with every other), then deletes
    the graphs."""
    table = _corpus(7, n=300, n_clusters=5)
    spec = _spec(chunk_size=100)
    manifest = run_selection(
        _shards(table, tmp_path / "in"), tmp_path / "out", spec, progress=False
    )
    cover = manifest["cover"]
    assert manifest["totals"]["n_groups"] > 1 and manifest["budget"]["allocation"] == "gains"
    assert cover["routes"]["graph"] > 0 and cover["exact"] == cover["rows"] == 300
    assert not list((tmp_path / "out" / "_work").glob("graphs/*.npz"))


def test_a_saved_graph_holds_cosines_under_a_token_budget(tmp_path):
    """The graph a group saves for the exchange round and its cover holds each pair's
    cosine, not the token budget's weighted rows: binding weighs it again (it was weighed
    twice, and the exchange round's prices per token with it)."""
    from types import SimpleNamespace

    from datamask.budget import TokenBudget
    from datamask.data import Corpus
    from datamask.distributed.paths import WorkDir
    from datamask.distributed.select.graphs import keep_graph, saved_graph
    from datamask.objectives.facility_location import facility_term

    table = _corpus(3, n=200)
    x = np.asarray(table.column("feature_arr").to_pylist(), dtype=np.float32)
    x /= np.linalg.norm(x, axis=1, keepdims=True)
    lengths = table.column("n_chars").to_numpy().astype(np.float64)
    corpus = Corpus(ids=np.arange(200), quality=np.ones((200, 1)), features=x)
    objective = _spec().objective.make()
    objective.bind(corpus, 20, "cpu", budget=TokenBudget(lengths, 0.1 * lengths.sum()))
    facility_term(objective).build_graph()  # as the selector's fit builds it
    job = SimpleNamespace(
        spec=_spec(),
        propose=True,
        totals=(1.0, 1.0),
        tokens=object(),
        dirs=WorkDir.of(tmp_path / "out"),
        group=SimpleNamespace(gid=0),
    )
    keep_graph(job, corpus, objective)
    idx, sims = saved_graph(job.dirs.graph(0))
    cosines = np.einsum("ij,ikj->ik", x, x[idx.numpy()]).clip(min=0)
    np.testing.assert_allclose(sims.numpy(), cosines, atol=1e-5)


def test_copied_shards_match_the_provenance_of_a_token_run(tmp_path):
    """The manifest's checksums cover the columns it records (the lengths too), so the
    same shards copied elsewhere (new paths, new mtimes) are still the selection's input:
    before, the scan's checksum left the length column out and `apply` of a copy refused
    it as "its content differs"."""
    from datamask.cli import main
    from datamask.io.shards import content_checksum

    src = _shards(_corpus(4), tmp_path / "shards")
    out = tmp_path / "out"
    run_selection(src, out, _spec(), progress=False)
    record = json.loads((out / "manifest.json").read_text())["provenance"]
    assert "n_chars" in record["columns"]
    for name, entry in record["files"].items():
        assert entry["checksum"] == content_checksum(src / name, record["columns"])
    copy = tmp_path / "copy"
    copy.mkdir()
    for f in sorted(src.glob("*.parquet")):
        (copy / f.name).write_bytes(f.read_bytes())
    argv = ["--input", str(copy), "--selection", str(out), "--no-progress"]
    assert main(["apply", *argv, "--output", str(tmp_path / "kept")]) == 0
    assert main(["evaluate", *argv, "--output", str(tmp_path / "e.json")]) == 0
    assert json.loads((tmp_path / "e.json").read_text())["k"] == len(_kept_ids(out))


def test_a_finished_token_run_writes_a_deleted_part_again(tmp_path):
    """A rerun of a finished run whose groups asked for more tokens, with one selected part
    deleted (or killed before the allocation's marker): the parts come back byte for byte.
    Before, the allocation's marker was trusted without its parts (the keep lists then
    miscounted), and the token runs' "want" files were read as document counts
    (KeyError: 'candidates')."""
    shards = _shards(_corpus(0, n=600, n_clusters=6), tmp_path / "in")
    spec = _spec(method="mask", partition="cluster", chunk_size=120, oversample=1.0, lamb=0.9)
    out = tmp_path / "out"
    first = run_selection(shards, out, spec, progress=False)
    assert list((out / "_work" / "candidates").glob("*.want.json"))  # asked for more
    parts = {p.name: p.read_bytes() for p in (out / "selected").glob("*.parquet")}
    victim = sorted(parts)[1]
    (out / "selected" / victim).unlink()
    again = run_selection(shards, out, spec, progress=False)
    assert {p.name: p.read_bytes() for p in (out / "selected").glob("*.parquet")} == parts
    assert again["selection_digest"] == first["selection_digest"]
    (out / "_work" / "completions" / "global").unlink()  # killed before the marker
    third = run_selection(shards, out, spec, progress=False)
    assert third["selection_digest"] == first["selection_digest"]
