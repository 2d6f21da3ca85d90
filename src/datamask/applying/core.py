"""Turn a selection into a dataset: stream each input shard, keep the selected rows.

    datamask apply --input data/ --selection out/sel --output out/kept --removed out/dropped

One output shard per input shard, with the same relative name and format (parquet,
``.jsonl`` or ``.jsonl.gz``), holding every column of the kept rows in their input order.
Each shard is streamed batch by batch and written atomically (see
:meth:`datamask.io.fs.Location.open_atomic`); after it (and its removed rows) is in
place, a completion marker ``OUT/_datamask_apply/done/<name>.json`` is written. A rerun
skips shards with a marker, so a killed run resumes; ``OUT/_datamask_apply/state.json``
records which selection the folder holds, and a rerun with another selection is refused.

Which rows are kept comes from the selection's per-file keep lists (see
:mod:`datamask.io.keep`): one shard's list in memory at a time, and each kept row's id is
checked against the list. When the selection has no keep lists for these shards (they
are, say, the original ``.jsonl.gz`` texts of an embedded parquet), rows are matched by
id against the selection's selected ids (held once, 8 bytes per id plus the ids).

``removed`` writes what was dropped, one file per input shard, in one of three layouts:

- ``ids``: ``REMOVED/<name>.parquet``, the id column of the dropped rows, with the kept
  document that covers each (``covered_by``, ``covered_sim``: docs/incremental.md);
- ``rows``: ``REMOVED/<name>``, the dropped rows with every column, in the input's format
  (parquet shards also get ``covered_by`` and ``covered_sim``; JSON lines are copied
  byte for byte);
- ``curator``: ``REMOVED/part.<i>.parquet``, one column ``id`` sorted ascending, the
  layout NeMo Curator's ``TextDuplicatesRemovalWorkflow(ids_to_remove_path=REMOVED,
  duplicate_id_field="id", id_field=<your id column>)`` reads (its removal stage loads the
  ids in each batch's min/max range with parquet filters, so the ids are sorted and
  written in row groups of ``max(1000, min(n // 10, 1_000_000))`` rows, as Curator's own
  identification stages write them).

This module is the command body (claims, the state file, resume markers); the input shards
are read in :mod:`.inputs`, the keep lists and provenance checks are in :mod:`.plan`, and
one shard is written by :mod:`.write`.
"""

from __future__ import annotations

import os
import time
from contextlib import ExitStack
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

from tqdm.auto import tqdm

from ..io.atomic import to_json
from ..io.claim import claim_output
from ..io.fs import Location, check_reachable, resolve
from ..io.keep import keep_file_name, relative_names
from ..io.listing import glob_root
from ..io.parquet import parquet_num_rows
from ..io.provenance import verify_inputs, warn_trust_unused
from .inputs import SHARD_SUFFIXES, _format, _input_shards, input_names
from .plan import (
    _KeepList,
    _Plan,
    _plan,
    _probe_ids,
    _read_cover,
    _read_json,
    _selection_meta,
)
from .spec import REMOVED_FORMATS, ApplySpec
from .write import _apply_shard_file, _write_removed_ids

__all__ = ["REMOVED_FORMATS", "SHARD_SUFFIXES", "ApplySpec", "apply_selection"]

STATE_DIR = "_datamask_apply"


def _source_stats(src: Location) -> dict[str, Any]:
    """What a done marker remembers of its input shard: a rerun redoes a changed one."""
    info = src.info()
    return {"uri": src.uri, "size": info.size, "mtime_ns": info.mtime_ns}


def _claim(out: Location) -> Any:
    """The exclusive claim on an output: a flock beside it (local), or a claim object
    written with a conditional put (remote: :mod:`datamask.io.claim`; one run per output
    from any host)."""
    return claim_output(out, folder=True)


