"""``datamask embed``: a text parquet/jsonl -> embeddings (and a quality score) per row.

datamask embed --input docs.jsonl --output docs.parquet --quality heuristic

The flags are made from the declarations of :class:`~datamask.embedding.EmbedSpec`; the flags
given become one spec, checked once, before any output or work.
"""

from __future__ import annotations

import argparse

from ..doors import embed
from ..embedding import EmbedSpec
from ..settings import section_settings
from .args import add_flags
from .common import add_config_argument, places_from_args, spec_from_args

__all__ = ["add_embed_parser", "run_embed"]


def add_embed_parser(sub: argparse._SubParsersAction) -> argparse.ArgumentParser:
    e = sub.add_parser(
        "embed",
        help="embed a text parquet/jsonl with a sentence-transformers "
        "model (default: the bundled all-MiniLM-L6-v2)",
    )
    add_config_argument(e)
    e.add_argument(
        "--input",
        help="parquet, jsonl or jsonl.gz file with a text column, or a folder or glob of them "
        "(streamed)",
    )
    e.add_argument("--output", help="output parquet or jsonl path")
    add_flags(e, section_settings(EmbedSpec))
    return e


def run_embed(args: argparse.Namespace) -> int:
    places = places_from_args(args, ("input", "output"), required=("input", "output"))
    keys = [o.name for o in section_settings(EmbedSpec)]
    spec = spec_from_args(args, EmbedSpec, keys, ("input", "output"))
    done = embed(places["input"], places["output"], spec)
    print(f"embedded {done['rows']} documents into {places['output']}")
    return 0
