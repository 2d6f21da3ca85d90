"""Remote path flags of ``evaluate``, ``bench`` and ``embed``: the parsed arguments around
:func:`datamask.io.remote.staged_paths` (``select`` stages its own paths:
:func:`datamask.select` takes URIs; ``apply`` streams them itself)."""

from __future__ import annotations

import argparse
from collections.abc import Iterator
from contextlib import contextmanager

from ..io.fs import is_uri
from ..io.remote import staged_paths

__all__ = ["COMMAND_PATHS", "staged_arguments"]

#: Path arguments of each command: (inputs, outputs).
COMMAND_PATHS: dict[str, tuple[tuple[str, ...], tuple[str, ...]]] = {
    "evaluate": (("input", "selection"), ("output",)),
    "embed": (("input",), ("output",)),
    "bench": (("input",), ("out_dir",)),
}


@contextmanager
def staged_arguments(args: argparse.Namespace) -> Iterator[argparse.Namespace]:
    """``args`` with its remote path arguments replaced by local ones while the command
    runs; outputs are uploaded when it succeeds. Other commands pass unchanged."""
    spec = COMMAND_PATHS.get(getattr(args, "command", ""))
    if spec is None:
        yield args
        return
    inputs, outputs = spec
    if (
        args.command == "evaluate"
        and getattr(args, "output", None) is None
        and is_uri(str(args.selection))
    ):
        text = str(args.selection)
        stem = text.rsplit(".", 1)[0] if "." in text.rsplit("/", 1)[-1] else text
        args.output = stem + ".eval.json"  # beside the selection, as for a local one
    paths = {name: getattr(args, name, None) for name in inputs + outputs}
    with staged_paths(paths, inputs=inputs) as local:
        for name, value in local.items():
            setattr(args, name, value)
        yield args
