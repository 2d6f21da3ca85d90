"""The driver of a sharded run: five short phases over pure steps, on any executor.

1. **Check: the one read of the corpus.** Footers; with ``--partition cluster`` the
   k-means tree, fitted on the seeded sample's rows alone (:func:`~.plan.plan.fit_first`);
   then every row of every shard in one pass (:mod:`.check.validate`) that checks it, files its
   id hash and, from the same rows, writes the shard's spill (its rows by leaf) and,
   under a token budget, sums its tokens. A refusal here leaves nothing behind
   (:func:`~.check.validate.dropped_on_error`). Then the work dir is claimed with its
   fingerprint, per-shard checksums included (:func:`~.lifecycle.claim`): a shard
   changed in place is refused on resume, by its scan, before it writes.
2. **Plan.** Groups (:mod:`.plan.partition`: k-means clusters by default, gathered from the
   spills, or shards, or chunks), each one's share of ``k = round(select_ratio * N)`` (or
   ``--k``) and its seed.
3. **Select.** :func:`~.select.steps.select_group` on every group without a finished result.
   Under the global budget a group proposes candidates instead of keeping its share.
4. **Combine.** Where the objective allows it, the budget is allocated by the groups'
   gain curves (:mod:`.combine.allocate`: one threshold, no central learner; groups cut off by
   their own candidates propose again); otherwise one more round over the union of the
   candidates (:func:`~.select.steps.select_global`).
5. **Merge.** The parts are the output dataset; the similarity cap across groups
   (:mod:`.combine.cap`), every row's nearest kept row (:mod:`.finish.cover`,
   ``OUT/covered/``), keep lists for ``apply``, then the manifest.

Layout of a run (``OUT`` is ``--output``, ``WORK`` is ``--work-dir``, default ``OUT/_work``)::

    OUT/selected/part-NNNNN.parquet   the kept ids of group NNNNN (budget group, or gains)
    OUT/selected/part-global.parquet  the central round's selection (id, group, rank, logit)
    OUT/covered/part-NNNNN.parquet    every row of group NNNNN: id, group, selected,
                                      covered_by, covered_sim, covered_exact (:mod:`.finish.cover`)
    OUT/manifest.json                 settings, budget, per-group n / k / seconds / memory
    WORK/settings.json                the settings and input fingerprint this work dir holds
    WORK/groups/, candidates/, completions/   the steps' files (:mod:`.select.steps`)
    WORK/candidates/NNNNN.want.json   the allocation asked group NNNNN for more candidates
    WORK/completions/global           round 2's stats; written after its parts
    WORK/clusters/...                 the cluster tree (tree.npz), per-shard spill counts
                                      (the spills are deleted once gathered) and
                                      clusters/groups/: one object per group (:mod:`.plan.gather`)
    WORK/ids/bucket=B/, ids/done/     id hashes per (shard, bucket); the bucket steps' finds
                                      (:mod:`.check.validate`)
    WORK/keep/bucket=B/, keep/done/   kept rows per (bucket of shards, group)
                                      (:mod:`.finish.keeplists`); every path: :mod:`.paths`

Every step writes atomically, its marker last, so a run killed at any point finishes, when
rerun with the same arguments, with the selection an uninterrupted run makes and redoes
only unfinished steps. The executors (:mod:`.executors`, :mod:`.ray_backend`) only schedule.
This module is the phases and nothing else: the plan is :mod:`.plan.plan`, the select and
combine rounds :mod:`.combine.rounds`, the manifest :mod:`.manifest`.
"""

from __future__ import annotations

import time
from collections.abc import Iterator
from contextlib import ExitStack, contextmanager, suppress
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

