"""The ``datamask apply`` command: its flags and body (the library is :mod:`.core`).

    datamask apply --input data/ --selection out/sel --output out/kept
    datamask apply --input 's3://corpus/raw/*.jsonl.gz' --selection s3://corpus/sel.parquet \
        --output s3://corpus/kept --removed s3://corpus/dropped --removed-format curator
"""

from __future__ import annotations

import argparse

from ..apply.core import REMOVED_FORMATS, apply_selection
from .common import add_trust_argument

__all__ = ["add_apply_parser", "run_apply"]


def add_apply_parser(subparsers: argparse._SubParsersAction) -> argparse.ArgumentParser:
    """Register ``datamask apply``."""
    p = subparsers.add_parser(
        "apply",
        help="write the selected rows of the input shards (every column), shard by shard",
        description="Stream every input shard and write the rows the selection keeps, one "
        "output shard per input shard with the same name and format; atomic and resumable "
        "(rerun the same command after a crash).",
    )
    add = p.add_argument
    add(
        "--input",
        required=True,
        help="input shards: a file, folder or glob of .parquet, .jsonl or .jsonl.gz; local, "
        "file://, s3://, gs:// or hf://",
    )
    add(
        "--selection",
        required=True,
        help="`datamask select` output: a parquet file or a sharded output folder (its keep "
        "lists are used when present)",
    )
    add("--output", required=True, help="output folder (one shard per input shard)")
    add("--removed", default=None, help="folder for the dropped rows or ids (default: none)")
    add(
        "--removed-format",
        "--removed_format",
        dest="removed_format",
        choices=REMOVED_FORMATS,
        default="ids",
        help="ids: <name>.parquet of dropped ids; rows: dropped rows, every column; curator: "
        "part.<i>.parquet with a sorted `id` column for NeMo Curator's "
        "TextDuplicatesRemovalWorkflow (default: ids)",
    )
    add(
        "--id-col",
        "--id_col",
        dest="id_col",
        default="chunk_id",
        help="id column of the input shards (default: chunk_id)",
    )
    add(
        "--batch-size",
        "--batch_size",
        dest="batch_size",
        type=int,
        default=65_536,
        help="rows per streamed batch (default: 65536)",
    )
    add_trust_argument(
        p,
        "the input's fingerprints against the selection's record, the id type, that some "
        "id is selected",
    )
    add("--no-progress", dest="progress", action="store_false", help="hide the progress bar")
    return p


def run_apply(args: argparse.Namespace) -> int:
    """``datamask apply``. Returns the exit status (0)."""
    result = apply_selection(
        args.input,
        args.selection,
        args.output,
        removed=args.removed,
        removed_format=args.removed_format,
        id_col=args.id_col,
        batch_size=args.batch_size,
        progress=args.progress,
        trust_selection=args.trust_selection,
    )
    how = "keep lists" if result["mode"] == "keep" else "selected ids"
    print(
        f"kept {result['kept']} of {result['rows']} rows from {result['n_shards']} shards "
        f"({result['shards_reused']} already done) using {how} in {result['seconds']:.1f}s: "
        f"{result['rows_per_second']:,.0f} rows/s"
    )
    print(f"wrote {result['output']}" + (f" and {result['removed']}" if result["removed"] else ""))
    return 0
