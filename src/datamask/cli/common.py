"""What ``evaluate`` and ``bench`` share: the corpus they read, the objective they score
with and the near-duplicate figures."""

from __future__ import annotations

import argparse
from pathlib import Path

from ..columns import Columns
from ..config import ObjectiveSpec, SelectorSpec, split_quality
from ..data import Corpus
from ..evaluate.redundancy import DuplicateSettings
from ..evaluate.report import LENGTH_COLUMNS
from ..io.datasets import input_column_names, is_save_to_disk, read_input_corpus
from ..settings import section_settings
from .args import add_column_arguments, add_flag, add_objective_arguments, add_threads_argument

__all__ = [
    "add_data_arguments",
    "add_dup_thresholds_argument",
    "add_objective_arguments",
    "add_redundancy_arguments",
    "add_trust_argument",
    "columns_from_args",
    "objective_from",
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
    column of the report."""
    add_column_arguments(p)
    p.add_argument(
        "--length-col",
        "--length_col",
        dest="length_col",
        default=None,
        help="column for the length distribution, numbers or texts (default: the first of "
        "n_chars, length, n_tokens, text present; none -> no length section)",
    )


def add_scoring_arguments(p: argparse.ArgumentParser) -> None:
    """The objective, the device and the threads."""
    add_objective_arguments(p)
    add_flag(p, next(o for o in section_settings(SelectorSpec) if o.name == "device"))
    add_threads_argument(p)


def objective_from(args: argparse.Namespace) -> ObjectiveSpec:
    """The objective the flags describe, checked like ``select``'s."""
    return ObjectiveSpec.from_mapping(vars(args))


def add_dup_thresholds_argument(p: argparse.ArgumentParser) -> None:
    _add_duplicate_flag(p, "dup_thresholds")


def add_redundancy_arguments(p: argparse.ArgumentParser) -> None:
    add_dup_thresholds_argument(p)
    _add_duplicate_flag(p, "dup_search")


def _add_duplicate_flag(p: argparse.ArgumentParser, name: str) -> None:
    """The flag of a near-duplicate setting, with its declared default (these commands read
    the flag's value as it is, with no spec to fill it)."""
    setting = next(s for s in section_settings(DuplicateSettings) if s.name == name)
    add_flag(p, setting).default = list(setting.default) if setting.many else setting.default


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
    names = input_column_names(path, split=split) if Path(path).exists() else []
    columns = columns_from_args(args).resolve(names, where=str(path))
    extra: list[str] = []
    wanted = [args.length_col] if args.length_col else list(LENGTH_COLUMNS)
    if Path(path).is_file() or is_save_to_disk(path):
        present = [c for c in wanted if c in names]
        if args.length_col and not present and names:
            raise ValueError(
                f"column {args.length_col!r} not found in {path}; available columns: {names}."
            )
        extra = present[:1]  # read one length source only (texts can be large)
    return read_input_corpus(path, columns, split=split, extra_cols=extra), columns