from ..config import SelectSpec
from ..io.atomic import (
    OutputLock,
    atomic_write_json,
    check_no_overlap,
    check_writable,
    clean_stale_temporaries,
)
from ..io.fs import Location, storage_path
from ..io.shards import (
    ShardInfo,
    ShardSource,
    inspect_shards,
    list_shards,
    literal_or_glob,
)
from ..pipeline.given import check_given_terms
from .check.validate import QualityRange, ScanShard, check_scans, dropped_on_error, scan_jobs
from .combine.cap import cap_across_groups
from .combine.rounds import allocate_round, allocate_tokens_round, central_round, select_round
from .context import Checked, RunContext
from .engine import run_steps, unfinished
from .executors import LocalRunner, Runner
from .finish.cover import cover_round
from .finish.keeplists import keep_round
from .lifecycle import claim, fingerprint
from .manifest import Outcome, build_manifest
from .paths import WorkDir
from .plan.partition import SpillShard
from .plan.plan import budget_k, check_work_disk, fit_first, plan_groups, spill_jobs
from .select.given import (
    CheckGivenSelection,
    GivenJob,
    PrepareKept,
    given_files,
    rate_totals,
    token_rate_totals,
)
from .select.steps import GlobalJob, SelectGlobal
from .select.tokens import (
    TokenPlan,
    check_token_settings,
    count_tokens,
    fill_round,
    token_combine,
    token_settings,
)

__all__ = ["run_selection"]


def run_selection(
    source: ShardSource,
    output: str | Path,
    spec: SelectSpec | None = None,
    *,
    runner: Runner | None = None,
    work_dir: str | Path | None = None,
    progress: bool = True,
    given: tuple[Any, Any] | None = None,
) -> dict[str, Any]:
    """Select ``round(select_ratio * N)`` (or ``k``) documents from a sharded corpus,
    resumably; given documents already kept (``spec.selector.given``), from the input
    only, counting coverage above them (:mod:`.select.given`).

    Parameters
    ----------
    source : str, Path, list of paths or pyarrow.dataset.FileSystemDataset
        Parquet shards (see :func:`datamask.io.shards.list_shards`).
    output : str or Path
        Output folder: ``selected/part-*.parquet`` and ``manifest.json``.
    spec : SelectSpec, optional
        Learner and partition settings (default ``SelectSpec()``).
    runner : Runner, optional
        Scheduler; default :class:`LocalRunner`.
    work_dir : str or Path, optional
        Where per-group results and completion markers go (default ``output/_work``).
    progress : bool, default=True
        Progress bars over shards and groups.
    given : (str, str or None), optional
        Where the steps read ``--given`` and ``--given-selection`` (default: the
        settings' ``given`` and ``given_selection``).

    Returns
    -------
    dict
        The manifest also written to ``output/manifest.json``.

    Raises
    ------
    ValueError
        Bad settings, no shards, a missing or corrupt shard (named), or a work dir that
        holds a run with other settings. Nothing is written for a group that fails.
    """
    started = time.perf_counter()
    spec = (spec or SelectSpec()).check()
    check_token_settings(spec)
    runner = runner or LocalRunner()
    # Absolute paths: steps run in other processes, on other nodes of a cluster, in other
    # working directories; a relative path would resolve there against another folder.
    # s3:// and gs:// stay URIs, read and written in place by the steps (nothing of the
    # input or the work dir is copied to the driver).
    dirs = _places(output, work_dir)
    out, work = dirs.output, dirs.root

    # Output and work dir never overlap the input: not the input folder itself, and no
    # input shard inside them (folders inside the input folder are skipped when listing).
    if isinstance(source, str | Path) and literal_or_glob(str(source)) == "literal":
        check_no_overlap([out, work], [source])
    files = [storage_path(f) for f in list_shards(source, exclude=[out, work])]
    check_no_overlap([out, work], files)
    spec = token_settings(spec, files)  # the length column named, if a token budget
    if given is not None and given[0] is not None:  # --given is read, never written
        check_no_overlap([out, work], [g for g in given if g])
    # Claim the output (and a work dir outside it) before any computation: a second run
    # writing the same folder is refused here, and an unwritable folder fails here.
    with ExitStack() as claims:  # released in reverse; on an error, made folders go too
        # (object storage has no lock: one run writes a remote output at a time, docs/remote.md)
        if isinstance(out, Path):
            claims.enter_context(OutputLock(out, folder=True))
        if isinstance(work, Path) and not _inside(work, out):
            claims.enter_context(OutputLock(work, folder=True))
        if given is None:
            given = (spec.selector.given, spec.selector.given_selection)
        run = RunContext(source, files, dirs, spec, runner, progress, given)
        return _run_claimed(run, started)


