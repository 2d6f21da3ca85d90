"""``datamask embed``: ids kept, folders/globs/.jsonl.gz streamed, heuristic quality; then
``datamask select`` on its output with no column flags."""

from __future__ import annotations

import gzip
import json
import os
from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest

os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TRANSFORMERS_OFFLINE", "1")

import datamask.embedding as embed_mod  # noqa: E402
from datamask.cli import main  # noqa: E402
from datamask.embedding import embed_file  # noqa: E402
from datamask.quality import heuristic_quality, heuristic_quality_batch  # noqa: E402
from tests._data import SHIPPED_DEMO, write  # noqa: E402

DEMO = SHIPPED_DEMO


@pytest.fixture(scope="module")
def demo() -> pa.Table:
    if not DEMO.exists():
        pytest.skip("examples/demo/demo_docs.parquet not present")
    return pq.read_table(DEMO, columns=["chunk_id", "text", "quality_score", "feature_arr"])


def write_jsonl_gz(path: Path, rows: list[dict]) -> None:
    with gzip.open(path, "wt", encoding="utf-8") as fh:
        for r in rows:
            fh.write(json.dumps(r) + "\n")


def test_heuristic_quality_is_the_demo_score(demo):
    np.testing.assert_array_equal(
        heuristic_quality_batch(demo["text"].to_pylist()), demo["quality_score"].to_numpy()
    )
    assert heuristic_quality("   ") == 0.0
    # hand-computed: 4 words, all alphabetic, mean length 4.25, stop words "the" and "on"
    # (fraction 0.5 -> 1), 1 line ending a sentence, unique, 23 chars -> 0.023
    assert heuristic_quality("The cat sat on matting.") == round((5 + 0.023) / 6, 6)


@pytest.mark.slow
def test_embed_keeps_ids_streams_a_gz_folder_then_select_needs_no_flags(tmp_path, demo):
    # short docs keep the model's work small: 36 documents from the demo, in three files
    rows = [
        {"id": i, "text": t, "source": "demo"}
        for i, t in zip(
            demo["chunk_id"].to_pylist()[:36], demo["text"].to_pylist()[:36], strict=True
        )
    ]
    folder = tmp_path / "docs"
    (folder / "part").mkdir(parents=True)
    write_jsonl_gz(folder / "a.jsonl.gz", rows[:14])
    write_jsonl_gz(folder / "part" / "b.jsonl.gz", rows[14:25])
    write(pa.Table.from_pylist(rows[25:]), folder / "part" / "c.parquet")
    (folder / "_skip.jsonl").write_text('{"text": "not read"}\n')
    (folder / "notes.txt").write_text("not a document file")
    out = tmp_path / "embedded.parquet"
    assert (
        main(
            [
                "embed",
                "--input",
                str(folder),
                "--output",
                str(out),
                "--quality",
                "heuristic",
                "--no-progress",
            ]
        )
        == 0
    )
    table = pq.read_table(out)
    assert table.column_names == ["id", "text", "source", "feature_arr", "quality_score"]
    assert table["id"].to_pylist() == [r["id"] for r in rows]  # kept, in sorted-file order
    emb = np.stack(table["feature_arr"].to_numpy(zero_copy_only=False))
    reference = np.stack(demo["feature_arr"].to_numpy(zero_copy_only=False)[:36])
    np.testing.assert_allclose(emb, reference, atol=2e-5)
    np.testing.assert_array_equal(
        table["quality_score"].to_numpy(), demo["quality_score"].to_numpy()[:36]
    )

    sel = tmp_path / "sel.parquet"
    assert main(["select", "--input", str(out), "--output", str(sel)]) == 0  # no column flags
    chosen = pq.read_table(sel)
    assert chosen.column_names[:2] == ["id", "selected"]
    assert int(chosen["selected"].to_numpy().sum()) == round(0.3 * 36)


