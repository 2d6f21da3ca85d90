"""One budget across groups by equal marginal gains: the global budget without a central round.

Quality is a mean over the ``k`` kept documents and facility location a mean over the ``N``
documents, so when each document's neighbours sit in its own group, ``J`` over the corpus
is a sum of the groups' shares::

    J(S) = sum_g [ lamb * sum_{j in S_g} q_j / k  +  (1 - lamb) * sum_{i in g} cover(i, S_g) / N ]

A group cannot see ``k`` and ``N`` of the others' choices, but it can price its own:

1. **Propose.** Group ``g`` (``n_g`` rows) selects ``c_g = ceil(oversample * k * n_g / N)``
   candidates with its method and the objective at the *global exchange rate* between
   quality and coverage (:func:`group_lamb`), then orders them by lazy greedy on its graph,
   coverage counted over every document of the group
   (:func:`datamask.greedy.lazy.gain_order`), and writes their marginal gains in ``J``
   units (:func:`gains_in_j_units`): a non-increasing curve of ``c_g`` numbers.
2. **Allocate.** One threshold, the ``k``-th largest gain over every group (ties: the lower
   group, then the earlier pick), gives group ``g`` the ``m_g`` gains above it
   (:func:`allocate`): the allocation that equalises marginal gains, i.e. one Lagrange
   price of the budget shared by every group; optimal for concave gain curves.
3. **Write.** Each group keeps the first ``m_g`` rows of its order.

Only ``c_g`` numbers per group cross groups; no process holds another group's rows. The
partition must be semantic and the objective quality plus per-document terms
(:attr:`Term.per_document`); other partitions and objectives (pairwise similarity, DiSF,
user terms that do not declare it) keep the central round over the union of the
candidates (:func:`allocates_by_gains`).
"""

from __future__ import annotations

import sys
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import pyarrow as pa

from ..._memory import peak_rss_mb
from ...config import SelectSpec
from ...io.atomic import atomic_write_json
from ...io.parquet import atomic_write_table, read_table
from ..engine import Step
from ..lifecycle import read_marker
from ..paths import WorkDir
from .gains import gain_knots

__all__ = [
    "allocate",
    "allocate_counts",
    "ask_for_more",
    "compact_marker",
    "finish_allocation",
    "knots_of",
    "read_gains",
    "reused_allocation",
    "saturated",
    "wanted",
    "AllocatedJob",
    "WriteAllocated",
]


#: Gains near the threshold read at once; more, and the knots are refined first.
WINDOW_MAX = 1 << 20


class _Knots:
    """Every group's knots in flat arrays: bounds on how many of its gains pass a value."""

    def __init__(self, knots: list[tuple[np.ndarray, np.ndarray]], lo: np.ndarray, hi: np.ndarray):
        sizes = np.asarray([len(p) for p, _ in knots], dtype=np.int64)
        self.starts = np.concatenate([[0], np.cumsum(sizes)[:-1]]).astype(np.int64)
        self.sizes = sizes
        self.pos = np.concatenate([p for p, _ in knots] or [np.zeros(0, np.int64)])
        self.val = np.concatenate([v for _, v in knots] or [np.zeros(0)])
        self.group = np.repeat(np.arange(len(knots)), sizes)
        self.lo, self.hi = lo, hi

    def ends(self, v: float, strict: bool) -> tuple[np.ndarray, np.ndarray]:
        """Per group, bounds on the end of its prefix of gains ``> v`` (``>= v``)."""
        passed = self.val > v if strict else self.val >= v
        j = np.bincount(self.group[passed], minlength=len(self.sizes))  # knots passed, a prefix
        if not len(self.pos):
            return self.lo.copy(), self.hi.copy()
        last = self.pos[np.clip(self.starts + j - 1, 0, len(self.pos) - 1)]
        first_failed = self.pos[np.clip(self.starts + j, 0, len(self.pos) - 1)]
        return np.where(j > 0, last + 1, self.lo), np.where(j < self.sizes, first_failed, self.hi)

    def bounds(self, v: float, strict: bool) -> tuple[int, int]:
        """Lower and upper bound of the gains ``> v`` (``>= v``) over every group."""
        lower, upper = self.ends(v, strict)
        return int(lower.sum()), int(upper.sum())

    def bracket(self, k: int) -> tuple[float, float]:
        """``(a, b)``: every gain above ``a`` is among the ``k`` largest, none below ``b``."""
        values = np.unique(self.val)  # ascending
        # a: the smallest knot value with at most k gains strictly above it (upper bound)
        lo_i, hi_i = 0, len(values) - 1
        while lo_i < hi_i:
            mid = (lo_i + hi_i) // 2
            if self.bounds(values[mid], strict=True)[1] <= k:
                hi_i = mid
            else:
                lo_i = mid + 1
        a = float(values[lo_i])
        # b: the largest knot value with at least k gains at or above it (lower bound)
        lo_i, hi_i = 0, len(values) - 1
        while lo_i < hi_i:
            mid = (lo_i + hi_i + 1) // 2
            if self.bounds(values[mid], strict=False)[0] >= k:
                lo_i = mid
            else:
                hi_i = mid - 1
        return a, float(values[lo_i])


