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

import hashlib
import os
import time
from collections.abc import Callable
from contextlib import ExitStack
from pathlib import Path
from typing import Any

from tqdm.auto import tqdm

from .._validation import check_choice
from ..io.atomic import OutputLock, to_json
from ..io.fs import Location, cache_dir, check_reachable, glob_root, resolve
from ..io.keep import keep_file_name, relative_names
from ..io.parquet import parquet_num_rows
from ..io.provenance import verify_inputs, warn_trust_unused
from .inputs import SHARD_SUFFIXES, _format, _input_shards
from .plan import (
    _KeepList,
    _Plan,
    _plan,
    _probe_ids,
    _read_cover,
    _read_json,
    _selection_meta,
)
from .write import _apply_jsonl, _apply_parquet, _write_removed_ids

__all__ = ["REMOVED_FORMATS", "SHARD_SUFFIXES", "apply_selection"]

REMOVED_FORMATS = ("ids", "rows", "curator")
STATE_DIR = "_datamask_apply"


def _source_stats(src: Location) -> dict[str, Any]:
    """What a done marker remembers of its input shard: a rerun redoes a changed one."""
    info = src.info()
    return {"uri": src.uri, "size": info.size, "mtime_ns": info.mtime_ns}


def _claim(out: Location) -> OutputLock:
    """The exclusive claim on an output: a flock beside it (local), or on a local file
    keyed by the URI (remote: this host's runs exclude each other; see docs/remote.md for the
    one-writer rule across hosts)."""
    if out.is_local:
        return OutputLock(out.path, folder=True)
    key = hashlib.sha256(out.uri.rstrip("/").encode()).hexdigest()[:16]
    return OutputLock(cache_dir() / "claims" / key, folder=True)


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
    removed_format: str = "ids",
    id_col: str = "chunk_id",
    batch_size: int = 65_536,
    progress: bool = True,
    trust_selection: bool = False,
) -> dict[str, Any]:
    """Write the rows of ``input`` that ``selection`` keeps, one output shard per input shard.

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
    removed_format : {"ids", "rows", "curator"}, default="ids"
        See the module docstring.
    id_col : str, default="chunk_id"
        Id column of the input shards.
    batch_size : int, default=65_536
        Rows per streamed batch (memory is about one batch of every column).
    progress : bool, default=True
        Show a progress bar over rows.
    trust_selection : bool, default=False
        Skip the provenance checks (``docs/provenance.md``): the input's fingerprints
        against the selection's record, and (without keep lists) that the input's ids
        are of the selection's type and that some are selected.

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
    check_choice("removed_format", removed_format, REMOVED_FORMATS)
    if int(batch_size) < 1:
        raise ValueError(f"batch_size must be >= 1; got {batch_size}.")
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
    is_dir, meta = _selection_meta(sel)
    if not trust_selection:  # before anything is written: is this what it was made from?
        verify_inputs((meta or {}).get("provenance"), list(zip(names, shards, strict=True)),
                      selection=sel.uri)  # fmt: skip
    plan = _plan(sel, is_dir, meta, names, id_col)
    if rem is not None and removed_format != "curator":  # what --removed carries
        plan.cover = _read_cover(sel, is_dir, id_col)
    if plan.mode == "ids" and not trust_selection:
        _probe_ids(shards, formats, plan, id_col, batch_size, sel.uri)
    if trust_selection and plan.mode == "keep" and not (meta or {}).get("provenance"):
        why = "it holds no provenance record, and its keep lists need no id check"
        warn_trust_unused(sel.uri, why)
    state = {
        "format": "datamask.apply/1",
        "input": os.path.abspath(src.path) if src.is_local else src.uri.rstrip("/"),
        "selection_id": plan.selection_id,
        "id_col": id_col,
        "removed": None if rem is None else rem.uri,
        "removed_format": None if rem is None else removed_format,
    }
    total = None
    if all(f == "parquet" for f in formats):
        total = 0
        for s in shards:
            total += parquet_num_rows(s)

    with ExitStack() as claims:  # released in reverse; on an error, made folders go too
        claims.enter_context(_claim(out))
        if rem is not None:
            claims.enter_context(_claim(rem))
        state_loc = out.join(STATE_DIR, "state.json")
        previous = _read_json(state_loc)
        if state_loc.is_file() and previous is None:
            raise ValueError(
                f"{state_loc.uri} is not readable JSON; delete {out.uri} (or that file) to "
                "apply again."
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

        def record_state() -> None:  # with the first finished shard: a run that fails
            if previous is None and not state_loc.is_file():  # first leaves no folder
                state_loc.write_text(to_json(state))

        result = _run(
            shards,
            names,
            formats,
            out,
            rem,
            removed_format,
            plan,
            id_col,
            batch_size,
            progress,
            total,
            record_state,
        )
    seconds = time.perf_counter() - started
    return {
        **result,
        "mode": plan.mode,
        "selection_id": plan.selection_id,
        "seconds": seconds,
        "rows_per_second": result["rows"] / seconds if seconds > 0 else None,
    }


def _run(
    shards: list[Location],
    names: list[str],
    formats: list[str],
    out: Location,
    rem: Location | None,
    removed_format: str,
    plan: _Plan,
    id_col: str,
    batch_size: int,
    progress: bool,
    total: int | None,
    record_state: Callable[[], None],
) -> dict[str, Any]:
    done_dir = out.join(STATE_DIR, "done")
    rows = kept = reused = 0
    bar = tqdm(
        total=total,
        desc="apply",
        unit="row",
        unit_scale=True,
        disable=not progress,
        dynamic_ncols=True,
    )
    try:
        for i, (src, name, fmt) in enumerate(zip(shards, names, formats, strict=True)):
            marker = done_dir.join(name + ".json")
            stats = _read_json(marker)
            source = _source_stats(src)
            if stats is not None and stats.get("source", source) != source:
                stats = None  # the input shard changed since it was applied: apply it again
            if stats is not None:
                rows += stats["rows"]
                kept += stats["kept"]
                reused += 1
                bar.update(stats["rows"])
                continue
            target = out.join(name)
            target.clean_temporaries()
            keep = None
            if plan.mode == "keep":
                keep = _KeepList(plan.keep_dir.join(keep_file_name(name)), id_col)
            rem_target = None
            if rem is not None:
                rem_target = {
                    "rows": rem.join(name),
                    "ids": rem.join(keep_file_name(name)),
                    "curator": rem.join(f"part.{i}.parquet"),
                }[removed_format]
                rem_target.clean_temporaries()
            args = (src, target, rem_target, removed_format, plan, keep, id_col, batch_size, bar)
            if fmt == "parquet":
                n, k, removed_ids = _apply_parquet(*args)
            else:
                n, k, removed_ids = _apply_jsonl(*args, gz=fmt == "jsonl.gz")
            if keep is not None and keep.num_rows is not None and keep.num_rows != n:
                target.delete()
                raise ValueError(
                    f"{src.uri} has {n} rows but had {keep.num_rows} when the selection was "
                    "made; select again."
                )
            if rem_target is not None and removed_format != "rows":
                id_type = removed_ids[0].type if removed_ids else None
                _write_removed_ids(
                    removed_ids, rem_target, id_col, removed_format, id_type, plan.cover
                )
            stats = {"shard": name, "rows": n, "kept": k, "removed": n - k, "index": i}
            record_state()
            marker.write_text(to_json({**stats, "source": source}))
            rows += n
            kept += k
    finally:
        bar.close()
    return {
        "n_shards": len(shards),
        "shards_done": len(shards) - reused,
        "shards_reused": reused,
        "rows": rows,
        "kept": kept,
        "output": out.uri,
        "removed": None if rem is None else rem.uri,
    }
