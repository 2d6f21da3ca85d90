"""Corpus-scale selection over parquet shards: partition, run per group, merge, resume.

``datamask.select(DIR, OUT, spec=spec)`` (``datamask select --input DIR_OR_GLOB``) plans
shards here; ``run_selection(source, output, spec, runner=RayRunner())`` is the sharded
run itself. See :mod:`.runner` for the layout of a run and :mod:`.partition` for the groups
and the exact global budget.
"""

from .executors import LocalRunner
from .partition import PARTITIONS, GroupSpec, Piece, apportion, group_seeds
from .ray_backend import RayRunner
from .runner import run_selection
from .steps import select_group

__all__ = [
    "PARTITIONS",
    "GroupSpec",
    "LocalRunner",
    "Piece",
    "RayRunner",
    "apportion",
    "group_seeds",
    "run_selection",
    "select_group",
]
