"""``datamask evaluate``: score a selection with the objective, every term and diagnostics.

datamask evaluate --input docs.parquet --selection out/selection.parquet
datamask evaluate --input shards/ --selection out/   # a sharded run, J over every document

The flags are made from the declarations of
:class:`~datamask.evaluation.evaluate_spec.EvaluateSpec` (and the objective's, the columns');
the flags given become one spec, checked once, before any output or work; the library runs
it (:func:`~datamask.evaluation.evaluate_run.evaluate_file`).
"""

from __future__ import annotations

import argparse
import json

from ..doors import evaluate
from ..evaluation.evaluate_run import evaluation_path
from ..evaluation.evaluate_spec import EvaluateSpec
from ..evaluation.scores import format_report
from ..settings import COLUMN_KEYS, section_settings
from .args import add_column_arguments, add_flag, add_objective_arguments
from .common import add_config_argument, add_trust_argument, places_from_args, spec_from_args

__all__ = ["add_evaluate_parser", "evaluate_spec_from_args", "run_evaluate"]

#: Settings whose flags come from elsewhere: the shared column group (``--split`` and the
#: columns), the objective's group and the shared escape hatch of apply, evaluate and report.
_ELSEWHERE = ("objective", "columns", "split", "trust_selection")


def add_evaluate_parser(subparsers: argparse._SubParsersAction) -> argparse.ArgumentParser:
    """Register ``datamask evaluate``; its settings' flags are made from the declarations
    of :class:`~datamask.evaluation.evaluate_spec.EvaluateSpec`."""
    p = subparsers.add_parser(
        "evaluate",
        help="score a selection: the objective, every term and diagnostics",
        description="Score a selection of --input: the objective J and each term, quality "
        "mean, facility-location coverage of the whole set, mean pairwise similarity, DiSF "
        "correlation loss, mean nearest-neighbour similarity inside the subset and the "
        "length distribution with the kept tokens (and the token budget a selection was "
        "made under). Prints a table and writes JSON.",
    )
    add_config_argument(p)
    p.add_argument(
        "--input",
        help="the parquet file, or the folder or glob of parquet shards, the selection was "
        "made from (read whole, into memory)",
    )
    p.add_argument(
        "--selection",
        help="`datamask select` output (parquet with the id column and a boolean "
        "`selected` column, or a sharded run's output folder), a parquet of selected ids "
        "only, or a text file with one id per line",
    )
    p.add_argument(
        "--output", default=None, help="JSON report path (default: <selection>.eval.json beside it)"
    )
    p.add_argument(
        "--format",
        choices=["table", "json"],
        default="table",
        help="what is printed on stdout (default: table)",
    )
    add_trust_argument(
        p, "that --input is the file the selection was made from: its recorded fingerprint"
    )
    for opt in section_settings(EvaluateSpec):
        if opt.name not in _ELSEWHERE:
            add_flag(p, opt)
    add_objective_arguments(p)
    add_column_arguments(p)
    return p


def evaluate_spec_from_args(args: argparse.Namespace) -> EvaluateSpec:
    """The one spec the flags and the config file make (checked once, before any work)."""
    keys = [k for k in EvaluateSpec.flat_keys() if k not in ("objective", "columns")]
    keys += [*COLUMN_KEYS, "quality_col"]
    return spec_from_args(args, EvaluateSpec, keys, _PLACES)


#: Where evaluate reads and writes (flags, or keys of the config file).
_PLACES = ("input", "selection", "output")


def run_evaluate(args: argparse.Namespace) -> int:
    """``datamask evaluate``: print the table (or JSON) and write the JSON report."""
    places = places_from_args(args, _PLACES, required=("input", "selection"))
    spec = evaluate_spec_from_args(args)
    report = evaluate(places["input"], places["selection"], places["output"], spec)
    if args.format == "json":
        print(json.dumps(report, indent=2))
    else:
        print(format_report(report))
        print(f"wrote {evaluation_path(places['selection'], places['output'])}")
    return 0
