"""The selection pipeline: one spec, one group step, one writer, for a file or a corpus.

``select(source, output, spec)`` is the library entry behind ``datamask select``: a single
file is a plan with one group, shards are planned by :mod:`datamask.distributed`; both run
:func:`fit_group` and write with :func:`selection_table`.
"""

from typing import Any

from .step import MODULAR, fit_group
from .writer import run_record, selection_table

__all__ = [
    "MODULAR",
    "fit_group",
    "is_sharded",
    "make_runner",
    "run_record",
    "select",
    "selection_table",
]


def __getattr__(name: str) -> Any:
    # .run imports the sharded runner, which imports .step and .writer of this package:
    # loaded on first use, so that importing either side first works without a cycle.
    if name in ("select", "make_runner", "is_sharded"):
        from . import run

        return getattr(run, name)
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