def allocate_counts(
    knots: list[tuple[np.ndarray, np.ndarray]],
    sizes: list[int] | np.ndarray,
    read: Any,
    k_total: int,
    *,
    window_max: int = WINDOW_MAX,
) -> np.ndarray:
    """How many of each group's ordered candidates to keep: the ``k_total`` largest gains
    over all groups (ties: the lower group, then the earlier pick), without holding them.

    Every group's gains are non-increasing (:func:`monotone`), so group ``g`` keeps a prefix
    and the question is where each prefix ends. Every group is known to keep its rows
    before ``lo[g]`` and to drop those from ``hi[g]`` (at first ``0`` and its size):

    1. **Bracket.** From the knots (:func:`gain_knots`, ``O(groups x KNOTS)`` numbers), the
       values ``a >= b`` such that at most ``k`` gains exceed ``a`` and at least ``k`` reach
       ``b``: every gain above ``a`` is kept, every gain below ``b`` dropped.
    2. **Narrow.** One pass over the groups reads each one's undecided gains
       (``read(g, lo, hi)``, one group at a time) and moves ``lo`` past its gains above
       ``a`` and ``hi`` to the end of those at or above ``b``.
    3. **Decide.** When the gains left between ``lo`` and ``hi`` number at most
       ``window_max``, the largest of them fill the budget exactly; otherwise they give
       finer knots and step 1 repeats on them.

    Memory: the knots and at most ``window_max`` gains, whatever the number of groups and
    candidates; :func:`allocate` is the same on curves in memory.
    """
    sizes = np.asarray(sizes, dtype=np.int64)
    if not 0 <= k_total <= int(sizes.sum()):
        raise ValueError(
            f"k_total must be in [0, {int(sizes.sum())}] (the candidates); got {k_total}."
        )
    lo = np.zeros(len(sizes), dtype=np.int64)
    hi = sizes.copy()
    for _ in range(64):
        if int(lo.sum()) == k_total:
            return lo
        if int(hi.sum()) == k_total:
            return hi
        # 1. Bracket the threshold from the knots of the undecided ranges.
        bounds = _Knots(knots, lo, hi)
        a, b = bounds.bracket(k_total)
        # 2. Narrow every range to its gains in [b, a], reading only where the knots leave
        #    it open; keep them if they are few.
        known_above, _ = bounds.ends(a, strict=True)  # the knots say: > a up to here
        _, known_below = bounds.ends(b, strict=False)  # ... and < b from here
        window: list[tuple[int, np.ndarray]] = []
        n_window = 0
        finer = []
        for g in np.flatnonzero(hi > lo):
            start, stop = int(known_above[g]), max(int(known_above[g]), int(known_below[g]))
            gains = np.asarray(read(int(g), start, stop) if stop > start else [], np.float64)
            above = int(np.searchsorted(-gains, -a, side="left"))  # gains > a
            reach = max(above, int(np.searchsorted(-gains, -b, side="right")))  # gains >= b
            lo[g], hi[g] = start + above, start + reach
            rest = gains[above:reach]
            n_window += len(rest)
            if n_window <= window_max:
                window.append((int(g), rest))
            finer.append((int(g), gain_knots(rest, int(lo[g]))))
        if int(lo.sum()) == k_total:
            return lo
        if a == b:  # one value left: ties go to the lower group, then the earlier pick
            return _fill_in_group_order(lo, hi, k_total - int(lo.sum()))
        if n_window <= window_max:  # 3. Decide among the few gains left.
            return _take_largest(lo, window, k_total - int(lo.sum()))
        knots = [(np.zeros(0, np.int64), np.zeros(0)) for _ in sizes]
        for g, kn in finer:
            knots[g] = kn
    raise RuntimeError("the allocation did not converge; please report this.")