def _overlaps(a: Location, b: Location) -> bool:
    if a.fs.type_name != b.fs.type_name:
        return False
    pa_, pb = a.path.rstrip("/") + "/", b.path.rstrip("/") + "/"
    return pa_.startswith(pb) or pb.startswith(pa_)


def apply_selection(
    input: str | Path,
    selection: str | Path,
    output: str | Path,
    *,
    removed: str | Path | None = None,
    spec: ApplySpec | None = None,
    **settings: Any,
) -> dict[str, Any]:
    """Write the rows of ``input`` that ``selection`` keeps, one output shard per input shard.

    It runs as named phases over one :class:`_ApplyRun`: :func:`_open` (the places, their
    shards and overlaps), :func:`_plan_run` (the selection's keep lists or ids and the
    provenance checks), :func:`_check_state` (under the claims: what the output already
    holds), then :func:`_apply_shards`.

    Parameters
    ----------
    input : str or Path
        Input shards: a file, a folder (every ``.parquet``, ``.jsonl`` and ``.jsonl.gz``
        below it) or a glob; local or ``file://``, ``s3://``, ``gs://``, ``hf://``.
    selection : str or Path
        ``datamask select``'s output: a parquet file (with ``selected``, or selected ids
        only) or a sharded output folder.
    output : str or Path
        Output folder: ``<name>`` for every input shard ``<name>``.
    removed : str or Path, optional
        Folder for what is dropped (see ``removed_format``). Default: not written.
    spec : ApplySpec, optional
        Everything else (default: from ``settings``).
    **settings
        Any field of :class:`~datamask.applying.spec.ApplySpec` by its key, instead of
        ``spec``: ``removed_format`` ({"ids", "rows", "curator"}, default "ids"; see the
        module docstring), ``id_col`` or ``preset`` (default: chunk_id, else id, as the
        input holds), ``batch_size`` (default 65_536:
        rows per streamed batch; memory is about one batch of every column), ``progress``
        (default True), ``trust_selection`` (default False: skip the provenance checks of
        ``docs/provenance.md``, the input's fingerprints against the selection's record
        and, without keep lists, that the input's ids are of the selection's type and that
        some are selected).

    Returns
    -------
    dict
        ``n_shards``, ``shards_done``, ``shards_reused``, ``rows``, ``kept``, ``mode``
        (``"keep"`` lists or ``"ids"``), ``seconds``, ``rows_per_second``.

    Raises
    ------
    ValueError
        Bad arguments, unreadable inputs, an unfinished selection, an input that is not
        what the selection was made from (``docs/provenance.md``), an output holding
        another selection or input, a shard changed since the selection; all before
        anything is written, except a shard found bad while streaming (its partial
        output is never put in place).
    """
    started = time.perf_counter()
    spec = ApplySpec.of(spec, settings, where="apply's arguments")
    run = _open(input, selection, output, removed, spec)
    if run.spec.columns.id_col is None or run.spec.columns.preset is not None:
        # the id column: given, else the preset's or the default's found in the first shard
        names = input_names(run.shards[0], run.formats[0])
        cols = run.spec.columns.resolve_id(names, where=run.shards[0].uri)
        run.spec = replace(run.spec, columns=cols)
    _plan_run(run)
    with ExitStack() as claims:  # released in reverse; on an error, made folders go too
        claims.enter_context(_claim(run.out))
        if run.rem is not None:
            claims.enter_context(_claim(run.rem))
        _check_state(run)
        result = _apply_shards(run)
    seconds = time.perf_counter() - started
    return {
        **result,
        "mode": run.plan.mode,
        "selection_id": run.plan.selection_id,
        "seconds": seconds,
        "rows_per_second": result["rows"] / seconds if seconds > 0 else None,
    }


