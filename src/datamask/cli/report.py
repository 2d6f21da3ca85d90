"""``datamask report``: one self-contained HTML page to look at selections in a browser.

datamask report --input docs.parquet --selection mask.parquet --compare topk.parquet \\
    random.parquet --output report/

The flags are made from the declarations of :class:`~datamask.evaluation.report_spec.ReportSpec`;
the flags given become one spec, checked once, before any output or work.
"""

from __future__ import annotations

import argparse
import time

from .._units import format_bytes
from ..doors import report
from ..evaluation.report_spec import ReportSpec
from ..settings import COLUMN_KEYS, section_settings
from .args import add_column_arguments, add_flag
from .common import add_config_argument, add_trust_argument, places_from_args, spec_from_args

__all__ = ["add_report_parser", "report_spec_from_args", "run_report"]

#: Flags spelled otherwise than ``--`` + the key (the first is the one the help shows).
_FLAGS = {
    "n_topics": ["--topics", "--n-topics", "--n_topics"],
    "sample_size": ["--sample", "--sample-size", "--sample_size"],
    "map_method": ["--map", "--map-method", "--map_method"],
    "n_examples": ["--examples", "--n-examples", "--n_examples"],
}
#: Settings whose flags come from elsewhere: the shared column group (``--split`` and the
#: columns) and the shared escape hatch of apply, evaluate and report.
_ELSEWHERE = ("split", "columns", "trust_selection")


def add_report_parser(subparsers: argparse._SubParsersAction) -> argparse.ArgumentParser:
    """Register ``datamask report``; its settings' flags are made from the declarations of
    :class:`~datamask.evaluation.report_spec.ReportSpec`."""
    p = subparsers.add_parser(
        "report",
        help="write an HTML page showing what selections kept, side by side",
        description="Write one self-contained HTML page (no server, no network) showing, "
        "for each selection side by side: the documents kept and, with a length column, "
        "the tokens kept (and the token budget a selection was made under); documents "
        "kept per topic (k-means clusters of "
        "the embeddings) and their quality, the quality and length distributions of kept, "
        "dropped and all documents, a 2-D map of a sample, the near-duplicate figures of "
        "`evaluate` with the closest kept pairs, text samples kept and dropped per topic, "
        "and the objective terms and settings of each selection. The input is streamed: "
        "memory stays flat in the number of documents.",
    )
    add_config_argument(p)
    p.add_argument(
        "--input",
        help="what the selections were made from: a parquet file, folder or glob, or a "
        "save_to_disk folder",
    )
    p.add_argument(
        "--selection",
        help="`datamask select` output (a parquet file, or a sharded run's output folder), "
        "a parquet of selected ids, or a text file of ids",
    )
    p.add_argument(
        "--compare",
        nargs="+",
        metavar="SELECTION",
        help="more selections of the same input, shown beside the first",
    )
    p.add_argument("--output", help="folder of the page (written as OUTPUT/index.html)")
    for opt in section_settings(ReportSpec):
        if opt.name not in _ELSEWHERE:
            add_flag(p, opt, flags=_FLAGS.get(opt.name))
    add_trust_argument(p, "that --input is what each selection was made from: its fingerprints")
    add_column_arguments(p.add_argument_group("columns"))
    return p


def report_spec_from_args(args: argparse.Namespace) -> ReportSpec:
    """The one spec the flags and the config file make (checked once, before any work)."""
    keys = [o.name for o in section_settings(ReportSpec)] + [*COLUMN_KEYS, "quality_col"]
    return spec_from_args(args, ReportSpec, keys, _PLACES)


#: Where report reads and writes (flags, or keys of the config file).
_PLACES = ("input", "selection", "compare", "output")


def run_report(args: argparse.Namespace) -> int:
    """``datamask report``: build the page and write OUTPUT/index.html."""
    places = places_from_args(args, _PLACES, required=("input", "selection", "output"))
    spec = report_spec_from_args(args)
    start = time.perf_counter()
    selections = [places["selection"], *(places["compare"] or [])]
    built = report(places["input"], selections, places["output"], spec)
    print(
        f"wrote {built['page']} ({format_bytes(built['page_bytes'])}): {built['n_docs']:,} "
        "documents, "
        f"{len(selections)} selection{'s' if len(selections) > 1 else ''}, "
        f"{len(built['topics'])} topics, in {time.perf_counter() - start:.1f}s"
    )
    return 0
