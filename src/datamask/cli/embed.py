"""``datamask embed``: a text parquet/jsonl -> embeddings (and a quality score) per row.

datamask embed --input docs.jsonl --output docs.parquet --quality heuristic

The flags are made from the declarations of :class:`~datamask.embedding.EmbedSpec`; the flags
given become one spec, checked once, before any output or work.
"""

from __future__ import annotations

import argparse

from ..embedding import EmbedSpec, embed_file
from ..io.atomic import OutputLock, check_no_overlap, check_writable
from ..io.text import list_text_files
from ..settings import section_settings
from .args import add_flags

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
    e.add_argument("--output", required=True, help="output parquet or jsonl path")
    add_flags(e, section_settings(EmbedSpec))
    return e


def run_embed(args: argparse.Namespace) -> int:
    given = vars(args)
    spec = EmbedSpec.from_mapping({o.name: given[o.name] for o in section_settings(EmbedSpec)})
    check_writable(args.output)
    check_no_overlap([args.output], list_text_files(args.input))
    with OutputLock(args.output):
        n = embed_file(args.input, args.output, spec)
    print(f"embedded {n} documents into {args.output}")
    return 0
