"""Build the real-text benchmark corpus (``realtext.parquet``) from Debian bookworm packages.

About 56,000 real documents from openly licensed Debian *main* packages, chunked
deterministically, scored with the demo's heuristic ``quality_score`` and embedded with the
bundled all-MiniLM-L6-v2 (``datamask.embed.embed_texts``, ``max_seq_length=256``,
L2-normalised). Debian package descriptions are *not* used (they are kept for independent
checks). Exact duplicates (lower-cased, whitespace-collapsed text) are dropped; near-duplicates
are kept on purpose, as real corpora have them. See ``benchmarks/realtext/README.md``.

The extraction of the Python documentation, the Linux man pages and the fortunes, the deb
handling and the quality score are imported from ``examples/demo/build_demo.py``; this script
adds the other sources and the chunking of long sections.

Usage::

    python benchmarks/realtext/build_corpus.py                # -> benchmarks/realtext/data/
    python benchmarks/realtext/build_corpus.py --out PATH     # no-op when PATH is up to date

The ``.deb`` files are downloaded once with ``apt-get download`` (pinned versions, run
``apt-get update`` first) into ``--cache`` (default ``benchmarks/realtext/data/cache``), which
also keeps the extracted texts and the embeddings (by text), so an interrupted build resumes.
"""

from __future__ import annotations

import argparse
import hashlib
import json
import os
import sys
import time
from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
from chunking import select
from corpus_spec import (
    CORPUS_VERSION,
    GROUP_CHARS,
    HERE,
    MAX_SEQ_LENGTH,
    META_KEY,
    MIN_CHARS,
    MODEL,
    PACKAGES,
    REPO,
    SOURCES,
    SPLIT_CHARS,
    build_key,
    demo,
    extract_key,
)
from embedding import embed_cached, near_duplicates
from sources import extract


def ensure_debs(debs: Path, allow_other_versions: bool) -> None:
    """Download the pinned ``.deb`` files that ``debs`` lacks."""
    debs.mkdir(parents=True, exist_ok=True)
    missing = {n: v for n, (v, _) in PACKAGES.items() if not list(debs.glob(f"{n}_*.deb"))}
    if missing:
        print(f"apt-get download {len(missing)} packages into {debs}")
        demo.fetch_debs(debs, allow_other_versions, missing)


def texts_table(docs: list[demo.Doc]) -> pa.Table:
    texts = [d.text for d in docs]
    package = [d.origin.split(" ", 1)[0] for d in docs]
    return pa.table(
        {
            "chunk_id": pa.array([d.chunk_id for d in docs], pa.string()),
            "text": pa.array(texts, pa.string()),
            "quality_score": pa.array([demo.quality_score(t) for t in texts], pa.float64()),
            "source": pa.array([d.source for d in docs], pa.string()),
            "package": pa.array(package, pa.string()),
            "n_chars": pa.array([len(t) for t in texts], pa.int64()),
            "license": pa.array([d.license for d in docs], pa.string()),
            "origin": pa.array([d.origin for d in docs], pa.string()),
        }
    )


def up_to_date(path: Path) -> bool:
    if not path.is_file():
        return False
    try:
        meta = pq.read_schema(path).metadata or {}
        meta = json.loads(meta[META_KEY.encode()])
        return meta["build_key"] == build_key() and not meta.get("partial", False)
    except (KeyError, ValueError, pa.ArrowInvalid, OSError):
        return False


