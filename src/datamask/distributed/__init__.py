"""Corpus-scale selection over parquet shards: partition, run per group, merge, resume.

``run_selection(source, output, Settings(...), runner=RayRunner())`` is the library entry;
``datamask select --input DIR_OR_GLOB`` the command. See :mod:`.runner` for the layout of
a run and :mod:`.partition` for the groups and the exact global budget.
"""

from .commands import add_distributed_arguments, make_runner, run_distributed
from .partition import PARTITIONS, GroupSpec, Piece, apportion, group_seeds
from .ray_backend import RayRunner
from .runner import LocalRunner, Settings, run_selection, select_group

__all__ = [
    "PARTITIONS",
    "GroupSpec",
    "LocalRunner",
    "Piece",
    "RayRunner",
    "Settings",
    "add_distributed_arguments",
    "apportion",
    "group_seeds",
    "make_runner",
    "run_distributed",
    "run_selection",
    "select_group",
]