def _places(output: str | Path, work_dir: str | Path | None) -> WorkDir:
    """The output folder and the work dir (default ``output/_work``), refusing an output
    that is a file and a local work dir that cannot be written."""
    dirs = WorkDir.of(output, work_dir)
    if dirs.output.is_file():
        raise ValueError(
            f"--output {dirs.out!r} is a file; sharded selection writes a folder "
            "(selected/ parts and manifest.json)."
        )
    if isinstance(dirs.root, Path):
        check_writable(dirs.root, folder=True)
    return dirs


def _inside(work: Path | Location, out: Path | Location) -> bool:
    """Whether the work dir lies inside the output (then the output's claim covers it)."""
    if isinstance(work, Path) and isinstance(out, Path):
        return work.resolve().is_relative_to(out.resolve())
    return str(work).startswith(str(out).rstrip("/") + "/")


@dataclass
class _Inputs:
    """What the check pass found: the input's shards, ``--given``'s, their checksums and
    quality range, the fit done before it (``--partition cluster``), the token plan
    (under a token budget) and the pass's seconds."""

    infos: list[ShardInfo]
    docs: list[ShardInfo]
    checksums: dict[str, str]
    quality_range: QualityRange
    fitted: dict[str, Any] | None
    tokens: TokenPlan | None
    seconds: float


def _check_inputs(run: RunContext) -> _Inputs:
    """Phase 1: footers (row counts, columns), the k-means fit on its sample
    (``--partition cluster``), then every row of every shard in one pass that also files
    each row under its leaf and counts its tokens, and ``--given``'s shards with them
    (one width, one id type, no id in both, one quality range); nothing is written for a
    run whose input is bad, and no group starts before all are checked."""
    infos = inspect_shards(run.files, columns=run.spec.read_columns)
    if sum(i.num_rows for i in infos) == 0:
        raise ValueError(f"the {len(infos)} input shard(s) hold no rows.")
    if isinstance(run.work, Path):  # before the scans write the id buckets
        check_work_disk(infos, run.spec, run.dirs)
    docs: list[ShardInfo] = []
    if run.given[0] is not None:
        check_given_terms(run.spec.objective)
        sel = run.spec.selector  # a token budget reads --given's lengths too
        more = [sel.length_col] if sel.token_budget and sel.length_col else []
        columns = list(dict.fromkeys([*run.spec.columns.read, *more]))
        docs = inspect_shards(given_files(run.given[0]), columns=columns)
    # The validation pass runs before any cluster is started: a RayRunner not yet
    # connected hands it to a local pool, so bad input fails before Ray starts.
    checker = getattr(run.runner, "validation_runner", lambda: run.runner)()
    try:
        # refuses a work dir of another run before anything is written
        jobs = scan_jobs(infos + docs, run.spec, run.dirs, n_input=len(infos))
        fitted = _fit_first(run, infos, docs, jobs, checker)
        clock = time.perf_counter()
        if fitted is not None:  # the scans spill the shards whose spill is not there
            spills = spill_jobs(infos, run.spec, run.dirs)
            by_shard = {spills[i].shard: spills[i] for i in unfinished(SpillShard(), spills)}
            jobs = [replace(job, spill=by_shard.get(job.index)) for job in jobs]
        scans = run_steps(checker, ScanShard(), jobs, progress=run.progress)
        checksums, quality_range = _check_scans(run, scans, infos, docs, checker)
        plan = count_tokens(run.spec, scans) if run.spec.selector.token_budget else None
        if run.given[1] is not None:  # every id of --given-selection is in --given
            job = GivenJob(run.spec, run.dirs, run.given)
            run_steps(checker, CheckGivenSelection(), [job], progress=False)
    except BaseException:
        if checker is not run.runner:
            checker.close()  # waits for the jobs running: none writes after a cleanup
        raise
    if checker is not run.runner:
        # Every job is done. A pool worker may still be starting (a spawned process
        # imports datamask first): it ends on its own while Ray starts (2.4 s at 1,200 rows).
        checker.close(wait=False)
    seconds = time.perf_counter() - clock
    return _Inputs(infos, docs, checksums, quality_range, fitted, plan, seconds)


