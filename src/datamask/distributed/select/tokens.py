"""Token budgets on a sharded run (issue 46): keep documents whose lengths sum to at most
``T`` and to within the longest document of it, over groups that never see each other.

1. **Count.** The check pass reads every shard's length column with its other columns
   (:mod:`..check.validate`; texts: their characters, :func:`~datamask.io.text.lengths_from_arrow`),
   refuses a length that is not > 0 naming the shard and row, and returns three numbers:
   its tokens, its longest and shortest document. The driver adds them up: the corpus'
   tokens resolve ``--select-token-ratio``, before the work dir is claimed.
2. **Select.** How the groups' results become one selection of ``T`` tokens follows the
   document budget (:func:`token_combine`):

   - **By gains per token** where the document budget allocates by gains
     (:func:`~..combine.gains.allocates_by_gains`: a semantic partition, per-document terms, a
     method that is not modular). Group ``g`` (``L_g`` tokens) selects ``T_c = oversample x T
     L_g / L`` tokens with its method at the corpus' rate between quality and coverage
     (:func:`~datamask.objectives.combined.group_lamb` of ``(T_c, L_g)`` against ``(T, L)``:
     quality counts ``l q / T``, coverage ``l cover / L``), then orders them by the
     cost-benefit lazy greedy on its graph (gain per token,
     :func:`~datamask.greedy.lazy.gain_order` with sizes) and writes each one's gain in ``J``
     units, its length and its **price**, gain per token (non-increasing). One price over every
     group keeps each group's candidates above it, walked best price first (ties: the group,
     then its order) until the next one does not fit ``T``; the walk goes on where a group's
     next candidate still fits, a group stopping at its first that does not
     (:func:`allocate_tokens`): every group keeps a prefix, and the kept tokens end within one
     document of ``T``. A group whose every candidate is kept, with rows left, proposes again
     with twice its tokens (its curve may go on above the price), until none is cut off. Only
     prices and lengths cross groups (16 bytes a candidate, on the driver), no embedding.
   - **Central round** for the other non-modular runs (a partition by chunk or shard, a
     term that is not per document, a similarity cap): every group proposes ``oversample``
     times its share of the tokens and **one central round** keeps ``T`` tokens of the
     union (:class:`~.steps.SelectGlobal` with ``budget_tokens=T``), as the document
     budget's central round does (GreeDi).
3. **Fill** (modular methods, or one group: no central round). Each group keeps its
   share ``T_g`` and offers its best unkept rows by quality per token, as many as make
   up its unspent tokens plus the corpus' longest document
   (``WORK/tokens/offer-NNNNN.parquet``); one step walks every group's offers, best
   quality first (ties: group, then the group's order), into the tokens the groups left
   unspent, keeping each that fits, then writes every group's part. Each group left less
   than its shortest unkept row and offers more than its unspent tokens, so the walk ends
   on a row that does not fit: the kept tokens are within the longest document of ``T``.

Besides the prices, only numbers cross groups on the driver (tokens per shard and per
group); the offers are read by the fill step, a few rows per group.
"""

from __future__ import annotations

import time
from collections.abc import Sequence
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq

from ...budget import TOKEN_FLAGS, budget_total, check_lengths, length_column
from ...config import SelectSpec
from ...data import Corpus, Selection
from ...io.atomic import atomic_write_json
from ...io.fs import open_input
from ...io.parquet import atomic_write_table, read_table
from ...io.shards import ShardScan
from ...io.text import lengths_from_arrow
from ...pipeline.step import MODULAR, fit_group, gain_curve
from ...pipeline.writer import selection_table
from ..combine.gains import (
    allocates_by_gains,
    gain_table,
    gains_in_j_units,
    group_spec,
    with_prices,
)
from ..engine import Step, run_steps
from ..executors import Runner
from ..lifecycle import read_marker
from ..paths import WorkDir
from .graphs import keep_graph

__all__ = [
    "FillSlack",
    "TokenPlan",
    "allocate_tokens",
    "ask_for_tokens",
    "check_token_settings",
    "count_tokens",
    "shard_tokens",
    "fill_round",
    "group_token_budget",
    "select_tokens",
    "token_combine",
    "token_settings",
    "wanted_tokens",
    "write_priced",
    "write_offers",
]