@dataclass
class _ApplyRun:
    """One apply's state, as its phases fill it: the places and their shards (:func:`_open`),
    the plan, the state record and the row total (:func:`_plan_run`), what the output
    already holds (:func:`_check_state`) and the counts (:func:`_apply_shards`)."""

    spec: ApplySpec
    src: Location
    sel: Location
    out: Location
    rem: Location | None
    shards: list[Location]
    names: list[str]
    formats: list[str]
    plan: _Plan = None  # type: ignore[assignment]  # set by _plan_run
    state: dict[str, Any] | None = None
    total: int | None = None
    state_loc: Location | None = None
    previous: dict[str, Any] | None = None
    rows: int = 0
    kept: int = 0
    reused: int = 0


def _open(
    input: str | Path,
    selection: str | Path,
    output: str | Path,
    removed: str | Path | None,
    spec: ApplySpec,
) -> _ApplyRun:
    """The places resolved and reachable, the input's shards, and no output over an input."""
    src = resolve(input, what="--input")
    sel = resolve(selection, what="--selection")
    out = resolve(output, what="--output")
    rem = resolve(removed, what="--removed") if removed is not None else None
    for loc, what in (
        (src, "--input"),
        (sel, "--selection"),
        (out, "--output"),
        (rem, "--removed"),
    ):
        if loc is not None:
            check_reachable(loc, what=what)
    shards = _input_shards(src, sel)
    for target, what in ((out, "--output"), (rem, "--removed")):
        if target is None:
            continue
        for other in (src, sel):
            if _overlaps(target, other):
                raise ValueError(
                    f"{what} {target.uri!r} overlaps {other.uri!r}; writing it would "
                    "overwrite or hide the input. Choose another folder."
                )
    if rem is not None and _overlaps(out, rem):
        raise ValueError(f"--removed {rem.uri!r} overlaps --output {out.uri!r}; choose another.")
    if out.is_file():
        raise ValueError(f"--output {out.uri!r} is a file; apply writes a folder.")
    names = relative_names(glob_root(src), [s.path for s in shards])
    formats = [_format(n) for n in names]
    return _ApplyRun(spec, src, sel, out, rem, shards, names, formats)


def _plan_run(run: _ApplyRun) -> None:
    """Which rows are kept (keep lists or selected ids), checked against the input before
    anything is written; the state record and the row total."""
    spec, sel = run.spec, run.sel
    is_dir, meta = _selection_meta(sel)
    if not spec.trust_selection:  # before anything is written: is this what it was made from?
        verify_inputs((meta or {}).get("provenance"),
                      list(zip(run.names, run.shards, strict=True)), selection=sel.uri)  # fmt: skip
    plan = _plan(sel, is_dir, meta, run.names, spec.id_col)
    if run.rem is not None and spec.removed_format != "curator":  # what --removed carries
        plan.cover = _read_cover(sel, is_dir, spec.id_col)
    if plan.mode == "ids" and not spec.trust_selection:
        _probe_ids(run.shards, run.formats, plan, spec.id_col, spec.batch_size, sel.uri)
    if spec.trust_selection and plan.mode == "keep" and not (meta or {}).get("provenance"):
        why = "it holds no provenance record, and its keep lists need no id check"
        warn_trust_unused(sel.uri, why)
    run.plan = plan
    run.state = {
        "format": "datamask.apply/1",
        "input": os.path.abspath(run.src.path) if run.src.is_local else run.src.uri.rstrip("/"),
        "selection_id": plan.selection_id,
        "id_col": spec.id_col,
        "removed": None if run.rem is None else run.rem.uri,
        "removed_format": None if run.rem is None else spec.removed_format,
    }
    if all(f == "parquet" for f in run.formats):
        run.total = sum((parquet_num_rows(s) for s in run.shards), 0)


