"""The ``max_similarity`` cap across groups of a sharded selection.

Each group's learner already keeps no two of *its* documents above the threshold (the cap
in its final rounding). Two groups can still keep near-duplicates of each other, so after
every group has finished, one pass on the driver makes the cap global:

1. groups are taken in order (gid); a :class:`~datamask.near_duplicates.SimilarityCap`
   holds the features of every document kept so far;
2. each group walks down its own ranking (rank 1 first, by logit, from
   ``WORK/groups/NNNNN.parquet``) and keeps its budget of documents compatible with
   everything kept before: with nothing kept before, that is exactly the group's own capped
   selection; otherwise a document that conflicts with an earlier group's is replaced by
   the next-best compatible one of its ranking;
3. a group that cannot fill its budget passes the shortfall to the next group, so the global
   count stays exactly ``round(select_ratio * N)``; a shortfall left after the last group
   sends a second sweep down every group's ranking; one left after that is the
   infeasible-cap error (no further document of the input is compatible);
4. the parts of changed groups are rewritten atomically, and the whole selection is checked
   exactly (every pair, in tiles) before the manifest is written. ``WORK/groups/*.parquet``
   keep each group's own ranking and ``selected`` flags; ``OUT/selected`` is the final,
   capped selection (replacements keep their rank in their group, so it exceeds k there).

Cost: one read of every group's rows and O(k^2 d) similarity work for k kept documents in
all (about 100,000 x 384 floats held in memory for k = 100,000).
"""

from __future__ import annotations

import time
from typing import Any

import numpy as np
import pyarrow as pa
from tqdm.auto import tqdm

from ..._validation import check_corpus
from ...config import SelectSpec
from ...io.integrity import recording
from ...io.parquet import atomic_write_table, read_table
from ...near_duplicates import SimilarityCap, infeasible_message, verify_cap
from ..engine import amend
from ..paths import WorkDir
from ..plan.partition import Group
from ..select.steps import read_group

__all__ = ["cap_across_groups"]


class _Pass:
    """The shared state of the pass: the cap and what each group keeps."""

    def __init__(self, spec: SelectSpec, dirs: WorkDir, capacity: int) -> None:
        self.spec, self.dirs, self.capacity = spec, dirs, capacity
        self.cap: SimilarityCap | None = None
        self.kept: dict[int, np.ndarray] = {}  # gid -> rows kept, in walk order
        self.tables: dict[int, tuple[pa.Array, np.ndarray, np.ndarray, np.ndarray]] = {}

    def walk(self, g: Group, want: int) -> int:
        """Keep up to ``want`` more rows of group ``g``, best rank first. Returns how many."""
        corpus, ids = read_group(g, self.spec)
        corpus = check_corpus(corpus)  # L2-normalised, as the learner saw them
        table = read_table(
            self.dirs.group_rows(g.gid),
            columns=["rank", "logit", "selected"],
        )
        rank = table.column("rank").to_numpy()
        order = np.argsort(rank, kind="stable")
        before = self.kept.get(g.gid, np.zeros(0, dtype=np.int64))
        order = order[~np.isin(order, before)]  # a second sweep skips the rows kept already
        if self.cap is None:
            self.cap = SimilarityCap(
                corpus.features,
                float(self.spec.selector.max_similarity),
                capacity=self.capacity,
            )
        else:
            self.cap.rebind(corpus.features)
        new = self.cap.walk(order, len(self.cap) + want)
        self.kept[g.gid] = np.concatenate([before, new])
        own = np.flatnonzero(table.column("selected").to_numpy(zero_copy_only=False))
        self.tables[g.gid] = (ids, rank, table.column("logit").to_numpy(), own)
        return len(new)


def cap_across_groups(
    groups: list[Group],
    spec: SelectSpec,
    dirs: WorkDir,
    *,
    progress: bool = False,
) -> dict[str, Any]:
    """Resolve near-duplicates between groups; rewrite the parts that change.

    Returns
    -------
    dict
        ``threshold``, ``replaced`` (documents swapped for a compatible one in all),
        ``groups_changed``, ``max_pair_similarity`` (exact, whole selection), ``seconds``
        and ``per_group`` (gid -> replaced and kept, for groups that changed).
    """
    started = time.perf_counter()
    threshold = float(spec.selector.max_similarity)
    k_total = sum(g.k for g in groups)
    state = _Pass(spec, dirs, k_total)
    short = 0
    for g in tqdm(groups, desc="cap across groups", unit="group", disable=not progress):
        if g.k + short:
            short = g.k + short - state.walk(g, g.k + short)
    for g in groups:  # a shortfall left: sweep every group's ranking again, in order
        if short == 0:
            break
        short -= state.walk(g, short)
    if short:
        raise ValueError(
            infeasible_message(
                threshold,
                len(state.cap or ()),
                k_total,
                sum(g.n for g in groups),
                "every group's ranking",
            )
        )
    replaced, per_group = 0, {}
    for g in groups:
        kept = state.kept.get(g.gid, np.zeros(0, dtype=np.int64))
        if g.gid not in state.tables:
            continue
        ids, rank, logits, own = state.tables[g.gid]  # own: the group's own (capped) choice
        swapped = len(np.setdiff1d(own, kept))
        if swapped == 0 and len(kept) == g.k:
            continue
        replaced += swapped
        per_group[str(g.gid)] = {"replaced": swapped, "k": int(len(kept))}
        keep = kept[np.argsort(rank[kept], kind="stable")]
        with recording([dirs.part(g.gid)]) as book:
            atomic_write_table(
                pa.table(
                    {
                        spec.columns.id_col: ids.take(pa.array(keep)),
                        "group": pa.array(np.full(len(keep), g.gid, dtype=np.int32)),
                        "rank": pa.array(rank[keep]),
                        "logit": pa.array(logits[keep]),
                    }
                ),
                dirs.part(g.gid),
            )
        amend(dirs.completion(g.gid), book)  # the group's marker: its part as now
    cap = state.cap
    top = verify_cap(cap.kept_features(), None, threshold) if cap is not None else -np.inf
    return {
        "threshold": threshold,
        "replaced": replaced,
        "groups_changed": len(per_group),
        "max_pair_similarity": float(top),
        "seconds": time.perf_counter() - started,
        "per_group": per_group,
    }