def check_token_settings(spec: SelectSpec) -> None:
    """Refuse what shards do not take with a token budget, before anything is written: the
    similarity cap with a modular method (each group's share and the fill would keep
    pairs across groups and the fill's rows unchecked)."""
    sel = spec.selector
    if sel.token_budget and sel.max_similarity is not None and sel.method in MODULAR:
        raise ValueError(
            f"--max-similarity with a token budget ({TOKEN_FLAGS}) on shards needs a method "
            f"that is not modular; got method={sel.method!r}. Use greedy or mask, select "
            "one file, or give a document budget (--select-ratio, --k)."
        )


def token_settings(spec: SelectSpec, files: list[Any]) -> SelectSpec:
    """``spec`` with its length column resolved from the first shard's columns (the named
    one, else the first of :data:`~datamask.budget.LENGTH_COLUMNS`); unchanged without a
    token budget. Every shard must hold it (the footers' check reads it)."""
    if not spec.selector.token_budget or not files:
        return spec
    with open_input(files[0]) as fh:
        names = list(pq.ParquetFile(fh).schema_arrow.names)
    column = length_column(names, spec.selector.length_col, str(files[0]))
    return replace(spec, selector=replace(spec.selector, length_col=column))


@dataclass(frozen=True, slots=True)
class TokenPlan:
    """The budget of a sharded token run: ``total`` tokens to keep of the corpus'
    ``corpus``; ``longest``: its longest document (the offers' margin)."""

    total: float
    corpus: float
    longest: float
    length_col: str

    def summary(self, kept: float) -> dict[str, Any]:
        """The manifest's ``tokens`` block, as the one-file summary's."""
        return {
            "kept": float(kept),
            "budget": self.total,
            "corpus": self.corpus,
            "length_col": self.length_col,
        }


def shard_tokens(column: Any, length_col: str, path: str) -> dict[str, float]:
    """Step 1 for one shard, on its length column as the check pass read it
    (:func:`~..check.validate.scan_step`): its tokens, longest and shortest document; a length
    that is not > 0 is refused naming the shard and row."""
    lengths = check_lengths(lengths_from_arrow(column, length_col, path), path)
    return {
        "tokens": float(lengths.sum()),
        "longest": float(lengths.max()),
        "shortest": float(lengths.min()),
    }


def count_tokens(spec: SelectSpec, scans: Sequence[ShardScan]) -> TokenPlan:
    """Step 1: the corpus' tokens from every shard's three numbers (the check pass's
    scans, :func:`shard_tokens`), and the budget ``T`` (``--budget-tokens``, or
    ``--select-token-ratio`` of the corpus' tokens), refused as
    :func:`~datamask.budget.resolve_token_budget` refuses it."""
    sel, column = spec.selector, spec.selector.length_col
    assert column is not None  # token_settings resolved it
    stats = [sc.tokens for sc in scans if sc.tokens is not None]
    corpus = float(sum(s["tokens"] for s in stats))
    shortest = min(s["shortest"] for s in stats)
    where = "the input shards"
    total = budget_total(sel.budget_tokens, sel.select_token_ratio, corpus, shortest, where)
    return TokenPlan(total, corpus, max(s["longest"] for s in stats), column)


def group_token_budget(plan: TokenPlan, lengths: np.ndarray) -> float:
    """Step 2: a group's share of the budget, proportional to its tokens."""
    return plan.total * float(lengths.sum()) / plan.corpus


def token_combine(spec: SelectSpec, n_groups: int) -> str:
    """How a token run combines its groups: ``"gains"`` (the allocation by gains per token,
    where the document budget allocates by gains), ``"central"`` (one central round: the
    other methods that are not modular, and every one with a similarity cap, which the
    central round keeps over every pair) or ``"group"`` (each group's share and the fill:
    modular methods, or one group)."""
    if spec.selector.method in MODULAR:
        return "group"
    if spec.selector.max_similarity is not None:  # every kept pair in one round
        return "central"
    if n_groups <= 1:
        return "group"
    return "gains" if allocates_by_gains(spec) else "central"