def _check_scans(
    run: RunContext, scans: list, infos: list[ShardInfo], docs: list[ShardInfo], checker: Any
) -> tuple[dict[str, str], QualityRange]:
    """:func:`~.check.validate.check_scans` of the input's scans and ``--given``'s."""
    n_input = len(infos) if docs else None
    return check_scans(scans, infos + docs, run.spec, checker, run.dirs, n_input)


def _fit_first(
    run: RunContext, infos: list[ShardInfo], docs: list[ShardInfo], jobs: list, checker: Any
) -> dict[str, Any] | None:
    """:func:`~.plan.plan.fit_first`. The fit reads only the sample's rows and cannot say what
    is wrong with the input as the check does: when it refuses its rows, the check pass
    (without spills) names the first bad row, file and column as ever."""
    try:
        return fit_first(infos, run.spec, run.dirs, checker, run.progress)
    except ValueError as refused:
        failed = refused
    scans = run_steps(checker, ScanShard(), jobs, progress=run.progress)
    _check_scans(run, scans, infos, docs, checker)
    raise failed


def _check_and_claim(run: RunContext) -> Checked:
    """Phase 1: check every row (and --given's), then claim the work dir for these inputs
    and settings (--given's files in the fingerprint too: changed, a resume is refused);
    given KEPT, its kept rows written once for the groups. The claim comes after the
    check pass, so a run refused there changes nothing of a run the work dir holds; its
    fingerprint holds every shard's checksum, so a resume refuses a shard changed in place
    (its scan compares it before writing anything)."""
    # a run refused here leaves nothing (a remote work dir it made: its empty folder too)
    with _made_remote_dropped(run.work), dropped_on_error(run.dirs):
        found = _check_inputs(run)
        infos, docs = found.infos, found.docs
        n_total = sum(i.num_rows for i in infos)
        k_total = budget_k(run.spec, n_total)
        record = fingerprint(run.spec, infos + docs, found.checksums)
        resumed = claim(run.dirs, record)
    kept = None
    if docs:
        job = GivenJob(run.spec, run.dirs, run.given)
        (kept,) = run_steps(run.runner, PrepareKept(), [job], progress=run.progress)
    rate = rate_totals(k_total, n_total, kept)
    return Checked(
        infos,
        docs,
        found.checksums,
        found.quality_range,
        k_total,
        record,
        resumed,
        kept,
        rate,
        fitted=found.fitted,
        tokens=found.tokens,
        check_s=found.seconds,
    )


@contextmanager
def _made_remote_dropped(work: Path | Location) -> Iterator[None]:
    """On an error in the ``with`` body, delete the remote folders above a work dir that
    did not exist before it, from the highest (the id buckets' empty folder objects stay
    behind :func:`~.check.validate.dropped_on_error`; deleting a lower one makes its parent's)."""
    if not isinstance(work, Location) or work.exists():
        yield
        return
    top = work
    while "/" in top.parent.path.strip("/") and not top.parent.exists():
        top = top.parent
    try:
        yield
    except BaseException:
        with suppress(OSError):
            top.fs.delete_dir(top.path)
        raise


