"""The ``--config`` file of ``datamask select``: YAML or TOML, read once, before the parser
is built (its ``term_modules`` add flags); :class:`~datamask.config.SelectSpec` takes its
flat settings."""

from __future__ import annotations

import tomllib
from pathlib import Path
from typing import Any

from ..io.fs import expect_file

__all__ = ["load_config"]


def load_config(path: str | Path) -> dict[str, Any]:
    """The flat settings of a YAML or TOML file; keys may use ``-`` or ``_``."""
    p = Path(path)
    expect_file(p, what="config file", accepted="a YAML or TOML file")
    raw = p.read_bytes()
    try:
        text = raw.decode("utf-8")
    except UnicodeDecodeError as exc:
        line = raw[: exc.start].count(b"\n") + 1
        raise ValueError(
            f"config file {str(path)!r} is not UTF-8 text: byte 0x{raw[exc.start]:02x} at "
            f"line {line}; save it as UTF-8."
        ) from None
    try:
        if p.suffix.lower() == ".toml":
            data = tomllib.loads(text)
        else:
            import yaml

            data = yaml.safe_load(text) or {}
    except Exception as exc:
        raise ValueError(f"cannot parse config file {str(path)!r}: {_config_error(exc)}") from None
    if not isinstance(data, dict):
        raise ValueError(f"config file {str(path)!r} must hold a mapping of settings.")
    flat: dict[str, Any] = {}
    spelt: dict[str, str] = {}
    for key, value in data.items():
        name = str(key).replace("-", "_")
        if name in flat:  # select-ratio and select_ratio: which one is meant is unknown
            raise ValueError(
                f"config file {str(path)!r} gives {name} twice ({spelt[name]!r} and "
                f"{str(key)!r}); keep one."
            )
        flat[name], spelt[name] = value, str(key)
    return flat


def _config_error(exc: Exception) -> str:
    """A parser's error in one line: the problem and where (YAML's are several lines)."""
    mark = getattr(exc, "problem_mark", None)
    problem = getattr(exc, "problem", None)
    if mark is not None and problem:
        return f"{problem} at line {mark.line + 1}, column {mark.column + 1}."
    return " ".join(str(exc).split())
