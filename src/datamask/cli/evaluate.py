"""``datamask evaluate``: score a selection with the objective, every term and diagnostics.

datamask evaluate --input docs.parquet --selection out/selection.parquet
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path
from typing import Any

from .._device import set_threads
from ..config import ObjectiveSpec, SelectorSpec
from ..evaluate.report import evaluate_selection, format_report, read_selection
from ..io.atomic import OutputLock, atomic_write_json, check_no_overlap, check_writable
from ..io.fs import expect_file
from ..io.provenance import selection_record, verify_selection_file, warn_trust_unused
from ..io.selection import SELECTION_FILES
from ..pipeline.given import evaluate_given, read_given
from ..settings import section_settings
from .args import add_flags
from .common import (
    add_data_arguments,
    add_redundancy_arguments,
    add_scoring_arguments,
    add_trust_argument,
    objective_from,
    read_corpus_arg,
)

__all__ = ["add_evaluate_parser", "run_evaluate"]


def add_evaluate_parser(subparsers: argparse._SubParsersAction) -> argparse.ArgumentParser:
    """Register ``datamask evaluate``."""
    p = subparsers.add_parser(
        "evaluate",
        help="score a selection: the objective, every term and diagnostics",
        description="Score a selection of --input: the objective J and each term, quality "
        "mean, facility-location coverage of the whole set, mean pairwise similarity, DiSF "
        "correlation loss, mean nearest-neighbour similarity inside the subset and the "
        "length distribution. Prints a table and writes JSON.",
    )
    p.add_argument("--input", required=True, help="the parquet the selection was made from")
    p.add_argument(
        "--selection",
        required=True,
        help="`datamask select` output (parquet with the id column and a boolean "
        "`selected` column), a parquet of selected ids only, or a text file with "
        "one id per line",
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
    add_flags(
        p, [o for o in section_settings(SelectorSpec) if o.name in ("given", "given_selection")]
    )
    add_scoring_arguments(p)
    add_data_arguments(p)
    add_redundancy_arguments(p)
    return p


def run_evaluate(args: argparse.Namespace) -> int:
    """``datamask evaluate``: print the table (or JSON) and write the JSON report."""
    set_threads(args.threads)
    objective = objective_from(args)  # checked before any work
    sel = Path(args.selection)
    output = (
        Path(args.output)
        if args.output
        else sel.with_name(sel.name.removesuffix(sel.suffix) + ".eval.json")
    )
    # Before any computation: the report never overwrites the data or the selection.
    check_writable(output)
    read = [args.input, args.selection, args.given, args.given_selection]
    check_no_overlap([output], [path for path in read if path is not None])
    for path, what in (
        (args.selection, "--selection"),
        (args.given_selection, "--given-selection"),
    ):
        if path is not None:  # a folder is named one, before the corpus is read
            expect_file(path, what=what, accepted=SELECTION_FILES)
    # The selection was made from this input (docs/provenance.md); the report says so.
    if args.trust_selection and selection_record(args.selection) is None:
        warn_trust_unused(args.selection, "it holds no provenance record to check")
    verified = (
        0
        if args.trust_selection
        else verify_selection_file(args.selection, args.input, split=getattr(args, "split", None))
    )
    with OutputLock(output):
        report = _evaluate(args, objective)
        report["provenance"] = {"trusted": args.trust_selection, "verified_files": verified}
        atomic_write_json(report, output)
    if args.format == "json":
        print(json.dumps(report, indent=2))
    else:
        print(format_report(report))
        print(f"wrote {output}")
    return 0


def _evaluate(args: argparse.Namespace, objective: ObjectiveSpec) -> dict[str, Any]:
    corpus, columns = read_corpus_arg(args, args.input)
    rows = read_selection(args.selection, corpus.ids, id_col=columns.id_col)
    report = evaluate_selection(
        corpus,
        rows,
        algorithm=list(objective.algorithm),
        lamb=objective.lamb,
        length_col=args.length_col,
        device=args.device or "auto",
        dup_thresholds=args.dup_thresholds,
        dup_search=args.dup_search,
    )
    report["selection"] = str(args.selection)
    if args.given is not None:  # scored given KEPT, as `select --given` scores it
        kept = read_given(args.given, columns, selection=args.given_selection)
        report["given"] = evaluate_given(corpus, kept, rows, objective, id_col=columns.id_col)
    elif args.given_selection is not None:
        raise ValueError(
            "--given-selection needs --given, the documents it selects from; got "
            f"--given-selection {args.given_selection!r} alone."
        )
    return report
