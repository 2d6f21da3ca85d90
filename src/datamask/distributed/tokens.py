"""Token budgets on a sharded run (issue 46): keep documents whose lengths sum to at most
``T`` and to within the longest document of it, over groups that never see each other.

1. **Count.** The check pass reads every shard's length column with its other columns
   (:mod:`.validate`; texts: their characters, :func:`~datamask.io.text.lengths_from_arrow`),
   refuses a length that is not > 0 naming the shard and row, and returns three numbers:
   its tokens, its longest and shortest document. The driver adds them up: the corpus'
   tokens resolve ``--select-token-ratio``, before the work dir is claimed.
2. **Select.** Group ``g`` (``L_g`` tokens) runs the method under ``oversample`` times
   its share of the budget, ``T_g = T * L_g / L``, and writes what it keeps as candidates
   (with their lengths, raw quality and embeddings); **one central round** then keeps
   ``T`` tokens of the union (:class:`~.steps.SelectGlobal` with ``budget_tokens=T``), as
   the document budget's central round does (GreeDi). This is not yet the allocation by
   equal marginal gains per token of :mod:`.allocate`: a group's candidates are capped at
   ``oversample`` times its proportional share, so a cluster worth more than that per
   token is cut short (``--oversample`` raises the cap), and coverage in the central
   round is counted over the candidates, not over every row.
3. **Fill** (modular methods, or one group: no central round). Each group keeps its
   share ``T_g`` and offers its best unkept rows by quality per token, as many as make
   up its unspent tokens plus the corpus' longest document
   (``WORK/tokens/offer-NNNNN.parquet``); one step walks every group's offers, best
   quality first (ties: group, then the group's order), into the tokens the groups left
   unspent, keeping each that fits, then writes every group's part. Each group left less
   than its shortest unkept row and offers more than its unspent tokens, so the walk ends
   on a row that does not fit: the kept tokens are within the longest document of ``T``.

Only numbers cross groups on the driver (tokens per shard and per group); the offers are
read by the fill step, a few rows per group.
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

from ..budget import budget_total, check_lengths, length_column
from ..config import SelectSpec
from ..data import Corpus, Selection
from ..io.fs import open_input, storage_path
from ..io.parquet import atomic_write_table, read_table
from ..io.shards import ShardScan
from ..io.text import lengths_from_arrow
from .engine import Step, run_steps
from .executors import Runner
from .paths import candidates_path, part_path

__all__ = [
    "FillSlack",
    "TokenPlan",
    "check_token_settings",
    "count_tokens",
    "shard_tokens",
    "fill_round",
    "group_token_budget",
    "offer_path",
    "select_tokens",
    "token_settings",
    "write_offers",
]


def check_token_settings(settings: SelectSpec) -> None:
    """Refuse what shards do not take with a token budget yet (``--given``,
    ``--max-similarity``), before anything is written."""
    sel = settings.selector
    if settings.selector.token_budget and (sel.given is not None or sel.max_similarity is not None):
        raise ValueError(
            "a token budget (--budget-tokens / --select-token-ratio) on shards does not take "
            "--given or --max-similarity yet; select one file, or give a document budget "
            "(--select-ratio, --k) for shards."
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
    (:func:`~.validate.scan_step`): its tokens, longest and shortest document; a length
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


def offer_path(work_dir: str | Path, gid: int) -> Path:
    """A group's offers for the fill: its best unkept rows."""
    return storage_path(work_dir) / "tokens" / f"offer-{gid:05d}.parquet"


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
    work: str
    out: str
    id_col: str
    slack: float


class FillSlack(Step[FillJob]):
    """Step 3: fill the tokens the groups left unspent from their offers, then write every
    group's part (``OUT/selected/part-NNNNN.parquet``); the marker last."""

    name = "fill the token budget"
    unit = "round"

    def marker(self, job: FillJob) -> Path:
        return storage_path(job.work) / "completions" / "tokens-fill"

    def outputs(self, job: FillJob) -> tuple[Path, ...]:
        return tuple(part_path(job.out, g) for g in job.gids)

    def accepts(self, job: FillJob, done: dict[str, Any]) -> bool:
        return done.get("slack") == job.slack

    def run(self, job: FillJob) -> dict[str, Any]:
        offers = [read_table(offer_path(job.work, g)) for g in job.gids]
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
            own = read_table(candidates_path(job.work, gid))
            mine = taken[owner == i]
            extra = offers[i].filter(pa.array(mine))
            counts[str(gid)] = own.num_rows + extra.num_rows
            atomic_write_table(_with_filled(own, extra, gid, job.id_col), part_path(job.out, gid))
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
    runner: Runner, gids: list[int], work: str, out: str, id_col: str, slack: float
) -> dict[str, Any]:
    """Step 3 through the engine (reused when its marker holds the same slack)."""
    job = FillJob(tuple(gids), work, out, id_col, float(slack))
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
    central round): ``oversample`` times its share, and no offers."""
    from ..pipeline.step import fit_group
    from ..pipeline.writer import selection_table

    group, spec, plan = job.group, job.spec, job.tokens
    assert plan is not None  # a token budget
    lengths = np.asarray([] if corpus.lengths is None else corpus.lengths, np.float64)
    budget = group_token_budget(plan, lengths) if corpus.n_docs else 0.0
    if propose is not None:
        budget *= spec.partition.oversample
    fit_spec = replace(
        spec, selector=replace(spec.selector, budget_tokens=budget, select_token_ratio=None)
    )
    if corpus.n_docs == 0 or budget < lengths.min():  # its share keeps none of its rows
        sel = fit_group(corpus, 0, fit_spec, seed=group.seed, evaluate=False)
    elif budget >= lengths.sum():  # proposing every row
        sel = fit_group(corpus, corpus.n_docs, fit_spec, seed=group.seed, evaluate=False)
    else:  # stored ids not passed: modular methods walk their ranking under the budget too
        sel = fit_group(corpus, None, fit_spec, seed=group.seed, evaluate=False)
    fit_s = time.perf_counter() - started - read_s
    id_col = spec.columns.id_col
    if not spec.run.selected_only:
        atomic_write_table(
            selection_table(sel, id_col=id_col, stored_ids=ids, group=group.gid, probability=True),
            storage_path(job.work) / "groups" / f"{group.gid:05d}.parquet",
        )
    kept = float(lengths[sel.selected].sum()) if corpus.n_docs else 0.0
    if propose is not None:  # the central round's candidates; no offers
        propose(sel)
    else:
        table = selection_table(sel, id_col=id_col, stored_ids=ids, group=group.gid, kept_only=True)
        atomic_write_table(table, candidates_path(job.work, group.gid))
        write_offers(sel, corpus, ids, plan, budget - kept, offer_path(job.work, group.gid))
    stats = group_stats(group, sel, corpus.n_docs, started, read_s, fit_s)
    stats.update(
        token_plan=[plan.total, plan.corpus],
        tokens={"group": float(lengths.sum()), "budget": budget, "kept": kept},
    )
    return stats