def _fill_in_group_order(lo: np.ndarray, hi: np.ndarray, need: int) -> np.ndarray:
    """Extend the prefixes ``lo`` (in place, returned) by ``need`` rows of the undecided
    ranges ``[lo, hi)``, the lower group first: all the gains left there are equal."""
    for g in np.flatnonzero(hi > lo):
        take = min(need, int(hi[g] - lo[g]))
        lo[g] += take
        need -= take
    return lo


def _take_largest(lo: np.ndarray, window: list[tuple[int, np.ndarray]], need: int) -> np.ndarray:
    """Extend the prefixes ``lo`` (in place, returned) by the ``need`` largest gains of
    ``window`` (each undecided group's gains, in order); ties: the lower group, then the
    earlier pick."""
    values = np.concatenate([w for _, w in window] or [np.zeros(0)])
    group = np.concatenate([np.full(len(w), g) for g, w in window] or [np.zeros(0, int)])
    order = np.concatenate([np.arange(len(w)) for _, w in window] or [np.zeros(0, int)])
    chosen = np.lexsort((order, group, -values))[:need]
    lo += np.bincount(group[chosen], minlength=len(lo)).astype(np.int64)
    return lo


def read_gains(path: str | Path, lo: int, hi: int) -> np.ndarray:
    """Gains ``lo:hi`` of a group's priced candidates (the ``gain`` column of its
    :func:`~.gains.gain_table`): what :func:`allocate_counts` reads near the threshold."""
    return read_table(path, columns=["gain"]).column(0).to_numpy()[lo:hi]


def allocate(gains: list[np.ndarray], k_total: int, **kwargs: Any) -> np.ndarray:
    """:func:`allocate_counts` on curves held in memory (non-increasing each).

    Examples
    --------
    >>> allocate([np.array([0.5, 0.2, 0.1]), np.array([0.4, 0.3])], 3).tolist()
    [1, 2]
    """
    curves = [np.asarray(g, dtype=np.float64) for g in gains]
    knots = [gain_knots(c) for c in curves]
    return allocate_counts(
        knots, [len(c) for c in curves], lambda g, lo, hi: curves[g][lo:hi], k_total, **kwargs
    )


# --- the allocation phase of a sharded run ---------------------------------------------------
def compact_marker(stats: dict[str, Any]) -> dict[str, Any]:
    """A group's marker as the driver holds it: its keys (and nested dicts' keys) and
    its string values interned, so G markers share one copy of each name, ``"cpu"`` and
    the host, not one per group (unpickled or parsed, each marker brings its own: about
    1 KB a group); a proposing group's knots and centroid as arrays (float32 centroid),
    not JSON's Python floats (at 10^5 groups of 384-d the lists alone would take over
    1 GB; the arrays take 170 MB). Returns the compacted dict (same keys, same order)."""
    if "gain_knots" in stats:
        pos, val = stats["gain_knots"]
        stats["gain_knots"] = (np.asarray(pos, dtype=np.int64), np.asarray(val, dtype=np.float64))
    if stats.get("centroid") is not None:
        stats["centroid"] = np.asarray(stats["centroid"], dtype=np.float32)
    return _interned(stats)


def _interned(value: Any) -> Any:
    """``value`` with the keys of its dicts and its strings (in dicts and lists) interned."""
    if isinstance(value, str):
        return sys.intern(value)
    if isinstance(value, dict):
        return {sys.intern(k) if isinstance(k, str) else k: _interned(v) for k, v in value.items()}
    if isinstance(value, list):
        return [_interned(v) for v in value]
    return value


def knots_of(stats: dict[str, Any]) -> tuple[np.ndarray, np.ndarray]:
    """The knots a proposing group left in its completion marker (and drops them there)."""
    pos, val = stats.pop("gain_knots")
    return np.asarray(pos, dtype=np.int64), np.asarray(val, dtype=np.float64)