def wanted_tokens(dirs: WorkDir, gid: int) -> float | None:
    """The tokens group ``gid`` proposes when the allocation asked it for more (else None:
    ``oversample`` times its share)."""
    done = read_marker(dirs.want(gid))
    return float(done["tokens"]) if done and "tokens" in done else None


def ask_for_tokens(dirs: WorkDir, gid: int, tokens: float) -> None:
    """Record that group ``gid`` must propose ``tokens`` (read back by :func:`wanted_tokens`)."""
    atomic_write_json({"tokens": float(tokens)}, dirs.want(gid))


def allocate_tokens(
    prices: list[np.ndarray], lengths: list[np.ndarray], total: float
) -> tuple[np.ndarray, list[np.ndarray], float]:
    """Which of each group's ordered candidates to keep under ``total`` tokens, by one
    price (gain per token) over every group. Returns each group's kept prefix (a count),
    each group's candidates kept by the fill after it (positions), and the tokens kept.

    Every group's prices are non-increasing (:func:`~..combine.gains.monotone`), so the price
    keeps a prefix of each group. The candidates are walked by price, best first (ties:
    the lower group, then the earlier pick), and kept while they fit: the price of the
    first that does not is the threshold, and the tokens left are less than its length.
    The walk then goes on past it (the fill): every candidate that still fits is kept, in
    price order (J is monotone: a fill never lowers it), until no candidate left fits.

    Examples
    --------
    >>> prices = [np.array([3.0, 1.0]), np.array([2.0, 0.5, 0.2])]
    >>> sizes = [np.array([4.0, 4.0]), np.array([5.0, 3.0, 1.0])]
    >>> counts, filled, kept = allocate_tokens(prices, sizes, 10)
    >>> counts.tolist(), [f.tolist() for f in filled], kept
    ([1, 1], [[], [2]], 10.0)
    """
    price = np.concatenate([np.asarray(p, np.float64) for p in prices] or [np.zeros(0)])
    size = np.concatenate([np.asarray(x, np.float64) for x in lengths] or [np.zeros(0)])
    group = np.concatenate([np.full(len(p), g) for g, p in enumerate(prices)] or [np.zeros(0, int)])
    place = np.concatenate([np.arange(len(p)) for p in prices] or [np.zeros(0, int)])
    order = np.lexsort((place, group, -price))
    reach = np.cumsum(size[order])
    stop = int(np.searchsorted(reach, total, side="right"))  # the threshold's walk
    counts = np.bincount(group[order[:stop]], minlength=len(prices)).astype(np.int64)
    left = total - (float(reach[stop - 1]) if stop else 0.0)
    rest = order[stop:]
    rest = rest[size[rest] <= left]  # what may still fit, in price order
    taken = []
    while len(rest) and left >= size[rest].min():
        row = int(rest[0])
        taken.append(row)
        left -= size[row]
        rest = rest[1:][size[rest[1:]] <= left]
    taken_rows = np.asarray(taken, dtype=np.int64)
    filled = [np.sort(place[taken_rows[group[taken_rows] == g]]) for g in range(len(prices))]
    return counts, filled, float(total - left)


def write_offers(
    sel: Selection, corpus: Corpus, ids: pa.Array, plan: TokenPlan, left: float, path: Path
) -> None:
    """Step 2's offers: the group's unkept rows by quality per token, best first (ties by
    row), as many as hold ``left + plan.longest`` tokens (or all)."""
    lengths = np.asarray(corpus.lengths, dtype=np.float64)
    quality = corpus.normalized_quality()
    unkept = np.setdiff1d(np.arange(corpus.n_docs), sel.selected)
    order = unkept[np.lexsort((unkept, -quality[unkept]))]
    reach = np.cumsum(lengths[order])
    n_offer = int(min(len(order), np.searchsorted(reach, left + plan.longest) + 1))
    rows = order[:n_offer]
    table = pa.table(
        {
            "id": ids.take(pa.array(rows)),
            "length": pa.array(lengths[rows]),
            "quality": pa.array(quality[rows]),
        }
    )
    atomic_write_table(table, path)


