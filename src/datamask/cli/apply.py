"""The ``datamask apply`` command: its flags and body (the library is :mod:`.core`).

    datamask apply --input data/ --selection out/sel --output out/kept
    datamask apply --input 's3://corpus/raw/*.jsonl.gz' --selection s3://corpus/sel.parquet \
        --output s3://corpus/kept --removed s3://corpus/dropped --removed-format curator

The flags are made from the declarations of :class:`~datamask.applying.spec.ApplySpec`; the
flags given become one spec, checked once, before any output or work.
"""

from __future__ import annotations

import argparse
import warnings

from ..applying.spec import ApplySpec
from ..doors import apply
from ..settings import COLUMN_KEYS, section_settings
from .args import add_column_arguments, add_flag
from .common import add_config_argument, add_trust_argument, places_from_args, spec_from_args

__all__ = ["add_apply_parser", "apply_spec_from_args", "run_apply"]


def add_apply_parser(subparsers: argparse._SubParsersAction) -> argparse.ArgumentParser:
    """Register ``datamask apply``; its settings' flags are made from the declarations of
    :class:`~datamask.applying.spec.ApplySpec`."""
    p = subparsers.add_parser(
        "apply",
        help="write the selected rows of the input shards (every column), shard by shard",
        description="Stream every input shard and write the rows the selection keeps, one "
        "output shard per input shard with the same name and format; atomic and resumable "
        "(rerun the same command after a crash).",
    )
    add = p.add_argument
    add_config_argument(p)
    add(
        "--input",
        help="input shards: a file, folder or glob of .parquet, .jsonl or .jsonl.gz; local, "
        "file://, s3://, gs:// or hf://",
    )
    add(
        "--selection",
        help="`datamask select` output: a parquet file or a sharded output folder (its keep "
        "lists are used when present)",
    )
    add("--output", help="output folder (one shard per input shard)")
    add("--removed", default=None, help="folder for the dropped rows or ids (default: none)")
    for opt in section_settings(ApplySpec):
        if opt.name != "trust_selection":  # the escape hatch apply, evaluate and report share
            add_flag(p, opt)
    # the columns as every command names them; apply reads the id column only
    add_column_arguments(p.add_argument_group("columns"), split=False)
    add_trust_argument(
        p,
        "the input's fingerprints against the selection's record, the id type, that some "
        "id is selected",
    )
    return p


def apply_spec_from_args(args: argparse.Namespace) -> ApplySpec:
    """The one spec the flags and the config file make (checked once, before any work)."""
    keys = [o.name for o in section_settings(ApplySpec)] + [*COLUMN_KEYS, "quality_col"]
    spec = spec_from_args(args, ApplySpec, keys, _PLACES)
    unread = [f"--{n.replace('_', '-')}" for n in ("quality_col", "feature_col")
              if getattr(args, n, None) is not None]  # fmt: skip
    if unread:
        warnings.warn(
            f"{' and '.join(unread)} {'is' if len(unread) == 1 else 'are'} ignored: apply "
            "reads the id column only.",
            UserWarning,
            stacklevel=2,
        )
    return spec


#: Where apply reads and writes (flags, or keys of the config file).
_PLACES = ("input", "selection", "output", "removed")


def run_apply(args: argparse.Namespace) -> int:
    """``datamask apply``. Returns the exit status (0)."""
    places = places_from_args(args, _PLACES, required=("input", "selection", "output"))
    spec = apply_spec_from_args(args)
    result = apply(
        places["input"], places["selection"], places["output"], spec, removed=places["removed"]
    )
    how = "keep lists" if result["mode"] == "keep" else "selected ids"
    print(
        f"kept {result['kept']} of {result['rows']} rows from {result['n_shards']} shards "
        f"({result['shards_reused']} already done) using {how} in {result['seconds']:.1f}s: "
        f"{result['rows_per_second']:,.0f} rows/s"
    )
    print(f"wrote {result['output']}" + (f" and {result['removed']}" if result["removed"] else ""))
    return 0
