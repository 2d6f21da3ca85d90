"""The partition section of :class:`~datamask.config.SelectSpec`: how a sharded corpus is
split into groups and how the budget is shared (:mod:`datamask.distributed`)."""

from __future__ import annotations

from dataclasses import dataclass

from ._needs import clustered, global_budget, grouped_by_size, sharded_only
from ._validation import Interval, Options
from .settings import setting_field

__all__ = ["COUNT", "PartitionSpec"]

#: A count's constraint: "> 0", as every count's message says.
COUNT = Interval(int, 0, None, closed="neither")


@dataclass(frozen=True)
class PartitionSpec:
    """How a sharded corpus is split into groups and how the budget is shared."""

    partition: str = setting_field(
        "cluster",
        (Options(str, ("shard", "chunk", "cluster")),),
        "selection groups: k-means clusters of the embeddings (each document's neighbours in "
        "its own group; a cluster above --chunk-size rows is cut along its geometry), one "
        "per shard, or "
        "fixed-size chunks of rows",
        needs=sharded_only,
    )
    chunk_size: int = setting_field(
        100_000,
        (COUNT,),
        "rows per group for --partition chunk, and the largest cluster group before it is "
        "split for --partition cluster",
        needs=grouped_by_size,
    )
    n_clusters: int | None = setting_field(
        None,
        (COUNT, None),
        "k-means clusters for --partition cluster (None: 1 when N fits one group, else "
        "3 x ceil(N / (0.9 x chunk-size)), neighbours then merged up to --chunk-size; "
        "given: every cluster its own group, or parts of one)",
        needs=clustered,
    )
    kmeans_sample: int | None = setting_field(
        None,
        (COUNT, None),
        "rows sampled to fit the k-means centroids (None: 100000, or 64 per centroid "
        "when that is more, at most 4000000)",
        needs=clustered,
    )
    kmeans_step_rows: int = setting_field(
        100_000,
        (COUNT,),
        "most sample rows one k-means step holds: a larger sample is fitted by steps over "
        "parts of it (Lloyd iterations that return only sums), in two levels above 1000 "
        "clusters",
        needs=clustered,
    )
    budget: str = setting_field(
        "global",
        (Options(str, ("global", "group")),),
        "global: exactly round(select-ratio * N) over the corpus from the groups' "
        "candidates (--partition cluster with quality + facility: one threshold over their "
        "gains in J; otherwise one more round over their union); group: each group keeps "
        "its proportional share",
        needs=sharded_only,
    )
    oversample: float = setting_field(
        2.0,
        (Interval(float, 1, None, closed="left"),),
        "--budget global: candidates per group as a multiple of its proportional share "
        "(exact merges for topk and random need none)",
        needs=global_budget,
    )
    exchange_neighbors: int = setting_field(
        8,
        (Interval(int, 0, None, closed="left"),),
        "--budget global by gains with facility location: after the allocation each group "
        "orders its candidates again, counting coverage above what the kept documents of up "
        "to this many nearest groups (of lower id) already give, and the budget is "
        "allocated again (0: no exchange round)",
        needs=global_budget,
    )