@dataclass(frozen=True, slots=True)
class FillJob:
    """Step 3: every group's kept rows and offers, and the tokens they left unspent."""

    gids: tuple[int, ...]
    dirs: WorkDir
    id_col: str
    slack: float


class FillSlack(Step[FillJob]):
    """Step 3: fill the tokens the groups left unspent from their offers, then write every
    group's part (``OUT/selected/part-NNNNN.parquet``); the marker last."""

    name = "fill the token budget"
    unit = "round"

    def marker(self, job: FillJob) -> Path:
        return job.dirs.tokens_fill_marker()

    def outputs(self, job: FillJob) -> tuple[Path, ...]:
        return tuple(job.dirs.part(g) for g in job.gids)

    def accepts(self, job: FillJob, done: dict[str, Any]) -> bool:
        return done.get("slack") == job.slack

    def run(self, job: FillJob) -> dict[str, Any]:
        offers = [read_table(job.dirs.offer(g)) for g in job.gids]
        quality = np.concatenate([t.column("quality").to_numpy() for t in offers])
        lengths = np.concatenate([t.column("length").to_numpy() for t in offers])
        owner = np.concatenate([np.full(t.num_rows, i) for i, t in enumerate(offers)])
        place = np.concatenate([np.arange(t.num_rows) for t in offers])
        left, taken = job.slack, np.zeros(len(lengths), dtype=bool)
        for row in np.lexsort((place, owner, -quality)).tolist():
            if lengths[row] <= left:
                taken[row], left = True, left - lengths[row]
        counts, filled_tokens = {}, float(lengths[taken].sum())
        for i, gid in enumerate(job.gids):
            own = read_table(job.dirs.candidates(gid))
            mine = taken[owner == i]
            extra = offers[i].filter(pa.array(mine))
            counts[str(gid)] = own.num_rows + extra.num_rows
            atomic_write_table(_with_filled(own, extra, gid, job.id_col), job.dirs.part(gid))
        return {
            "slack": job.slack,
            "filled": int(taken.sum()),
            "filled_tokens": filled_tokens,
            "left": float(left),
            "k_by_group": counts,
        }


def _with_filled(own: pa.Table, extra: pa.Table, gid: int, id_col: str) -> pa.Table:
    """A group's part: its kept rows, then its filled rows ranked after them (their logit:
    NaN, no method scored them against the kept ones)."""
    if extra.num_rows == 0:
        return own
    n = own.num_rows
    columns: dict[str, pa.Array] = {}
    for field in own.schema:
        if field.name == id_col:
            columns[field.name] = extra.column("id").cast(field.type)
        elif field.name == "group":
            columns[field.name] = pa.array(np.full(extra.num_rows, gid)).cast(field.type)
        elif field.name == "rank":
            columns[field.name] = pa.array(np.arange(n, n + extra.num_rows)).cast(field.type)
        else:
            columns[field.name] = pa.nulls(extra.num_rows, field.type)
    added = pa.table(columns, schema=own.schema)
    return pa.concat_tables([own, added])


def fill_round(
    runner: Runner, gids: list[int], dirs: WorkDir, id_col: str, slack: float
) -> dict[str, Any]:
    """Step 3 through the engine (reused when its marker holds the same slack)."""
    job = FillJob(tuple(gids), dirs, id_col, float(slack))
    (stats,) = run_steps(runner, FillSlack(), [job], progress=False)
    return stats


