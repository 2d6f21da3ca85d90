"""When a setting is read: the ``needs`` of the option declarations in
:mod:`datamask.config` (see :func:`datamask._validation.setting_field`).

Each predicate takes the run's spec and whether the run is sharded, and returns why that
run ignores the setting, or None when it reads it. A setting given (not its default) that
a run ignores is warned about at the door and not recorded as used
(:meth:`datamask.config.SelectSpec.ignored`).
"""

from __future__ import annotations

from typing import Any

__all__ = ["clustered", "global_budget", "grouped_by_size", "on_ray", "sharded_only"]


def sharded_only(spec: Any, sharded: bool) -> str | None:
    """Settings of a sharded run."""
    if sharded:
        return None
    return (
        "a one-file run is selected whole, in this process (give a folder, a glob or a list "
        "of shards, or shards=True, to partition it)"
    )


def clustered(spec: Any, sharded: bool) -> str | None:
    part = spec.partition.partition
    return sharded_only(spec, sharded) or (
        None if part == "cluster" else f"it is read by --partition cluster, not {part}"
    )


def grouped_by_size(spec: Any, sharded: bool) -> str | None:
    part = spec.partition.partition
    return sharded_only(spec, sharded) or (
        None if part in ("chunk", "cluster") else f"--partition {part} makes one group per shard"
    )


def global_budget(spec: Any, sharded: bool) -> str | None:
    budget = spec.partition.budget
    return sharded_only(spec, sharded) or (
        None if budget == "global" else f"it is read by --budget global, not {budget}"
    )


def on_ray(spec: Any, sharded: bool) -> str | None:
    run = spec.run
    ray = run.runner == "ray" or (run.runner is None and run.ray_address is not None)
    return sharded_only(spec, sharded) or (None if ray else "it is read by --runner ray only")
