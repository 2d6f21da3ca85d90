"""What ``evaluate``, ``bench``, ``apply`` and ``report`` share: the corpus they read, its
columns and the provenance escape hatch."""

from __future__ import annotations

import argparse

from ..columns import Columns
from ..config import split_quality
from ..data import Corpus
from ..evaluation.evaluate_run import read_scored_corpus
from ..io.input_settings import InputSettings
from ..settings import section_settings
from .args import add_column_arguments, add_flag

__all__ = [
    "add_data_arguments",
    "add_trust_argument",
    "columns_from_args",
    "read_corpus_arg",
]


def add_trust_argument(p: argparse.ArgumentParser | argparse._ArgumentGroup, checks: str) -> None:
    """``--trust-selection``: skip the provenance checks ``checks`` (docs/provenance.md),
    the one escape hatch ``apply``, ``evaluate`` and ``report`` share."""
    p.add_argument(
        "--trust-selection",
        "--trust_selection",
        dest="trust_selection",
        action="store_true",
        help=f"skip the provenance checks ({checks}), e.g. for the same rows re-encoded; see "
        "docs/provenance.md (default: check)",
    )


def add_data_arguments(p: argparse.ArgumentParser) -> None:
    """The corpus columns (None: from ``--preset`` or the input's columns) and the length
    column of the report (declared once, by :class:`InputSettings`)."""
    add_column_arguments(p)
    add_flag(p, next(o for o in section_settings(InputSettings) if o.name == "length_col"))


def columns_from_args(args: argparse.Namespace) -> Columns:
    """The columns the flags name; the rest are resolved by the reader from ``--preset``,
    else the input's schema (:meth:`~datamask.columns.Columns.resolve`)."""
    given = split_quality({"quality_col": args.quality_col})
    return Columns(
        id_col=args.id_col,
        quality_cols=tuple(given.get("quality_cols", ())),
        quality_weights=None
        if given.get("quality_weights") is None
        else tuple(given["quality_weights"]),
        feature_col=args.feature_col,
        preset=args.preset,
    )


def read_corpus_arg(args: argparse.Namespace, path: str) -> tuple[Corpus, Columns]:
    """The corpus at ``path`` with the columns the flags name (else preset, else schema),
    and those columns resolved (what ``read_selection`` matches ids with)."""
    split = getattr(args, "split", None)
    columns = columns_from_args(args)
    return read_scored_corpus(path, columns, split=split, length_col=args.length_col)
