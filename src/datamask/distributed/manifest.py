"""The manifest of a sharded run (``OUT/manifest.json``): settings, input, partition,
budget, output, timings, provenance and per-group stats, built from what the phases of
:mod:`.runner` found (:class:`~.context.Checked`, :class:`Outcome`)."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

import numpy as np

from .._memory import peak_rss_mb
from ..io.keep import input_names
from ..io.provenance import record_inputs
from ..pipeline.writer import run_record
from .check.validate import QualityRange
from .context import Checked, RunContext
from .finish.cover import corpus_terms
from .plan.partition import Group

__all__ = ["Outcome", "build_manifest", "step_seconds"]


@dataclass
class Outcome:
    """A run's facts: the groups and their stats (in group order, with their shares), how
    they were combined, the rounds' facts; the cover's, the keep lists' and the phases'
    seconds are filled in by the runner's last phases."""

    groups: list[Group]
    ordered: list[dict[str, Any]]
    plan_facts: dict[str, Any]
    combine: str
    global_stats: dict[str, Any] | None
    cap_facts: dict[str, Any] | None
    k_selected: int
    n_pending_docs: int
    budget_tokens: float | None = None  # T of a token budget
    cover_facts: dict[str, Any] | None = None  # the cover's, where it ran
    keep: dict[str, Any] = field(default_factory=dict)  # the keep lists' facts
    seconds: dict[str, float] = field(default_factory=dict)  # plan, select, global, total

    @property
    def two_rounds(self) -> bool:
        return self.combine != "group"


def build_manifest(run: RunContext, checked: Checked, done: Outcome) -> dict[str, Any]:
    """The manifest of a complete run (the caller writes it, last)."""
    spec, infos, global_stats = run.spec, checked.infos, done.global_stats
    n_total, groups, ordered = checked.n_total, done.groups, done.ordered
    computed = [s for s in ordered if not s["reused"]]
    terms = dict(global_stats["terms"]) if global_stats else {}
    cover = done.cover_facts
    if cover is not None:  # J over every document, from the cover (empty: not derived)
        objective = corpus_terms(spec, cover.get("objective_sums"), done.budget_tokens)
        cover, terms = {**cover, "objective": objective}, terms | objective
    manifest = {
        **run_record(spec, n_docs=n_total, k=done.k_selected, terms=terms or None, sharded=True),
        **checked.record,
        "complete": True,
        "input": {"source": str(run.source), "n_shards": len(infos), "n_docs": n_total},
        "partition": {
            "by": spec.partition.partition,
            "n_groups": len(groups),
            "chunk_size": spec.partition.chunk_size,
            **done.plan_facts,
        },
        "runner": getattr(run.runner, "describe", lambda: {"runner": run.runner.name})(),
        "work_dir": str(run.work),
        "budget": _budget_block(run, checked.quality_range, done),
        "output": {
            "selected": str(run.dirs.selected()),
            "parts": 1 if done.two_rounds and done.combine != "gains" else len(groups),
            "k": checked.k_total,
            "covered": None if done.cover_facts is None else done.cover_facts["dataset"],
        },
        "totals": _totals(checked, done, computed),
        "max_similarity": done.cap_facts,
        "cover": cover,
        "selection_digest": done.keep["selection"],
        "provenance": record_inputs(  # what `apply` and `evaluate` check their input against
            [i.path for i in infos],
            input_names(run.source, [i.path for i in infos]),
            spec.read_columns,
            id_col=spec.columns.id_col,
            checksums=checked.checksums,
        ),
        "summary": {
            **_summary(ordered),
            "peak_rss_mb_global_round": global_stats["peak_rss_mb"] if global_stats else None,
        },
        "summary_computed": _summary(computed) if computed else None,
        "groups": ordered,
    }
    if checked.kept is not None:
        manifest["given"] = _given_block(
            run, checked.kept, ordered, n_total, checked.rate, checked.quality_range
        )
        manifest["terms_union"] = None  # not computed in a sharded run: the block says why
        manifest["provenance"]["given"] = record_inputs(
            [i.path for i in checked.docs],
            input_names(run.given[0], [i.path for i in checked.docs]),
            spec.columns.read,
            id_col=spec.columns.id_col,
            checksums=checked.checksums,
        )
    return manifest