def summary(table: pa.Table) -> str:
    src = np.asarray(table.column("source").to_pylist())
    q = table.column("quality_score").to_numpy()
    n = table.column("n_chars").to_numpy()
    qs = (0.05, 0.25, 0.5, 0.75, 0.95)
    out = [
        "| source | docs | quality mean | quality p5 / p25 / p50 / p75 / p95 | "
        "n_chars median (mean) [min, max] |",
        "|---|---:|---:|---|---|",
    ]
    for s in [*SOURCES, None]:
        m = np.ones(len(src), bool) if s is None else src == s
        name = "**all**" if s is None else f"`{s}`"
        out.append(
            f"| {name} | {m.sum():,} | {q[m].mean():.3f} | {demo._q(q[m], qs)} | "
            f"{np.median(n[m]):,.0f} ({n[m].mean():,.0f}) [{n[m].min():,}, {n[m].max():,}] |"
        )
    return "\n".join(out)


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--out", type=Path, default=HERE / "data" / "realtext.parquet")
    ap.add_argument("--cache", type=Path, default=HERE / "data" / "cache")
    ap.add_argument("--allow-other-versions", action="store_true")
    ap.add_argument("--device", default="cpu", help="embedding device (default cpu)")
    ap.add_argument("--batch-size", type=int, default=64)
    ap.add_argument("--threads", type=int, default=2, help="torch CPU threads (default 2)")
    ap.add_argument("--texts-only", action="store_true", help="stop after the text cache")
    ap.add_argument(
        "--partial",
        action="store_true",
        help="write only the documents whose embeddings are cached (a uniform sample); "
        "the output is marked partial and a later run completes it",
    )
    ap.add_argument("--no-progress", action="store_true")
    args = ap.parse_args(argv)

    if up_to_date(args.out):
        print(f"{args.out} is up to date (build {build_key()}); nothing to do.")
        return
    try:
        import datamask.embedding  # noqa: F401
    except ImportError:  # running from a checkout without `pip install -e .`
        sys.path.insert(0, str(REPO / "src"))

    t0 = time.perf_counter()
    key = build_key()
    args.cache.mkdir(parents=True, exist_ok=True)
    texts_path = args.cache / f"texts-{key}.parquet"
    if texts_path.is_file():
        table = pq.read_table(texts_path)
        meta = json.loads(table.schema.metadata[META_KEY.encode()])
        print(f"read {table.num_rows:,} extracted documents from {texts_path}")
    else:
        import tempfile

        debs = args.cache / "debs"
        ensure_debs(debs, args.allow_other_versions)
        with tempfile.TemporaryDirectory(prefix="datamask-realtext-") as tmp:
            root = Path(tmp)
            versions = {n: v for n, (v, _) in PACKAGES.items()}
            info = demo.unpack_debs(debs, root, versions)
            docs = extract(root, info, args.cache / f"sections-{extract_key()}")
        chosen, counts = select(docs)
        for s, c in counts.items():
            print(f"{s}: {dict(c)}")
        for name, pkg_info in info.items():
            pkg_info["license"] = PACKAGES[name][1]
        meta = {
            "build_key": key,
            "corpus_version": CORPUS_VERSION,
            "packages": info,
            "sources": {s: list(p) for s, p in SOURCES.items()},
            "counts": {s: dict(c) for s, c in counts.items()},
            "min_chars": MIN_CHARS,
            "split_chars": SPLIT_CHARS,
            "group_chars": GROUP_CHARS,
            "dedup": "exact, on lower-cased whitespace-collapsed text; first chunk_id kept",
        }
        table = texts_table(chosen).replace_schema_metadata({META_KEY: json.dumps(meta)})
        tmp_path = texts_path.with_suffix(".tmp")
        pq.write_table(table, tmp_path, compression="zstd")
        os.replace(tmp_path, texts_path)
    t_text = time.perf_counter() - t0
    print(f"{table.num_rows:,} documents; text stage {t_text:.1f}s")
    if args.texts_only:
        return

    import torch

    torch.set_num_threads(args.threads)
    texts = table.column("text").to_pylist()
    ids = table.column("chunk_id").to_pylist()
    t1 = time.perf_counter()
    emb, rows, n_new = embed_cached(
        texts, ids, args.cache, args.batch_size, args.device, not args.no_progress, args.partial
    )
    t_emb = time.perf_counter() - t1
    if args.partial:
        print(f"partial: {len(rows):,} of {table.num_rows:,} documents are embedded")
        meta |= {"partial": True, "rows_total": table.num_rows}
        table = table.take(pa.array(rows))
        texts = [texts[i] for i in rows]
    rate = f"{n_new / t_emb:.2f} docs/s" if n_new else "all from the cache"
    print(f"embedding: {n_new:,} of {len(texts):,} docs embedded now in {t_emb:.1f}s ({rate})")

    sources = np.asarray(table.column("source").to_pylist())
    t2 = time.perf_counter()
    dups = near_duplicates(emb, sources)
    print(f"near-duplicates ({time.perf_counter() - t2:.1f}s): {json.dumps(dups, indent=1)}")
    meta |= {
        "model": MODEL,
        "max_seq_length": MAX_SEQ_LENGTH,
        "normalized": True,
        "embed_device": args.device,
        "near_duplicates": dups,
        "quality_score": "build_demo.quality_score: mean of six heuristic signals in [0, 1]",
    }
    table = table.append_column(
        "feature_arr",
        pa.FixedSizeListArray.from_arrays(pa.array(emb.reshape(-1), pa.float32()), emb.shape[1]),
    ).replace_schema_metadata({META_KEY: json.dumps(meta)})
    args.out.parent.mkdir(parents=True, exist_ok=True)
    tmp_out = Path(str(args.out) + ".tmp")
    pq.write_table(table, tmp_out, compression="zstd", compression_level=9)
    os.replace(tmp_out, args.out)

    md5 = hashlib.md5(args.out.read_bytes()).hexdigest()
    text = summary(table)
    total = time.perf_counter() - t0
    lines = [
        text,
        "",
        f"wrote {args.out} ({args.out.stat().st_size / 1e6:.1f} MB, md5 {md5})",
        f"time: text {t_text:.1f}s, embedding {t_emb:.1f}s ({n_new:,} new documents, {rate}, "
        f"{args.threads} threads, {args.device}), total {total:.1f}s",
    ]
    if args.partial:
        lines.insert(
            0,
            f"PARTIAL snapshot: {len(rows):,} of {meta['rows_total']:,} documents, a uniform "
            "sample by sha1(chunk_id); run again without --partial to complete it.\n",
        )
    print("\n".join(lines))
    stats = {
        "build_key": key,
        "rows": table.num_rows,
        "md5": md5,
        "t_text": t_text,
        "t_embed": t_emb,
        "embedded_now": n_new,
        "partial": bool(args.partial),
        "t_total": total,
        "near_duplicates": dups,
        "counts": meta["counts"],
    }
    args.out.with_suffix(".summary.json").write_text(json.dumps(stats, indent=1) + "\n")
    args.out.with_suffix(".summary.md").write_text("\n".join(lines) + "\n")


if __name__ == "__main__":
    main()