class FakeModel:
    """Stands in for the sentence-transformers model (its ``encode``): records the chunk
    sizes it sees."""

    def __init__(self) -> None:
        self.calls: list[int] = []

    def encode(self, texts, **kwargs):
        self.calls.append(len(texts))
        rng = np.random.default_rng(len(texts))
        v = rng.normal(size=(len(texts), 8)).astype(np.float32)
        return v / np.linalg.norm(v, axis=1, keepdims=True)


def _use(monkeypatch, fake: FakeModel) -> FakeModel:
    """``embed_file`` loads its model once, at the door: it gets ``fake``."""
    monkeypatch.setattr(embed_mod, "_model_for", lambda model, device, max_seq_length: fake)
    return fake


def test_embed_streams_in_chunks_and_numbers_rows_across_files(tmp_path, monkeypatch):
    fake = _use(monkeypatch, FakeModel())
    for j in range(3):
        write_jsonl_gz(
            tmp_path / f"s{j}.jsonl.gz", [{"text": f"document {j}-{i}."} for i in range(2500)]
        )
    out = tmp_path / "out.parquet"
    n = embed_file(
        str(tmp_path / "s*.jsonl.gz"), out, chunk_rows=1000, progress=False, quality="heuristic"
    )
    assert n == 7500
    assert max(fake.calls) == 1000 and len(fake.calls) == 9  # 1000, 1000, 500 per file
    table = pq.read_table(out)
    assert table["chunk_id"].to_pylist() == [f"row-{i}" for i in range(7500)]
    assert pq.ParquetFile(out).metadata.num_row_groups >= 9  # written as it was read


def test_embed_later_chunks_follow_the_first_schema(tmp_path, monkeypatch, caplog):
    _use(monkeypatch, FakeModel())
    src = tmp_path / "in"
    src.mkdir()
    write_jsonl_gz(src / "a.jsonl.gz", [{"id": "a", "text": "x.", "lang": "en"}])
    write_jsonl_gz(src / "b.jsonl.gz", [{"id": "b", "text": "y.", "extra": 1}])
    out = tmp_path / "out.jsonl"
    assert embed_file(src, out, progress=False) == 2
    back = [json.loads(line) for line in out.read_text().splitlines()]
    assert [r["id"] for r in back] == ["a", "b"]
    assert [r["lang"] for r in back] == ["en", None]
    assert "extra" not in back[1]
    assert "['extra'] appear only after the first rows" in caplog.text

    write_jsonl_gz(src / "c.jsonl.gz", [{"id": "c", "text": "z.", "lang": ["en", "fr"]}])
    with pytest.raises(ValueError, match=r"column 'lang' in c\.jsonl\.gz \(rows from 0\) has type"):
        embed_file(src, tmp_path / "bad.parquet", progress=False)
    assert not (tmp_path / "bad.parquet").exists()


def test_embed_input_errors_at_the_door(tmp_path, capsys):
    assert (
        main(
            [
                "embed",
                "--input",
                str(tmp_path / "*.jsonl.gz"),
                "--output",
                str(tmp_path / "o.parquet"),
            ]
        )
        == 2
    )
    assert "no files match" in capsys.readouterr().err
    (tmp_path / "d.txt").write_text("x")
    with pytest.raises(ValueError, match=r"must end in \.parquet, \.jsonl or \.json"):
        embed_file([tmp_path / "d.txt"], tmp_path / "o.parquet", progress=False)
    bad = tmp_path / "bad.jsonl.gz"
    bad.write_bytes(gzip.compress(b'{"text": "ok"}\n')[:-6])
    with pytest.raises(ValueError, match=r"cannot read .*bad\.jsonl\.gz"):
        embed_file(bad, tmp_path / "o.parquet", progress=False)
    with pytest.raises(ValueError, match=r"quality must be one of \['heuristic'\]; got 'fasttext'"):
        embed_file(bad, tmp_path / "o.parquet", quality="fasttext", progress=False)
    assert not (tmp_path / "o.parquet").exists()