def _check_state(run: _ApplyRun) -> None:
    """Under the claims: an output that holds another selection, input or layout is refused."""
    state, out = run.state or {}, run.out
    state_loc = out.join(STATE_DIR, "state.json")
    previous = _read_json(state_loc)
    if state_loc.is_file() and previous is None:
        raise ValueError(
            f"{state_loc.uri} is not readable JSON; delete {out.uri} (or that file) to apply again."
        )
    if previous is not None and "input" not in previous:  # written before inputs were
        previous = {**previous, "input": state["input"]}  # recorded: each marker checks
    if previous is not None and previous != state:
        changed = [k for k in state if previous.get(k) != state[k]]
        raise ValueError(
            f"--output {out.uri!r} holds rows applied with another {changed[0]} "
            f"({previous.get(changed[0])!r}, now {state[changed[0]]!r}); choose another "
            "--output or delete it."
        )
    run.state_loc, run.previous = state_loc, previous


def _record_state(run: _ApplyRun) -> None:
    """With the first finished shard: a run that fails first leaves no state file."""
    loc = run.state_loc  # set by _check_state
    if run.previous is None and loc is not None and not loc.is_file():
        loc.write_text(to_json(run.state))


def _apply_shards(run: _ApplyRun) -> dict[str, Any]:
    """Every shard in turn: reused when its marker says it is done, else applied."""
    bar = tqdm(
        total=run.total,
        desc="apply",
        unit="row",
        unit_scale=True,
        disable=not run.spec.progress,
        dynamic_ncols=True,
    )
    done_dir = run.out.join(STATE_DIR, "done")
    try:
        for i, (src, name) in enumerate(zip(run.shards, run.names, strict=True)):
            marker = done_dir.join(name + ".json")
            stats = _read_json(marker)
            source = _source_stats(src)
            if stats is not None and stats.get("source", source) != source:
                stats = None  # the input shard changed since it was applied: apply it again
            if stats is None:
                stats = _apply_shard(run, i, bar)
                _record_state(run)
                marker.write_text(to_json({**stats, "source": source}))
            else:
                run.reused += 1
                bar.update(stats["rows"])
            run.rows += stats["rows"]
            run.kept += stats["kept"]
    finally:
        bar.close()
    n = len(run.shards)
    return {
        "n_shards": n,
        "shards_done": n - run.reused,
        "shards_reused": run.reused,
        "rows": run.rows,
        "kept": run.kept,
        "output": run.out.uri,
        "removed": None if run.rem is None else run.rem.uri,
    }


def _removed_target(run: _ApplyRun, i: int, name: str) -> Location | None:
    """Where shard ``i``'s dropped rows or ids go (temporaries of a killed run removed)."""
    if run.rem is None:
        return None
    target = {
        "rows": run.rem.join(name),
        "ids": run.rem.join(keep_file_name(name)),
        "curator": run.rem.join(f"part.{i}.parquet"),
    }[run.spec.removed_format]
    target.clean_temporaries()
    return target


def _apply_shard(run: _ApplyRun, i: int, bar: Any) -> dict[str, Any]:
    """Shard ``i`` streamed: its kept rows (and what it drops) written; its counts."""
    spec, plan = run.spec, run.plan
    src, name, fmt = run.shards[i], run.names[i], run.formats[i]
    target = run.out.join(name)
    target.clean_temporaries()
    keep = None
    if plan.mode == "keep":
        keep = _KeepList(plan.keep_dir.join(keep_file_name(name)), spec.id_col)
    rem_target = _removed_target(run, i, name)
    args = (src, target, rem_target, spec.removed_format, plan, keep, spec.id_col,
            spec.batch_size, bar)  # fmt: skip
    n, k, removed_ids = _apply_shard_file(*args, fmt=fmt)
    if keep is not None and keep.num_rows is not None and keep.num_rows != n:
        target.delete()
        raise ValueError(
            f"{src.uri} has {n} rows but had {keep.num_rows} when the selection was "
            "made; select again."
        )
    if rem_target is not None and spec.removed_format != "rows":
        id_type = removed_ids[0].type if removed_ids else None
        _write_removed_ids(
            removed_ids, rem_target, spec.id_col, spec.removed_format, id_type, plan.cover
        )
    return {"shard": name, "rows": n, "kept": k, "removed": n - k, "index": i}
