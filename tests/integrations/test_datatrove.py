"""The datatrove steps: features -> select (one rank per group) -> filter, end to end."""

from __future__ import annotations

import importlib.util
import os
from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest

os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TRANSFORMERS_OFFLINE", "1")
pytest.importorskip("datatrove")

from datatrove.data import Document  # noqa: E402

from datamask import select_table  # noqa: E402
from datamask.integrations.datatrove import (  # noqa: E402
    DatamaskFeatures,
    DatamaskFilter,
    group_seed,
)
from tests._data import ROOT, SHIPPED_DEMO, write, write_columns, write_shards  # noqa: E402

DEMO = SHIPPED_DEMO
EXAMPLE = ROOT / "examples" / "datatrove" / "select_pipeline.py"


def load_example():
    spec = importlib.util.spec_from_file_location("select_pipeline", EXAMPLE)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def read_folder(folder: Path) -> pa.Table:
    files = sorted(folder.glob("*.parquet"))
    return pa.concat_tables([pq.read_table(f) for f in files])


@pytest.mark.skipif(not DEMO.exists(), reason="examples/demo/demo_docs.parquet not present")
def test_example_pipeline_end_to_end_on_the_demo(tmp_path):
    demo = pq.read_table(DEMO)
    shards = tmp_path / "in"
    write_shards(demo, shards, 750)  # 3,000 documents in four shards of 750
    work = tmp_path / "work"
    argv = [
        "--input",
        str(shards),
        "--work",
        str(work),
        "--tasks",
        "4",
        "--groups",
        "2",
        "--select-ratio",
        "0.1",
        "--precomputed",
        "--removed",
    ]
    assert load_example().main(argv) == 0

    kept = read_folder(work / "output")
    removed = read_folder(work / "removed")
    assert kept.num_rows == 300 and removed.num_rows == 2700
    assert set(kept["id"].to_pylist()).isdisjoint(removed["id"].to_pylist())
    assert kept.column_names == ["text", "id", "metadata"]  # datatrove's layout, all columns
    assert "source" in kept["metadata"].type.names

    # each group is what select_table picks from its feature files, with the group's seed
    expected = set()
    for g, files in enumerate([["00000", "00002"], ["00001", "00003"]]):
        features = pa.concat_tables(
            [pq.read_table(work / "features" / f"{f}.parquet") for f in files]
        ).replace_schema_metadata(None)
        sel = select_table(features, select_ratio=0.1, seed=group_seed(0, g, 2), device="cpu")
        ids = sel.filter(sel["selected"])["chunk_id"].to_pylist()
        assert len(ids) == 150
        group = pq.read_table(work / "selection" / "groups" / f"{g:05d}.parquet")
        assert sorted(group.filter(group["selected"])["chunk_id"].to_pylist()) == sorted(ids)
        expected.update(ids)
    assert set(kept["id"].to_pylist()) == expected
    # the features came from the input's columns
    f0 = pq.read_table(work / "features" / "00000.parquet")
    np.testing.assert_array_equal(
        f0["quality_score"].to_numpy(), demo["quality_score"].to_numpy()[:750]
    )

    before = {p: p.stat().st_mtime_ns for p in (work / "output").glob("*.parquet")}
    assert load_example().main(argv) == 0  # every task completed: nothing runs again
    assert {p: p.stat().st_mtime_ns for p in (work / "output").glob("*.parquet")} == before


@pytest.mark.slow
def test_features_computed_from_text_and_documents_pass_through(tmp_path):
    from datamask.embedding import embed_texts
    from datamask.quality import heuristic_quality_batch

    texts = [f"Sentence number {i} about {w}." for i, w in enumerate(["cats", "stocks"] * 5)]
    docs = [Document(text=t, id=f"d{i}") for i, t in enumerate(texts)]
    step = DatamaskFeatures(str(tmp_path / "features"), chunk_docs=4)
    out = list(step.run(iter(docs), rank=3, world_size=5))
    assert [d.id for d in out] == [d.id for d in docs]
    table = pq.read_table(tmp_path / "features" / "00003.parquet")
    assert table["chunk_id"].to_pylist() == [d.id for d in docs]
    emb = np.stack(table["feature_arr"].to_numpy(zero_copy_only=False))
    np.testing.assert_allclose(emb, embed_texts(texts, progress=False), atol=1e-5)
    np.testing.assert_array_equal(table["quality_score"].to_numpy(), heuristic_quality_batch(texts))
    assert (
        pq.read_schema(tmp_path / "features" / "00003.parquet").metadata[b"datamask.world_size"]
        == b"5"
    )

    with pytest.raises(ValueError, match=r"document 'd0' has no metadata key 'emb'"):
        list(DatamaskFeatures(str(tmp_path / "f2"), embedding_key="emb").run(iter(docs)))
    assert not (tmp_path / "f2" / "00000.parquet").exists()


def test_filter_loads_its_own_keep_list_only_when_the_task_counts_match(tmp_path):
    keep = tmp_path / "sel" / "keep"
    keep.mkdir(parents=True)
    for r, ids in enumerate([["a"], ["b", "c"]]):
        write_columns(
            keep / f"{r:05d}.parquet", chunk_id=ids, metadata={"datamask.world_size": "2"}
        )
    step = DatamaskFilter(str(tmp_path / "sel"))
    assert step._load(1, 2) == {"b", "c"}
    assert step._load(1, 3) == {"a", "b", "c"}  # other task count: every list
    assert DatamaskFilter(str(tmp_path / "sel"), per_rank=False)._load(1, 2) == {"a", "b", "c"}
    docs = [Document(text="x", id=i) for i in "abcd"]
    assert [d.id for d in step.run(iter(docs), rank=1, world_size=2)] == ["b", "c"]
    with pytest.raises(ValueError, match="no keep lists in"):
        DatamaskFilter(str(tmp_path / "nothing"))._load(0, 1)