def wanted(dirs: WorkDir, gid: int, default: int) -> int:
    """The candidates group ``gid`` proposes: ``default`` unless an extension says more."""
    done = read_marker(dirs.want(gid))
    return int(done["candidates"]) if done and "candidates" in done else default  # not tokens


def ask_for_more(dirs: WorkDir, gid: int, candidates: int) -> None:
    """Record that group ``gid`` must propose ``candidates`` (read back by :func:`wanted`)."""
    atomic_write_json({"candidates": candidates}, dirs.want(gid))


def saturated(counts: np.ndarray, proposed: list[int], sizes: list[int]) -> list[int]:
    """Groups whose every candidate is kept though they have rows left: their curve may go
    on above the threshold, so they propose again, twice as many (the allocation is only
    exact once no group is cut off by its own candidate count)."""
    return [
        g for g, (m, c, n) in enumerate(zip(counts, proposed, sizes, strict=True)) if 0 < c == m < n
    ]


@dataclass(frozen=True, slots=True)
class AllocatedJob:
    """One group's allocated part: its first ``m`` candidates, read from ``candidates``
    (its candidates or its exchanged ones), written to ``part``; and the candidates at
    positions ``filled`` after them (a token budget's fill,
    :func:`~..select.tokens.allocate_tokens`)."""

    gid: int
    m: int
    spec: SelectSpec
    part: str
    candidates: str
    filled: tuple[int, ...] = ()


class WriteAllocated(Step[AllocatedJob]):
    """Step 3 for one group: its first ``m`` candidates in pick order as its selected part
    (id, group, rank within the group, logit, gain in J units). Idempotent: no marker
    (round 2's marker covers the parts)."""

    name = "write"

    def size(self, job: AllocatedJob) -> int:
        return job.m

    def run(self, job: AllocatedJob) -> dict[str, Any]:
        table = read_table(job.candidates)
        if job.filled:
            table = pa.concat_tables([table.slice(0, int(job.m)), table.take(list(job.filled))])
        else:
            table = table.slice(0, int(job.m))
        id_col = job.spec.columns.id_col
        columns = [id_col, "group", "rank", "logit", "gain"]
        atomic_write_table(pa.table({c: table.column(c) for c in columns}), job.part)
        gains = table.column("gain").to_numpy()
        return {
            "gid": job.gid,
            "kept": table.num_rows,
            "gain_sum": float(gains.sum()),
            "last_gain": float(gains[-1]) if table.num_rows else None,
            "peak_rss_mb": peak_rss_mb(),
        }


def reused_allocation(dirs: WorkDir, groups: Sequence[Any]) -> dict[str, Any] | None:
    """The allocation's marker (``WORK/completions/global``, :func:`finish_allocation`)
    when it and every group's part are there (one listing of ``selected/``), else None: a
    part deleted since is written again from the same files, not skipped by a marker that
    no longer describes the output (its ids were then missing from the keep lists)."""
    done = read_marker(dirs.global_marker())
    if done is None:
        return None
    there = {p.name for p in dirs.selected().glob("part-*.parquet")}
    if all(dirs.part(g.gid).name in there for g in groups):
        return done
    dirs.global_marker().unlink(missing_ok=True)
    return None


def finish_allocation(
    dirs: WorkDir,
    counts: np.ndarray,
    written: list[dict[str, Any]],
    n_candidates: int,
    rounds: int,
    seconds: dict[str, float],
    extra: dict[str, Any] | None = None,
) -> dict[str, Any]:
    """The allocation's stats (and ``extra``: a token budget's), written as the marker
    ``WORK/completions/global`` last."""
    last = [w["last_gain"] for w in written if w["last_gain"] is not None]
    stats = {
        "mode": "allocate",
        "n_candidates": int(n_candidates),
        "k": int(counts.sum()),
        "threshold": min(last) if last else None,
        "rounds": rounds,
        "kept_per_group": counts.tolist(),
        # J of the selection as the groups priced it: every document covered within its
        # own group, on the graph; the exact J over the corpus is what `evaluate` computes.
        "terms": {"J_groups": float(sum(w["gain_sum"] for w in written))},
        "seconds": seconds,
        "peak_rss_mb": peak_rss_mb(),
        "peak_rss_mb_write": max((w["peak_rss_mb"] or 0) for w in written) if written else None,
        **(extra or {}),
    }
    atomic_write_json(stats, dirs.global_marker())
    return stats