def select_tokens(
    job: Any,
    corpus: Corpus,
    ids: pa.Array,
    started: float,
    read_s: float,
    group_stats: Any,
    propose: Any = None,
) -> dict[str, Any]:
    """A group under a token budget (:mod:`.tokens`): its proportional share ``T_g`` of
    the budget, its kept rows to ``WORK/candidates/`` (the fill step writes the part) and
    its offers for the fill. With ``propose`` (a callable writing the candidates of the
    central round): ``oversample`` times its share, and no offers. Proposing with
    ``job.totals`` (the ``(T, L)`` of the rate): priced candidates for the allocation by
    gains per token (:func:`write_priced`), ``oversample`` times its share or what the
    allocation asked for (:func:`wanted_tokens`)."""
    group, spec, plan = job.group, job.spec, job.tokens
    assert plan is not None  # a token budget
    lengths = np.asarray([] if corpus.lengths is None else corpus.lengths, np.float64)
    by_gains = job.propose and job.totals is not None
    want = wanted_tokens(job.dirs, group.gid) if by_gains else None
    budget = group_token_budget(plan, lengths) if corpus.n_docs else 0.0
    if propose is not None or by_gains:
        budget = want if want is not None else budget * spec.partition.oversample
    fit_spec = replace(
        spec, selector=replace(spec.selector, budget_tokens=budget, select_token_ratio=None)
    )
    rate = job.totals if by_gains else (job.rate if corpus.floor is not None else None)
    if rate is not None and corpus.n_docs:  # T_c tokens of L_g against T of L (KEPT's too)
        fit_spec = group_spec(fit_spec, budget, float(lengths.sum()), *rate)
    if corpus.n_docs == 0 or budget < lengths.min():  # its share keeps none of its rows
        k: int | None = 0
    elif budget >= lengths.sum():  # proposing every row
        k = corpus.n_docs
    else:  # stored ids not passed: modular methods walk their ranking under the budget too
        k = None
    sel, objective = fit_group(corpus, k, fit_spec, seed=group.seed, evaluate=False)
    if by_gains:
        gain_curve(corpus, sel, objective, fit_spec, group.seed)
    keep_graph(job, corpus, objective)
    del objective
    fit_s = time.perf_counter() - started - read_s
    id_col = spec.columns.id_col
    if not spec.run.selected_only:
        atomic_write_table(
            selection_table(sel, id_col=id_col, stored_ids=ids, group=group.gid, probability=True),
            job.dirs.group_rows(group.gid),
        )
    kept = float(lengths[sel.selected].sum()) if corpus.n_docs else 0.0
    centroid = None
    if by_gains:
        write_priced(sel, corpus, ids, job, fit_spec.objective.lamb, budget)
        centroid = corpus.features.mean(0).tolist() if corpus.n_docs else None
    elif propose is not None:  # the central round's candidates; no offers
        propose(sel)
    else:
        table = selection_table(sel, id_col=id_col, stored_ids=ids, group=group.gid, kept_only=True)
        atomic_write_table(table, job.dirs.candidates(group.gid))
        write_offers(sel, corpus, ids, plan, budget - kept, job.dirs.offer(group.gid))
    stats = group_stats(group, sel, corpus.n_docs, started, read_s, fit_s)
    stats.update(
        token_plan=[plan.total, plan.corpus],
        tokens={"group": float(lengths.sum()), "budget": budget, "kept": kept, "wanted": want},
    )
    if centroid is not None:  # where the exchange round looks (unit rows: checked)
        stats["centroid"] = centroid
    return stats


def write_priced(
    sel: Selection, corpus: Corpus, ids: pa.Array, job: Any, lamb_g: float, budget: float
) -> None:
    """A group's candidates for the allocation by gains per token, in cost-benefit order
    (``sel.meta["gain_order"]``): :func:`~..combine.gains.gain_table`'s columns (gains in ``J``
    units of the rate ``job.totals``) with each one's ``length`` and ``price``, its gain
    per token made non-increasing (:func:`~..combine.gains.monotone`)."""
    order, gains = sel.meta["gain_order"]
    lengths = np.asarray(corpus.lengths, dtype=np.float64)
    group, spec = job.group, job.spec
    if len(order):
        lamb = spec.objective.lamb
        gains = gains_in_j_units(gains, lamb, lamb_g, budget, float(lengths.sum()), *job.totals)
    logits = sel.logits if sel.logits is not None else sel.scores
    table = gain_table(ids, order, group.gid, logits, gains, corpus.features, spec.columns.id_col)
    atomic_write_table(with_prices(table, gains, lengths[order]), job.dirs.candidates(group.gid))
