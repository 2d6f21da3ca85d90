"""``datamask report``: one self-contained HTML page to look at selections in a browser.

datamask report --input docs.parquet --selection mask.parquet --compare topk.parquet \\
    random.parquet --output report/
"""

from __future__ import annotations

import argparse
import inspect
import time
from pathlib import Path
from typing import Any

from .._device import set_threads
from ..evaluate.browse import REPORT_CONSTRAINTS, build_report, write_report
from ..io.atomic import OutputLock, check_no_overlap, check_writable
from .args import add_threads_argument
from .common import (
    add_data_arguments,
    add_dup_thresholds_argument,
    add_trust_argument,
    columns_from_args,
)

__all__ = ["add_report_parser", "run_report"]

_DEFAULTS = {
    name: p.default
    for name, p in inspect.signature(build_report).parameters.items()
    if p.default is not inspect.Parameter.empty
}

#: Flags passed to :func:`build_report` when given (their defaults live there, once).
_PASSED = ("text_col", "length_col", "n_topics", "sample_size", "map_method", "n_examples")


def _d(name: str) -> str:
    return f"(default: {_DEFAULTS[name]})"


def add_report_parser(subparsers: argparse._SubParsersAction) -> argparse.ArgumentParser:
    """Register ``datamask report``."""
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
    p.add_argument(
        "--text-col",
        "--text_col",
        dest="text_col",
        default=None,
        help="column of the documents' text, for topic words and samples (default: text, "
        "when present)",
    )
    p.add_argument(
        "--topics",
        dest="n_topics",
        type=int,
        default=None,
        help=f"k-means topics of the embeddings {_d('n_topics')}",
    )
    p.add_argument(
        "--sample",
        dest="sample_size",
        type=int,
        default=None,
        help=f"seeded sample for the map, the topic fit and the text samples {_d('sample_size')}",
    )
    p.add_argument(
        "--map",
        dest="map_method",
        choices=REPORT_CONSTRAINTS["map_method"][0].ordered,
        default=None,
        help=f"projection of the 2-D map (tsne: slower, needs scikit-learn) {_d('map_method')}",
    )
    p.add_argument(
        "--examples",
        dest="n_examples",
        type=int,
        default=None,
        help=f"closest kept pairs shown per selection {_d('n_examples')}",
    )
    p.add_argument(
        "--seed",
        type=int,
        default=_DEFAULTS["seed"],
        help=f"seed of the sample, the topics and the map {_d('seed')}",
    )
    p.add_argument(
        "--no-progress", dest="progress", action="store_false", help="hide progress bars"
    )
    add_trust_argument(p, "that --input is what each selection was made from: its fingerprints")
    add_dup_thresholds_argument(p)
    add_data_arguments(p.add_argument_group("columns"))  # as evaluate and bench: --length-col too
    add_threads_argument(p)
    return p


def run_report(args: argparse.Namespace) -> int:
    """``datamask report``: build the page and write OUTPUT/index.html."""
    set_threads(args.threads)
    start = time.perf_counter()
    selections = [args.selection, *args.compare]
    output = Path(args.output)
    page = output / "index.html"
    # Before any computation: the page never overwrites the data or a selection.
    check_writable(page)
    check_no_overlap([page], [args.input, *selections])
    given: dict[str, Any] = {k: getattr(args, k) for k in _PASSED if getattr(args, k) is not None}
    with OutputLock(page):
        report = build_report(
            args.input,
            selections,
            split=args.split,
            columns=columns_from_args(args),
            dup_thresholds=args.dup_thresholds,
            seed=args.seed,
            progress=args.progress,
            trust_selection=args.trust_selection,
            **given,
        )
        path = write_report(report, output)
    print(
        f"wrote {path} ({path.stat().st_size / 1e6:.1f} MB): {report['n_docs']:,} documents, "
        f"{len(selections)} selection{'s' if len(selections) > 1 else ''}, "
        f"{len(report['topics'])} topics, in {time.perf_counter() - start:.1f}s"
    )
    return 0