def _run_claimed(run: RunContext, started: float) -> dict[str, Any]:
    """:func:`run_selection` once the output is claimed: six phases."""
    dirs, spec, progress = run.dirs, run.spec, run.progress
    # 1. Check every row, claim the work dir.
    checked = _check_and_claim(run)
    if spec.selector.token_budget:
        return _run_tokens(run, checked, started)
    k_total, quality_range = checked.k_total, checked.quality_range
    # 2. Plan the groups.
    groups, shares, plan_facts, combine = plan_groups(run, checked.infos, k_total, checked.fitted)
    _check_seconds(plan_facts, checked)
    two_rounds = combine != "group"
    totals = checked.rate if combine == "gains" else None
    plan_s = time.perf_counter() - started

    # 3. Select every group, or let it propose candidates (round 1).
    stats: dict[int, dict[str, Any]] = {}
    select_started = time.perf_counter()
    desc = "propose candidates" if two_rounds else "select groups"
    n_pending_docs = select_round(
        run,
        groups,
        quality_range,
        stats,
        propose=two_rounds,
        totals=totals,
        rate=checked.rate,
        desc=desc,
    )
    select_s = time.perf_counter() - select_started

    # 4. Combine (round 2): allocate the budget by gains, or the central round.
    global_started = time.perf_counter()
    global_stats = None
    if combine == "gains":
        global_stats, groups = allocate_round(run, groups, quality_range, totals, stats, k_total)
    elif combine == "central":
        global_stats = central_round(run, groups, k_total, quality_range)
    global_s = time.perf_counter() - global_started if two_rounds else 0.0

    # 5. Merge: the parts are the output dataset (stray temporaries of killed runs go),
    #    the similarity cap across groups, keep lists for `apply`, and the manifest.
    clean_stale_temporaries(dirs.selected())
    for g in groups:  # each group's stats as the manifest lists them: in place, not copied
        stats[g.gid]["share"] = shares[g.gid]
    ordered = [stats[g.gid] for g in groups]
    cap_facts = None
    if spec.selector.max_similarity is not None and not two_rounds:
        cap_facts = cap_across_groups(groups, spec, dirs, progress=progress)
    elif global_stats is not None and spec.selector.max_similarity is not None:
        cap_facts = {"applied_in": "global round", "threshold": spec.selector.max_similarity}
    k_selected = global_stats["k"] if global_stats else int(sum(s["k"] for s in ordered))
    if k_selected != k_total:  # every path guarantees it; check before marking complete
        raise RuntimeError(f"selected {k_selected} documents, not {k_total}; please report this.")
    # 6. Cover (every row's nearest kept row: OUT/covered/), keep lists and the manifest.
    seconds = {"plan": plan_s, "select": select_s, "global": global_s}
    done = Outcome(
        groups, ordered, plan_facts, combine, global_stats, cap_facts, k_selected, n_pending_docs
    )
    manifest = _finish(run, checked, done, seconds, started)
    atomic_write_json(manifest, dirs.manifest())
    return manifest


def _run_tokens(run: RunContext, checked: Checked, started: float) -> dict[str, Any]:
    """:func:`run_selection` under a token budget (:mod:`.select.tokens`): the corpus' tokens from
    every shard; then every group proposes ``oversample`` times its share of the tokens
    and one price per token over every group keeps ``T`` of them where the document
    budget allocates by gains, else one central round (:func:`~.select.tokens.token_combine`;
    for a modular method or one group, every group keeps its share and one fill spends
    what they left); then the cover, the keep lists and the manifest as ever."""
    dirs, spec = run.dirs, run.spec
    plan = checked.tokens
    assert plan is not None  # counted by the check pass
    groups, shares, plan_facts, _ = plan_groups(run, checked.infos, checked.k_total, checked.fitted)
    _check_seconds(plan_facts, checked)
    groups = [replace(g, k=share) for g, share in zip(groups, shares, strict=True)]
    combine = token_combine(spec, len(groups))
    central = combine != "group"
    rate = token_rate_totals(plan.total, plan.corpus, checked.kept)  # given KEPT: the union's
    totals = rate if combine == "gains" else None
    plan_s = time.perf_counter() - started
    stats: dict[int, dict[str, Any]] = {}
    select_started = time.perf_counter()
    n_pending_docs = select_round(
        run,
        groups,
        checked.quality_range,
        stats,
        propose=central,
        totals=totals,
        rate=rate,
        tokens=plan,
    )
    select_s = time.perf_counter() - select_started
    global_started = time.perf_counter()
    if combine == "gains":
        fill = None
        global_stats = allocate_tokens_round(
            run, groups, checked.quality_range, stats, plan, totals
        )
        kept = global_stats["tokens_kept"]
    elif central:
        fill, global_stats = None, _central_tokens(run, groups, plan, checked.quality_range)
        kept = global_stats["tokens_kept"]
    else:
        fill, global_stats = _fill_tokens(run, groups, plan, stats), None
        kept = fill["kept"]
    clean_stale_temporaries(dirs.selected())
    for g in groups:
        stats[g.gid]["share"] = shares[g.gid]
    ordered = [stats[g.gid] for g in groups]
    k_selected = global_stats["k"] if central else int(sum(s["k"] for s in ordered))
    cap_facts = None
    if spec.selector.max_similarity is not None:  # token_combine: the central round
        cap_facts = {"applied_in": "global round", "threshold": spec.selector.max_similarity}
    seconds = {"plan": plan_s, "select": select_s, "global": time.perf_counter() - global_started}
    done = Outcome(
        groups,
        ordered,
        plan_facts,
        combine,
        global_stats,
        cap_facts,
        k_selected,
        n_pending_docs,
        budget_tokens=plan.total,
    )
    manifest = _finish(run, checked, done, seconds, started)
    tokens = plan.summary(kept)
    manifest["totals"]["tokens"] = tokens
    manifest["tokens"] = {**tokens, "allocation": TOKEN_ALLOCATIONS[combine], "fill": fill}
    atomic_write_json(manifest, dirs.manifest())
    return manifest