def _budget_block(run: RunContext, quality_range: QualityRange, done: Outcome) -> dict[str, Any]:
    spec, two_rounds, global_stats = run.spec, done.two_rounds, done.global_stats
    allocating = done.combine == "gains"
    return {
        "mode": "global" if two_rounds else "group",
        "allocation": "gains" if allocating else ("central round" if two_rounds else None),
        "method": spec.selector.method,
        "oversample": spec.partition.oversample if two_rounds else None,
        "candidates": global_stats["n_candidates"] if global_stats else None,
        "quality_range": {
            name: [quality_range[0][j], quality_range[1][j]]
            for j, name in enumerate(spec.columns.quality_cols)
        },
        "global_round": global_stats,
    }


def _totals(checked: Checked, done: Outcome, computed: list[dict[str, Any]]) -> dict[str, Any]:
    n_total, seconds, n_groups = checked.n_total, done.seconds, len(done.groups)
    return {
        "n_docs": n_total,
        "k": done.k_selected,
        "n_groups": n_groups,
        "groups_computed": len(computed),
        "groups_reused": n_groups - len(computed),
        "resumed": checked.resumed,
        "seconds": {
            "plan": seconds["plan"],
            "select": seconds["select"],
            "global": seconds["global"],
            "cover": None if done.cover_facts is None else done.cover_facts["seconds"]["total"],
            "total": seconds["total"],
        },
        "docs_per_second": n_total / seconds["total"],
        "select_docs_per_second": (
            done.n_pending_docs / seconds["select"] if done.n_pending_docs else None
        ),
        "driver_peak_rss_mb": peak_rss_mb(),
    }


def step_seconds(stats: dict[str, Any], key: str) -> float:
    """A group's ``seconds[key]`` summed over its proposals: the latest (``stats``) and
    those before it (``stats["earlier"]``); a part a step did not time counts 0.

    >>> step_seconds({"seconds": {"total": 3.0}, "earlier": [{"seconds": {"total": 9.0}}]}, "total")
    12.0
    """
    runs = [stats, *stats.get("earlier", ())]
    return float(sum(r["seconds"].get(key) or 0.0 for r in runs))


def _summary(stats: list[dict[str, Any]]) -> dict[str, Any]:
    # every proposal of a group that proposed again (:func:`~.combine.rounds.earlier_proposals`)
    secs = np.asarray([step_seconds(s, "total") for s in stats], dtype=np.float64)
    rss = [s["peak_rss_mb"] for s in stats if s.get("peak_rss_mb") is not None]
    gpu = [s["gpu_peak_mb"] for s in stats if s.get("gpu_peak_mb") is not None]
    return {
        "group_seconds": {
            "min": float(secs.min()),
            "median": float(np.median(secs)),
            "mean": float(secs.mean()),
            "max": float(secs.max()),
            "sum": float(secs.sum()),
        },
        "peak_rss_mb_per_worker": max(rss) if rss else None,
        "gpu_peak_mb_per_worker": max(gpu) if gpu else None,
        "workers_seen": len({(s["host"], s["pid"]) for s in stats}),
        "devices": sorted({s["device"] for s in stats}),
    }


def _given_block(
    run: RunContext,
    kept: dict[str, Any],
    ordered: list[dict[str, Any]],
    n_total: int,
    rate: tuple[int, int],
    quality_range: QualityRange,
) -> dict[str, Any]:
    """The manifest's ``given``, as the one-file summary's: KEPT, its counts, the quality
    scale and the floors (mean over the input, methods, from the groups' stats)."""
    floors = [s["floor"] for s in ordered if s.get("floor")]
    return {
        "source": str(run.spec.selector.given),
        "selection": run.spec.selector.given_selection,
        "n_docs": kept["n_docs"],
        "n_kept": kept["n_kept"],
        "quality_scale": "min-max over --given and --input together",
        "quality_range": [list(quality_range[0]), list(quality_range[1])],
        "floor": {
            "method": sorted({f["method"] for f in floors}),
            "mean": sum(f["sum"] for f in floors) / n_total,
            "seconds": sum(f["seconds"] for f in floors),
        },
        "rate_totals": {"k": rate[0], "n_docs": rate[1]},
        "kept_rows": {"seconds": kept["seconds"], "peak_rss_mb": kept.get("peak_rss_mb")},
        "terms_union": (
            "not computed in a sharded run: it needs every row of --given and of the input "
            "against KEPT ∪ S; score it with datamask evaluate --given"
        ),
    }
