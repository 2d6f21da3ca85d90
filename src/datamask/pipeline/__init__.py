"""The selection pipeline's parts: one group step and one writer, for a file or a corpus.

:func:`fit_group` selects exactly k rows of one group with any method of the registry;
:func:`selection_table` and :func:`run_record` write what it chose. The doors that run them
on a file or on shards are :func:`datamask.select` and :func:`datamask.select_table`
(:mod:`datamask.api`); the sharded planner is :mod:`datamask.distributed`.
"""

from .step import MODULAR, fit_group
from .writer import run_record, selection_table

__all__ = ["MODULAR", "fit_group", "run_record", "selection_table"]
