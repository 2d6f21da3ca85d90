"""What the commands share: ``--config`` (a YAML or TOML file of settings, and of places:
``input``, ``output``, ...; flags win), the corpus columns and the provenance escape hatch.
Every command's spec is made the same way: :func:`spec_from_args`."""

from __future__ import annotations

import argparse
from dataclasses import fields
from typing import Any

from ..columns import Columns
from ..config import split_quality
from ..data import Corpus
from ..evaluation.evaluate_run import read_scored_corpus
from ..io.input_settings import InputSettings
from ..settings import merge_settings, section_settings
from .args import add_column_arguments, add_flag

__all__ = [
    "add_config_argument",
    "add_data_arguments",
    "add_trust_argument",
    "columns_from_args",
    "places_from_args",
    "read_corpus_arg",
    "spec_from_args",
]


def add_config_argument(p: argparse.ArgumentParser) -> None:
    """``--config``: the one config file flag of every command."""
    p.add_argument(
        "--config",
        help="YAML or TOML file with any of these settings, and the places (input, output, "
        "...); flags win",
    )


def _config(args: argparse.Namespace) -> dict[str, Any]:
    return dict(getattr(args, "config_values", None) or {})


def places_from_args(
    args: argparse.Namespace, names: tuple[str, ...], required: tuple[str, ...]
) -> dict[str, Any]:
    """Where a command reads and writes: each flag, else the config file's key; a
    ``required`` one given by neither is refused, naming the flag."""
    config = _config(args)
    places = {n: getattr(args, n, None) if getattr(args, n, None) is not None else config.get(n)
              for n in names}  # fmt: skip
    for name in required:
        if places[name] in (None, "", []):
            raise ValueError(f"--{name.replace('_', '-')} is required (a flag or a config key).")
    return places


def spec_from_args(
    args: argparse.Namespace, spec_class: Any, keys: list[str], places: tuple[str, ...] = ()
) -> Any:
    """The one spec the flags and the config file make: flags over the file over defaults;
    the file's settings are checked first, so an error names it."""
    config = {k: v for k, v in _config(args).items() if k not in places}
    where = f"config file {getattr(args, 'config', None)!r}"
    if config:
        spec_class.from_mapping(config, where=where)  # errors name the file
    given = {k: getattr(args, k) for k in keys if getattr(args, k, None) is not None}
    if "columns" in {f.name for f in fields(spec_class)}:  # NAME:WEIGHT -> columns, weights
        given = split_quality(given)
    return spec_class.from_mapping(merge_settings(config, given))


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