def test_steps_write_through_fsspec_folders():
    """The same steps on a non-local DataFolder (fsspec's in-memory filesystem)."""
    from datamask.integrations.datatrove import DatamaskSelect

    rng = np.random.default_rng(0)
    docs = [
        Document(
            text=f"doc {i}.",
            id=f"m{i}",
            metadata={"q": float(rng.random()), "e": rng.normal(size=8).tolist()},
        )
        for i in range(40)
    ]
    for rank in range(2):
        step = DatamaskFeatures("memory://dm/features", embedding_key="e", quality_key="q")
        assert len(list(step.run(iter(docs[rank::2]), rank=rank, world_size=2))) == 20
    select = DatamaskSelect(
        "memory://dm/features", "memory://dm/sel", select_ratio=0.25, method="greedy"
    )
    list(select.run(None, rank=0, world_size=1))  # a generator, as the executor drives it
    kept = [
        d.id
        for r in range(2)
        for d in DatamaskFilter("memory://dm/sel").run(iter(docs[r::2]), rank=r, world_size=2)
    ]
    assert len(kept) == 10
    import fsspec

    fs = fsspec.filesystem("memory")
    assert sorted(p.rsplit("/", 1)[-1] for p in fs.ls("/dm/sel/keep", detail=False)) == [
        "00000.parquet",
        "00001.parquet",
    ]


@pytest.mark.parametrize("method", ["mask", "random"])
def test_one_task_select_reproduces_datamask_select_bit_for_bit(tmp_path, method):
    """With one task the group's seed is the run's seed, as ``datamask select`` uses it on a
    single file: the same rows, logits and ranks, bit for bit."""
    from datamask.cli import main
    from datamask.integrations.datatrove import DatamaskSelect

    demo = pq.read_table(DEMO).slice(0, 600).select(["chunk_id", "quality_score", "feature_arr"])
    write(demo, tmp_path / "features" / "00000.parquet")
    settings = {"select_ratio": 0.1, "method": method}
    if method == "mask":
        settings["n_epochs"] = 20
    features, selection = str(tmp_path / "features"), str(tmp_path / "sel")
    step = DatamaskSelect(features, selection, seed=3, device="cpu", **settings)
    list(step.run(None, rank=0, world_size=1))
    group = pq.read_table(tmp_path / "sel" / "groups" / "00000.parquet")

    flags = [f"--{k.replace('_', '-')}={v}" for k, v in settings.items()]
    out = tmp_path / "cli.parquet"
    argv = ["select", "--input", str(tmp_path / "features" / "00000.parquet"), "--output"]
    assert main([*argv, str(out), "--seed", "3", "--device", "cpu", "--no-progress", *flags]) == 0
    cli = pq.read_table(out)
    assert cli.column_names == group.column_names
    assert {"chunk_id", "selected", "logit", "rank"} <= set(cli.column_names)
    assert sum(cli["selected"].to_pylist()) == 60
    for name in cli.column_names:  # every value, NaN where both have NaN
        a = cli[name].to_numpy(zero_copy_only=False)
        np.testing.assert_array_equal(a, group[name].to_numpy(zero_copy_only=False), err_msg=name)


def test_group_seed_is_the_seed_the_sharded_runner_gives_each_group():
    from datamask.distributed import group_seeds

    assert group_seed(7, 0, 1) == 7  # one task: the run's own seed
    for n in (2, 5):
        assert [group_seed(7, g, n) for g in range(n)] == group_seeds(7, n)


def test_select_keeps_a_token_budget_counted_by_the_features_step():
    """DatamaskFeatures writes each document's length (``length_key``'s token count, else
    its characters); DatamaskSelect keeps a token budget of them, per task."""
    from datamask.integrations.datatrove import DatamaskSelect

    rng = np.random.default_rng(1)
    docs = [
        Document(
            text="w" * int(rng.integers(5, 500)),
            id=f"t{i}",
            metadata={
                "q": float(rng.random()),
                "e": rng.normal(size=8).tolist(),
                "token_count": int(rng.integers(1, 100)),
            },
        )  # fmt: skip
        for i in range(60)
    ]
    step = DatamaskFeatures("memory://tok/chars", embedding_key="e", quality_key="q")
    list(step.run(iter(docs)))
    step = DatamaskFeatures(
        "memory://tok/tokens", embedding_key="e", quality_key="q", length_key="token_count"
    )
    list(step.run(iter(docs)))
    for folder, lengths in (
        ("chars", np.array([len(d.text) for d in docs])),
        ("tokens", np.array([d.metadata["token_count"] for d in docs])),
    ):
        select = DatamaskSelect(
            f"memory://tok/{folder}", f"memory://tok/sel-{folder}", select_token_ratio=0.2,
            method="greedy", device="cpu",
        )  # fmt: skip
        list(select.run(None, rank=0, world_size=1))
        kept = {d.id for d in DatamaskFilter(f"memory://tok/sel-{folder}").run(iter(docs))}
        used = lengths[[d.id in kept for d in docs]].sum()
        assert 0.2 * lengths.sum() - lengths.max() <= used <= 0.2 * lengths.sum()
