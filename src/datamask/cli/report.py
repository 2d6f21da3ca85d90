"""``datamask report``: one self-contained HTML page to look at selections in a browser.

datamask report --input docs.parquet --selection mask.parquet --compare topk.parquet \\
    random.parquet --output report/

The flags are made from the declarations of :class:`~datamask.evaluation.report_spec.ReportSpec`;
the flags given become one spec, checked once, before any output or work.
"""

from __future__ import annotations

import argparse
import time
from pathlib import Path

from .._device import set_threads
from .._units import format_bytes
from ..evaluation.browse import build_report, write_report
from ..evaluation.report_spec import ReportSpec
from ..io.atomic import OutputLock, check_no_overlap, check_writable
from ..settings import section_settings
from .args import add_column_arguments, add_flag, add_threads_argument
from .common import add_trust_argument, columns_from_args

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
        "for each selection side by side: documents kept per topic (k-means clusters of "
        "the embeddings) and their quality, the quality and length distributions of kept, "
        "dropped and all documents, a 2-D map of a sample, the near-duplicate figures of "
        "`evaluate` with the closest kept pairs, text samples kept and dropped per topic, "
        "and the objective terms and settings of each selection. The input is streamed: "
        "memory stays flat in the number of documents.",
    )
    p.add_argument(
        "--input",
        required=True,
        help="what the selections were made from: a parquet file, folder or glob, or a "
        "save_to_disk folder",
    )
    p.add_argument(
        "--selection",
        required=True,
        help="`datamask select` output, a parquet of selected ids, or a text file of ids",
    )
    p.add_argument(
        "--compare",
        nargs="+",
        default=[],
        metavar="SELECTION",
        help="more selections of the same input, shown beside the first",
    )
    p.add_argument(
        "--output", required=True, help="folder of the page (written as OUTPUT/index.html)"
    )
    for opt in section_settings(ReportSpec):
        if opt.name not in _ELSEWHERE:
            action = add_flag(p, opt, flags=_FLAGS.get(opt.name))
            if opt.name == "progress":  # the command shows bars unless --no-progress
                action.default = True
    add_trust_argument(p, "that --input is what each selection was made from: its fingerprints")
    add_column_arguments(p.add_argument_group("columns"))
    add_threads_argument(p)
    return p


def report_spec_from_args(args: argparse.Namespace) -> ReportSpec:
    """The one spec the flags given make (checked once, before any output or work)."""
    given = vars(args)
    values = {o.name: given.get(o.name) for o in section_settings(ReportSpec)}
    return ReportSpec.from_mapping({**values, "columns": columns_from_args(args)})


def run_report(args: argparse.Namespace) -> int:
    """``datamask report``: build the page and write OUTPUT/index.html."""
    spec = report_spec_from_args(args)
    set_threads(args.threads)
    start = time.perf_counter()
    selections = [args.selection, *args.compare]
    output = Path(args.output)
    page = output / "index.html"
    # Before any computation: the page never overwrites the data or a selection.
    check_writable(page)
    check_no_overlap([page], [args.input, *selections])
    with OutputLock(page):
        report = build_report(args.input, selections, spec)
        path = write_report(report, output)
    print(
        f"wrote {path} ({format_bytes(path.stat().st_size)}): {report['n_docs']:,} documents, "
        f"{len(selections)} selection{'s' if len(selections) > 1 else ''}, "
        f"{len(report['topics'])} topics, in {time.perf_counter() - start:.1f}s"
    )
    return 0
