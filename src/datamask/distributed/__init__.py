"""Corpus-scale selection over parquet shards: partition, run per group, merge, resume.

``datamask.select(DIR, OUT, spec=spec)`` (``datamask select --input DIR_OR_GLOB``) plans
shards here; ``run_selection(source, output, spec, runner=RayRunner())`` is the sharded
run itself. See :mod:`.runner` for the layout of a run and :mod:`.plan.partition` for the groups
and the exact global budget.
"""

from .engine import Step, execute, run_steps
from .executors import LocalRunner
from .paths import WorkDir
from .plan.partition import PARTITIONS, Group, Piece, apportion, group_seeds
from .ray_backend import RayRunner
from .runner import run_selection
from .select.steps import GroupJob, SelectGroup

__all__ = [
    "PARTITIONS",
    "Group",
    "GroupJob",
    "LocalRunner",
    "Piece",
    "RayRunner",
    "SelectGroup",
    "Step",
    "WorkDir",
    "apportion",
    "execute",
    "group_seeds",
    "run_selection",
    "run_steps",
]
