"""Which files a location names: itself, a folder's files of some suffixes, or the
matches of a glob (:func:`expand`), and the folder their relative names start from
(:func:`glob_root`)."""

from __future__ import annotations

import fnmatch
import glob
import os
import re
from collections.abc import Sequence
from pathlib import Path

import pyarrow.fs as pafs

from .fs import Location

__all__ = ["expand", "glob_root"]


def expand(loc: Location, *, what: str, suffixes: Sequence[str]) -> list[Location]:
    """The files ``loc`` names: itself, every file with one of ``suffixes`` (any letter
    case) below a folder,
    or the matches of a glob (``*``, ``?``, ``[``; ``**`` crosses folders).

    Raises a one-line ValueError when nothing matches.
    """
    text = loc.path
    if loc.is_local and not Path(text).exists() and glob.has_magic(text):
        files = sorted(p for p in glob.glob(text, recursive=True) if os.path.isfile(p))
        found = [_local_child(loc, p) for p in files if p.lower().endswith(tuple(suffixes))]
        if not found:
            raise ValueError(f"{what} {loc.uri!r}: no files match.")
        return found
    if not loc.is_local and glob.has_magic(text):
        head = re.split(r"[*?\[]", text, maxsplit=1)[0]
        base = head.rsplit("/", 1)[0]
        root = Location(loc.uri, loc.scheme, loc.fs, base)
        pattern = text.replace("**/", "*")
        found = [f for f in root.walk() if fnmatch.fnmatchcase(f.path, pattern)]
        found = [
            Location(loc.uri.split("://")[0] + "://" + f.path, loc.scheme, loc.fs, f.path)
            for f in found
        ]
        if not found:
            raise ValueError(f"{what} {loc.uri!r}: no files match.")
        return found
    info = loc.info()
    if info.type == pafs.FileType.File:
        return [loc]
    if info.type == pafs.FileType.NotFound:
        raise ValueError(f"{what} {loc.uri!r} does not exist.")
    found = [f for f in loc.walk() if f.path.lower().endswith(tuple(suffixes))]
    if not found:
        listed = ", ".join(f"*{s}" for s in suffixes)
        raise ValueError(f"{what} {loc.uri!r} is a folder with no {listed} files.")
    return found


def _local_child(loc: Location, path: str) -> Location:
    return Location(path, loc.scheme, loc.fs, os.path.abspath(path))


def glob_root(loc: Location) -> str:
    """The folder that relative names of ``loc``'s files are taken from (see :func:`expand`)."""
    text = loc.path
    if glob.has_magic(text) and not (loc.is_local and Path(text).exists()):
        head = re.split(r"[*?\[]", text, maxsplit=1)[0]
        return head.rsplit("/", 1)[0]
    return text
