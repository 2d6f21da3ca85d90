"""The ``max_similarity`` cap across groups of a sharded selection.

Each group's learner already keeps no two of *its* documents above the threshold (the cap
in its final rounding). Two groups can still keep near-duplicates of each other, so after
every group has finished, one pass on the driver makes the cap global:

1. groups are taken in order (gid); a :class:`~datamask.near_duplicates.SimilarityCap`
   holds the features of every document kept so far;
2. each group walks down its own ranking (rank 1 first, from ``WORK/groups/NNNNN.parquet``)
   and keeps its budget of documents compatible with everything kept before: its own
   selection wherever it has no conflict with an earlier group, and for each conflict the
   next-best compatible document of its ranking;
3. a group that cannot fill its budget passes the shortfall to the next group, so the global
   count stays exactly ``round(select_ratio * N)``; a shortfall left after the last group is
   the infeasible-cap error;
4. the parts of changed groups are rewritten atomically, and the whole selection is checked
   exactly (every pair, in tiles) before the manifest is written. ``WORK/groups/*.parquet``
   keep each group's own ranking and ``selected`` flags; ``OUT/selected`` is the final,
   capped selection (replacements keep their rank in their group, so it exceeds k there).

Cost: one read of every group's rows and O(k^2 d) similarity work for k kept documents in
all (about 100,000 x 384 floats held in memory for k = 100,000).
"""

from __future__ import annotations

import time
from pathlib import Path
from typing import Any

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
from tqdm.auto import tqdm

from .._validation import check_corpus
from ..io.parquet import atomic_write_table
from ..near_duplicates import SimilarityCap, infeasible_message, verify_cap
from .partition import GroupSpec
from .runner import Settings, _group_name, part_path, read_group

__all__ = ["cap_across_groups"]


def cap_across_groups(
    groups: list[GroupSpec],
    settings: Settings,
    work: Path,
    out: Path,
    *,
    progress: bool = False,
) -> dict[str, Any]:
    """Resolve near-duplicates between groups; rewrite the parts that change.

    Returns
    -------
    dict
        ``threshold``, ``replaced`` (documents swapped for a compatible one in all),
        ``groups_changed``, ``max_pair_similarity`` (exact, whole selection), ``seconds``
        and ``per_group`` (gid -> replaced, for groups that changed).
    """
    started = time.perf_counter()
    threshold = float(settings.max_similarity)
    k_total = sum(g.k for g in groups)
    cap: SimilarityCap | None = None
    short, replaced, per_group = 0, 0, {}
    for g in tqdm(groups, desc="cap across groups", unit="group", disable=not progress):
        want = g.k + short
        if want == 0:
            continue
        corpus, ids = read_group(g, settings)
        check_corpus(corpus)  # L2-normalised, as the learner saw them
        table = pq.read_table(
            Path(work) / "groups" / f"{_group_name(g.gid)}.parquet", columns=["rank", "logit"]
        )
        rank = table.column("rank").to_numpy()
        order = np.argsort(rank, kind="stable")
        if cap is None:
            cap = SimilarityCap(corpus.features, threshold, capacity=k_total)
        else:
            cap.rebind(corpus.features)
        kept = cap.walk(order, len(cap) + want)
        short = want - len(kept)
        own = order[: g.k]
        swapped = len(np.setdiff1d(own, kept))
        if swapped or len(kept) != g.k:
            replaced += swapped
            per_group[str(g.gid)] = {"replaced": swapped, "k": int(len(kept))}
            keep = kept[np.argsort(rank[kept], kind="stable")]
            logits = table.column("logit").to_numpy()
            atomic_write_table(
                pa.table(
                    {
                        settings.id_col: ids.take(pa.array(keep)),
                        "group": pa.array(np.full(len(keep), g.gid, dtype=np.int32)),
                        "rank": pa.array(rank[keep]),
                        "logit": pa.array(logits[keep]),
                    }
                ),
                part_path(out, g.gid),
            )
    if short:
        kept_n = len(cap) if cap is not None else 0
        raise ValueError(
            infeasible_message(
                threshold, kept_n, k_total, sum(g.n for g in groups), "the groups' rankings"
            )
        )
    top = verify_cap(cap.kept_features(), None, threshold) if cap is not None else -np.inf
    return {
        "threshold": threshold,
        "replaced": replaced,
        "groups_changed": len(per_group),
        "max_pair_similarity": float(top),
        "seconds": time.perf_counter() - started,
        "per_group": per_group,
    }
