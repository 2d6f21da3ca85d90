"""Flags made from the declared settings, and the argument groups commands share.

Every flag of a setting comes from its :class:`~datamask.settings.Setting` (name, type,
choices, help and default), so a setting is declared once, in :mod:`datamask.config` or in
the constraint table of the selector or term that owns it. Flags default to None, so that
a ``--config`` file can fill what the command line leaves out; the setting's default is
shown in the help and applied by :class:`~datamask.config.SelectSpec`.
"""

from __future__ import annotations

import argparse
from collections.abc import Iterable
from typing import Any

from ..columns import Columns
from ..config import (
    ObjectiveSpec,
    PartitionSpec,
    RunSpec,
    SelectorSpec,
    quality_spec,
    selector_settings,
    term_settings,
)
from ..settings import Setting, section_settings

__all__ = [
    "add_column_arguments",
    "add_objective_arguments",
    "add_flag",
    "add_flags",
    "add_select_arguments",
]

#: Flags whose spelling is not ``--`` + the key (or which act differently from a plain value).
_SPECIAL: dict[str, dict[str, Any]] = {
    "quality_cols": {
        "flags": ["--quality-col", "--quality_col"],
        "dest": "quality_col",
        "action": "append",
        "type": None,  # set below: NAME or NAME:WEIGHT
        "help": "quality column, NAME or NAME:WEIGHT; repeat to mix several",
    },
    "term_modules": {"flags": ["--term-module", "--term_module"], "action": "append"},
    "progress": {
        "flags": ["--no-progress"],
        "action": "store_false",
        "help": "hide the progress bar",
    },
    "selected_only": {"flags": ["--selected-only", "--selected_only"], "action": "store_true"},
}


def _quality_arg(text: str) -> tuple[str, float]:
    try:
        return quality_spec(text)
    except ValueError as exc:
        raise argparse.ArgumentTypeError(str(exc)) from None


_SPECIAL["quality_cols"]["type"] = _quality_arg


def _flags(name: str) -> list[str]:
    dashed = "--" + name.replace("_", "-")
    return [dashed] if "_" not in name else [dashed, "--" + name]


def _help(opt: Setting) -> str:
    text = opt.help.replace("%", "%%")
    if opt.owners:
        text = f"[{', '.join(opt.owners)}] {text}"
    default = opt.default
    if isinstance(default, tuple):
        default = " ".join(map(str, default)) or "none"
    return f"{text} (default: {default})" if default is not None else text


def add_flag(parser: Any, opt: Setting, flags: list[str] | None = None) -> argparse.Action:
    """One flag for ``opt`` (default None: "not given"); ``flags``: its spellings, when not
    ``--`` + the key."""
    special = dict(_SPECIAL.get(opt.name, {}))
    flags = flags or special.pop("flags", _flags(opt.name))
    special.pop("flags", None)
    kw: dict[str, Any] = {"dest": special.pop("dest", opt.name), "default": None}
    kw["help"] = special.pop("help", None) or _help(opt)
    if special.get("action") in ("store_true", "store_false"):
        kw.update(special)
        return parser.add_argument(*flags, **kw)
    kw.update(special)
    if "type" not in kw and opt.kind is not bool:
        kw["type"] = opt.kind if opt.kind in (int, float) else None
    if opt.kind is bool and "action" not in kw:
        kw["action"] = argparse.BooleanOptionalAction
    if opt.many and "action" not in kw:
        kw["nargs"] = "+"
    if opt.choices is not None:  # a registry's names: user terms are imported by now
        kw["choices"] = opt.choices
    if kw.get("type") is None:
        kw.pop("type", None)
    return parser.add_argument(*flags, **kw)


def add_flags(parser: Any, opts: Iterable[Setting], skip: Iterable[str] = ()) -> None:
    skipped = set(skip)
    for opt in opts:
        if opt.name not in skipped:
            add_flag(parser, opt)


def add_column_arguments(parser: argparse.ArgumentParser, *, split: bool = True) -> None:
    """``--id-col``, ``--quality-col``, ``--feature-col`` and ``--preset``, as every command
    that reads a corpus takes them (None: from ``--preset`` or the input's columns), and
    ``--split`` where the command reads save_to_disk or Hub folders."""
    add_flags(parser, section_settings(Columns))
    if split:
        parser.add_argument(
            "--split",
            help="split of a DatasetDict save_to_disk folder or of a Hub-style parquet folder "
            "(default: the only one)",
        )


def add_objective_arguments(parser: argparse.ArgumentParser) -> None:
    """The objective: ``--algorithm``, ``--lamb``, ``--term-module`` and every term's
    parameters (``--n-neighbors``, ``--knn``, ``--n-probe``, and those of user terms)."""
    group = parser.add_argument_group("objective")
    add_flags(group, section_settings(ObjectiveSpec))
    add_flags(group, term_settings())


def add_select_arguments(parser: argparse.ArgumentParser) -> None:
    """Every setting of ``datamask select``, grouped as the spec's sections."""
    add_objective_arguments(parser)
    add_flags(parser.add_argument_group("method"), section_settings(SelectorSpec))
    add_flags(parser.add_argument_group("method parameters"), selector_settings())
    add_column_arguments(parser.add_argument_group("columns"))
    add_flags(
        parser.add_argument_group(
            "sharded selection",
            "used when --input is a directory or glob of parquet shards, or --partition is given",
        ),
        section_settings(PartitionSpec),
    )
    add_flags(parser.add_argument_group("run"), section_settings(RunSpec))
