"""Embedding of the real-text corpus (cached by text) and its near-duplicate counts."""

from __future__ import annotations

import hashlib
import os
from pathlib import Path

import numpy as np
from corpus_spec import EMBED_BLOCK, MAX_SEQ_LENGTH, MODEL, SOURCES, _key
from tqdm import tqdm


def _text_key(text: str) -> bytes:
    return hashlib.sha256(text.encode("utf-8")).hexdigest().encode("ascii")


def load_embedding_cache(folder: Path) -> dict[bytes, np.ndarray]:
    """sha256(text) -> embedding, from every ``*.npz`` block in ``folder``."""
    store: dict[bytes, np.ndarray] = {}
    for path in sorted(folder.glob("*.npz")):
        with np.load(path) as block:
            store.update(zip(block["keys"].tolist(), block["emb"], strict=True))
    return store


def embed_cached(
    texts: list[str],
    ids: list[str],
    cache: Path,
    batch_size: int,
    device: str,
    progress: bool,
    partial: bool = False,
) -> tuple[np.ndarray, np.ndarray, int]:
    """Embed ``texts``, reusing the embeddings cached under ``cache`` by sha256 of the text.

    Texts that are not cached yet are embedded in ascending ``sha1(chunk_id)`` order, in blocks
    of EMBED_BLOCK that are each saved (atomically) as soon as they are done, so the documents
    embedded after any number of blocks are a uniform random sample of the corpus.
    sentence-transformers sorts each block by length; a text's embedding does not depend on the
    other texts of its batch (up to float rounding).

    Returns the embeddings, the row indices they belong to (all rows; with ``partial`` only
    the rows already cached, and nothing is embedded) and the number embedded in this call.
    """
    from datamask.embedding import embed_texts

    folder = cache / f"emb-{_key({'model': MODEL, 'max_seq_length': MAX_SEQ_LENGTH})}"
    folder.mkdir(parents=True, exist_ok=True)
    store = load_embedding_cache(folder)
    keys = [_text_key(t) for t in texts]
    order = sorted(range(len(texts)), key=lambda i: hashlib.sha1(ids[i].encode()).hexdigest())
    todo = [i for i in order if keys[i] not in store]
    n_new = 0
    if not partial:
        bar = tqdm(total=len(texts), initial=len(texts) - len(todo), desc="embed", unit="doc",
                   disable=not progress, smoothing=0.05)  # fmt: skip
        for start in range(0, len(todo), EMBED_BLOCK):
            idx = todo[start : start + EMBED_BLOCK]
            emb = embed_texts(
                [texts[i] for i in idx],
                batch_size=batch_size,
                device=device,
                max_seq_length=MAX_SEQ_LENGTH,
                progress=False,
            )
            block_keys = np.array([keys[i] for i in idx])
            name = hashlib.sha1(b"".join(block_keys.tolist())).hexdigest()[:16]
            tmp = folder / f"{name}.npz.tmp"
            with open(tmp, "wb") as fh:
                np.savez(fh, keys=block_keys, emb=emb)
            os.replace(tmp, folder / f"{name}.npz")
            store.update(zip(block_keys.tolist(), emb, strict=True))
            n_new += len(idx)
            bar.update(len(idx))
        bar.close()
    rows = np.array([i for i in range(len(texts)) if keys[i] in store], dtype=np.int64)
    emb = np.stack([store[keys[i]] for i in rows]) if len(rows) else np.empty((0, 384))
    return emb.astype(np.float32, copy=False), rows, n_new


def near_duplicates(
    emb: np.ndarray, sources: np.ndarray, thresholds: tuple[float, ...] = (0.9, 0.95, 0.99)
) -> dict:
    """Exact pair counts above cosine thresholds (blockwise torch matmul, i < j)."""
    import torch

    x = torch.from_numpy(emb)
    n = x.shape[0]
    pairs = dict.fromkeys(thresholds, 0)
    has = {t: np.zeros(n, dtype=bool) for t in thresholds}
    cross = dict.fromkeys(thresholds, 0)  # pairs whose two documents come from different sources
    src_codes = np.unique(sources, return_inverse=True)[1]
    step = 2048
    for i in tqdm(range(0, n, step), desc="near-duplicates", unit="block"):
        sim = x[i : i + step] @ x.T
        rows = torch.arange(i, min(i + step, n)).unsqueeze(1)
        sim[torch.arange(n).unsqueeze(0) <= rows] = -1.0  # keep j > i only
        for t in thresholds:
            r, c = (sim > t).nonzero(as_tuple=True)
            r = r.numpy() + i
            c = c.numpy()
            pairs[t] += len(r)
            cross[t] += int((src_codes[r] != src_codes[c]).sum())
            has[t][r] = True
            has[t][c] = True
    out = {}
    for t in thresholds:
        per_source = {
            s: round(float(has[t][sources == s].mean()), 4) for s in SOURCES if (sources == s).any()
        }
        out[str(t)] = {
            "pairs": pairs[t],
            "cross_source_pairs": cross[t],
            "docs_with_a_pair": int(has[t].sum()),
            "share_with_a_pair_by_source": per_source,
        }
    return out