def _finish(
    run: RunContext, checked: Checked, done: Outcome, seconds: dict[str, float], started: float
) -> dict[str, Any]:
    """The last phases of either path, once the selection is final: the cover (every
    row's nearest kept row, written by the groups to ``OUT/covered/``), the keep lists for
    ``apply``, and the manifest (returned; the caller writes it, last). ``seconds`` holds
    the phases before (plan, select, global); the total runs from ``started``."""
    spec = run.spec
    if not spec.run.selected_only:
        clean_stale_temporaries(run.dirs.covered())
        done.cover_facts = cover_round(run, done.groups, checked.quality_range)
    done.keep = keep_round(
        done.groups, checked.infos, spec.columns.id_col, run, run.runner, run.progress
    )
    done.seconds = {**seconds, "total": time.perf_counter() - started}
    return build_manifest(run, checked, done)


#: How a token run's groups became one selection, as its manifest says (by combine).
TOKEN_ALLOCATIONS = {
    "gains": "each group proposes oversample x its tokens' share priced per token, one price "
    "over every group keeps T",
    "central": "each group proposes oversample x its tokens' share, one central round keeps T",
    "group": "each group keeps its tokens' share, one fill spends what they left",
}


def _check_seconds(facts: dict[str, Any], checked: Checked) -> None:
    """The check pass's seconds in the plan's split (``partition.seconds``; with
    ``--partition cluster`` the pass writes the spills too)."""
    if "seconds" in facts:
        facts["seconds"] = {"check": checked.check_s, **facts["seconds"]}


def _central_tokens(
    run: RunContext, groups: list, plan: TokenPlan, quality_range: QualityRange
) -> dict[str, Any]:
    """The central round of a token budget: ``T`` tokens of every group's candidates."""
    sel = run.spec.selector
    spec = replace(
        run.spec, selector=replace(sel, budget_tokens=plan.total, select_token_ratio=None)
    )
    job = GlobalJob(tuple(groups), spec, run.dirs, None, quality_range)
    return run_steps(run.runner, SelectGlobal(), [job], progress=run.progress)[0]


def _fill_tokens(
    run: RunContext, groups: list, plan: TokenPlan, stats: dict[int, dict[str, Any]]
) -> dict[str, Any]:
    """Every group kept its share: one fill of the tokens they left (:mod:`.select.tokens`);
    each group's ``k`` becomes its kept and filled rows."""
    kept = sum(stats[g.gid]["tokens"]["kept"] for g in groups)
    gids = [g.gid for g in groups]
    fill = fill_round(run.runner, gids, run.dirs, run.spec.columns.id_col, plan.total - kept)
    for g in groups:
        stats[g.gid]["k"] = fill["k_by_group"][str(g.gid)]
    return {**fill, "kept": kept + fill["filled_tokens"]}
